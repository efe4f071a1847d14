// The `grouped` GEMM output model (docs/recipes.md §6): a native block-scaled
// tensor-core GEMM as the UE5M3 paper probes it.
//
//   C (M,N) = A (M,K) · B (N,K)^T, with A and B the *encoded* operands: each
//   element is its payload times its block scale (tensor scales not applied),
//   an exact double. K is split into groups of G products, starting at k = 0
//   (the last group may be partial). Per output element:
//     g_j  = round_fp32(exact Σ_{k in group j} a_k b_k)   group_round: rne | rtz
//     c    = ((0 + g_0) + g_1) + ...                     float adds, accumulate: rne | rtz
//     c    = fp32(RNE(d·c) / d)                          when the grid d is set
//     C    = fl(c · alpha),  alpha = fl(ginv_a · ginv_b) the two tensor decode scales
//   An exact zero sum is +0. A group holding a NaN (or Inf·0, or +Inf and
//   -Inf products) sums to NaN, one holding ±Inf products to ±Inf; every
//   NaN written to C is the canonical quiet NaN.
//
// grouped_gemm_ref adds every product into an exact fixed-point accumulator:
// slow, obviously right. grouped_gemm computes each group of a tile with
// float32 GEMMs (of the group, or of 16-product sub-blocks added in double)
// or a double GEMM (Eigen), whichever is exact for every row pair of the
// tile — checked from the operands' exponent ranges: all partial sums must
// fit 24 (float32) or 53 (double) bits; the few groups that fail even the
// double check (and any with non-finite operands) are recomputed with the
// exact accumulator. The two agree bit for bit. Their per-element
// arithmetic (the exact accumulator, the roundings, the ranges and the
// exactness test, the epilogue) is the EXMY_HD code of
// sim/quant/grouped_items.hpp, which the kernels of
// sim/quant/cuda/grouped_gemm_cuda.hpp run too (float32 GEMMs of each
// group used where exact, a thread per output element: the same bits).
#pragma once

#include <atomic>
#include <cstdint>
#include <vector>

#include "formats/quantize.hpp"
#include "formats/round.hpp"
#include "sim/quant/grouped_items.hpp"
#include "sim/quant/recipe.hpp"

namespace exmy::sim::quant {

// ExactSum (the exact Σ a_i·b_i of doubles, rounded once to float32), the
// roundings and the epilogue are EXMY_HD code in sim/quant/grouped_items.hpp,
// shared with the kernels of sim/quant/cuda/grouped_gemm_cuda.hpp.

// float32 rounding of an exact double (rne or rtz).
float round_to_float(double v, Round mode);
// a + b rounded to float32 (rne or rtz), exactly.
float add_float(float a, float b, Round mode);

void grouped_gemm_ref(float* C, const double* A, const double* B, int64_t M, int64_t N, int64_t K,
                      const GemmModel& model, float alpha);
void grouped_gemm(float* C, const double* A, const double* B, int64_t M, int64_t N, int64_t K, const GemmModel& model,
                  float alpha);

// How many (128 x 128 tile, group) pieces grouped_gemm computed on each of
// its three paths since the process started (or the counters were zeroed):
// one float32 GEMM of the group, float32 GEMMs of 16-product sub-blocks, or
// the double GEMM with the exact fallback. For tests and benchmarks.
struct GroupedGemmPaths {
  std::atomic<uint64_t> f32_group{0}, f32_split{0}, f64{0};
  void zero() { f32_group = 0, f32_split = 0, f64 = 0; }
};
GroupedGemmPaths& grouped_gemm_paths();

// The encoded operand of a quantization call: v[i] = value(code_i) ·
// s_b(block of i) (value(code_i) alone without a block scale), (rows, cols)
// row-major, from exmy::quantize's codes and scale codes for `spec`.
void encode_operand(double* v, const QuantSpec& spec, const void* codes, const void* scale_codes, int64_t rows,
                    int64_t cols);
// The same values as bfloat16 bits (through float), for the `fp32` model's
// BF16 GEMM on the CPU: exact where bf16_holds_encoded(spec), and then the
// bits of encode_bf16_launches (sim/quant/quant_launches.hpp), which the
// device runs; by value tables and rows in parallel.
void encode_operand_bf16(uint16_t* v, const QuantSpec& spec, const void* codes, const void* scale_codes, int64_t rows,
                         int64_t cols);

// Quantizes x (rows, cols) with `spec` and returns its encoded operand; the
// call's QuantInfo and dequantized values go to `info` and `values` when
// given. For tests and benchmarks (training reuses its own buffers).
std::vector<double> quantize_encoded(const QuantSpec& spec, const float* x, int64_t rows, int64_t cols,
                                     QuantInfo* info = nullptr, std::vector<float>* values = nullptr);

// fl(fl(1/t_a) · fl(1/t_b)): the product of the two tensor decode scales.
float tensor_decode_alpha(float t_a, float t_b);

// Row outer scales (docs/recipes.md §6): C (M,N), made with alpha = 1,
// becomes fl(C · alpha_mn), alpha_mn = tensor_decode_alpha(t_a[m], t_b[n]),
// a NaN the canonical one; the epilogue with alpha = 1 leaves c unchanged,
// so this is the epilogue of every element with its own alpha. An operand
// without row scales (row_t null) takes its tensor scale t for every row.
void apply_outer_alpha(float* C, int64_t M, int64_t N, float t_a, const float* row_t_a, float t_b,
                       const float* row_t_b);

}  // namespace exmy::sim::quant

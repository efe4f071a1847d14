// The `grouped` GEMM output model (docs/recipes.md §6) as kernels, the
// launches of sim/quant/grouped_launches.hpp, in two builds:
// - *_cuda: on the current CUDA device, device pointers, the default stream
//   (asynchronous; a failed launch throws exmy::Error naming the kernel).
//   Only where exmy is built with CUDA (EXMY_HAVE_CUDA).
// - *_emulated: the same launches with the threads run one after another on
//   the host, host pointers; always built (exmy_quant), so CI compares them
//   with the CPU (tests/quant/test_grouped_cuda.cpp).
//
// grouped_gemm_*: C (M,N) from the encoded operands A (M,K) and B (N,K)
// (encode_operand's doubles) with the model's groups, roundings, grid and
// alpha (a float, or one in the kernels' memory: GroupedAlpha), as
// sim::quant::grouped_gemm; `scratch` holds
// grouped_gemm_scratch(M, N, K, model) GroupRange (8 bytes each: the group
// ranges and the float32 path's tiles, sim/quant/grouped_launches.hpp; none
// when K <= 0).
// apply_outer_alpha_*: the row outer scales' epilogue on a C made with
// alpha = 1, as sim::quant::apply_outer_alpha (row_t_a (M) and row_t_b (N)
// may be null: the tensor scale for every row).
//
// Bits: both builds equal the CPU's grouped_gemm (and grouped_gemm_ref) bit
// for bit: every group sum is exact before its one rounding (the float32
// GEMM's outputs are used only where they are exact, whatever its order),
// and the rest is IEEE float32/double +, * and / in the CPU's order (the
// kernels are built without fma contraction, with IEEE division, without
// flush to zero).
#pragma once

#include <cstdint>

#include "sim/quant/grouped_launches.hpp"  // grouped_gemm_scratch, GroupRange, GemmModel

namespace exmy::sim::quant {

#define EXMY_GROUPED_KERNELS(suffix)                                                                                  \
  void grouped_gemm_##suffix(float* C, const double* A, const double* B, int64_t M, int64_t N, int64_t K,             \
                             const GemmModel& model, GroupedAlpha alpha, GroupRange* scratch);                        \
  void apply_outer_alpha_##suffix(float* C, int64_t M, int64_t N, float t_a, const float* row_t_a, float t_b,        \
                                  const float* row_t_b);

EXMY_GROUPED_KERNELS(emulated)
#if defined(EXMY_HAVE_CUDA)
EXMY_GROUPED_KERNELS(cuda)
#endif
#undef EXMY_GROUPED_KERNELS

}  // namespace exmy::sim::quant

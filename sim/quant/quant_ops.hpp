// Where a quantized linear's tensors live and what runs on them: the CPU
// (host memory; exmy::quantize, sim::gemm, the threaded transpose) or a
// device backend (its memory; the CUDA quantizer, cuBLASLt, the launches of
// sim/quant/quant_launches.hpp). QuantizedLinear makes every call through
// its runtime's QuantOps, so one implementation of the recipe's logic
// (tensor references, random streams, statistics, capture) serves both; on
// a device the statistics reduce the tensors there and bring only their
// small results to the host; captures copy the operand to the host (both
// only on the steps that record them).
#pragma once

#include <cstdint>
#include <vector>

#include "formats/quantize.hpp"
#include "sim/gemm.hpp"  // Op
#include "sim/memory.hpp"
#include "sim/quant/recipe.hpp"  // GemmModel
#include "sim/quant/stats.hpp"   // OperandStats, ScaleCodeTable

namespace exmy::sim::quant {

class QuantOps {
 public:
  virtual ~QuantOps() = default;
  virtual const char* name() const = 0;
  virtual Memory& memory() = 0;
  // dst (cols, rows) = src (rows, cols)^T
  virtual void transpose(float* dst, const float* src, int64_t rows, int64_t cols) = 0;
  // dst = round_bf16(src) (in place allowed)
  virtual void round_bf16(float* dst, const float* src, int64_t n) = 0;
  // The spec's random Hadamard transform of x (rows, cols) along cols, in place.
  virtual void rht(const QuantSpec& q, float* x, int64_t rows, int64_t cols) = 0;
  // exmy::quantize's contract on tensors in memory() (out.stats on the host).
  // need_info = false: the caller reads neither the info's amax nor its t,
  // so a device may return before its kernels ran (the CUDA quantizer's
  // calls that do not wait) and report an unrepresentable element at the
  // next check_deferred(). t_out (in memory(), or null): where the call's
  // tensor encode scale t goes, where the ops run (for gemm_bf16_scaled).
  virtual QuantInfo quantize(const QuantSpec& q, const float* x, int64_t rows, int64_t cols, const QuantOutput& out,
                             bool need_info, float* t_out) = 0;
  // Throws what the calls that did not wait left to report (exmy::Error);
  // nothing where every call waits.
  virtual void check_deferred() {}
  // sim::gemm's product (row-major, C = op(A) op(B), C overwritten) with
  // FP32 operands and accumulation: the `fp32` GEMM output model and the
  // GEMM statistics' unquantized reference (on a device, cuBLAS's order of
  // the sums; on cuda-emulated, the CPU's sim::gemm).
  virtual void gemm(float* C, int64_t ldc, const float* A, int64_t lda, Op opA, const float* B, int64_t ldb, Op opB,
                    int64_t M, int64_t N, int64_t K) = 0;
  // dst += src
  virtual void add(float* dst, const float* src, int64_t n) = 0;
  // The grouped GEMM output model (sim/quant/grouped_gemm.hpp): an operand's
  // codes as the model's doubles (encode_operand), the model's product, and
  // the row outer scales' alphas (apply_outer_alpha; row_t in memory()).
  virtual void encode(double* v, const QuantSpec& q, const void* codes, const void* scale_codes, int64_t rows,
                      int64_t cols) = 0;
  virtual void grouped_gemm(float* C, const double* A, const double* B, int64_t M, int64_t N, int64_t K,
                            const GemmModel& model, float alpha) = 0;
  // The same with alpha = tensor_decode_alpha(*t_a, *t_b), the two tensor
  // scales in memory() (on a device made and read there, as for
  // gemm_bf16_scaled).
  virtual void grouped_gemm_scaled(float* C, const double* A, const double* B, int64_t M, int64_t N, int64_t K,
                                   const GemmModel& model, const float* t_a, const float* t_b) = 0;
  virtual void outer_alpha(float* C, int64_t M, int64_t N, float t_a, const float* row_t_a, float t_b,
                           const float* row_t_b) = 0;
  // The `fp32` model's GEMM in BF16 (RuntimeOptions::fp32_gemm = bf16): an
  // operand's encoded values q·s as bfloat16 bits (exact: only for specs
  // bf16_holds_encoded accepts), and C (M,N) = fl(alpha · A (M,K) · B (N,K)^T)
  // of two such operands, products exact in FP32 and FP32 accumulation (on
  // a device cuBLASLt's order, on the CPU and cuda-emulated sim::gemm's).
  virtual void encode_bf16(uint16_t* v, const QuantSpec& q, const void* codes, const void* scale_codes, int64_t rows,
                           int64_t cols) = 0;
  virtual void gemm_bf16(float* C, const uint16_t* A, const uint16_t* B, int64_t M, int64_t N, int64_t K,
                         float alpha) = 0;
  // The same with alpha = tensor_decode_alpha(*t_a, *t_b), the two tensor
  // scales in memory() (on a device the host never reads them: the
  // epilogue's alpha is made and read there).
  virtual void gemm_bf16_scaled(float* C, const uint16_t* A, const uint16_t* B, int64_t M, int64_t N, int64_t K,
                                const float* t_a, const float* t_b) = 0;

  // --- statistics (tensors in memory(), results on the host) ---
  //
  // A statistics step's results may arrive later: on ops whose
  // defers_stats() is true (a device's), the calls marked "later" leave
  // their results where the ops run and fill the host locations they were
  // given at collect_stats(), in one copy and one wait for all of them (so
  // a statistics step waits once, not a few thousand times); those
  // locations must stay valid until then. On the CPU they fill them at once.
  virtual bool defers_stats() const { return false; }
  virtual void collect_stats() {}
  // quantize() with the call's statistics into os.q, its reference amax
  // into os.reference and its tensor scale into os.tensor_scale (later;
  // out.stats is not read). A device fills them later only where the call
  // need not wait otherwise: need_info false and no row outer scales.
  virtual QuantInfo quantize_recorded(const QuantSpec& q, const float* x, int64_t rows, int64_t cols,
                                      const QuantOutput& out, bool need_info, float* t_out, OperandStats& os);
  // max|x| over n elements, NaN when one is NaN (stats.hpp's abs_max): at
  // once, and into *dst (later).
  virtual double abs_max(const float* x, int64_t n) = 0;
  virtual void abs_max_later(const float* x, int64_t n, double* dst) { *dst = abs_max(x, n); }
  // stats.hpp's add_block_ranges and ScaleCodeTable::add, counts into st
  // (later).
  virtual void add_block_ranges(const float* x, int64_t rows, int64_t cols, int block_rows, int block_cols,
                                OperandStats& st) = 0;
  virtual void add_scale_codes(const ScaleCodeTable& table, const void* codes, int64_t blocks, OperandStats& st) = 0;
  // An operand's statistics besides its quantizer call's (later): with
  // `amax`, st.amax = max|x|; with a block scale (table non-null) the
  // block ranges of x's block_rows x block_cols blocks and the histogram
  // of their `blocks` scale codes. The default calls the three above; a
  // device makes them in one pass.
  virtual void operand_stats(const float* x, int64_t rows, int64_t cols, bool amax, const ScaleCodeTable* table,
                             const void* scale_codes, int64_t blocks, int block_rows, int block_cols,
                             OperandStats& st);
  // *dst = compare_gemm(got, ref, got_rows, N, rows) (stats.hpp) of got
  // (got_rows, N) and ref (R, N) in memory(), R = rows.size() or got_rows
  // when rows is empty (later). A device takes got compact (rows empty).
  virtual void compare_rows(const float* got, int64_t got_rows, const float* ref, int64_t N,
                            const std::vector<int64_t>& rows, GemmStats* dst);
  // The GEMM statistics' sampled operand rows (sampled_row(i, M, R) of
  // sim/quant/stats_items.hpp, i < R): dst (R, ld) = those rows of src
  // (M, ld), and dst (R, rows) = those columns of src (rows, cols).
  virtual void gather_rows(float* dst, const float* src, int64_t ld, int64_t M, int64_t R) = 0;
  virtual void gather_columns(float* dst, const float* src, int64_t rows, int64_t cols, int64_t R) = 0;
};

// The CPU's: host memory and the CPU paths.
QuantOps& cpu_quant_ops();

// Whether bfloat16 holds every encoded value q·s of q's element and scale
// formats (q alone without a block scale): every finite element value times
// every finite scale value, checked one by one (cached per format pair;
// pairs of more than 2^22 values count as not held). E2M1 or E4M3 elements
// with UE4M3 or UE5M3 scales are held (at most 4 + 4 significant bits, in
// range); UE8M0 scales are not (2^127 · 6 overflows, 2^-127 · 2^-9 is below
// bfloat16's smallest subnormal), nor is any format wider than 8 bits of
// significand.
bool bf16_holds_encoded(const QuantSpec& q);

// gemm_bf16 on the host (the CPU's and cuda-emulated's): the operands widened
// to float (exact), sim::gemm, then each element times alpha (fl(alpha · c);
// none when alpha is 1).
void gemm_bf16_host(float* C, const uint16_t* A, const uint16_t* B, int64_t M, int64_t N, int64_t K, float alpha);

// Scratch in a QuantOps' memory: b placed in m with room for n elements
// (its contents are not kept when it grows: every caller writes before it
// reads).
template <class T>
T* ensure(MemBuf<T>& b, int64_t n, Memory& m) {
  b.place(m);
  if (b.size() < n) b.resize_zero(n);
  return b.data();
}

}  // namespace exmy::sim::quant

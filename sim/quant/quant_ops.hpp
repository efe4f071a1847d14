// Where a quantized linear's tensors live and what runs on them: the CPU
// (host memory; exmy::quantize, sim::gemm, the threaded transpose) or a
// device backend (its memory; the CUDA quantizer, cuBLASLt, the launches of
// sim/quant/quant_launches.hpp). QuantizedLinear makes every call through
// its runtime's QuantOps, so one implementation of the recipe's logic
// (tensor references, random streams, statistics, capture) serves both; on
// a device the statistics and captures read the tensors through host
// copies, made only on statistics and capture steps.
#pragma once

#include <cstdint>

#include "formats/quantize.hpp"
#include "sim/memory.hpp"
#include "sim/quant/recipe.hpp"  // GemmModel

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
  virtual QuantInfo quantize(const QuantSpec& q, const float* x, int64_t rows, int64_t cols,
                             const QuantOutput& out) = 0;
  // C (M,N) = A (M,K) B (N,K)^T with FP32 operands and accumulation (the
  // `fp32` GEMM output model; the device's order of the sums is cuBLAS's).
  virtual void gemm_nt(float* C, const float* A, const float* B, int64_t M, int64_t N, int64_t K) = 0;
  // dst += src
  virtual void add(float* dst, const float* src, int64_t n) = 0;
  // The grouped GEMM output model (sim/quant/grouped_gemm.hpp): an operand's
  // codes as the model's doubles (encode_operand), the model's product, and
  // the row outer scales' alphas (apply_outer_alpha; row_t in memory()).
  virtual void encode(double* v, const QuantSpec& q, const void* codes, const void* scale_codes, int64_t rows,
                      int64_t cols) = 0;
  virtual void grouped_gemm(float* C, const double* A, const double* B, int64_t M, int64_t N, int64_t K,
                            const GemmModel& model, float alpha) = 0;
  virtual void outer_alpha(float* C, int64_t M, int64_t N, float t_a, const float* row_t_a, float t_b,
                           const float* row_t_b) = 0;
  // Why a quantization call of spec q cannot run here (a recipe is refused
  // when its linears are made, before training), or null when it can.
  virtual const char* unsupported(const QuantSpec& q) const {
    (void)q;
    return nullptr;
  }
};

// The CPU's: host memory and the CPU paths.
QuantOps& cpu_quant_ops();

}  // namespace exmy::sim::quant

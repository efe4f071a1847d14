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
  // Whether the grouped GEMM output model runs here.
  virtual bool runs_grouped() const = 0;
};

// The CPU's: host memory and the CPU paths.
QuantOps& cpu_quant_ops();

}  // namespace exmy::sim::quant

#include "sim/quant/quant_ops.hpp"

#include "sim/gemm.hpp"
#include "sim/linear.hpp"
#include "sim/parallel.hpp"
#include "sim/quant/grouped_gemm.hpp"
#include "sim/quant/kernels.hpp"

namespace exmy::sim::quant {

namespace {

class CpuQuantOps final : public QuantOps {
 public:
  const char* name() const override { return "cpu"; }
  Memory& memory() override { return host_memory(); }
  void transpose(float* dst, const float* src, int64_t rows, int64_t cols) override {
    quant::transpose(dst, src, rows, cols);
  }
  void round_bf16(float* dst, const float* src, int64_t n) override { sim::round_bf16(dst, src, n); }
  void rht(const QuantSpec& q, float* x, int64_t rows, int64_t cols) override {
    hadamard(x, rows, cols, 1, rht_of(q));
  }
  QuantInfo quantize(const QuantSpec& q, const float* x, int64_t rows, int64_t cols,
                     const QuantOutput& out) override {
    return exmy::quantize(q, x, rows, cols, out);
  }
  void gemm_nt(float* C, const float* A, const float* B, int64_t M, int64_t N, int64_t K) override {
    gemm(C, N, A, K, Op::N, B, K, Op::T, M, N, K, false);
  }
  void add(float* dst, const float* src, int64_t n) override {
#pragma omp parallel for schedule(static) if (n >= parallel_min_work())
    for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
  }
  void encode(double* v, const QuantSpec& q, const void* codes, const void* scale_codes, int64_t rows,
              int64_t cols) override {
    encode_operand(v, q, codes, scale_codes, rows, cols);
  }
  void grouped_gemm(float* C, const double* A, const double* B, int64_t M, int64_t N, int64_t K,
                    const GemmModel& model, float alpha) override {
    quant::grouped_gemm(C, A, B, M, N, K, model, alpha);
  }
  void outer_alpha(float* C, int64_t M, int64_t N, float t_a, const float* row_t_a, float t_b,
                   const float* row_t_b) override {
    apply_outer_alpha(C, M, N, t_a, row_t_a, t_b, row_t_b);
  }
};

}  // namespace

QuantOps& cpu_quant_ops() {
  static CpuQuantOps* ops = new CpuQuantOps;  // never destroyed (see sim::host_memory)
  return *ops;
}

}  // namespace exmy::sim::quant

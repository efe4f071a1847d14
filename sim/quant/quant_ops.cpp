#include "sim/quant/quant_ops.hpp"

#include "formats/launch_profile.hpp"

#include <cstring>
#include <vector>

#include "sim/gemm.hpp"
#include "sim/linear.hpp"
#include "sim/parallel.hpp"
#include "sim/quant/grouped_gemm.hpp"
#include "sim/quant/kernels.hpp"
#include "sim/quant/stats.hpp"

namespace exmy::sim::quant {

namespace {

class CpuQuantOps final : public QuantOps {
 public:
  const char* name() const override { return "cpu"; }
  Memory& memory() override { return host_memory(); }
  void transpose(float* dst, const float* src, int64_t rows, int64_t cols) override {
    launch_profile_host("transpose", 0, [&] { quant::transpose(dst, src, rows, cols); });
  }
  void round_bf16(float* dst, const float* src, int64_t n) override {
    launch_profile_host("round_bf16", 0, [&] { sim::round_bf16(dst, src, n); });
  }
  void rht(const QuantSpec& q, float* x, int64_t rows, int64_t cols) override {
    launch_profile_host("rht", 0, [&] { hadamard(x, rows, cols, 1, rht_of(q)); });
  }
  QuantInfo quantize(const QuantSpec& q, const float* x, int64_t rows, int64_t cols,
                     const QuantOutput& out) override {
    QuantInfo info;
    launch_profile_host("quantize", 0, [&] { info = exmy::quantize(q, x, rows, cols, out); });
    return info;
  }
  void add(float* dst, const float* src, int64_t n) override {
#pragma omp parallel for schedule(static) if (n >= parallel_min_work())
    for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
  }
  void encode(double* v, const QuantSpec& q, const void* codes, const void* scale_codes, int64_t rows,
              int64_t cols) override {
    launch_profile_host("encode (grouped model)", 0, [&] { encode_operand(v, q, codes, scale_codes, rows, cols); });
  }
  void grouped_gemm(float* C, const double* A, const double* B, int64_t M, int64_t N, int64_t K,
                    const GemmModel& model, float alpha) override {
    launch_profile_host("grouped gemm", gemm_flops(M, N, K), [&] { quant::grouped_gemm(C, A, B, M, N, K, model, alpha); });
  }
  void outer_alpha(float* C, int64_t M, int64_t N, float t_a, const float* row_t_a, float t_b,
                   const float* row_t_b) override {
    apply_outer_alpha(C, M, N, t_a, row_t_a, t_b, row_t_b);
  }
  double abs_max(const float* x, int64_t n) override { return quant::abs_max(x, n); }
  void add_block_ranges(const float* x, int64_t rows, int64_t cols, int block_rows, int block_cols,
                        OperandStats& st) override {
    launch_profile_host("statistics: block ranges", 0,
                        [&] { quant::add_block_ranges(x, rows, cols, block_rows, block_cols, st); });
  }
  void add_scale_codes(const ScaleCodeTable& table, const void* codes, int64_t blocks, OperandStats& st) override {
    table.add(codes, blocks, st);
  }
  void gather_rows(float* dst, const float* src, int64_t ld, int64_t M, int64_t R) override {
    for (int64_t i = 0; i < R; ++i)
      std::memcpy(dst + i * ld, src + sampled_row(i, M, R) * ld, sizeof(float) * static_cast<size_t>(ld));
  }
  void gather_columns(float* dst, const float* src, int64_t rows, int64_t cols, int64_t R) override {
    // Row by row of src, so that it is read in order (its sampled columns
    // lie a cache line or more apart: column by column, every read would
    // miss); the R rows being written stay in cache.
    std::vector<int64_t> col(static_cast<size_t>(R));
    for (int64_t i = 0; i < R; ++i) col[static_cast<size_t>(i)] = sampled_row(i, cols, R);
    for (int64_t t = 0; t < rows; ++t) {
      const float* row = src + t * cols;
      for (int64_t i = 0; i < R; ++i) dst[i * rows + t] = row[col[static_cast<size_t>(i)]];
    }
  }
  void gemm(float* C, int64_t ldc, const float* A, int64_t lda, Op opA, const float* B, int64_t ldb, Op opB,
            int64_t M, int64_t N, int64_t K) override {
    launch_profile_host("gemm (quantized operands, sim::gemm)",
                        gemm_flops(M, N, K),
                        [&] { sim::gemm(C, ldc, A, lda, opA, B, ldb, opB, M, N, K, false); });
  }
};

}  // namespace

QuantOps& cpu_quant_ops() {
  static CpuQuantOps* ops = new CpuQuantOps;  // never destroyed (see sim::host_memory)
  return *ops;
}

}  // namespace exmy::sim::quant

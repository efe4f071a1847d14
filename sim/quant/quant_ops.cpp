#include "sim/quant/quant_ops.hpp"

#include "formats/launch_profile.hpp"

#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "sim/gemm.hpp"
#include "sim/linear.hpp"
#include "sim/parallel.hpp"
#include "sim/quant/grouped_gemm.hpp"
#include "sim/quant/kernels.hpp"
#include "sim/quant/quant_launches.hpp"
#include "sim/quant/stats.hpp"

namespace exmy::sim::quant {

QuantInfo QuantOps::quantize_recorded(const QuantSpec& q, const float* x, int64_t rows, int64_t cols,
                                      const QuantOutput& out, bool, float* t_out, OperandStats& os) {
  QuantOutput o = out;
  o.stats = &os.q;
  const QuantInfo info = quantize(q, x, rows, cols, o, true, t_out);
  os.reference = info.amax;
  os.tensor_scale = info.t;
  return info;
}

void QuantOps::operand_stats(const float* x, int64_t rows, int64_t cols, bool amax, const ScaleCodeTable* table,
                             const void* scale_codes, int64_t blocks, int block_rows, int block_cols,
                             OperandStats& st) {
  if (amax) abs_max_later(x, rows * cols, &st.amax);
  if (table) {
    add_scale_codes(*table, scale_codes, blocks, st);
    add_block_ranges(x, rows, cols, block_rows, block_cols, st);
  }
}

void QuantOps::compare_rows(const float* got, int64_t got_rows, const float* ref, int64_t N,
                            const std::vector<int64_t>& rows, GemmStats* dst) {
  const int64_t R = rows.empty() ? got_rows : static_cast<int64_t>(rows.size());
  std::vector<float> got_host, ref_host;
  *dst = compare_gemm(host_view(memory(), got, got_rows * N, got_host), host_view(memory(), ref, R * N, ref_host),
                      got_rows, N, rows);
}

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
  QuantInfo quantize(const QuantSpec& q, const float* x, int64_t rows, int64_t cols, const QuantOutput& out, bool,
                     float* t_out) override {
    QuantInfo info;
    launch_profile_host("quantize", 0, [&] { info = exmy::quantize(q, x, rows, cols, out); });
    if (t_out) *t_out = info.t;
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
  void encode_bf16(uint16_t* v, const QuantSpec& q, const void* codes, const void* scale_codes, int64_t rows,
                   int64_t cols) override {
    launch_profile_host("encode_bf16 (fp32 model in BF16)", 0,
                        [&] { encode_operand_bf16(v, q, codes, scale_codes, rows, cols); });
  }
  void gemm_bf16(float* C, const uint16_t* A, const uint16_t* B, int64_t M, int64_t N, int64_t K,
                 float alpha) override {
    launch_profile_host("gemm (quantized operands in BF16, sim::gemm)", gemm_flops(M, N, K),
                        [&] { gemm_bf16_host(C, A, B, M, N, K, alpha); });
  }
  void gemm_bf16_scaled(float* C, const uint16_t* A, const uint16_t* B, int64_t M, int64_t N, int64_t K,
                        const float* t_a, const float* t_b) override {
    gemm_bf16(C, A, B, M, N, K, tensor_decode_alpha(*t_a, *t_b));
  }
  void grouped_gemm_scaled(float* C, const double* A, const double* B, int64_t M, int64_t N, int64_t K,
                           const GemmModel& model, const float* t_a, const float* t_b) override {
    grouped_gemm(C, A, B, M, N, K, model, tensor_decode_alpha(*t_a, *t_b));
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

namespace {

// Every finite value of f's magnitudes (both signs are symmetric).
std::vector<double> finite_magnitudes(const Format& f) {
  std::vector<double> v;
  v.reserve(f.max_mag + 1);
  for (uint32_t m = 0; m <= f.max_mag; ++m) v.push_back(f.mag_value(m));
  return v;
}

bool held_by_bf16(const Format& elem, const Format* scale) {
  const double pairs = (elem.max_mag + 1.0) * (scale ? scale->max_mag + 1.0 : 1.0);
  if (pairs > double(1 << 22)) return false;
  const std::vector<double> e = finite_magnitudes(elem);
  const std::vector<double> s = scale ? finite_magnitudes(*scale) : std::vector<double>{1.0};
  for (const double b : s)
    for (const double a : e) {
      const double v = a * b;  // exact: two significands of at most 24 bits
      const float f = static_cast<float>(v);
      if (static_cast<double>(f) != v || (bits_of(f) & 0xffffu) != 0) return false;  // not a float, or not a bfloat16
    }
  return true;
}

std::string format_key(const Format& f) {
  return std::to_string(f.E) + "," + std::to_string(f.M) + "," + std::to_string(f.is_signed) + "," +
         std::to_string(f.bias) + "," + std::to_string(f.subnormals) + "," + std::to_string(f.has_inf) + "," +
         std::to_string(f.nans) + "," + std::to_string(f.negzero);
}

}  // namespace

bool bf16_holds_encoded(const QuantSpec& q) {
  static std::mutex mu;
  static std::map<std::string, bool> known;
  const Format* scale = q.scale ? &*q.scale : nullptr;
  const std::string key = format_key(q.elem) + "/" + (scale ? format_key(*scale) : "-");
  std::lock_guard<std::mutex> lock(mu);
  const auto it = known.find(key);
  if (it != known.end()) return it->second;
  return known[key] = held_by_bf16(q.elem, scale);
}

void gemm_bf16_host(float* C, const uint16_t* A, const uint16_t* B, int64_t M, int64_t N, int64_t K, float alpha) {
  // The operands widened to float (exact) into buffers kept for the next
  // call: sim::gemm multiplies float32. (Host memory outside the plan's
  // scratch: 4 bytes an element of the largest A and B, only where the CPU
  // or cuda-emulated runs `train.fp32_gemm = bf16`, which is not their
  // default.)
  thread_local std::vector<float> a, b;
  const auto widen = [](std::vector<float>& dst, const uint16_t* src, int64_t n) {
    if (dst.size() < static_cast<size_t>(n)) dst.resize(static_cast<size_t>(n));
    float* d = dst.data();
#pragma omp parallel for schedule(static) if (n >= parallel_min_work())
    for (int64_t i = 0; i < n; ++i) d[i] = bf16_value(src[i]);
  };
  widen(a, A, M * K);
  widen(b, B, N * K);
  sim::gemm(C, N, a.data(), K, Op::N, b.data(), K, Op::T, M, N, K, false);
  if (alpha != 1.0f) {
    const int64_t n = M * N;
#pragma omp parallel for schedule(static) if (n >= parallel_min_work())
    for (int64_t i = 0; i < n; ++i) C[i] = alpha * C[i];
  }
}

QuantOps& cpu_quant_ops() {
  static CpuQuantOps* ops = new CpuQuantOps;  // never destroyed (see sim::host_memory)
  return *ops;
}

}  // namespace exmy::sim::quant

#include "sim/train/training_device.hpp"

#include <algorithm>

#include "formats/cuda/quantize_cuda.hpp"
#include "formats/launch_profile.hpp"
#include "sim/adamw_update.hpp"
#include "sim/gemm.hpp"
#include "sim/quant/cuda/grouped_gemm_cuda.hpp"
#include "sim/quant/device_stats.hpp"
#include "sim/quant/quant_launches.hpp"

#if defined(EXMY_HAVE_CUDA)
#include <cuda_runtime.h>

#include "models/cuda/backend_cuda.hpp"
#include "sim/cuda/gemm_cuda.hpp"
#include "sim/cuda/linear_cuda.hpp"
#endif

namespace exmy::train {

namespace {

// The grouped model's scratch (sim/quant/grouped_launches.hpp), grown in a
// memory as needed.
struct GroupedScratch {
  sim::MemBuf<sim::quant::GroupRange> ranges;
  sim::quant::GroupRange* get(sim::Memory& m, int64_t M, int64_t N, int64_t K, const sim::quant::GemmModel& model) {
    ranges.place(m);
    const int64_t n = std::max<int64_t>(1, sim::quant::grouped_gemm_scratch(M, N, K, model));
    if (ranges.size() < n) ranges.resize_zero(n);
    return ranges.data();
  }
};

// What the device's quantized-linear ops share: their memory and name, the
// grouped model's scratch and the statistics' reductions (through the
// launcher's kernels). Their quantizer runs every spec the CPU's does.
class DeviceQuantOps : public sim::quant::QuantOps {
 public:
  DeviceQuantOps(const char* name, sim::Memory& memory, const sim::quant::StatsKernels& stats)
      : name_(name), mem_(memory), stats_(memory, stats) {}
  const char* name() const final { return name_; }
  sim::Memory& memory() final { return mem_; }
  // A statistics step waits once, at collect_stats (sim/quant/device_stats.hpp).
  bool defers_stats() const final { return true; }
  void collect_stats() final { stats_.collect(); }
  QuantInfo quantize_recorded(const QuantSpec& q, const float* x, int64_t rows, int64_t cols, const QuantOutput& out,
                              bool need_info, float* t_out, sim::quant::OperandStats& os) final {
    if (need_info || q.outer == OuterScale::row)  // (such a call waits anyway)
      return QuantOps::quantize_recorded(q, x, rows, cols, out, need_info, t_out, os);
    QuantRecord* record = stats_.record_later([&os](const QuantRecord& r) {
      os.q = r.stats;
      os.reference = r.amax;
      os.tensor_scale = r.t;
    });
    QuantOutput o = out;
    o.stats = nullptr;
    return quantize_into_record(q, x, rows, cols, o, t_out, record);
  }
  double abs_max(const float* x, int64_t n) final { return stats_.abs_max(x, n); }
  void abs_max_later(const float* x, int64_t n, double* dst) final { stats_.abs_max_later(x, n, dst); }
  void operand_stats(const float* x, int64_t rows, int64_t cols, bool amax, const sim::quant::ScaleCodeTable* table,
                     const void* scale_codes, int64_t blocks, int block_rows, int block_cols,
                     sim::quant::OperandStats& st) final {
    if (table && (!table->tabled() || table->code_bytes() > 2))  // (codes counted on the host)
      return QuantOps::operand_stats(x, rows, cols, amax, table, scale_codes, blocks, block_rows, block_cols, st);
    if (!table) {
      if (amax) stats_.abs_max_later(x, rows * cols, &st.amax);
      return;
    }
    stats_.operand_later(x, rows, cols, block_rows, block_cols, table, scale_codes, amax ? &st.amax : nullptr, st);
  }
  void compare_rows(const float* got, int64_t got_rows, const float* ref, int64_t N, const std::vector<int64_t>& rows,
                    sim::quant::GemmStats* dst) final {
    if (!rows.empty()) return QuantOps::compare_rows(got, got_rows, ref, N, rows, dst);  // (the host's copies)
    stats_.compare_gemm_later(got, ref, got_rows, N, dst);
  }
  void add_block_ranges(const float* x, int64_t rows, int64_t cols, int block_rows, int block_cols,
                        sim::quant::OperandStats& st) final {
    stats_.add_block_ranges(x, rows, cols, block_rows, block_cols, st);
  }
  void add_scale_codes(const sim::quant::ScaleCodeTable& table, const void* codes, int64_t blocks,
                       sim::quant::OperandStats& st) final {
    stats_.add_scale_codes(table, codes, blocks, st);
  }
  void gather_rows(float* dst, const float* src, int64_t ld, int64_t M, int64_t R) final {
    stats_.gather_rows(dst, src, ld, M, R);
  }
  void gather_columns(float* dst, const float* src, int64_t rows, int64_t cols, int64_t R) final {
    stats_.gather_columns(dst, src, rows, cols, R);
  }

 protected:
  const char* name_;
  sim::Memory& mem_;
  GroupedScratch scratch_;
  sim::quant::DeviceStats stats_;
  sim::MemBuf<float> alpha_;  // gemm_bf16_scaled's and grouped_gemm_scaled's alpha, made where the ops run

  // quantize() with the call's statistics into `record` (in mem_), need_info
  // false: the backend's quantizer leaving its record where it runs.
  virtual QuantInfo quantize_into_record(const QuantSpec& q, const float* x, int64_t rows, int64_t cols,
                                         const QuantOutput& out, float* t_out, QuantRecord* record) = 0;

  // That alpha from the two tensor scales, by the launcher's decode_alpha.
  float* made_alpha(void (*decode_alpha)(float*, const float*, const float*), const float* t_a, const float* t_b) {
    float* const alpha = sim::quant::ensure(alpha_, 1, mem_);
    decode_alpha(alpha, t_a, t_b);
    return alpha;
  }
};

// The quantized linears on cuda-emulated: the device's quantizer and small
// kernels with their threads run on the host. The GEMM is the CPU's (the
// device's cuBLASLt has no emulation; only its accumulation order differs).
class EmulatedQuantOps final : public DeviceQuantOps {
 public:
  explicit EmulatedQuantOps(sim::Memory& memory)
      : DeviceQuantOps("cuda-emulated", memory, sim::quant::stats_kernels_emulated()) {}
  void transpose(float* dst, const float* src, int64_t rows, int64_t cols) override {
    sim::quant::transpose_emulated(dst, src, rows, cols);
  }
  void round_bf16(float* dst, const float* src, int64_t n) override { sim::quant::round_bf16_emulated(dst, src, n); }
  void rht(const QuantSpec& q, float* x, int64_t rows, int64_t cols) override { apply_rht_emulated(q, x, rows, cols); }
  QuantInfo quantize(const QuantSpec& q, const float* x, int64_t rows, int64_t cols, const QuantOutput& out, bool,
                     float* t_out) override {
    QuantInfo info;
#if defined(EXMY_HAVE_CUDA)
    launch_profile_host("quantize (host emulation of the kernels)", 0,
                        [&] { info = quantize_cuda_emulated(q, x, rows, cols, out); });
#else
    // A build without CUDA has no emulation of the device quantizer (it is
    // made from formats/cuda/quantize.cu): the CPU's quantizer, whose bits
    // the emulation equals (tests/formats/test_cuda.cpp).
    launch_profile_host("quantize (the CPU's: a build without CUDA)", 0,
                        [&] { info = exmy::quantize(q, x, rows, cols, out); });
#endif
    if (t_out) *t_out = info.t;  // (the host's memory)
    return info;
  }
  QuantInfo quantize_into_record(const QuantSpec& q, const float* x, int64_t rows, int64_t cols,
                                 const QuantOutput& out, float* t_out, QuantRecord* record) override {
    QuantInfo info;
#if defined(EXMY_HAVE_CUDA)
    launch_profile_host("quantize (host emulation of the kernels)", 0,
                        [&] { info = quantize_cuda_emulated(q, x, rows, cols, out, record); });
#else
    QuantOutput o = out;
    o.stats = &record->stats;
    launch_profile_host("quantize (the CPU's: a build without CUDA)", 0,
                        [&] { info = exmy::quantize(q, x, rows, cols, o); });
    record->amax = info.amax;
    record->t = info.t;
#endif
    if (t_out) *t_out = info.t;
    return info;
  }
  void gemm(float* C, int64_t ldc, const float* A, int64_t lda, sim::Op opA, const float* B, int64_t ldb,
            sim::Op opB, int64_t M, int64_t N, int64_t K) override {
    launch_profile_host("gemm (quantized operands, sim::gemm)",
                        sim::gemm_flops(M, N, K),
                        [&] { sim::gemm(C, ldc, A, lda, opA, B, ldb, opB, M, N, K, false); });
  }
  void add(float* dst, const float* src, int64_t n) override { sim::quant::add_emulated(dst, src, n); }
  void encode(double* v, const QuantSpec& q, const void* codes, const void* scale_codes, int64_t rows,
              int64_t cols) override {
    sim::quant::encode_emulated(v, sim::quant::encode_plan(q), codes, scale_codes, rows, cols);
  }
  void grouped_gemm(float* C, const double* A, const double* B, int64_t M, int64_t N, int64_t K,
                    const sim::quant::GemmModel& model, float alpha) override {
    sim::quant::grouped_gemm_emulated(C, A, B, M, N, K, model, alpha, scratch_.get(mem_, M, N, K, model));
  }
  void grouped_gemm_scaled(float* C, const double* A, const double* B, int64_t M, int64_t N, int64_t K,
                           const sim::quant::GemmModel& model, const float* t_a, const float* t_b) override {
    const float* alpha = made_alpha(sim::quant::decode_alpha_emulated, t_a, t_b);
    sim::quant::grouped_gemm_emulated(C, A, B, M, N, K, model, {1.0f, alpha}, scratch_.get(mem_, M, N, K, model));
  }
  void outer_alpha(float* C, int64_t M, int64_t N, float t_a, const float* row_t_a, float t_b,
                   const float* row_t_b) override {
    sim::quant::apply_outer_alpha_emulated(C, M, N, t_a, row_t_a, t_b, row_t_b);
  }
  void encode_bf16(uint16_t* v, const QuantSpec& q, const void* codes, const void* scale_codes, int64_t rows,
                   int64_t cols) override {
    sim::quant::encode_bf16_emulated(v, sim::quant::encode_plan(q), codes, scale_codes, rows, cols);
  }
  void gemm_bf16(float* C, const uint16_t* A, const uint16_t* B, int64_t M, int64_t N, int64_t K,
                 float alpha) override {
    launch_profile_host("gemm (quantized operands in BF16, sim::gemm)", sim::gemm_flops(M, N, K),
                        [&] { sim::quant::gemm_bf16_host(C, A, B, M, N, K, alpha); });
  }
  void gemm_bf16_scaled(float* C, const uint16_t* A, const uint16_t* B, int64_t M, int64_t N, int64_t K,
                        const float* t_a, const float* t_b) override {
    float alpha = 0;
    sim::quant::decode_alpha_emulated(&alpha, t_a, t_b);
    gemm_bf16(C, A, B, M, N, K, alpha);
  }
};

#if defined(EXMY_HAVE_CUDA)
// The quantized linears on a CUDA device: the quantizer on device tensors,
// cuBLASLt for the fp32 GEMM model, the small kernels as CUDA launches.
class CudaQuantOps final : public DeviceQuantOps {
 public:
  CudaQuantOps(sim::Memory& memory, sim::CudaGemm& gemm)
      : DeviceQuantOps("cuda", memory, sim::quant::stats_kernels_cuda()), gemm_(gemm) {}
  void transpose(float* dst, const float* src, int64_t rows, int64_t cols) override {
    sim::quant::transpose_cuda(dst, src, rows, cols);
  }
  void round_bf16(float* dst, const float* src, int64_t n) override { sim::quant::round_bf16_cuda(dst, src, n); }
  void rht(const QuantSpec& q, float* x, int64_t rows, int64_t cols) override { apply_rht_cuda(q, x, rows, cols); }
  // Calls need not wait for the device (CudaQuantizer's wait = false): an
  // unrepresentable element is reported at the next check_deferred, which
  // QuantRuntime::begin and ::finish call.
  QuantInfo quantize(const QuantSpec& q, const float* x, int64_t rows, int64_t cols, const QuantOutput& out,
                     bool need_info, float* t_out) override {
    return quantizer_.run(q, x, rows, cols, out, /*wait=*/false, need_info, t_out);
  }
  QuantInfo quantize_into_record(const QuantSpec& q, const float* x, int64_t rows, int64_t cols,
                                 const QuantOutput& out, float* t_out, QuantRecord* record) override {
    return quantizer_.run(q, x, rows, cols, out, /*wait=*/false, /*need_info=*/false, t_out, record);
  }
  void check_deferred() override { quantizer_.check(); }
  void gemm(float* C, int64_t ldc, const float* A, int64_t lda, sim::Op opA, const float* B, int64_t ldb,
            sim::Op opB, int64_t M, int64_t N, int64_t K) override {
    gemm_.run(C, ldc, A, lda, opA, B, ldb, opB, M, N, K, false, sim::GemmOperands::fp32);
  }
  void add(float* dst, const float* src, int64_t n) override { sim::quant::add_cuda(dst, src, n); }
  void encode(double* v, const QuantSpec& q, const void* codes, const void* scale_codes, int64_t rows,
              int64_t cols) override {
    sim::quant::encode_cuda(v, sim::quant::encode_plan(q), codes, scale_codes, rows, cols);
  }
  void grouped_gemm(float* C, const double* A, const double* B, int64_t M, int64_t N, int64_t K,
                    const sim::quant::GemmModel& model, float alpha) override {
    sim::quant::grouped_gemm_cuda(C, A, B, M, N, K, model, alpha, scratch_.get(mem_, M, N, K, model));
  }
  void grouped_gemm_scaled(float* C, const double* A, const double* B, int64_t M, int64_t N, int64_t K,
                           const sim::quant::GemmModel& model, const float* t_a, const float* t_b) override {
    const float* alpha = made_alpha(sim::quant::decode_alpha_cuda, t_a, t_b);
    sim::quant::grouped_gemm_cuda(C, A, B, M, N, K, model, {1.0f, alpha}, scratch_.get(mem_, M, N, K, model));
  }
  void outer_alpha(float* C, int64_t M, int64_t N, float t_a, const float* row_t_a, float t_b,
                   const float* row_t_b) override {
    sim::quant::apply_outer_alpha_cuda(C, M, N, t_a, row_t_a, t_b, row_t_b);  // row_t in device memory
  }
  void encode_bf16(uint16_t* v, const QuantSpec& q, const void* codes, const void* scale_codes, int64_t rows,
                   int64_t cols) override {
    sim::quant::encode_bf16_cuda(v, sim::quant::encode_plan(q), codes, scale_codes, rows, cols);
  }
  void gemm_bf16(float* C, const uint16_t* A, const uint16_t* B, int64_t M, int64_t N, int64_t K,
                 float alpha) override {
    gemm_.run(C, N, A, K, sim::Op::N, B, K, sim::Op::T, M, N, K, false, sim::GemmOperands::bf16, alpha);
  }
  void gemm_bf16_scaled(float* C, const uint16_t* A, const uint16_t* B, int64_t M, int64_t N, int64_t K,
                        const float* t_a, const float* t_b) override {
    const float* alpha = made_alpha(sim::quant::decode_alpha_cuda, t_a, t_b);
    gemm_.run_device_alpha(C, N, A, K, sim::Op::N, B, K, sim::Op::T, M, N, K, sim::GemmOperands::bf16, alpha);
  }

 private:
  sim::CudaGemm& gemm_;
  CudaQuantizer quantizer_;
};
#endif

}  // namespace

bool cuda_device_memory(const sim::Device& d, size_t* free_bytes, size_t* total_bytes) {
#if defined(EXMY_HAVE_CUDA)
  if (!d.is_cuda()) return false;
  sim::require_device(d, "train.device");
  return cudaMemGetInfo(free_bytes, total_bytes) == cudaSuccess;
#else
  (void)d, (void)free_bytes, (void)total_bytes;
  return false;
#endif
}

bool cuda_available_memory(const sim::Device& d, sim::AvailableMemory* out) {
  size_t free_b = 0, total_b = 0;
  if (!cuda_device_memory(d, &free_b, &total_b)) return false;
  out->bytes = static_cast<double>(free_b);
  out->source = sim::device_name(d) + ": " + sim::gib_text(static_cast<double>(free_b)) + " free of " +
                sim::gib_text(static_cast<double>(total_b));
  return true;
}

TrainingDevice::TrainingDevice(const sim::Device& d) : device_(d) {
  sim::require_training_device(d, "train.device");
  if (d.is_emulated()) {
    be_ = models::make_emulated_device_backend();
    optim_ = {sim::adamw_update_emulated, sim::global_norm_partials_emulated, sim::adamw_bf16_update_emulated};
    quant_ = std::make_unique<EmulatedQuantOps>(be_->memory());
  } else if (d.is_cuda()) {
#if defined(EXMY_HAVE_CUDA)
    be_ = models::make_cuda_backend(d.index);
    optim_ = {sim::adamw_update_cuda, sim::global_norm_partials_cuda, sim::adamw_bf16_update_cuda};
    gemm_ = std::make_shared<sim::CudaGemm>();
    quant_ = std::make_unique<CudaQuantOps>(be_->memory(), *static_cast<sim::CudaGemm*>(gemm_.get()));
#endif
  }
}

TrainingDevice::~TrainingDevice() = default;

sim::Memory* TrainingDevice::offload_memory() {
#if defined(EXMY_HAVE_CUDA)
  if (device_.is_cuda()) return &models::cuda_pinned_memory();
#endif
  return device_.is_emulated() ? &sim::host_memory() : nullptr;
}

std::unique_ptr<sim::LinearFactory<float>> TrainingDevice::plain_linears(std::string_view policy) {
#if defined(EXMY_HAVE_CUDA)
  if (device_.is_cuda()) {
    return sim::make_cuda_linear_factory(policy, *static_cast<sim::CudaGemm*>(gemm_.get()));
  }
#endif
  // The CPU's linears: the CPU's memory, and cuda-emulated's, which is the host's.
  return sim::make_linear_factory<float>(policy);
}

}  // namespace exmy::train

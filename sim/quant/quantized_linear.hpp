// The quantized linear layer and the recipe's linear factory.
//
// QuantizedLinear runs the three GEMMs of docs/recipes.md §1 with both operands of
// each quantized per role, along that GEMM's reduction dimension K. Every
// operand is quantized from the high-precision tensor the model passes in
// (never from another role's quantized copy), in the K-major layout the GEMM
// consumes, C (M,N) = A (M,K) · B (N,K)^T:
//
//   GEMM   A (rows M)              B (rows N)              K
//   fprop  fprop-x  X  (tokens,in)  fprop-w  W   (out,in)   in
//   dgrad  dgrad-dy dY (tokens,out) dgrad-w  W^T (in,out)   out
//   wgrad  wgrad-dy dY^T(out,tokens) wgrad-x X^T (in,tokens) tokens
//
// so a recipe's 1xB block runs along K, and a BxB weight tile of W^T is the
// transposed tile of W (the 2D tiles are shared by both views). With the
// RHT on, both operands of the GEMM are transformed along K (the transform
// cancels in the product). Then the GEMM output model: `fp32` multiplies the
// decoded operands with FP32 accumulation (sim::gemm; or, with
// RuntimeOptions::fp32_gemm = bf16, the encoded operands in BF16 with the
// tensor scales applied to the result); `grouped` runs
// grouped_gemm on the encoded operands. backward() accumulates into dX and
// dW like every layer (the GEMM result is formed first, then added).
//
// State shared by all linears of a model lives in a QuantRuntime: the step
// context (optimizer step, micro-batch, whether to collect statistics or
// capture operands), the tensor references, the sinks and the scratch
// buffers. The training loop calls runtime.begin(...) before each
// micro-batch's forward. Linears of one runtime must be called one at a
// time (models/ does).
#pragma once

#include <array>
#include <deque>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "sim/linear.hpp"
#include "sim/quant/fp32_gemm.hpp"
#include "sim/quant/recipe.hpp"
#include "sim/quant/reference.hpp"
#include "sim/quant/kernels.hpp"
#include "sim/quant/quant_ops.hpp"
#include "sim/quant/stats.hpp"
#include "sim/tensor.hpp"

namespace exmy::sim::quant {

struct RuntimeOptions {
  uint64_t seed = 0;  // Philox seed of every stochastic rounding call (the run's seed)
  // GEMM statistics compare R = min(gemm_stats_rows, ceil(M/gemm_stats_sample))
  // output rows (evenly spread: floor(i*M/R)) with the unquantized GEMM, so
  // the reference GEMM costs at most 1/gemm_stats_sample of the quantized one
  // and statistics at every step stay cheap; gemm_stats_rows = 0 compares all
  // M rows. One row in 64 (32 tokens of a 2048-token step, each with all N
  // outputs: tens of thousands of outputs) is plenty for the four figures;
  // one in 32 costs about three times as much on proxy-50m (docs/benchmarks.md,
  // "Statistics sums").
  int64_t gemm_stats_rows = 128;
  int64_t gemm_stats_sample = 64;
  Fp32Gemm fp32_gemm = Fp32Gemm::sgemm;
};

struct StepContext {
  int64_t step = 1;         // 1-based optimizer step
  int64_t micro_batch = 0;  // 0-based gradient-accumulation micro-batch
  bool stats = false;       // record OperandStats / GemmStats to the stats sink
  bool capture = false;     // hand every operand to the capture sink
};

class QuantRuntime {
 public:
  explicit QuantRuntime(RuntimeOptions opt = {}) : opt_(opt) {}

  // Sets the context of the calls that follow. Throws exmy::Error for a step
  // < 1 or a negative micro-batch.
  void begin(const StepContext& ctx);
  // Brings the statistics the ops left where they run to the host
  // (QuantOps::collect_stats: one copy, one wait) and hands every complete
  // record to the stats sink in call order; then throws what the ops' calls
  // that did not wait left to report (an unrepresentable element;
  // QuantOps::check_deferred). The trainer calls it after each
  // micro-batch's backward, before the gradients are used; begin() calls
  // it too.
  void finish();
  const StepContext& context() const { return ctx_; }
  const RuntimeOptions& options() const { return opt_; }

  ReferenceStore& references() { return refs_; }
  void set_stats_sink(StatsSink* s) { stats_ = s; }
  void set_capture_sink(CaptureSink* c) { capture_ = c; }
  StatsSink* stats_sink() const { return stats_; }
  CaptureSink* capture_sink() const { return capture_; }
  // Where the linears' tensors live and run (the CPU unless set; set it
  // before the first call).
  QuantOps& ops() const { return *ops_; }
  void set_ops(QuantOps& ops) { ops_ = &ops; }

  // Scratch shared by the linears (implementation detail).
  // In ops().memory(): every MemBuf (row_t included); on the host: the
  // copy of what the host reads from a device (captures).
  struct OperandBuffers {
    MemBuf<float> hp;  // transposed and/or RHT'd high-precision operand
    MemBuf<float> dq;  // decoded operand
    MemBuf<uint8_t> codes, scale_codes;
    MemBuf<double> enc;  // encoded operand (grouped GEMM)
    MemBuf<uint16_t> bf16;  // encoded operand as bfloat16 bits (fp32 model, Fp32Gemm::bf16)
    MemBuf<float> t;        // its tensor encode scale, where the ops run (gemm_bf16_scaled)
    MemBuf<float> row_t;  // row outer scales: each row's encode scale (for ops().outer_alpha)
  };
  struct Scratch {
    OperandBuffers side[2];
    MemBuf<float> out;
    MemBuf<float> ref, gather, got;  // the GEMM statistics' reference, sampled operand rows, sampled output rows
    std::vector<float> host;         // a copy from a device: the captured operand
    bool busy = false;
  };
  Scratch& scratch() { return scratch_; }

  // A statistics record of one call (implementation detail): the linear
  // fills it through its ops (at once, or on ops that defer statistics at
  // finish()) and closes it; closed records reach the sink in call order,
  // at close on ops that fill at once, at finish() otherwise. A record
  // refers to its linear (the key's layer name, the scale-code table the
  // ops read at collect): the linears live until finish(), as the
  // trainer's do (the runtime, the model and the ops end together).
  struct Record {
    CallKey key;
    bool gemm = false;
    bool amax_is_reference = false;  // a `current` call: its amax is the reference it measured
    bool closed = false;
    OperandStats operand;
    GemmStats gemm_stats;
  };
  Record& open_record(const CallKey& key, bool gemm);
  void close_record(Record& r);

 private:
  void hand_records();

  RuntimeOptions opt_;
  StepContext ctx_;
  ReferenceStore refs_;
  StatsSink* stats_ = nullptr;
  CaptureSink* capture_ = nullptr;
  QuantOps* ops_ = &cpu_quant_ops();
  Scratch scratch_;
  std::deque<Record> records_;  // (a deque: the ops fill records in place, later)
};

class QuantizedLinear final : public Linear<float> {
 public:
  QuantizedLinear(const LinearInfo& info, const std::array<RoleSpec, kNumRoles>& specs, const GemmModel& gemm,
                  bool shared_dy_reference, std::shared_ptr<QuantRuntime> runtime);

  void forward(float* Y, const float* X, const float* W, int64_t tokens) override;
  // The forward again with the specs its forward of this step and
  // micro-batch decided (tensor references as they were then): the same Y,
  // and no statistics, capture or reference update.
  void recompute_forward(float* Y, const float* X, const float* W, int64_t tokens) override;
  void backward(float* dX, float* dW, const float* dY, const float* X, const float* W, int64_t tokens) override;

  const RoleSpec& spec(Role r) const { return specs_[static_cast<size_t>(r)]; }
  const GemmModel& gemm_model() const { return gemm_; }

 private:
  struct Operand {
    const float* dq = nullptr;    // decoded (rows, K)
    const double* enc = nullptr;  // encoded (grouped model)
    const uint16_t* bf16 = nullptr;  // encoded as bfloat16 bits (fp32 model in BF16)
    const float* t_at = nullptr;     // ... and t in the ops' memory (no row scales)
    float t = 1;                  // tensor encode scale
    const float* row_t = nullptr; // row outer scales: each row's (t then unused)
  };
  Operand quantize_operand(Role role, const float* src, int64_t src_rows, int64_t src_cols, bool transpose,
                           QuantRuntime::OperandBuffers& b);
  // One GEMM on two quantized operands into dst (overwrite, or add when
  // `accumulate`), with its statistics.
  void run_gemm(Gemm g, const Operand& a, const Operand& b, int64_t M, int64_t N, int64_t K, float* dst,
                bool accumulate, const float* X, const float* W, const float* dY, int64_t tokens);
  CallKey key(Gemm g, Role r) const;
  struct Quantized {
    Operand op;
    QuantInfo info;
    const float* hp = nullptr;  // the tensor quantized (after the RHT)
    int64_t blocks = 0;
  };
  Quantized quantize_decided(const QuantSpec& q, const float* hp, int64_t rows, int64_t cols,
                             QuantRuntime::OperandBuffers& b, OperandStats* stats, Gemm g, bool need_amax);

  // What the last quantization of each role decided (for recompute_forward).
  struct Decided {
    bool valid = false;
    int64_t step = 0, micro_batch = 0;
    QuantSpec q;
  };
  std::array<Decided, kNumRoles> decided_;
  bool replay_ = false;

  std::array<RoleSpec, kNumRoles> specs_;
  GemmModel gemm_;
  std::shared_ptr<QuantRuntime> rt_;
  std::array<ReferenceState*, kNumRoles> refs_{};
  std::array<ScaleCodeTable, kNumRoles> scale_tables_;
  std::array<bool, 3> bf16_gemm_{};  // per Gemm: the fp32 model's GEMM in BF16 (Fp32Gemm::bf16 and formats held)
  std::array<bool, 3> row_gemm_{};   // per Gemm: an operand has row outer scales (alphas made on the host's word)
};

// The bytes QuantRuntime's scratch (in its ops' memory, with the device
// ops' grouped-model scratch) grows to when each of `linears` that the
// recipe quantizes runs its forward and backward on `tokens` tokens, with
// statistics when `stats`: per buffer the largest call's size (MemBufs only
// grow, so the largest calls' buffers are all held at the end). For the
// memory plan of a run (sim/train: MemoryEstimate::quant_scratch). Not in
// it: a CUDA quantizer's own buffers (formats/cuda/quantize.cu), a few MiB
// in training: its copy for a random Hadamard transform and its values for
// statistics stay empty there, since the runtime rotates in its own
// scratch (the `hp` buffer above) and asks for values whenever statistics
// are on; its tables and statistics partials are small.
double quant_scratch_bytes(const Recipe& recipe, int64_t num_blocks, const std::vector<LinearInfo>& linears,
                           int64_t tokens, const RuntimeOptions& opt, bool stats);

// The recipe as a precision policy: quantized linears where the recipe's
// layer selection says so, the `unquantized` policy (bf16 or fp32)
// elsewhere. num_blocks is the model's num_hidden_layers (for first/last
// block selections).
class RecipeLinearFactory final : public LinearFactory<float> {
 public:
  // `unquantized` makes the linears the recipe leaves unquantized (null:
  // sim::make_linear_factory of the recipe's `unquantized` policy, on the
  // CPU; a device run passes the device's).
  RecipeLinearFactory(Recipe recipe, int64_t num_blocks, std::shared_ptr<QuantRuntime> runtime,
                      std::unique_ptr<LinearFactory<float>> unquantized = nullptr);
  std::string policy() const override { return "recipe:" + recipe_.name; }
  std::unique_ptr<Linear<float>> make(const LinearInfo& info) const override;

  const Recipe& recipe() const { return recipe_; }
  QuantRuntime& runtime() const { return *rt_; }
  const std::shared_ptr<QuantRuntime>& runtime_ptr() const { return rt_; }

  // What make() decided for each linear, in the order they were made: the
  // run's complete numeric plan, for logs and run files.
  struct PlanEntry {
    LinearInfo info;
    bool quantized = false;
    std::array<RoleSpec, kNumRoles> specs;  // when quantized
  };
  const std::vector<PlanEntry>& plan() const { return plan_; }
  // One line per linear: "NAME: bf16" or "NAME: ROLE{knob=value ...} ...".
  std::string plan_text() const;

 private:
  Recipe recipe_;
  int64_t num_blocks_;
  std::shared_ptr<QuantRuntime> rt_;
  std::unique_ptr<LinearFactory<float>> unquantized_;
  mutable std::vector<PlanEntry> plan_;
};

}  // namespace exmy::sim::quant

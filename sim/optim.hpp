// The optimizer side of a training step: the global gradient norm, clipping,
// AdamW with FP32 master weights, and the learning-rate schedules.
//
// Everything works on the whole parameter arena at once (sim/arena.hpp): the
// padding between views is zero in the parameters, the gradients and both
// moments, and every update maps zero to zero there, so one loop over the
// arena is exact. Elementwise updates are the same for any thread count; the
// one reduction (the gradient norm) adds fixed blocks in block order.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "sim/adamw_update.hpp"
#include "sim/arena.hpp"
#include "sim/memory.hpp"
#include "sim/tensor.hpp"

namespace exmy::sim {

// sqrt(sum g^2) of the arena times `scale`, summed in double over fixed
// blocks of kNormBlock elements (norm_block_partial, sim/adamw_update.hpp)
// whose partial sums are added in block order (global_norm_of_partials).
double global_norm(std::span<const float> g, double scale = 1.0);
double global_norm_of_partials(std::span<const double> part, double scale = 1.0);

// The optimizer's kernels for an arena the host cannot touch (a device
// backend's memory): sim/adamw_update.hpp's adamw_update_{emulated,cuda} and
// global_norm_partials_{emulated,cuda}. Null on the CPU.
struct OptimKernels {
  void (*adamw)(float* p, float* m, float* v, const float* g, int64_t n, float dk, const AdamWScalars& s) = nullptr;
  void (*norm_partials)(const float* g, int64_t n, double* part) = nullptr;
  // BF16 working weights: adamw_bf16_update_{emulated,cuda}.
  void (*adamw_bf16)(float* p, float* master, float* m, float* v, const float* g, int64_t n, float dk,
                     const AdamWScalars& s) = nullptr;
  bool on_device() const { return adamw != nullptr; }
};

// global_norm of g in `memory`: the block partials by k.norm_partials (the
// CPU's blocks and order), added on the host; the same bits as the CPU.
double global_norm(Memory& memory, const OptimKernels& k, std::span<const float> g, double scale = 1.0);

// The factor that brings a gradient of norm `norm` down to `max_norm`
// (PyTorch's clip_grad_norm_: max_norm / (norm + 1e-6), never above 1).
// max_norm <= 0 switches clipping off.
double clip_factor(double norm, double max_norm);

struct AdamWConfig {
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;  // decoupled; only on views flagged weight_decay (the arena's no-decay set is exempt)
};

struct AdamWScalars;  // sim/adamw_update.hpp

// The weights the model reads (train.working_weights): the FP32 weights the
// optimizer updates, or (bf16) those rounded to the nearest bfloat16 after
// every update, the optimizer keeping the FP32 master weights apart.
enum class WorkingWeights : uint8_t { fp32, bf16 };
// "fp32" | "bf16"; throws exmy::Error naming `key` and the accepted values.
WorkingWeights parse_working_weights(std::string_view name, std::string_view key = "train.working_weights");
std::string_view working_weights_name(WorkingWeights w);

// The FP32 scalars of update t (1-based) at learning rate lr: the bias
// corrections formed in double, each scalar rounded to float once.
AdamWScalars adamw_scalars(const AdamWConfig& cfg, int64_t t, double lr, double grad_scale);

// AdamW exactly as PyTorch's single-tensor implementation orders it, in FP32:
//   p *= 1 - lr*wd                      (decay views only)
//   m  = b1 m + (1-b1) g
//   v  = b2 v + (1-b2) g^2
//   p -= (lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps),   bc_i = 1 - b_i^t
// with g = grad * grad_scale (gradient-accumulation averaging and clipping
// folded into one factor) and t the 1-based update count. The bias
// corrections are formed in double and rounded to float once per step.
// The part of the arena one rank's optimizer updates when the optimizer
// state is sharded over the ranks of a data-parallel job (ZeRO-1): whole
// views [first_view, end_view), which occupy arena elements [begin, end)
// (the padding after each view included, so the shards of all ranks tile
// the arena). The whole arena is one shard.
struct OptimizerShard {
  int first_view = 0, end_view = 0;
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
};
OptimizerShard whole_arena(const ArenaLayout& layout);
// Rank r's shard of n: contiguous runs of views, rank r's starting at the
// first view that begins at or after r/n of the arena's elements (a rank may
// get none when there are fewer large views than ranks). Every element
// belongs to exactly one rank's shard, in rank order.
OptimizerShard optimizer_shard(const ArenaLayout& layout, int r, int n);
// The elements of the largest of n ranks' shards (what each rank's moments
// must have room for).
int64_t largest_shard(const ArenaLayout& layout, int n);

// Elements of the arena an offloaded AdamW moves per copy (64 MiB of FP32):
// its host staging buffer.
inline constexpr int64_t kOffloadChunk = int64_t{1} << 24;
// The staging buffers of kOffloadChunk elements an offloaded AdamW keeps on
// the host so that its copies overlap its update: two with FP32 working
// weights (one chunk's gradients arriving while the other's are used), three
// with BF16 (a chunk's rounded weights wait in their buffer until they have
// gone up).
inline constexpr int offload_staging_chunks(WorkingWeights w) { return w == WorkingWeights::bf16 ? 3 : 2; }

class AdamW {
 public:
  // The state of `shard` (default: the whole arena), in `memory`: the
  // host's, or a device backend's with its kernels (the arena's params and
  // grads given to step() are then in that memory too).
  //
  // With `offload` (train.offload = optimizer; a host memory, pinned for a
  // CUDA device), the arena stays in `memory` (a device's) but the state
  // moves to the host: the shard's FP32 master weights and both moments
  // live in *offload, and each step copies the gradients to the host in
  // chunks of kOffloadChunk elements, updates the master weights there
  // with the CPU's per-element update (the device kernel's arithmetic,
  // sim/adamw_update.hpp, so the same bits) and copies each chunk of
  // weights back into the arena; the copies are the memory's asynchronous
  // ones, the next chunk's gradients and the last chunk's weights moving
  // while the host updates a chunk, and all have landed when step returns. The device then holds only the working
  // weights and the gradients. The master copy is taken from the arena at
  // the first step and after master_from_params(), or at once by
  // take_master().
  //
  // With `working` = bf16 (train.working_weights) the optimizer keeps the
  // shard's FP32 master weights apart from the arena (in `memory` beside
  // the moments, or offloaded with them), updates them, and writes each
  // updated element's BF16 rounding into the arena (adamw_update_bf16,
  // sim/adamw_update.hpp): the arena holds the working weights the model
  // reads. The master must be taken with take_master() before the first
  // step (the arena's values are then the master weights, not yet rounded).
  AdamW(const ArenaLayout& layout, AdamWConfig cfg);
  AdamW(const ArenaLayout& layout, AdamWConfig cfg, OptimizerShard shard, Memory& memory = host_memory(),
        OptimKernels kernels = {}, Memory* offload = nullptr, WorkingWeights working = WorkingWeights::fp32);

  // Updates the shard's part of the (whole-arena) params from the
  // whole-arena grads; the rest of params is left as it is. Each element's
  // update depends only on that element, so the shards of n ranks together
  // give the bits of one whole-arena step.
  void step(std::span<float> params, std::span<const float> grads, double lr, double grad_scale);

  const AdamWConfig& config() const { return cfg_; }
  const OptimizerShard& shard() const { return shard_; }
  int64_t steps() const { return t_; }  // updates applied so far
  // The moments of the shard, shard-shaped (arena element begin + i is index
  // i), for checkpoints; set_steps restores t.
  // In memory(): device pointers on a device.
  std::span<float> exp_avg() { return {m_.data(), static_cast<size_t>(m_.size())}; }
  std::span<float> exp_avg_sq() { return {v_.data(), static_cast<size_t>(v_.size())}; }
  std::span<const float> exp_avg() const { return {m_.data(), static_cast<size_t>(m_.size())}; }
  std::span<const float> exp_avg_sq() const { return {v_.data(), static_cast<size_t>(v_.size())}; }
  Memory& memory() const { return m_.memory(); }
  // Whether view i is in the shard, and its moments (only then).
  bool owns(int view) const { return view >= shard_.first_view && view < shard_.end_view; }
  float* exp_avg_of(int view) { return m_.data() + local(view); }
  float* exp_avg_sq_of(int view) { return v_.data() + local(view); }
  const float* exp_avg_of(int view) const { return m_.data() + local(view); }
  const float* exp_avg_sq_of(int view) const { return v_.data() + local(view); }
  void set_steps(int64_t t) { t_ = t; }
  // Whether the state lives in host memory away from the arena's device.
  bool offloaded() const { return offloaded_; }
  // The arena's params were written other than by step() (a checkpoint
  // loaded): an offloaded optimizer takes its master weights from them
  // again at its next step. Nothing to do otherwise.
  void master_from_params() { master_valid_ = false; }
  // The working weights the arena holds (WorkingWeights::bf16: the master's
  // BF16 rounding).
  WorkingWeights working_weights() const { return working_; }
  // Whether FP32 master weights are kept apart from the arena (offloaded,
  // or BF16 working weights); they are then in memory(), shard-indexed.
  bool keeps_master() const { return offloaded_ || working_ == WorkingWeights::bf16; }
  // The arena's params hold FP32 master weights just written (an
  // initialization, a checkpoint or HF weights loaded): the shard's master
  // copy is taken from them now. Nothing to do for an optimizer that keeps
  // no master.
  void take_master(std::span<const float> params);
  // The shard's master weights written into the arena's params (the rest
  // left as it is): an FP32 export of a run with BF16 working weights.
  void master_to(std::span<float> params) const;
  // View i's master weights (an owned view of an optimizer that keeps_master).
  const float* master_of(int view) const { return master_.data() + local(view); }
  // Elements per staged copy of an offloaded optimizer (kOffloadChunk;
  // tests make it small so that chunks cut views and many are in flight).
  // Grows the staging buffers when needed.
  void set_offload_chunk(int64_t n);
  int64_t offload_chunk() const { return chunk_; }

 private:
  // step() of an offloaded optimizer.
  void step_offloaded(float* params, const float* grads, const AdamWScalars& s);

  AdamWConfig cfg_;
  // Index in the shard's moments of view i's first element.
  int64_t local(int view) const { return offsets_.at(static_cast<size_t>(view)) - shard_.begin; }

  OptimizerShard shard_;
  int64_t arena_size_ = 0;
  std::vector<int64_t> offsets_;                     // arena offset of every view
  std::vector<std::pair<int64_t, int64_t>> ranges_;  // (offset, numel) of each view of the shard
  std::vector<bool> decay_;                          // per view of the shard
  OptimKernels kernels_;
  MemBuf<float> m_, v_;
  int64_t t_ = 0;
  // Offloaded: the arena's memory, the shard's master weights and the
  // gradient chunks staged on the host (offload_staging_chunks of them).
  bool offloaded_ = false;
  Memory* arena_memory_ = nullptr;
  MemBuf<float> master_;
  std::array<MemBuf<float>, 3> stage_;
  int64_t chunk_ = kOffloadChunk;
  bool master_valid_ = false;
  WorkingWeights working_ = WorkingWeights::fp32;
};

// Learning-rate schedules over `total` updates (step = 0-based update index).
//   constant  peak after the warmup
//   cosine    warmup, then half a cosine from peak down to min_ratio * peak at the last step
//   wsd       warmup-stable-decay (the UE5M3 paper's): warmup, constant peak,
//             then a linear decay over the last decay_fraction of the steps
//             that reaches final_ratio * peak on the last step
// Warmup is linear: peak * (step + 1) / warmup; a warmup longer than the
// run simply never reaches the peak (and for wsd the ramp multiplies the
// decay where the two overlap), so `--steps 10` smoke tests of any config work.
enum class LrKind : uint8_t { constant, cosine, wsd };
LrKind parse_lr_kind(std::string_view name);  // throws exmy::Error naming the accepted values
std::string_view lr_kind_name(LrKind kind);

struct LrSchedule {
  LrKind kind = LrKind::cosine;
  double peak = 1e-3;
  int64_t warmup = 0;
  int64_t total = 1;
  double min_ratio = 0.1;        // cosine floor
  double decay_fraction = 0.15;  // wsd
  double final_ratio = 0.01;     // wsd

  double at(int64_t step) const;
  // Steps of the wsd decay phase: ceil(decay_fraction * total).
  int64_t decay_steps() const;
  // Throws exmy::Error for an inconsistent schedule (one line, naming the key).
  void validate() const;
};

}  // namespace exmy::sim

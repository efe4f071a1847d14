// The CPU training loop behind `exmy train`.
//
// A run directory holds
//   config.ini                the resolved configuration (RunConfig::text())
//   run.h5                    the run file (sim/io/run_file.hpp): /train rows every
//                             log_interval steps, /eval rows every eval_interval steps
//   checkpoints/step_N.h5     native checkpoints (sim/train/checkpoint.hpp)
//
// One step: for each of grad_accum micro-batches, zero the gradients,
// forward and backward, and add the micro-batch's gradient to the step's
// sum in micro-batch order (the first is copied); the loss is the mean of
// the micro-batch losses and the gradient their mean (a factor 1/grad_accum
// folded into the update); global norm, clip, AdamW at the schedule's LR.
//
// Data parallel (TrainHooks::comm with N ranks, docs/training.md): rank r
// runs micro-batches [r G/N, (r+1) G/N) of the step's G, and the sums
// (gradients, losses, validation losses) are chained through the ranks in
// rank order (dist::ordered_sum), so N ranks give the bits of 1 rank. Rank 0
// alone writes the run file and checkpoints and prints; hooks.after_step
// runs on rank 0 only. Ranks on devices move gradient sums, weight shards
// and moments with the Comm train.comm chooses: NCCL on device buffers
// (the sums added by the device's add kernel), or the host Comm through
// host copies.
// The whole run is a function of the configuration: the same config gives
// bit-identical losses and weights for any thread count, and a run resumed
// from a checkpoint continues exactly as the uninterrupted run would have.
//
// Stopping: when *hooks.stop becomes non-zero (the CLI's SIGINT/SIGTERM
// handler sets it) the loop finishes the step in progress, writes a
// checkpoint and returns `interrupted`. A loss or gradient norm that is not
// finite stops the run before the update, with a checkpoint of the last good
// step, and returns `diverged`.
#pragma once

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "models/nemotron_h.hpp"
#include "sim/dist/comm.hpp"
#include "sim/data/sampler.hpp"
#include "sim/data/token_file.hpp"
#include "sim/io/run_file.hpp"
#include "sim/train/run_config.hpp"

namespace exmy::train {

enum class TrainStatus { completed, interrupted, diverged };

struct TrainHooks {
  const std::atomic<int>* stop = nullptr;  // non-zero: checkpoint and return after the current step
  // Called before each step with the 0-based step index (tests poison
  // parameters or raise `stop` here).
  std::function<void(int64_t step, models::NemotronH<float>& model)> before_step;
  // Called after each update with the steps done, before that step's rows
  // are flushed: where per-step statistics go into the run file (append
  // rows to a group with its own `step` dataset; the loop flushes at every
  // logging and evaluation step, and a hook may flush too).
  std::function<void(int64_t step, models::NemotronH<float>& model, io::RunFile& run)> after_step;
  std::FILE* out = stdout;  // progress lines; nullptr for silence
  bool keep_params = false;  // copy the final parameters into TrainResult::params
  // The ranks of a data-parallel job; nullptr: this process alone.
  dist::Comm* comm = nullptr;
};

struct TrainResult {
  TrainStatus status = TrainStatus::completed;
  int64_t step = 0;                // steps done when the run returned
  std::vector<double> losses;      // training loss of every step run in this session
  // The final-window train loss of the whole run as it stands (every step,
  // across resumes; sim/train/loss_window.hpp), and its window.
  double final_window_loss = NAN;
  int64_t final_window_steps = 0;
  std::vector<double> val_losses;  // every evaluation of this session
  double last_val_loss = 0;
  std::string checkpoint;          // the last checkpoint written
  std::string message;             // for diverged: the one-line reason
  std::vector<float> params;       // with hooks.keep_params: the arena after the last step
  int64_t device_peak_bytes = -1;  // on a device: the most the run allocated in its memory at once (-1 on the CPU)
};

// Identification written into run files and checkpoints.
struct BuildInfo {
  std::string version = "unknown";
  std::string git_commit = "unknown";
};

// The token source of a run: a file, a prepare-data directory (made on
// first use from data.prepare_from, progress to `out` unless null), or the
// synthetic Markov source; and its train/validation split.
struct RunData {
  std::unique_ptr<data::TokenStream> stream;
  double entropy_rate = -1;  // synthetic only: the loss floor, nats/token
  data::Split split;
};
RunData open_run_data(const RunConfig& cfg, const BuildInfo& build, std::FILE* out);

// Throws exmy::Error, naming bytes needed and available, when the training
// memory that `exmy model-info` estimates for the run's model and
// micro-batch exceeds what the machine has available (sim/sysmem.hpp).
// Every command that builds a model for a run checks this first. A rank of
// an n-rank job with train.shard_optimizer counts its shard of the moments;
// what a device run keeps in host memory (offloaded optimizer state, staged
// gradients) is checked against the host's memory.
void require_training_memory(const RunConfig& cfg, int ranks = 1);
// What one rank of a run keeps besides the model's own tensors, for its
// memory plan.
struct RankPlan {
  int ranks = 1;
  bool shard_optimizer = true;  // AdamW state sharded over the ranks (ZeRO-1)
  bool offload = false;         // train.offload = optimizer
  // train.working_weights = bf16: the optimizer keeps FP32 master weights
  // beside the working weights (the arena stays FP32 storage, 4 bytes a
  // parameter, holding BF16 values)
  bool bf16_weights = false;
  int64_t grad_accum = 1;       // micro-batches per optimizer step, all ranks together
  bool on_device = false;       // the model trains in a device's memory
  // The gradient sums of a device run stay on the device (one rank alone,
  // or ranks whose Comm takes device buffers); else they are the host's.
  bool device_sums = true;
  // Bytes of the quantized linears' shared scratch (quant_scratch_bytes of
  // the run's recipe; 0 when it quantizes nothing).
  double quant_scratch = 0;
  // Bytes of a CUDA device's `bf16` plain Linears' operand copies
  // (plain_linear_scratch; 0 on the CPU and cuda-emulated, whose plain
  // Linears are the CPU's).
  double linear_scratch = 0;
};
// The BF16 operand copies the plain Linears of `recipe` (those it leaves
// unquantized, with its `unquantized` policy) keep on `device` for `tokens`
// tokens: a CUDA device's `bf16` Linears' (sim::cuda_bf16_linear_scratch_bytes),
// else 0.
double plain_linear_scratch(const models::NemotronHConfig& model, const sim::quant::Recipe& recipe,
                            const sim::Device& device, int64_t tokens);
// The plan of `cfg` on one of `ranks` ranks.
RankPlan rank_plan(const RunConfig& cfg, int ranks);
// models::training_memory of the rank that keeps the most: the largest of
// the optimizer shards (sim::optimizer_shard), with `bf16_weights` the
// shard's FP32 master weights (MemoryEstimate::master), with `offload` the
// shard's master weights, moments and staging chunks (two, three with
// `bf16_weights`: sim::offload_staging_chunks) counted in host_state instead
// (sim::AdamW's offload), and the gradient sums of
// accumulation: one running sum alone, or on one of n ranks ceil(G/n) held
// micro-batch gradients plus the sum the chain passes on.
models::MemoryEstimate rank_training_memory(const models::NemotronHConfig& model, int64_t batch, int64_t seq_len,
                                            bool recompute, const RankPlan& plan = {});

// Starts a new run in `out_dir` (created if needed). Throws exmy::Error when
// out_dir already holds a run, unless `overwrite`.
TrainResult train_new(const RunConfig& cfg, const std::string& out_dir, const TrainHooks& hooks,
                      const BuildInfo& build, bool overwrite = false);

// Continues the run in `out_dir` from its newest checkpoint. `steps`
// replaces train.steps (the run's total length, so the schedule stretches
// accordingly); `overrides` are --set assignments applied on top of the
// saved configuration.
TrainResult train_resume(const std::string& out_dir, std::optional<int64_t> steps,
                         const std::vector<std::string>& overrides, const TrainHooks& hooks, const BuildInfo& build,
                         bool allow_changes = false);

// The configuration train_resume continues with: the configuration of the
// run's newest checkpoint (what the run last trained with; config.ini keeps
// the configuration the run started with and is never rewritten) with
// `steps` and `overrides` applied. Overrides may change only keys that
// leave the run's numbers alone (resumable_key); any other change is an
// error listing every changed key, unless `allow_changes`. Throws naming
// the problem when out_dir holds no run. Callers that need it before
// training (the CLI's evaluation hook) resolve it once and pass it to the
// overload below.
// In a data-parallel job only rank 0 probes the run's lock (probe_lock):
// the ranks' probes would collide with each other.
RunConfig resume_config(const std::string& out_dir, std::optional<int64_t> steps,
                        const std::vector<std::string>& overrides, bool allow_changes = false,
                        bool probe_lock = true);
TrainResult train_resume(const std::string& out_dir, const RunConfig& cfg, const TrainHooks& hooks,
                         const BuildInfo& build);

// Optimizer steps of a run without a run directory, timed (`exmy bench
// train` on ranks): the training loop's own step (the micro-batches split
// over comm's ranks, the gradient sums chained in rank order, the sharded or
// whole AdamW update) on cfg's data from the seed's initial weights, with no
// run file, checkpoint, evaluation or output. cfg.steps bounds the steps
// (it is the LR schedule's length); cfg.stats_interval and cfg.capture_step
// must be 0 (rank 0 has no run file to write rows to).
class TimedSteps {
 public:
  // comm: the ranks of the job; nullptr: this process alone.
  TimedSteps(const RunConfig& cfg, dist::Comm* comm);
  ~TimedSteps();
  struct Timing {
    double seconds = 0;       // the step's wall time on this rank
    double comm_seconds = 0;  // of it, in the job's collectives (waits for slower ranks included)
  };
  // The next step. Throws dist::CollectiveError when its loss or gradient
  // norm is not finite (every rank sees the same ones), exmy::Error past
  // cfg.steps.
  Timing step();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Keys a resume may change without --allow-changes: the run's length, and
// what is logged, evaluated, checkpointed or exported, and how many threads
// run it (never the bits of a training step).
bool resumable_key(const std::string& key);

}  // namespace exmy::train

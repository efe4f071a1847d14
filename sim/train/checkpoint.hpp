// Native checkpoints: one HDF5 file with everything a resumed run needs to
// continue bit-identically.
//
//   /                       attributes: format "exmy-checkpoint", schema_version, step,
//                           data_position, data_seed, tokens_seen, adam_step,
//                           best_val_loss, best_val_step, elapsed_s, config (resolved
//                           text), exmy_version, git_commit
//   /params/<name>          float32, each parameter view with its HF name and shape: the FP32
//                           master weights (with train.working_weights = bf16 the optimizer's
//                           master, which the working weights are the BF16 rounding of; else
//                           the model's weights, the same thing)
//   /optimizer/exp_avg/<name>, /optimizer/exp_avg_sq/<name>   AdamW moments, same shapes
//   /train_losses           float64 [step]: the training loss of every step (TrainState::losses;
//                           absent at step 0)
//   /rng                    uint64 [data_seed, data_position]: the data sampler's whole
//                           state (it is counter-based; nothing else in a run draws)
//   /layer_state/<linear>/  per-layer state of a precision policy (issue 4: held
//                           tensor-amax references), written by LayerState objects
//
// A checkpoint is written to a temporary file and renamed into place, so a
// crash while writing never leaves a truncated checkpoint under the final
// name.
#pragma once

#include "sim/io/h5.hpp"  // hid_t

#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "models/nemotron_h.hpp"
#include "sim/optim.hpp"

namespace exmy::train {

struct TrainState {
  int64_t step = 0;           // optimizer steps done
  int64_t data_position = 0;  // training windows handed out
  uint64_t data_seed = 0;
  int64_t tokens_seen = 0;
  double best_val_loss = std::numeric_limits<double>::infinity();
  int64_t best_val_step = -1;
  double elapsed_s = 0;  // training wall time before this session
  // The training loss of every step so far (losses[i]: step i + 1), for the
  // final-window train loss (sim/train/loss_window.hpp). NaN for steps a
  // checkpoint written before it was kept does not know.
  std::vector<double> losses;
};

// State beyond parameters and optimizer moments that must survive a resume.
// A sim::Linear of a precision policy that keeps such state implements this
// too; the trainer saves it under /layer_state/<linear name>/ and loads it
// back into the same layer.
class LayerState {
 public:
  virtual ~LayerState() = default;
  virtual void save_state(hid_t group) const = 0;
  virtual void load_state(hid_t group) = 0;
};

struct CheckpointInfo {
  std::string config_text;
  std::string exmy_version, git_commit;
};

// The optimizer state of one view in host memory: its AdamW moments and,
// with BF16 working weights, its FP32 master weights (else null).
struct ViewState {
  const float* exp_avg = nullptr;
  const float* exp_avg_sq = nullptr;
  const float* master = nullptr;
};
// The state of a view the optimizer does not own: with the optimizer state
// sharded over the ranks, rank 0 writes the checkpoint and receives the
// other ranks' views through this, in view order. The pointers stay valid
// until the next call.
using ShardStateOf = std::function<ViewState(int view)>;

// The checkpoint is the same file whether the moments (and master weights)
// come from one optimizer or from the shards of several ranks (`others`
// gives those opt does not own). /params is the master: the model's arena,
// or with BF16 working weights (opt.working_weights()) the optimizer's
// master copy.
void save_checkpoint(const std::string& path, const models::NemotronH<float>& model, const sim::AdamW& opt,
                     const TrainState& state, const CheckpointInfo& info, const ShardStateOf& others = {});
// Throws exmy::Error naming the file for a missing, corrupt or mismatched
// checkpoint (a parameter of the wrong shape, a missing moment, ...). Reads
// the moments of the views opt owns (a shard: any number of ranks resumes
// from any checkpoint). The arena then holds the FP32 master weights: a
// caller with BF16 working weights gives them to the optimizer
// (AdamW::take_master) and rounds the arena.
void load_checkpoint(const std::string& path, models::NemotronH<float>& model, sim::AdamW& opt, TrainState& state);
// The resolved configuration text a checkpoint was written with.
std::string checkpoint_config(const std::string& path);

// Checkpoint files of a run directory's checkpoints/ folder, oldest first.
std::vector<std::string> list_checkpoints(const std::string& dir);
std::string checkpoint_name(int64_t step);  // "step_00000100.h5"

}  // namespace exmy::train

// Quantized-inference evaluation: the validation loss of a run's weights
// with the forward pass quantized by a recipe (docs/eval.md).
//
// Only the forward roles of the recipe act (fprop-x on the activation X,
// fprop-w on the weight W of every linear the recipe quantizes); the rest of
// the recipe (layer selection, formats, blocks, rounding, RHT, the GEMM
// output model, the unquantized precision) applies as in training. The
// tensor references of the two forward roles are not the recipe's: they
// follow an explicit evaluation policy.
//
//   weights (fprop-w)   amax measured once when the weights are loaded
//                       (after the RHT when the role has it) and frozen;
//   activations (fprop-x), one of
//     current           every call measures the amax of its own X;
//     replay:D          a cold sample-and-hold cache counted in evaluation
//                       batches: the reference is sampled on evaluation
//                       batch 1, D+1, 2D+1, ... and held in between
//                       (replay:1 is `current`);
//     calibrated:N      the largest amax of X over N calibration sequences,
//                       then frozen. The sequences are the first N windows
//                       the run's training sampler hands out (training
//                       split, epoch 0 of train.seed: disjoint windows), run
//                       through the forward pass in the recipe's unquantized
//                       precision (bf16 or fp32), as Transformer Engine's
//                       and ModelOpt's calibration run unquantized.
//     checkpoint        the training run's own references as its
//                       checkpoint holds them, frozen: a periodic
//                       reference's held sample, a delayed one's window max
//                       (the deployment of sample-and-hold scaling); a
//                       `current` role measures its X. The weights likewise
//                       take the checkpoint's held reference where the
//                       recipe holds theirs (else the amax at load). Needs
//                       an exmy checkpoint trained with the recipe.
//   A role whose recipe reference is `none` (MX recipes: no tensor scale)
//   keeps `none`: the policy does not apply to it.
//
// Evaluation batch b (1-based) runs with the quantization runtime's step b
// and micro-batch 0, so stochastic rounding in a forward role draws from
// stream (b, 0, block, kind, role) with the run's seed: an evaluation is a
// function of the weights, the recipe, the policy and the batches, the same
// for any thread count. Every evaluation uses its own QuantRuntime and
// ReferenceStore (and its own copy of the weights), so nothing of the
// training state is touched.
//
// The loss is the trainer's validation loss: the mean over batches of each
// batch's mean cross-entropy (FP32 logits, FP64 sums), on the same
// validation windows (the first `batches * train.batch_size` windows of the
// validation region). With the fp32 recipe it equals the training loop's
// validation loss of an fp32 run bit for bit.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "models/nemotron_h.hpp"
#include "sim/data/sampler.hpp"
#include "sim/data/token_file.hpp"
#include "sim/io/run_file.hpp"
#include "sim/quant/quantized_linear.hpp"
#include "sim/quant/recipe.hpp"
#include "sim/train/run_config.hpp"

namespace exmy::train {
class TrainingDevice;
}

namespace exmy::eval {

// The activation-scale policy of an evaluation.
struct ActPolicy {
  enum class Kind : uint8_t { current, replay, calibrated, checkpoint };
  Kind kind = Kind::current;
  int64_t n = 0;  // D of replay:D, N of calibrated:N
  bool operator==(const ActPolicy&) const = default;
};
// current | replay:D | calibrated:N (D, N >= 1) | checkpoint; throws exmy::Error naming
// the bad value and what is accepted.
ActPolicy parse_act_policy(std::string_view s);
std::string act_policy_name(const ActPolicy& p);

// A run's token source and split, opened as the trainer opens them
// (preparing data.path from data.prepare_from when it does not exist).
struct EvalData {
  std::unique_ptr<data::TokenStream> stream;
  data::Split split;
  int64_t val_windows = 0;  // validation windows of seq_len + 1 tokens
};
EvalData open_eval_data(const train::RunConfig& cfg);

// The validation batches the trainer evaluates: `batches` x batch_size
// windows from the start of the validation region. batches = 0 means the
// trainer's own count, min(train.eval_batches, windows / batch_size).
// Throws exmy::Error when the region holds fewer.
struct EvalBatches {
  int64_t batches = 0, batch_size = 0, seq_len = 0;
  std::vector<int32_t> tokens, targets;  // (batches * batch_size, seq_len)
};
EvalBatches validation_batches(const train::RunConfig& cfg, const EvalData& d, int64_t batches = 0);

// The calibration sequences of calibrated:N: the first N windows the run's
// training sampler hands out ((N, seq_len) tokens). Throws exmy::Error when
// the training region holds fewer than N windows.
std::vector<int32_t> calibration_sequences(const train::RunConfig& cfg, const EvalData& d, int64_t n);

// The recipe as a run of configuration `cfg` applies it: with
// train.precision = bf16 the linears it leaves unquantized run in BF16 (as
// in training; activations are BF16 too).
sim::quant::Recipe run_recipe(const train::RunConfig& cfg, sim::quant::Recipe r);

// The model of one evaluation: the run's architecture with the recipe's
// forward quantization and the policy's references, on its own runtime.
// It runs on the configuration's train.device (cpu, cuda[:N] or
// cuda-emulated; sim/train/training_device.hpp) as training does: the
// model's backend and memory, the device's quantized-linear ops and plain
// linears. Weights, weight and calibration amaxes and logits cross to the
// host through sim::host_view / write_through_host, so on cuda-emulated
// every result is the CPU's bit for bit.
class QuantEvalModel {
 public:
  // Stochastic rounding draws with the run's train.seed.
  QuantEvalModel(const train::RunConfig& cfg, sim::quant::Recipe recipe, ActPolicy policy);
  ~QuantEvalModel();
  QuantEvalModel(const QuantEvalModel&) = delete;
  QuantEvalModel& operator=(const QuantEvalModel&) = delete;

  // Copies weights in (an arena of the same layout: another model of the
  // same configuration), measures and freezes the weight references, and
  // makes the activation references cold.
  void set_params(std::span<const float> arena);
  // The weights of a checkpoint (sim/train/checkpoint.hpp); returns its step.
  int64_t load_checkpoint(const std::string& path);
  // The weights of an HF checkpoint (a directory with config.json and
  // model.safetensors, or a .safetensors file; models/hf_checkpoint.hpp).
  void load_hf(const std::string& path);

  // calibrated:N: runs `sequences` (n, seq_len) through the unquantized
  // forward in batches of `batch` and freezes every quantized linear's
  // activation reference at the largest amax seen. Other policies: throws.
  void calibrate(std::span<const int32_t> sequences, int64_t seq_len, int64_t batch);

  // The mean over batches of each batch's mean loss, evaluation batch b
  // running at quantization step b (1-based). Activation references start
  // cold for current/replay; calibrated needs calibrate() first.
  struct Result {
    double loss = 0;                  // nats/token
    std::vector<double> batch_losses;
    int64_t tokens = 0;               // counted targets
  };
  // With `logits`, the logits of every batch are appended to it, batch after
  // batch ((batches x batch_size x seq_len, vocab) float32, row-major).
  Result evaluate(const EvalBatches& b, std::vector<float>* logits = nullptr);

  // Inspection (tests, logs).
  models::NemotronH<float>& model() { return *model_; }
  sim::quant::QuantRuntime& runtime() { return *runtime_; }
  const sim::quant::Recipe& recipe() const { return recipe_; }
  const ActPolicy& policy() const { return policy_; }
  // What the model runs on (the configuration's train.device).
  train::TrainingDevice& device() { return *device_; }
  int64_t quantized_linears() const;
  // Quantized linears whose activations have a tensor scale (the policy
  // acts on these; 0 for MX recipes).
  int64_t scaled_activations() const;
  // Reference key of a linear's forward role ("layers.0.mixer.in_proj/fprop-x").
  static std::string reference_key(const std::string& linear, sim::quant::Role role);

 private:
  class Linear;
  class Factory;
  void round_working_weights();  // train.working_weights = bf16: the arena to BF16
  void freeze_weights();
  void reset_activations();
  // policy checkpoint: the forward references the checkpoint at `path`
  // (written after optimizer step `step`) holds, frozen.
  void freeze_checkpointed(const std::string& path, int64_t step);

  train::RunConfig cfg_;
  sim::quant::Recipe recipe_;
  ActPolicy policy_;
  // Declared before everything that runs on it: the runtime holds its ops,
  // the factory its linears, the model its backend and memory.
  std::unique_ptr<train::TrainingDevice> device_;
  std::shared_ptr<sim::quant::QuantRuntime> runtime_;
  std::unique_ptr<Factory> factory_;
  std::unique_ptr<models::NemotronH<float>> model_;
  bool calibrated_ = false;
};

// What one (recipe, policy) evaluation of a run's weights gave.
struct EvalResult {
  std::string name;  // the /eval subgroup: the recipe name unless given
  ActPolicy policy;
  int64_t step = 0;  // optimizer steps of the weights
  double loss = 0;
  int64_t batches = 0, tokens = 0;
  int64_t calibration_sequences = 0;
  double seconds = 0;
};

// Evaluates `params` (an arena of cfg's model) with `recipe` under `policy`.
EvalResult evaluate_params(const train::RunConfig& cfg, const EvalData& d, std::span<const float> params,
                           const sim::quant::Recipe& recipe, const ActPolicy& policy, int64_t batches = 0);

// The /eval subgroup of a (name, policy): "/eval/NAME/POLICY" ("/eval/te-nvfp4/replay:4").
// Throws exmy::Error for a name that is empty, holds '/', or is one of the
// trainer's /eval datasets (step, loss).
std::string eval_group(const std::string& name, const ActPolicy& policy);
// Appends the row of `r` to its group: step (int64), loss (float64, nats per
// token), tokens, batches, calibration_sequences (int64). Does not flush.
void append_eval_row(io::RunFile& run, const EvalResult& r);
// The root attribute that holds the recipe text of an /eval subgroup:
// "eval_recipe:NAME".
std::string eval_recipe_attribute(const std::string& name);

// In-training quantized evaluation: a TrainHooks::after_step function that,
// at the trainer's validation steps (every train.eval_interval steps and the
// last step), evaluates the model's weights with every (recipe, policy)
// pair and appends /eval/RECIPE/POLICY rows to the run file (the trainer's
// own evaluation flushes them). Data are opened on first use.
struct TrainingEvalSpec {
  std::vector<sim::quant::Recipe> recipes;
  std::vector<ActPolicy> policies;
  int64_t batches = 0;  // 0: the trainer's count
};
// From the values of the proposed configuration keys eval.recipes
// ("te-nvfp4,ue5m3-b16": names or files; empty: off) and eval.policies
// ("current,calibrated:64"; empty: current).
TrainingEvalSpec parse_training_eval(std::string_view recipes, std::string_view policies);
// The in-training evaluation a run configuration asks for, from the
// resolved values (RunConfig::values) of the keys eval.recipes,
// eval.policies and eval.batches (docs/eval.md); nullopt when eval.recipes
// is empty or the keys do not exist. Throws exmy::Error naming the key for a
// bad value, so a run with a bad evaluation fails at start.
std::optional<TrainingEvalSpec> training_eval_from_config(const train::RunConfig& cfg);
using AfterStepHook = std::function<void(int64_t step, models::NemotronH<float>& model, io::RunFile& run)>;
// Returns a hook that runs `next` (may be empty) and then the evaluation;
// `out` gets one line per evaluation (nullptr: silent).
AfterStepHook make_training_eval_hook(const train::RunConfig& cfg, TrainingEvalSpec spec, AfterStepHook next = {},
                                      std::FILE* out = stdout);

}  // namespace exmy::eval

// The run configuration: INI files (experiments/*.ini) read by
// Boost.Program_options, `--set section.key=value` overrides, and the typed,
// validated RunConfig the trainer reads. Nothing numeric about a run is
// decided outside it; its resolved text (every key, defaults included, the
// model fully expanded) is saved in the run file and the run directory, and
// reading that text back gives the same RunConfig.
//
// Keys (section.key; config_keys() lists them with defaults and help):
//   model.name           preset or config.json; model.FIELD overrides any HF field
//   train.*              steps, batch, sequence length, accumulation, precision, recipe, seed, threads,
//                        device,
//                        intervals, statistics and capture
//   recipe.SECTION.KNOB  overrides of the recipe's knobs (docs/recipes.md), applied in order; in an INI
//                        file, keys `SECTION.KNOB = value` of a [recipe] section
//   optim.*              AdamW, clipping, LR schedule
//   data.*               token file, split, synthetic source, text to prepare on first use
// An unknown key, in a file or in --set, is an error naming it.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "models/config.hpp"
#include "sim/device/device.hpp"
#include "sim/dist/comm.hpp"
#include "sim/optim.hpp"
#include "sim/quant/recipe.hpp"

namespace exmy::train {

struct ConfigKey {
  std::string name;  // "train.steps"
  std::string default_value;
  std::string help;
};
// Every key except the model fields (model.FIELD for each HF field, see
// models::field_names(), defaults from the preset).
const std::vector<ConfigKey>& config_keys();

struct RunConfig {
  // [model]
  std::string model_name = "proxy-tiny";
  models::NemotronHConfig model;
  // [train]
  int64_t steps = 200;
  int64_t batch_size = 8;  // sequences per micro-batch
  int64_t seq_len = 128;
  int64_t grad_accum = 1;  // micro-batches per optimizer step
  // fp32 | bf16: with bf16, activations are rounded to BF16 (docs/models.md)
  // and every linear the recipe leaves unquantized runs in BF16 (the
  // recipe's `unquantized` knob is set to bf16).
  std::string precision = "fp32";
  // fp32 | bf16: the weights every layer reads; with bf16 the optimizer
  // keeps the FP32 master weights and the model's arena holds their BF16
  // rounding, renewed after every update (sim::AdamW, WorkingWeights).
  sim::WorkingWeights working_weights = sim::WorkingWeights::fp32;
  bool bf16_weights() const { return working_weights == sim::WorkingWeights::bf16; }
  // The quantization recipe of every linear layer: train.recipe (a name or
  // an .ini file) with the recipe.* overrides applied, validated.
  std::string recipe_name = "fp32";
  std::vector<std::pair<std::string, std::string>> recipe_sets;  // "recipe.all.round" -> "rne", in order
  sim::quant::Recipe recipe;
  uint64_t seed = 1;
  int threads = 0;  // 0: OpenMP's default
  sim::Device device;  // train.device: cpu, cuda[:N] or cuda-emulated
  int64_t log_interval = 10;
  int64_t eval_interval = 100;  // 0: only at the end
  int64_t eval_batches = 4;
  int64_t checkpoint_interval = 0;  // 0: only at the end (and on interruption)
  int64_t keep_checkpoints = 2;
  // Statistics of quantized operands and GEMMs on step 1, every
  // stats_interval-th step and the last (0: never); the exact operands of
  // capture_step go to /capture (0: none).
  int64_t stats_interval = 1;
  int64_t capture_step = 0;
  int64_t gemm_stats_rows = 128;   // sim::quant::RuntimeOptions::gemm_stats_rows
  int64_t gemm_stats_sample = 64;  // sim::quant::RuntimeOptions::gemm_stats_sample
  // auto | sgemm | bf16: how the `fp32` GEMM output model's GEMMs run
  // (sim::quant::Fp32Gemm; auto: bf16 on a CUDA device, sgemm elsewhere).
  std::string fp32_gemm = "auto";
  // On resume, tensor references start empty instead of restored (the
  // reference implementation's cold restart).
  bool cold_restart_references = false;
  std::string recompute = "none";  // none | blocks: activation recompute (NemotronH::set_recompute)
  // none | optimizer: the optimizer state (FP32 master weights, AdamW
  // moments) in host memory while the model trains on a device (sim::AdamW's
  // offload); only with a device.
  std::string offload = "none";
  bool offloaded() const { return offload == "optimizer"; }
  // Multi-rank jobs: each rank keeps the AdamW moments of its share of the
  // parameters (ZeRO-1, sim::optimizer_shard) instead of all of them.
  bool shard_optimizer = true;
  // Multi-rank jobs on devices: which Comm moves the model's buffers
  // between the ranks (NCCL on device buffers, or MPI through host copies).
  dist::CommChoice comm = dist::CommChoice::automatic;
  std::string init_from;           // HF checkpoint to start a new run from (empty: init_weights(seed))
  std::string export_hf = "none";  // none | fp32 | bf16: DIR/hf/ at the end of a completed run
  // [optim]
  sim::LrSchedule schedule;  // peak = optim.lr, total = train.steps
  sim::AdamWConfig adamw;
  double grad_clip = 1.0;
  // [data]
  std::string data_path = "synthetic";
  std::string data_format = "auto";
  std::string prepare_from;  // text to turn into data_path when it does not exist
  double val_fraction = 0.05;
  int64_t synthetic_tokens = 262144;
  int64_t synthetic_branching = 4;
  uint64_t synthetic_seed = 7;

  // The resolved values of every key, as strings (what text() prints).
  std::map<std::string, std::string> values;

  int64_t tokens_per_step() const { return batch_size * seq_len * grad_accum; }
  // Whether optimizer step `step` (1-based) records statistics.
  bool stats_step(int64_t step) const {
    return stats_interval > 0 && (step == 1 || step % stats_interval == 0 || step == steps);
  }
  // The resolved configuration as an INI file.
  std::string text() const;
};

// Parses INI text (`origin` names it in errors) and then the overrides
// ("section.key=value"). Throws exmy::Error with one line for an unknown
// key, a bad value or an inconsistent configuration.
RunConfig parse_run_config(const std::string& ini_text, const std::string& origin,
                           const std::vector<std::string>& overrides);
// The same from a file; an empty path means the defaults.
RunConfig load_run_config(const std::string& path, const std::vector<std::string>& overrides);

}  // namespace exmy::train

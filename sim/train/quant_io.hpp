// What quantized training adds to the training loop: the statistics and the
// captured operands in the run file, and the tensor references in
// checkpoints (docs/hdf5-schema.md has the layout; docs/recipes.md the
// statistics).
//
//   /quant/<layer>/<gemm>/<operand>/{step, micro_batch, <stat>...}   one row per call on a statistics step
//   /gemm/<layer>/<gemm>/{step, micro_batch, <stat>...}              one row per GEMM on a statistics step
//   /hist/<layer>/<gemm>/<operand>/{step, micro_batch, counts}       block-scale log2 histogram rows
//   /capture/step_<N>/<layer>/<gemm>/<operand>                       the exact operand of the capture step
//   checkpoint /layer_state/<layer>/<slot>                           ReferenceState::save() of each reference
//
// <stat> names come from sim::quant::operand_fields() / gemm_fields(), so
// adding a statistic there adds its dataset here.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "sim/io/run_file.hpp"
#include "sim/quant/quantized_linear.hpp"
#include "sim/train/checkpoint.hpp"

namespace exmy::train {

// Rows per chunk of the statistics datasets (scalar rows; histogram rows
// use kHistChunkRows): small chunks, as a run has thousands of them.
inline constexpr int64_t kStatsChunkRows = 256;
inline constexpr int64_t kHistChunkRows = 16;

// OperandStats and GemmStats as rows of the run file. Rows wait in memory
// until the run file's flush (the trainer's logging step).
class RunFileStatsSink final : public sim::quant::StatsSink {
 public:
  explicit RunFileStatsSink(io::RunFile& run) : run_(run) {}
  // Creates every dataset the plan's quantized linears will write. Call it
  // before RunFile::start_swmr(): creating thousands of datasets later would
  // reopen the file for each.
  void declare(const std::vector<sim::quant::RecipeLinearFactory::PlanEntry>& plan);

  void record_operand(const sim::quant::CallKey& key, const sim::quant::OperandStats& stats) override;
  void record_gemm(const sim::quant::CallKey& key, const sim::quant::GemmStats& stats) override;

 private:
  struct Group {
    std::string step, micro_batch;
    std::vector<std::string> fields;  // one per operand_fields() / gemm_fields() entry
  };
  // The running mean of a GEMM's gain over its rows so far (finite gains):
  // continued from the run file's rows after a resume.
  struct RunningMean {
    std::string path;  // /gemm/<layer>/<gemm>/gain_mean
    bool started = false;
    double sum = 0;
    int64_t n = 0;
  };
  struct LayerPaths {
    std::array<Group, sim::quant::kNumRoles> operand;  // /quant/<layer>/<gemm>/<operand>/
    std::array<Group, sim::quant::kNumRoles> hist;     // /hist/<layer>/<gemm>/<operand>/ (fields: counts)
    std::array<Group, 3> gemm;                         // /gemm/<layer>/<gemm>/
    std::array<RunningMean, 3> gain_mean;
  };
  LayerPaths& paths(std::string_view layer);
  void declare_layer(const LayerPaths& p);

  io::RunFile& run_;
  std::map<std::string, LayerPaths, std::less<>> layers_;
};

// The statistics records of a rank other than 0 in a data-parallel run, as
// bytes: rank 0 gathers them after the step and replays them, rank by rank,
// into its RunFileStatsSink, so the run file's rows come in micro-batch
// order whatever the number of ranks.
class SerializedStatsSink final : public sim::quant::StatsSink {
 public:
  void record_operand(const sim::quant::CallKey& key, const sim::quant::OperandStats& stats) override;
  void record_gemm(const sim::quant::CallKey& key, const sim::quant::GemmStats& stats) override;
  // The records so far, and a fresh start.
  std::string take() { return std::move(bytes_); }

 private:
  std::string bytes_;
};
// Hands every record of SerializedStatsSink::take() bytes to `sink`, in the
// order they were recorded. Throws exmy::Error on malformed bytes.
void replay_stats(const std::string& bytes, sim::quant::StatsSink& sink);

// The operands of the capture step, written to
// /capture/step_<N>/<layer>/<gemm>/<operand> as float32 (rows, K) with the
// quantization parameters as attributes (capture_attributes). Only
// micro-batch 0 is written. The trainer leaves the run file's SWMR mode
// for the capture step, so that creating the tensors does not reopen the
// file for each.
class RunFileCaptureSink final : public sim::quant::CaptureSink {
 public:
  explicit RunFileCaptureSink(io::RunFile& run) : run_(run) {}
  void capture(const sim::quant::CallKey& key, const QuantSpec& spec, const float* x, int64_t rows,
               int64_t cols) override;
  int64_t tensors() const { return tensors_; }

 private:
  io::RunFile& run_;
  int64_t tensors_ = 0;
};

std::string capture_path(const sim::quant::CallKey& key);
// The attributes of a captured operand: step, micro_batch, layer, block,
// kind, gemm, operand, the recipe knobs of the call (elem, scale, block,
// scale_rule, arith, round, sr_bits, scale_target, zero_scale, saturate,
// rht, rht_signs), tensor_amax (none | auto | given) and tensor_amax_value,
// seed, stream, and quantize_options (the `exmy quantize` options).
std::vector<io::RunFile::Attribute> capture_attributes(const sim::quant::CallKey& key, const QuantSpec& spec);

// A quantized linear whose tensor references are checkpointed: the
// train::LayerState of the references "<layer>/<slot>" of the runtime's
// ReferenceStore, one float64 dataset per slot (fprop-x, ..., or dy for a
// shared dY reference) holding ReferenceState::save(). With cold_restart,
// loading leaves every reference empty (the reference implementation's
// behaviour after a resume).
class ReferenceStateLinear final : public sim::Linear<float>, public LayerState {
 public:
  ReferenceStateLinear(std::unique_ptr<sim::Linear<float>> inner, std::shared_ptr<sim::quant::QuantRuntime> rt,
                       bool cold_restart);
  void forward(float* Y, const float* X, const float* W, int64_t tokens) override {
    inner_->forward(Y, X, W, tokens);
  }
  void recompute_forward(float* Y, const float* X, const float* W, int64_t tokens) override {
    inner_->recompute_forward(Y, X, W, tokens);
  }
  void backward(float* dX, float* dW, const float* dY, const float* X, const float* W, int64_t tokens) override {
    inner_->backward(dX, dW, dY, X, W, tokens);
  }
  void save_state(hid_t group) const override;
  void load_state(hid_t group) override;
  sim::Linear<float>& inner() { return *inner_; }

 private:
  // The references of this layer: (slot, key) pairs.
  std::vector<std::pair<std::string, std::string>> slots() const;
  std::unique_ptr<sim::Linear<float>> inner_;
  std::shared_ptr<sim::quant::QuantRuntime> rt_;
  bool cold_restart_;
};

// The recipe as the trainer's precision policy: RecipeLinearFactory's
// linears, the quantized ones wrapped in ReferenceStateLinear.
class TrainingLinearFactory final : public sim::LinearFactory<float> {
 public:
  // `unquantized`: as RecipeLinearFactory's (null: the CPU's).
  TrainingLinearFactory(const sim::quant::Recipe& recipe, int64_t num_blocks,
                        std::shared_ptr<sim::quant::QuantRuntime> rt, bool cold_restart,
                        std::unique_ptr<sim::LinearFactory<float>> unquantized = nullptr);
  std::string policy() const override { return recipe_.policy(); }
  std::unique_ptr<sim::Linear<float>> make(const sim::LinearInfo& info) const override;
  const sim::quant::RecipeLinearFactory& recipe_factory() const { return recipe_; }

 private:
  sim::quant::RecipeLinearFactory recipe_;
  std::shared_ptr<sim::quant::QuantRuntime> rt_;
  bool cold_restart_;
};

}  // namespace exmy::train

#include "sim/eval/quant_eval.hpp"

#include <omp.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>

#include "formats/error.hpp"
#include "formats/quantize.hpp"
#include "sim/io/h5.hpp"
#include "sim/optim.hpp"
#include "sim/quant/stats.hpp"
#include "sim/memory.hpp"
#include "sim/train/checkpoint.hpp"
#include "sim/train/training_device.hpp"
#include "models/hf_checkpoint.hpp"
#include "models/nemotron_h.hpp"
#include "sim/quant/fp32_gemm.hpp"
#include "sim/quant/quantized_linear.hpp"
#include "sim/sysmem.hpp"
#include "sim/train/trainer.hpp"

namespace exmy::eval {
using sim::quant::RefPolicy;
using sim::quant::Role;

namespace {

// A periodic reference that samples only at step 1 and that a preloaded
// state (held value, sampled at step 1) never resamples: a frozen reference.
constexpr RefPolicy kFrozen{RefPolicy::Kind::periodic, std::numeric_limits<int64_t>::max()};

// max that propagates NaN, as the reference state does (a NaN amax means
// no tensor scale).
double nan_max(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<double>::quiet_NaN();
  return std::max(a, b);
}

// max|x| of the operand a role quantizes: x itself, or its 16-point RHT
// along K when the role has one (the amax a `current` call measures).
double operand_amax(const sim::quant::RoleSpec& rs, const float* x, int64_t rows, int64_t cols,
                    std::vector<float>& scratch) {
  if (!rs.q.rht) return sim::quant::abs_max(x, rows * cols);
  if (cols % rs.q.rht_size != 0)
    throw Error("the random Hadamard transform runs along K = " + std::to_string(cols) +
                ", which must be a multiple of " + std::to_string(rs.q.rht_size));
  scratch.assign(x, x + rows * cols);
  hadamard(scratch.data(), rows, cols, 1, rht_of(rs.q));
  return sim::quant::abs_max(scratch.data(), rows * cols);
}

// ... per row (row outer scales), NaN for a row holding a NaN.
std::vector<double> operand_row_amax(const sim::quant::RoleSpec& rs, const float* x, int64_t rows, int64_t cols,
                                     std::vector<float>& scratch) {
  operand_amax(rs, x, rows, cols, scratch);  // checks K for the transform
  const float* t = rs.q.rht ? scratch.data() : x;
  std::vector<double> a(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) a[static_cast<size_t>(r)] = sim::quant::abs_max(t + r * cols, cols);
  return a;
}

// A policy that holds its reference between calls (its state is in checkpoints).
bool held(const RefPolicy& p) { return p.kind == RefPolicy::Kind::periodic || p.kind == RefPolicy::Kind::delayed; }

bool parse_count(std::string_view s, int64_t& v) {
  const auto r = std::from_chars(s.data(), s.data() + s.size(), v);
  return r.ec == std::errc() && r.ptr == s.data() + s.size() && v >= 1;
}

}  // namespace

ActPolicy parse_act_policy(std::string_view s) {
  ActPolicy p;
  if (s == "current") return p;
  if (s == "checkpoint") {
    p.kind = ActPolicy::Kind::checkpoint;
    return p;
  }
  const size_t c = s.find(':');
  const std::string_view head = s.substr(0, c);
  if (c != std::string_view::npos && (head == "replay" || head == "calibrated") && parse_count(s.substr(c + 1), p.n) &&
      p.n <= (int64_t{1} << 30)) {
    p.kind = head == "replay" ? ActPolicy::Kind::replay : ActPolicy::Kind::calibrated;
    return p;
  }
  throw Error("bad activation-scale policy '" + std::string(s) +
              "' (expected current, replay:D, calibrated:N with D, N >= 1, or checkpoint)");
}

std::string act_policy_name(const ActPolicy& p) {
  switch (p.kind) {
    case ActPolicy::Kind::current: return "current";
    case ActPolicy::Kind::replay: return "replay:" + std::to_string(p.n);
    case ActPolicy::Kind::calibrated: return "calibrated:" + std::to_string(p.n);
    case ActPolicy::Kind::checkpoint: return "checkpoint";
  }
  return "?";
}

// ---------------------------------------------------------------------------
// Data
// ---------------------------------------------------------------------------

EvalData open_eval_data(const train::RunConfig& cfg) {
  // The trainer's own data: the same source, tokens and split.
  train::RunData r = train::open_run_data(cfg, {}, nullptr);
  EvalData d;
  d.stream = std::move(r.stream);
  d.split = r.split;
  d.val_windows = data::window_count(d.split.val_begin, d.split.val_end, cfg.seq_len);
  return d;
}

EvalBatches validation_batches(const train::RunConfig& cfg, const EvalData& d, int64_t batches) {
  const int64_t available = d.val_windows / cfg.batch_size;
  if (batches < 0) throw Error("--batches must be positive");
  if (batches == 0) batches = std::min(cfg.eval_batches, available);
  if (batches <= 0 || batches > available)
    throw Error("the validation region holds " + std::to_string(d.val_windows) + " windows of " +
                std::to_string(cfg.seq_len + 1) + " tokens: " + std::to_string(available) +
                " batches of train.batch_size = " + std::to_string(cfg.batch_size) + ", not " +
                std::to_string(std::max<int64_t>(batches, 1)));
  EvalBatches b;
  b.batches = batches;
  b.batch_size = cfg.batch_size;
  b.seq_len = cfg.seq_len;
  data::fixed_windows(*d.stream, d.split.val_begin, d.split.val_end, cfg.seq_len, batches * cfg.batch_size, b.tokens,
                      b.targets);
  return b;
}

std::vector<int32_t> calibration_sequences(const train::RunConfig& cfg, const EvalData& d, int64_t n) {
  data::SequenceSampler sampler(*d.stream, d.split.train_begin, d.split.train_end, cfg.seq_len, cfg.seed);
  if (n > sampler.windows())
    throw Error("calibrated:" + std::to_string(n) + " needs " + std::to_string(n) +
                " disjoint training windows; the training region holds " + std::to_string(sampler.windows()));
  std::vector<int32_t> tokens(static_cast<size_t>(n * cfg.seq_len)), targets(tokens.size());
  sampler.next(tokens.data(), targets.data(), n);
  return tokens;
}

sim::quant::Recipe run_recipe(const train::RunConfig& cfg, sim::quant::Recipe r) {
  // As in training (sim/train/run_config.cpp).
  if (cfg.precision == "bf16" && r.unquantized != "bf16") sim::quant::apply_recipe_override(r, "recipe.unquantized", "bf16");
  return r;
}

// ---------------------------------------------------------------------------
// The evaluation model
// ---------------------------------------------------------------------------

// A linear the recipe quantizes: the quantized linear for evaluation, and
// the unquantized one (the recipe's `unquantized` precision) that runs the
// calibration forward while recording the amax of X (X is in the model's
// memory `mem`: a device's is read through a host copy).
class QuantEvalModel::Linear final : public sim::Linear<float> {
 public:
  Linear(const sim::LinearInfo& info, std::unique_ptr<sim::Linear<float>> quantized,
         std::unique_ptr<sim::Linear<float>> plain, const sim::quant::RoleSpec& x_spec, const bool* calibrating,
         sim::Memory& mem)
      : sim::Linear<float>(info),
        quantized_(std::move(quantized)),
        plain_(std::move(plain)),
        x_spec_(x_spec),
        calibrating_(calibrating),
        mem_(mem) {}

  void forward(float* Y, const float* X, const float* W, int64_t tokens) override {
    if (*calibrating_) {
      const float* hx = sim::host_view(mem_, X, tokens * info_.in_features, host_x_);
      calib_amax_ = nan_max(calib_amax_, operand_amax(x_spec_, hx, tokens, info_.in_features, scratch_));
      plain_->forward(Y, X, W, tokens);
    } else {
      quantized_->forward(Y, X, W, tokens);
    }
  }
  void backward(float*, float*, const float*, const float*, const float*, int64_t) override {
    throw std::logic_error("an evaluation model runs forward only");
  }

  double calib_amax_ = 0;

 private:
  std::unique_ptr<sim::Linear<float>> quantized_, plain_;
  sim::quant::RoleSpec x_spec_;
  const bool* calibrating_;
  sim::Memory& mem_;
  std::vector<float> scratch_, host_x_;
};

class QuantEvalModel::Factory final : public sim::LinearFactory<float> {
 public:
  // `plain`: the unquantized linears on the model's memory `mem` (null: the CPU's).
  Factory(const sim::quant::Recipe& recipe, const ActPolicy& policy, int64_t num_blocks,
          std::shared_ptr<sim::quant::QuantRuntime> rt, std::unique_ptr<sim::LinearFactory<float>> plain,
          sim::Memory& mem)
      : recipe_(recipe), policy_(policy), num_blocks_(num_blocks), rt_(std::move(rt)), mem_(mem) {
    sim::quant::validate_recipe(recipe_);
    unquantized_ = plain ? std::move(plain) : sim::make_linear_factory<float>(recipe_.unquantized);
  }
  std::string policy() const override { return "eval:" + recipe_.name + ":" + act_policy_name(policy_); }

  std::unique_ptr<sim::Linear<float>> make(const sim::LinearInfo& info) const override {
    if (!recipe_.quantizes(info, num_blocks_)) return unquantized_->make(info);
    auto specs = recipe_.resolve(info, num_blocks_);
    auto& x = specs[sim::quant::role_index(Role::fprop_x)];
    auto& w = specs[sim::quant::role_index(Role::fprop_w)];
    const RefPolicy train_x = x.reference, train_w = w.reference;  // the recipe's own (policy checkpoint)
    // The evaluation policy replaces the recipe's forward references; a
    // role without a tensor scale (`none`) keeps none.
    // Row outer scales on fprop-x (its rows are tokens) run `current` under
    // every policy: per-token scales are measured with the tokens.
    if (x.reference.kind != RefPolicy::Kind::none && x.q.outer == OuterScale::row) {
      x.reference = RefPolicy{RefPolicy::Kind::current, 0};
    } else if (x.reference.kind != RefPolicy::Kind::none) {
      switch (policy_.kind) {
        case ActPolicy::Kind::current: x.reference = RefPolicy{RefPolicy::Kind::current, 0}; break;
        case ActPolicy::Kind::replay: x.reference = RefPolicy{RefPolicy::Kind::periodic, policy_.n}; break;
        case ActPolicy::Kind::calibrated: x.reference = kFrozen; break;
        case ActPolicy::Kind::checkpoint:
          x.reference = held(x.reference) ? kFrozen : RefPolicy{RefPolicy::Kind::current, 0};
          break;
      }
    }
    if (w.reference.kind != RefPolicy::Kind::none) w.reference = kFrozen;
    Entry e{info, specs};
    e.train_x = train_x;
    e.train_w = train_w;
    auto q = std::make_unique<sim::quant::QuantizedLinear>(info, specs, recipe_.gemm, recipe_.shared_dy_reference, rt_);
    auto lin = std::make_unique<QuantEvalModel::Linear>(info, std::move(q), unquantized_->make(info),
                                                       specs[sim::quant::role_index(Role::fprop_x)], &calibrating_, mem_);
    e.linear = lin.get();
    entries_.push_back(std::move(e));
    return lin;
  }

  struct Entry {
    sim::LinearInfo info;
    std::array<sim::quant::RoleSpec, sim::quant::kNumRoles> specs;
    QuantEvalModel::Linear* linear = nullptr;
    RefPolicy train_x, train_w;  // the recipe's forward references, as training held them
    const sim::quant::RoleSpec& spec(Role r) const { return specs[sim::quant::role_index(r)]; }
  };
  const std::vector<Entry>& entries() const { return entries_; }
  mutable bool calibrating_ = false;

 private:
  sim::quant::Recipe recipe_;
  ActPolicy policy_;
  int64_t num_blocks_;
  std::shared_ptr<sim::quant::QuantRuntime> rt_;
  sim::Memory& mem_;
  std::unique_ptr<sim::LinearFactory<float>> unquantized_;
  mutable std::vector<Entry> entries_;
};

QuantEvalModel::QuantEvalModel(const train::RunConfig& cfg, sim::quant::Recipe recipe, ActPolicy policy)
    : cfg_(cfg), recipe_(std::move(recipe)), policy_(policy) {
  const sim::quant::RuntimeOptions rt_opt{cfg_.seed, 128, 64,
                                          sim::quant::parse_fp32_gemm(cfg_.fp32_gemm, cfg_.device.is_cuda())};
  if (!cfg_.device.is_cuda()) {  // forward only: weights and activations, no gradients or AdamW moments
    // (in host memory; on a CUDA device they are the device's), and the
    // quantized linears' scratch (planned for forward and backward: an
    // upper bound of the forward's)
    const models::MemoryEstimate m = models::training_memory(cfg_.model, cfg_.batch_size, cfg_.seq_len);
    const double scratch = sim::quant::quant_scratch_bytes(
        recipe_, cfg_.model.num_hidden_layers, models::linear_infos(cfg_.model), cfg_.batch_size * cfg_.seq_len,
        rt_opt, false);
    sim::require_memory(m.params + m.activations + m.workspace + scratch,
                        "evaluating model " + cfg_.model_name + " (batch " + std::to_string(cfg_.batch_size) + " x " +
                            std::to_string(cfg_.seq_len) + ")",
                        "lower train.batch_size or train.seq_len with --set");
  }
  recipe_ = run_recipe(cfg_, std::move(recipe_));
  // As the trainer builds its model (sim/train/trainer.cpp): the quantized
  // linears through the device's ops, the others the device's plain
  // linears, the layers and tensors the device backend's.
  device_ = std::make_unique<train::TrainingDevice>(cfg_.device);
  runtime_ = std::make_shared<sim::quant::QuantRuntime>(rt_opt);
  runtime_->set_ops(device_->quant_ops());
  factory_ = std::make_unique<Factory>(recipe_, policy_, cfg_.model.num_hidden_layers, runtime_,
                                       device_->on_device() ? device_->plain_linears(recipe_.unquantized) : nullptr,
                                       device_->memory());
  model_ = std::make_unique<models::NemotronH<float>>(cfg_.model, *factory_, device_->backend());
  model_->set_bf16_activations(cfg_.precision == "bf16");
}

QuantEvalModel::~QuantEvalModel() = default;

int64_t QuantEvalModel::quantized_linears() const { return static_cast<int64_t>(factory_->entries().size()); }

int64_t QuantEvalModel::scaled_activations() const {
  int64_t n = 0;
  for (const auto& e : factory_->entries()) n += e.spec(Role::fprop_x).reference.kind != RefPolicy::Kind::none;
  return n;
}

std::string QuantEvalModel::reference_key(const std::string& linear, Role role) {
  return sim::quant::reference_key(linear, role, false);
}

void QuantEvalModel::set_params(std::span<const float> arena) {
  auto dst = model_->arena().params();
  if (arena.size() != dst.size())
    throw Error("evaluation model: the weights hold " + std::to_string(arena.size()) + " values, the model " +
                std::to_string(dst.size()) + " (another configuration?)");
  if (policy_.kind == ActPolicy::Kind::checkpoint)
    throw Error("policy checkpoint reads the tensor references of an exmy checkpoint (exmy eval RUN_DIR or "
                "--checkpoint FILE); weights alone have none");
  std::vector<float> staging;
  sim::write_through_host(model_->arena().memory(), dst.data(), static_cast<int64_t>(dst.size()), staging,
                          [&](float* q) { std::copy(arena.begin(), arena.end(), q); });
  freeze_weights();
  reset_activations();
}

int64_t QuantEvalModel::load_checkpoint(const std::string& path) {
  // load_checkpoint also reads the optimizer moments; they are dropped.
  sim::AdamW opt(model_->arena().layout(), cfg_.adamw);
  train::TrainState state;
  train::load_checkpoint(path, *model_, opt, state);
  round_working_weights();
  freeze_weights();
  reset_activations();
  if (policy_.kind == ActPolicy::Kind::checkpoint) freeze_checkpointed(path, state.step);
  return state.step;
}

void QuantEvalModel::freeze_checkpointed(const std::string& path, int64_t step) {
  io::h5::silence_errors();
  const io::h5::Handle f = io::h5::open_file(path, false);
  if (!f.valid()) throw Error("cannot read checkpoint '" + path + "'");
  for (const auto& e : factory_->entries()) {
    for (const auto& [role, trained] : {std::pair{Role::fprop_x, e.train_x}, std::pair{Role::fprop_w, e.train_w}}) {
      if (!held(trained)) continue;
      const std::string key = reference_key(e.info.name, role);
      const std::string ds = "/layer_state/" + key;
      if (!io::h5::path_exists(f.get(), ds))
        throw Error("policy checkpoint: '" + path + "' holds no tensor reference " + key +
                    " (was the run trained with recipe " + recipe_.name + "?)");
      sim::quant::ReferenceState st;
      try {
        st.load(io::h5::read_f64_array(f.get(), ds, "checkpoint '" + path + "'"));
        runtime_->references().get(key) = st.frozen_at(trained, step + 1);
      } catch (const Error& err) {
        throw Error("policy checkpoint: '" + path + "', " + key + ": " + err.what());
      }
    }
  }
}

void QuantEvalModel::load_hf(const std::string& path) {
  if (policy_.kind == ActPolicy::Kind::checkpoint)
    throw Error("policy checkpoint reads the tensor references of an exmy checkpoint; an HF checkpoint has none");
  models::load_hf_weights(*model_, path);
  round_working_weights();
  freeze_weights();
  reset_activations();
}

// A run with train.working_weights = bf16 read its FP32 master weights
// (what checkpoints and FP32 HF exports hold) rounded to BF16: so does its
// evaluation, as the in-training one does from the run's arena.
void QuantEvalModel::round_working_weights() {
  if (!cfg_.bf16_weights()) return;
  const auto params = model_->arena().params();
  model_->backend().round_bf16(params.data(), static_cast<int64_t>(params.size()));
}

void QuantEvalModel::freeze_weights() {
  std::vector<float> scratch, staging;
  for (const auto& e : factory_->entries()) {
    const auto& ws = e.spec(Role::fprop_w);
    if (ws.reference.kind == RefPolicy::Kind::none) continue;
    const float* W = sim::host_view(model_->arena().memory(), model_->arena().param(e.info.name + ".weight"),
                                    e.info.out_features * e.info.in_features, staging);
    auto& ref = runtime_->references().get(reference_key(e.info.name, Role::fprop_w));
    if (ws.q.outer == OuterScale::row)
      ref = sim::quant::ReferenceState::frozen_rows(
          operand_row_amax(ws, W, e.info.out_features, e.info.in_features, scratch));
    else
      ref = sim::quant::ReferenceState::frozen(operand_amax(ws, W, e.info.out_features, e.info.in_features, scratch));
  }
}

void QuantEvalModel::reset_activations() {
  calibrated_ = false;
  for (const auto& e : factory_->entries()) {
    runtime_->references().get(reference_key(e.info.name, Role::fprop_x)) = sim::quant::ReferenceState{};
    e.linear->calib_amax_ = 0;
  }
}

void QuantEvalModel::calibrate(std::span<const int32_t> sequences, int64_t seq_len, int64_t batch) {
  if (policy_.kind != ActPolicy::Kind::calibrated)
    throw Error("calibrate() under policy " + act_policy_name(policy_) + " (only calibrated:N calibrates)");
  if (seq_len <= 0 || batch <= 0 || sequences.size() % static_cast<size_t>(seq_len) != 0)
    throw Error("calibration sequences: bad shape");
  reset_activations();
  const int64_t n = static_cast<int64_t>(sequences.size()) / seq_len;
  factory_->calibrating_ = true;
  try {
    for (int64_t i = 0; i < n; i += batch) {
      const int64_t b = std::min(batch, n - i);
      model_->forward(sequences.data() + i * seq_len, nullptr, b, seq_len);
    }
    runtime_->finish();
  } catch (...) {
    factory_->calibrating_ = false;
    throw;
  }
  factory_->calibrating_ = false;
  for (const auto& e : factory_->entries()) {
    if (e.spec(Role::fprop_x).reference.kind == RefPolicy::Kind::none) continue;
    runtime_->references().get(reference_key(e.info.name, Role::fprop_x)) = sim::quant::ReferenceState::frozen(e.linear->calib_amax_);
  }
  calibrated_ = true;
}

QuantEvalModel::Result QuantEvalModel::evaluate(const EvalBatches& b, std::vector<float>* logits) {
  if (policy_.kind == ActPolicy::Kind::calibrated && !calibrated_)
    throw Error("policy " + act_policy_name(policy_) + ": calibrate before evaluating");
  // current and replay start cold at every evaluation; calibrated keeps its
  // frozen references.
  if (policy_.kind != ActPolicy::Kind::calibrated)
    for (const auto& e : factory_->entries())
      runtime_->references().get(reference_key(e.info.name, Role::fprop_x)) = sim::quant::ReferenceState{};
  Result r;
  const int64_t n = b.batch_size * b.seq_len;
  std::vector<float> staging;
  double sum = 0;
  for (int64_t i = 0; i < b.batches; ++i) {
    runtime_->begin({i + 1, 0, false, false});
    const double loss = model_->forward(b.tokens.data() + i * n, b.targets.data() + i * n, b.batch_size, b.seq_len);
    runtime_->finish();
    r.batch_losses.push_back(loss);
    r.tokens += model_->counted_targets();
    if (logits) {
      const int64_t nl = n * cfg_.model.vocab_size;
      const float* l = sim::host_view(model_->backend().memory(), model_->logits(), nl, staging);
      logits->insert(logits->end(), l, l + nl);
    }
    sum += loss;
  }
  // As the trainer's validation loss: the mean of the batch means.
  r.loss = sum / static_cast<double>(b.batches);
  return r;
}

EvalResult evaluate_params(const train::RunConfig& cfg, const EvalData& d, std::span<const float> params,
                           const sim::quant::Recipe& recipe, const ActPolicy& policy, int64_t batches) {
  const auto t0 = std::chrono::steady_clock::now();
  const EvalBatches vb = validation_batches(cfg, d, batches);
  QuantEvalModel m(cfg, recipe, policy);
  m.set_params(params);
  EvalResult r;
  r.name = recipe.name;
  r.policy = policy;
  if (policy.kind == ActPolicy::Kind::calibrated) {
    const auto seqs = calibration_sequences(cfg, d, policy.n);
    m.calibrate(seqs, cfg.seq_len, cfg.batch_size);
    r.calibration_sequences = policy.n;
  }
  const auto res = m.evaluate(vb);
  r.loss = res.loss;
  r.batches = vb.batches;
  r.tokens = res.tokens;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

// ---------------------------------------------------------------------------
// Run file rows
// ---------------------------------------------------------------------------

std::string eval_group(const std::string& name, const ActPolicy& policy) {
  if (name.empty() || name.find('/') != std::string::npos || name == "step" || name == "loss" || name == "." ||
      name == "..")
    throw Error("bad evaluation name '" + name + "' (a recipe name or --name: not empty, no '/', not step or loss)");
  return "/eval/" + name + "/" + act_policy_name(policy);
}

void append_eval_row(io::RunFile& run, const EvalResult& r) {
  const std::string g = eval_group(r.name, r.policy);
  // The other datasets first: a group's `step` is written last by flush().
  run.append(g + "/loss", r.loss);
  run.append(g + "/tokens", r.tokens);
  run.append(g + "/batches", r.batches);
  run.append(g + "/calibration_sequences", r.calibration_sequences);
  run.append(g + "/step", r.step);
}

std::string eval_recipe_attribute(const std::string& name) { return "eval_recipe:" + name; }

// ---------------------------------------------------------------------------
// In training
// ---------------------------------------------------------------------------

namespace {

std::vector<std::string> split_list(std::string_view s) {
  std::vector<std::string> v;
  size_t i = 0;
  while (i <= s.size()) {
    size_t j = s.find(',', i);
    if (j == std::string_view::npos) j = s.size();
    std::string item(s.substr(i, j - i));
    const auto b = item.find_first_not_of(" \t"), e = item.find_last_not_of(" \t");
    item = b == std::string::npos ? "" : item.substr(b, e - b + 1);
    if (!item.empty()) v.push_back(item);
    i = j + 1;
  }
  return v;
}

}  // namespace

TrainingEvalSpec parse_training_eval(std::string_view recipes, std::string_view policies) {
  TrainingEvalSpec s;
  for (const auto& r : split_list(recipes)) s.recipes.push_back(sim::quant::load_recipe(r));
  for (const auto& p : split_list(policies)) {
    s.policies.push_back(parse_act_policy(p));
    if (s.policies.back().kind == ActPolicy::Kind::checkpoint)
      throw Error("eval.policies: checkpoint evaluates a checkpoint's tensor references; run exmy eval on the "
                  "run's checkpoint instead");
  }
  if (s.policies.empty()) s.policies.push_back(ActPolicy{});
  return s;
}

std::optional<TrainingEvalSpec> training_eval_from_config(const train::RunConfig& cfg) {
  const auto get = [&](const char* key, const char* fallback) {
    const auto it = cfg.values.find(key);
    return it == cfg.values.end() ? std::string(fallback) : it->second;
  };
  const std::string recipes = get("eval.recipes", "");
  if (split_list(recipes).empty()) return std::nullopt;
  TrainingEvalSpec spec;
  try {
    spec = parse_training_eval(recipes, get("eval.policies", "current"));
  } catch (const Error& e) {
    throw Error(std::string("eval.recipes / eval.policies: ") + e.what());
  }
  const std::string b = get("eval.batches", "0");
  const auto r = std::from_chars(b.data(), b.data() + b.size(), spec.batches);
  if (r.ec != std::errc() || r.ptr != b.data() + b.size() || spec.batches < 0)
    throw Error("eval.batches: bad value '" + b + "' (expected 0 or a positive integer)");
  // Every recipe against the run's model, now rather than at the first
  // validation step (a layer the recipe cannot quantize is named here).
  for (const auto& rec : spec.recipes) {
    try {
      QuantEvalModel probe(cfg, rec, spec.policies.front());
    } catch (const Error& e) {
      throw Error("eval.recipes: " + std::string(e.what()));
    }
  }
  return spec;
}

AfterStepHook make_training_eval_hook(const train::RunConfig& cfg, TrainingEvalSpec spec, AfterStepHook next,
                                      std::FILE* out) {
  struct State {
    train::RunConfig cfg;
    TrainingEvalSpec spec;
    AfterStepHook next;
    std::FILE* out;
    std::unique_ptr<EvalData> data;
    bool attributes_written = false;
    std::vector<float> params;  // host copy of a device model's weights
  };
  auto st = std::make_shared<State>(State{cfg, std::move(spec), std::move(next), out, nullptr, false, {}});
  return [st](int64_t step, models::NemotronH<float>& model, io::RunFile& run) {
    if (st->next) st->next(step, model, run);
    const auto& c = st->cfg;
    // The trainer's validation steps (sim/train/trainer.cpp).
    if (st->spec.recipes.empty() || !((c.eval_interval > 0 && step % c.eval_interval == 0) || step == c.steps)) return;
    if (!st->data) st->data = std::make_unique<EvalData>(open_eval_data(c));
    if (!st->attributes_written) {
      for (const auto& r : st->spec.recipes)
        run.set_attribute(eval_recipe_attribute(r.name), sim::quant::recipe_to_ini(run_recipe(c, r)));
      st->attributes_written = true;
    }
    // The training model's weights as the host sees them (a copy when it
    // trains on a device); each evaluation copies them to its own model.
    const auto& arena = std::as_const(model).arena();
    const float* p = sim::host_view(arena.memory(), arena.params().data(), static_cast<int64_t>(arena.params().size()),
                                    st->params);
    const std::span<const float> params(p, arena.params().size());
    for (const auto& r : st->spec.recipes) {
      for (const auto& p : st->spec.policies) {
        EvalResult e = evaluate_params(c, *st->data, params, r, p, st->spec.batches);
        e.step = step;
        append_eval_row(run, e);
        if (st->out) {
          std::fprintf(st->out, "eval step %lld | %s %s | val loss %.4f (%.1fs)\n", static_cast<long long>(step),
                       e.name.c_str(), act_policy_name(p).c_str(), e.loss, e.seconds);
          std::fflush(st->out);
        }
      }
    }
  };
}

}  // namespace exmy::eval

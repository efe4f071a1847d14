// Quantized-inference evaluation in process (sim/eval/quant_eval.hpp): the
// three activation-scale policies on proxy-tiny, frozen weight and
// calibrated references, reproducibility across thread counts, the fp32
// recipe against the training loop's validation loss, and the in-training
// hook.
#include <gtest/gtest.h>
#include <omp.h>

#include <bit>
#include <cmath>
#include <initializer_list>
#include <map>

#include "formats/quantize.hpp"
#include "sim/device/device.hpp"
#include "sim/eval/quant_eval.hpp"
#include "sim/io/h5.hpp"
#include "sim/io/run_file.hpp"
#include "sim/quant/stats.hpp"
#include "sim/train/checkpoint.hpp"
#include "sim/train/trainer.hpp"
#include "sim/train/training_device.hpp"
#include "tests/train/test_support.hpp"

namespace exmy::eval {
namespace {

using sim::quant::Role;
using test::expect_error;
using test::TempDir;

using test::bits;

// proxy-tiny on a small synthetic source: 3 validation batches of 4 x 16.
train::RunConfig tiny(std::vector<std::string> sets = {}) {
  std::vector<std::string> base = {"train.steps=4",        "train.batch_size=4",    "train.seq_len=16",
                                   "train.log_interval=2", "train.eval_interval=2", "train.eval_batches=3",
                                   "optim.lr=1e-2",        "data.synthetic_tokens=8192"};
  base.insert(base.end(), sets.begin(), sets.end());
  return train::parse_run_config("", "test", base);
}

// A recipe that quantizes every linear in NVFP4 with `current` references
// (the policies replace them), the given overrides applied.
sim::quant::Recipe nvfp4(std::vector<std::string> sets = {}) {
  auto r = sim::quant::load_recipe("nvfp4-no-rht-all");
  for (const auto& s : sets) sim::quant::apply_recipe_override(r, s);
  return r;
}

// Weights of a freshly initialized model (seeded), as an arena.
std::vector<float> init_params(const train::RunConfig& cfg) {
  auto f = sim::make_linear_factory<float>("fp32");
  models::NemotronH<float> m(cfg.model, *f);
  m.init_weights(cfg.seed);
  const auto p = m.arena().params();
  return {p.begin(), p.end()};
}

struct Fixture {
  train::RunConfig cfg = tiny();
  EvalData data = open_eval_data(cfg);
  EvalBatches batches = validation_batches(cfg, data);
  std::vector<float> params = init_params(cfg);
};
Fixture& fx() {
  static Fixture f;
  return f;
}

QuantEvalModel::Result run(const sim::quant::Recipe& r, const ActPolicy& p, QuantEvalModel** keep = nullptr) {
  static std::unique_ptr<QuantEvalModel> last;
  last = std::make_unique<QuantEvalModel>(fx().cfg, r, p);
  last->set_params(fx().params);
  if (p.kind == ActPolicy::Kind::calibrated)
    last->calibrate(calibration_sequences(fx().cfg, fx().data, p.n), fx().cfg.seq_len, fx().cfg.batch_size);
  if (keep) *keep = last.get();
  return last->evaluate(fx().batches);
}

void expect_same(const QuantEvalModel::Result& a, const QuantEvalModel::Result& b) {
  ASSERT_EQ(a.batch_losses.size(), b.batch_losses.size());
  for (size_t i = 0; i < a.batch_losses.size(); ++i)
    EXPECT_EQ(bits(a.batch_losses[i]), bits(b.batch_losses[i])) << "batch " << i + 1;
  EXPECT_EQ(bits(a.loss), bits(b.loss));
  EXPECT_EQ(a.tokens, b.tokens);
}

TEST(EvalPolicy, ParsesAndRejects) {
  EXPECT_EQ(parse_act_policy("current"), ActPolicy{});
  EXPECT_EQ(parse_act_policy("replay:4"), (ActPolicy{ActPolicy::Kind::replay, 4}));
  EXPECT_EQ(parse_act_policy("calibrated:64"), (ActPolicy{ActPolicy::Kind::calibrated, 64}));
  for (const char* s : {"current", "replay:1", "replay:50", "calibrated:3"})
    EXPECT_EQ(act_policy_name(parse_act_policy(s)), s);
  for (const char* s : {"", "Current", "replay", "replay:0", "replay:-2", "replay:x", "calibrated:", "delayed:4", "periodic:2"})
    expect_error([&] { parse_act_policy(s); }, "activation-scale policy");
  expect_error([] { eval_group("a/b", ActPolicy{}); }, "bad evaluation name");
  expect_error([] { eval_group("loss", ActPolicy{}); }, "bad evaluation name");
  EXPECT_EQ(eval_group("te-nvfp4", ActPolicy{ActPolicy::Kind::replay, 4}), "/eval/te-nvfp4/replay:4");
}

TEST(EvalPolicy, ReplayOneEqualsCurrentAndLongerPeriodsHoldTheFirstSample) {
  const auto r = nvfp4();
  const auto cur = run(r, ActPolicy{});
  ASSERT_EQ(cur.batch_losses.size(), 3u);
  EXPECT_TRUE(std::isfinite(cur.loss));
  EXPECT_GT(cur.tokens, 0);
  expect_same(run(r, ActPolicy{ActPolicy::Kind::replay, 1}), cur);

  // replay:3 over 3 batches: batch 1 samples (as current does), batches 2
  // and 3 reuse batch 1's amax: different scales, different losses.
  QuantEvalModel* m = nullptr;
  const auto rep = run(r, ActPolicy{ActPolicy::Kind::replay, 3}, &m);
  EXPECT_EQ(bits(rep.batch_losses[0]), bits(cur.batch_losses[0]));
  EXPECT_NE(bits(rep.batch_losses[1]), bits(cur.batch_losses[1]));
  EXPECT_NE(bits(rep.batch_losses[2]), bits(cur.batch_losses[2]));
  const auto& ref = m->runtime().references().get(QuantEvalModel::reference_key("layers.0.mixer.in_proj", Role::fprop_x));
  EXPECT_TRUE(ref.has_held());
  EXPECT_EQ(ref.sampled_step(), 1);

  // replay:2: sampled on batches 1 and 3; batch 3 then equals current's.
  const auto rep2 = run(r, ActPolicy{ActPolicy::Kind::replay, 2}, &m);
  EXPECT_EQ(bits(rep2.batch_losses[0]), bits(cur.batch_losses[0]));
  EXPECT_EQ(bits(rep2.batch_losses[1]), bits(rep.batch_losses[1]));
  EXPECT_EQ(bits(rep2.batch_losses[2]), bits(cur.batch_losses[2]));
  EXPECT_EQ(m->runtime().references().get(QuantEvalModel::reference_key("layers.0.mixer.in_proj", Role::fprop_x))
                .sampled_step(),
            3);

  // A second evaluation starts cold again: the same result.
  expect_same(m->evaluate(fx().batches), rep2);
}

TEST(EvalPolicy, CalibratedIsTheMaximumOverTheSequencesAndStaysFrozen) {
  const auto r = nvfp4();
  const auto& f = fx();
  const auto seqs = calibration_sequences(f.cfg, f.data, 8);
  ASSERT_EQ(seqs.size(), 8u * 16u);
  QuantEvalModel m(f.cfg, r, ActPolicy{ActPolicy::Kind::calibrated, 8});
  m.set_params(f.params);
  expect_error([&] { m.evaluate(f.batches); }, "calibrate before evaluating");
  m.calibrate(seqs, f.cfg.seq_len, 3);  // batches of 3, 3, 2 sequences

  // The two halves calibrated apart: the whole is the max of the two.
  QuantEvalModel a(f.cfg, r, ActPolicy{ActPolicy::Kind::calibrated, 4}), b(f.cfg, r, ActPolicy{ActPolicy::Kind::calibrated, 4});
  a.set_params(f.params);
  b.set_params(f.params);
  a.calibrate(std::span(seqs).first(4 * 16), f.cfg.seq_len, 4);
  b.calibrate(std::span(seqs).last(4 * 16), f.cfg.seq_len, 4);
  ASSERT_EQ(m.quantized_linears(), 13 - 1);  // every linear but the LM head
  std::map<std::string, double> held;
  for (const auto& lin : m.model().linears()) {
    if (lin->info().name == "lm_head") continue;
    const std::string key = QuantEvalModel::reference_key(lin->info().name, Role::fprop_x);
    const auto& s = m.runtime().references().get(key);
    ASSERT_TRUE(s.has_held()) << key;
    EXPECT_GT(s.held(), 0) << key;
    EXPECT_EQ(s.held(), std::max(a.runtime().references().get(key).held(), b.runtime().references().get(key).held()))
        << key;
    held[key] = s.held();
  }

  // Evaluating twice: the same losses, the references unchanged (frozen),
  // and not those of `current`.
  const auto first = m.evaluate(f.batches);
  const auto second = m.evaluate(f.batches);
  expect_same(first, second);
  for (const auto& [key, v] : held) {
    EXPECT_EQ(m.runtime().references().get(key).held(), v) << key;
    EXPECT_EQ(m.runtime().references().get(key).sampled_step(), 1) << key;
  }
  EXPECT_NE(bits(first.loss), bits(run(r, ActPolicy{}).loss));

  // Calibrating under another policy is refused.
  QuantEvalModel c(f.cfg, r, ActPolicy{});
  expect_error([&] { c.calibrate(seqs, f.cfg.seq_len, 4); }, "only calibrated:N calibrates");
  expect_error([&] { calibration_sequences(f.cfg, f.data, 1 << 20); }, "disjoint training windows");
}

// Weight amaxes are measured at load (after the RHT when fprop-w has it) and
// frozen; with `current` activations the evaluation is then exactly the
// recipe's own forward pass (a held amax quantizes as the measured one).
TEST(EvalPolicy, WeightsFrozenAtLoadAndCurrentEqualsTheRecipesForward) {
  const auto& f = fx();
  for (const bool rht : {false, true}) {
    SCOPED_TRACE(rht ? "RHT on the forward operands" : "no RHT");
    // RHT must be on for both fprop operands at once (the recipe is
    // validated after every --set), and runs along 1x16 blocks only, so the
    // RHT variant is a recipe text with 1x16 weight blocks.
    const auto r = rht ? sim::quant::parse_recipe("[recipe]\nbase = nvfp4-no-rht-all\n[weights]\nblock = 1x16\n"
                                                  "[fprop-x]\nrht = true\n[fprop-w]\nrht = true\n",
                             "nvfp4-rht-fprop", "test")
                       : nvfp4();

    QuantEvalModel m(f.cfg, r, ActPolicy{});
    m.set_params(f.params);
    int checked = 0;
    for (const auto& lin : m.model().linears()) {
      const auto& info = lin->info();
      if (info.name == "lm_head") continue;
      const auto& s = m.runtime().references().get(QuantEvalModel::reference_key(info.name, Role::fprop_w));
      ASSERT_TRUE(s.has_held()) << info.name;
      std::vector<float> w(m.model().arena().param(info.name + ".weight"),
                           m.model().arena().param(info.name + ".weight") + info.out_features * info.in_features);
      const auto specs = r.resolve(info, f.cfg.model.num_hidden_layers);
      const auto& ws = specs[sim::quant::role_index(Role::fprop_w)];
      ASSERT_EQ(ws.q.rht, rht) << info.name;
      ASSERT_EQ(specs[sim::quant::role_index(Role::fprop_x)].q.rht, rht) << info.name;
      if (rht) hadamard16(w.data(), info.out_features, info.in_features, 1, ws.q.rht_signs);
      EXPECT_EQ(s.held(), sim::quant::abs_max(w.data(), static_cast<int64_t>(w.size()))) << info.name;
      ++checked;
    }
    EXPECT_EQ(checked, 12);
    const auto res = m.evaluate(f.batches);

    // The recipe's forward, every reference `current`, at step b.
    auto rt = std::make_shared<sim::quant::QuantRuntime>(sim::quant::RuntimeOptions{f.cfg.seed, 128});
    sim::quant::RecipeLinearFactory factory(r, f.cfg.model.num_hidden_layers, rt);
    models::NemotronH<float> plain(f.cfg.model, factory);
    std::copy(f.params.begin(), f.params.end(), plain.arena().params().begin());
    const int64_t n = f.cfg.batch_size * f.cfg.seq_len;
    for (int64_t b = 0; b < f.batches.batches; ++b) {
      rt->begin({b + 1, 0, false, false});
      const double loss = plain.forward(f.batches.tokens.data() + b * n, f.batches.targets.data() + b * n,
                                        f.cfg.batch_size, f.cfg.seq_len);
      EXPECT_EQ(bits(loss), bits(res.batch_losses[static_cast<size_t>(b)])) << "batch " << b + 1;
    }

    // Frozen: weights changed after the load keep the amax measured at the
    // load (so they quantize differently from a fresh load of them).
    const std::string w0 = "layers.0.mixer.in_proj";
    const auto& held = m.runtime().references().get(QuantEvalModel::reference_key(w0, Role::fprop_w));
    const double before = held.held();
    float* W = m.model().arena().param(w0 + ".weight");
    const auto& i0 = m.model().linears().front()->info();
    ASSERT_EQ(i0.name, w0);
    for (int64_t i = 0; i < i0.out_features * i0.in_features; ++i) W[i] *= 4;
    const auto scaled = m.evaluate(f.batches);
    EXPECT_EQ(held.held(), before);
    std::vector<float> p4(m.model().arena().params().begin(), m.model().arena().params().end());
    QuantEvalModel fresh(f.cfg, r, ActPolicy{});
    fresh.set_params(p4);
    EXPECT_EQ(fresh.runtime().references().get(QuantEvalModel::reference_key(w0, Role::fprop_w)).held(), 4 * before);
    EXPECT_NE(bits(fresh.evaluate(f.batches).loss), bits(scaled.loss));
  }
}

// MX recipes have no tensor scale: the policy has nothing to act on.
TEST(EvalPolicy, RecipesWithoutTensorScaleIgnoreThePolicy) {
  const auto r = sim::quant::load_recipe("mxfp4");
  QuantEvalModel* m = nullptr;
  const auto cur = run(r, ActPolicy{}, &m);
  EXPECT_EQ(m->scaled_activations(), 0);
  EXPECT_EQ(m->quantized_linears(), 12);
  expect_same(run(r, ActPolicy{ActPolicy::Kind::replay, 2}), cur);
  expect_same(run(r, ActPolicy{ActPolicy::Kind::calibrated, 4}), cur);
}

// Same weights, same recipe and policy: the same bits with 1 and 2 threads,
// including stochastic rounding in the forward roles and the grouped GEMM.
TEST(EvalReproducibility, OneAndTwoThreadsGiveTheSameLoss) {
  const auto r = sim::quant::load_recipe("ue5m3-b16");
  auto sr = r;
  sim::quant::apply_recipe_override(sr, "recipe.fprop-x.round=stochastic");
  const int saved = omp_get_max_threads();
  for (const auto& p : {ActPolicy{}, ActPolicy{ActPolicy::Kind::replay, 2}, ActPolicy{ActPolicy::Kind::calibrated, 6}}) {
    for (const auto* rec : std::initializer_list<const sim::quant::Recipe*>{&r, &sr}) {
      SCOPED_TRACE(act_policy_name(p) + (rec == &sr ? " with SR on fprop-x" : ""));
      omp_set_num_threads(1);
      const auto one = run(*rec, p);
      omp_set_num_threads(2);
      const auto two = run(*rec, p);
      expect_same(one, two);
      EXPECT_TRUE(std::isfinite(one.loss));
    }
  }
  omp_set_num_threads(saved);
}

// The fp32 recipe is the unquantized forward: its evaluation equals the
// training loop's validation loss on the same batches, bit for bit, for an
// fp32 and a bf16 run, from the parameters and from the checkpoint; and for
// a run with BF16 working weights, whose checkpoint holds the FP32 master
// that the evaluation rounds as the run did.
TEST(EvalAgainstTraining, Fp32RecipeEqualsTheValidationLoss) {
  for (const std::vector<std::string>& sets : {std::vector<std::string>{"train.precision=fp32"},
                                               std::vector<std::string>{"train.precision=bf16"},
                                               std::vector<std::string>{"train.working_weights=bf16"}}) {
    SCOPED_TRACE(sets[0]);
    TempDir d;
    const auto cfg = tiny(sets);
    train::TrainHooks h;
    h.out = nullptr;
    h.keep_params = true;
    const auto res = train::train_new(cfg, d.path(), h, {});
    ASSERT_EQ(res.status, train::TrainStatus::completed);
    const EvalData data = open_eval_data(cfg);
    const auto fp32 = sim::quant::load_recipe("fp32");
    const EvalResult e = evaluate_params(cfg, data, res.params, fp32, ActPolicy{});
    EXPECT_EQ(bits(e.loss), bits(res.last_val_loss));
    EXPECT_EQ(e.batches, 3);
    EXPECT_EQ(e.tokens, 3 * 4 * 16);

    QuantEvalModel m(cfg, fp32, ActPolicy{});
    EXPECT_EQ(m.load_checkpoint(res.checkpoint), 4);
    EXPECT_EQ(bits(m.evaluate(validation_batches(cfg, data)).loss), bits(res.last_val_loss));
  }
}

// Policy checkpoint: the forward references a ue5m3-b16 run (periodic:3
// here) checkpointed, frozen: the evaluation's fprop-x and fprop-w states
// hold exactly the checkpoint's samples (the weights' sampled at step 4,
// not the final weights' amax), and its loss is that of those scales.
// Mismatched inputs are one-line errors.
TEST(EvalPolicy, CheckpointFreezesTheTrainingRunsOwnReferences) {
  TempDir d;
  const auto cfg = tiny({"train.recipe=ue5m3-b16", "recipe.all.reference=periodic:3", "train.steps=5"});
  train::TrainHooks h;
  h.out = nullptr;
  h.keep_params = true;
  const auto res = train::train_new(cfg, d.path(), h, {});
  ASSERT_EQ(res.status, train::TrainStatus::completed);
  auto recipe = run_recipe(cfg, sim::quant::load_recipe("ue5m3-b16"));
  sim::quant::apply_recipe_override(recipe, "recipe.all.reference=periodic:3");
  const ActPolicy ck = parse_act_policy("checkpoint");
  EXPECT_EQ(act_policy_name(ck), "checkpoint");
  QuantEvalModel m(cfg, recipe, ck);
  EXPECT_EQ(m.load_checkpoint(res.checkpoint), 5);
  const std::string layer = "layers.0.mixer.in_proj";
  io::h5::silence_errors();
  const io::h5::Handle f = io::h5::open_file(res.checkpoint, false);
  ASSERT_TRUE(f.valid());
  for (const Role role : {Role::fprop_x, Role::fprop_w}) {
    const std::string key = QuantEvalModel::reference_key(layer, role);
    const auto saved = io::h5::read_f64_array(f.get(), "/layer_state/" + key, "checkpoint");
    ASSERT_EQ(saved[1], 1.0) << key;  // held
    EXPECT_EQ(saved[3], 4.0) << key;  // sampled at step 4 (1, 4, 7, ...)
    const auto& st = m.runtime().references().get(key);
    ASSERT_TRUE(st.has_held()) << key;
    EXPECT_EQ(st.held(), saved[2]) << key;
  }
  // the weights' sample of step 4 is not the final weights' amax
  QuantEvalModel cur(cfg, recipe, ActPolicy{});
  cur.load_checkpoint(res.checkpoint);
  const std::string wkey = QuantEvalModel::reference_key(layer, Role::fprop_w);
  EXPECT_NE(cur.runtime().references().get(wkey).held(), m.runtime().references().get(wkey).held());
  const EvalData data = open_eval_data(cfg);
  const EvalBatches vb = validation_batches(cfg, data);
  const auto a = m.evaluate(vb), b = cur.evaluate(vb);
  EXPECT_TRUE(std::isfinite(a.loss));
  EXPECT_NE(bits(a.loss), bits(b.loss));
  // the state after evaluating is still the checkpoint's (frozen)
  EXPECT_EQ(m.runtime().references().get(wkey).held(),
            io::h5::read_f64_array(f.get(), "/layer_state/" + wkey, "checkpoint")[2]);

  // errors: weights without references, an HF checkpoint, a run trained otherwise, in-training
  QuantEvalModel p(cfg, recipe, ck);
  expect_error([&] { p.set_params(res.params); }, "policy checkpoint reads the tensor references");
  expect_error([&] { p.load_hf(d / "none"); }, "an HF checkpoint has none");
  TempDir d2;
  const auto plain_cfg = tiny({"train.steps=2"});
  const auto plain = train::train_new(plain_cfg, d2.path(), h, {});
  ASSERT_EQ(plain.status, train::TrainStatus::completed);
  QuantEvalModel q(plain_cfg, recipe, ck);
  expect_error([&] { q.load_checkpoint(plain.checkpoint); }, "holds no tensor reference " + QuantEvalModel::reference_key(layer, Role::fprop_x));
  expect_error([&] { parse_training_eval("ue5m3-b16", "current,checkpoint"); }, "eval.policies: checkpoint");
}

// The in-training hook: rows under /eval/RECIPE/POLICY at the trainer's
// validation steps; the fp32 rows repeat /eval/loss; the last row of a
// quantized recipe equals a standalone evaluation of the final weights.
TEST(EvalInTraining, HookAppendsRowsAtValidationSteps) {
  TempDir d;
  const auto cfg = tiny();
  train::TrainHooks h;
  h.out = nullptr;
  h.keep_params = true;
  int calls = 0;
  h.after_step = make_training_eval_hook(
      cfg, parse_training_eval("fp32, nvfp4-no-rht-all", "current,calibrated:4"),
      [&](int64_t, models::NemotronH<float>&, io::RunFile&) { ++calls; }, nullptr);
  const auto res = train::train_new(cfg, d.path(), h, {});
  ASSERT_EQ(res.status, train::TrainStatus::completed);
  EXPECT_EQ(calls, 4);  // the hook it wraps still runs at every step
  const std::string f = d / "run.h5";
  const auto val_steps = io::read_run_column(f, "/eval/step"), val = io::read_run_column(f, "/eval/loss");
  ASSERT_EQ(val_steps, (std::vector<double>{2, 4}));
  for (const char* g : {"/eval/fp32/current", "/eval/fp32/calibrated:4", "/eval/nvfp4-no-rht-all/current",
                        "/eval/nvfp4-no-rht-all/calibrated:4"})
    EXPECT_EQ(io::read_run_column(f, std::string(g) + "/step"), val_steps) << g;
  const auto fp32 = io::read_run_column(f, "/eval/fp32/current/loss");
  ASSERT_EQ(fp32.size(), 2u);
  for (size_t i = 0; i < 2; ++i) EXPECT_EQ(bits(fp32[i]), bits(val[i]));
  EXPECT_EQ(io::read_run_column(f, "/eval/nvfp4-no-rht-all/calibrated:4/calibration_sequences"),
            (std::vector<double>{4, 4}));
  const auto q = io::read_run_column(f, "/eval/nvfp4-no-rht-all/current/loss");
  const EvalData data = open_eval_data(cfg);
  const EvalResult e = evaluate_params(cfg, data, res.params, nvfp4(), ActPolicy{});
  EXPECT_EQ(bits(q.back()), bits(e.loss));
  const auto text = io::read_run_attribute(f, eval_recipe_attribute("nvfp4-no-rht-all"));
  ASSERT_TRUE(text.has_value());
  EXPECT_EQ(*text, sim::quant::recipe_to_ini(nvfp4()));
  // No recipes: no hook work at all.
  EXPECT_TRUE(parse_training_eval("", "").recipes.empty());
  expect_error([] { parse_training_eval("no-such-recipe", ""); }, "no-such-recipe");
}

// The configuration keys that turn the hook on from `exmy train`
// (eval.recipes, eval.policies, eval.batches; read from RunConfig::values).
TEST(EvalInTraining, SpecFromConfigurationValues) {
  auto cfg = tiny();
  cfg.values.erase("eval.recipes");
  EXPECT_FALSE(training_eval_from_config(cfg).has_value());  // keys absent: off
  cfg.values["eval.recipes"] = " ";
  EXPECT_FALSE(training_eval_from_config(cfg).has_value());  // empty: off
  cfg.values["eval.recipes"] = "fp32,nvfp4-no-rht-all";
  cfg.values["eval.policies"] = "current, replay:2";
  cfg.values["eval.batches"] = "2";
  const auto spec = training_eval_from_config(cfg);
  ASSERT_TRUE(spec.has_value());
  ASSERT_EQ(spec->recipes.size(), 2u);
  EXPECT_EQ(spec->recipes[1].name, "nvfp4-no-rht-all");
  EXPECT_EQ(spec->policies, (std::vector<ActPolicy>{ActPolicy{}, ActPolicy{ActPolicy::Kind::replay, 2}}));
  EXPECT_EQ(spec->batches, 2);
  cfg.values["eval.policies"] = "";
  EXPECT_EQ(training_eval_from_config(cfg)->policies, std::vector<ActPolicy>{ActPolicy{}});
  cfg.values["eval.policies"] = "replay:0";
  expect_error([&] { training_eval_from_config(cfg); }, "eval.recipes / eval.policies: bad activation-scale policy");
  cfg.values["eval.policies"] = "current";
  cfg.values["eval.batches"] = "-1";
  expect_error([&] { training_eval_from_config(cfg); }, "eval.batches: bad value '-1'");
  cfg.values["eval.batches"] = "0";
  cfg.values["eval.recipes"] = "fp32,no-such-recipe";
  expect_error([&] { training_eval_from_config(cfg); }, "no-such-recipe");
}

// ---------------------------------------------------------------------------
// On a device: cuda-emulated runs the device backend, memory and ops (its
// memory is not the host's to the model, so every host read is a staged
// copy) and gives the CPU's bits.
// ---------------------------------------------------------------------------

struct DeviceEval {
  QuantEvalModel::Result res;
  std::vector<float> logits;
  std::map<std::string, std::vector<double>> refs;  // every reference state after evaluating
};

// Loads `res`'s weights (its checkpoint, or the arena when !from_checkpoint),
// calibrates under calibrated:N and evaluates the run's validation batches.
DeviceEval eval_on(const train::RunConfig& base, const char* device, const train::TrainResult& res,
                   const sim::quant::Recipe& recipe, const ActPolicy& p, bool from_checkpoint) {
  train::RunConfig cfg = base;
  cfg.device = sim::parse_device(device, "test");
  QuantEvalModel m(cfg, recipe, p);
  EXPECT_EQ(m.model().arena().memory().on_host(), cfg.device.is_cpu()) << device;
  EXPECT_EQ(m.device().on_device(), !cfg.device.is_cpu()) << device;
  EXPECT_STREQ(m.runtime().ops().name(), cfg.device.is_cpu() ? "cpu" : "cuda-emulated");
  if (from_checkpoint)
    EXPECT_EQ(m.load_checkpoint(res.checkpoint), base.steps);
  else
    m.set_params(res.params);
  const EvalData data = open_eval_data(cfg);
  if (p.kind == ActPolicy::Kind::calibrated)
    m.calibrate(calibration_sequences(cfg, data, p.n), cfg.seq_len, cfg.batch_size);
  DeviceEval e;
  e.res = m.evaluate(validation_batches(cfg, data), &e.logits);
  for (const auto& [k, st] : m.runtime().references().states()) e.refs[k] = st.save();
  return e;
}

void expect_same_bits(const DeviceEval& a, const DeviceEval& b) {
  expect_same(a.res, b.res);
  ASSERT_EQ(a.logits.size(), b.logits.size());
  size_t differ = 0;
  for (size_t i = 0; i < a.logits.size(); ++i) differ += std::bit_cast<uint32_t>(a.logits[i]) != std::bit_cast<uint32_t>(b.logits[i]);
  EXPECT_EQ(differ, 0u) << "of " << a.logits.size() << " logits";
  ASSERT_EQ(a.refs.size(), b.refs.size());
  for (const auto& [k, v] : a.refs) {
    const auto it = b.refs.find(k);
    ASSERT_NE(it, b.refs.end()) << k;
    ASSERT_EQ(v.size(), it->second.size()) << k;
    for (size_t i = 0; i < v.size(); ++i) EXPECT_EQ(bits(v[i]), bits(it->second[i])) << k << " [" << i << "]";
  }
}

// A trained tiny run evaluated on the CPU and on cuda-emulated: the same
// batch losses, loss, token count, logits and per-layer references (weight
// amaxes frozen at load, calibrated activation amaxes) for a plain policy
// and quantized recipes under current and calibrated:N, from the checkpoint
// and from the weights in memory.
TEST(EvalDevice, EmulatedDeviceGivesTheCpuBits) {
  TempDir d;
  const auto cfg = tiny();
  train::TrainHooks h;
  h.out = nullptr;
  h.keep_params = true;
  const auto res = train::train_new(cfg, d.path(), h, {});
  ASSERT_EQ(res.status, train::TrainStatus::completed);
  struct Case {
    const char* recipe;
    const char* policy;
  };
  for (const Case c : {Case{"fp32", "current"}, Case{"bf16", "current"}, Case{"nvfp4-no-rht-all", "current"},
                       Case{"nvfp4-no-rht-all", "calibrated:4"}, Case{"nvfp4-no-rht-all", "replay:2"},
                       Case{"te-nvfp4", "calibrated:3"}, Case{"ue5m3-b16", "calibrated:4"},
                       Case{"nvfp4-row-scaled", "calibrated:3"}}) {
    SCOPED_TRACE(std::string(c.recipe) + " " + c.policy);
    const auto recipe = sim::quant::load_recipe(c.recipe);
    const ActPolicy p = parse_act_policy(c.policy);
    const DeviceEval cpu = eval_on(cfg, "cpu", res, recipe, p, true);
    ASSERT_FALSE(cpu.res.batch_losses.empty());
    EXPECT_TRUE(std::isfinite(cpu.res.loss));
    expect_same_bits(cpu, eval_on(cfg, "cuda-emulated", res, recipe, p, true));
  }
  // weights from memory (set_params) rather than a checkpoint
  const ActPolicy cal = parse_act_policy("calibrated:4");
  const DeviceEval a = eval_on(cfg, "cpu", res, nvfp4(), cal, false);
  expect_same_bits(a, eval_on(cfg, "cuda-emulated", res, nvfp4(), cal, false));
  // the calibrated references are really measured (not the cold zero)
  size_t frozen = 0;
  for (const auto& [k, v] : a.refs) frozen += k.ends_with("/fprop-x") && v.size() > 2 && v[2] > 0;
  EXPECT_GT(frozen, 0u);
}

// The in-training hook of a run trained on cuda-emulated reads the device
// model's weights through a host copy and evaluates on the device: its
// /eval rows are the CPU run's.
TEST(EvalDevice, InTrainingHookOnEmulatedDeviceGivesTheCpuRows) {
  std::vector<std::vector<double>> rows[2];
  const char* groups[] = {"/eval/loss", "/eval/fp32/current/loss", "/eval/nvfp4-no-rht-all/current/loss",
                          "/eval/nvfp4-no-rht-all/calibrated:4/loss"};
  for (int i = 0; i < 2; ++i) {
    TempDir d;
    const auto cfg = tiny({std::string("train.device=") + (i ? "cuda-emulated" : "cpu")});
    train::TrainHooks h;
    h.out = nullptr;
    h.after_step = make_training_eval_hook(cfg, parse_training_eval("fp32,nvfp4-no-rht-all", "current,calibrated:4"),
                                           {}, nullptr);
    const auto res = train::train_new(cfg, d.path(), h, {});
    ASSERT_EQ(res.status, train::TrainStatus::completed);
    for (const char* g : groups) rows[i].push_back(io::read_run_column(d / "run.h5", g));
  }
  for (size_t g = 0; g < std::size(groups); ++g) {
    ASSERT_EQ(rows[0][g].size(), 2u) << groups[g];
    ASSERT_EQ(rows[1][g].size(), 2u) << groups[g];
    for (size_t i = 0; i < 2; ++i) EXPECT_EQ(bits(rows[0][g][i]), bits(rows[1][g][i])) << groups[g] << " row " << i;
  }
}

}  // namespace
}  // namespace exmy::eval

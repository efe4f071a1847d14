// The training loop in process: learning on the synthetic source, bit
// identity across thread counts and across a checkpoint/resume, the stop
// flag (what SIGINT sets), NaN stops, gradient accumulation, and bad input.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "sim/data/synthetic.hpp"
#include "sim/data/token_file.hpp"
#include "sim/io/h5.hpp"
#include "sim/io/run_file.hpp"
#include "models/hf_checkpoint.hpp"
#include "sim/bf16.hpp"
#include "sim/linear.hpp"
#include "sim/parallel.hpp"
#include "sim/train/checkpoint.hpp"
#include "sim/train/trainer.hpp"
#include "tests/train/test_support.hpp"

namespace exmy::train {
namespace {

using test::expect_error;
using test::TempDir;
namespace fs = std::filesystem;

// proxy-tiny on the synthetic Markov source, small enough for milliseconds per step.
RunConfig tiny(std::vector<std::string> sets) {
  std::vector<std::string> base = {"train.steps=24",          "train.batch_size=4",   "train.seq_len=16",
                                   "train.log_interval=5",    "train.eval_interval=8", "train.eval_batches=2",
                                   "optim.lr=1e-2",           "optim.warmup_steps=3", "data.synthetic_tokens=16384",
                                   "train.threads=1"};
  base.insert(base.end(), sets.begin(), sets.end());
  return parse_run_config("", "test", base);
}

using test::bits;
using test::quiet;

void expect_same_bits(const std::vector<double>& a, const std::vector<double>& b, const char* what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(bits(a[i]), bits(b[i])) << what << " " << i;
}

void expect_same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  ASSERT_EQ(a.size(), b.size());
  size_t diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff += std::bit_cast<uint32_t>(a[i]) != std::bit_cast<uint32_t>(b[i]);
  EXPECT_EQ(diff, 0u) << "parameters differ in " << diff << " of " << a.size() << " elements";
}

TEST(Trainer, LossFallsTowardsTheSyntheticEntropyRate) {
  TempDir d;
  const RunConfig c = tiny({"train.steps=150", "train.batch_size=8", "train.seq_len=32", "train.eval_interval=0",
                            "train.eval_batches=4", "data.synthetic_tokens=65536"});
  const double H = data::MarkovSource::random(c.model.vocab_size, c.synthetic_branching, c.synthetic_seed).entropy_rate();
  const TrainResult r = train_new(c, d / "run", quiet(), {});
  ASSERT_EQ(r.status, TrainStatus::completed);
  ASSERT_EQ(r.losses.size(), 150u);
  // From about ln(64) = 4.16 at the start to within 0.15 nats of the floor;
  // the validation loss cannot beat the entropy rate by more than noise.
  EXPECT_GT(r.losses.front(), H + 2.5);
  EXPECT_LT(r.last_val_loss, H + 0.15) << "entropy rate " << H;
  EXPECT_GT(r.last_val_loss, H - 0.1) << "entropy rate " << H;
  const auto rows = io::read_run_column(d / "run/run.h5", "/train/step");
  EXPECT_EQ(rows.front(), 1);
  EXPECT_EQ(rows.back(), 150);
  EXPECT_EQ(io::read_run_column(d / "run/run.h5", "/eval/loss").back(), r.last_val_loss);
}

void thread_identity(const std::string& precision) {
  const int64_t saved = sim::parallel_min_work();
  sim::parallel_min_work() = 0;  // every loop threaded, so two threads really split the work
  TempDir d;
  const TrainResult one = train_new(tiny({"train.threads=1", "train.precision=" + precision}), d / "a", quiet(), {});
  const TrainResult two = train_new(tiny({"train.threads=2", "train.precision=" + precision}), d / "b", quiet(), {});
  sim::parallel_min_work() = saved;
  expect_same_bits(one.losses, two.losses, "loss");
  expect_same_bits(one.val_losses, two.val_losses, "val loss");
  expect_same_bits(one.params, two.params);
  EXPECT_GT(one.losses.size(), 0u);
}

TEST(Trainer, BitIdenticalWithOneOrTwoThreadsFp32) { thread_identity("fp32"); }
TEST(Trainer, BitIdenticalWithOneOrTwoThreadsBf16) { thread_identity("bf16"); }

TEST(Trainer, ResumeContinuesBitIdentically) {
  TempDir d;
  const std::vector<std::string> sets = {"train.grad_accum=2", "train.checkpoint_interval=10"};
  const TrainResult full = train_new(tiny(sets), d / "full", quiet(), {});
  ASSERT_EQ(full.status, TrainStatus::completed);

  // The same run stopped by the flag a signal handler would raise, after
  // step 13 (between checkpoints and log rows), then resumed.
  std::atomic<int> stop{0};
  TrainHooks h = quiet();
  h.stop = &stop;
  h.before_step = [&](int64_t s, models::NemotronH<float>&) {
    if (s == 12) stop = SIGINT;
  };
  const TrainResult first = train_new(tiny(sets), d / "cut", h, {});
  ASSERT_EQ(first.status, TrainStatus::interrupted);
  EXPECT_EQ(first.step, 13);
  EXPECT_TRUE(fs::exists(d / "cut/checkpoints/step_00000013.h5"));
  const TrainResult rest = train_resume(d / "cut", std::nullopt, {}, quiet(), {});
  ASSERT_EQ(rest.status, TrainStatus::completed);
  EXPECT_EQ(rest.step, 24);

  std::vector<double> joined = first.losses;
  joined.insert(joined.end(), rest.losses.begin(), rest.losses.end());
  expect_same_bits(joined, full.losses, "loss");
  expect_same_bits(rest.params, full.params);
  // The run file of the resumed run holds the same rows as the
  // uninterrupted one: rows after the checkpoint were cut, then rewritten.
  for (const char* ds : {"/train/step", "/train/loss", "/train/lr", "/train/grad_norm", "/eval/step", "/eval/loss"})
    expect_same_bits(io::read_run_column(d / "cut/run.h5", ds), io::read_run_column(d / "full/run.h5", ds), ds);
  EXPECT_EQ(io::read_run_attribute(d / "cut/run.h5", "resumed_at_steps"), std::string("13"));
  // keep_checkpoints = 2: the newest two remain.
  EXPECT_EQ(list_checkpoints(d / "cut/checkpoints").size(), 2u);

  // Extending a finished run: --steps 30 continues from step 24 with a
  // schedule stretched to 30 steps.
  const TrainResult more = train_resume(d / "cut", 30, {}, quiet(), {});
  EXPECT_EQ(more.step, 30);
  EXPECT_EQ(more.losses.size(), 6u);
  // Resuming a finished run does nothing and leaves its files alone.
  const TrainResult again = train_resume(d / "cut", std::nullopt, {}, quiet(), {});
  EXPECT_EQ(again.status, TrainStatus::completed);
  EXPECT_EQ(again.step, 30);
  EXPECT_TRUE(again.losses.empty());
  EXPECT_EQ(io::read_run_attribute(d / "cut/run.h5", "resumed_at_steps"), std::string("13,24"));
}

// The /params of a checkpoint (the FP32 master weights), as an arena.
std::vector<float> checkpoint_params(const RunConfig& c, const std::string& path) {
  auto f = sim::make_linear_factory<float>("fp32");
  models::NemotronH<float> m(c.model, *f);
  sim::AdamW opt(m.arena().layout(), c.adamw);
  TrainState st;
  load_checkpoint(path, m, opt, st);
  return {m.arena().params().begin(), m.arena().params().end()};
}

// train.working_weights = bf16: the weights the model reads are the FP32
// master weights rounded to BF16, renewed after every step. Each step's
// checkpoint holds the master (/params); the arena the step's hook sees is
// its rounding, bit for bit, and the master itself is not BF16. Step 1
// reads the rounded initialization: its loss is that of an FP32 run whose
// initial weights were rounded, and step 2 is not (that run's optimizer
// updated the rounded weights, this one the master). A run cut by a signal
// and resumed from its checkpoint (the master) continues the uninterrupted
// run's bits. A checkpoint of an FP32 run (what every older checkpoint is)
// resumes with BF16 working weights only with --allow-changes, and then
// reads its weights as the master.
TEST(Trainer, Bf16WorkingWeightsAreTheRoundedMasterAndResumeBitIdentically) {
  TempDir d;
  const std::vector<std::string> sets = {"train.working_weights=bf16", "train.grad_accum=2", "train.steps=12",
                                         "train.checkpoint_interval=1", "train.keep_checkpoints=100"};
  const RunConfig c = tiny(sets);
  std::vector<std::vector<float>> working;  // the arena after each step
  TrainHooks h = quiet();
  h.after_step = [&](int64_t, models::NemotronH<float>& m, io::RunFile&) {
    const auto p = m.arena().params();
    working.emplace_back(p.begin(), p.end());
  };
  const TrainResult full = train_new(c, d / "full", h, {});
  ASSERT_EQ(full.status, TrainStatus::completed);
  ASSERT_EQ(working.size(), 12u);
  size_t below_bf16 = 0;
  for (int64_t s = 1; s <= 12; ++s) {
    const auto master = checkpoint_params(c, d / ("full/checkpoints/" + checkpoint_name(s)));
    const auto& w = working[static_cast<size_t>(s - 1)];
    ASSERT_EQ(master.size(), w.size());
    for (size_t i = 0; i < w.size(); ++i) {
      ASSERT_EQ(std::bit_cast<uint32_t>(w[i]), std::bit_cast<uint32_t>(sim::round_bf16_hd(master[i])))
          << "step " << s << ", element " << i;
      below_bf16 += w[i] != master[i];
    }
  }
  EXPECT_GT(below_bf16, 0u);
  expect_same_bits(full.params, working.back());

  const std::vector<std::string> plain = {"train.grad_accum=2", "train.steps=12"};
  TrainHooks r = quiet();
  r.before_step = [](int64_t s, models::NemotronH<float>& m) {
    if (s == 0)
      for (float& x : m.arena().params()) x = sim::round_bf16_hd(x);
  };
  const TrainResult rounded_init = train_new(tiny(plain), d / "rounded", r, {});
  const TrainResult fp32 = train_new(tiny(plain), d / "fp32", quiet(), {});
  EXPECT_EQ(bits(rounded_init.losses[0]), bits(full.losses[0]));
  EXPECT_NE(bits(fp32.losses[0]), bits(full.losses[0]));
  EXPECT_NE(bits(rounded_init.losses[1]), bits(full.losses[1]));

  std::atomic<int> stop{0};
  TrainHooks cut = quiet();
  cut.stop = &stop;
  cut.before_step = [&](int64_t s, models::NemotronH<float>&) {
    if (s == 6) stop = SIGINT;
  };
  const TrainResult first = train_new(c, d / "cut", cut, {});
  ASSERT_EQ(first.status, TrainStatus::interrupted);
  EXPECT_EQ(first.step, 7);
  const TrainResult rest = train_resume(d / "cut", std::nullopt, {}, quiet(), {});
  ASSERT_EQ(rest.status, TrainStatus::completed);
  std::vector<double> joined = first.losses;
  joined.insert(joined.end(), rest.losses.begin(), rest.losses.end());
  expect_same_bits(joined, full.losses, "loss");
  expect_same_bits(rest.params, full.params);
  for (const char* ds : {"/train/param_norm", "/train/grad_norm", "/eval/loss"})
    expect_same_bits(io::read_run_column(d / "cut/run.h5", ds), io::read_run_column(d / "full/run.h5", ds), ds);

  expect_error([&] { train_resume(d / "fp32", 14, {"train.working_weights=bf16"}, quiet(), {}); },
               "train.working_weights fp32 -> bf16");
  const TrainResult changed = train_resume(d / "fp32", 14, {"train.working_weights=bf16"}, quiet(), {}, true);
  ASSERT_EQ(changed.status, TrainStatus::completed);
  for (const float x : changed.params) ASSERT_EQ(std::bit_cast<uint32_t>(x) & 0xffffu, 0u);
  const auto master = checkpoint_params(c, d / ("fp32/checkpoints/" + checkpoint_name(14)));
  for (size_t i = 0; i < master.size(); ++i)
    ASSERT_EQ(std::bit_cast<uint32_t>(changed.params[i]), std::bit_cast<uint32_t>(sim::round_bf16_hd(master[i])));
}

// The final-window train loss is the mean of the last max(1, round(steps/10))
// steps' losses (here 3 of 30), of every step, not of the logged rows; its
// steps survive a checkpoint: a run cut inside the window and resumed gives
// the same figure bit for bit.
TEST(Trainer, FinalWindowLossCoversEveryStepAcrossAResume) {
  TempDir d;
  const std::vector<std::string> sets = {"train.steps=30", "train.log_interval=7", "train.checkpoint_interval=0"};
  const TrainResult full = train_new(tiny(sets), d / "full", quiet(), {});
  ASSERT_EQ(full.status, TrainStatus::completed);
  ASSERT_EQ(full.losses.size(), 30u);
  EXPECT_EQ(full.final_window_steps, 3);
  const double expect = (full.losses[27] + full.losses[28] + full.losses[29]) / 3.0;
  EXPECT_EQ(bits(full.final_window_loss), bits(expect));
  // Every step's loss is in the run file, not only the logged rows.
  expect_same_bits(io::read_run_column(d / "full/run.h5", "/step_loss/loss"), full.losses, "/step_loss/loss");
  const auto steps = io::read_run_column(d / "full/run.h5", "/step_loss/step");
  ASSERT_EQ(steps.size(), 30u);
  for (size_t i = 0; i < steps.size(); ++i) EXPECT_EQ(steps[i], static_cast<double>(i + 1));
  EXPECT_EQ(io::read_run_column(d / "full/run.h5", "/train/loss").size(), 6u);  // 1, 7, 14, 21, 28, 30

  // Cut after step 28, inside the window (28, 29, 30), and resumed.
  std::atomic<int> stop{0};
  TrainHooks h = quiet();
  h.stop = &stop;
  h.before_step = [&](int64_t s, models::NemotronH<float>&) {
    if (s == 27) stop = SIGINT;  // the step in progress (28) finishes
  };
  const TrainResult first = train_new(tiny(sets), d / "cut", h, {});
  ASSERT_EQ(first.step, 28);
  const TrainResult rest = train_resume(d / "cut", std::nullopt, {}, quiet(), {});
  ASSERT_EQ(rest.losses.size(), 2u);
  EXPECT_EQ(rest.final_window_steps, 3);
  EXPECT_EQ(bits(rest.final_window_loss), bits(expect));
  expect_same_bits(io::read_run_column(d / "cut/run.h5", "/step_loss/loss"), full.losses, "/step_loss/loss");
}

TEST(Trainer, NonFiniteLossStopsWithACheckpointOfTheLastGoodStep) {
  TempDir d;
  // A learning rate no model survives, without clipping: the weights blow
  // up until the loss overflows.
  const RunConfig c = tiny({"optim.lr=1e6", "optim.grad_clip=0", "optim.schedule=constant", "optim.warmup_steps=0",
                            "optim.weight_decay=0", "train.steps=50"});
  const TrainResult r = train_new(c, d / "run", quiet(), {});
  ASSERT_EQ(r.status, TrainStatus::diverged);
  EXPECT_LT(r.step, 50);
  EXPECT_NE(r.message.find("at step " + std::to_string(r.step + 1)), std::string::npos) << r.message;
  EXPECT_NE(r.message.find(checkpoint_name(r.step)), std::string::npos) << r.message;
  EXPECT_EQ(r.message.find('\n'), std::string::npos);
  // The checkpoint holds the weights before the failing step: all finite.
  auto f = sim::make_linear_factory<float>("fp32");
  models::NemotronH<float> m(c.model, *f);
  sim::AdamW opt(m.arena().layout(), c.adamw);
  TrainState st;
  load_checkpoint(d / ("run/checkpoints/" + checkpoint_name(r.step)), m, opt, st);
  EXPECT_EQ(st.step, r.step);
  for (float x : m.arena().params()) ASSERT_TRUE(std::isfinite(x));
}

TEST(Trainer, GradientAccumulationAveragesMicroBatches) {
  // 2 x 4 sequences accumulated and 8 sequences at once see the same data
  // and the same mean gradient; only the order of the sums differs.
  TempDir d;
  const TrainResult a = train_new(tiny({"train.batch_size=8", "train.steps=6"}), d / "a", quiet(), {});
  const TrainResult b = train_new(tiny({"train.batch_size=4", "train.grad_accum=2", "train.steps=6"}), d / "b", quiet(), {});
  ASSERT_EQ(a.losses.size(), b.losses.size());
  for (size_t i = 0; i < a.losses.size(); ++i) EXPECT_NEAR(a.losses[i], b.losses[i], 2e-5 * a.losses[i]) << i;
}

TEST(Trainer, Bf16StaysCloseToFp32) {
  TempDir d;
  const TrainResult a = train_new(tiny({"train.steps=10"}), d / "a", quiet(), {});
  const TrainResult b = train_new(tiny({"train.steps=10", "train.precision=bf16"}), d / "b", quiet(), {});
  EXPECT_NE(bits(a.losses.back()), bits(b.losses.back()));  // BF16 really rounds
  for (size_t i = 0; i < a.losses.size(); ++i) EXPECT_NEAR(a.losses[i], b.losses[i], 0.05) << i;
}

TEST(Trainer, AfterStepHookAppendsRowsToTheRunFile) {
  // The extension point for per-step statistics: a group with its own `step`.
  TempDir d;
  TrainHooks h = quiet();
  h.after_step = [](int64_t step, models::NemotronH<float>& m, io::RunFile& run) {
    const std::vector<float> norms = {m.arena().params()[0], static_cast<float>(step)};
    run.append("/stats/step", step);
    run.append("/stats/row", std::span<const float>(norms));
  };
  const TrainResult r = train_new(tiny({"train.steps=6"}), d / "run", h, {});
  ASSERT_EQ(r.status, TrainStatus::completed);
  EXPECT_EQ(io::read_run_column(d / "run/run.h5", "/stats/step"), (std::vector<double>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(io::read_run_column(d / "run/run.h5", "/stats/row").size(), 12u);
}

TEST(Trainer, HandsOverToAndStartsFromHfCheckpoints) {
  TempDir d;
  const TrainResult a = train_new(tiny({"train.steps=30", "train.export_hf=fp32"}), d / "a", quiet(), {});
  ASSERT_TRUE(fs::exists(d / "a/hf/config.json"));
  ASSERT_TRUE(fs::exists(d / "a/hf/model.safetensors"));
  // A new run from the exported weights starts where the first one ended,
  // far below a fresh initialization.
  const TrainResult b = train_new(tiny({"train.steps=2", "train.init_from=" + (d / "a/hf")}), d / "b", quiet(), {});
  const TrainResult fresh = train_new(tiny({"train.steps=2"}), d / "c", quiet(), {});
  EXPECT_LT(b.losses.front(), fresh.losses.front() - 1.0);
  EXPECT_NEAR(b.losses.front(), a.losses.back(), 0.3);
  expect_error([&] { train_new(tiny({"train.init_from=" + (d / "none")}), d / "e", quiet(), {}); }, "none");
  expect_error([] { parse_run_config("", "f", {"train.export_hf=fp16"}); }, "train.export_hf");
}

// With BF16 working weights an FP32 HF export holds the master weights
// (the final checkpoint's /params), so a run started from it has the same
// master and working weights; a BF16 export holds the working weights (the
// master's rounding), which the run's final arena is.
TEST(Trainer, Bf16WorkingWeightsExportTheMasterOrTheWorkingWeights) {
  TempDir d;
  const auto sets = [](const char* dtype) {
    return tiny({"train.steps=6", "train.working_weights=bf16", std::string("train.export_hf=") + dtype});
  };
  const TrainResult a = train_new(sets("fp32"), d / "fp32", quiet(), {});
  const TrainResult b = train_new(sets("bf16"), d / "bf16", quiet(), {});
  ASSERT_EQ(a.status, TrainStatus::completed);
  expect_same_bits(a.params, b.params);  // the export changes nothing of the run
  auto f = sim::make_linear_factory<float>("fp32");
  models::NemotronH<float> m(sets("fp32").model, *f);
  models::load_hf_weights(m, d / "fp32/hf");
  const std::vector<float> exported(m.arena().params().begin(), m.arena().params().end());
  const auto master = checkpoint_params(sets("fp32"), d / ("fp32/checkpoints/" + checkpoint_name(6)));
  expect_same_bits(exported, master);
  size_t below_bf16 = 0;
  for (size_t i = 0; i < master.size(); ++i) below_bf16 += master[i] != a.params[i];
  EXPECT_GT(below_bf16, 0u);
  models::load_hf_weights(m, d / "bf16/hf");
  expect_same_bits(std::vector<float>(m.arena().params().begin(), m.arena().params().end()), b.params);
}

TEST(Trainer, BadInputIsAOneLineError) {
  TempDir d;
  expect_error([&] { train_new(tiny({"data.path=" + (d / "none.tok")}), d / "r1", quiet(), {}); }, "does not exist");
  expect_error([&] { train_new(tiny({"data.path=" + (d / "none"), "data.prepare_from=" + (d / "no-text")}), d / "r2", quiet(), {}); },
               "data.prepare_from");
  expect_error([&] { train_new(tiny({"train.seq_len=20000"}), d / "r3", quiet(), {}); }, "too few");
  expect_error([&] { train_new(tiny({"train.batch_size=64"}), d / "r4", quiet(), {}); }, "fewer than one batch");
  // A token file for a larger vocabulary than the model's.
  data::write_flat_tokens(d / "big.tok", std::vector<int32_t>(5000, 100), 200);
  expect_error([&] { train_new(tiny({"data.path=" + (d / "big.tok")}), d / "r5", quiet(), {}); }, "model.vocab_size");
  // A second run into the same directory, and resuming what is not a run.
  train_new(tiny({"train.steps=4"}), d / "r6", quiet(), {});
  expect_error([&] { train_new(tiny({"train.steps=4"}), d / "r6", quiet(), {}); }, "already holds a run");
  expect_error([&] { train_resume(d / "nowhere", std::nullopt, {}, quiet(), {}); }, "no run to resume");
  // A corrupt newest checkpoint.
  {
    std::ofstream(d / "r6/checkpoints/step_00000004.h5", std::ios::trunc) << "not hdf5";
  }
  expect_error([&] { train_resume(d / "r6", 6, {}, quiet(), {}); }, "step_00000004.h5");
  fs::remove(d / "r6/checkpoints/step_00000004.h5");
  expect_error([&] { train_resume(d / "r6", 6, {}, quiet(), {}); }, "no checkpoint to resume from");
  // A checkpoint of another model shape.
  train_new(tiny({"train.steps=4"}), d / "r7", quiet(), {});
  expect_error([&] { train_resume(d / "r7", 6, {"model.hidden_size=48"}, quiet(), {}, true); }, "has shape");
}

// --resume continues the run as it was: an override of a key that changes
// what the run computes is refused, naming every such key, unless the
// caller allows changes; the run's recorded configuration (config.ini and
// the run file's `config`) is never rewritten, and the run file lists what
// a resume changed.
TEST(Trainer, ResumeRefusesChangesOfWhatTheRunComputes) {
  TempDir d;
  train_new(tiny({"train.steps=4"}), d / "r", quiet(), {});
  auto slurp = [](const std::string& p) {
    std::ifstream f(p, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  };
  const std::string ini = slurp(d / "r/config.ini");
  const auto recorded = io::read_run_attribute(d / "r/run.h5", "config");
  ASSERT_TRUE(recorded);
  try {
    train_resume(d / "r", 6, {"optim.lr=0.02", "model.hidden_size=48", "recipe.keep_last_bf16=1", "train.log_interval=2"},
                 quiet(), {});
    ADD_FAILURE() << "changed keys were accepted";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("optim.lr 1e-2 -> 0.02"), std::string::npos) << m;
    EXPECT_NE(m.find("model.hidden_size 32 -> 48"), std::string::npos) << m;
    EXPECT_NE(m.find("recipe.keep_last_bf16 (unset) -> 1"), std::string::npos) << m;
    EXPECT_EQ(m.find("log_interval"), std::string::npos) << m;  // allowed: not listed
    EXPECT_EQ(m.find("train.steps"), std::string::npos) << m;
    EXPECT_NE(m.find("--allow-changes"), std::string::npos) << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  }
  // Keys that leave the numbers alone may change; the run goes on.
  // (optim.lr=0.01 is the run's 1e-2 spelled otherwise: no change.)
  const TrainResult r = train_resume(d / "r", 6, {"train.log_interval=2", "train.threads=1", "optim.lr=0.01"}, quiet(), {});
  EXPECT_EQ(r.step, 6);
  EXPECT_EQ(slurp(d / "r/config.ini"), ini);
  EXPECT_EQ(io::read_run_attribute(d / "r/run.h5", "config"), recorded);
  const auto changes = io::read_run_attribute(d / "r/run.h5", "resume_changes");
  ASSERT_TRUE(changes);
  EXPECT_NE(changes->find("step 4: "), std::string::npos) << *changes;
  EXPECT_NE(changes->find("train.steps 4 -> 6"), std::string::npos) << *changes;
  EXPECT_NE(changes->find("train.log_interval"), std::string::npos) << *changes;
  // The next resume starts from what the run last trained with (6 steps,
  // from the checkpoint), not from config.ini's 4.
  const TrainResult again = train_resume(d / "r", std::nullopt, {}, quiet(), {});
  EXPECT_EQ(again.step, 6);
  EXPECT_TRUE(again.losses.empty());
  // Allowed explicitly: the learning rate changes.
  const TrainResult lr = train_resume(d / "r", 7, {"optim.lr=0.02"}, quiet(), {}, true);
  EXPECT_EQ(lr.step, 7);
}

// Checkpoint data carries checksums: one flipped bit inside a parameter's
// stored floats makes the resume fail with a one-line error, instead of
// continuing from silently different weights.
TEST(Trainer, CorruptCheckpointDataIsAnErrorNotASilentResume) {
  TempDir d;
  const RunConfig c = tiny({"train.steps=4"});
  train_new(c, d / "r", quiet(), {});
  const std::string ck = d / ("r/checkpoints/" + checkpoint_name(4));
  // The stored bytes of a parameter tensor (float32 little-endian, as loaded).
  auto f = sim::make_linear_factory<float>("fp32");
  models::NemotronH<float> m(c.model, *f);
  sim::AdamW opt(m.arena().layout(), c.adamw);
  TrainState st;
  load_checkpoint(ck, m, opt, st);
  const auto& views = m.arena().layout().views();
  const auto v = std::find_if(views.begin(), views.end(), [](const sim::ParamView& p) { return p.numel >= 64; });
  ASSERT_NE(v, views.end());
  const float* p = m.arena().params().data() + v->offset;
  const std::string needle(reinterpret_cast<const char*>(p), 64 * sizeof(float));
  std::string file;
  {
    std::ifstream in(ck, std::ios::binary);
    file.assign(std::istreambuf_iterator<char>(in), {});
  }
  const size_t at = file.find(needle);
  ASSERT_NE(at, std::string::npos) << "the bytes of " << v->name << " are not in the checkpoint";
  ASSERT_EQ(file.find(needle, at + 1), std::string::npos);
  file[at + 100] ^= 0x10;  // one bit of one float in the middle
  std::ofstream(ck, std::ios::binary | std::ios::trunc) << file;
  expect_error([&] { train_resume(d / "r", 6, {}, quiet(), {}); }, "corrupt");
}

// Checkpoints written before the checksums (contiguous datasets, HDF5's
// earliest file format) still load: read_array takes both layouts.
TEST(Trainer, ArraysWithoutChecksumsStillRead) {
  TempDir d;
  const std::string path = d / "old.h5";
  const std::vector<float> want = {1.5f, -2.0f, 3.25f, 0.0f, 7.0f, -0.5f};
  {
    io::h5::Handle f(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose);
    const hsize_t dims[2] = {2, 3};
    io::h5::Handle space(H5Screate_simple(2, dims, nullptr), H5Sclose);
    io::h5::Handle ds(H5Dcreate2(f.get(), "a", H5T_IEEE_F32LE, space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                      H5Dclose);
    ASSERT_GE(H5Dwrite(ds.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, want.data()), 0);
  }
  io::h5::Handle f(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  std::vector<float> got(6);
  io::h5::read_array(f.get(), "a", got.data(), {2, 3}, "old file");
  EXPECT_EQ(got, want);
}

}  // namespace
}  // namespace exmy::train

namespace exmy::train {
namespace {

// train.device = cuda-emulated: the device backend's code (its kernels'
// launches run on the host, its memory treated as the device's: staged
// copies for initial weights, norms, checkpoints) trains the CPU's bits —
// losses, validation losses, gradient norms, per-parameter norms and the
// final weights — with gradient accumulation, for both plain policies.
void device_identity(const std::string& precision, const std::string& working = "fp32") {
  TempDir d;
  const std::vector<std::string> sets = {"train.precision=" + precision, "train.grad_accum=2",
                                         "train.stats_interval=5", "train.working_weights=" + working};
  auto with = [&](const char* device) {
    auto s = sets;
    s.push_back(std::string("train.device=") + device);
    return tiny(s);
  };
  const TrainResult cpu = train_new(with("cpu"), d / "cpu", quiet(), {});
  const TrainResult dev = train_new(with("cuda-emulated"), d / "dev", quiet(), {});
  ASSERT_EQ(dev.status, TrainStatus::completed);
  expect_same_bits(dev.losses, cpu.losses, "loss");
  expect_same_bits(dev.val_losses, cpu.val_losses, "val loss");
  expect_same_bits(dev.params, cpu.params);
  for (const char* ds : {"/train/grad_norm", "/train/param_norm", "/train/param_grad_norm", "/eval/loss"}) {
    const auto a = io::read_run_column(d / "dev/run.h5", ds);
    EXPECT_FALSE(a.empty()) << ds;
    expect_same_bits(a, io::read_run_column(d / "cpu/run.h5", ds), ds);
  }
  EXPECT_GT(cpu.losses.front(), cpu.losses.back());
}

TEST(TrainerDevice, EmulatedDeviceTrainsTheCpuBitsFp32) { device_identity("fp32"); }
TEST(TrainerDevice, EmulatedDeviceTrainsTheCpuBitsBf16) { device_identity("bf16"); }
// BF16 working weights: the device's master in its memory, the fused
// update-and-round kernel, the rounding of the initial arena.
TEST(TrainerDevice, EmulatedDeviceTrainsTheCpuBitsBf16WorkingWeights) { device_identity("bf16", "bf16"); }

// A checkpoint written on the device resumes on the CPU and one written on
// the CPU resumes on the device, continuing the uninterrupted run's bits
// (the moments and weights go through the same checkpoint file).
TEST(TrainerDevice, CheckpointsMoveBetweenCpuAndDevice) {
  TempDir d;
  const std::vector<std::string> sets = {"train.checkpoint_interval=10"};
  const TrainResult full = train_new(tiny(sets), d / "full", quiet(), {});
  ASSERT_EQ(full.status, TrainStatus::completed);
  for (const char* first : {"cuda-emulated", "cpu"}) {
    const std::string then = std::string(first) == "cpu" ? "cuda-emulated" : "cpu";
    const std::string dir = d / (std::string("cut-") + first);
    std::atomic<int> stop{0};
    TrainHooks h = quiet();
    h.stop = &stop;
    h.before_step = [&](int64_t s, models::NemotronH<float>&) {
      if (s == 12) stop = SIGINT;
    };
    auto s = sets;
    s.push_back(std::string("train.device=") + first);
    const TrainResult a = train_new(tiny(s), dir, h, {});
    ASSERT_EQ(a.status, TrainStatus::interrupted) << first;
    const TrainResult b = train_resume(dir, std::nullopt, {"train.device=" + then}, quiet(), {});
    ASSERT_EQ(b.status, TrainStatus::completed) << first;
    std::vector<double> joined = a.losses;
    joined.insert(joined.end(), b.losses.begin(), b.losses.end());
    expect_same_bits(joined, full.losses, first);
    expect_same_bits(b.params, full.params);
  }
}

// The memory plan (model-info, and the check before a run) against what a
// device run allocates in its memory at its peak (cuda-emulated counts the
// same allocations a CUDA device gets): within 2%, with and without block
// recompute, with gradient accumulation (the step's running sum of the
// micro-batches' gradients is one more arena on the device), and with
// recipes, whose quantized linears' scratch (operands, codes, encodings,
// the backward's results, the grouped model's ranges, the statistics' rows)
// is 5-13% of these runs.
TEST(TrainerDevice, PeakDeviceMemoryIsThePlanWithinTwoPercent) {
  TempDir d;
  struct Case {
    const char* recompute;
    int accum;
    const char* recipe;
    const char* fp32_gemm;
  };
  for (const Case k : {Case{"none", 1, "fp32", "sgemm"}, Case{"blocks", 1, "fp32", "sgemm"},
                       Case{"blocks", 3, "fp32", "sgemm"}, Case{"none", 1, "te-nvfp4", "sgemm"},
                       Case{"none", 1, "ue5m3-b16", "sgemm"}, Case{"blocks", 1, "te-nvfp4", "bf16"}}) {
    const char* recompute = k.recompute;
    const int accum = k.accum;
    const RunConfig c = tiny({"model.name=proxy-10m", "train.batch_size=4", "train.seq_len=256", "train.steps=1",
                              "train.eval_batches=1", "train.eval_interval=0", "data.synthetic_tokens=65536",
                              "train.device=cuda-emulated", std::string("train.recompute=") + recompute,
                              "train.grad_accum=" + std::to_string(accum), std::string("train.recipe=") + k.recipe,
                              std::string("train.fp32_gemm=") + k.fp32_gemm});
    const std::string name = std::string(recompute) + "-" + std::to_string(accum) + "-" + k.recipe + "-" + k.fp32_gemm;
    const TrainResult r = train_new(c, d / name, quiet(), {});
    ASSERT_EQ(r.status, TrainStatus::completed);
    const models::MemoryEstimate m =
        rank_training_memory(c.model, c.batch_size, c.seq_len, c.recompute == "blocks", rank_plan(c, 1));
    EXPECT_EQ(m.grad_sums, accum > 1 ? m.grads : 0.0) << name;
    const double plan = m.total();
    const double peak = static_cast<double>(r.device_peak_bytes);
    std::printf("[%s] plan %.1f MiB, device peak %.1f MiB (%+.1f%%)\n", name.c_str(), plan / 1048576.0,
                peak / 1048576.0, 100.0 * (peak - plan) / plan);
    EXPECT_LT(std::fabs(peak - plan), 0.02 * plan) << name;
  }
}

// train.offload = optimizer: the FP32 master weights and the AdamW moments
// on the host, the device keeping the working weights and gradients, gives
// the bits of the run that keeps everything on the device (and so the
// CPU's): losses, gradient norms, per-parameter norms, weights. A run cut by
// a checkpoint resumes with the offload switched either way and continues
// the same bits (the checkpoint holds the moments and weights whichever
// memory they were in).
void offload_identity(const std::string& working) {
  TempDir d;
  const std::vector<std::string> sets = {"train.device=cuda-emulated", "train.grad_accum=2",
                                         "train.checkpoint_interval=10", "train.working_weights=" + working};
  const TrainResult on_device = train_new(tiny(sets), d / "device", quiet(), {});
  ASSERT_EQ(on_device.status, TrainStatus::completed);
  auto offloaded = sets;
  offloaded.push_back("train.offload=optimizer");
  const TrainResult off = train_new(tiny(offloaded), d / "off", quiet(), {});
  ASSERT_EQ(off.status, TrainStatus::completed);
  expect_same_bits(off.losses, on_device.losses, "loss");
  expect_same_bits(off.params, on_device.params);
  for (const char* ds : {"/train/grad_norm", "/train/param_norm", "/eval/loss"})
    expect_same_bits(io::read_run_column(d / "off/run.h5", ds), io::read_run_column(d / "device/run.h5", ds), ds);
  EXPECT_GT(off.losses.front(), off.losses.back());
  for (const bool first_offloaded : {true, false}) {
    const std::string dir = d / (first_offloaded ? "cut-off" : "cut-on");
    std::atomic<int> stop{0};
    TrainHooks h = quiet();
    h.stop = &stop;
    h.before_step = [&](int64_t s, models::NemotronH<float>&) {
      if (s == 12) stop = SIGINT;
    };
    const TrainResult a = train_new(tiny(first_offloaded ? offloaded : sets), dir, h, {});
    ASSERT_EQ(a.status, TrainStatus::interrupted);
    const TrainResult b = train_resume(
        dir, std::nullopt, {std::string("train.offload=") + (first_offloaded ? "none" : "optimizer")}, quiet(), {});
    ASSERT_EQ(b.status, TrainStatus::completed);
    std::vector<double> joined = a.losses;
    joined.insert(joined.end(), b.losses.begin(), b.losses.end());
    expect_same_bits(joined, on_device.losses, dir.c_str());
    expect_same_bits(b.params, on_device.params);
  }
}

TEST(TrainerDevice, OffloadedOptimizerTrainsTheSameBits) { offload_identity("fp32"); }
// With BF16 working weights the offloaded optimizer keeps the master on the
// host and sends the rounded chunks up; the device run keeps the master in
// its memory: the same bits (and those of the CPU, QuantTrain.EmulatedDeviceGivesTheCpuBits).
TEST(TrainerDevice, OffloadedOptimizerTrainsTheSameBitsWithBf16WorkingWeights) { offload_identity("bf16"); }

// The offloaded plan: the device's part (no AdamW moments) against the
// device run's measured peak, within 10%; the host's part is the shard's
// master weights and moments plus two staging chunks (the copies of one
// overlap the update of the other).
TEST(TrainerDevice, OffloadedPlanIsTheDevicePeakWithinTenPercent) {
  TempDir d;
  const RunConfig c = tiny({"model.name=proxy-10m", "train.batch_size=4", "train.seq_len=256", "train.steps=1",
                            "train.eval_batches=1", "train.eval_interval=0", "data.synthetic_tokens=65536",
                            "train.device=cuda-emulated", "train.recompute=blocks", "train.offload=optimizer"});
  const TrainResult r = train_new(c, d / "run", quiet(), {});
  ASSERT_EQ(r.status, TrainStatus::completed);
  RankPlan plan = rank_plan(c, 1);
  ASSERT_TRUE(plan.offload);
  const models::MemoryEstimate m = rank_training_memory(c.model, c.batch_size, c.seq_len, true, plan);
  plan.offload = false;
  const models::MemoryEstimate all = rank_training_memory(c.model, c.batch_size, c.seq_len, true, plan);
  EXPECT_EQ(m.optimizer, 0);
  EXPECT_EQ(m.total(), all.total() - all.optimizer);
  const double arena = m.params / 4;
  EXPECT_EQ(m.host_state, 12 * arena + 2 * 4 * std::min<double>(arena, static_cast<double>(sim::kOffloadChunk)));
  const double peak = static_cast<double>(r.device_peak_bytes);
  std::printf("[offload] plan %.1f MiB, device peak %.1f MiB (%+.1f%%)\n", m.total() / 1048576.0, peak / 1048576.0,
              100.0 * (peak - m.total()) / m.total());
  EXPECT_LT(std::fabs(peak - m.total()), 0.10 * m.total());
}

// train.keep_checkpoints = 0: a measuring run writes no checkpoint at all.
TEST(Trainer, KeepCheckpointsZeroWritesNone) {
  TempDir d;
  const TrainResult r = train_new(tiny({"train.steps=6", "train.checkpoint_interval=2", "train.keep_checkpoints=0"}),
                                  d / "run", quiet(), {});
  ASSERT_EQ(r.status, TrainStatus::completed);
  EXPECT_TRUE(r.checkpoint.empty());
  EXPECT_TRUE(!fs::exists(d / "run/checkpoints") || fs::is_empty(d / "run/checkpoints"));
  EXPECT_TRUE(fs::exists(d / "run/run.h5"));
}

// train.working_weights = bf16 in the plan: the optimizer's FP32 master, 4
// bytes a parameter of its shard, where the optimizer state lives: beside
// the moments in the memory the model trains in (all of it, or the largest
// shard of 3 ranks), or on the host with the offloaded state (which held a
// master already). On cuda-emulated the run allocates exactly that much
// more at its peak than the FP32 run.
TEST(TrainerDevice, Bf16WorkingWeightsPlanTheMasterWhereTheOptimizerStateLives) {
  const RunConfig c = tiny({"train.working_weights=bf16", "train.device=cuda-emulated"});
  for (const int ranks : {1, 3}) {
    RankPlan plan = rank_plan(c, ranks);
    ASSERT_TRUE(plan.bf16_weights);
    const models::MemoryEstimate m = rank_training_memory(c.model, c.batch_size, c.seq_len, false, plan);
    plan.bf16_weights = false;
    const models::MemoryEstimate fp32 = rank_training_memory(c.model, c.batch_size, c.seq_len, false, plan);
    const double shard =
        ranks == 1 ? m.params / 4 : static_cast<double>(sim::largest_shard(models::make_layout(c.model), ranks));
    EXPECT_EQ(m.master, 4 * shard) << ranks;
    EXPECT_EQ(m.master, m.optimizer / 2) << ranks;
    EXPECT_EQ(m.total(), fp32.total() + m.master) << ranks;
    plan.offload = true;
    const models::MemoryEstimate off_fp32 = rank_training_memory(c.model, c.batch_size, c.seq_len, false, plan);
    plan.bf16_weights = true;
    const models::MemoryEstimate off = rank_training_memory(c.model, c.batch_size, c.seq_len, false, plan);
    EXPECT_EQ(off.master, 0) << ranks;
    EXPECT_EQ(off.total(), off_fp32.total()) << ranks;
    // one more staging chunk: the rounded weights wait there until they have gone up
    EXPECT_EQ(off.host_state, off_fp32.host_state + 4 * std::min<double>(shard, static_cast<double>(sim::kOffloadChunk)))
        << ranks;
  }
  TempDir d;
  const TrainResult bf = train_new(tiny({"train.working_weights=bf16", "train.device=cuda-emulated", "train.steps=2"}),
                                   d / "bf16", quiet(), {});
  const TrainResult fp = train_new(tiny({"train.device=cuda-emulated", "train.steps=2"}), d / "fp32", quiet(), {});
  ASSERT_EQ(bf.status, TrainStatus::completed);
  const models::MemoryEstimate m = rank_training_memory(c.model, c.batch_size, c.seq_len, false, rank_plan(c, 1));
  EXPECT_EQ(static_cast<double>(bf.device_peak_bytes - fp.device_peak_bytes), m.master);
}

// A device error in the middle of a run (what DeviceLaunch throws for a
// failed kernel, raised here from the step hook) ends the run with that
// one-line error; the newest checkpoint is intact and --resume continues
// with the uninterrupted run's bits.
TEST(TrainerDevice, ADeviceErrorKeepsTheCheckpointAndTheRunResumes) {
  TempDir d;
  const std::vector<std::string> sets = {"train.checkpoint_interval=10", "train.device=cuda-emulated"};
  const TrainResult full = train_new(tiny(sets), d / "full", quiet(), {});
  ASSERT_EQ(full.status, TrainStatus::completed);
  TrainHooks h = quiet();
  h.before_step = [](int64_t s, models::NemotronH<float>&) {
    if (s == 14) throw Error("CUDA error in kernel rmsnorm_forward rstd: an illegal memory access was encountered");
  };
  expect_error([&] { train_new(tiny(sets), d / "cut", h, {}); }, "CUDA error in kernel rmsnorm_forward rstd");
  EXPECT_TRUE(fs::exists(d / "cut/checkpoints/step_00000010.h5"));
  const TrainResult rest = train_resume(d / "cut", std::nullopt, {}, quiet(), {});
  ASSERT_EQ(rest.status, TrainStatus::completed);
  EXPECT_EQ(rest.step, 24);
  expect_same_bits(rest.params, full.params);
  const auto a = io::read_run_column(d / "cut/run.h5", "/train/loss"), b = io::read_run_column(d / "full/run.h5", "/train/loss");
  expect_same_bits(a, b, "logged loss");
}

}  // namespace
}  // namespace exmy::train

// Quantized training through the trainer: the recipe in the configuration,
// tensor references across a checkpoint/resume (bit identity, and the cold
// restart), statistics rows in the run file, and the captured operands
// replayed with exmy::quantize (every recorded statistic bit for bit).
#include <gtest/gtest.h>

#include <cstring>

#include <bit>
#include <cmath>
#include <filesystem>

#include "formats/spec.hpp"
#include "formats/vocab.hpp"
#include "sim/io/h5.hpp"
#include "sim/io/run_file.hpp"
#include "sim/quant/stats.hpp"
#include "sim/train/checkpoint.hpp"
#include "sim/train/quant_io.hpp"
#include "sim/train/trainer.hpp"
#include "tests/train/test_support.hpp"

namespace exmy::train {
namespace {

using test::expect_error;
using test::TempDir;
namespace fs = std::filesystem;
namespace q = sim::quant;

// proxy-tiny on the synthetic source, 2 micro-batches of 2 x 16 tokens
// (K = 32 tokens for wgrad): milliseconds per step even with the grouped
// GEMM model and statistics at every step.
RunConfig quant_tiny(std::vector<std::string> sets) {
  std::vector<std::string> base = {"train.steps=16",        "train.batch_size=2",    "train.seq_len=16",
                                   "train.grad_accum=2",    "train.log_interval=4",  "train.eval_interval=6",
                                   "train.eval_batches=1",  "optim.lr=1e-2",         "optim.warmup_steps=2",
                                   "data.synthetic_tokens=8192", "train.threads=1"};
  base.insert(base.end(), sets.begin(), sets.end());
  return parse_run_config("", "test", base);
}

using test::bits;
using test::quiet;

// Columns whose values are wall-clock measurements.
bool timing(const std::string& ds) { return ds == "/train/tokens_per_s" || ds == "/train/elapsed_s"; }

TEST(QuantTrain, RecipeInTheConfiguration) {
  const RunConfig a = quant_tiny({"train.recipe=ue5m3-b16", "recipe.keep_last_bf16=2", "recipe.all.round=rtz"});
  EXPECT_EQ(a.recipe.name, "ue5m3-b16");
  EXPECT_EQ(a.recipe.keep_last_bf16, sim::quant::BlockCount{2});
  // The resolved text lists the overrides; reading it back gives the same recipe.
  const std::string text = a.text();
  EXPECT_NE(text.find("recipe = ue5m3-b16"), std::string::npos) << text;
  EXPECT_NE(text.find("\n[recipe]\nkeep_last_bf16 = 2\nall.round = rtz\n"), std::string::npos) << text;
  const RunConfig b = parse_run_config(text, "resolved", {});
  EXPECT_EQ(q::recipe_to_ini(a.recipe), q::recipe_to_ini(b.recipe));
  // An INI [recipe] section may repeat a key: the overrides apply in order.
  const RunConfig c = parse_run_config("[train]\nrecipe = te-nvfp4\n[recipe]\nkeep_last_bf16 = 1\nkeep_last_bf16 = 3\n",
                                       "c.ini", {});
  EXPECT_EQ(c.recipe.keep_last_bf16, sim::quant::BlockCount{3});
  // precision = bf16 runs the linears the recipe leaves unquantized in BF16.
  EXPECT_EQ(quant_tiny({}).recipe.unquantized, "fp32");
  EXPECT_EQ(quant_tiny({"train.precision=bf16"}).recipe.unquantized, "bf16");
  // Bad recipes: one line naming the key.
  expect_error([] { quant_tiny({"train.recipe=no-such-recipe"}); }, "train.recipe: unknown recipe 'no-such-recipe'");
  expect_error([] { quant_tiny({"train.recipe=te-nvfp4", "recipe.all.round=sometimes"}); }, "recipe.all.round");
  expect_error([] { quant_tiny({"recipe.gemm.bogus=1"}); }, "bogus");
  expect_error([] { parse_run_config("[recipe]\nall.elem = e9m9x\n", "d.ini", {}); }, "all.elem");
  expect_error([] { quant_tiny({"train.stats_interval=-1"}); }, "train.stats_interval");
  expect_error([] { quant_tiny({"train.cold_restart_references=maybe"}); }, "train.cold_restart_references");
}

// Every dataset of a run file, as doubles (counts are exact below 2^53).
std::map<std::string, std::vector<double>> all_columns(const std::string& file) {
  std::map<std::string, std::vector<double>> m;
  for (const auto& ds : io::list_run_datasets(file))
    if (!ds.starts_with("/capture/") && !timing(ds)) m[ds] = io::read_run_column(file, ds);
  return m;
}

// Activation recompute per block changes no bit: losses, weights and every
// row of the run file (statistics at every step, periodic references, a
// capture, two micro-batches) are those of the run that keeps everything,
// for fp32, bf16 and quantized recipes under both GEMM output models.
TEST(QuantTrain, BlockRecomputeGivesTheSameBits) {
  TempDir d;
  for (const std::vector<std::string>& sets :
       std::vector<std::vector<std::string>>{{"train.precision=fp32"},
                                             {"train.precision=bf16"},
                                             {"train.recipe=ue5m3-b16", "train.stats_interval=1", "train.capture_step=3"},
                                             {"train.recipe=te-nvfp4", "recipe.keep_last_bf16=0", "train.stats_interval=2"},
                                             {"train.recipe=mxfp4", "recipe.gemm.model=grouped"}}) {
    std::string label;
    for (const auto& s : sets) label += s + " ";
    SCOPED_TRACE(label);
    std::vector<std::string> steps = sets;
    steps.push_back("train.steps=6");
    const TrainResult keep = train_new(quant_tiny(steps), d / "keep", quiet(), {}, true);
    steps.push_back("train.recompute=blocks");
    const TrainResult again = train_new(quant_tiny(steps), d / "again", quiet(), {}, true);
    ASSERT_EQ(keep.losses.size(), again.losses.size());
    for (size_t i = 0; i < keep.losses.size(); ++i) EXPECT_EQ(bits(keep.losses[i]), bits(again.losses[i])) << i;
    ASSERT_EQ(keep.params.size(), again.params.size());
    EXPECT_EQ(0, std::memcmp(keep.params.data(), again.params.data(), keep.params.size() * sizeof(float)));
    const auto a = all_columns(d / "keep/run.h5"), b = all_columns(d / "again/run.h5");
    ASSERT_EQ(a.size(), b.size());
    for (const auto& [name, col] : a) {
      ASSERT_TRUE(b.count(name)) << name;
      ASSERT_EQ(col.size(), b.at(name).size()) << name;  // no statistics row recorded twice
      for (size_t i = 0; i < col.size(); ++i) ASSERT_EQ(bits(col[i]), bits(b.at(name)[i])) << name << " row " << i;
    }
  }
}

// train.device = cuda-emulated: the recipes' quantized linears through the
// device's ops (the device quantizer, transpose, BF16 rounding and add with
// their threads run on the host; the statistics reduced by the device's
// kernels, sim/quant/device_stats.hpp; staged copies for capture)
// give the CPU's bits: losses, weights and every row of the run file —
// statistics at every step, current, periodic and held references, the RHT,
// stochastic rounding, both GEMM output models, two micro-batches, block
// recompute, and row outer scales (nvfp4-row-scaled: current row
// references, held ones row by row on wgrad-x, the grouped model's per-row
// alphas from row scales staged in the device's memory).
TEST(QuantTrain, EmulatedDeviceGivesTheCpuBits) {
  TempDir d;
  for (const std::vector<std::string>& sets : std::vector<std::vector<std::string>>{
           {"train.recipe=te-nvfp4", "train.stats_interval=1", "train.capture_step=3", "train.grad_accum=2"},
           {"train.recipe=ue5m3-b16-fp32gemm", "train.stats_interval=2", "train.precision=bf16"},
           {"train.recipe=mxfp4", "train.stats_interval=3", "train.recompute=blocks"},
           {"train.recipe=ue5m3-b16", "train.stats_interval=1", "train.grad_accum=2"},
           {"train.recipe=nvfp4-no-rht-all-grouped", "train.stats_interval=2"},
           {"train.recipe=nvfp4-row-scaled", "train.stats_interval=1", "train.grad_accum=2"},
           {"train.recipe=nvfp4-row-scaled", "recipe.gemm.model=grouped", "recipe.wgrad-x.reference=periodic:3",
            "train.stats_interval=2", "train.recompute=blocks"},
           // BF16 working weights: the device's fused update and rounding
           // (the master in its memory) give the CPU's bits, the recipes
           // quantizing BF16 weights
           {"train.recipe=ue5m3-b16", "train.working_weights=bf16", "train.stats_interval=2", "train.grad_accum=2"},
           {"train.recipe=te-nvfp4", "train.precision=bf16", "train.working_weights=bf16", "train.stats_interval=3"},
           // the fp32 model in BF16 (the encoded operands, the tensor
           // scales applied to the result; row scales by the epilogue)
           {"train.recipe=te-nvfp4", "train.fp32_gemm=bf16", "train.stats_interval=1", "train.grad_accum=2"},
           {"train.recipe=nvfp4-row-scaled", "train.fp32_gemm=bf16", "train.stats_interval=2",
            "train.recompute=blocks"}}) {
    std::string label;
    for (const auto& s : sets) label += s + " ";
    SCOPED_TRACE(label);
    std::vector<std::string> steps = sets;
    steps.push_back("train.steps=6");
    const TrainResult cpu = train_new(quant_tiny(steps), d / "cpu", quiet(), {}, true);
    steps.push_back("train.device=cuda-emulated");
    const TrainResult dev = train_new(quant_tiny(steps), d / "dev", quiet(), {}, true);
    ASSERT_EQ(cpu.losses.size(), dev.losses.size());
    for (size_t i = 0; i < cpu.losses.size(); ++i) EXPECT_EQ(bits(cpu.losses[i]), bits(dev.losses[i])) << i;
    ASSERT_EQ(cpu.params.size(), dev.params.size());
    EXPECT_EQ(0, std::memcmp(cpu.params.data(), dev.params.data(), cpu.params.size() * sizeof(float)));
    const auto a = all_columns(d / "cpu/run.h5"), b = all_columns(d / "dev/run.h5");
    ASSERT_EQ(a.size(), b.size());
    int quant = 0;
    for (const auto& [name, col] : a) {
      ASSERT_TRUE(b.count(name)) << name;
      ASSERT_EQ(col.size(), b.at(name).size()) << name;
      for (size_t i = 0; i < col.size(); ++i) ASSERT_EQ(bits(col[i]), bits(b.at(name)[i])) << name << " row " << i;
      quant += name.starts_with("/quant/");
    }
    EXPECT_GT(quant, 0);
  }
}

// train.fp32_gemm = bf16 runs the fp32 model's GEMMs on the encoded
// operands where bfloat16 holds them (te-nvfp4: other bits than sgemm's, the
// same run twice the same bits) and keeps sgemm where it does not (mxfp4's
// UE8M0 scales: sgemm's bits); auto is sgemm on the CPU.
TEST(QuantTrain, Fp32GemmInBf16WhereBfloat16HoldsTheOperands) {
  TempDir d;
  const auto run = [&](const char* recipe, const char* fp32_gemm, const char* dir) {
    return train_new(quant_tiny({std::string("train.recipe=") + recipe, std::string("train.fp32_gemm=") + fp32_gemm,
                           "train.steps=4"}),
                     d / dir, quiet(), {}, true);
  };
  const auto same = [](const TrainResult& a, const TrainResult& b) {
    return a.params.size() == b.params.size() &&
           std::memcmp(a.params.data(), b.params.data(), a.params.size() * sizeof(float)) == 0;
  };
  const TrainResult te_s = run("te-nvfp4", "sgemm", "te-s"), te_b = run("te-nvfp4", "bf16", "te-b");
  EXPECT_FALSE(same(te_s, te_b));
  EXPECT_TRUE(same(te_b, run("te-nvfp4", "bf16", "te-b2")));
  EXPECT_TRUE(same(te_s, run("te-nvfp4", "auto", "te-auto")));
  EXPECT_TRUE(same(run("mxfp4", "sgemm", "mx-s"), run("mxfp4", "bf16", "mx-b")));
}

TEST(QuantTrain, ResumeWithPeriodicReferencesIsBitIdentical) {
  // ue5m3-b16: periodic:50 references sampled at step 1 and held, one dY
  // reference per layer, stochastic rounding on dY, the grouped GEMM.
  // Interrupted after step 7 and resumed, the run must use the held
  // references of step 1 and give the same losses, weights and rows.
  TempDir d;
  const std::vector<std::string> sets = {"train.recipe=ue5m3-b16", "train.checkpoint_interval=5",
                                         "train.stats_interval=3"};
  const TrainResult full = train_new(quant_tiny(sets), d / "full", quiet(), {});
  ASSERT_EQ(full.status, TrainStatus::completed);

  std::atomic<int> stop{0};
  TrainHooks h = quiet();
  h.stop = &stop;
  h.before_step = [&](int64_t s, models::NemotronH<float>&) {
    if (s == 6) stop = SIGINT;
  };
  const TrainResult first = train_new(quant_tiny(sets), d / "cut", h, {});
  ASSERT_EQ(first.status, TrainStatus::interrupted);
  ASSERT_EQ(first.step, 7);
  // The checkpoint of the interruption holds each reference under /layer_state/<layer>/<slot>.
  {
    io::h5::silence_errors();
    io::h5::Handle f(H5Fopen((d / "cut/checkpoints/step_00000007.h5").c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
    ASSERT_TRUE(f.valid());
    const auto v = io::h5::read_f64_array(f.get(), "/layer_state/layers.0.mixer.in_proj/fprop-x", "checkpoint");
    ASSERT_GE(v.size(), 8u);
    EXPECT_EQ(v[1], 1.0);  // has a held value
    EXPECT_EQ(v[3], 1.0);  // sampled at step 1
    EXPECT_TRUE(io::h5::path_exists(f.get(), "/layer_state/layers.0.mixer.in_proj/dy"));  // the shared dY reference
  }

  const TrainResult rest = train_resume(d / "cut", std::nullopt, {}, quiet(), {});
  ASSERT_EQ(rest.status, TrainStatus::completed);

  std::vector<double> joined = first.losses;
  joined.insert(joined.end(), rest.losses.begin(), rest.losses.end());
  ASSERT_EQ(joined.size(), full.losses.size());
  for (size_t i = 0; i < joined.size(); ++i) EXPECT_EQ(bits(joined[i]), bits(full.losses[i])) << "loss of step " << i + 1;
  ASSERT_EQ(rest.params.size(), full.params.size());
  size_t differ = 0;
  for (size_t i = 0; i < full.params.size(); ++i)
    differ += std::bit_cast<uint32_t>(rest.params[i]) != std::bit_cast<uint32_t>(full.params[i]);
  EXPECT_EQ(differ, 0u);

  // The run files hold the same rows, statistics included.
  const auto a = all_columns(d / "full/run.h5"), b = all_columns(d / "cut/run.h5");
  ASSERT_EQ(a.size(), b.size());
  size_t quant_sets = 0;
  for (const auto& [name, col] : a) {
    ASSERT_TRUE(b.count(name)) << name;
    const auto& other = b.at(name);
    ASSERT_EQ(col.size(), other.size()) << name;
    for (size_t i = 0; i < col.size(); ++i) ASSERT_EQ(bits(col[i]), bits(other[i])) << name << " row " << i;
    quant_sets += name.starts_with("/quant/");
  }
  EXPECT_GT(quant_sets, 100u);
  // Statistics on steps 1, 3, 6, 9, 12, 15, 16, two micro-batches each.
  EXPECT_EQ(io::read_run_column(d / "full/run.h5", "/quant/layers.0.mixer.in_proj/fprop/fprop-x/step"),
            (std::vector<double>{1, 1, 3, 3, 6, 6, 9, 9, 12, 12, 15, 15, 16, 16}));

  // The reference implementation's cold restart: references sampled again
  // at the first step after the resume, so the run leaves the
  // uninterrupted one there.
  stop = 0;
  const TrainResult cold_first = train_new(quant_tiny(sets), d / "cold", h, {});
  ASSERT_EQ(cold_first.step, 7);
  const TrainResult cold =
      train_resume(d / "cold", std::nullopt, {"train.cold_restart_references=true"}, quiet(), {});
  ASSERT_EQ(cold.status, TrainStatus::completed);
  ASSERT_EQ(cold.losses.size(), rest.losses.size());
  EXPECT_NE(bits(cold.losses[0]), bits(rest.losses[0]));
  // The fprop-x reference of layer 0: the uninterrupted run holds step 1's
  // first amax throughout; the cold restart samples anew at step 8, so its
  // rows of steps 9.. hold another value.
  const std::string ref = "/quant/layers.0.mixer.in_proj/fprop/fprop-x/reference";
  const std::string amax = "/quant/layers.0.mixer.in_proj/fprop/fprop-x/amax";
  const std::string step = "/quant/layers.0.mixer.in_proj/fprop/fprop-x/step";
  const auto full_ref = io::read_run_column(d / "full/run.h5", ref);
  const auto cold_ref = io::read_run_column(d / "cold/run.h5", ref);
  const auto cold_step = io::read_run_column(d / "cold/run.h5", step);
  EXPECT_EQ(full_ref.front(), io::read_run_column(d / "full/run.h5", amax).front());  // step 1 sampled
  ASSERT_EQ(cold_ref.size(), full_ref.size());
  for (size_t i = 0; i < full_ref.size(); ++i) {
    EXPECT_EQ(full_ref[i], full_ref[0]) << "row " << i;
    if (cold_step[i] <= 7) EXPECT_EQ(cold_ref[i], full_ref[i]) << "row " << i;
    else EXPECT_NE(cold_ref[i], full_ref[i]) << "row " << i;
  }
}

// Row outer scales (nvfp4-row-scaled) under the grouped GEMM model, with the
// wgrad operands' references held row by row (periodic and delayed): the run
// differs from one tensor scale, and interrupted and resumed it gives the
// uninterrupted run's losses and weights bit for bit (the per-row references
// go through the checkpoint).
TEST(QuantTrain, RowOuterScalesResumeBitIdentical) {
  TempDir d;
  const std::vector<std::string> sets = {"train.recipe=nvfp4-row-scaled", "recipe.gemm.model=grouped",
                                         "recipe.wgrad-x.reference=periodic:4", "recipe.wgrad-dy.reference=delayed:3",
                                         "train.checkpoint_interval=5", "train.stats_interval=3"};
  const TrainResult full = train_new(quant_tiny(sets), d / "full", quiet(), {});
  ASSERT_EQ(full.status, TrainStatus::completed);
  for (const double l : full.losses) ASSERT_TRUE(std::isfinite(l));
  std::vector<std::string> tensor = sets;
  tensor.push_back("recipe.activations.outer_scale=tensor");
  tensor.push_back("recipe.gradients.outer_scale=tensor");
  const TrainResult plain = train_new(quant_tiny(tensor), d / "plain", quiet(), {});
  ASSERT_EQ(plain.status, TrainStatus::completed);
  EXPECT_NE(bits(plain.losses.back()), bits(full.losses.back()));

  std::atomic<int> stop{0};
  TrainHooks h = quiet();
  h.stop = &stop;
  h.before_step = [&](int64_t s, models::NemotronH<float>&) {
    if (s == 6) stop = SIGINT;
  };
  const TrainResult first = train_new(quant_tiny(sets), d / "cut", h, {});
  ASSERT_EQ(first.status, TrainStatus::interrupted);
  {
    io::h5::silence_errors();
    io::h5::Handle f(H5Fopen((d / "cut/checkpoints/step_00000007.h5").c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
    ASSERT_TRUE(f.valid());
    const auto v = io::h5::read_f64_array(f.get(), "/layer_state/layers.0.mixer.in_proj/wgrad-x", "checkpoint");
    ASSERT_GE(v.size(), 9u);
    EXPECT_EQ(v[0], 2.0);  // the per-row layout
    const size_t at = 8 + static_cast<size_t>(v[7]);  // after the tensor history: the held rows
    ASSERT_LT(at, v.size());
    EXPECT_GT(v[at], 0.0);
  }
  const TrainResult rest = train_resume(d / "cut", std::nullopt, {}, quiet(), {});
  ASSERT_EQ(rest.status, TrainStatus::completed);
  std::vector<double> joined = first.losses;
  joined.insert(joined.end(), rest.losses.begin(), rest.losses.end());
  ASSERT_EQ(joined.size(), full.losses.size());
  for (size_t i = 0; i < joined.size(); ++i) EXPECT_EQ(bits(joined[i]), bits(full.losses[i])) << "loss of step " << i + 1;
  size_t differ = 0;
  for (size_t i = 0; i < full.params.size(); ++i)
    differ += std::bit_cast<uint32_t>(rest.params[i]) != std::bit_cast<uint32_t>(full.params[i]);
  EXPECT_EQ(differ, 0u);
}

// The sample-and-hold statistics: stale_ratio = amax / reference (1 at the
// steps a periodic reference samples, other values between samples) and
// scale_saturated_fraction = scale_saturated / blocks, row by row.
TEST(QuantTrain, StaleRatioAndSaturatedFractionOfHeldReferences) {
  TempDir d;
  const TrainResult r = train_new(
      quant_tiny({"train.recipe=ue5m3-b16", "recipe.all.reference=periodic:3", "train.steps=6",
                  "train.stats_interval=1"}),
      d / "run", quiet(), {});
  ASSERT_EQ(r.status, TrainStatus::completed);
  const std::string file = d / "run/run.h5";
  int groups = 0, held_differs = 0;
  for (const auto& ds : io::list_run_datasets(file)) {
    if (!ds.starts_with("/quant/") || !ds.ends_with("/stale_ratio")) continue;
    const std::string g = ds.substr(0, ds.size() - std::string("/stale_ratio").size());
    SCOPED_TRACE(g);
    const auto rho = io::read_run_column(file, ds), amax = io::read_run_column(file, g + "/amax"),
               ref = io::read_run_column(file, g + "/reference"), step = io::read_run_column(file, g + "/step"),
               mb = io::read_run_column(file, g + "/micro_batch"), sat = io::read_run_column(file, g + "/scale_saturated"),
               blocks = io::read_run_column(file, g + "/blocks"),
               frac = io::read_run_column(file, g + "/scale_saturated_fraction");
    ASSERT_EQ(rho.size(), amax.size());
    for (size_t i = 0; i < rho.size(); ++i) {
      EXPECT_EQ(bits(rho[i]), bits(amax[i] / ref[i])) << "row " << i;
      EXPECT_EQ(bits(frac[i]), bits(sat[i] / blocks[i])) << "row " << i;
      // Steps 1, 4 (periodic:3), micro-batch 0 of a forward operand: the
      // reference is the call's own amax.
      if ((step[i] == 1 || step[i] == 4) && mb[i] == 0 && g.ends_with("/fprop-x")) {
        EXPECT_EQ(rho[i], 1.0) << "row " << i;
      }
      held_differs += rho[i] != 1.0;
    }
    ++groups;
  }
  EXPECT_GT(groups, 0);
  EXPECT_GT(held_differs, 0) << "no held reference was stale: the test shows nothing";
}

// gain_mean is the running mean of gain over a GEMM's rows, row by row (the
// resume test compares it, with every other column, across a resume).
TEST(QuantTrain, GainMeanIsTheRunningMeanOfGain) {
  TempDir d;
  const TrainResult r = train_new(quant_tiny({"train.recipe=ue5m3-b16", "train.steps=5", "train.stats_interval=1"}),
                                  d / "run", quiet(), {});
  ASSERT_EQ(r.status, TrainStatus::completed);
  const std::string file = d / "run/run.h5";
  int groups = 0;
  for (const auto& ds : io::list_run_datasets(file)) {
    if (!ds.starts_with("/gemm/") || !ds.ends_with("/gain_mean")) continue;
    const std::string g = ds.substr(0, ds.size() - std::string("/gain_mean").size());
    const auto mean = io::read_run_column(file, ds), gain = io::read_run_column(file, g + "/gain");
    ASSERT_EQ(mean.size(), gain.size()) << g;
    ASSERT_GT(mean.size(), 5u) << g;  // five steps, two micro-batches
    double sum = 0;
    int64_t n = 0;
    for (size_t i = 0; i < gain.size(); ++i) {
      if (std::isfinite(gain[i])) sum += gain[i], ++n;
      EXPECT_EQ(bits(mean[i]), bits(sum / static_cast<double>(n))) << g << " row " << i;
    }
    ++groups;
  }
  EXPECT_GT(groups, 0);
}

TEST(QuantTrain, StatisticsEqualQuantizeOnTheCapturedTensors) {
  // te-nvfp4 with every block quantized: RHT on wgrad, stochastic rounding
  // on dY, current references; captured at step 3 (micro-batch 0).
  TempDir d;
  const TrainResult r = train_new(
      quant_tiny({"train.recipe=te-nvfp4", "recipe.keep_last_bf16=0", "train.capture_step=3", "train.steps=4"}),
      d / "run", quiet(), {});
  ASSERT_EQ(r.status, TrainStatus::completed);
  const std::string file = d / "run/run.h5";
  io::h5::silence_errors();
  io::h5::Handle f(H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  ASSERT_TRUE(f.valid());
  int compared = 0;
  for (const auto& ds : io::list_run_datasets(file)) {
    if (!ds.starts_with("/capture/step_3/")) continue;
    SCOPED_TRACE(ds);
    io::h5::Handle t(H5Dopen2(f.get(), ds.c_str(), H5P_DEFAULT), H5Dclose);
    auto str = [&](const char* a) { return io::h5::read_string_attribute(t.get(), a).value(); };
    auto num = [&](const char* a) { return io::h5::read_double_attribute(t.get(), a).value(); };
    // The spec from the attributes.
    QuantSpec s;
    s.elem = parse_format(str("elem"));
    if (str("scale") != "none") s.scale = parse_format(str("scale"));
    const std::string block = str("block");
    s.block_rows = std::stoi(block.substr(0, block.find('x')));
    s.block_cols = std::stoi(block.substr(block.find('x') + 1));
    s.rule = parse_scale_rule(str("scale_rule"));
    s.arith = str("arith") == "fp32" ? Arith::fp32 : Arith::exact;
    s.round = parse_round(str("round"));
    s.sr_bits = static_cast<int>(num("sr_bits"));
    if (!std::isnan(num("scale_target"))) s.scale_target = num("scale_target");
    s.zero_scale = str("zero_scale") == "one" ? ZeroScale::one : ZeroScale::zero;
    s.saturate = num("saturate") != 0;
    s.rht = num("rht") != 0;
    s.rht_signs = static_cast<uint16_t>(std::stoul(str("rht_signs"), nullptr, 16));
    const std::string amax = str("tensor_amax");
    s.amax_kind = amax == "none" ? AmaxKind::none : amax == "auto" ? AmaxKind::current : AmaxKind::given;
    if (amax == "given") s.amax_value = num("tensor_amax_value");
    uint64_t seed = 0, stream = 0;
    {
      io::h5::Handle a(H5Aopen(t.get(), "seed", H5P_DEFAULT), H5Aclose);
      io::h5::Handle b(H5Aopen(t.get(), "stream", H5P_DEFAULT), H5Aclose);
      ASSERT_GE(H5Aread(a.get(), H5T_NATIVE_UINT64, &seed), 0);
      ASSERT_GE(H5Aread(b.get(), H5T_NATIVE_UINT64, &stream), 0);
    }
    s.seed = seed;
    s.stream = stream;
    EXPECT_EQ(q::quantize_options(s), str("quantize_options"));

    int64_t rows = 0, cols = 0;
    const std::vector<float> x = io::read_run_tensor(file, ds, rows, cols);
    std::vector<float> y(x.size());
    QuantStats st;
    QuantOutput out;
    out.values = y.data();
    out.stats = &st;
    const QuantInfo info = quantize(s, x.data(), rows, cols, out);

    // The row of /quant/<layer>/<gemm>/<operand> for step 3, micro-batch 0.
    const std::string group = "/quant/" + ds.substr(std::string("/capture/step_3/").size());
    const auto steps = io::read_run_column(file, group + "/step");
    const auto mbs = io::read_run_column(file, group + "/micro_batch");
    size_t row = steps.size();
    for (size_t i = 0; i < steps.size(); ++i)
      if (steps[i] == 3 && mbs[i] == 0) row = i;
    ASSERT_LT(row, steps.size());
    auto stat = [&](const char* name) { return io::read_run_column(file, group + "/" + name).at(row); };
    // The counts and sums of the statistics table (formats/vocab.hpp), exactly.
    for (const QuantStat& c : quant_stats()) {
      if (c.kind == StatKind::count) {
        EXPECT_EQ(stat(c.name), c.value(st)) << c.name;
      } else if (c.kind == StatKind::sum) {
        EXPECT_EQ(bits(stat(c.name)), bits(c.value(st))) << c.name;
      }
    }
    EXPECT_EQ(bits(stat("reference")), bits(info.amax));
    EXPECT_EQ(stat("tensor_scale"), static_cast<double>(info.t));
    EXPECT_GT(st.nonzero, 0u);
    ++compared;
  }
  // 5 blocks of proxy-tiny: 2 x (in_proj, out_proj) + 4 attention + 2 x (up, down) = 12 linears, 6 operands each.
  EXPECT_EQ(compared, 72);
}

TEST(QuantTrain, ParameterNormsPerLoggedStep) {
  TempDir d;
  const TrainResult r = train_new(quant_tiny({"train.steps=8", "train.recipe=mxfp4"}), d / "run", quiet(), {});
  ASSERT_EQ(r.status, TrainStatus::completed);
  const std::string file = d / "run/run.h5";
  const auto steps = io::read_run_column(file, "/train/step");  // 1, 4, 8
  const auto w = io::read_run_column(file, "/train/param_norm");
  const auto g = io::read_run_column(file, "/train/param_grad_norm");
  ASSERT_EQ(steps.size(), 3u);
  ASSERT_EQ(w.size() % steps.size(), 0u);
  const size_t P = w.size() / steps.size();
  EXPECT_EQ(g.size(), w.size());
  // The per-parameter gradient norms add up (in squares) to the global norm.
  const auto gn = io::read_run_column(file, "/train/grad_norm");
  for (size_t s = 0; s < steps.size(); ++s) {
    double sq = 0;
    for (size_t i = 0; i < P; ++i) sq += g[s * P + i] * g[s * P + i];
    EXPECT_NEAR(std::sqrt(sq), gn[s], 1e-9 * gn[s]);
    for (size_t i = 0; i < P; ++i) EXPECT_GT(w[s * P + i], 0) << i;
  }
  EXPECT_EQ(*io::read_run_attribute(file, "recipe_name"), "mxfp4");
  EXPECT_NE(io::read_run_attribute(file, "plan")->find("layers.0.mixer.in_proj: fprop-x{elem=e2m1"), std::string::npos);
  EXPECT_NE(io::read_run_attribute(file, "recipe")->find("[gemm]"), std::string::npos);
}

}  // namespace
}  // namespace exmy::train

// The run configuration: INI sections, --set overrides, model fields,
// one-line errors for unknown keys and bad values, and the resolved text.
#include <gtest/gtest.h>

#include <optional>
#include <string>

#include "formats/error.hpp"
#include "models/config.hpp"
#include "sim/quant/recipe.hpp"
#include "sim/quant/quantized_linear.hpp"
#include "sim/train/run_config.hpp"
#include "tests/train/test_support.hpp"

namespace exmy::train {
namespace {

using test::expect_error;

const char* kIni = R"(# a comment
[model]
name = proxy-1m
hidden_size = 64      # trailing comment

[train]
steps = 30
batch_size = 4
precision = bf16

[optim]
lr = 1e-3
schedule = wsd
warmup_steps = 3

[data]
path = synthetic
)";

TEST(RunConfig, DefaultsWithoutAFile) {
  const RunConfig c = parse_run_config("", "defaults", {});
  EXPECT_EQ(c.model_name, "proxy-tiny");
  EXPECT_EQ(c.model.hidden_size, 32);
  EXPECT_EQ(c.steps, 200);
  EXPECT_EQ(c.precision, "fp32");
  EXPECT_EQ(c.fp32_gemm, "auto");
  // auto: the fp32 model in BF16 on a CUDA device only
  EXPECT_EQ(sim::quant::parse_fp32_gemm(c.fp32_gemm, true), sim::quant::Fp32Gemm::bf16);
  EXPECT_EQ(sim::quant::parse_fp32_gemm(c.fp32_gemm, false), sim::quant::Fp32Gemm::sgemm);
  EXPECT_EQ(sim::quant::parse_fp32_gemm("sgemm", true), sim::quant::Fp32Gemm::sgemm);
  EXPECT_EQ(sim::quant::parse_fp32_gemm("bf16", false), sim::quant::Fp32Gemm::bf16);
  EXPECT_EQ(c.schedule.kind, sim::LrKind::cosine);
  EXPECT_EQ(c.data_path, "synthetic");
}

TEST(RunConfig, IniSectionsAndModelFields) {
  const RunConfig c = parse_run_config(kIni, "test.ini", {});
  EXPECT_EQ(c.model_name, "proxy-1m");
  EXPECT_EQ(c.model.hidden_size, 64);
  EXPECT_EQ(c.model.intermediate_size, 512);  // from the preset
  EXPECT_EQ(c.steps, 30);
  EXPECT_EQ(c.schedule.total, 30);
  EXPECT_EQ(c.batch_size, 4);
  EXPECT_EQ(c.precision, "bf16");
  EXPECT_DOUBLE_EQ(c.schedule.peak, 1e-3);
  EXPECT_EQ(c.schedule.kind, sim::LrKind::wsd);
  EXPECT_EQ(c.schedule.warmup, 3);
  EXPECT_EQ(c.tokens_per_step(), 4 * 128);
}

TEST(RunConfig, SetOverridesTheFileAndTheLastSetWins) {
  const RunConfig c = parse_run_config(
      kIni, "test.ini",
      {"train.steps=50", "model.hybrid_override_pattern=M-*", "optim.lr = 2e-3", "train.steps=60", "model.n_groups=1"});
  EXPECT_EQ(c.steps, 60);
  EXPECT_EQ(c.model.hybrid_override_pattern, "M-*");
  EXPECT_EQ(c.model.num_hidden_layers, 3);
  EXPECT_DOUBLE_EQ(c.schedule.peak, 2e-3);
  EXPECT_EQ(c.model.n_groups, 1);
}

TEST(RunConfig, UnknownKeysAreRejectedByName) {
  expect_error([] { parse_run_config("[train]\nstepz = 3\n", "f.ini", {}); }, "unknown configuration key 'train.stepz'");
  expect_error([] { parse_run_config("[train]\nstepz = 3\n", "f.ini", {}); }, "f.ini");
  expect_error([] { parse_run_config("[modle]\nname = x\n", "f.ini", {}); }, "'modle.name'");
  expect_error([] { parse_run_config("steps = 3\n", "f.ini", {}); }, "'steps'");
  expect_error([] { parse_run_config("", "f.ini", {"optim.momentum=0.9"}); }, "unknown configuration key 'optim.momentum'");
  expect_error([] { parse_run_config("", "f.ini", {"model.hidden=8"}); }, "'model.hidden'");
  expect_error([] { parse_run_config("", "f.ini", {"train.steps"}); }, "expected section.key=value");
}

// Run configurations are read as recipes and sweep files are (one INI
// dialect): a key given twice is an error naming both lines, '#' and ';'
// start a comment at the start of a line or after a blank (so a value may
// hold either character), a [recipe] section may repeat a key (its
// overrides apply in order), and a directory is not a configuration.
TEST(RunConfig, OneIniDialectWithCommentsDuplicatesAndDirectories) {
  expect_error([] { parse_run_config("[train]\nsteps = 5\nsteps = 6\n", "f.ini", {}); },
               "f.ini:3: key 'train.steps' given twice (first on line 2)");
  expect_error([] { parse_run_config("[train]\nsteps = 5\n[train]\nseed = 2\n", "f.ini", {}); },
               "f.ini:3: section [train] appears twice");
  const RunConfig c = parse_run_config(
      "; a comment\n[train]\nsteps = 5  # five\nlog_interval = 2 ; two\n[data]\npath = a#b;c\n"
      "[recipe]\nall.round = rtz\nall.round = rne\n",
      "f.ini", {});
  EXPECT_EQ(c.steps, 5);
  EXPECT_EQ(c.log_interval, 2);
  EXPECT_EQ(c.data_path, "a#b;c");
  ASSERT_EQ(c.recipe_sets.size(), 2u);
  EXPECT_EQ(c.recipe_sets[1].second, "rne");
  test::TempDir d;
  expect_error([&] { load_run_config(d.path(), {}); }, "is a directory, not a file");
  expect_error([&] { load_run_config(d / "missing.ini", {}); }, "no such file");
}

TEST(RunConfig, BadValuesAndShapesAreOneLineErrors) {
  expect_error([] { parse_run_config("", "f", {"train.steps=abc"}); }, "train.steps: bad value 'abc'");
  expect_error([] { parse_run_config("", "f", {"train.steps=0"}); }, "train.steps = 0 must be at least 1");
  expect_error([] { parse_run_config("", "f", {"train.precision=fp8"}); },
               "train.precision: bad value 'fp8' (expected fp32 or bf16)");
  expect_error([] { parse_run_config("", "f", {"optim.schedule=step"}); }, "unknown schedule 'step'");
  expect_error([] { parse_run_config("", "f", {"optim.lr=nan"}); }, "optim.lr");
  expect_error([] { parse_run_config("", "f", {"model.hybrid_override_pattern=MXM"}); }, "unknown layer letter 'X'");
  expect_error([] { parse_run_config("", "f", {"model.num_attention_heads=3"}); }, "not a multiple of num_key_value_heads");
  expect_error([] { parse_run_config("", "f", {"model.mamba_num_heads=3"}); }, "not a multiple of n_groups");
  expect_error([] { parse_run_config("", "f", {"model.name=nemotron-h-9b"}); }, "unknown model 'nemotron-h-9b'");
  expect_error([] { parse_run_config("", "f", {"data.val_fraction=1"}); }, "data.val_fraction");
  expect_error([] { parse_run_config("", "f", {"data.format=json"}); }, "data.format");
  expect_error([] { parse_run_config("", "f", {"train.comm=gloo"}); },
               "train.comm: bad value 'gloo' (expected auto, mpi or nccl)");
  expect_error([] { parse_run_config("", "f", {"train.comm=nccl"}); },
               "train.comm = nccl moves device buffers, but train.device = cpu");
  EXPECT_EQ(parse_run_config("", "f", {"train.comm=nccl", "train.device=cuda-emulated"}).comm, dist::CommChoice::nccl);
  expect_error([] { parse_run_config("", "f", {"train.working_weights=fp16"}); },
               "train.working_weights: bad value 'fp16' (expected fp32 or bf16)");
  expect_error([] { parse_run_config("", "f", {"train.fp32_gemm=tf32"}); },
               "train.fp32_gemm: bad value 'tf32' (expected auto, sgemm or bf16)");
  EXPECT_FALSE(parse_run_config("", "f", {}).bf16_weights());
  EXPECT_TRUE(parse_run_config("", "f", {"train.working_weights=bf16"}).bf16_weights());
  expect_error([] { load_run_config("/nonexistent/x.ini", {}); }, "cannot open configuration");
}

TEST(RunConfig, ResolvedTextReadsBackToTheSameConfiguration) {
  const RunConfig a = parse_run_config(kIni, "test.ini", {"model.chunk_size=16", "optim.beta2=0.99"});
  const std::string text = a.text();
  for (const auto& k : config_keys()) {
    const std::string key = k.name.substr(k.name.find('.') + 1);
    EXPECT_NE(text.find("\n" + key + " = "), std::string::npos) << k.name;
  }
  EXPECT_NE(text.find("chunk_size = 16"), std::string::npos);
  const RunConfig b = parse_run_config(text, "resolved", {});
  EXPECT_EQ(b.text(), text);
  EXPECT_EQ(models::describe(b.model), models::describe(a.model));
  EXPECT_EQ(b.values, a.values);
  EXPECT_DOUBLE_EQ(b.adamw.beta2, 0.99);
}

// One boolean spelling for every reader: a model configuration field, a
// recipe knob and a run configuration key accept the same words with the
// same meaning (formats/vocab.hpp's parse_bool_word) and reject the rest.
TEST(RunConfig, BooleansAreSpelledAlikeInModelConfigsRecipesAndRunConfigs) {
  for (const std::string w : {"true", "false", "on", "off", "1", "0", "True", "False", "yes", "no", ""}) {
    std::optional<bool> model, recipe, run;
    try {
      models::NemotronHConfig c = models::preset_config("proxy-tiny");
      models::apply_override(c, "model.use_conv_bias=" + w);
      model = c.use_conv_bias;
    } catch (const Error&) {
    }
    try {
      const std::string text = "[recipe]\ndescription = b\nlayers = all\nlm_head = " + w + "\n[all]\nelem = e2m1\nscale = ue4m3\n";
      recipe = sim::quant::parse_recipe(text, "b", "test").lm_head;
    } catch (const Error&) {
    }
    try {
      run = parse_run_config("", "test.ini", {"train.cold_restart_references=" + w}).cold_restart_references;
    } catch (const Error&) {
    }
    EXPECT_EQ(model, recipe) << "'" << w << "'";
    EXPECT_EQ(model, run) << "'" << w << "'";
    const bool yes = w == "true" || w == "on", no = w == "false" || w == "off";
    EXPECT_EQ(model, yes || no ? std::optional<bool>(yes) : std::nullopt) << "'" << w << "'";
  }
}

}  // namespace
}  // namespace exmy::train

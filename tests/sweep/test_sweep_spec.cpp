// Sweep files and their expansion (sim/sweep/sweep.hpp): grid order, zipped
// axes, run names, quoting, references, and one-line FILE:LINE errors.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "formats/error.hpp"
#include "sim/sweep/sweep.hpp"

namespace exmy::sweep {
namespace {

// Expects parse_sweep(text) to throw one line that starts with `prefix`
// ("s.ini:LINE:") and contains `needle`.
void expect_parse_error(const std::string& text, const std::string& prefix, const std::string& needle) {
  try {
    parse_sweep(text, "s.ini");
    ADD_FAILURE() << "no error (expected '" << prefix << "... " << needle << "') for:\n" << text;
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind(prefix, 0), 0u) << "message: " << msg;
    EXPECT_NE(msg.find(needle), std::string::npos) << "message: " << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "not one line: " << msg;
  }
}

const char* kBase = "[sweep]\nbase = experiments/proxy-tiny.ini\n";

TEST(SweepSpec, GridOrderFirstAxisSlowest) {
  const SweepSpec s = parse_sweep(std::string(kBase) +
                                      "[set]\ntrain.steps = 20\n"
                                      "[grid]\ntrain.seed = 1, 2, 3\noptim.lr = 3e-3, 1e-2\n",
                                  "dir/lr-seed.ini");
  EXPECT_EQ(s.name, "lr-seed");  // the file's stem
  ASSERT_EQ(s.axes.size(), 2u);
  EXPECT_EQ(s.run_count(), 6);
  const auto runs = expand(s);
  ASSERT_EQ(runs.size(), 6u);
  const std::vector<std::pair<std::string, std::string>> expect = {
      {"1", "3e-3"}, {"1", "1e-2"}, {"2", "3e-3"}, {"2", "1e-2"}, {"3", "3e-3"}, {"3", "1e-2"}};
  for (size_t i = 0; i < runs.size(); ++i) {
    EXPECT_EQ(runs[i].index, static_cast<int64_t>(i));
    ASSERT_EQ(runs[i].values.size(), 2u);
    EXPECT_EQ(runs[i].values[0], (Assignment{"train.seed", expect[i].first}));
    EXPECT_EQ(runs[i].values[1], (Assignment{"optim.lr", expect[i].second}));
  }
  EXPECT_EQ(runs[0].name, "000_seed=1_lr=3e-3");
  EXPECT_EQ(runs[3].name, "003_seed=2_lr=1e-2");
  // Arguments: the base, [set], then the axes in order.
  EXPECT_EQ(runs[3].args, (std::vector<std::string>{"--config", "experiments/proxy-tiny.ini", "--set", "train.steps=20",
                                                    "--set", "train.seed=2", "--set", "optim.lr=1e-2"}));
  EXPECT_FALSE(runs[3].reference.has_value());
}

TEST(SweepSpec, ZipStepsKeysTogetherAtItsHeader) {
  const SweepSpec s = parse_sweep(std::string(kBase) +
                                      "[zip.shape]\nmodel.hidden_size = 32, 64, 96\nmodel.num_attention_heads = 2, 4, 6\n"
                                      "[grid]\nrecipe = ue5m3-b16, bf16\ntrain.seed = 1, 2\n",
                                  "z.ini");
  ASSERT_EQ(s.axes.size(), 3u);
  EXPECT_EQ(s.axes[0].name, "shape");
  EXPECT_EQ(s.axes[0].keys, (std::vector<std::string>{"model.hidden_size", "model.num_attention_heads"}));
  EXPECT_EQ(s.axis_keys(), (std::vector<std::string>{"model.hidden_size", "model.num_attention_heads",
                                                     "train.recipe", "train.seed"}));
  EXPECT_EQ(s.run_count(), 3 * 2 * 2);
  const auto runs = expand(s);
  // Run 9 = (2, 0, 1): the third shape, ue5m3-b16, seed 2.
  const RunSpec& r = runs[9];
  EXPECT_EQ(r.position, (std::vector<int64_t>{2, 0, 1}));
  EXPECT_EQ(r.values, (std::vector<Assignment>{{"model.hidden_size", "96"},
                                               {"model.num_attention_heads", "6"},
                                               {"train.recipe", "ue5m3-b16"},
                                               {"train.seed", "2"}}));
  EXPECT_EQ(r.name, "009_hidden-size=96_num-attention-heads=6_recipe=ue5m3-b16_seed=2");  // "_" only between parts
  // Zipped values never cross: every run has heads = hidden_size / 16.
  for (const auto& x : runs) EXPECT_EQ(std::stoi(x.values[0].second) / 16, std::stoi(x.values[1].second));
}

TEST(SweepSpec, NamesQuotingAndShortNames) {
  const SweepSpec s = parse_sweep(std::string(kBase) +
                                      "[grid]\n"
                                      "recipe.all.round = rne, \"stochastic-fast\"\n"
                                      "recipe.wgrad-dy.round = rne, \"a,b c\"\n"
                                      "data.path = \"x/y.tok\"\n",
                                  "q.ini");
  EXPECT_EQ(s.axes[1].values[0], (std::vector<std::string>{"rne", "a,b c"}));
  EXPECT_EQ(s.axes[2].values[0], (std::vector<std::string>{"x/y.tok"}));
  const auto shorts = short_names(s.axis_keys());
  EXPECT_EQ(shorts.at("recipe.all.round"), "all.round");  // "round" alone would clash
  EXPECT_EQ(shorts.at("recipe.wgrad-dy.round"), "wgrad-dy.round");
  EXPECT_EQ(shorts.at("data.path"), "path");
  const auto runs = expand(s);
  ASSERT_EQ(runs.size(), 4u);
  EXPECT_EQ(runs[3].name, "003_all.round=stochastic-fast_wgrad-dy.round=a-b-c_path=x-y.tok");
  // The value itself goes to exmy train untouched.
  EXPECT_EQ(runs[3].args.back(), "data.path=x/y.tok");
  EXPECT_EQ(runs[3].args[runs[3].args.size() - 3], "recipe.wgrad-dy.round=a,b c");

  EXPECT_EQ(split_values("a, b ,\"c,d\" , \" e \"", "t"), (std::vector<std::string>{"a", "b", "c,d", " e "}));
  EXPECT_EQ(sanitize_value("../../etc"), "etc");
  EXPECT_EQ(sanitize_value("experiments/recipes/x.ini"), "experiments-recipes-x.ini");
  EXPECT_EQ(sanitize_value("-1"), "-1");
  EXPECT_EQ(sanitize_value("///"), "x");
  EXPECT_EQ(sanitize_value(std::string(100, 'a')).size(), 40u);
  // Index widths grow with the sweep.
  std::string many = std::string(kBase) + "[grid]\ntrain.seed = ";
  for (int i = 0; i < 1200; ++i) many += (i ? "," : "") + std::to_string(i + 1);
  const auto big = expand(parse_sweep(many + "\n", "m.ini"));
  EXPECT_EQ(big[7].name, "0007_seed=8");
  EXPECT_EQ(big[1199].name, "1199_seed=1200");
}

TEST(SweepSpec, ReferenceIsTheRunWithTheNamedValues) {
  const SweepSpec s = parse_sweep(
      "[sweep]\nname = ref\nbase = b.ini\nreference = recipe=bf16\ndiverge_above = 6.5\n"
      "group_over = train.seed\n"
      "[grid]\nrecipe = ue5m3-b16, bf16, te-nvfp4\ntrain.seed = 1, 2\n",
      "r.ini");
  EXPECT_EQ(s.name, "ref");
  ASSERT_TRUE(s.diverge_above.has_value());
  EXPECT_EQ(*s.diverge_above, 6.5);
  EXPECT_EQ(s.group_over, "train.seed");
  EXPECT_EQ(s.reference, (std::vector<Assignment>{{"train.recipe", "bf16"}}));
  const auto runs = expand(s);
  // bf16 is the second recipe: runs 2 (seed 1) and 3 (seed 2).
  for (const auto& r : runs) {
    ASSERT_TRUE(r.reference.has_value());
    EXPECT_EQ(*r.reference, 2 + r.position[1]) << r.name;
  }
  // A reference value no axis has is an error of the expansion.
  SweepSpec bad = s;
  bad.reference = {{"train.recipe", "fp32"}};
  try {
    expand(bad);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("matches 0 values of axis 'train.recipe'"), std::string::npos) << e.what();
  }
}

TEST(SweepSpec, ErrorsAreOneLineNamingFileAndLine) {
  const std::string base(kBase);  // lines 1-2
  expect_parse_error(base + "[grid]\ntrain.seed = 1, 2\n[swep]\n", "s.ini:5:", "unknown section [swep]");
  expect_parse_error(base + "steps = 3\n", "s.ini:3:", "unknown key 'steps' in [sweep]");
  // The final-window loss is defined once, by the trainer: no sweep key sets it.
  expect_parse_error(base + "final_window = 5\n", "s.ini:3:", "final_window is no longer a sweep key");
  expect_parse_error(base + "diverge_above = high\n", "s.ini:3:", "expected a number");
  expect_parse_error(base + "[grid]\ntrain.seed = 1, , 2\n", "s.ini:4:", "empty value");
  expect_parse_error(base + "[grid]\ntrain.seed = 1, 2, 1\n", "s.ini:4:", "lists '1' twice");
  expect_parse_error(base + "[grid]\nseed = 1, 2\n", "s.ini:4:", "'seed' is not a run key");
  expect_parse_error(base + "[grid]\ntrain.seed = 1, \"2\n", "s.ini:4:", "unterminated quote");
  expect_parse_error(base + "[grid]\ntrain.seed = 1, 2\n[zip.a]\ntrain.seed = 3, 4\n", "s.ini:6:",
                     "'train.seed' is already an axis");
  expect_parse_error(base + "[zip.a]\nmodel.hidden_size = 32, 64\nmodel.num_attention_heads = 2, 4, 8\n", "s.ini:5:",
                     "zips lists of equal length");
  expect_parse_error(base + "[set]\ntrain.seed = 3\n[grid]\ntrain.seed = 1, 2\n", "s.ini:6:",
                     "both an axis and in [set] (line 4)");
  expect_parse_error(base + "[grid]\ntrain.seed = 1, 2\n[set]\ntrain.seed = 3\n", "s.ini:6:",
                     "both in [set] and an axis");
  expect_parse_error(base + "reference = optim.lr=1e-2\n[grid]\ntrain.seed = 1, 2\n", "s.ini:3:",
                     "reference names 'optim.lr', which is not an axis");
  expect_parse_error(base + "group_over = optim.lr\n[grid]\ntrain.seed = 1, 2\n", "s.ini:3:",
                     "group_over names 'optim.lr'");
  expect_parse_error(base + "[grid]\ntrain.seed\n", "s.ini:4:", "");  // not key = value
  expect_parse_error("[grid]\ntrain.seed = 1, 2\n", "s.ini:", "needs base");
  expect_parse_error(base + "[set]\ntrain.steps = 3\n", "s.ini:", "no axis");
  try {
    load_sweep("/nonexistent/sweep.ini");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/sweep.ini"), std::string::npos);
  }
}

}  // namespace
}  // namespace exmy::sweep

// Configuration: presets, parameter counts, overrides, validation, HF JSON.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <string>

#include "formats/error.hpp"
#include "models/config.hpp"
#include "models/mixer.hpp"

namespace exmy::models {
namespace {

// The message of the exmy::Error that f throws; "" when it throws none.
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Config, Nemotron8BHasExactlyThePublishedParameterCount) {
  const NemotronHConfig c = preset_config("nemotron-h-8b");
  validate(c);
  EXPECT_EQ(parameter_count(c), 8'100'852'736);
  EXPECT_EQ(c.num_hidden_layers, 52);
  EXPECT_EQ(c.count_layers('M'), 24);
  EXPECT_EQ(c.count_layers('*'), 4);
  EXPECT_EQ(c.count_layers('-'), 24);
  // Per-component rows add up to the same total; spot-check the big ones.
  int64_t sum = 0;
  for (const auto& r : parameter_breakdown(c)) {
    sum += r.total();
    if (r.block == "mamba" && r.component == "in_proj") { EXPECT_EQ(r.per_layer, 18560 * 4096); }
    if (r.block == "mamba" && r.component == "conv1d") { EXPECT_EQ(r.per_layer, 10240 * 4 + 10240); }
    if (r.block == "mlp" && r.component == "up_proj") { EXPECT_EQ(r.total(), 24LL * 21504 * 4096); }
    if (r.block == "attention" && r.component == "k_proj") { EXPECT_EQ(r.per_layer, 1024 * 4096); }
  }
  EXPECT_EQ(sum, 8'100'852'736);
}

TEST(Config, PublishedPresetsAndProxies) {
  struct Want {
    const char* name;
    int64_t layers, params_lo, params_hi;
  };
  for (const Want& w : {Want{"nemotron-h-4b", 52, 4'489'223'040, 4'489'223'040},
                        Want{"nemotron-h-47b", 98, 46'791'554'816, 46'791'554'816},
                        Want{"nemotron-h-56b", 118, 56'324'350'464, 56'324'350'464},
                        Want{"proxy-tiny", 5, 10'000, 50'000}, Want{"proxy-1m", 9, 800'000, 1'300'000},
                        Want{"proxy-10m", 22, 8'000'000, 13'000'000},
                        Want{"proxy-50m", 28, 40'000'000, 60'000'000}}) {
    const NemotronHConfig c = preset_config(w.name);
    EXPECT_NO_THROW(validate(c)) << w.name;
    EXPECT_EQ(c.num_hidden_layers, w.layers) << w.name;
    const int64_t p = parameter_count(c);
    EXPECT_GE(p, w.params_lo) << w.name;
    EXPECT_LE(p, w.params_hi) << w.name;
    EXPECT_GT(c.count_layers('M'), c.count_layers('*')) << w.name << ": proxies keep the Mamba-heavy style";
  }
  EXPECT_EQ(error_of([] { preset_config("nemotron-h-9b"); }).find("unknown model preset 'nemotron-h-9b'"), 0u);
}

// The GPU proxies (docs/models.md): the 8B's layer style - its pattern cut
// after whole Mamba-2/MLP pairs, every block type, the 8B's block sizes -
// at 125M, 350M and 1B parameters (within 10%, and exactly the counts the
// docs state).
TEST(Config, GpuProxiesKeepThe8BStyleAtTheirSizes) {
  const NemotronHConfig b8 = preset_config("nemotron-h-8b");
  struct Want {
    const char* name;
    double nominal;
    int64_t exact;
  };
  for (const Want& w : {Want{"proxy-125m", 125e6, 128'330'264}, Want{"proxy-350m", 350e6, 358'602'432},
                        Want{"proxy-1b", 1e9, 1'036'700'544}}) {
    const NemotronHConfig c = preset_config(w.name);
    EXPECT_NO_THROW(validate(c)) << w.name;
    EXPECT_NE(std::find(preset_names().begin(), preset_names().end(), w.name), preset_names().end()) << w.name;
    // The pattern: a prefix of the 8B's, ending after a pair's MLP block,
    // with every block type and as many MLP as Mamba-2 blocks.
    const std::string& p = c.hybrid_override_pattern;
    EXPECT_EQ(b8.hybrid_override_pattern.rfind(p, 0), 0u) << w.name << ": " << p;
    ASSERT_FALSE(p.empty()) << w.name;
    EXPECT_EQ(p.back(), '-') << w.name << ": " << p;
    for (char t : {'M', '*', '-'}) EXPECT_GT(c.count_layers(t), 0) << w.name << ": no '" << t << "' in " << p;
    EXPECT_EQ(c.count_layers('M'), c.count_layers('-')) << w.name;
    EXPECT_LT(c.count_layers('*'), c.count_layers('M')) << w.name;
    // The 8B's block sizes.
    EXPECT_EQ(c.head_dim, b8.head_dim) << w.name;
    EXPECT_EQ(c.num_attention_heads * c.head_dim, c.hidden_size) << w.name;
    EXPECT_LT(c.num_key_value_heads, c.num_attention_heads) << w.name << ": GQA";
    EXPECT_EQ(c.mamba_head_dim, b8.mamba_head_dim) << w.name;
    EXPECT_EQ(c.mamba_d_inner() * b8.hidden_size, b8.mamba_d_inner() * c.hidden_size) << w.name << ": expand";
    EXPECT_EQ(c.ssm_state_size, b8.ssm_state_size) << w.name;
    EXPECT_EQ(c.n_groups, b8.n_groups) << w.name;
    EXPECT_EQ(c.conv_kernel, b8.conv_kernel) << w.name;
    EXPECT_EQ(c.chunk_size, b8.chunk_size) << w.name;
    EXPECT_EQ(c.intermediate_size * b8.hidden_size, b8.intermediate_size * c.hidden_size) << w.name << ": MLP ratio";
    EXPECT_EQ(c.mlp_hidden_act, b8.mlp_hidden_act) << w.name;
    EXPECT_EQ(c.vocab_size, 256) << w.name << ": byte vocabulary, as the other proxies";
    // The size its name promises.
    const int64_t n = parameter_count(c);
    EXPECT_GE(static_cast<double>(n), 0.9 * w.nominal) << w.name << ": " << n;
    EXPECT_LE(static_cast<double>(n), 1.1 * w.nominal) << w.name << ": " << n;
    EXPECT_EQ(n, w.exact) << w.name << ": docs/models.md states " << w.exact;
  }
  // Wider and deeper in order.
  EXPECT_LT(preset_config("proxy-125m").hidden_size, preset_config("proxy-350m").hidden_size);
  EXPECT_LT(preset_config("proxy-350m").num_hidden_layers, preset_config("proxy-1b").num_hidden_layers);
  EXPECT_EQ(preset_config("proxy-1b").hybrid_override_pattern, b8.hybrid_override_pattern);
  // The help texts' list of presets.
  EXPECT_EQ(preset_list(), "nemotron-h-4b/8b/47b/56b, proxy-tiny/1m/10m/50m/125m/350m/1b");
}

TEST(Config, OverridesSetAnyFieldAndNameUnknownOnes) {
  NemotronHConfig c = preset_config("proxy-tiny");
  apply_override(c, "model.hidden_size=48");
  apply_override(c, "layer_norm_epsilon", "1e-6");
  apply_override(c, "model.use_conv_bias=false");
  apply_override(c, "model.hybrid_override_pattern=M*M-");
  apply_override(c, "model.time_step_limit=0.001,inf");
  apply_override(c, "model.attention_head_dim=16");  // HF alias of head_dim
  EXPECT_EQ(c.hidden_size, 48);
  EXPECT_EQ(c.layer_norm_epsilon, 1e-6);
  EXPECT_FALSE(c.use_conv_bias);
  EXPECT_EQ(c.num_hidden_layers, 4);  // follows the pattern
  EXPECT_EQ(c.time_step_limit[0], 0.001);
  EXPECT_TRUE(std::isinf(c.time_step_limit[1]));
  EXPECT_EQ(c.head_dim, 16);
  validate(c);
  const std::string unknown = error_of([&] { apply_override(c, "model.hiden_size=3"); });
  EXPECT_EQ(unknown.rfind("unknown model field 'hiden_size' (known: vocab_size, hidden_size,", 0), 0u) << unknown;
  EXPECT_EQ(unknown.find('\n'), std::string::npos);
  EXPECT_EQ(error_of([&] { apply_override(c, "model.hidden_size=big"); }),
            "model.hidden_size: bad value 'big' (expected an integer)");
  EXPECT_EQ(error_of([&] { apply_override(c, "model.use_conv_bias=maybe"); }),
            "model.use_conv_bias: bad value 'maybe' (expected true or false)");
  EXPECT_EQ(error_of([&] { apply_override(c, "hidden_size"); }),
            "bad override 'hidden_size' (expected model.FIELD=VALUE)");
}

TEST(Config, BadConfigsAreRejectedWithOneLineErrors) {
  auto with = [](const char* key, const char* value) {
    NemotronHConfig c = preset_config("proxy-tiny");
    apply_override(c, key, value);
    return error_of([&] { validate(c); });
  };
  EXPECT_EQ(with("hybrid_override_pattern", "M-X"),
            "model.hybrid_override_pattern: unknown layer letter 'X' at position 2 (expected M = Mamba-2, * = "
            "attention, - = MLP)");
  EXPECT_EQ(with("hybrid_override_pattern", "ME"),
            "model.hybrid_override_pattern: MoE blocks ('E' at position 1) are not supported (expected M, * or -)");
  EXPECT_EQ(with("num_hidden_layers", "7"), "model.num_hidden_layers = 7 does not match the pattern's 5 layers");
  EXPECT_EQ(with("num_key_value_heads", "3"),
            "model.num_attention_heads = 4 is not a multiple of num_key_value_heads = 3");
  EXPECT_EQ(with("n_groups", "3"), "model.mamba_num_heads = 4 is not a multiple of n_groups = 3");
  EXPECT_EQ(with("chunk_size", "0"), "model.chunk_size must be positive (got 0)");
  EXPECT_EQ(with("hidden_size", "-4"), "model.hidden_size must be positive (got -4)");
  EXPECT_EQ(with("use_bias", "true"), "model.use_bias = true is not supported (Nemotron-H has no linear biases)");
  EXPECT_EQ(with("tie_word_embeddings", "true"),
            "model.tie_word_embeddings = true is not supported (Nemotron-H has an untied LM head)");
  EXPECT_EQ(with("mlp_hidden_act", "gelu"), "model.mlp_hidden_act = 'gelu' is not supported (expected relu2)");
  EXPECT_EQ(with("hybrid_override_pattern", ""), "model.hybrid_override_pattern is empty (expected letters M, * and -)");
  // A pattern without attention does not care about attention heads.
  EXPECT_EQ(with("hybrid_override_pattern", "M-M-"), "");
}

TEST(Config, ReadsHfConfigJson) {
  // As in NVIDIA's config.json: legacy names, Python's bare Infinity.
  const std::string text = R"({
    "architectures": ["NemotronHForCausalLM"], "model_type": "nemotron_h",
    "attention_head_dim": 128, "chunk_size": 128, "conv_kernel": 4, "hidden_size": 4096,
    "hybrid_override_pattern": "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-",
    "intermediate_size": 21504, "layer_norm_epsilon": 1e-05, "mamba_head_dim": 64, "mamba_num_heads": 128,
    "n_groups": 8, "num_attention_heads": 32, "num_hidden_layers": 52, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05, "ssm_state_size": 128, "tie_word_embeddings": false, "use_bias": false,
    "use_conv_bias": true, "vocab_size": 131072, "time_step_limit": [0.0, Infinity], "torch_dtype": "bfloat16",
    "unrelated_key": {"nested": [1, 2]}
  })";
  const NemotronHConfig c = config_from_json_text(text, "config.json");
  validate(c);
  EXPECT_EQ(parameter_count(c), 8'100'852'736);
  EXPECT_TRUE(std::isinf(c.time_step_limit[1]));
  // transformers 5 writes the block list instead of the pattern.
  const NemotronHConfig v5 = config_from_json_text(
      R"({"layers_block_type": ["mamba", "mlp", "attention"], "hidden_size": 32, "vocab_size": 64,
          "intermediate_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
          "mamba_num_heads": 4, "mamba_head_dim": 8, "n_groups": 2, "ssm_state_size": 8})",
      "v5.json");
  EXPECT_EQ(v5.hybrid_override_pattern, "M-*");
  EXPECT_EQ(v5.num_hidden_layers, 3);
  validate(v5);
  EXPECT_EQ(error_of([] { config_from_json_text("{\"hidden_size\": ", "x.json"); }).rfind("x.json: not valid JSON", 0),
            0u);
  EXPECT_EQ(error_of([] { config_from_json_text(R"({"model_type": "llama"})", "x.json"); }),
            "x.json: model_type is 'llama' (expected nemotron_h)");
  EXPECT_EQ(error_of([] { resolve_config("/nonexistent/config.json"); }),
            "cannot open model config '/nonexistent/config.json'");
}

TEST(Config, JsonRoundTrip) {
  for (const auto& name : preset_names()) {
    NemotronHConfig c = preset_config(name);
    const NemotronHConfig back = config_from_json_text(config_to_json(c), name);
    EXPECT_EQ(describe(back), describe(c)) << name;
  }
}

TEST(Mixers, OneRowPerPatternLetter) {
  std::string letters;
  for (const MixerKind& k : mixer_kinds()) {
    EXPECT_EQ(letters.find(k.letter), std::string::npos) << k.letter;
    letters += k.letter;
    EXPECT_EQ(find_mixer_kind(k.letter), &k);
    EXPECT_EQ(&mixer_kind(k.letter), &k);
  }
  EXPECT_EQ(letters, "M*-");
  EXPECT_EQ(find_mixer_kind('E'), nullptr);
  EXPECT_NE(error_of([] { (void)mixer_kind('x'); }), "");
  // Every row registers parameters and has kept tensors and backward scratch.
  const NemotronHConfig c = preset_config("proxy-tiny");
  for (const MixerKind& k : mixer_kinds()) {
    sim::ArenaLayout L;
    k.ops.add_params(L, c, "mixer.");
    EXPECT_GT(L.num_params(), 0) << k.block;
    EXPECT_GT(k.ops.kept(c, 2, 8), 0) << k.block;
    EXPECT_FALSE(k.ops.scratch(c, 2, 8).per_token.empty()) << k.block;
  }
}

TEST(Config, FlopsAndMemoryEstimates) {
  const NemotronHConfig c = preset_config("nemotron-h-8b");
  const FlopCount f = flops_per_token(c, 4096);
  // Linear FLOPs are 2 per weight of every linear layer (the embedding is a
  // lookup): 2 * (params - embeddings - norms - conv/SSM vectors).
  int64_t linear_params = 0;
  for (const auto& r : parameter_breakdown(c))
    if (r.component.ends_with("proj") || r.component == "lm_head") linear_params += r.total();
  EXPECT_DOUBLE_EQ(f.linear, 2.0 * static_cast<double>(linear_params));
  EXPECT_GT(f.attention, 0);
  EXPECT_GT(f.ssd, 0);
  EXPECT_LT(f.attention + f.ssd, 0.2 * f.linear);
  EXPECT_DOUBLE_EQ(f.training(), 3 * f.forward());
  const MemoryEstimate m = training_memory(c, 1, 4096);
  EXPECT_GE(m.params, 4.0 * 8'100'852'736);
  EXPECT_EQ(m.optimizer, 2 * m.params);
  EXPECT_GT(m.activations, 0);
  EXPECT_GT(m.total(), 16.0 * 8e9);
}

}  // namespace
}  // namespace exmy::models

// Recipes: the shipped files, parsing, resolution, overrides, errors.
#include <gtest/gtest.h>

#include <algorithm>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <tuple>

#include "formats/error.hpp"
#include "formats/spec.hpp"
#include "formats/vocab.hpp"
#include "models/config.hpp"
#include "sim/quant/recipe.hpp"

namespace exmy::sim::quant {
namespace {

// recipe_to_ini without its first line (a comment naming the origin).
std::string body(const Recipe& r) {
  const std::string t = recipe_to_ini(r);
  return t.substr(t.find('\n') + 1);
}

const std::vector<std::string> kShipped = {"bf16",      "fp32",      "te-nvfp4",          "nvfp4-no-rht-all",
                                           "te-nvfp4-grouped", "nvfp4-no-rht-all-grouped",
                                           "ue5m3-b16", "ue5m3-b16-fp32gemm", "ue5m3-b32", "ue5m3-te-settings",
                                           "mxfp4",     "mxfp8",     "fp8-current", "nvfp4-4over6",
                                           "nvfp4-h32-wgrad", "nvfp4-dithered"};

LinearInfo linear(int layer, LinearKind kind, const std::string& name = "l") {
  LinearInfo i;
  i.name = name;
  i.layer = layer;
  i.kind = kind;
  i.in_features = 64;
  i.out_features = 64;
  return i;
}

// The message of the exmy::Error `f` throws (fails the test if none).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no exmy::Error thrown";
  return "";
}

void expect_one_line_naming(const std::string& msg, const std::string& what) {
  EXPECT_NE(msg.find(what), std::string::npos) << msg << " (expected to name: " << what << ")";
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
}

TEST(Recipe, EveryShippedRecipeLoadsByNameAndRoundTrips) {
  const auto names = recipe_names();
  for (const auto& n : kShipped) {
    SCOPED_TRACE(n);
    EXPECT_NE(std::find(names.begin(), names.end(), n), names.end());
    const Recipe r = load_recipe(n);
    EXPECT_EQ(r.name, n);
    EXPECT_FALSE(r.description.empty());
    const Recipe back = parse_recipe(recipe_to_ini(r), n, "round trip");
    EXPECT_EQ(body(back), body(r));
    if (r.quantize) {
      for (int layer : {0, 3}) {
        const auto a = r.resolve(linear(layer, LinearKind::mlp_down), 24);
        const auto b = back.resolve(linear(layer, LinearKind::mlp_down), 24);
        for (Role role : kRoles)
          EXPECT_EQ(role_spec_string(a[role_index(role)]), role_spec_string(b[role_index(role)]));
      }
    }
  }
  // A path works too, and the name is the file stem.
  EXPECT_EQ(load_recipe(recipe_dir() + "/mxfp4.ini").name, "mxfp4");
}

TEST(Recipe, TeNvfp4MatchesTransformerEngine) {
  const Recipe r = load_recipe("te-nvfp4");
  const int64_t L = 52;  // the 8B's depth
  EXPECT_TRUE(r.quantizes(linear(0, LinearKind::mamba_in_proj), L));
  EXPECT_TRUE(r.quantizes(linear(43, LinearKind::mlp_up), L));
  EXPECT_FALSE(r.quantizes(linear(44, LinearKind::mlp_up), L));  // last 8 blocks (15% of 52) in BF16
  EXPECT_FALSE(r.quantizes(linear(20, LinearKind::lm_head), L));
  EXPECT_EQ(r.gemm.kind, GemmModel::Kind::fp32);
  const auto s = r.resolve(linear(3, LinearKind::attn_q), L);
  for (Role role : kRoles) {
    const QuantSpec& q = s[role_index(role)].q;
    SCOPED_TRACE(std::string(role_name(role)));
    EXPECT_EQ(format_name(q.elem), "e2m1");
    EXPECT_EQ(format_name(*q.scale), "ue4m3");
    EXPECT_EQ(q.arith, Arith::fp32);
    EXPECT_FALSE(q.scale_target.has_value());  // default: Fs.max = 448
    EXPECT_EQ(s[role_index(role)].reference.kind, RefPolicy::Kind::current);
    const bool weight = role == Role::fprop_w || role == Role::dgrad_w;
    EXPECT_EQ(q.block_rows, weight ? 16 : 1);
    EXPECT_EQ(q.block_cols, 16);
    const bool dy = role == Role::dgrad_dy || role == Role::wgrad_dy;
    EXPECT_EQ(q.round, dy ? Round::stochastic_fastest : Round::rne);
    if (dy) {
      EXPECT_EQ(q.sr_bits, 8);
    }
    EXPECT_EQ(q.rht, role_gemm(role) == Gemm::wgrad);
    EXPECT_EQ(q.rht_signs, 0xD7E8);
  }
}

TEST(Recipe, Ue5m3B16AndItsVariants) {
  const Recipe r = load_recipe("ue5m3-b16");
  const int64_t L = 52;  // the 8B's depth: the 2048 override covers blocks 44..51
  EXPECT_TRUE(r.quantizes(linear(51, LinearKind::mlp_down), L));
  EXPECT_TRUE(r.shared_dy_reference);
  EXPECT_EQ(r.gemm, (GemmModel{GemmModel::Kind::grouped, 64, Round::rne, Round::rtz, 1024}));
  const auto early = r.resolve(linear(3, LinearKind::mlp_down), L);
  const auto late = r.resolve(linear(45, LinearKind::mlp_down), L);
  const auto late_up = r.resolve(linear(45, LinearKind::mlp_up), L);
  const auto before = r.resolve(linear(43, LinearKind::mlp_down), L);
  EXPECT_EQ(*before[role_index(Role::wgrad_dy)].q.scale_target, 448);
  for (Role role : kRoles) {
    SCOPED_TRACE(std::string(role_name(role)));
    const size_t i = role_index(role);
    EXPECT_EQ(format_name(*early[i].q.scale), "ue5m3");
    EXPECT_EQ(early[i].q.zero_scale, ZeroScale::one);
    EXPECT_EQ(early[i].reference, (RefPolicy{RefPolicy::Kind::periodic, 50}));
    EXPECT_EQ(*early[i].q.scale_target, 448);
    EXPECT_EQ(*late_up[i].q.scale_target, 448);
    EXPECT_EQ(*late[i].q.scale_target, role == Role::wgrad_dy ? 2048 : 448);
    const bool dy = role == Role::dgrad_dy || role == Role::wgrad_dy;
    EXPECT_EQ(early[i].q.round, dy ? Round::stochastic_fast : Round::rne);
    EXPECT_FALSE(early[i].q.rht);
  }
  EXPECT_EQ(load_recipe("ue5m3-b16-fp32gemm").gemm.kind, GemmModel::Kind::fp32);
  const auto b32 = load_recipe("ue5m3-b32").resolve(linear(0, LinearKind::mlp_up), L);
  EXPECT_EQ(b32[role_index(Role::fprop_x)].q.block_cols, 32);
  EXPECT_EQ(b32[role_index(Role::dgrad_w)].q.block_rows, 32);
  const Recipe te5 = load_recipe("ue5m3-te-settings");
  EXPECT_EQ(te5.keep_last_bf16, (BlockCount{150000, true}));  // 15%
  EXPECT_EQ(te5.keep_last_bf16.of(L), 8);
  EXPECT_EQ(format_name(*te5.resolve(linear(0, LinearKind::mlp_up), L)[0].q.scale), "ue5m3");
  const Recipe norht = load_recipe("nvfp4-no-rht-all");
  EXPECT_EQ(norht.keep_last_bf16, BlockCount{});
  EXPECT_FALSE(norht.resolve(linear(0, LinearKind::mlp_up), L)[role_index(Role::wgrad_x)].q.rht);
}

TEST(Recipe, MxAndFp8) {
  const auto mx = load_recipe("mxfp8").resolve(linear(0, LinearKind::attn_o), 4);
  for (const auto& s : mx) {
    EXPECT_EQ(format_name(s.q.elem), "e4m3");
    EXPECT_EQ(format_name(*s.q.scale), "ue8m0");
    EXPECT_EQ(s.q.rule, ScaleRule::mx_floor);
    EXPECT_EQ(s.q.block_cols, 32);
    EXPECT_EQ(s.reference.kind, RefPolicy::Kind::none);
  }
  const auto fp8 = load_recipe("fp8-current").resolve(linear(0, LinearKind::attn_o), 4);
  for (const auto& s : fp8) {
    EXPECT_FALSE(s.q.scale.has_value());
    EXPECT_EQ(s.reference.kind, RefPolicy::Kind::current);
  }
  EXPECT_FALSE(load_recipe("bf16").quantize);
  EXPECT_EQ(load_recipe("fp32").unquantized, "fp32");
}

// nvfp4-h32-wgrad: te-nvfp4 with the 32-point transform on both wgrad
// operands, the other roles without one.
TEST(Recipe, H32WgradRecipe) {
  const Recipe r = load_recipe("nvfp4-h32-wgrad");
  const auto s = r.resolve(linear(0, LinearKind::mlp_up), 24);
  for (Role role : kRoles) {
    const QuantSpec& q = s[role_index(role)].q;
    EXPECT_EQ(q.rht, role_gemm(role) == Gemm::wgrad) << role_name(role);
    if (q.rht) {
      EXPECT_EQ(q.rht_size, 32);
      EXPECT_EQ(q.rht_kind, RhtKind::random);
      EXPECT_EQ(q.rht_signs, 0xD7E8);
      EXPECT_NE(role_spec_string(s[role_index(role)]).find("rht_size=32"), std::string::npos);
    }
  }
  // deterministic signs on every role load (only the wgrad roles have the
  // transform); on one operand alone they do not
  Recipe d = r;
  apply_recipe_override(d, "recipe.all.rht_kind", "deterministic");
  EXPECT_EQ(d.resolve(linear(0, LinearKind::mlp_up), 24)[role_index(Role::wgrad_x)].q.rht_kind,
            RhtKind::deterministic);
  Recipe one = r;
  expect_one_line_naming(error_of([&] { apply_recipe_override(one, "recipe.wgrad-x.rht_kind", "deterministic"); }),
                         "same size, kind and signs");
}

// Row outer scales: on the activations and gradients only; held row by row
// where the rows persist (the wgrad operands), never on token rows.
TEST(Recipe, RowScaledRecipe) {
  const Recipe r = load_recipe("nvfp4-row-scaled");
  const auto s = r.resolve(linear(0, LinearKind::mlp_up), 24);
  for (Role role : kRoles) {
    const bool weights = role == Role::fprop_w || role == Role::dgrad_w;
    EXPECT_EQ(s[role_index(role)].q.outer, weights ? OuterScale::tensor : OuterScale::row) << role_name(role);
    EXPECT_EQ(role_spec_string(s[role_index(role)]).find("outer_scale=row") != std::string::npos, !weights);
  }
  Recipe held = r;
  apply_recipe_override(held, "recipe.wgrad-x.reference", "periodic:50");
  apply_recipe_override(held, "recipe.wgrad-dy.reference", "delayed:4");
  EXPECT_EQ(held.resolve(linear(0, LinearKind::mlp_up), 24)[role_index(Role::wgrad_x)].reference.kind,
            RefPolicy::Kind::periodic);
  for (const char* token_role : {"fprop-x", "dgrad-dy"}) {
    Recipe bad = r;
    expect_one_line_naming(
        error_of([&] { apply_recipe_override(bad, std::string("recipe.") + token_role + ".reference", "periodic:50"); }),
        std::string(token_role) + " are tokens");
  }
  Recipe blocks = r;
  expect_one_line_naming(error_of([&] { apply_recipe_override(blocks, "recipe.weights.outer_scale", "row"); }),
                         "needs blocks along rows (1xB), got 16x16");
  Recipe shared = r;
  apply_recipe_override(shared, "recipe.dgrad-dy.outer_scale", "tensor");
  expect_one_line_naming(error_of([&] { apply_recipe_override(shared, "recipe.shared_dy_reference", "true"); }),
                         "outer_scale setting");
}

const char* kSmall = R"(
[recipe]
description = small
layers = all
[all]
elem = e2m1
scale = ue4m3
)";

TEST(Recipe, ResolutionOrder) {
  const Recipe r = parse_recipe(std::string(kSmall) + R"(
[weights]
round = rtz
[dgrad-w]
round = rna
[override.a]
layers = 0,2-3
kinds = up_proj,down_proj
roles = dgrad
round = up
[override.b]
roles = fprop-w
layers = last:1
round = down
)",
                                "t", "text");
  auto round_of = [&](int layer, LinearKind k, Role role) { return r.resolve(linear(layer, k), 6)[role_index(role)].q.round; };
  EXPECT_EQ(round_of(1, LinearKind::mlp_up, Role::fprop_x), Round::rne);
  EXPECT_EQ(round_of(1, LinearKind::mlp_up, Role::fprop_w), Round::rtz);
  EXPECT_EQ(round_of(1, LinearKind::mlp_up, Role::dgrad_w), Round::rna);
  EXPECT_EQ(round_of(2, LinearKind::mlp_up, Role::dgrad_w), Round::up);   // override a: blocks 0,2,3
  EXPECT_EQ(round_of(2, LinearKind::mlp_up, Role::dgrad_dy), Round::up);
  EXPECT_EQ(round_of(2, LinearKind::attn_q, Role::dgrad_w), Round::rna);  // kind not selected
  EXPECT_EQ(round_of(5, LinearKind::attn_q, Role::fprop_w), Round::down); // override b: last block
  EXPECT_EQ(round_of(4, LinearKind::attn_q, Role::fprop_w), Round::rtz);
}

TEST(Recipe, SetOverrides) {
  Recipe r = load_recipe("te-nvfp4");
  apply_recipe_override(r, "recipe.wgrad-dy.round", "rne");
  apply_recipe_override(r, "recipe.keep_last_bf16=2");
  apply_recipe_override(r, "recipe.gemm.model=grouped");
  apply_recipe_override(r, "recipe.gemm.grid=1024");
  apply_recipe_override(r, "recipe.override.late.layers=last:3");
  apply_recipe_override(r, "recipe.override.late.roles=wgrad-dy");
  apply_recipe_override(r, "recipe.override.late.scale_target=256");  // at most ue4m3's 448
  EXPECT_EQ(r.keep_last_bf16, BlockCount{2});
  EXPECT_EQ(r.gemm.kind, GemmModel::Kind::grouped);
  EXPECT_EQ(r.gemm.grid, 1024);
  const auto s = r.resolve(linear(7, LinearKind::mlp_down), 10);
  EXPECT_EQ(s[role_index(Role::wgrad_dy)].q.round, Round::rne);
  EXPECT_EQ(*s[role_index(Role::wgrad_dy)].q.scale_target, 256);
  EXPECT_FALSE(s[role_index(Role::dgrad_dy)].q.scale_target.has_value());
  // The --set value survives the text form (run files keep it).
  const Recipe back = parse_recipe(recipe_to_ini(r), r.name, "rt");
  EXPECT_EQ(body(back), body(r));

  expect_one_line_naming(error_of([&] { apply_recipe_override(r, "recipe.all.rounding", "rne"); }), "all.rounding");
  expect_one_line_naming(error_of([&] { apply_recipe_override(r, "recipe.all.round", "nearest"); }), "nearest");
  expect_one_line_naming(error_of([&] { apply_recipe_override(r, "recipe.fprop.round", "rne"); }), "fprop");
  expect_one_line_naming(error_of([&] { apply_recipe_override(r, "recipe.base", "bf16"); }), "base");
  expect_one_line_naming(error_of([&] { apply_recipe_override(r, "recipe.gemm.group", "0"); }), "gemm.group");
  // A setting that breaks a cross-role rule is refused.
  expect_one_line_naming(error_of([&] { apply_recipe_override(r, "recipe.wgrad-x.rht", "false"); }),
                         "wgrad-x.rht=false");
}

// A recipe reads a QuantSpec knob exactly as `exmy quantize` and the sweep
// grids do (the knob table of formats/vocab.hpp): rht_signs = 1234 is 0x04D2
// (it was 0x1234 in recipes alone), and booleans have one set of spellings.
TEST(Recipe, KnobValuesAreReadAsEverywhereElse) {
  auto q_of = [](const std::string& lines) {
    const Recipe r = parse_recipe(std::string(kSmall) + lines, "t", "text");
    return r.resolve(linear(1, LinearKind::mlp_up), 4)[role_index(Role::fprop_x)].q;
  };
  for (const char* v : {"1234", "0x04D2", "0x04d2", "0X4D2"}) {
    QuantSpec cli;
    set_knob(cli, "rht-signs", v);
    EXPECT_EQ(q_of(std::string("rht_signs = ") + v + "\n").rht_signs, cli.rht_signs) << v;
    EXPECT_EQ(cli.rht_signs, 0x04D2) << v;
  }
  EXPECT_EQ(q_of("rht_signs = 0x1234\n").rht_signs, 0x1234);
  EXPECT_EQ(q_of("sr_bits = 0x10\n").sr_bits, 16);
  for (const char* t : {"true", "on"}) EXPECT_TRUE(q_of(std::string("saturate = ") + t + "\n").saturate) << t;
  for (const char* f : {"false", "off"}) EXPECT_FALSE(q_of(std::string("saturate = ") + f + "\n").saturate) << f;
  // Every knob a recipe takes prints in role_spec_string and reads back.
  RoleSpec s;
  s.q = q_of("round = stochastic\nsr_bits = 7\nrht_signs = 4660\nscale_target = 300\n");
  for (const QuantKnob& k : quant_knobs()) {
    if (!k.in_recipe) continue;
    const std::string text = role_spec_string(s);
    EXPECT_NE(text.find(std::string(k.name) + "=" + k.print(s.q)), std::string::npos) << k.name << ": " << text;
  }
  EXPECT_EQ(role_knob_names().size(), 19u);  // four_over_six the 16th, rht_size, rht_kind, outer_scale
}

TEST(Recipe, BadRecipesAreRejectedNamingTheKey) {
  auto err = [](const std::string& text) { return error_of([&] { parse_recipe(text, "bad", "bad.ini"); }); };
  expect_one_line_naming(err(std::string(kSmall) + "rounding = rne\n"), "all.rounding");
  expect_one_line_naming(err(std::string(kSmall) + "rounding = rne\n"), "bad.ini:8");
  expect_one_line_naming(err(std::string(kSmall) + "round = sometimes\n"), "all.round");
  expect_one_line_naming(err(std::string(kSmall) + "block = 16x1\n"), "all.block");
  expect_one_line_naming(err(std::string(kSmall) + "block = 3x5\n"), "all.block");
  expect_one_line_naming(err(std::string(kSmall) + "reference = periodic:0\n"), "all.reference");
  expect_one_line_naming(err(std::string(kSmall) + "reference = delayed\n"), "all.reference");
  expect_one_line_naming(err(std::string(kSmall) + "sr_bits = 33\n"), "all.sr_bits");
  expect_one_line_naming(err(std::string(kSmall) + "rht_signs = 0x1FFFF\n"), "all.rht_signs");
  expect_one_line_naming(err(std::string(kSmall) + "rht_size = 48\n"), "all.rht_size");
  expect_one_line_naming(err(std::string(kSmall) + "rht_kind = fixed\n"), "all.rht_kind");
  expect_one_line_naming(
      err(std::string(kSmall) + "[wgrad-x]\nrht = true\nrht_size = 32\n[wgrad-dy]\nrht = true\n"), "same size");
  expect_one_line_naming(
      err(std::string(kSmall) + "[wgrad-x]\nrht = true\nrht_kind = deterministic\n[wgrad-dy]\nrht = true\n"),
      "same size, kind");
  expect_one_line_naming(err(std::string(kSmall) + "[fprop-x]\nelem = e9m1\n"), "fprop-x.elem");
  expect_one_line_naming(err(std::string(kSmall) + "scale_target = -4\n"), "all.scale_target");
  expect_one_line_naming(err(std::string(kSmall) + "saturate = yes\n"), "all.saturate");
  expect_one_line_naming(err(std::string(kSmall) + "[bogus]\nx = 1\n"), "bogus");
  expect_one_line_naming(err(std::string(kSmall) + "[gemm]\nmodel = tensor-core\n"), "gemm.model");
  expect_one_line_naming(err(std::string(kSmall) + "[gemm]\naccumulate = rna\n"), "gemm.accumulate");
  expect_one_line_naming(err(std::string(kSmall) + "[override.x]\nlayers = last\n"), "override.x.layers");
  expect_one_line_naming(err(std::string(kSmall) + "[override.x]\nkinds = gate_proj\n"), "override.x.kinds");
  expect_one_line_naming(err(std::string(kSmall) + "[override.x]\nroles = fprop-y\n"), "override.x.roles");
  expect_one_line_naming(err(std::string(kSmall) + "[override.x]\nround = ?\n"), "override.x.round");
  expect_one_line_naming(err(std::string(kSmall) + "[override.x]\nbogus = 1\n"), "override.x.bogus");
  expect_one_line_naming(err(std::string(kSmall) + "elem = e2m1\n"), "all.elem' given twice");
  expect_one_line_naming(err(std::string(kSmall) + "just words\n"), "key = value");
  expect_one_line_naming(err("[recipe]\nlayers = all\n"), "no element format");
  expect_one_line_naming(err("[recipe]\nbase = nonexistent\n"), "nonexistent");
  expect_one_line_naming(err(std::string(kSmall) + "[wgrad-x]\nrht = true\n"), "Hadamard");
  expect_one_line_naming(err(std::string(kSmall) + "[fprop-w]\nblock = 16x16\n"), "2D weight tiles");
  expect_one_line_naming(err(std::string(kSmall) + "[recipe]\n"), "appears twice");
  expect_one_line_naming(err(std::string(kSmall) + "[fprop-x]\nblock = 1x32\nrht = true\n[fprop-w]\nrht = true\n"),
                         "rht needs a 1x16");
  expect_one_line_naming(
      err(std::string("[recipe]\nlayers = all\nshared_dy_reference = true\n[all]\nelem = e2m1\nreference = periodic:5\n") +
          "[wgrad-dy]\nreference = current\n"),
      "shared_dy_reference");
  // An override that breaks a rule on its own is refused at load.
  expect_one_line_naming(err(std::string(kSmall) + "[override.z]\nroles = wgrad-dy\nrht = true\n"), "override.z");
  expect_one_line_naming(error_of([] { load_recipe("no-such-recipe"); }), "te-nvfp4");
}

TEST(Recipe, RecipeDirOverride) {
  set_recipe_dir("/nonexistent-dir");
  EXPECT_TRUE(recipe_names().empty());
  EXPECT_THROW(load_recipe("bf16"), Error);
  set_recipe_dir("");
  EXPECT_NO_THROW(load_recipe("bf16"));
}

TEST(Recipe, Selectors) {
  EXPECT_TRUE(parse_block_selector("last:2").matches(8, 10));
  EXPECT_FALSE(parse_block_selector("last:2").matches(7, 10));
  EXPECT_FALSE(parse_block_selector("last:2").matches(10, 10));  // the LM head is not a block
  EXPECT_TRUE(parse_block_selector("first:1").matches(0, 10));
  EXPECT_FALSE(parse_block_selector("first:1").matches(1, 10));
  const BlockSelector l = parse_block_selector("1,4-6");
  EXPECT_EQ(block_selector_name(l), "1,4-6");
  EXPECT_TRUE(l.matches(5, 10));
  EXPECT_FALSE(l.matches(3, 10));
  EXPECT_EQ(ref_policy_name(parse_ref_policy("periodic:50")), "periodic:50");
  EXPECT_EQ(ref_policy_name(parse_ref_policy("delayed:16")), "delayed:16");
  EXPECT_THROW(parse_ref_policy("periodic:x"), Error);
}

// A fraction p% of L blocks is floor(p·L/100 + 1/2) (docs/recipes.md); the
// expected counts are that formula worked by hand.
TEST(Recipe, BlockCountsAreFractionsOfTheDepth) {
  const BlockCount p15 = parse_block_count("15%");
  EXPECT_EQ(p15.of(52), 8);  // 7.8
  EXPECT_EQ(p15.of(13), 2);  // 1.95
  EXPECT_EQ(p15.of(8), 1);   // 1.2
  EXPECT_EQ(p15.of(5), 1);   // 0.75
  EXPECT_EQ(p15.of(3), 0);   // 0.45
  const BlockCount p125 = parse_block_count("12.5%");
  EXPECT_EQ(p125.of(4), 1);   // 0.5: half up
  EXPECT_EQ(p125.of(12), 2);  // 1.5
  EXPECT_EQ(p125.of(11), 1);  // 1.375
  EXPECT_EQ(parse_block_count("100%").of(7), 7);
  EXPECT_EQ(parse_block_count("0%").of(52), 0);
  EXPECT_EQ(parse_block_count("8").of(3), 8);  // absolute counts are not scaled
  EXPECT_EQ(block_count_name(p15), "15%");
  EXPECT_EQ(block_count_name(p125), "12.5%");
  EXPECT_EQ(block_count_name(parse_block_count("0.0625%")), "0.0625%");
  EXPECT_EQ(block_count_name(parse_block_count("7")), "7");
  for (const char* bad : {"101%", "15.00001%", "%", "1.%", "-1%", "x%", "15 %", "-2", "1e3"}) {
    SCOPED_TRACE(bad);
    expect_one_line_naming(error_of([&] { parse_block_count(bad); }), bad);
  }
  const BlockSelector last = parse_block_selector("last:15%");
  EXPECT_EQ(block_selector_name(last), "last:15%");
  EXPECT_TRUE(last.matches(44, 52));
  EXPECT_FALSE(last.matches(43, 52));
  EXPECT_TRUE(last.matches(11, 13));
  EXPECT_FALSE(last.matches(10, 13));
  EXPECT_TRUE(parse_block_selector("first:50%").matches(2, 5));   // 2.5 -> 3 blocks
  EXPECT_FALSE(parse_block_selector("first:50%").matches(3, 5));
  expect_one_line_naming(error_of([] { parse_block_selector("last:200%"); }), "last:200%");
  // keep_*_bf16 take the same counts, and the text form keeps them.
  Recipe r = load_recipe("mxfp4");
  apply_recipe_override(r, "recipe.keep_first_bf16=12.5%");
  EXPECT_FALSE(r.quantizes(linear(1, LinearKind::mlp_up), 12));
  EXPECT_TRUE(r.quantizes(linear(2, LinearKind::mlp_up), 12));
  EXPECT_NE(recipe_to_ini(r).find("keep_first_bf16 = 12.5%"), std::string::npos);
}

// The shipped selections give the published 8B behaviour (8 of its 52 blocks
// in BF16 for te-nvfp4; the 2048 target on 4 of its 24 MLPs for ue5m3-b16)
// and scale with the depth of a proxy.
TEST(Recipe, ShippedLayerSelectionsScaleWithDepth) {
  const models::NemotronHConfig study = [] {
    auto c = models::preset_config("proxy-1m");
    c.hybrid_override_pattern = "M-M-M-M*-M-M-";  // experiments/ue5m3-proxy/base.ini
    c.num_hidden_layers = 13;
    return c;
  }();
  for (const auto& [cfg, kept, mlps, all_mlps] :
       {std::tuple{models::preset_config("nemotron-h-8b"), 8, 4, 24}, std::tuple{study, 2, 1, 6},
        std::tuple{models::preset_config("proxy-tiny"), 1, 1, 2}}) {
    SCOPED_TRACE(cfg.name);
    const int64_t L = cfg.num_hidden_layers;
    for (const char* name : {"te-nvfp4", "ue5m3-te-settings", "te-nvfp4-grouped"}) {
      const Recipe te = load_recipe(name);
      int64_t not_quantized = 0;
      for (int64_t b = 0; b < L; ++b) not_quantized += !te.quantizes(linear(static_cast<int>(b), LinearKind::mlp_up), L);
      EXPECT_EQ(not_quantized, kept) << name;
    }
    const Recipe u = load_recipe("ue5m3-b16");
    int64_t mlp = 0, overridden = 0;
    for (int64_t b = 0; b < L; ++b) {
      if (cfg.hybrid_override_pattern[static_cast<size_t>(b)] != '-') continue;
      ++mlp;
      const auto s = u.resolve(linear(static_cast<int>(b), LinearKind::mlp_down), L);
      overridden += *s[role_index(Role::wgrad_dy)].q.scale_target == 2048;
    }
    EXPECT_EQ(mlp, all_mlps);
    EXPECT_EQ(overridden, mlps);
  }
}

TEST(Recipe, GroupedVariantsDifferOnlyInTheGemmModel) {
  const GemmModel native = load_recipe("ue5m3-b16").gemm;
  for (const auto& [base, grouped] : {std::pair{"te-nvfp4", "te-nvfp4-grouped"},
                                      std::pair{"nvfp4-no-rht-all", "nvfp4-no-rht-all-grouped"}}) {
    SCOPED_TRACE(grouped);
    const Recipe a = load_recipe(base), b = load_recipe(grouped);
    EXPECT_EQ(a.gemm.kind, GemmModel::Kind::fp32);
    EXPECT_EQ(b.gemm, native);
    EXPECT_EQ(a.keep_last_bf16, b.keep_last_bf16);
    for (int layer : {0, 30, 51}) {
      if (!a.quantizes(linear(layer, LinearKind::attn_q), 52)) continue;
      const auto sa = a.resolve(linear(layer, LinearKind::attn_q), 52);
      const auto sb = b.resolve(linear(layer, LinearKind::attn_q), 52);
      for (Role role : kRoles) EXPECT_EQ(role_spec_string(sa[role_index(role)]), role_spec_string(sb[role_index(role)]));
    }
  }
  // ue5m3-te-settings: TE's global scale 6·448/amax, i.e. T = 448 with UE5M3 scales.
  const auto te5 = load_recipe("ue5m3-te-settings").resolve(linear(0, LinearKind::mlp_up), 52);
  for (const auto& s : te5) EXPECT_EQ(*s.q.scale_target, 448);
}

TEST(Recipe, ImpossibleKnobValuesAreOneLineErrorsAtLoad) {
  auto parse = [](const std::string& extra) { return parse_recipe(std::string(kSmall) + extra, "bad", "text"); };
  struct Case {
    std::string text, names1, names2;
  };
  for (const auto& c : std::vector<Case>{
           {"[weights]\nelem = ue4m3\n", "fprop-w: elem", "unsigned"},
           {"[gradients]\nelem = e0m3\n", "dgrad-dy: elem", "float format"},
           {"[fprop-x]\nscale_target = 1000\n", "fprop-x: scale_target", "largest ue4m3 block scale 448"},
           {"[fprop-x]\nscale_target = 1e-4\n", "fprop-x: scale_target", "smallest ue4m3"},
           {"[wgrad-x]\nscale = none\nscale_target = 448\n", "wgrad-x: scale_target", "without a block scale"},
           {"[override.o]\nroles = wgrad-dy\nscale_target = 61440\n", "override.o: wgrad-dy: scale_target",
            "largest ue4m3"},
       }) {
    SCOPED_TRACE(c.text);
    const std::string msg = error_of([&] { parse(c.text); });
    expect_one_line_naming(msg, c.names1);
    expect_one_line_naming(msg, c.names2);
    expect_one_line_naming(msg, "recipe 'bad'");
  }
  Recipe r = load_recipe("te-nvfp4");
  expect_one_line_naming(error_of([&] { apply_recipe_override(r, "recipe.gradients.scale_target=1e6"); }),
                         "dgrad-dy: scale_target");
  // The scale-first dequantization is an order of fp32 arithmetic.
  expect_one_line_naming(error_of([&] { parse("[fprop-x]\narith = exact\ndequant = scale-first\n"); }),
                         "fprop-x");
  expect_one_line_naming(error_of([&] { parse("[fprop-x]\ndequant = last\n"); }), "product-first or scale-first");
  {
    const Recipe d = parse("[fprop-x]\narith = fp32\ndequant = scale-first\n");
    const auto s = d.resolve(linear(0, LinearKind::mlp_down), 4);
    EXPECT_EQ(s[role_index(Role::fprop_x)].q.dequant, DequantOrder::scale_first);
    EXPECT_EQ(s[role_index(Role::fprop_w)].q.dequant, DequantOrder::product_first);
    EXPECT_EQ(body(parse_recipe(recipe_to_ini(d), d.name, "rt")), body(d));
  }
  // Within range is fine, UE5M3's wider range included.
  EXPECT_NO_THROW(parse("[fprop-x]\nscale_target = 448\n"));
  EXPECT_NO_THROW(parse("[fprop-x]\nscale = ue5m3\nscale_target = 61440\n"));
}

// Named recipes are looked up in the working directory's experiments/recipes
// first, then in the source tree's.
TEST(Recipe, NamesResolveInTheWorkingDirectoryFirst) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("exmy-recipe-cwd-" + std::to_string(::getpid()));
  fs::create_directories(dir / "experiments/recipes");
  std::ofstream(dir / "experiments/recipes/te-nvfp4.ini") << "[recipe]\ndescription = the local one\nlayers = none\n";
  std::ofstream(dir / "experiments/recipes/mine.ini") << "[recipe]\ndescription = only here\nlayers = none\n";
  const fs::path cwd = fs::current_path();
  const char* env = std::getenv("EXMY_RECIPE_DIR");
  const std::string saved = env ? env : "";
  ::unsetenv("EXMY_RECIPE_DIR");
  fs::current_path(dir);
  const std::string local = load_recipe("te-nvfp4").description;
  const std::string mine = load_recipe("mine").description;
  const std::string shipped = load_recipe("ue5m3-b16").name;
  const auto dirs = recipe_dirs();
  const auto names = recipe_names();
  fs::current_path(cwd);
  if (!saved.empty()) ::setenv("EXMY_RECIPE_DIR", saved.c_str(), 1);
  fs::remove_all(dir);
  EXPECT_EQ(local, "the local one");
  EXPECT_EQ(mine, "only here");
  EXPECT_EQ(shipped, "ue5m3-b16");  // not in the working directory: the source tree's
  ASSERT_GE(dirs.size(), 2u);
  EXPECT_EQ(dirs[0], "experiments/recipes");
  EXPECT_EQ(std::count(names.begin(), names.end(), "te-nvfp4"), 1);
  EXPECT_EQ(std::count(names.begin(), names.end(), "mine"), 1);
  EXPECT_NE(std::find(names.begin(), names.end(), "ue5m3-b16"), names.end());
}

}  // namespace
}  // namespace exmy::sim::quant

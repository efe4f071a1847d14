// Recipes: the shipped files, parsing, resolution, overrides, errors.
#include <gtest/gtest.h>

#include <algorithm>

#include "formats/error.hpp"
#include "formats/spec.hpp"
#include "sim/quant/recipe.hpp"

namespace exmy::sim::quant {
namespace {

// recipe_to_ini without its first line (a comment naming the origin).
std::string body(const Recipe& r) {
  const std::string t = recipe_to_ini(r);
  return t.substr(t.find('\n') + 1);
}

const std::vector<std::string> kShipped = {"bf16",      "fp32",      "te-nvfp4",          "nvfp4-no-rht-all",
                                           "ue5m3-b16", "ue5m3-b16-fp32gemm", "ue5m3-b32", "ue5m3-te-settings",
                                           "mxfp4",     "mxfp8",     "fp8-current"};

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
  const int64_t L = 20;
  EXPECT_TRUE(r.quantizes(linear(0, LinearKind::mamba_in_proj), L));
  EXPECT_TRUE(r.quantizes(linear(11, LinearKind::mlp_up), L));
  EXPECT_FALSE(r.quantizes(linear(12, LinearKind::mlp_up), L));  // last 8 blocks in BF16
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
  const int64_t L = 24;
  EXPECT_TRUE(r.quantizes(linear(23, LinearKind::mlp_down), L));
  EXPECT_TRUE(r.shared_dy_reference);
  EXPECT_EQ(r.gemm, (GemmModel{GemmModel::Kind::grouped, 64, Round::rne, Round::rtz, 1024}));
  const auto early = r.resolve(linear(3, LinearKind::mlp_down), L);
  const auto late = r.resolve(linear(17, LinearKind::mlp_down), L);
  const auto late_up = r.resolve(linear(17, LinearKind::mlp_up), L);
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
  EXPECT_EQ(te5.keep_last_bf16, 8);
  EXPECT_EQ(format_name(*te5.resolve(linear(0, LinearKind::mlp_up), L)[0].q.scale), "ue5m3");
  const Recipe norht = load_recipe("nvfp4-no-rht-all");
  EXPECT_EQ(norht.keep_last_bf16, 0);
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
  apply_recipe_override(r, "recipe.override.late.scale_target=2048");
  EXPECT_EQ(r.keep_last_bf16, 2);
  EXPECT_EQ(r.gemm.kind, GemmModel::Kind::grouped);
  EXPECT_EQ(r.gemm.grid, 1024);
  const auto s = r.resolve(linear(7, LinearKind::mlp_down), 10);
  EXPECT_EQ(s[role_index(Role::wgrad_dy)].q.round, Round::rne);
  EXPECT_EQ(*s[role_index(Role::wgrad_dy)].q.scale_target, 2048);
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

}  // namespace
}  // namespace exmy::sim::quant

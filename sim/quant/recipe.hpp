// Quantized training recipes (docs/recipes.md): what happens to each of the
// six GEMM operands of every linear layer.
//
// A recipe is a layered set of knob = value settings read from an INI file
// (experiments/recipes/NAME.ini; docs/recipes.md describes every knob):
//
//   [recipe]            layer selection, the precision of unquantized layers,
//                       the shared dY reference, an optional `base` recipe
//   [gemm]              the GEMM output model (fp32 | grouped)
//   [all]               role knobs for all six roles
//   [activations]       ... for fprop-x and wgrad-x
//   [weights]           ... for fprop-w and dgrad-w
//   [gradients]         ... for dgrad-dy and wgrad-dy
//   [fprop-x] ...       ... for one role
//   [override.NAME]     role knobs for selected layers/kinds/roles
//
// A role's spec for a linear is resolved by applying, in this order: the
// defaults, [all], the role's group, the role's own section, then every
// override that selects the linear and the role, in file order. Every key
// and value is validated when it is read; a bad one is an exmy::Error naming
// the key.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "formats/quantize.hpp"
#include "sim/linear.hpp"

namespace exmy::sim::quant {

// The three GEMMs of a linear layer and the six operand roles (docs/recipes.md §1).
// The numeric values are part of the stream derivation (docs/recipes.md):
// never reorder them.
enum class Gemm : uint8_t { fprop = 0, dgrad = 1, wgrad = 2 };
enum class Role : uint8_t { fprop_x = 0, fprop_w = 1, dgrad_dy = 2, dgrad_w = 3, wgrad_dy = 4, wgrad_x = 5 };
inline constexpr int kNumRoles = 6;
inline constexpr std::array<Role, kNumRoles> kRoles = {Role::fprop_x, Role::fprop_w,  Role::dgrad_dy,
                                                       Role::dgrad_w, Role::wgrad_dy, Role::wgrad_x};

std::string_view role_name(Role r);  // "fprop-x", ...
std::string_view gemm_name(Gemm g);  // "fprop", "dgrad", "wgrad"
Role parse_role(std::string_view s); // throws exmy::Error
Gemm role_gemm(Role r);
// The two roles of a GEMM: {left operand (rows M of the output), right operand (columns N)}.
std::array<Role, 2> gemm_roles(Gemm g);
inline int role_index(Role r) { return static_cast<int>(r); }

// Tensor-reference policy of a role (docs/recipes.md §5).
struct RefPolicy {
  enum class Kind : uint8_t { current, periodic, delayed, none };
  Kind kind = Kind::current;
  int64_t n = 0;  // D of periodic:D, L of delayed:L
  bool operator==(const RefPolicy&) const = default;
};
RefPolicy parse_ref_policy(std::string_view s);  // current | none | periodic:D | delayed:L
std::string ref_policy_name(const RefPolicy& p);

// The resolved settings of one role of one linear. `q` holds every
// quantization knob; its amax_kind/amax_value (the tensor reference), seed
// and stream are filled in per call by the quantized linear.
struct RoleSpec {
  QuantSpec q;
  RefPolicy reference;
  // pre_round = bf16: the high-precision operand is rounded to BF16 (RNE)
  // before anything else (reference amax, RHT, quantization), as a BF16
  // trainer with FP4 GEMMs (TE, Megatron) hands its BF16 tensors to the
  // quantizer. Default none: the tensor the model passes (FP32 master
  // weights) is quantized as it is.
  bool pre_round_bf16 = false;
};
// "elem=e2m1 scale=ue4m3 block=1x16 ..." (every knob, canonical values).
std::string role_spec_string(const RoleSpec& s);

// The GEMM output model (docs/recipes.md §6).
struct GemmModel {
  enum class Kind : uint8_t { fp32, grouped };
  Kind kind = Kind::fp32;
  int64_t group = 64;              // G: products per group
  Round group_round = Round::rne;  // exact group sum -> FP32 (rne | rtz)
  Round accumulate = Round::rne;   // FP32 accumulator additions (rne | rtz)
  int64_t grid = 0;                // d of the output grid RNE(d*c)/d; 0 = no grid
  bool operator==(const GemmModel&) const = default;
};

// Ordered knob = value settings of one section; every value is checked when
// it is set. Setting a knob again replaces its value.
class KnobLayer {
 public:
  // Throws exmy::Error "<knob>: <problem>" for an unknown knob or bad value.
  void set(std::string_view knob, std::string_view value);
  void apply(RoleSpec& spec) const;
  const std::vector<std::pair<std::string, std::string>>& items() const { return items_; }
  bool empty() const { return items_.empty(); }

 private:
  std::vector<std::pair<std::string, std::string>> items_;
};

// The role knobs, in documentation order.
const std::vector<std::string>& role_knob_names();

// A number of blocks, absolute ("8") or a fraction of the model's depth
// ("15%", up to four decimals). A fraction p% of L blocks is
// round-half-up(p·L/100) = floor(p·L/100 + 1/2), computed exactly in
// integers: 15% of 52 blocks is 8 (7.8), of 13 blocks 2 (1.95), of 8
// blocks 1 (1.2), of 3 blocks 0 (0.45).
struct BlockCount {
  int64_t n = 0;         // blocks, or (percent) the percentage in units of 10^-4 %
  bool percent = false;
  int64_t of(int64_t num_blocks) const;  // the blocks it means on a model of num_blocks
  bool operator==(const BlockCount&) const = default;
};
BlockCount parse_block_count(std::string_view s);  // "N" or "P%"; throws exmy::Error
std::string block_count_name(const BlockCount& c); // canonical: "8", "15%", "12.5%"

// Which blocks (pattern layers) a setting applies to: all | first:C | last:C
// (C a BlockCount: first:2, last:15%) | a list of indices and ranges
// "0,3,5-7". The LM head has index num_blocks: only `all` or an explicit
// index selects it.
struct BlockSelector {
  enum class Kind : uint8_t { all, first, last, list };
  Kind kind = Kind::all;
  BlockCount n;
  std::vector<std::pair<int64_t, int64_t>> ranges;  // inclusive
  bool matches(int64_t block, int64_t num_blocks) const;
};
BlockSelector parse_block_selector(std::string_view s);
std::string block_selector_name(const BlockSelector& s);

struct Override {
  std::string name;
  BlockSelector layers;                 // default all
  std::vector<LinearKind> kinds;        // empty = all
  std::array<bool, kNumRoles> roles{};  // default all
  KnobLayer knobs;
  bool selects(const LinearInfo& info, Role r, int64_t num_blocks) const;
};

struct Recipe {
  std::string name;    // "te-nvfp4", or the file stem
  std::string origin;  // where it was read from (file path, "text")
  std::string description;

  // Layer selection: which linears are quantized (the rest run in
  // `unquantized` precision).
  bool quantize = false;          // layers = all | none
  BlockCount keep_first_bf16;     // blocks [0, k) unquantized (k = keep_first_bf16.of(L))
  BlockCount keep_last_bf16;      // blocks [L-k, L) unquantized
  // A recipe with layers = all that quantizes no linear of the model (the
  // kept blocks cover it and the LM head is not quantized) is an error at
  // start unless this is true.
  bool allow_no_quantized = false;
  bool lm_head = false;           // quantize the LM head
  std::string unquantized = "bf16";  // bf16 | fp32
  // One periodic/delayed dY reference per layer, used by dgrad-dy and
  // wgrad-dy (UE5M3 paper), instead of one per role.
  bool shared_dy_reference = false;

  GemmModel gemm;

  KnobLayer all, activations, weights, gradients;
  std::array<KnobLayer, kNumRoles> role;
  std::vector<Override> overrides;

  // True when `info` runs quantized.
  bool quantizes(const LinearInfo& info, int64_t num_blocks) const;
  // Throws exmy::Error when the recipe has layers = all but selects no
  // linear of a model of num_blocks blocks, unless allow_no_quantized.
  void check_selects_some(int64_t num_blocks) const;
  // The six resolved, validated role specs of a quantized linear; throws
  // exmy::Error naming the recipe and the layer.
  std::array<RoleSpec, kNumRoles> resolve(const LinearInfo& info, int64_t num_blocks) const;
};

// Parses recipe text (the INI format above). `name` names it in messages;
// `base_dir` is where `base = NAME` is looked up (default: recipe_dir()).
Recipe parse_recipe(std::string_view text, std::string_view name, std::string_view origin,
                    const std::string& base_dir = "");

// NAME, looked up as NAME.ini in recipe_dirs() in order (the first found
// wins), or a path to an .ini file.
Recipe load_recipe(const std::string& name_or_path);

// The folders named recipes are looked up in, in order: set_recipe_dir's
// value alone if set; else $EXMY_RECIPE_DIR (when set), the working
// directory's experiments/recipes, the source tree's experiments/recipes
// (compiled in); a folder reached twice is listed once.
std::vector<std::string> recipe_dirs();
std::string find_recipe(const std::string& name);  // the path load_recipe(name) reads, or ""
// The first existing folder of recipe_dirs() (where `base = NAME` of recipe
// text without a folder is looked up).
std::string recipe_dir();
void set_recipe_dir(const std::string& dir);  // "" restores the default
std::vector<std::string> recipe_names();      // NAME of every .ini in recipe_dirs(), sorted, once each

// `--set recipe.SECTION.KNOB=VALUE`: SECTION is recipe (also `recipe.KNOB`),
// gemm, all, activations, weights, gradients, a role, or override.NAME (a
// new override is appended). The recipe is validated again; throws
// exmy::Error naming the key.
void apply_recipe_override(Recipe& r, std::string_view key, std::string_view value);
void apply_recipe_override(Recipe& r, std::string_view assignment);  // "recipe.all.round=rne"

// The recipe as INI text (base recipes flattened in); parse_recipe of it
// gives the same recipe. Written into run files.
std::string recipe_to_ini(const Recipe& r);

// Checks everything that does not depend on a particular layer (each role's
// QuantSpec, cross-role rules, with each override applied on its own).
void validate_recipe(const Recipe& r);

}  // namespace exmy::sim::quant

#include "sim/quant/recipe.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <sstream>
#include <stdexcept>

#include "formats/conventions.hpp"
#include "formats/error.hpp"
#include "formats/spec.hpp"
#include "formats/vocab.hpp"
#include "sim/quant/ini.hpp"

#ifndef EXMY_RECIPE_DIR
#define EXMY_RECIPE_DIR "experiments/recipes"
#endif

namespace exmy::sim::quant {

// ---------------------------------------------------------------------------
// Names
// ---------------------------------------------------------------------------

namespace {
constexpr std::array<std::string_view, kNumRoles> kRoleNames = {"fprop-x", "fprop-w",  "dgrad-dy",
                                                                "dgrad-w", "wgrad-dy", "wgrad-x"};
constexpr std::array<std::string_view, 4> kGroupSections = {"all", "activations", "weights", "gradients"};

std::string join(const std::vector<std::string>& v, std::string_view sep = ", ") {
  std::string s;
  for (const auto& x : v) {
    if (!s.empty()) s += sep;
    s += x;
  }
  return s;
}

std::string fmt_double(double v) {
  std::ostringstream os;
  os.precision(9);
  os << v;
  return os.str();
}

bool parse_int(std::string_view s, int64_t& v) {
  if (s.empty()) return false;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  return ec == std::errc() && p == s.data() + s.size();
}

int64_t parse_count(std::string_view s, int64_t lo, int64_t hi, std::string_view what) {
  int64_t v = 0;
  if (!parse_int(s, v) || v < lo || v > hi)
    throw Error("bad " + std::string(what) + " '" + std::string(s) + "' (expected an integer in " +
                std::to_string(lo) + ".." + std::to_string(hi) + ")");
  return v;
}


std::vector<std::string_view> split(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  size_t pos = 0;
  while (true) {
    const size_t k = s.find(sep, pos);
    std::string_view part = s.substr(pos, k == std::string_view::npos ? std::string_view::npos : k - pos);
    while (!part.empty() && part.front() == ' ') part.remove_prefix(1);
    while (!part.empty() && part.back() == ' ') part.remove_suffix(1);
    out.push_back(part);
    if (k == std::string_view::npos) break;
    pos = k + 1;
  }
  return out;
}

// The roles of a group section, or of a role section.
std::vector<Role> section_roles(std::string_view section) {
  if (section == "all") return {kRoles.begin(), kRoles.end()};
  if (section == "activations") return {Role::fprop_x, Role::wgrad_x};
  if (section == "weights") return {Role::fprop_w, Role::dgrad_w};
  if (section == "gradients") return {Role::dgrad_dy, Role::wgrad_dy};
  if (section == "fprop") return {Role::fprop_x, Role::fprop_w};
  if (section == "dgrad") return {Role::dgrad_dy, Role::dgrad_w};
  if (section == "wgrad") return {Role::wgrad_dy, Role::wgrad_x};
  for (Role r : kRoles)
    if (role_name(r) == section) return {r};
  return {};
}

}  // namespace

std::string_view role_name(Role r) { return kRoleNames[static_cast<size_t>(r)]; }

std::string_view gemm_name(Gemm g) {
  switch (g) {
    case Gemm::fprop: return "fprop";
    case Gemm::dgrad: return "dgrad";
    case Gemm::wgrad: return "wgrad";
  }
  return "?";
}

Role parse_role(std::string_view s) {
  for (Role r : kRoles)
    if (role_name(r) == s) return r;
  throw Error("unknown role '" + std::string(s) +
              "' (expected fprop-x, fprop-w, dgrad-dy, dgrad-w, wgrad-dy or wgrad-x)");
}

Gemm role_gemm(Role r) { return static_cast<Gemm>(static_cast<int>(r) / 2); }

std::array<Role, 2> gemm_roles(Gemm g) {
  switch (g) {
    case Gemm::fprop: return {Role::fprop_x, Role::fprop_w};
    case Gemm::dgrad: return {Role::dgrad_dy, Role::dgrad_w};
    case Gemm::wgrad: return {Role::wgrad_dy, Role::wgrad_x};
  }
  return {Role::fprop_x, Role::fprop_w};
}

RefPolicy parse_ref_policy(std::string_view s) {
  RefPolicy p;
  if (s == "current") return p;
  if (s == "none") {
    p.kind = RefPolicy::Kind::none;
    return p;
  }
  const size_t c = s.find(':');
  const std::string_view head = s.substr(0, c);
  int64_t n = 0;
  if (c != std::string_view::npos && (head == "periodic" || head == "delayed") && parse_int(s.substr(c + 1), n) &&
      n >= 1 && n <= (int64_t{1} << 30)) {
    p.kind = head == "periodic" ? RefPolicy::Kind::periodic : RefPolicy::Kind::delayed;
    p.n = n;
    return p;
  }
  throw Error("bad tensor reference '" + std::string(s) + "' (expected current, none, periodic:D or delayed:L)");
}

std::string ref_policy_name(const RefPolicy& p) {
  switch (p.kind) {
    case RefPolicy::Kind::current: return "current";
    case RefPolicy::Kind::none: return "none";
    case RefPolicy::Kind::periodic: return "periodic:" + std::to_string(p.n);
    case RefPolicy::Kind::delayed: return "delayed:" + std::to_string(p.n);
  }
  return "?";
}

// ---------------------------------------------------------------------------
// Role knobs: one row per knob (name, setter, printer)
// ---------------------------------------------------------------------------

namespace {

struct RoleKnob {
  const char* name;
  std::function<void(RoleSpec&, std::string_view)> set;
  std::function<std::string(const RoleSpec&)> show;
};

// A role's own knobs, beside the QuantSpec knobs of formats/vocab.hpp.
const std::vector<RoleKnob>& own_role_knobs() {
  static const std::vector<RoleKnob> k = {
      {"reference", [](RoleSpec& s, std::string_view v) { s.reference = parse_ref_policy(v); },
       [](const RoleSpec& s) { return ref_policy_name(s.reference); }},
      {"pre_round",
       [](RoleSpec& s, std::string_view v) {
         if (v != "none" && v != "bf16") throw Error("bad value '" + std::string(v) + "' (expected none or bf16)");
         s.pre_round_bf16 = v == "bf16";
       },
       [](const RoleSpec& s) { return std::string(s.pre_round_bf16 ? "bf16" : "none"); }},
  };
  return k;
}

// The order in which role_spec_string prints the knobs (plan texts keep
// it): every QuantSpec knob a recipe sets (QuantKnob::in_recipe) and the
// role's own, each once (checked when the list is built).
constexpr std::string_view kRoleKnobOrder[] = {
    "elem",    "scale",    "block",     "scale_rule", "arith",     "round",    "sr_bits",  "scale_target",
    "four_over_six", "zero_scale", "dequant", "saturate", "reference", "outer_scale", "rht", "rht_signs", "rht_size", "rht_kind", "pre_round",
};

const std::vector<RoleKnob>& role_knobs() {
  static const std::vector<RoleKnob> k = [] {
    std::vector<RoleKnob> v;
    for (std::string_view name : kRoleKnobOrder) {
      const RoleKnob* own = nullptr;
      for (const auto& o : own_role_knobs())
        if (name == o.name) own = &o;
      if (own) {
        v.push_back(*own);
        continue;
      }
      const QuantKnob* q = find_quant_knob(name);
      if (!q || !q->in_recipe) throw std::logic_error("recipe knob order names '" + std::string(name) + "'");
      RoleKnob r{q->name, [q](RoleSpec& s, std::string_view val) { q->parse(s.q, val); },
                 [q](const RoleSpec& s) { return q->print(s.q); }};
      if (name == "block") {
        r.set = [q](RoleSpec& s, std::string_view val) {
          QuantSpec t;
          q->parse(t, val);
          if (t.block_rows > 1 && t.block_cols == 1)
            throw Error("block " + std::string(val) +
                        " runs across the reduction dimension; every operand is quantized along its GEMM's K "
                        "(expected 1xB or BxB)");
          q->parse(s.q, val);
        };
      }
      v.push_back(std::move(r));
    }
    size_t recipe_knobs = own_role_knobs().size();
    for (const auto& q : quant_knobs()) recipe_knobs += q.in_recipe;
    if (recipe_knobs != v.size()) throw std::logic_error("recipe knob order misses a knob of formats/vocab.hpp");
    return v;
  }();
  return k;
}

const RoleKnob* find_role_knob(std::string_view name) {
  for (const auto& k : role_knobs())
    if (name == k.name) return &k;
  return nullptr;
}

// Defaults before any section: no element format (a recipe must name one),
// everything else as `exmy quantize`'s defaults, current reference.
RoleSpec default_role_spec() {
  RoleSpec s;
  s.q.elem = Format{};  // E = M = 0: "unset"
  return s;
}

bool elem_unset(const RoleSpec& s) { return s.q.elem.bits == 0; }

}  // namespace

const std::vector<std::string>& role_knob_names() {
  static const std::vector<std::string> n = [] {
    std::vector<std::string> v;
    for (const auto& k : role_knobs()) v.emplace_back(k.name);
    return v;
  }();
  return n;
}

void KnobLayer::set(std::string_view knob, std::string_view value) {
  const RoleKnob* k = find_role_knob(knob);
  if (!k) throw Error("unknown knob '" + std::string(knob) + "' (expected " + join(role_knob_names()) + ")");
  RoleSpec scratch;
  try {
    k->set(scratch, value);
  } catch (const Error& e) {
    throw Error(std::string(knob) + ": " + e.what());
  }
  for (auto& [n, v] : items_)
    if (n == knob) {
      v = std::string(value);
      return;
    }
  items_.emplace_back(std::string(knob), std::string(value));
}

void KnobLayer::apply(RoleSpec& spec) const {
  for (const auto& [n, v] : items_) find_role_knob(n)->set(spec, v);
}

std::string role_spec_string(const RoleSpec& s) {
  std::string out;
  for (const auto& k : role_knobs()) {
    if (!out.empty()) out += ' ';
    out += std::string(k.name) + "=" + (elem_unset(s) && std::string_view(k.name) == "elem" ? "unset" : k.show(s));
  }
  return out;
}

// ---------------------------------------------------------------------------
// Selectors
// ---------------------------------------------------------------------------

int64_t BlockCount::of(int64_t num_blocks) const {
  if (!percent) return n;
  // floor(p·L/100 + 1/2) with p = n·10^-4: floor((n·L + 500000) / 1000000).
  // n <= 10^6 and L < 2^40 keep the product far inside int64.
  return (n * num_blocks + 500000) / 1000000;
}

BlockCount parse_block_count(std::string_view s) {
  BlockCount c;
  auto bad = [&]() {
    return Error("bad block count '" + std::string(s) +
                 "' (expected a number of blocks N or a percentage of the depth P% with 0 <= P <= 100 and at most "
                 "four decimals, e.g. 8 or 15%)");
  };
  if (!s.ends_with('%')) {
    if (!parse_int(s, c.n) || c.n < 0 || c.n > (int64_t{1} << 20)) throw bad();
    return c;
  }
  std::string_view num = s.substr(0, s.size() - 1);
  const size_t dot = num.find('.');
  const std::string_view whole = num.substr(0, dot), frac = dot == std::string_view::npos ? "" : num.substr(dot + 1);
  int64_t w = 0, f = 0;
  if (!parse_int(whole, w) || w < 0 || frac.size() > 4 || (dot != std::string_view::npos && frac.empty()) ||
      (!frac.empty() && (!parse_int(frac, f) || f < 0 || frac.front() == '+' || frac.front() == '-')))
    throw bad();
  for (size_t i = frac.size(); i < 4; ++i) f *= 10;
  c.percent = true;
  c.n = w * 10000 + f;
  if (w > 100 || c.n > 1000000) throw bad();
  return c;
}

std::string block_count_name(const BlockCount& c) {
  if (!c.percent) return std::to_string(c.n);
  std::string out = std::to_string(c.n / 10000);
  if (int64_t f = c.n % 10000; f != 0) {
    std::string d = std::to_string(f);
    d = std::string(4 - d.size(), '0') + d;
    while (d.back() == '0') d.pop_back();
    out += "." + d;
  }
  return out + "%";
}

bool BlockSelector::matches(int64_t block, int64_t num_blocks) const {
  switch (kind) {
    case Kind::all: return true;
    case Kind::first: return block < n.of(num_blocks) && block < num_blocks;
    case Kind::last: return block < num_blocks && block >= num_blocks - n.of(num_blocks);
    case Kind::list:
      for (const auto& [a, b] : ranges)
        if (block >= a && block <= b) return true;
      return false;
  }
  return false;
}

BlockSelector parse_block_selector(std::string_view s) {
  BlockSelector sel;
  auto bad = [&]() {
    return Error("bad layer selector '" + std::string(s) +
                 "' (expected all, first:N, last:N, first:P%, last:P% or block indices like 0,3,5-7)");
  };
  if (s == "all") return sel;
  if (s.starts_with("first:") || s.starts_with("last:")) {
    const bool first = s.starts_with("first:");
    try {
      sel.n = parse_block_count(s.substr(first ? 6 : 5));
    } catch (const Error&) {
      throw bad();
    }
    sel.kind = first ? BlockSelector::Kind::first : BlockSelector::Kind::last;
    return sel;
  }
  sel.kind = BlockSelector::Kind::list;
  for (std::string_view part : split(s, ',')) {
    const size_t dash = part.find('-');
    int64_t a = 0, b = 0;
    if (dash == std::string_view::npos) {
      if (!parse_int(part, a) || a < 0) throw bad();
      b = a;
    } else if (!parse_int(part.substr(0, dash), a) || !parse_int(part.substr(dash + 1), b) || a < 0 || b < a) {
      throw bad();
    }
    sel.ranges.emplace_back(a, b);
  }
  return sel;
}

std::string block_selector_name(const BlockSelector& s) {
  switch (s.kind) {
    case BlockSelector::Kind::all: return "all";
    case BlockSelector::Kind::first: return "first:" + block_count_name(s.n);
    case BlockSelector::Kind::last: return "last:" + block_count_name(s.n);
    case BlockSelector::Kind::list: {
      std::string out;
      for (const auto& [a, b] : s.ranges) {
        if (!out.empty()) out += ',';
        out += std::to_string(a);
        if (b != a) out += "-" + std::to_string(b);
      }
      return out;
    }
  }
  return "?";
}

namespace {

constexpr std::array<LinearKind, 9> kKinds = {LinearKind::mamba_in_proj, LinearKind::mamba_out_proj, LinearKind::attn_q,
                                              LinearKind::attn_k,        LinearKind::attn_v,         LinearKind::attn_o,
                                              LinearKind::mlp_up,        LinearKind::mlp_down,       LinearKind::lm_head};

std::vector<LinearKind> parse_kinds(std::string_view s) {
  if (s == "all") return {};
  std::vector<LinearKind> out;
  for (std::string_view part : split(s, ',')) {
    bool found = false;
    for (LinearKind k : kKinds)
      if (linear_kind_name(k) == part) {
        out.push_back(k);
        found = true;
      }
    if (!found)
      throw Error("unknown linear kind '" + std::string(part) +
                  "' (expected all or in_proj, out_proj, q_proj, k_proj, v_proj, o_proj, up_proj, down_proj, lm_head)");
  }
  return out;
}

std::string kinds_name(const std::vector<LinearKind>& kinds) {
  if (kinds.empty()) return "all";
  std::string out;
  for (LinearKind k : kinds) {
    if (!out.empty()) out += ',';
    out += linear_kind_name(k);
  }
  return out;
}

std::array<bool, kNumRoles> parse_roles(std::string_view s) {
  std::array<bool, kNumRoles> out{};
  for (std::string_view part : split(s, ',')) {
    const auto roles = section_roles(part);
    if (roles.empty())
      throw Error("unknown role '" + std::string(part) +
                  "' (expected all, activations, weights, gradients, fprop, dgrad, wgrad or a role like wgrad-dy)");
    for (Role r : roles) out[static_cast<size_t>(r)] = true;
  }
  return out;
}

std::string roles_name(const std::array<bool, kNumRoles>& roles) {
  if (std::all_of(roles.begin(), roles.end(), [](bool b) { return b; })) return "all";
  std::string out;
  for (Role r : kRoles) {
    if (!roles[static_cast<size_t>(r)]) continue;
    if (!out.empty()) out += ',';
    out += role_name(r);
  }
  return out;
}

}  // namespace

bool Override::selects(const LinearInfo& info, Role r, int64_t num_blocks) const {
  if (!roles[static_cast<size_t>(r)]) return false;
  if (!kinds.empty() && std::find(kinds.begin(), kinds.end(), info.kind) == kinds.end()) return false;
  return layers.matches(info.layer, num_blocks);
}

// ---------------------------------------------------------------------------
// Recipe-level knobs
// ---------------------------------------------------------------------------

namespace {

struct RecipeKnob {
  const char* section;
  const char* name;
  std::function<void(Recipe&, std::string_view)> set;
  std::function<std::string(const Recipe&)> show;
};

Round parse_rne_rtz(std::string_view v) {
  if (v == "rne") return Round::rne;
  if (v == "rtz") return Round::rtz;
  throw Error("bad rounding '" + std::string(v) + "' (expected rne or rtz)");
}

const std::vector<RecipeKnob>& recipe_knobs() {
  static const std::vector<RecipeKnob> k = {
      {"recipe", "description", [](Recipe& r, std::string_view v) { r.description = std::string(v); },
       [](const Recipe& r) { return r.description; }},
      {"recipe", "layers",
       [](Recipe& r, std::string_view v) {
         if (v != "all" && v != "none") throw Error("bad value '" + std::string(v) + "' (expected all or none)");
         r.quantize = v == "all";
       },
       [](const Recipe& r) { return std::string(r.quantize ? "all" : "none"); }},
      {"recipe", "keep_first_bf16", [](Recipe& r, std::string_view v) { r.keep_first_bf16 = parse_block_count(v); },
       [](const Recipe& r) { return block_count_name(r.keep_first_bf16); }},
      {"recipe", "keep_last_bf16", [](Recipe& r, std::string_view v) { r.keep_last_bf16 = parse_block_count(v); },
       [](const Recipe& r) { return block_count_name(r.keep_last_bf16); }},
      {"recipe", "allow_no_quantized", [](Recipe& r, std::string_view v) { r.allow_no_quantized = parse_bool_word(v); },
       [](const Recipe& r) { return std::string(r.allow_no_quantized ? "true" : "false"); }},
      {"recipe", "lm_head", [](Recipe& r, std::string_view v) { r.lm_head = parse_bool_word(v); },
       [](const Recipe& r) { return std::string(r.lm_head ? "true" : "false"); }},
      {"recipe", "unquantized",
       [](Recipe& r, std::string_view v) {
         if (v != "bf16" && v != "fp32") throw Error("bad value '" + std::string(v) + "' (expected bf16 or fp32)");
         r.unquantized = std::string(v);
       },
       [](const Recipe& r) { return r.unquantized; }},
      {"recipe", "shared_dy_reference", [](Recipe& r, std::string_view v) { r.shared_dy_reference = parse_bool_word(v); },
       [](const Recipe& r) { return std::string(r.shared_dy_reference ? "true" : "false"); }},
      {"gemm", "model",
       [](Recipe& r, std::string_view v) {
         if (v == "fp32") r.gemm.kind = GemmModel::Kind::fp32;
         else if (v == "grouped") r.gemm.kind = GemmModel::Kind::grouped;
         else throw Error("bad GEMM model '" + std::string(v) + "' (expected fp32 or grouped)");
       },
       [](const Recipe& r) { return std::string(r.gemm.kind == GemmModel::Kind::grouped ? "grouped" : "fp32"); }},
      {"gemm", "group", [](Recipe& r, std::string_view v) { r.gemm.group = parse_count(v, 1, 1 << 20, "group"); },
       [](const Recipe& r) { return std::to_string(r.gemm.group); }},
      {"gemm", "group_round", [](Recipe& r, std::string_view v) { r.gemm.group_round = parse_rne_rtz(v); },
       [](const Recipe& r) { return std::string(round_name(r.gemm.group_round)); }},
      {"gemm", "accumulate", [](Recipe& r, std::string_view v) { r.gemm.accumulate = parse_rne_rtz(v); },
       [](const Recipe& r) { return std::string(round_name(r.gemm.accumulate)); }},
      {"gemm", "grid",
       [](Recipe& r, std::string_view v) {
         r.gemm.grid = v == "none" ? 0 : parse_count(v, 1, int64_t{1} << 30, "grid (none or d in RNE(d*c)/d)");
       },
       [](const Recipe& r) { return r.gemm.grid == 0 ? std::string("none") : std::to_string(r.gemm.grid); }},
  };
  return k;
}

std::string knob_list(std::string_view section) {
  std::vector<std::string> n;
  for (const auto& k : recipe_knobs())
    if (section == k.section) n.emplace_back(k.name);
  if (section == "recipe") n.emplace_back("base");
  return join(n);
}

KnobLayer* role_layer(Recipe& r, std::string_view section) {
  if (section == "all") return &r.all;
  if (section == "activations") return &r.activations;
  if (section == "weights") return &r.weights;
  if (section == "gradients") return &r.gradients;
  for (Role role : kRoles)
    if (role_name(role) == section) return &r.role[static_cast<size_t>(role)];
  return nullptr;
}

std::string section_list() {
  std::string s = "recipe, gemm, all, activations, weights, gradients";
  for (Role r : kRoles) s += ", " + std::string(role_name(r));
  return s + ", override.NAME";
}

// Sets one key of one section (not `base`). Throws Error "<section>.<key>: ...".
void set_key(Recipe& r, std::string_view section, std::string_view key, std::string_view value) {
  const std::string where = std::string(section) + "." + std::string(key);
  try {
    if (section == "recipe" || section == "gemm") {
      for (const auto& k : recipe_knobs())
        if (section == k.section && key == k.name) {
          k.set(r, value);
          return;
        }
      throw Error("unknown key (expected " + knob_list(section) + ")");
    }
    if (KnobLayer* layer = role_layer(r, section)) {
      try {
        layer->set(key, value);
      } catch (const Error& e) {
        // KnobLayer names the knob itself; the caller adds the section.
        const std::string msg = e.what();
        const std::string prefix = std::string(key) + ": ";
        throw Error(msg.starts_with(prefix) ? msg.substr(prefix.size()) : msg);
      }
      return;
    }
    if (section.starts_with("override.") && section.size() > 9) {
      const std::string name(section.substr(9));
      Override* ov = nullptr;
      for (auto& o : r.overrides)
        if (o.name == name) ov = &o;
      if (!ov) {
        r.overrides.emplace_back();
        ov = &r.overrides.back();
        ov->name = name;
        ov->roles.fill(true);
      }
      if (key == "layers") ov->layers = parse_block_selector(value);
      else if (key == "kinds") ov->kinds = parse_kinds(value);
      else if (key == "roles") ov->roles = parse_roles(value);
      else {
        try {
          ov->knobs.set(key, value);
        } catch (const Error& e) {
          const std::string msg = e.what();
          const std::string prefix = std::string(key) + ": ";
          if (msg.starts_with("unknown knob"))
            throw Error("unknown key (expected layers, kinds, roles, " + join(role_knob_names()) + ")");
          throw Error(msg.starts_with(prefix) ? msg.substr(prefix.size()) : msg);
        }
      }
      return;
    }
  } catch (const Error& e) {
    throw Error(where + ": " + e.what());
  }
  throw Error("unknown section '" + std::string(section) + "' (expected " + section_list() + ")");
}

// --- resolution ------------------------------------------------------------

const KnobLayer& group_layer(const Recipe& r, Role role) {
  switch (role) {
    case Role::fprop_x:
    case Role::wgrad_x: return r.activations;
    case Role::fprop_w:
    case Role::dgrad_w: return r.weights;
    default: return r.gradients;
  }
}

RoleSpec resolve_base(const Recipe& r, Role role) {
  RoleSpec s = default_role_spec();
  r.all.apply(s);
  group_layer(r, role).apply(s);
  r.role[static_cast<size_t>(role)].apply(s);
  return s;
}

// Values QuantSpec accepts but a GEMM operand cannot use: they would show up
// as a NaN loss or an all-zero operand many steps later. `rw` names the
// recipe, layer and role.
void check_knob_values(const RoleSpec& rs, const std::string& rw) {
  const QuantSpec& q = rs.q;
  const std::string elem = format_name(q.elem);
  if (!q.elem.is_signed)
    throw Error(rw + "elem: " + elem + " is unsigned, but GEMM operands have both signs (expected a signed format, e.g. e2m1)");
  if (q.elem.E < 1)
    throw Error(rw + "elem: " + elem + " has no exponent bits; an element format must be a float format (e.g. e2m1, e4m3)");
  if (!q.scale && q.scale_target)
    throw Error(rw + "scale_target: " + fmt_double(*q.scale_target) +
                " has no effect without a block scale (scale = none maps the tensor amax to the element maximum " +
                fmt_double(q.elem.max) + "); remove it or set scale");
  if (q.scale) {
    const std::string scale = format_name(*q.scale);
    if (q.scale_target) {
      const double t = static_cast<double>(static_cast<float>(*q.scale_target));
      if (t > q.scale->max)
        throw Error(rw + "scale_target: " + fmt_double(*q.scale_target) + " exceeds the largest " + scale +
                    " block scale " + fmt_double(q.scale->max) +
                    " (blocks near the tensor amax would saturate the scale range; expected at most that, or default)");
      if (t < q.scale->min_pos)
        throw Error(rw + "scale_target: " + fmt_double(*q.scale_target) + " is below the smallest " + scale +
                    " block scale " + fmt_double(q.scale->min_pos) + " (every block scale would underflow to zero)");
      if (!std::isfinite(static_cast<float>(q.elem.max * t)))
        throw Error(rw + "scale_target: " + fmt_double(*q.scale_target) + " times the " + elem + " maximum " +
                    fmt_double(q.elem.max) + " overflows float32");
    }
  }
}

bool square_2d(const QuantSpec& q) { return q.block_rows > 1 && q.block_rows == q.block_cols; }

// Checks a set of six resolved specs; `where` prefixes messages.
void check_specs(const Recipe& r, const std::array<RoleSpec, kNumRoles>& s, const std::string& where) {
  for (Role role : kRoles) {
    const RoleSpec& rs = s[static_cast<size_t>(role)];
    const std::string rw = where + std::string(role_name(role)) + ": ";
    if (elem_unset(rs)) throw Error(rw + "no element format (set all.elem or " + std::string(role_name(role)) + ".elem)");
    try {
      rs.q.validate();
    } catch (const Error& e) {
      throw Error(rw + e.what());
    }
    check_knob_values(rs, rw);
    // A held reference per row needs rows that are the same at every step:
    // the weights' (output or input features) and the wgrad operands'
    // (features), not fprop-x's and dgrad-dy's, whose rows are tokens.
    const bool held = rs.reference.kind == RefPolicy::Kind::periodic || rs.reference.kind == RefPolicy::Kind::delayed;
    if (rs.q.outer == OuterScale::row && held && (role == Role::fprop_x || role == Role::dgrad_dy))
      throw Error(rw + "outer_scale = row with reference = " + ref_policy_name(rs.reference) + ": the rows of " +
                  std::string(role_name(role)) +
                  " are tokens, which change every step, so a reference cannot be held row by row (use "
                  "reference = current, or outer_scale = tensor)");
  }
  for (Gemm g : {Gemm::fprop, Gemm::dgrad, Gemm::wgrad}) {
    const auto [a, b] = gemm_roles(g);
    const QuantSpec& qa = s[static_cast<size_t>(a)].q;
    const QuantSpec& qb = s[static_cast<size_t>(b)].q;
    const bool same = qa.rht_size == qb.rht_size && qa.rht_kind == qb.rht_kind &&
                      (qa.rht_kind == RhtKind::deterministic || qa.rht_signs == qb.rht_signs);
    if (qa.rht != qb.rht || (qa.rht && !same))
      throw Error(where + std::string(gemm_name(g)) + ": the random Hadamard transform must be on for both operands " +
                  std::string(role_name(a)) + " and " + std::string(role_name(b)) +
                  " with the same size, kind and signs, or off for both (the GEMM then sees the transform cancel)");
  }
  const QuantSpec& fw = s[static_cast<size_t>(Role::fprop_w)].q;
  const QuantSpec& dw = s[static_cast<size_t>(Role::dgrad_w)].q;
  if ((square_2d(fw) || square_2d(dw)) && (fw.block_rows != dw.block_rows || fw.block_cols != dw.block_cols))
    throw Error(where + "weights: fprop-w uses " + std::to_string(fw.block_rows) + "x" +
                std::to_string(fw.block_cols) + " blocks and dgrad-w " + std::to_string(dw.block_rows) + "x" +
                std::to_string(dw.block_cols) + "; 2D weight tiles are shared by both views, so both must use the same BxB");
  if (r.shared_dy_reference) {
    const RoleSpec& d = s[static_cast<size_t>(Role::dgrad_dy)];
    const RoleSpec& w = s[static_cast<size_t>(Role::wgrad_dy)];
    const auto row = [](const RoleSpec& x) { return x.q.outer == OuterScale::row ? " with row outer scales" : ""; };
    if (!(d.reference == w.reference) || d.q.rht != w.q.rht || (d.q.rht && !(rht_of(d.q) == rht_of(w.q))) ||
        d.q.outer != w.q.outer)
      throw Error(where + "shared_dy_reference: dgrad-dy and wgrad-dy share one dY reference, so they need the same "
                          "reference policy, rht and outer_scale setting (got " +
                  ref_policy_name(d.reference) + (d.q.rht ? " with rht" : "") + row(d) + " and " +
                  ref_policy_name(w.reference) + (w.q.rht ? " with rht" : "") + row(w) + ")");
  }
}

std::string recipe_label(const Recipe& r) { return "recipe '" + r.name + "'"; }

void parse_into(Recipe& r, const IniFile& f, const std::string& base_dir, int depth);

Recipe load_path(const std::string& path, const std::string& name, int depth) {
  const IniFile f = read_ini(path);
  Recipe r;
  r.name = name;
  r.origin = path;
  parse_into(r, f, std::filesystem::path(path).parent_path().string(), depth);
  return r;
}

void parse_into(Recipe& r, const IniFile& f, const std::string& base_dir, int depth) {
  // `base` first: the named recipe is the starting point.
  for (const auto& e : f.entries) {
    if (e.section == "recipe" && e.key == "base") {
      if (depth > 8) throw Error(f.origin + ":" + std::to_string(e.line) + ": recipe.base: bases nest too deep");
      const std::string dir = base_dir.empty() ? recipe_dir() : base_dir;
      const std::string path = (std::filesystem::path(dir) / (e.value + ".ini")).string();
      if (!std::filesystem::exists(path))
        throw Error(f.origin + ":" + std::to_string(e.line) + ": recipe.base: no recipe '" + e.value + "' in " + dir);
      const std::string name = r.name, origin = r.origin;
      r = load_path(path, e.value, depth + 1);
      r.name = name;
      r.origin = origin;
    }
  }
  for (const auto& e : f.entries) {
    if (e.section == "recipe" && e.key == "base") continue;
    try {
      if (e.section.empty()) throw Error(e.key + ": key outside any section");
      set_key(r, e.section, e.key, e.value);
    } catch (const Error& err) {
      throw Error(recipe_label(r) + " (" + f.origin + ":" + std::to_string(e.line) + "): " + err.what());
    }
  }
  for (const auto& s : f.sections) {
    const bool known = s == "recipe" || s == "gemm" || role_layer(r, s) != nullptr ||
                       (s.starts_with("override.") && s.size() > 9);
    if (!known)
      throw Error(recipe_label(r) + " (" + f.origin + "): unknown section [" + s + "] (expected " + section_list() + ")");
    if (s.starts_with("override.")) {
      // An empty override section still exists (it selects but sets nothing).
      bool have = false;
      for (const auto& o : r.overrides) have = have || o.name == s.substr(9);
      if (!have) {
        r.overrides.emplace_back();
        r.overrides.back().name = s.substr(9);
        r.overrides.back().roles.fill(true);
      }
    }
  }
}

}  // namespace

bool Recipe::quantizes(const LinearInfo& info, int64_t num_blocks) const {
  if (!quantize) return false;
  if (info.kind == LinearKind::lm_head) return lm_head;
  if (info.layer < keep_first_bf16.of(num_blocks)) return false;
  if (info.layer >= num_blocks - keep_last_bf16.of(num_blocks)) return false;
  return true;
}

void Recipe::check_selects_some(int64_t num_blocks) const {
  if (!quantize || allow_no_quantized || lm_head) return;
  const int64_t first = keep_first_bf16.of(num_blocks), last = keep_last_bf16.of(num_blocks);
  if (first + last < num_blocks) return;  // every block holds linears (Mamba, attention or MLP)
  throw Error(recipe_label(*this) + " quantizes no linear of this " + std::to_string(num_blocks) +
              "-block model: keep_first_bf16 = " + block_count_name(keep_first_bf16) + " (" + std::to_string(first) +
              " blocks) and keep_last_bf16 = " + block_count_name(keep_last_bf16) + " (" + std::to_string(last) +
              " blocks) keep every block unquantized (lower them, e.g. --set recipe.keep_last_bf16=15%, or set "
              "recipe.allow_no_quantized=true if that is intended)");
}

std::array<RoleSpec, kNumRoles> Recipe::resolve(const LinearInfo& info, int64_t num_blocks) const {
  std::array<RoleSpec, kNumRoles> s;
  for (Role role : kRoles) {
    RoleSpec& rs = s[static_cast<size_t>(role)];
    rs = resolve_base(*this, role);
    for (const auto& o : overrides)
      if (o.selects(info, role, num_blocks)) o.knobs.apply(rs);
  }
  check_specs(*this, s, recipe_label(*this) + ", " + info.name + ", ");
  return s;
}

void validate_recipe(const Recipe& r) {
  if (r.keep_first_bf16.n < 0 || r.keep_last_bf16.n < 0) throw Error(recipe_label(r) + ": negative block count");
  if (!r.quantize) return;
  std::array<RoleSpec, kNumRoles> base;
  for (Role role : kRoles) base[static_cast<size_t>(role)] = resolve_base(r, role);
  check_specs(r, base, recipe_label(r) + ": ");
  for (const auto& o : r.overrides) {
    auto s = base;
    for (Role role : kRoles)
      if (o.roles[static_cast<size_t>(role)]) o.knobs.apply(s[static_cast<size_t>(role)]);
    check_specs(r, s, recipe_label(r) + ", override." + o.name + ": ");
  }
}

Recipe parse_recipe(std::string_view text, std::string_view name, std::string_view origin,
                    const std::string& base_dir) {
  const IniFile f = parse_ini(text, origin);
  Recipe r;
  r.name = std::string(name);
  r.origin = std::string(origin);
  parse_into(r, f, base_dir, 0);
  validate_recipe(r);
  return r;
}

namespace {
std::string& recipe_dir_override() {
  static std::string dir;
  return dir;
}
}  // namespace

std::vector<std::string> recipe_dirs() {
  if (!recipe_dir_override().empty()) return {recipe_dir_override()};
  std::vector<std::string> dirs;
  if (const char* env = std::getenv("EXMY_RECIPE_DIR"); env && *env) dirs.emplace_back(env);
  dirs.emplace_back("experiments/recipes");  // the working directory's
  dirs.emplace_back(EXMY_RECIPE_DIR);        // the source tree's
  // The same folder reached twice (exmy run from the repository root) is
  // listed once.
  std::vector<std::string> out;
  for (const auto& d : dirs) {
    std::error_code ec;
    bool seen = false;
    for (const auto& o : out) seen = seen || std::filesystem::equivalent(o, d, ec);
    if (!seen) out.push_back(d);
  }
  return out;
}

std::string recipe_dir() {
  const auto dirs = recipe_dirs();
  std::error_code ec;
  for (const auto& d : dirs)
    if (std::filesystem::is_directory(d, ec)) return d;
  return dirs.back();
}

void set_recipe_dir(const std::string& dir) { recipe_dir_override() = dir; }

std::vector<std::string> recipe_names() {
  std::vector<std::string> names;
  for (const auto& dir : recipe_dirs()) {
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(dir, ec))
      if (e.path().extension() == ".ini") names.push_back(e.path().stem().string());
  }
  std::sort(names.begin(), names.end());
  names.erase(std::unique(names.begin(), names.end()), names.end());
  return names;
}

std::string find_recipe(const std::string& name) {
  std::error_code ec;
  for (const auto& dir : recipe_dirs()) {
    const std::string path = (std::filesystem::path(dir) / (name + ".ini")).string();
    if (std::filesystem::is_regular_file(path, ec)) return path;
  }
  return "";
}

Recipe load_recipe(const std::string& name_or_path) {
  const bool is_path = name_or_path.find('/') != std::string::npos || name_or_path.ends_with(".ini");
  std::string path = name_or_path, name = std::filesystem::path(name_or_path).stem().string();
  if (!is_path) {
    path = find_recipe(name_or_path);
    if (path.empty())
      throw Error("unknown recipe '" + name_or_path + "' (expected " + join(recipe_names()) +
                  ", or a path to an .ini file; names are looked up in " + join(recipe_dirs(), ", then ") + ")");
  }
  Recipe r = load_path(path, name, 0);
  validate_recipe(r);
  return r;
}

void apply_recipe_override(Recipe& r, std::string_view key, std::string_view value) {
  std::string_view k = key;
  if (k.starts_with("recipe.")) k.remove_prefix(7);
  std::string_view section = "recipe", knob = k;
  if (k.starts_with("override.")) {
    const size_t dot = k.rfind('.');
    if (dot <= 9) throw Error("--set " + std::string(key) + ": expected recipe.override.NAME.KNOB");
    section = k.substr(0, dot);
    knob = k.substr(dot + 1);
  } else if (const size_t dot = k.find('.'); dot != std::string_view::npos) {
    section = k.substr(0, dot);
    knob = k.substr(dot + 1);
  }
  if (section == "recipe" && knob == "base")
    throw Error("--set " + std::string(key) + ": a base recipe can only be named in a recipe file");
  try {
    set_key(r, section, knob, value);
    validate_recipe(r);
  } catch (const Error& e) {
    throw Error("--set " + std::string(key) + "=" + std::string(value) + ": " + e.what());
  }
}

void apply_recipe_override(Recipe& r, std::string_view assignment) {
  const size_t eq = assignment.find('=');
  if (eq == std::string_view::npos)
    throw Error("--set " + std::string(assignment) + ": expected recipe.SECTION.KNOB=VALUE");
  apply_recipe_override(r, assignment.substr(0, eq), assignment.substr(eq + 1));
}

std::string recipe_to_ini(const Recipe& r) {
  std::ostringstream os;
  os << "# recipe " << r.name << " (from " << r.origin << ")\n";
  for (const char* sec : {"recipe", "gemm"}) {
    os << "\n[" << sec << "]\n";
    for (const auto& k : recipe_knobs())
      if (std::string_view(sec) == k.section) os << k.name << " = " << k.show(r) << "\n";
  }
  auto layer = [&](std::string_view name, const KnobLayer& l) {
    if (l.empty()) return;
    os << "\n[" << name << "]\n";
    for (const auto& [k, v] : l.items()) os << k << " = " << v << "\n";
  };
  for (std::string_view g : kGroupSections) layer(g, *role_layer(const_cast<Recipe&>(r), g));
  for (Role role : kRoles) layer(role_name(role), r.role[static_cast<size_t>(role)]);
  for (const auto& o : r.overrides) {
    os << "\n[override." << o.name << "]\n";
    os << "layers = " << block_selector_name(o.layers) << "\n";
    os << "kinds = " << kinds_name(o.kinds) << "\n";
    os << "roles = " << roles_name(o.roles) << "\n";
    for (const auto& [k, v] : o.knobs.items()) os << k << " = " << v << "\n";
  }
  return os.str();
}

}  // namespace exmy::sim::quant

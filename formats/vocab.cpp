#include "formats/vocab.hpp"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "formats/spec.hpp"

namespace exmy {

// ---------------------------------------------------------------------------
// Option enums (docs/numerics.md §2 for rounding, §3 for the others)
// ---------------------------------------------------------------------------

const OptionTable<Round>& round_options() {
  static const OptionTable<Round> t = {
      "rounding mode",
      {
          {"rne", Round::rne, "to nearest, ties to even"},
          {"rna", Round::rna, "to nearest, ties away from zero"},
          {"rtz", Round::rtz, "toward zero"},
          {"up", Round::up, "toward +inf"},
          {"down", Round::down, "toward -inf"},
          {"odd", Round::odd, "to odd (sticky)"},
          {"stochastic", Round::stochastic, "away when rne(delta*2^n) + r >= 2^n (n = sr-bits random bits r)"},
          {"stochastic-fast", Round::stochastic_fast,
           "away when floor(delta*2^(n+1)) + 2r + 1 >= 2^(n+1) (the UE5M3 paper's midpoint rule at n = 8)"},
          {"stochastic-fastest", Round::stochastic_fastest,
           "away when floor(delta*2^n) + r >= 2^n (Transformer Engine's NVFP4 rounding at n = 8)"},
      }};
  return t;
}

const OptionTable<ScaleRule>& scale_rule_options() {
  static const OptionTable<ScaleRule> t = {
      "scale rule",
      {
          {"amax-rne", ScaleRule::amax_rne, "block scale b*t/Fe.max rounded into Fs to nearest even"},
          {"amax-up", ScaleRule::amax_up, "block scale b*t/Fe.max rounded into Fs toward +inf"},
          {"amax-down", ScaleRule::amax_down, "block scale b*t/Fe.max rounded into Fs toward -inf"},
          {"mx-floor", ScaleRule::mx_floor, "2^(floor(log2(b*t)) - floor(log2 Fe.max)) (OCP MX)"},
          {"mx-ceil", ScaleRule::mx_ceil, "as mx-floor with ceil"},
          {"mx-even", ScaleRule::mx_even, "as mx-floor after rounding b*t to Fe's M+1 significant bits"},
          {"amax-sr", ScaleRule::amax_sr,
           "block scale b*t/Fe.max rounded into Fs stochastically (dithered), sr_bits bits per block from the call's scale stream"},
      }};
  return t;
}

const OptionTable<Arith>& arith_options() {
  static const OptionTable<Arith> t = {
      "arithmetic",
      {
          {"exact", Arith::exact, "every value rounded once from the exact real value"},
          {"fp32", Arith::fp32, "Transformer Engine's float32 operation order"},
      }};
  return t;
}

const OptionTable<ZeroScale>& zero_scale_options() {
  static const OptionTable<ZeroScale> t = {
      "zero-scale policy",
      {
          {"zero", ZeroScale::zero, "a block whose scale is 0 stores scale 0 and encodes its elements as zero"},
          {"one", ZeroScale::one, "such a block stores 1.0 rounded into Fs (the UE5M3 paper's guard)"},
      }};
  return t;
}

const OptionTable<AmaxKind>& tensor_amax_options() {
  static const OptionTable<AmaxKind> t = {
      "tensor amax",
      {
          {"none", AmaxKind::none, "no tensor scale (t = 1)"},
          {"auto", AmaxKind::current, "the tensor's own max |x| (a current reference)"},
      }};
  return t;
}

const OptionTable<CodeConvention>& code_convention_options() {
  static const OptionTable<CodeConvention> t = {
      "code convention",
      {
          {"exmy", CodeConvention::exmy, "a zero-scale block's elements as zero codes, -0 inputs kept"},
          {"te", CodeConvention::te,
           "Transformer Engine's bytes: a zero-scale block's non-zero elements as +-Fe.max codes, -0 inputs as +0"},
      }};
  return t;
}

const OptionTable<DequantOrder>& dequant_order_options() {
  static const OptionTable<DequantOrder> t = {
      "dequantization order",
      {
          {"product-first", DequantOrder::product_first, "fp32 x-hat = fl(fl(q*s)*1/G) (the UE5M3 paper's Triton kernel)"},
          {"scale-first", DequantOrder::scale_first, "fp32 x-hat = fl(q*fl(s*1/G)) (its portable Torch path)"},
      }};
  return t;
}

const OptionTable<FourSix>& four_over_six_options() {
  static const OptionTable<FourSix> t = {
      "four-over-six measure",
      {
          {"off", FourSix::off, "every block takes the scale to Fe.max (the usual rule)"},
          {"always-4", FourSix::always_4, "every block takes the scale to 2^floor(log2 Fe.max) (the paper's always_4)"},
          {"mse", FourSix::mse, "the scale with the lower sum of (x-hat - x)^2 over the block (Cook et al. 2025)"},
          {"mae", FourSix::mae, "the scale with the lower sum of |x-hat - x| over the block"},
      }};
  return t;
}

const OptionTable<RhtKind>& rht_kind_options() {
  static const OptionTable<RhtKind> t = {
      "Hadamard transform kind",
      {
          {"random", RhtKind::random, "signs from rht_signs and its splitmix64 expansion (docs/numerics.md §3)"},
          {"deterministic", RhtKind::deterministic, "no signs: the normalized Sylvester Hadamard matrix"},
      }};
  return t;
}

const OptionTable<OuterScale>& outer_scale_options() {
  static const OptionTable<OuterScale> t = {
      "outer scale",
      {
          {"tensor", OuterScale::tensor, "one encode scale t for the whole tensor (docs/numerics.md §3)"},
          {"row", OuterScale::row, "one encode scale per row, from the row's own reference amax (1xB blocks)"},
      }};
  return t;
}

// ---------------------------------------------------------------------------
// Spelling of values
// ---------------------------------------------------------------------------

bool parse_bool_word(std::string_view s) {
  if (s == "true" || s == "on") return true;
  if (s == "false" || s == "off") return false;
  throw Error("bad value '" + std::string(s) + "' (expected true or false)");
}

uint64_t parse_uint(std::string_view what, std::string_view s, uint64_t lo, uint64_t hi) {
  uint64_t v = 0;
  int base = 10;
  std::string_view t = s;
  if (t.size() > 2 && t[0] == '0' && (t[1] == 'x' || t[1] == 'X')) {
    base = 16;
    t.remove_prefix(2);
  }
  auto [p, ec] = std::from_chars(t.data(), t.data() + t.size(), v, base);
  if (t.empty() || ec != std::errc() || p != t.data() + t.size() || v < lo || v > hi) {
    const std::string range =
        lo == 0 && hi == UINT64_MAX ? "an unsigned 64-bit integer" : "an integer in " + std::to_string(lo) + ".." + std::to_string(hi);
    throw Error("bad " + std::string(what) + " '" + std::string(s) + "' (expected " + range +
                ", decimal or 0x-prefixed hex)");
  }
  return v;
}

std::string real_text(double v) {
  // 9 significant digits where they read back, else 17.
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  if (std::strtod(buf, nullptr) != v) std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

std::string float_text(float v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(v));  // 9 digits read back to any float32
  return buf;
}

// ---------------------------------------------------------------------------
// QuantSpec knobs
// ---------------------------------------------------------------------------

namespace {

double parse_positive_real(std::string_view what, std::string_view v) {
  double t = 0;
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), t);
  if (v.empty() || ec != std::errc() || p != v.data() + v.size() || !(t > 0) || !std::isfinite(t))
    throw Error("bad " + std::string(what) + " '" + std::string(v) + "' (expected default or a positive number)");
  return t;
}

std::string bool_text(bool b) { return b ? "true" : "false"; }

template <class E>
std::string rows_help(const OptionTable<E>& t) {
  return t.help();
}

}  // namespace

const std::vector<QuantKnob>& quant_knobs() {
  using S = QuantSpec;
  using V = std::string_view;
  static const std::vector<QuantKnob> k = {
      {"elem", "elem", "FMT", "element format Fe", KnobKind::text, nullptr, true,
       [](S& s, V v) { s.elem = parse_format(v); }, [](const S& s) { return format_name(s.elem); }, nullptr, nullptr},
      {"scale", "scale", "FMT", "block scale format Fs, or none", KnobKind::text, nullptr, true,
       [](S& s, V v) {
         if (v == "none") s.scale.reset();
         else s.scale = parse_format(v);
       },
       [](const S& s) { return s.scale ? format_name(*s.scale) : std::string("none"); }, nullptr, nullptr},
      {"block", "block", "RxC", "block shape: 1xB, Bx1 or BxB", KnobKind::text, nullptr, true,
       [](S& s, V v) { parse_block(v, s.block_rows, s.block_cols); },
       [](const S& s) { return std::to_string(s.block_rows) + "x" + std::to_string(s.block_cols); }, nullptr, nullptr},
      {"scale_rule", "scale-rule", "RULE", "how a block's scale is chosen:", KnobKind::text, nullptr, true,
       [](S& s, V v) { s.rule = scale_rule_options().parse(v); },
       [](const S& s) { return std::string(scale_rule_options().name(s.rule)); },
       [] { return rows_help(scale_rule_options()); }, nullptr},
      {"tensor_amax", "tensor-amax", "A", "tensor reference amax: none, auto, or a positive float:", KnobKind::text,
       nullptr, false, [](S& s, V v) { parse_tensor_amax(v, s.amax_kind, s.amax_value); },
       [](const S& s) {
         // A given amax is a float32 value (parse_tensor_amax rounds it).
         return s.amax_kind == AmaxKind::given ? float_text(static_cast<float>(s.amax_value))
                                               : std::string(tensor_amax_options().name(s.amax_kind));
       },
       [] { return rows_help(tensor_amax_options()) + "\n  <float>  a given (held) reference"; }, nullptr},
      {"scale_target", "scale-target", "T", "scale target T (a float32 value), or default (Fs.max)", KnobKind::real,
       nullptr, true,
       [](S& s, V v) {
         if (v == "default") s.scale_target.reset();
         else s.scale_target = parse_positive_real("scale target", v);
       },
       [](const S& s) { return s.scale_target ? real_text(*s.scale_target) : std::string("default"); }, nullptr,
       [](const S& s) { return s.scale_target.has_value(); }},
      {"four_over_six", "four-over-six", "MEASURE",
       "per block, the scale to Fe.max or to 2^floor(log2 Fe.max) (4 for e2m1), whichever errs less:",
       KnobKind::text, nullptr, true, [](S& s, V v) { s.four_over_six = four_over_six_options().parse(v); },
       [](const S& s) { return std::string(four_over_six_options().name(s.four_over_six)); },
       [] { return rows_help(four_over_six_options()); }, [](const S& s) { return s.four_over_six != FourSix::off; }},
      {"round", "round", "MODE", "element rounding mode:", KnobKind::text, nullptr, true,
       [](S& s, V v) { s.round = round_options().parse(v); },
       [](const S& s) { return std::string(round_options().name(s.round)); }, [] { return rows_help(round_options()); },
       nullptr},
      {"sr_bits", "sr-bits", "N", "random bits per element for stochastic modes (1..32)", KnobKind::integer, nullptr,
       true, [](S& s, V v) { s.sr_bits = static_cast<int>(parse_uint("sr_bits", v, 1, 32)); },
       [](const S& s) { return std::to_string(s.sr_bits); }, nullptr, [](const S& s) { return is_stochastic(s.round); }},
      {"seed", "seed", "S", "Philox key (64-bit)", KnobKind::u64, nullptr, false,
       [](S& s, V v) { s.seed = parse_uint("seed", v); }, [](const S& s) { return std::to_string(s.seed); }, nullptr,
       nullptr},
      {"stream", "stream", "T", "Philox stream (64-bit)", KnobKind::u64, nullptr, false,
       [](S& s, V v) { s.stream = parse_uint("stream", v); }, [](const S& s) { return std::to_string(s.stream); },
       nullptr, nullptr},
      {"arith", "arith", "ARITH", "arithmetic of the scales and elements:", KnobKind::text, nullptr, true,
       [](S& s, V v) { s.arith = arith_options().parse(v); },
       [](const S& s) { return std::string(arith_options().name(s.arith)); }, [] { return rows_help(arith_options()); },
       nullptr},
      {"zero_scale", "zero-scale", "POLICY", "scale stored for blocks whose scale is 0:", KnobKind::text, nullptr, true,
       [](S& s, V v) { s.zero_scale = zero_scale_options().parse(v); },
       [](const S& s) { return std::string(zero_scale_options().name(s.zero_scale)); },
       [] { return rows_help(zero_scale_options()); }, nullptr},
      {"convention", "convention", "CONV",
       "output bytes (values and statistics unchanged but for the sign of zeros):", KnobKind::text, nullptr, false,
       [](S& s, V v) { s.codes = code_convention_options().parse(v); },
       [](const S& s) { return std::string(code_convention_options().name(s.codes)); },
       [] { return rows_help(code_convention_options()); }, [](const S& s) { return s.codes != CodeConvention::exmy; }},
      {"dequant", "dequant", "ORDER", "order of fp32 arithmetic's dequantization:", KnobKind::text, nullptr, true,
       [](S& s, V v) { s.dequant = dequant_order_options().parse(v); },
       [](const S& s) { return std::string(dequant_order_options().name(s.dequant)); },
       [] { return rows_help(dequant_order_options()); },
       [](const S& s) { return s.dequant != DequantOrder::product_first; }},
      {"saturate", "no-saturate", "BOOL", "overflow to Inf/NaN instead of saturating to max", KnobKind::boolean,
       "false", true, [](S& s, V v) { s.saturate = parse_bool_word(v); },
       [](const S& s) { return bool_text(s.saturate); }, nullptr, [](const S& s) { return !s.saturate; }},
      {"rht", "rht", "BOOL", "apply the Hadamard transform (rht_size, rht_kind) along the block axis first",
       KnobKind::boolean, "true", true, [](S& s, V v) { s.rht = parse_bool_word(v); },
       [](const S& s) { return bool_text(s.rht); }, nullptr, [](const S& s) { return s.rht; }},
      {"rht_signs", "rht-signs", "MASK", "16-bit sign mask of the transform (decimal or 0x hex)", KnobKind::text,
       nullptr, true, [](S& s, V v) { s.rht_signs = static_cast<uint16_t>(parse_uint("RHT sign mask", v, 0, 0xffff)); },
       [](const S& s) {
         char buf[8];
         std::snprintf(buf, sizeof buf, "0x%04X", s.rht_signs);
         return std::string(buf);
       },
       nullptr, [](const S& s) { return s.rht; }},
      {"rht_size", "rht-size", "N", "points of the Hadamard transform: 16, 32, 64 or 128", KnobKind::integer, nullptr,
       true,
       [](S& s, V v) {
         const int n = static_cast<int>(parse_uint("rht_size", v, 0, 1u << 20));
         Rht{n}.validate();
         s.rht_size = n;
       },
       [](const S& s) { return std::to_string(s.rht_size); }, nullptr,
       [](const S& s) { return s.rht && s.rht_size != 16; }},
      {"rht_kind", "rht-kind", "KIND", "signs of the Hadamard transform:", KnobKind::text, nullptr, true,
       [](S& s, V v) { s.rht_kind = rht_kind_options().parse(v); },
       [](const S& s) { return std::string(rht_kind_options().name(s.rht_kind)); },
       [] { return rows_help(rht_kind_options()); },
       [](const S& s) { return s.rht && s.rht_kind != RhtKind::random; }},
      {"outer_scale", "outer-scale", "KIND", "the outer (tensor-level) encode scale:", KnobKind::text, nullptr, true,
       [](S& s, V v) { s.outer = outer_scale_options().parse(v); },
       [](const S& s) { return std::string(outer_scale_options().name(s.outer)); },
       [] { return rows_help(outer_scale_options()); }, [](const S& s) { return s.outer != OuterScale::tensor; }},
  };
  return k;
}

const QuantKnob* find_quant_knob(std::string_view name) {
  std::string n(name);
  for (char& c : n)
    if (c == '-') c = '_';
  for (const auto& k : quant_knobs())
    if (n == k.name) return &k;
  return nullptr;
}

void set_knob(QuantSpec& spec, std::string_view name, std::string_view value) {
  const QuantKnob* k = find_quant_knob(name);
  if (!k) {
    std::string all;
    for (const auto& q : quant_knobs()) all += (all.empty() ? "" : ", ") + std::string(q.name);
    throw Error("unknown knob '" + std::string(name) + "' (expected one of " + all + ")");
  }
  k->parse(spec, value);
}

QuantSpec spec_from_knobs(const Knobs& knobs, QuantSpec base) {
  for (const auto& [n, v] : knobs) set_knob(base, n, v);
  return base;
}

Knobs spec_to_knobs(const QuantSpec& spec) {
  Knobs out;
  for (const auto& k : quant_knobs()) out.emplace_back(k.name, k.print(spec));
  return out;
}

KnobValue typed_value(const QuantKnob& knob, const QuantSpec& spec) {
  const std::string t = knob.print(spec);
  switch (knob.kind) {
    case KnobKind::text: break;
    case KnobKind::boolean: return int64_t{t == "true"};
    case KnobKind::integer: return static_cast<int64_t>(std::stoll(t));
    case KnobKind::u64: return static_cast<uint64_t>(std::stoull(t));
    case KnobKind::real: return t == "default" ? std::nan("") : std::strtod(t.c_str(), nullptr);
  }
  return t;
}

std::string typed_text(const QuantKnob& knob, const KnobValue& v) {
  if (const auto* s = std::get_if<std::string>(&v)) return *s;
  if (const auto* u = std::get_if<uint64_t>(&v)) return std::to_string(*u);
  if (const auto* i = std::get_if<int64_t>(&v)) return knob.kind == KnobKind::boolean ? bool_text(*i != 0) : std::to_string(*i);
  const double d = std::get<double>(v);
  return std::isnan(d) ? std::string("default") : real_text(d);
}

std::string quantize_options(const QuantSpec& spec) {
  std::string o;
  for (const auto& k : quant_knobs()) {
    if (k.shown && !k.shown(spec)) continue;
    o += (o.empty() ? "--" : " --") + std::string(k.flag);
    if (!k.switch_value) o += " " + k.print(spec);
  }
  return o;
}

// ---------------------------------------------------------------------------
// Statistics of a call
// ---------------------------------------------------------------------------

const std::vector<QuantStat>& quant_stats() {
  using S = QuantStats;
  using K = StatKind;
  using W = StatWorst;
#define EXMY_COUNT(f, unit, desc, ...)                                                                    \
  {#f, unit, desc, K::count, [](const S& s) { return s.f; }, [](const S& s) { return static_cast<double>(s.f); } \
   __VA_OPT__(, ) __VA_ARGS__}
#define EXMY_SUM(f, desc) {#f, "", desc, K::sum, nullptr, [](const S& s) { return s.f; }}
  static const std::vector<QuantStat> t = {
      EXMY_COUNT(elements, "elements", "number of elements"),
      EXMY_COUNT(nonzero, "elements", "elements with x != 0 (a NaN counts)"),
      EXMY_COUNT(underflow, "elements", "x != 0 and x-hat = 0", W::largest, "nonzero", "underflow"),
      EXMY_COUNT(saturated, "elements", "scaled magnitude above Fe.max", W::largest, "elements", "saturated"),
      EXMY_COUNT(subnormal, "elements", "element code is a non-zero subnormal of Fe"),
      EXMY_COUNT(blocks, "blocks", "number of blocks (0 without a block scale)"),
      EXMY_COUNT(scale_underflow, "blocks", "blocks with b > 0 whose scale rounded to 0", W::largest, "blocks",
                 "scale underflow"),
      EXMY_COUNT(scale_subnormal, "blocks", "blocks whose scale code is a non-zero subnormal of Fs"),
      EXMY_COUNT(scale_saturated, "blocks", "blocks whose unrounded scale exceeded Fs.max", W::largest, "blocks",
                 "scale saturated"),
      EXMY_COUNT(scale_four, "blocks", "blocks whose four-over-six choice was the 4 scale (0 with it off)"),
      EXMY_SUM(sum_sq, "sum of x^2"),
      EXMY_SUM(sum_sq_err, "sum of (x-hat - x)^2"),
      EXMY_SUM(sum_err, "sum of (x-hat - x)"),
      EXMY_SUM(sum_abs, "sum of |x|"),
      {"sqnr_db", "dB", "10 log10(sum_sq / sum_sq_err)", K::derived, nullptr, [](const S& s) { return s.sqnr_db(); },
       W::lowest, nullptr, "SQNR min"},
      {"relative_mse", "", "sum_sq_err / sum_sq", K::derived, nullptr, [](const S& s) { return s.relative_mse(); }},
      {"relative_bias", "", "sum_err / sum_abs", K::derived, nullptr, [](const S& s) { return s.relative_bias(); }},
      {"underflow_fraction", "", "underflow / nonzero", K::derived, nullptr,
       [](const S& s) { return s.underflow_fraction(); }},
  };
#undef EXMY_COUNT
#undef EXMY_SUM
  return t;
}

}  // namespace exmy

#include "formats/spec.hpp"

#include <charconv>
#include <map>

#include "formats/error.hpp"
#include "formats/vocab.hpp"

namespace exmy {
namespace {

struct Preset {
  const char* name;
  Format f;
};

Format make(int E, int M, bool is_signed, int bias, bool sub, bool inf, int nans) {
  Format f;
  f.E = E;
  f.M = M;
  f.is_signed = is_signed;
  f.bias = bias;
  f.subnormals = sub;
  f.has_inf = inf;
  f.nans = nans;
  f.negzero = true;
  return f;
}

// The preset table of docs/numerics.md §1. `fp32` (IEEE binary32) is used
// internally for fp32_rne and accepted as a format like the others.
const std::vector<Preset>& presets() {
  static const std::vector<Preset> table = {
      {"e2m1", make(2, 1, true, 1, true, false, 0)},
      {"e2m3", make(2, 3, true, 1, true, false, 0)},
      {"e3m2", make(3, 2, true, 3, true, false, 0)},
      {"e4m3", make(4, 3, true, 7, true, false, 1)},
      {"e5m2", make(5, 2, true, 15, true, true, 3)},
      {"ue4m3", make(4, 3, false, 7, true, false, 1)},
      // The three UE5M3 encodings in use (public code disagrees on which
      // one "UE5M3" means): the all-ones exponent reserved (max 61,440),
      // only 0xFF as NaN (114,688), no NaN at all (122,880).
      {"ue5m3", make(5, 3, false, 15, true, false, 8)},
      {"ue5m3-fn", make(5, 3, false, 15, true, false, 1)},
      {"ue5m3-nonan", make(5, 3, false, 15, true, false, 0)},
      {"ue8m0", make(8, 0, false, 127, false, false, 1)},
      {"bf16", make(8, 7, true, 127, true, true, 127)},
      {"fp16", make(5, 10, true, 15, true, true, 1023)},
      {"fp32", make(8, 23, true, 127, true, true, (1 << 23) - 1)},
  };
  return table;
}

const std::map<std::string, std::string, std::less<>>& aliases() {
  static const std::map<std::string, std::string, std::less<>> table = {
      {"float4_e2m1fn", "e2m1"},  {"float8_e4m3fn", "e4m3"},   {"float8_e5m2", "e5m2"},
      {"float8_e8m0fnu", "ue8m0"}, {"float6_e2m3fn", "e2m3"}, {"float6_e3m2fn", "e3m2"},
      {"bfloat16", "bf16"},        {"float16", "fp16"},        {"float32", "fp32"},
  };
  return table;
}

bool parse_int(std::string_view s, int& out) {
  if (s.empty()) return false;
  const char* b = s.data();
  const char* e = s.data() + s.size();
  if (*b == '+') ++b;
  auto [p, ec] = std::from_chars(b, e, out);
  return ec == std::errc() && p == e;
}

// `[u]e<E>m<M>` with the default fields of docs/numerics.md §1.
bool parse_generic(std::string_view name, Format& f) {
  std::string_view s = name;
  bool is_signed = true;
  if (!s.empty() && s.front() == 'u') {
    is_signed = false;
    s.remove_prefix(1);
  }
  if (s.empty() || s.front() != 'e') return false;
  s.remove_prefix(1);
  const auto m = s.find('m');
  if (m == std::string_view::npos) return false;
  int E, M;
  if (!parse_int(s.substr(0, m), E) || !parse_int(s.substr(m + 1), M)) return false;
  // Canonical digits only: no sign, no leading zeros. Otherwise "e4m03" would
  // be a generic E4M3 (no NaN) beside the e4m3 preset, and format_name could
  // not tell them apart.
  auto canonical = [](std::string_view d) {
    for (char c : d)
      if (c < '0' || c > '9') return false;
    return d.size() == 1 || d.front() != '0';
  };
  if (!canonical(s.substr(0, m)) || !canonical(s.substr(m + 1))) return false;
  if (E < 0 || E > 8 || M < 0 || M > 23) return false;
  // For E = 0 there is no exponent field; bias 0 makes the codes 0..2^M-1
  // the integers times 2^(1-M) (the subnormal formula with bias 0).
  f = make(E, M, is_signed, E > 0 ? (1 << (E - 1)) - 1 : 0, true, false, 0);
  return true;
}

}  // namespace

const std::vector<std::string>& preset_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const auto& p : presets()) v.push_back(p.name);
    return v;
  }();
  return names;
}

Format parse_format(std::string_view spec) {
  const auto colon = spec.find(':');
  std::string_view name = spec.substr(0, colon);
  if (auto a = aliases().find(name); a != aliases().end()) name = a->second;
  Format f;
  bool found = false;
  for (const auto& p : presets()) {
    if (name == p.name) {
      f = p.f;
      found = true;
      break;
    }
  }
  if (!found && !parse_generic(name, f)) {
    throw Error("unknown format '" + std::string(name) + "' in spec '" + std::string(spec) +
                "' (expected a preset such as e2m1, e4m3, ue5m3, ue8m0, bf16, or [u]e<E>m<M> with E in 0..8, M in 0..23)");
  }
  if (colon != std::string_view::npos) {
    std::string_view opts = spec.substr(colon + 1);
    if (opts.empty()) throw Error("empty option list in format spec '" + std::string(spec) + "'");
    while (true) {
      const auto comma = opts.find(',');
      const std::string_view opt = opts.substr(0, comma);
      int v = 0;
      if (opt.substr(0, 5) == "bias=" && parse_int(opt.substr(5), v)) {
        if (v < -1000 || v > 1000) throw Error("bias out of range in format spec '" + std::string(spec) + "': " + std::string(opt));
        f.bias = v;
      } else if (opt == "nosub") {
        f.subnormals = false;
      } else if (opt == "inf") {
        f.has_inf = true;
      } else if (opt == "noinf") {
        f.has_inf = false;
      } else if (opt.substr(0, 5) == "nans=" && parse_int(opt.substr(5), v) && v >= 0) {
        f.nans = v;
      } else if (opt == "nonegzero") {
        f.negzero = false;
      } else {
        throw Error("unknown option '" + std::string(opt) + "' in format spec '" + std::string(spec) +
                    "' (expected bias=<int>, nosub, inf, noinf, nans=<int>, nonegzero)");
      }
      if (comma == std::string_view::npos) break;
      opts.remove_prefix(comma + 1);
    }
  }
  if (!f.finalize()) {
    throw Error("format spec '" + std::string(spec) +
                "' describes no usable format (it needs a positive finite value, and values within 2^-300..2^300)");
  }
  return f;
}

std::string format_name(const Format& f) {
  for (const auto& p : presets()) {
    const Format& q = p.f;
    if (q.E == f.E && q.M == f.M && q.is_signed == f.is_signed && q.bias == f.bias &&
        q.subnormals == f.subnormals && q.has_inf == f.has_inf && q.nans == f.nans && q.negzero == f.negzero)
      return p.name;
  }
  std::string s = std::string(f.is_signed ? "" : "u") + "e" + std::to_string(f.E) + "m" + std::to_string(f.M);
  // The options are relative to what the bare name parses to: a preset when
  // the name is one (e4m3, e5m2, ue8m0, ...), else the generic defaults.
  // Options switch subnormals and -0 off and Inf on or off, so a format with
  // subnormals or -0 where its preset has none has no spec string; the name
  // returned for it does not parse back to it.
  Format base;
  if (!parse_generic(s, base)) return s;  // E or M out of range: no usable format
  for (const auto& p : presets())
    if (s == p.name) base = p.f;
  std::vector<std::string> opts;
  if (f.bias != base.bias) opts.push_back("bias=" + std::to_string(f.bias));
  if (!f.subnormals && base.subnormals) opts.push_back("nosub");
  if (f.has_inf && !base.has_inf) opts.push_back("inf");
  if (!f.has_inf && base.has_inf) opts.push_back("noinf");
  if (f.nans != base.nans) opts.push_back("nans=" + std::to_string(f.nans));
  if (!f.negzero && base.negzero) opts.push_back("nonegzero");
  for (size_t i = 0; i < opts.size(); ++i) s += (i == 0 ? ":" : ",") + opts[i];
  return s;
}

// The names live in the rounding-mode table of formats/vocab.cpp.
const std::vector<std::string>& round_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const auto& r : round_options().rows) v.push_back(r.name);
    return v;
  }();
  return names;
}

Round parse_round(std::string_view name) { return round_options().parse(name); }

std::string_view round_name(Round mode) { return round_options().name(mode); }

}  // namespace exmy

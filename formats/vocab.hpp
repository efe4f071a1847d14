// The vocabulary of a quantization call, one table per concept: a table of
// names per option enum (rounding modes, scale rules, arithmetics, zero-scale
// policies, tensor-amax policies, code conventions, dequantization orders),
// one row per QuantSpec knob, and one row per per-call statistic. Every
// reader and writer of a QuantSpec or a QuantStats (`exmy quantize`, recipes,
// sweep-tensors, capture attributes, run-file and sweep columns, the docs
// tests) iterates these tables instead of spelling the names out again.
// Host only.
//
// Spelling rules (docs/numerics.md §7, "How option values are spelled"):
// integers are decimal or 0x-prefixed hexadecimal, the whole string;
// booleans are true or false, with on and off read as the same.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "formats/error.hpp"
#include "formats/quantize.hpp"

namespace exmy {

// ---------------------------------------------------------------------------
// Option enums
// ---------------------------------------------------------------------------

template <class E>
struct OptionRow {
  const char* name;  // as written on the command line and in recipes
  E value;
  const char* help;  // one line, shown in --help
};

template <class E>
struct OptionTable {
  const char* what;  // "rounding mode": the noun of the error message
  std::vector<OptionRow<E>> rows;

  // The value named `s`; throws exmy::Error naming `s` and every name.
  E parse(std::string_view s) const {
    for (const auto& r : rows)
      if (s == r.name) return r.value;
    throw Error("unknown " + std::string(what) + " '" + std::string(s) + "' (expected " + names() + ")");
  }
  // The name of `v` ("?" for a value no row has).
  std::string_view name(E v) const {
    for (const auto& r : rows)
      if (r.value == v) return r.name;
    return "?";
  }
  // "a, b or c".
  std::string names() const {
    std::string s;
    for (size_t i = 0; i < rows.size(); ++i)
      s += (i == 0 ? "" : i + 1 == rows.size() ? " or " : ", ") + std::string(rows[i].name);
    return s;
  }
  // One line per row, "  name  help", for --help texts.
  std::string help() const {
    size_t w = 0;
    for (const auto& r : rows) w = std::max(w, std::string_view(r.name).size());
    std::string s;
    for (const auto& r : rows) {
      const std::string n = r.name;
      s += "\n  " + n + std::string(w + 2 - n.size(), ' ') + r.help;
    }
    return s;
  }
};

const OptionTable<Round>& round_options();
const OptionTable<ScaleRule>& scale_rule_options();
const OptionTable<Arith>& arith_options();
const OptionTable<ZeroScale>& zero_scale_options();
// The named tensor-amax policies; AmaxKind::given is written as its value.
const OptionTable<AmaxKind>& tensor_amax_options();
const OptionTable<CodeConvention>& code_convention_options();
const OptionTable<DequantOrder>& dequant_order_options();
const OptionTable<FourSix>& four_over_six_options();
const OptionTable<RhtKind>& rht_kind_options();
const OptionTable<OuterScale>& outer_scale_options();

// ---------------------------------------------------------------------------
// Spelling of values
// ---------------------------------------------------------------------------

// true or on, false or off; throws exmy::Error naming `s`.
bool parse_bool_word(std::string_view s);
// Decimal or 0x-prefixed hexadecimal in lo..hi; throws exmy::Error naming
// `what` and `s`.
uint64_t parse_uint(std::string_view what, std::string_view s, uint64_t lo = 0, uint64_t hi = UINT64_MAX);
// v with 9 significant digits where they read back to v exactly, else 17.
std::string real_text(double v);
// A float32 value with 9 significant digits (they read back to it through
// float32 rounding).
std::string float_text(float v);

// ---------------------------------------------------------------------------
// QuantSpec knobs
// ---------------------------------------------------------------------------

// How a knob's value is stored where values are typed (HDF5 attributes and
// columns): text as the printed string, the others as numbers.
enum class KnobKind : uint8_t {
  text,     // string
  boolean,  // int64 0/1
  integer,  // int64
  u64,      // uint64
  real,     // double, NaN when unset ("default")
};

struct QuantKnob {
  const char* name;      // recipe key, capture attribute and column name: "scale_rule"
  const char* flag;      // `exmy quantize` option without "--": "scale-rule"
  const char* syntax;    // value syntax shown in help: "RULE"
  const char* help;      // one line
  KnobKind kind;
  // Non-null: the flag is a switch whose presence sets this value ("false"
  // for --no-saturate, "true" for --rht).
  const char* switch_value;
  // Whether the knob can be set in a recipe (the others are set per call:
  // the tensor amax by the reference policy, seed and stream per call).
  bool in_recipe;
  void (*parse)(QuantSpec&, std::string_view);
  std::string (*print)(const QuantSpec&);  // reads back through parse to the same field
  // The extra help text (the rows of the knob's option table), or null.
  std::string (*options_help)();
  // Whether the knob is written in a spec's option string (null: always);
  // the others are at a value that does not matter or the default.
  bool (*shown)(const QuantSpec&);
};

// Every knob, in the order recipes print them.
const std::vector<QuantKnob>& quant_knobs();
// The knob called `name` ('-' or '_' alike: "scale-rule" = "scale_rule");
// null when there is none. Flags are not names: --no-saturate is a switch of
// the knob `saturate`.
const QuantKnob* find_quant_knob(std::string_view name);
// Sets one knob; throws exmy::Error naming an unknown knob or a bad value.
void set_knob(QuantSpec& spec, std::string_view name, std::string_view value);

using Knobs = std::vector<std::pair<std::string, std::string>>;
// `base` with the knobs applied in order (not validated).
QuantSpec spec_from_knobs(const Knobs& knobs, QuantSpec base = {});
// Every knob of `spec` with its printed value, in table order:
// spec_from_knobs(spec_to_knobs(s)) == s.
Knobs spec_to_knobs(const QuantSpec& spec);
// A knob's value where values are typed (KnobKind), and back to the text
// its parse reads: typed_text(k, typed_value(k, s)) == k.print(s).
using KnobValue = std::variant<std::string, int64_t, uint64_t, double>;
KnobValue typed_value(const QuantKnob& knob, const QuantSpec& spec);
std::string typed_text(const QuantKnob& knob, const KnobValue& v);

// The `exmy quantize` options that reproduce `spec`: the shown knobs, as
// `--flag value` (a switch alone when set).
std::string quantize_options(const QuantSpec& spec);

// ---------------------------------------------------------------------------
// Statistics of a call (docs/numerics.md §5)
// ---------------------------------------------------------------------------

enum class StatKind : uint8_t {
  count,    // uint64 field of QuantStats
  sum,      // double field of QuantStats
  derived,  // computed from the others
};

// Whether a statistic is a column of `exmy inspect`'s worst-per-layer table
// of operands, and which way is worse: its largest value over the run (a
// count, read as a fraction of the count `per`) or its lowest.
enum class StatWorst : uint8_t { none, largest, lowest };

struct QuantStat {
  const char* name;  // JSON key, HDF5 dataset, CSV column
  const char* unit;  // "elements", "blocks", "dB", ...
  const char* description;
  StatKind kind;
  uint64_t (*count)(const QuantStats&);  // for StatKind::count
  double (*value)(const QuantStats&);    // every kind: the count as a double, the sum, the derived figure
  StatWorst worst = StatWorst::none;     // its place in `exmy inspect` (sim/eval/inspect.cpp)
  const char* per = nullptr;             // the count this one is a fraction of there
  const char* heading = nullptr;         // its column heading there
};

// The statistics of docs/numerics.md §5: the counts, the four sums, then
// the derived figures.
const std::vector<QuantStat>& quant_stats();

}  // namespace exmy

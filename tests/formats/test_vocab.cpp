// The vocabulary tables of formats/vocab.hpp: every option name parses back
// to its value, every QuantSpec knob reads back what it prints, integers and
// booleans are spelled one way for every knob, and the docs list every row.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "formats/conventions.hpp"
#include "formats/spec.hpp"
#include "formats/vocab.hpp"

#ifndef EXMY_SOURCE_DIR
#define EXMY_SOURCE_DIR "."
#endif

namespace exmy {
namespace {

template <class E>
void expect_rows_parse_back(const OptionTable<E>& t) {
  SCOPED_TRACE(t.what);
  ASSERT_FALSE(t.rows.empty());
  std::set<std::string> names;
  std::set<int> values;
  for (const auto& r : t.rows) {
    EXPECT_TRUE(names.insert(r.name).second) << "two rows named " << r.name;
    EXPECT_TRUE(values.insert(static_cast<int>(r.value)).second) << "two rows for the value of " << r.name;
    EXPECT_EQ(t.parse(r.name), r.value) << r.name;
    EXPECT_EQ(t.name(r.value), r.name);
    EXPECT_NE(std::string(r.help), "") << r.name;
    EXPECT_NE(t.help().find(r.name), std::string::npos) << r.name;
  }
  try {
    (void)t.parse("no-such-name");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("'no-such-name'"), std::string::npos) << m;
    EXPECT_NE(m.find(t.what), std::string::npos) << m;
    for (const auto& r : t.rows) EXPECT_NE(m.find(r.name), std::string::npos) << m;
  }
}

TEST(Vocab, EveryOptionRowParsesBackToItsValue) {
  expect_rows_parse_back(round_options());
  expect_rows_parse_back(scale_rule_options());
  expect_rows_parse_back(arith_options());
  expect_rows_parse_back(zero_scale_options());
  expect_rows_parse_back(tensor_amax_options());
  expect_rows_parse_back(code_convention_options());
  expect_rows_parse_back(dequant_order_options());
  expect_rows_parse_back(four_over_six_options());
  // The older entry points read the same tables.
  for (const auto& r : round_options().rows) EXPECT_EQ(parse_round(r.name), r.value);
  for (const auto& r : scale_rule_options().rows) EXPECT_EQ(parse_scale_rule(r.name), r.value);
  for (const auto& r : arith_options().rows) EXPECT_EQ(parse_arith(r.name), r.value);
  for (const auto& r : zero_scale_options().rows) EXPECT_EQ(parse_zero_scale(r.name), r.value);
  for (const auto& r : code_convention_options().rows) EXPECT_EQ(parse_code_convention(r.name), r.value);
  for (const auto& r : dequant_order_options().rows) EXPECT_EQ(parse_dequant_order(r.name), r.value);
  EXPECT_EQ(round_options().rows.size(), 9u);
  EXPECT_EQ(scale_rule_options().rows.size(), 7u);
}

// Every field of a QuantSpec, as text, for comparisons.
std::string fields(const QuantSpec& s) {
  std::ostringstream o;
  o.precision(17);
  o << format_name(s.elem) << " " << (s.scale ? format_name(*s.scale) : "-") << " " << s.block_rows << "x"
    << s.block_cols << " " << int(s.rule) << " " << int(s.amax_kind) << " " << s.amax_value << " "
    << (s.scale_target ? *s.scale_target : -1.0) << " " << int(s.round) << " " << s.sr_bits << " " << s.seed << " "
    << s.stream << " " << int(s.arith) << " " << int(s.zero_scale) << " " << s.saturate << " " << s.rht << " "
    << s.rht_signs << " " << int(s.codes) << " " << int(s.dequant) << " " << int(s.four_over_six) << " " << s.rht_size << " " << int(s.rht_kind) << " " << int(s.outer);
  return o.str();
}

// A spec whose every field differs from the default.
QuantSpec all_changed() {
  QuantSpec s;
  s.elem = parse_format("e2m1");
  s.scale = parse_format("ue5m3");
  s.block_rows = 16;
  s.block_cols = 16;
  s.rule = ScaleRule::mx_even;
  s.amax_kind = AmaxKind::given;
  s.amax_value = static_cast<float>(0.123456789);
  s.scale_target = 1.0 / 3.0;  // needs 17 digits
  s.round = Round::stochastic_fastest;
  s.sr_bits = 13;
  s.seed = 0xFFFFFFFFFFFFFFFFull;
  s.stream = 1234567;
  s.arith = Arith::fp32;
  s.zero_scale = ZeroScale::one;
  s.saturate = false;
  s.rht = true;
  s.rht_signs = 0x04D2;
  s.codes = CodeConvention::te;
  s.dequant = DequantOrder::scale_first;
  s.four_over_six = FourSix::mae;
  s.rht_size = 64;
  s.rht_kind = RhtKind::deterministic;
  s.outer = OuterScale::row;
  return s;
}

TEST(Vocab, SpecToKnobsToSpecKeepsEveryField) {
  QuantSpec def;
  def.elem = parse_format("e4m3");
  const QuantSpec changed = all_changed();
  for (const QuantSpec& s : {def, changed}) {
    const Knobs k = spec_to_knobs(s);
    ASSERT_EQ(k.size(), quant_knobs().size());
    EXPECT_EQ(fields(spec_from_knobs(k)), fields(s));
  }
  // Each knob alone carries its field: applied to the default spec it
  // changes exactly what it names, and every knob changes something.
  for (const QuantKnob& knob : quant_knobs()) {
    SCOPED_TRACE(knob.name);
    QuantSpec one = def;
    knob.parse(one, knob.print(changed));
    EXPECT_NE(fields(one), fields(def));
    EXPECT_EQ(knob.print(one), knob.print(changed));
    // The typed form (HDF5 attributes) reads back to the same text.
    EXPECT_EQ(typed_text(knob, typed_value(knob, changed)), knob.print(changed));
    EXPECT_EQ(typed_text(knob, typed_value(knob, def)), knob.print(def));
    EXPECT_EQ(find_quant_knob(knob.name), &knob);
    std::string dashed = knob.name;
    for (char& c : dashed)
      if (c == '_') c = '-';
    EXPECT_EQ(find_quant_knob(dashed), &knob);
  }
  // The option string names every shown knob and nothing else.
  const std::string o = quantize_options(changed);
  for (const QuantKnob& knob : quant_knobs())
    EXPECT_NE(o.find(std::string("--") + knob.flag), std::string::npos) << knob.flag << ": " << o;
  EXPECT_EQ(quantize_options(def), "--elem e4m3 --scale none --block 1x16 --scale-rule amax-rne --tensor-amax none "
                                   "--round rne --seed 0 --stream 0 --arith exact --zero-scale zero");
}

// Integers are decimal or 0x-prefixed hex for every knob: before the table,
// a recipe read rht_signs = 1234 as 0x1234 while --rht-signs 1234 was 0x04D2.
TEST(Vocab, IntegersAreDecimalOrPrefixedHexForEveryKnob) {
  QuantSpec s;
  set_knob(s, "rht_signs", "1234");
  EXPECT_EQ(s.rht_signs, 1234);
  set_knob(s, "rht-signs", "0x1234");
  EXPECT_EQ(s.rht_signs, 0x1234);
  set_knob(s, "rht_signs", "0XD7E8");
  EXPECT_EQ(s.rht_signs, 0xD7E8);
  set_knob(s, "sr_bits", "0x10");
  EXPECT_EQ(s.sr_bits, 16);
  set_knob(s, "seed", "0x10");
  EXPECT_EQ(s.seed, 16u);
  set_knob(s, "stream", "10");
  EXPECT_EQ(s.stream, 10u);
  for (const char* bad : {"D7E8", "0x", "0x1FFFF", "-1", "12 ", ""}) {
    SCOPED_TRACE(bad);
    EXPECT_THROW(set_knob(s, "rht_signs", bad), Error);
  }
  // A given tensor amax is a float32 value: one that rounds to 0 or Inf there
  // would print as a value the knob refuses.
  for (const char* bad : {"1e-50", "1e39", "0", "-1", "nan", "inf"}) EXPECT_THROW(set_knob(s, "tensor_amax", bad), Error) << bad;
  set_knob(s, "tensor_amax", "1e-40");  // a float32 subnormal
  EXPECT_EQ(s.amax_value, static_cast<double>(1e-40f));
  EXPECT_EQ(find_quant_knob("tensor_amax")->print(s), "9.9999461e-41");
  EXPECT_THROW(set_knob(s, "sr_bits", "0"), Error);
  EXPECT_THROW(set_knob(s, "sr_bits", "33"), Error);
}

TEST(Vocab, BooleansHaveOneSetOfSpellings) {
  for (const char* name : {"saturate", "rht"}) {
    SCOPED_TRACE(name);
    for (const char* t : {"true", "on"}) {
      QuantSpec s;
      s.saturate = false;
      set_knob(s, name, t);
      EXPECT_TRUE(std::string_view(name) == "rht" ? s.rht : s.saturate) << t;
    }
    for (const char* f : {"false", "off"}) {
      QuantSpec s;
      s.rht = true;
      set_knob(s, name, f);
      EXPECT_FALSE(std::string_view(name) == "rht" ? s.rht : s.saturate) << f;
    }
    QuantSpec s;
    EXPECT_THROW(set_knob(s, name, "maybe"), Error);
    for (const char* bad : {"True", "yes", "no", "1", "0", ""}) EXPECT_THROW(set_knob(s, name, bad), Error) << bad;
  }
}

TEST(Vocab, UnknownKnobIsAnErrorNamingIt) {
  QuantSpec s;
  try {
    set_knob(s, "rounding", "rne");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'rounding'"), std::string::npos) << e.what();
  }
  // A switch's flag is not a knob name: --no-saturate is the knob saturate.
  EXPECT_EQ(find_quant_knob("no-saturate"), nullptr);
}

TEST(Vocab, StatisticsTableCoversQuantStats) {
  QuantStats st;
  st.elements = 1, st.nonzero = 2, st.underflow = 3, st.saturated = 4, st.subnormal = 5;
  st.blocks = 6, st.scale_underflow = 7, st.scale_subnormal = 8, st.scale_saturated = 9;
  st.sum_sq = 10, st.sum_sq_err = 11, st.sum_err = 12, st.sum_abs = 13;
  st.scale_four = 14;
  std::set<std::string> names;
  double counts = 0, sums = 0;
  size_t derived = 0;
  for (const QuantStat& s : quant_stats()) {
    EXPECT_TRUE(names.insert(s.name).second) << s.name;
    ASSERT_NE(s.value, nullptr) << s.name;
    if (s.kind == StatKind::count) {
      ASSERT_NE(s.count, nullptr) << s.name;
      EXPECT_EQ(static_cast<double>(s.count(st)), s.value(st)) << s.name;
      counts += s.value(st);
    } else if (s.kind == StatKind::sum) {
      sums += s.value(st);
    } else {
      ++derived;
    }
  }
  // Every field of QuantStats is a row: 1 + ... + 9 + 14 and 10 + ... + 13.
  EXPECT_EQ(counts, 59.0);
  EXPECT_EQ(sums, 46.0);
  EXPECT_EQ(derived, 4u);
}

// QuantStats::add_counts (streamed bands) adds every count of the table and
// leaves the sums alone.
TEST(Vocab, AddCountsAddsEveryCountOfTheTable) {
  QuantStats a, b;
  uint64_t k = 1;
  for (const QuantStat& s : quant_stats()) {
    if (s.kind != StatKind::count) continue;
    // the table's accessor reads the field; set it through a pointer found by value
    auto set = [&](QuantStats& st, uint64_t v) {
      for (uint64_t* f : {&st.elements, &st.nonzero, &st.underflow, &st.saturated, &st.subnormal, &st.blocks,
                          &st.scale_underflow, &st.scale_subnormal, &st.scale_saturated, &st.scale_four}) {
        const uint64_t old = *f;
        *f = 0xdead;
        const bool mine = s.count(st) == 0xdead;
        *f = old;
        if (mine) *f = v;
      }
    };
    set(a, k);
    set(b, 100 * k);
    ++k;
  }
  a.sum_sq = 1.5, b.sum_sq = 2.5;
  QuantStats c = a;
  c.add_counts(b);
  for (const QuantStat& s : quant_stats()) {
    if (s.kind == StatKind::count) {
      EXPECT_EQ(s.count(c), s.count(a) + s.count(b)) << s.name;
    }
  }
  EXPECT_EQ(c.sum_sq, 1.5);
}

std::string read_doc(const std::string& rel) {
  std::ifstream in(std::string(EXMY_SOURCE_DIR) + "/" + rel);
  std::stringstream ss;
  ss << in.rdbuf();
  EXPECT_FALSE(ss.str().empty()) << rel;
  return ss.str();
}

// The docs list every row of the tables: the statistics (docs/numerics.md
// §5 and the /quant columns of docs/hdf5-schema.md), the knobs (the capture
// attributes of docs/hdf5-schema.md, `exmy quantize` in docs/numerics.md §7,
// the recipe knobs of docs/recipes.md) and the option names.
TEST(Vocab, DocsListEveryRow) {
  const std::string numerics = read_doc("docs/numerics.md");
  const std::string schema = read_doc("docs/hdf5-schema.md");
  const std::string recipes = read_doc("docs/recipes.md");
  const std::string sweeps = read_doc("docs/sweeps.md");
  for (const QuantStat& s : quant_stats()) {
    if (s.kind != StatKind::derived) {
      EXPECT_NE(numerics.find("`" + std::string(s.name) + "`"), std::string::npos) << s.name;
    }
    EXPECT_NE(schema.find("`/quant/<layer>/<gemm>/<operand>/" + std::string(s.name) + "`"), std::string::npos) << s.name;
  }
  for (const QuantKnob& k : quant_knobs()) {
    const std::string n = k.name;
    EXPECT_NE(schema.find("| `" + n + "` | `/capture/step_<N>/<layer>/<gemm>/<operand>` |"), std::string::npos) << n;
    EXPECT_NE(numerics.find("--" + std::string(k.flag)), std::string::npos) << k.flag;
    if (k.in_recipe) {
      EXPECT_NE(recipes.find("| `" + n + "` |"), std::string::npos) << n;
    }
    std::string dashed = n;
    for (char& c : dashed)
      if (c == '_') c = '-';
    EXPECT_NE(sweeps.find("`" + dashed + "`"), std::string::npos) << dashed;
  }
  for (const auto& r : round_options().rows) EXPECT_NE(numerics.find("`" + std::string(r.name) + "`"), std::string::npos);
  for (const auto& r : scale_rule_options().rows)
    EXPECT_NE(numerics.find("`" + std::string(r.name) + "`"), std::string::npos) << r.name;
}

}  // namespace
}  // namespace exmy

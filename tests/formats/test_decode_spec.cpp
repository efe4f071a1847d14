// The format model of docs/numerics.md §1: Format::classify and Format::decode of
// every code against the rational reference's table (zero, subnormal,
// normal, Inf, NaN, exact values, signs), the derived constants, the preset
// table, the ml_dtypes aliases, and the errors of the spec parser and of the
// other option parsers (each names the bad token).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "exact_ref.hpp"
#include "formats/error.hpp"
#include "formats/quantize.hpp"
#include "formats/spec.hpp"
#include "test_support.hpp"

namespace exmy {
namespace {

using ref::Rat;
using test::hex;
using test::hexcode;

// Compares classify/decode of one code with the reference; returns the class.
CodeClass check_code(const std::string& spec, const Format& f, const ref::Table& t, uint32_t code, int& reported) {
  const ref::CodeInfo want = t.info(code);
  const CodeClass cls = f.classify(code);
  const double v = f.decode(code);
  bool ok = cls == want.cls;
  if (ok) {
    switch (want.cls) {
      case CodeClass::nan: ok = std::isnan(v); break;
      case CodeClass::inf: ok = std::isinf(v) && std::signbit(v) == want.neg; break;
      default: ok = std::isfinite(v) && ref::exact(v) == want.value && std::signbit(v) == want.neg; break;
    }
  }
  if (!ok && ++reported <= 10) {
    ADD_FAILURE() << spec << " code " << hexcode(code) << ": classify " << static_cast<int>(cls) << " decode "
                  << hex(v) << "; expected class " << static_cast<int>(want.cls) << " value "
                  << (want.neg ? "-" : "+") << ref::str(want.value);
  }
  return want.cls;
}

class Decode : public ::testing::TestWithParam<const char*> {};

TEST_P(Decode, EveryCodeMatchesTheTable) {
  const std::string spec = GetParam();
  const Format f = parse_format(spec);
  const ref::Table t(f);
  ASSERT_EQ(f.bits, t.bits()) << spec;
  int reported = 0;
  size_t per_class[5] = {};
  if (t.bits() <= 16) {
    for (uint64_t c = 0; c < t.code_count(); ++c) ++per_class[static_cast<int>(check_code(spec, f, t, static_cast<uint32_t>(c), reported))];
  } else {
    // fp32-sized formats: the lowest and highest codes of each sign, the
    // binade edges, and random codes.
    test::Rng rng(7);
    std::vector<uint32_t> codes;
    const uint32_t sign = f.is_signed ? uint32_t{1} << (f.E + f.M) : 0u;
    for (uint32_t k = 0; k < 4096; ++k) {
      codes.push_back(k);
      codes.push_back(t.mag_count() - 1 - k);
    }
    for (uint32_t e = 1; e < (uint32_t{1} << f.E); ++e) {
      codes.push_back((e << f.M) - 1);
      codes.push_back(e << f.M);
    }
    for (int k = 0; k < 20000; ++k) codes.push_back(static_cast<uint32_t>(rng.u64() % t.mag_count()));
    for (uint32_t c : codes) {
      for (uint32_t s : {0u, sign}) ++per_class[static_cast<int>(check_code(spec, f, t, c | s, reported))];
    }
  }
  EXPECT_EQ(reported, 0) << spec << ": " << reported << " codes decode wrongly";
  // Not vacuous: normal codes exist, and the formats' special codes were seen.
  EXPECT_GT(per_class[static_cast<int>(CodeClass::normal)] + per_class[static_cast<int>(CodeClass::subnormal)], 0u);
  EXPECT_EQ(per_class[static_cast<int>(CodeClass::inf)] > 0, f.has_inf) << spec;
  EXPECT_EQ(per_class[static_cast<int>(CodeClass::nan)] > 0, t.has_nan()) << spec;
  EXPECT_EQ(per_class[static_cast<int>(CodeClass::zero)] > 0, t.has_zero()) << spec;

  // The derived constants the rounding core relies on.
  EXPECT_EQ(ref::exact(f.max), t.max()) << spec << " max " << hex(f.max) << " expected " << ref::str(t.max());
  EXPECT_EQ(ref::exact(f.min_pos), t.min_pos()) << spec << " min_pos " << hex(f.min_pos);
  EXPECT_EQ(f.has_zero, t.has_zero()) << spec;
  EXPECT_EQ(f.has_nan, t.has_nan()) << spec;
  EXPECT_EQ(f.max_mag, t.fcode(t.nfinite() - 1)) << spec;
  EXPECT_EQ(f.max_exp, ref::Table::floor_log2(t.max())) << spec;
  if (f.has_nan) {
    EXPECT_EQ(t.info(f.nan_code).cls, CodeClass::nan) << spec << " nan_code " << hexcode(f.nan_code);
  }
  if (f.has_inf) {
    EXPECT_EQ(t.info(f.inf_mag()).cls, CodeClass::inf) << spec;
  }
  // Finite magnitudes in value order have increasing codes: the rounding
  // core and the lazy reference for wide formats both rely on it.
  if (t.enumerated()) {
    for (size_t i = 1; i < t.nfinite(); ++i) ASSERT_LT(t.fcode(i - 1), t.fcode(i)) << spec << " index " << i;
  }
  // The canonical name parses back to the same fields.
  const Format g = parse_format(format_name(f));
  EXPECT_TRUE(g.E == f.E && g.M == f.M && g.is_signed == f.is_signed && g.bias == f.bias &&
              g.subnormals == f.subnormals && g.has_inf == f.has_inf && g.nans == f.nans && g.negzero == f.negzero)
      << spec << " -> " << format_name(f);
}

INSTANTIATE_TEST_SUITE_P(
    Formats, Decode,
    ::testing::Values("e2m1", "e2m3", "e3m2", "e4m3", "e5m2", "ue4m3", "ue5m3", "ue8m0", "bf16", "fp16", "fp32",
                      "e1m0", "e3m0", "e8m0", "e4m7", "ue6m1", "e0m1", "e0m3", "ue0m4", "e0m3:inf", "e0m4:nans=2",
                      "e0m3:nosub", "e2m1:nosub", "e4m3:nosub", "e3m0:nosub", "ue4m0:nosub", "ue8m0:bias=100",
                      "e3m0:nosub,nonegzero", "e2m1:bias=-2", "e8m3:bias=200", "e4m3:inf", "e1m3:nans=8",
                      "e5m2:nonegzero", "e4m3:bias=8,nans=0,nonegzero", "ue5m3:nans=0", "e2m2:nosub,inf",
                      "e5m10:nans=0", "e5m20", "ue8m23:nosub"),
    [](const ::testing::TestParamInfo<const char*>& i) {
      std::string s = i.param;
      for (char& ch : s)
        if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
      return s;
    });

// The preset table of docs/numerics.md §1, field by field, with max and min positive.
TEST(Presets, NumericsTable) {
  struct Row {
    const char* name;
    int E, M;
    bool is_signed;
    int bias;
    bool sub, inf;
    int nans;
    double max, min_pos;
  };
  const Row rows[] = {
      {"e2m1", 2, 1, true, 1, true, false, 0, 6.0, 0.5},
      {"e2m3", 2, 3, true, 1, true, false, 0, 7.5, 0.125},
      {"e3m2", 3, 2, true, 3, true, false, 0, 28.0, 0.0625},
      {"e4m3", 4, 3, true, 7, true, false, 1, 448.0, 0x1p-9},
      {"e5m2", 5, 2, true, 15, true, true, 3, 57344.0, 0x1p-16},
      {"ue4m3", 4, 3, false, 7, true, false, 1, 448.0, 0x1p-9},
      {"ue5m3", 5, 3, false, 15, true, false, 8, 61440.0, 0x1p-17},
      {"ue8m0", 8, 0, false, 127, false, false, 1, 0x1p127, 0x1p-127},
      {"bf16", 8, 7, true, 127, true, true, 127, 0x1.fep127, 0x1p-133},
      {"fp16", 5, 10, true, 15, true, true, 1023, 65504.0, 0x1p-24},
  };
  ASSERT_GE(preset_names().size(), std::size(rows));
  for (const Row& r : rows) {
    const Format f = parse_format(r.name);
    EXPECT_EQ(f.E, r.E) << r.name;
    EXPECT_EQ(f.M, r.M) << r.name;
    EXPECT_EQ(f.is_signed, r.is_signed) << r.name;
    EXPECT_EQ(f.bias, r.bias) << r.name;
    EXPECT_EQ(f.subnormals, r.sub) << r.name;
    EXPECT_EQ(f.has_inf, r.inf) << r.name;
    EXPECT_EQ(f.nans, r.nans) << r.name;
    EXPECT_TRUE(f.negzero) << r.name;
    EXPECT_EQ(f.max, r.max) << r.name << " max " << hex(f.max);
    EXPECT_EQ(f.min_pos, r.min_pos) << r.name << " min_pos " << hex(f.min_pos);
    // and the same facts from the reference's own table of the fields
    const ref::Table t(f);
    EXPECT_EQ(t.max(), ref::exact(r.max)) << r.name;
    EXPECT_EQ(t.min_pos(), ref::exact(r.min_pos)) << r.name;
    EXPECT_NE(std::find(preset_names().begin(), preset_names().end(), r.name), preset_names().end()) << r.name;
  }
  EXPECT_NEAR(parse_format("bf16").max, 3.39e38, 0.01e38);
  // The facts docs/numerics.md §1 spells out.
  const Format ue8m0 = parse_format("ue8m0"), ue5m3 = parse_format("ue5m3");
  EXPECT_EQ(ue8m0.decode(0), 0x1p-127);
  EXPECT_EQ(ue8m0.classify(0), CodeClass::normal);
  EXPECT_EQ(ue8m0.classify(255), CodeClass::nan);
  EXPECT_EQ(ue5m3.decode(ue5m3.max_mag), 61440.0);
  EXPECT_EQ(ue5m3.classify(0xf8), CodeClass::nan);  // the whole top binade is reserved
  EXPECT_EQ(ue5m3.decode(0xf7), 61440.0);
  EXPECT_EQ(parse_format("e4m3").classify(0x7f), CodeClass::nan);
  EXPECT_EQ(parse_format("e4m3").decode(0x7e), 448.0);
  EXPECT_EQ(parse_format("e5m2").classify(0x7c), CodeClass::inf);
  EXPECT_EQ(parse_format("e5m2").classify(0xfc), CodeClass::inf);
  EXPECT_TRUE(std::signbit(parse_format("e2m1").decode(0x8)));  // -0
}

// The three UE5M3 encodings in public code, side by side: the all-ones
// exponent reserved (the IEEE-style reading, max 61,440, codes 0xF8-0xFF
// NaN), only 0xFF NaN (max 114,688 = 2^16 x 1.75), no NaN (max 122,880 =
// 2^16 x 1.875). The values here are computed from the encoding.
TEST(Presets, ThreeUe5m3Encodings) {
  const Format a = parse_format("ue5m3"), b = parse_format("ue5m3-fn"), c = parse_format("ue5m3-nonan");
  EXPECT_EQ(a.max, 61440.0);
  EXPECT_EQ(b.max, std::ldexp(1.75, 16));
  EXPECT_EQ(c.max, std::ldexp(1.875, 16));
  EXPECT_EQ(a.nans, 8);
  EXPECT_EQ(b.nans, 1);
  EXPECT_EQ(c.nans, 0);
  EXPECT_TRUE(b.has_nan);
  EXPECT_FALSE(c.has_nan);
  for (const Format* f : {&a, &b, &c}) {
    EXPECT_EQ(f->min_pos, std::ldexp(1.0, -17));  // the same subnormals
    EXPECT_FALSE(f->is_signed);
  }
  EXPECT_EQ(format_name(parse_format("ue5m3:nans=1")), "ue5m3-fn");
  EXPECT_EQ(format_name(parse_format("ue5m3:nans=0")), "ue5m3-nonan");
  EXPECT_EQ(format_name(parse_format("ue5m3-fn:nans=8")), "ue5m3");
}

TEST(Presets, MlDtypesAliases) {
  const std::pair<const char*, const char*> aliases[] = {
      {"float4_e2m1fn", "e2m1"}, {"float8_e4m3fn", "e4m3"}, {"float8_e5m2", "e5m2"},
      {"float8_e8m0fnu", "ue8m0"}, {"float6_e2m3fn", "e2m3"}, {"float6_e3m2fn", "e3m2"},
  };
  for (const auto& [alias, name] : aliases) {
    const Format a = parse_format(alias), b = parse_format(name);
    EXPECT_TRUE(a.E == b.E && a.M == b.M && a.is_signed == b.is_signed && a.bias == b.bias &&
                a.subnormals == b.subnormals && a.has_inf == b.has_inf && a.nans == b.nans && a.negzero == b.negzero)
        << alias << " is not " << name;
    // options apply to an alias like to the preset
    EXPECT_EQ(parse_format(std::string(alias) + ":nosub").subnormals, false) << alias;
  }
}

// Generic names take the defaults of docs/numerics.md §1.
TEST(Presets, GenericDefaults) {
  for (int E = 1; E <= 8; ++E) {
    for (int M : {0, 1, 5, 23}) {
      if (E == 8 && M == 0) continue;
      for (bool u : {false, true}) {
        const std::string name = std::string(u ? "u" : "") + "e" + std::to_string(E) + "m" + std::to_string(M);
        bool preset = false;
        for (const auto& p : preset_names()) preset = preset || p == name;
        if (preset) continue;
        const Format f = parse_format(name);
        EXPECT_EQ(f.bias, (1 << (E - 1)) - 1) << name;
        EXPECT_EQ(f.is_signed, !u) << name;
        EXPECT_TRUE(f.subnormals && !f.has_inf && f.nans == 0 && f.negzero) << name;
      }
    }
  }
  const Format f = parse_format("e4m3:bias=3,nosub,inf,nans=2,nonegzero");
  EXPECT_TRUE(f.bias == 3 && !f.subnormals && f.has_inf && f.nans == 2 && !f.negzero);
}

// Expects `call` to throw exmy::Error whose message contains `token`.
template <class F>
void expect_error_naming(F call, const std::string& token, const std::string& what) {
  try {
    call();
    ADD_FAILURE() << what << ": no exmy::Error thrown";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(token), std::string::npos)
        << what << ": message does not name '" << token << "': " << e.what();
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << what << ": message is not one line";
  } catch (const std::exception& e) {
    ADD_FAILURE() << what << ": threw something other than exmy::Error: " << e.what();
  }
}

TEST(SpecErrors, FormatNamesAndOptions) {
  // unknown names
  for (const char* s : {"e9m1", "e4m24", "foo", "E4M3", "e4m3x", "ue", "em3", "e-1m2", "u", "", "float8_e4m3",
                        "fp8", "e4m3fnuz"}) {
    expect_error_naming([&] { parse_format(s); }, std::string("'") + s + "'", std::string("spec '") + s + "'");
  }
  // bad options: the message names the option
  const std::pair<const char*, const char*> bad_opts[] = {
      {"e2m1:bogus", "bogus"},         {"e2m1:bias=x", "bias=x"},      {"e2m1:nans=-1", "nans=-1"},
      {"e2m1:inf,nosub,wat", "wat"},   {"e2m1:bias=", "bias="},        {"e4m3:NOSUB", "NOSUB"},
      {"e4m3:nans=1.5", "nans=1.5"},   {"e4m3:bias=1e3", "bias=1e3"},  {"e4m3:inf=1", "inf=1"},
      {"ue8m0:nonegzero=0", "nonegzero=0"}, {"e4m3: nosub", " nosub"},
  };
  for (const auto& [spec_, token] : bad_opts) {
    const char* spec = spec_;  // (clang 14 cannot capture a structured binding)
    expect_error_naming([&] { parse_format(spec); }, token, std::string("spec '") + spec + "'");
  }
  // empty option lists and empty tokens are errors too
  for (const char* s : {"e2m1:", "e2m1:nosub,", "e2m1:,inf", "e2m1:nosub,,inf"})
    EXPECT_THROW(parse_format(s), Error) << s;
  // fields that leave no usable format: the message names the spec
  for (const char* s : {"e2m1:nans=8", "e2m1:nans=7", "ue8m0:nans=256", "e1m0:nans=1", "e8m23:bias=-1000"})
    expect_error_naming([&] { parse_format(s); }, s, std::string("spec '") + s + "'");
}

// Regressions found by fuzzing: names with leading zeros or signs are not
// formats (they would shadow presets), and canonical names of formats that
// differ from a preset parse back to the same fields.
TEST(SpecNames, CanonicalDigitsAndPresetRelativeOptions) {
  for (const char* s : {"ue8m00", "e4m03", "e04m3", "e+4m3", "e-0m3", "e4m+3"}) EXPECT_THROW(parse_format(s), Error) << s;
  for (const char* s : {"e4m3:nonegzero,nans=0", "ue5m3:nans=0", "e4m3:bias=8,nans=0,nonegzero", "e5m2:noinf",
                        "e5m2:noinf,nans=0", "e2m1:inf,nosub", "bf16:noinf", "ue8m0:nans=0,bias=100"}) {
    const Format f = parse_format(s);
    const std::string name = format_name(f);
    const Format g = parse_format(name);
    EXPECT_TRUE(f.E == g.E && f.M == g.M && f.is_signed == g.is_signed && f.bias == g.bias &&
                f.subnormals == g.subnormals && f.has_inf == g.has_inf && f.nans == g.nans && f.negzero == g.negzero)
        << s << " -> " << name;
  }
  // noinf: E5M2 without Inf keeps its 3 NaN codes; the former Inf code 0x7C
  // becomes the largest finite value, 2^16
  const Format e5 = parse_format("e5m2:noinf");
  EXPECT_FALSE(e5.has_inf);
  EXPECT_EQ(e5.max, 65536.0);
  EXPECT_EQ(format_name(e5), "e5m2:noinf");
}

TEST(SpecErrors, OtherOptionParsers) {
  expect_error_naming([] { parse_round("nearest"); }, "nearest", "round");
  expect_error_naming([] { parse_round("RNE"); }, "RNE", "round");
  expect_error_naming([] { parse_scale_rule("amax"); }, "amax", "scale rule");
  expect_error_naming([] { parse_arith("fp64"); }, "fp64", "arith");
  expect_error_naming([] { parse_zero_scale("two"); }, "two", "zero scale");
  int r = 0, c = 0;
  for (const char* b : {"3x5", "0x16", "16", "1x", "x1", "1x-2", "axb"})
    expect_error_naming([&] { parse_block(b, r, c); }, b, std::string("block ") + b);
  AmaxKind k;
  double v;
  for (const char* a : {"-1", "0", "abc", "inf", "nan", "1e999"})
    expect_error_naming([&] { parse_tensor_amax(a, k, v); }, a, std::string("amax ") + a);
  // and the good spellings
  for (const auto& n : round_names()) EXPECT_EQ(round_name(parse_round(n)), n);
  EXPECT_EQ(round_names().size(), 9u);
  parse_block("16x16", r, c);
  EXPECT_TRUE(r == 16 && c == 16);
  parse_tensor_amax("2.5", k, v);
  EXPECT_TRUE(k == AmaxKind::given && v == 2.5);
}

TEST(SpecErrors, QuantSpecValidation) {
  QuantSpec s;
  s.elem = parse_format("e2m1");
  s.round = Round::stochastic;
  for (int bits : {0, 33, -1}) {
    s.sr_bits = bits;
    expect_error_naming([&] { s.validate(); }, std::to_string(bits), "sr_bits");
  }
  s.sr_bits = 8;
  s.validate();
  s.rht = true;
  s.block_cols = 32;
  EXPECT_THROW(s.validate(), Error);
  s.block_cols = 16;
  s.validate();
  s.block_rows = 2;
  s.block_cols = 3;
  s.rht = false;
  EXPECT_THROW(s.validate(), Error);
  s.block_rows = 1;
  s.block_cols = 16;
  s.scale_target = -1.0;
  EXPECT_THROW(s.validate(), Error);
}

}  // namespace
}  // namespace exmy

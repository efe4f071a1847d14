// The rounding core (formats/round.hpp) against the rational reference of
// exact_ref.hpp, exhaustively.
//
// encode_exact: for every format with at most 16 bits (presets and a few
// dozen generic ones; those with more than 512 finite values, such as bf16
// and fp16, at both sides of every binade edge, the ends, a stride and
// random picks) at every representable value, every midpoint, points at
// δ = 1/4 and 3/4, stochastic decision boundaries δ = j / 2^(n+1), one
// double-ulp on each side of all of those and one float-ulp on each side of
// the values and midpoints, values beyond max and below the smallest
// positive value, and the negatives of everything; in every rounding mode,
// the stochastic ones with n in {1, 4, 8, 12, 16, 24, 32} and r at the
// corners of [0, 2^n) and on both sides of the r where the decision flips;
// saturation on and off.
//
// encode_quotient: num = x * t (an exact product of two floats) over a scale
// value den, random draws and constructed near-ties (num = boundary * den,
// then nudged by one double-ulp), including the 128-bit path of formats
// with M >= 20 and n = 28..32.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "exact_ref.hpp"
#include "formats/round.hpp"
#include "formats/spec.hpp"
#include "test_support.hpp"

namespace exmy {
namespace {

using ref::Rat;
using test::hex;
using test::hexcode;

const std::vector<int> kAllBits = {1, 4, 8, 12, 16, 24, 32};

// The r values probed for one (point, mode, n): the corners 0 and 2^n - 1,
// the middle 2^(n-1) and 2^(n-1) - 1, and the two r on either side of the
// smallest r that goes away (where an off-by-one would show).
struct RValues {
  uint32_t v[6];
  int count = 0;
  const uint32_t* begin() const { return v; }
  const uint32_t* end() const { return v + count; }
};
RValues r_values(const ref::Located& l, ref::Mode m, int n) {
  const uint64_t top = (uint64_t{1} << n) - 1;
  // (top + 1 marks an unused slot)
  uint64_t cand[6] = {0, top, uint64_t{1} << (n - 1), (uint64_t{1} << (n - 1)) - 1, top + 1, top + 1};
  if (!l.past() && !l.below_min()) {
    const uint64_t t = l.threshold(m, n);
    cand[4] = t;
    if (t > 0) cand[5] = t - 1;
  }
  RValues out;
  for (uint64_t r : cand)
    if (r <= top && std::find(out.begin(), out.end(), static_cast<uint32_t>(r)) == out.end())
      out.v[out.count++] = static_cast<uint32_t>(r);
  return out;
}

// Compares production results with the reference for one format, and keeps
// the evidence that the comparison was not vacuous.
class Checker {
 public:
  explicit Checker(const std::string& spec) : spec_(spec), f_(parse_format(spec)), t_(f_) {}
  const Format& f() const { return f_; }
  const ref::Table& t() const { return t_; }

  // Every mode on one input; enc(mode, n, r, saturate) is the production call.
  template <class Enc>
  void all_modes(const std::string& input, const ref::Located& l, Enc enc, const std::vector<int>& bits) {
    for (bool sat : {true, false}) {
      for (Round m : test::kDeterministic) one(input, l, m, 0, 0, sat, enc(m, 0, 0, sat));
      for (Round m : test::kStochastic)
        for (int n : bits) {
          // Below max saturation changes nothing; one n is enough to show it.
          if (!sat && !l.above_max() && n != bits[bits.size() / 2]) continue;
          for (uint32_t r : r_values(l, test::to_ref(m), n)) one(input, l, m, n, r, sat, enc(m, n, r, sat));
        }
    }
  }

  void one(const std::string& input, const ref::Located& l, Round m, int n, uint32_t r, bool sat,
           const Encoded& got) {
    const ref::Result want = ref::encode(t_, l, test::to_ref(m), n, r, sat);
    ++compared_;
    // evidence of both directions, from inputs where the direction matters
    if (!l.past() && !l.below_min() && !l.zero() && (t_.is_signed() || !l.neg())) {
      ++(l.away(test::to_ref(m), n, r) ? away_ : stay_)[static_cast<int>(m)];
    }
    overflow_special_ += want.nan || want.unrepresentable || (!sat && t_.has_inf() && l.above_max());
    above_max_ += want.above_max;
    bool ok = got.above_max == want.above_max && got.unrepresentable == want.unrepresentable;
    if (ok && !want.unrepresentable)
      ok = want.nan ? t_.info(got.code).cls == CodeClass::nan : got.code == want.code;
    if (ok) return;
    if (++failures_ > kMaxReports) return;
    ADD_FAILURE() << spec_ << " " << test::mode_name(m) << " n=" << n << " r=" << hexcode(r)
                  << " saturate=" << sat << " input " << input << ": got code " << hexcode(got.code)
                  << " above_max=" << got.above_max << " unrepresentable=" << got.unrepresentable
                  << "; expected " << (want.nan ? std::string("a NaN code") : hexcode(want.code))
                  << " above_max=" << want.above_max << " unrepresentable=" << want.unrepresentable
                  << " (lo code " << hexcode(l.lo_code()) << ", delta " << ref::str(l.delta())
                  << (l.past() ? ", past max" : "") << (l.below_min() ? ", below min" : "") << ")";
  }

  // The final verdict and the non-vacuity checks.
  void finish() const {
    EXPECT_EQ(failures_, 0u) << spec_ << ": " << failures_ << " of " << compared_ << " comparisons failed";
    EXPECT_GT(compared_, 1000u) << spec_;
    EXPECT_GT(above_max_, 0u) << spec_;
    for (Round m : test::kAllModes) {
      const int i = static_cast<int>(m);
      // rtz never goes away. Unsigned formats map negative values to code 0
      // whatever the mode, so there down never goes away and up stays only
      // on exact values.
      if (m != Round::up || t_.is_signed()) {
        EXPECT_GT(stay_[i], 0u) << spec_ << " " << test::mode_name(m) << ": never rounded toward lo";
      }
      if (m != Round::rtz && (m != Round::down || t_.is_signed())) {
        EXPECT_GT(away_[i], 0u) << spec_ << " " << test::mode_name(m) << ": never rounded away";
      }
    }
    EXPECT_GT(overflow_special_, 0u) << spec_ << ": no overflow to Inf/NaN/error";
  }

 private:
  static constexpr uint64_t kMaxReports = 12;
  std::string spec_;
  Format f_;
  ref::Table t_;
  uint64_t compared_ = 0, failures_ = 0, above_max_ = 0, overflow_special_ = 0;
  uint64_t away_[9] = {}, stay_[9] = {};
};

// The double holding q exactly, if there is one.
bool as_double(const Rat& q, double& d) {
  d = ref::to_double(q);
  return std::isfinite(d) && ref::exact(d) == q;
}

// Indices of finite magnitudes to visit: all of them for small formats; for
// wide ones the first and last few, both sides of every binade edge (where
// the exponent field changes), a stride through the rest and random picks.
std::vector<size_t> indices_to_visit(const ref::Table& t, const Format& f, test::Rng& rng, size_t limit) {
  const size_t n = t.nfinite();
  if (n <= limit) {
    std::vector<size_t> all(n);
    for (size_t i = 0; i < n; ++i) all[i] = i;
    return all;
  }
  std::set<size_t> s;
  for (size_t i = 0; i < 8; ++i) {
    s.insert(i);
    s.insert(n - 1 - i);
  }
  for (size_t i = 1; i < n; ++i) {
    if ((t.fcode(i) >> f.M) != (t.fcode(i - 1) >> f.M)) {
      s.insert(i - 1);
      s.insert(i);
    }
  }
  for (size_t i = 0; i < n; i += n / 128) s.insert(i);
  for (int k = 0; k < 100; ++k) s.insert(static_cast<size_t>(rng.range(0, static_cast<int64_t>(n) - 1)));
  return {s.begin(), s.end()};
}

// Test inputs around finite magnitude index i: lo itself, the midpoint to
// the next value (or to the virtual hi past max), δ = 1/4 and 3/4, and for
// some indices a stochastic decision boundary per n; each with its
// double-ulp neighbours, lo and the midpoint also with their float-ulp ones.
void points_near(const ref::Table& t, size_t i, bool boundaries, test::Rng& rng, std::vector<double>& out) {
  const Rat lo = t.fvalue(i);
  const Rat hi = i + 1 < t.nfinite() ? t.fvalue(i + 1) : t.hi_past_max();
  const Rat w = hi - lo;
  auto add = [&](const Rat& q, bool float_ulps) {
    double d;
    if (!as_double(q, d)) return;
    out.push_back(d);
    out.push_back(std::nextafter(d, 0.0));
    out.push_back(std::nextafter(d, HUGE_VAL));
    const float fl = static_cast<float>(d);
    if (float_ulps && static_cast<double>(fl) == d && d != 0.0) {
      out.push_back(std::nextafterf(fl, 0.0f));
      out.push_back(std::nextafterf(fl, HUGE_VALF));
    }
  };
  add(lo, true);
  add(lo + w / 2, true);
  add(lo + w / 4, false);
  add(lo + w * 3 / 4, false);
  if (boundaries) {
    for (int n : {4, 8, 12, 16, 24, 32}) {
      const int k = n + 1;
      const uint64_t j = (rng.u64() % ((uint64_t{1} << k) - 1)) + 1;  // 1 .. 2^k - 1
      add(lo + w * Rat(ref::Int(j)) * ref::pow2(-k), false);
    }
  }
}

// Inputs outside the grid: far beyond max, Inf, far below the smallest
// positive value, zero.
void extreme_points(const ref::Table& t, std::vector<double>& out) {
  const double mx = ref::to_double(t.max()), hi = ref::to_double(t.hi_past_max());
  const double mn = ref::to_double(t.min_pos() > 0 ? t.min_pos() : t.fvalue(0));
  for (double v : {hi, hi * 1.5, mx * 2, mx * 1024, static_cast<double>(FLT_MAX), 1e300, HUGE_VAL})
    if (v > mx) out.push_back(v);
  for (double v : {mn / 2, mn / 3, mn / 4, mn * 0.75, mn * 0x1p-30, 0x1p-149, 0x1p-1000, 0x1p-1022, 0.0})
    if (v < mn) out.push_back(v);
}

class RoundExact : public ::testing::TestWithParam<const char*> {};

TEST_P(RoundExact, MatchesRationalReference) {
  Checker c(GetParam());
  const ref::Table& t = c.t();
  ASSERT_LE(t.bits(), 16) << "encode_exact is compared exhaustively only for formats up to 16 bits";
  test::Rng rng(0x5eed0000u + static_cast<uint64_t>(t.bits()));

  std::vector<double> pts;
  const auto idx = indices_to_visit(t, c.f(), rng, 512);
  for (size_t k = 0; k < idx.size(); ++k) points_near(t, idx[k], t.nfinite() <= 300 || k % 4 == 0, rng, pts);
  extreme_points(t, pts);
  // Each magnitude once, then both signs.
  std::sort(pts.begin(), pts.end());
  pts.erase(std::unique(pts.begin(), pts.end(), [](double a, double b) { return bits_of(a) == bits_of(b); }),
            pts.end());
  size_t nonzero = 0;
  for (double mag : pts) {
    nonzero += mag != 0;
    for (double v : {mag, -mag}) {
      // ref::exact takes finite values; an infinity is located by its flag alone.
      const bool inf = std::isinf(v);
      const ref::Located l(t, std::signbit(v), inf ? ref::Rat(0) : ref::exact(std::fabs(v)), inf);
      c.all_modes(hex(v), l, [&](Round m, int n, uint32_t r, bool sat) { return encode_exact(c.f(), v, m, n, r, sat); },
                  kAllBits);
    }
  }
  EXPECT_GE(nonzero, std::min<size_t>(3000, t.nfinite())) << GetParam();
  c.finish();
}

// Presets of at most 16 bits, then generic formats: E 0..8, M 0..7, bias,
// no subnormals (with M = 0: no zero), Inf, NaN counts, fnuz, unsigned.
INSTANTIATE_TEST_SUITE_P(
    Formats, RoundExact,
    ::testing::Values("e2m1", "e2m3", "e3m2", "e4m3", "e5m2", "ue4m3", "ue5m3", "ue8m0", "bf16", "fp16",
                      // plain generic formats
                      "e1m0", "e1m1", "e1m2", "e2m0", "e2m2", "e3m0", "e3m1", "e3m3", "e4m0", "e4m2", "e5m1",
                      "e6m1", "e7m0", "e8m0", "e8m1", "e2m7", "e4m7", "ue3m2", "ue6m1",
                      // E = 0: every code is a subnormal
                      "e0m1", "e0m3", "ue0m4", "e0m7", "e0m3:bias=-3", "e0m3:inf", "e0m4:nans=2", "e0m3:nosub",
                      // no subnormals, with and without zero (and without zero
                      // and -0: the negative side starts at magnitude code 1)
                      "e2m1:nosub", "e3m2:nosub", "e4m3:nosub", "e3m0:nosub", "ue4m0:nosub", "ue8m0:bias=100",
                      "e3m0:nosub,nonegzero", "e2m2:nosub,nonegzero",
                      "e5m2:nosub,inf,nans=1",
                      // bias, Inf, NaN counts, fnuz
                      "e2m1:bias=-2", "e2m1:bias=5", "e6m3:bias=40", "e8m3:bias=200", "e4m3:inf",
                      "e4m3:nans=3", "e3m2:inf,nans=1", "ue3m3:inf,nans=2", "e1m3:nans=8", "e5m2:nonegzero",
                      "e4m3:bias=8,nans=0,nonegzero", "e5m2:bias=16,nans=0,nonegzero", "ue5m3:nans=0",
                      "e2m2:nosub,inf"),
    [](const ::testing::TestParamInfo<const char*>& i) {
      std::string s = i.param;
      for (char& ch : s)
        if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
      return s;
    });

// ---------------------------------------------------------------------------
// encode_quotient
// ---------------------------------------------------------------------------

// Scale values a den is drawn from: decoded codes of the usual scale formats
// and plain random floats.
double random_den(test::Rng& rng) {
  static const Format ue8m0 = parse_format("ue8m0"), ue5m3 = parse_format("ue5m3"), e4m3 = parse_format("e4m3");
  switch (rng.range(0, 4)) {
    case 0: return ue8m0.decode(static_cast<uint32_t>(rng.range(100, 160)));
    case 1: return ue5m3.decode(static_cast<uint32_t>(rng.range(1, ue5m3.max_mag)));
    case 2: return e4m3.decode(static_cast<uint32_t>(rng.range(1, e4m3.max_mag)));
    case 3: {
      // a float with a short significand, so that boundary * den is often exact
      const double m = 1.0 + static_cast<double>(rng.range(0, 255)) / 256.0;
      return std::ldexp(m, static_cast<int>(rng.range(-40, 40)));
    }
    default: return static_cast<double>(rng.float_in(-60, 60));
  }
}

// Splits a wanted numerator into an exact product of two floats x * t.
bool split_product(double want, test::Rng& rng, double& num) {
  const float t = rng.float_in(-3, 3);
  const float x = static_cast<float>(want / static_cast<double>(t));
  if (!std::isfinite(x) || x == 0.0f) return false;
  num = static_cast<double>(x) * static_cast<double>(t);  // exact: 24 + 24 bits
  return true;
}

struct QuotientCase {
  const char* spec;
  std::vector<int> bits;
};
void PrintTo(const QuotientCase& c, std::ostream* os) { *os << c.spec; }

class RoundQuotient : public ::testing::TestWithParam<QuotientCase> {};

TEST_P(RoundQuotient, MatchesRationalReference) {
  const QuotientCase& qc = GetParam();
  Checker c(qc.spec);
  const ref::Table& t = c.t();
  test::Rng rng(0x0ddba11u + static_cast<uint64_t>(t.bits()) * 131u);
  size_t wide = 0, inputs = 0;
  for (int n : qc.bits) wide += needs_wide_path(c.f(), Round::stochastic, n);

  auto run = [&](bool neg, double num, double den) {
    if (!(num >= 0) || !(den > 0) || !std::isfinite(den)) return;
    const ref::Located l(t, neg, std::isinf(num) ? Rat(0) : Rat(ref::exact(num) / ref::exact(den)), std::isinf(num));
    const std::string input = std::string(neg ? "-" : "+") + "num " + hex(num) + " / den " + hex(den);
    c.all_modes(input, l,
                [&](Round m, int n, uint32_t r, bool sat) { return encode_quotient(c.f(), neg, num, den, m, n, r, sat); },
                qc.bits);
    ++inputs;
  };

  const size_t nf = t.nfinite();
  for (int k = 0; k < 1500; ++k) {
    const size_t i = static_cast<size_t>(rng.range(0, static_cast<int64_t>(nf) - 1));
    const Rat lo = t.fvalue(i);
    const Rat hi = i + 1 < nf ? t.fvalue(i + 1) : t.hi_past_max();
    const double den = random_den(rng);
    const bool neg = rng.coin(0.3);
    if (k % 3 == 0) {
      // Random draw: a quotient anywhere near the grid, as x * t / den.
      const double q = ref::to_double(lo + (hi - lo) * Rat(ref::Int(rng.u64() >> 11)) * ref::pow2(-53)) *
                       (rng.coin(0.9) ? 1.0 : std::ldexp(1.0, static_cast<int>(rng.range(-8, 8))));
      double num;
      if (q > 0 && split_product(q * den, rng, num)) run(neg, num, den);
      continue;
    }
    // Constructed near-tie: a decision boundary b = lo + (hi - lo) * j / 2^kk
    // (kk = 1: the midpoint), num = b * den exactly when a double holds it,
    // else the nearest double; then one double-ulp on each side.
    int kk = 1;
    uint64_t j = 1;
    if (k % 3 == 2) {
      const int n = qc.bits[static_cast<size_t>(rng.range(0, static_cast<int64_t>(qc.bits.size()) - 1))];
      kk = n + 1;
      j = (rng.u64() % ((uint64_t{1} << kk) - 1)) + 1;
    }
    const Rat b = lo + (hi - lo) * Rat(ref::Int(j)) * ref::pow2(-kk);
    const Rat prod = b * ref::exact(den);
    const double num = ref::to_double(prod);
    if (!std::isfinite(num) || num == 0) continue;
    for (double v : {num, std::nextafter(num, 0.0), std::nextafter(num, HUGE_VAL)}) run(neg, v, den);
  }
  // Zero and infinite numerators.
  run(false, 0.0, 3.0);
  run(true, 0.0, 0.75);
  run(false, HUGE_VAL, 1.0);
  run(true, HUGE_VAL, 2.0);
  EXPECT_GT(inputs, 3000u) << qc.spec;
  if (c.f().M >= 20) {
    EXPECT_GT(wide, 0u) << qc.spec << ": the 128-bit path was not exercised";
  }
  c.finish();
}

INSTANTIATE_TEST_SUITE_P(
    Formats, RoundQuotient,
    ::testing::Values(QuotientCase{"e2m1", {1, 4, 8, 16, 32}}, QuotientCase{"e4m3", {1, 4, 8, 16, 32}},
                      QuotientCase{"e5m2", {1, 8, 12, 32}}, QuotientCase{"ue5m3", {1, 4, 8, 16, 32}},
                      QuotientCase{"ue8m0", {1, 8, 24, 32}}, QuotientCase{"bf16", {1, 8, 16, 32}},
                      QuotientCase{"fp16", {4, 8, 24, 32}}, QuotientCase{"e3m2:nosub", {1, 8, 32}},
                      QuotientCase{"e0m3", {1, 8, 32}}, QuotientCase{"e4m3:nosub,nans=0,inf", {4, 12, 32}},
                      // M >= 20: n = 28..32 take the 128-bit path (M + n > 49)
                      QuotientCase{"e5m20", {4, 16, 28, 30, 32}}, QuotientCase{"fp32", {8, 24, 28, 30, 32}},
                      QuotientCase{"e8m23:nosub", {8, 28, 32}}, QuotientCase{"e3m21:nosub,bias=2", {8, 30, 32}},
                      QuotientCase{"ue6m22:bias=20", {12, 28, 32}}),
    [](const ::testing::TestParamInfo<QuotientCase>& i) {
      std::string s = i.param.spec;
      for (char& ch : s)
        if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
      return s;
    });

// ---------------------------------------------------------------------------
// Properties beyond the reference
// ---------------------------------------------------------------------------

// With saturation on, a finite input never encodes to a NaN code (it is
// clamped to +-max, docs/numerics.md §2), in any format, including a signed format
// without zero and without negzero, where sign = 1 with magnitude 0 is NaN.
TEST(RoundProperties, FiniteSaturatedNeverNaN) {
  size_t checked = 0;
  for (const char* spec : {"e3m0:nosub,nonegzero", "e4m3:bias=8,nans=0,nonegzero", "e2m1:nonegzero", "e4m3",
                           "e0m3:nonegzero"}) {
    const Format f = parse_format(spec);
    const ref::Table t(f);
    for (double mag : {0.0, 1e-30, 0.001, 0.3, 1.0, 7.0, 1e3, 1e30}) {
      for (double v : {mag, -mag}) {
        for (Round m : test::kAllModes) {
          const Encoded e = encode_exact(f, v, m, 8, 0x80, true);
          ++checked;
          EXPECT_NE(t.info(e.code).cls, CodeClass::nan)
              << spec << " " << test::mode_name(m) << " input " << hex(v) << " encoded to NaN code " << hexcode(e.code);
        }
      }
    }
  }
  EXPECT_GT(checked, 300u);
}

}  // namespace
}  // namespace exmy

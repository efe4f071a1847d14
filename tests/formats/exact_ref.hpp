// An independent, slow reference for docs/numerics.md §1 (decoding) and §2 (rounding)
// in exact rational arithmetic, for the tests of the formats library.
//
// Independence: it reads only the model fields of a Format (E, M, is_signed,
// bias, subnormals, has_inf, nans, negzero), never the constants finalize()
// derives, and it never calls formats/round.hpp. A format is turned into a
// sorted table of its finite magnitudes (searched lazily for fp32-sized
// formats); rounding searches that table for lo and hi and applies the
// table of modes of docs/numerics.md §2 literally to the exact δ = (|v| - lo) / (hi - lo).
// It is slow on purpose: the only shortcuts are caches of integers derived
// from δ, which the tests query for many (mode, n, r) at the same point.
#pragma once

#include <boost/multiprecision/cpp_int.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "formats/format.hpp"

namespace exmy::ref {

using Int = boost::multiprecision::cpp_int;
using Rat = boost::multiprecision::cpp_rational;

// Rounding modes, mirrored from the table of docs/numerics.md §2 so that this header does
// not need formats/round.hpp (the tests map exmy::Round onto these).
enum class Mode { rne, rna, rtz, up, down, odd, stochastic, stochastic_fast, stochastic_fastest };

inline bool is_stochastic(Mode m) {
  return m == Mode::stochastic || m == Mode::stochastic_fast || m == Mode::stochastic_fastest;
}

inline Rat pow2(int e) {
  const Int one = 1;
  return e >= 0 ? Rat(one << e) : Rat(Int(1), one << -e);
}

// The exact value of a double (any finite double, subnormals included).
inline Rat exact(double d) {
  if (d == 0.0) return Rat(0);
  int e = 0;
  const double m = std::frexp(std::fabs(d), &e);  // |d| = m * 2^e, m in [0.5, 1)
  const auto sig = static_cast<uint64_t>(std::ldexp(m, 53));
  Rat r = Rat(Int(sig)) * pow2(e - 53);
  return d < 0 ? Rat(-r) : r;
}

// floor(q) of a non-negative rational.
inline Int floor_nonneg(const Rat& q) { return boost::multiprecision::numerator(q) / boost::multiprecision::denominator(q); }

// Round-half-to-even of a non-negative rational to an integer.
inline Int rne_nonneg(const Rat& q) {
  const Int f = floor_nonneg(q);
  const Rat frac = q - Rat(f);
  const Rat half(Int(1), Int(2));
  if (frac > half) return f + 1;
  if (frac == half) return (f & 1) != 0 ? Int(f + 1) : f;
  return f;
}

inline double to_double(const Rat& q) { return q.convert_to<double>(); }

inline std::string str(const Rat& q) {
  std::ostringstream os;
  os << q << " (~" << to_double(q) << ")";
  return os.str();
}

// What a code is, from the decoding rules of docs/numerics.md §1.
struct CodeInfo {
  CodeClass cls = CodeClass::zero;
  bool neg = false;
  Rat value;  // finite codes only; for zero the sign is in `neg`
};

// A format as a table of its codes. Formats with at most 2^16 magnitudes are
// enumerated into an explicit list of finite magnitudes sorted by value;
// wider ones (fp32, e5m20) are searched lazily over the code order, which
// is the value order (the enumerated formats check that assumption).
class Table {
 public:
  static constexpr uint32_t kEnumerateLimit = uint32_t{1} << 16;

  explicit Table(const Format& f) : E_(f.E), M_(f.M), signed_(f.is_signed), bias_(f.bias), sub_(f.subnormals),
                                    inf_(f.has_inf), nans_(f.nans), negzero_(f.negzero) {
    mag_count_ = uint32_t{1} << (E_ + M_);
    bits_ = E_ + M_ + (signed_ ? 1 : 0);
    enumerated_ = mag_count_ <= kEnumerateLimit;
    if (enumerated_) {
      std::vector<std::pair<Rat, uint32_t>> fin;
      for (uint32_t c = 0; c < mag_count_; ++c) {
        const CodeInfo i = decode_mag(c);
        if (i.cls == CodeClass::nan || i.cls == CodeClass::inf) continue;
        fin.emplace_back(i.value, c);
      }
      std::stable_sort(fin.begin(), fin.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
      for (auto& [v, c] : fin) {
        finite_.push_back(v);
        finite_code_.push_back(c);
      }
      nfinite_ = finite_.size();
    } else {
      // The reserved codes are the highest ones, so the finite ones are 0..k-1.
      nfinite_ = mag_count_ - static_cast<uint32_t>(nans_) - (inf_ ? 1u : 0u);
    }
    if (nfinite_ == 0) throw std::logic_error("format without finite values");
    has_zero_ = fvalue(0) == 0;
    max_ = fvalue(nfinite_ - 1);
    min_pos_ = has_zero_ ? (nfinite_ > 1 ? fvalue(1) : Rat(0)) : fvalue(0);
    // docs/numerics.md §2: above the largest finite value hi = max + 2^(floor(log2 max) - M).
    // Taken literally also where max is a subnormal (E = 0 formats, or all
    // normal codes reserved): there 2^(floor(log2 max) - M) is smaller than
    // the spacing 2^(1 - bias - M) of the codes below max.
    hi_past_max_ = max_ + pow2(floor_log2(max_) - M_);
    if (inf_) inf_mag_ = mag_count_ - static_cast<uint32_t>(nans_) - 1u;
    // NaN codes: the reserved magnitudes, or the negative zero of "fnuz".
    has_nan_ = nans_ > 0 || (signed_ && info(uint32_t{1} << (E_ + M_)).cls == CodeClass::nan);
  }

  int bits() const { return bits_; }
  uint64_t code_count() const { return uint64_t{1} << bits_; }
  uint32_t mag_count() const { return mag_count_; }
  bool is_signed() const { return signed_; }
  bool enumerated() const { return enumerated_; }
  bool has_zero() const { return has_zero_; }
  bool has_inf() const { return inf_mag_.has_value(); }
  bool has_nan() const { return has_nan_; }
  uint32_t inf_mag() const { return *inf_mag_; }
  const Rat& max() const { return max_; }
  const Rat& min_pos() const { return min_pos_; }
  const Rat& hi_past_max() const { return hi_past_max_; }

  // The i-th smallest finite magnitude and its code.
  size_t nfinite() const { return nfinite_; }
  Rat fvalue(size_t i) const { return enumerated_ ? finite_[i] : decode_mag(static_cast<uint32_t>(i)).value; }
  uint32_t fcode(size_t i) const { return enumerated_ ? finite_code_[i] : static_cast<uint32_t>(i); }

  // Index of the smallest finite magnitude a value of this sign can take.
  size_t first_index(bool neg) const {
    if (!neg || !signed_ || has_zero_) return 0;
    return info(fcode(0) | (uint32_t{1} << (E_ + M_))).cls == CodeClass::nan ? 1 : 0;
  }

  // Index of the largest finite magnitude <= mag (mag >= the smallest one).
  size_t floor_index(const Rat& mag) const {
    if (enumerated_)
      return static_cast<size_t>(std::upper_bound(finite_.begin(), finite_.end(), mag) - finite_.begin()) - 1;
    size_t lo = 0, hi = nfinite_;  // fvalue(lo) <= mag < fvalue(hi)
    while (hi - lo > 1) {
      const size_t mid = lo + (hi - lo) / 2;
      if (fvalue(mid) <= mag) lo = mid;
      else hi = mid;
    }
    return lo;
  }

  // Decoding of any code (docs/numerics.md §1).
  CodeInfo info(uint32_t code) const {
    const bool neg = signed_ && ((code >> (E_ + M_)) & 1u);
    const uint32_t mag = code & (mag_count_ - 1);
    CodeInfo i = decode_mag(mag);
    i.neg = neg;
    if (i.cls == CodeClass::nan || i.cls == CodeClass::inf) return i;
    // sign = 1 with an all-zero magnitude: -0, or NaN without negzero ("fnuz").
    if (neg && mag == 0 && !negzero_) {
      i.cls = CodeClass::nan;
      return i;
    }
    if (neg) i.value = -i.value;
    return i;
  }

  // Full code of a finite magnitude code with a sign, following docs/numerics.md §1:
  // a negative zero is +0 without negzero; unsigned formats have no sign.
  uint32_t with_sign(uint32_t mag, bool neg) const {
    if (!neg || !signed_) return mag;
    if (mag == 0 && has_zero_ && !negzero_) return mag;  // only magnitude code 0 can be zero
    return mag | (uint32_t{1} << (E_ + M_));
  }

  static int floor_log2(const Rat& q) {
    // q > 0: the e with 2^e <= q < 2^(e+1)
    int e = static_cast<int>(std::floor(std::log2(to_double(q))));
    while (pow2(e) > q) --e;
    while (pow2(e + 1) <= q) ++e;
    return e;
  }

  // The value of a magnitude code by the decoding rules of docs/numerics.md §1.
  CodeInfo decode_mag(uint32_t c) const {
    CodeInfo i;
    if (c >= mag_count_ - static_cast<uint32_t>(nans_)) {
      i.cls = CodeClass::nan;
      return i;
    }
    if (inf_ && c == mag_count_ - static_cast<uint32_t>(nans_) - 1) {
      i.cls = CodeClass::inf;
      return i;
    }
    const uint32_t e = c >> M_, m = c & ((uint32_t{1} << M_) - 1);
    if (e == 0 && sub_) {
      i.value = Rat(Int(m)) * pow2(1 - bias_ - M_);
      i.cls = m == 0 ? CodeClass::zero : CodeClass::subnormal;
    } else if (e == 0 && m == 0) {
      // no subnormals: zero, except for M == 0 where code 0 is 2^-bias
      if (M_ == 0) {
        i.value = pow2(-bias_);
        i.cls = CodeClass::normal;
      } else {
        i.value = 0;
        i.cls = CodeClass::zero;
      }
    } else {
      i.value = (Rat(1) + Rat(Int(m)) * pow2(-M_)) * pow2(static_cast<int>(e) - bias_);
      i.cls = CodeClass::normal;
    }
    return i;
  }

 private:
  int E_, M_;
  bool signed_;
  int bias_;
  bool sub_, inf_;
  int nans_;
  bool negzero_;
  uint32_t mag_count_ = 0;
  int bits_ = 0;
  bool enumerated_ = false;
  std::vector<Rat> finite_;
  std::vector<uint32_t> finite_code_;
  size_t nfinite_ = 0;
  bool has_zero_ = false, has_nan_ = false;
  Rat max_, min_pos_, hi_past_max_;
  std::optional<uint32_t> inf_mag_;
};

// Where a magnitude lies in a format: the mode-independent part of rounding.
// The mode-dependent integers (floor and rne of δ·2^k) are cached because the
// tests ask the same point for many (mode, n, r).
class Located {
 public:
  Located(const Table& t, bool neg, const Rat& mag, bool infinite = false)
      : neg_(neg), zero_(!infinite && mag == 0), mag_(mag) {
    if (infinite) {
      past_ = true;
      above_max_ = true;
      return;
    }
    above_max_ = mag > t.max();
    // The smallest magnitude of the value's sign: index 0, except for the
    // negative side of a signed format without zero and without -0, whose
    // sign = 1, magnitude 0 code is a NaN: there the negative values start
    // at the second magnitude.
    const size_t first = t.first_index(neg);
    if (mag < t.fvalue(first)) {
      // Only without zero: below the smallest value, which is the result.
      below_min_ = true;
      lo_code_ = t.fcode(first);
      return;
    }
    // lo: the largest representable magnitude <= |v|
    const size_t idx = t.floor_index(mag);
    const Rat lo = t.fvalue(idx);
    lo_code_ = t.fcode(idx);
    Rat hi;
    if (idx + 1 < t.nfinite()) {
      hi = t.fvalue(idx + 1);
      hi_code_ = t.fcode(idx + 1);
    } else {
      hi = t.hi_past_max();
      // At or beyond the virtual hi past max, δ would be >= 1: the value
      // rounds, on the grid extended past max (gfloat's model), to hi or
      // beyond in every mode, so the result lies past max (clamped or
      // overflowing), even for rtz.
      if (mag >= hi) {
        past_ = true;
        return;
      }
    }
    delta_ = (mag - lo) / (hi - lo);
    const Rat half(Int(1), Int(2));
    delta_pos_ = delta_ > 0;
    half_cmp_ = delta_ > half ? 1 : delta_ == half ? 0 : -1;
    delta_num_ = boost::multiprecision::numerator(delta_);
    delta_den_ = boost::multiprecision::denominator(delta_);
  }

  bool neg() const { return neg_; }
  bool zero() const { return zero_; }
  bool above_max() const { return above_max_; }
  bool past() const { return past_; }
  bool below_min() const { return below_min_; }
  const Rat& delta() const { return delta_; }
  const Rat& mag() const { return mag_; }
  uint32_t lo_code() const { return lo_code_; }
  std::optional<uint32_t> hi_code() const { return hi_code_; }

  // floor(δ · 2^k)
  uint64_t floor_scaled(int k) const {
    auto& c = floor_cache_[k];
    if (!c) c = static_cast<uint64_t>((delta_num_ << k) / delta_den_);
    return *c;
  }
  // rne(δ · 2^k): the floor, plus one when the remainder is above half, or
  // exactly half and the floor is odd
  uint64_t rne_scaled(int k) const {
    auto& c = rne_cache_[k];
    if (!c) {
      Int q, rem;
      boost::multiprecision::divide_qr(Int(delta_num_ << k), delta_den_, q, rem);
      const int cmp = Int(2 * rem).compare(delta_den_);
      c = static_cast<uint64_t>(q) + ((cmp > 0 || (cmp == 0 && (q & 1) != 0)) ? 1 : 0);
    }
    return *c;
  }

  // The "away" column of the table of docs/numerics.md §2, literally.
  bool away(Mode mode, int n, uint32_t r) const {
    const bool lo_odd = (lo_code_ & 1u) != 0;
    const uint64_t two_n = uint64_t{1} << n;
    // (the comparisons of δ with 1/2 and 0 are made once, in the constructor)
    switch (mode) {
      case Mode::rne: return half_cmp_ > 0 || (half_cmp_ == 0 && lo_odd);
      case Mode::rna: return half_cmp_ >= 0;
      case Mode::rtz: return false;
      case Mode::up: return !neg_ && delta_pos_;
      case Mode::down: return neg_ && delta_pos_;
      case Mode::odd: return delta_pos_ && !lo_odd;
      case Mode::stochastic: return rne_scaled(n) + r >= two_n;
      case Mode::stochastic_fast: return floor_scaled(n + 1) + 2 * uint64_t{r} + 1 >= 2 * two_n;
      case Mode::stochastic_fastest: return floor_scaled(n) + r >= two_n;
    }
    return false;
  }

  // The smallest r in [0, 2^n] for which a stochastic mode goes away (2^n:
  // never), from the same formulas; the tests probe r on both sides of it.
  uint64_t threshold(Mode mode, int n) const {
    const uint64_t two_n = uint64_t{1} << n;
    uint64_t t = 0;
    switch (mode) {
      case Mode::stochastic: t = two_n - std::min(two_n, rne_scaled(n)); break;
      case Mode::stochastic_fast: {
        const uint64_t need = 2 * two_n - 1 - floor_scaled(n + 1);  // 2r >= need
        t = (need + 1) / 2;
        break;
      }
      case Mode::stochastic_fastest: t = two_n - floor_scaled(n); break;
      default: break;
    }
    return std::min(t, two_n);
  }

 private:
  bool neg_ = false, zero_ = false;
  Rat mag_;
  bool above_max_ = false, past_ = false, below_min_ = false;
  uint32_t lo_code_ = 0;
  std::optional<uint32_t> hi_code_;
  Rat delta_;
  bool delta_pos_ = false;
  int half_cmp_ = -1;  // sign of δ - 1/2
  Int delta_num_, delta_den_;
  mutable std::optional<uint64_t> floor_cache_[40];
  mutable std::optional<uint64_t> rne_cache_[40];
};

// The specified result of encoding a value.
struct Result {
  uint32_t code = 0;
  bool above_max = false;        // |v| > max
  bool nan = false;              // the result is a NaN (any NaN code)
  bool unrepresentable = false;  // overflow with saturation off and no Inf/NaN
};

// Rounds the located value with (mode, n, r) and applies docs/numerics.md §2's sign,
// overflow and saturation rules.
inline Result encode(const Table& t, const Located& l, Mode mode, int n, uint32_t r, bool saturate) {
  Result out;
  out.above_max = l.above_max();
  // Unsigned formats: a negative value (-0 included) becomes code 0.
  if (l.neg() && !t.is_signed()) return out;
  bool overflow = false;
  uint32_t mag = 0;
  if (l.below_min()) {
    mag = l.lo_code();
  } else if (l.past()) {
    overflow = true;
  } else if (l.away(mode, n, r)) {
    if (l.hi_code()) mag = *l.hi_code();
    else overflow = true;  // hi is the virtual value past max
  } else {
    mag = l.lo_code();
  }
  if (overflow) {
    if (saturate) {
      mag = t.fcode(t.nfinite() - 1);
    } else if (t.has_inf()) {
      mag = t.inf_mag();
    } else if (t.has_nan()) {
      out.nan = true;
      return out;
    } else {
      out.unrepresentable = true;
      return out;
    }
  }
  out.code = t.with_sign(mag, l.neg());
  return out;
}

}  // namespace exmy::ref

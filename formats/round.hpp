// The scalar rounding core (docs/numerics.md §2): rounds an exact real value to any
// Format, in every rounding mode, without double rounding.
//
// How exactness is kept. Every value exmy rounds is a quotient num/den of two
// doubles that hold exact products of float32-sized significands (x * t,
// b * t, q * s, ...). The quotient is computed once with IEEE division and its
// exact remainder fma(-y, den, num); folding the remainder's sign into the
// last bit gives the quotient rounded to odd ("sticky" in the last bit). A
// value rounded to odd at 53 bits rounds to any narrower grid exactly as the
// real value would, as long as every decision boundary has at most 52
// significant bits. The boundaries of a format with M mantissa bits and n
// stochastic bits have M + n + 2 bits, so the round-to-odd path serves
// M + n <= 49; wider cases (stochastic rounding of 20+-bit mantissas with
// many random bits) take an exact 128-bit integer path from num and den.
//
// Plain header code for host and CUDA device code: no exceptions, no global
// state, rounding mode always an explicit argument.
#pragma once

#include <cmath>
#include <cstdint>

#include "formats/format.hpp"

namespace exmy {

enum class Round : uint8_t {
  rne,                 // to nearest, ties to even
  rna,                 // to nearest, ties away from zero
  rtz,                 // toward zero
  up,                  // toward +inf
  down,                // toward -inf
  odd,                 // to odd (sticky)
  stochastic,          // rne(delta * 2^n) + r >= 2^n
  stochastic_fast,     // floor(delta * 2^(n+1)) + 2r + 1 >= 2^(n+1)
  stochastic_fastest,  // floor(delta * 2^n) + r >= 2^n
};

EXMY_HD constexpr bool is_stochastic(Round m) {
  return m == Round::stochastic || m == Round::stochastic_fast || m == Round::stochastic_fastest;
}

// Result of rounding a magnitude.
struct MagRound {
  uint32_t mag;     // magnitude code (saturated to max_mag when `overflow`)
  bool above_max;   // the exact magnitude exceeded the format's max
  bool overflow;    // the rounded result lies past max (saturate or Inf/NaN)
};

namespace detail {

// num/den for positive num, den, rounded to odd at double precision.
EXMY_HD double rto_div(double num, double den) {
  if (den == 1.0) return num;
  const double y = num / den;
  const double rem = ::fma(-y, den, num);
  uint64_t b = bits_of(y);
  if (rem != 0.0) {
    if (rem < 0.0) b -= 1;  // true value below y: truncation is the previous double
    b |= 1u;
  }
  return double_of(b);
}

// 53-bit integer significand and exponent of a positive normal double:
// x = sig * 2^exp.
EXMY_HD void split(double x, uint64_t& sig, int& exp) {
  const uint64_t b = bits_of(x);
  sig = (b & ((uint64_t{1} << 52) - 1)) | (uint64_t{1} << 52);
  exp = static_cast<int>((b >> 52) & 0x7ff) - 1075;
}

// floor(sig * 2^shift / div) and whether the division left a remainder.
// Callers guarantee the quotient fits 64 bits and, for shift >= 0, that
// sig << shift fits 126 bits.
EXMY_HD uint64_t fixed_div(uint64_t sig, int shift, unsigned __int128 div, bool& sticky) {
  using u128 = unsigned __int128;
  if (shift >= 0) {
    const u128 num = static_cast<u128>(sig) << shift;
    const u128 q = num / div;
    sticky = (num - q * div) != 0;
    return static_cast<uint64_t>(q);
  }
  const int s = -shift;
  // bit length of div
  int dbits = 0;
  for (u128 d = div; d != 0; d >>= 1) ++dbits;
  if (s + dbits > 126) {  // quotient is zero
    sticky = sig != 0;
    return 0;
  }
  const u128 d = div << s;
  const u128 q = static_cast<u128>(sig) / d;
  sticky = (static_cast<u128>(sig) - q * d) != 0;
  return static_cast<uint64_t>(q);
}

// The away-from-lo decision of docs/numerics.md §2 from F = floor(delta * 2^(h+1))
// (h = n for stochastic modes, 0 otherwise) and the sticky flag
// (delta * 2^(h+1) not an integer).
EXMY_HD bool away(Round mode, uint64_t F, bool sticky, bool lo_odd, bool neg, int n, uint32_t r) {
  const bool inexact = F != 0 || sticky;
  switch (mode) {
    case Round::rne: return F != 0 && (sticky || lo_odd);
    case Round::rna: return F != 0;
    case Round::rtz: return false;
    case Round::up: return !neg && inexact;
    case Round::down: return neg && inexact;
    case Round::odd: return inexact && !lo_odd;
    case Round::stochastic: {
      // rne(delta * 2^n) from floor(delta * 2^(n+1)) and sticky
      const uint64_t j = F >> 1;
      const uint64_t rn = j + ((F & 1) && (sticky || (j & 1)) ? 1 : 0);
      return rn + r >= (uint64_t{1} << n);
    }
    case Round::stochastic_fast:
      return F + 2 * static_cast<uint64_t>(r) + 1 >= (uint64_t{1} << (n + 1));
    case Round::stochastic_fastest:
      return (F >> 1) + r >= (uint64_t{1} << n);
  }
  return false;
}

EXMY_HD MagRound finish(const Format& f, int64_t code_lo, uint64_t F, bool sticky, bool neg,
                        Round mode, int n, uint32_t r) {
  const bool inexact = F != 0 || sticky;
  const int64_t maxm = static_cast<int64_t>(f.max_mag);
  MagRound out;
  out.above_max = code_lo > maxm || (code_lo == maxm && inexact);
  const int64_t code = code_lo + (away(mode, F, sticky, (code_lo & 1) != 0, neg, n, r) ? 1 : 0);
  out.overflow = code > maxm;
  out.mag = out.overflow ? f.max_mag : static_cast<uint32_t>(code);
  return out;
}

// Formats without subnormals but with M > 0 have zero and then
// min_pos = (2^M + 1) * 2^(emin - M); 2^emin itself is not representable.
// True when a value with floor(log2) = fl2 and in-binade index k lies below
// min_pos.
EXMY_HD bool below_min_pos(const Format& f, int fl2, uint64_t k) {
  return f.M > 0 && (fl2 < f.emin || (fl2 == f.emin && k == (uint64_t{1} << f.M)));
}

// A format whose largest finite value is subnormal (E = 0, or every normal
// binade reserved for Inf/NaN) rounds values at or above max against
// docs/numerics.md §2's hi = max + 2^(floor(log2 max) - M), not against the
// subnormal grid spacing. Returns true (and the code and index offsets to
// use) when y >= max lies in that case.
EXMY_HD bool above_subnormal_max(const Format& f, double y, int& ee, int64_t& code_base, uint64_t& k_base) {
  if (!(f.subnormals && f.max < f.min_normal && y >= f.max)) return false;
  ee = f.max_exp;
  code_base = static_cast<int64_t>(f.max_mag);
  k_base = static_cast<uint64_t>(f.max * pow2(f.M - f.max_exp));  // max in units of the spacing
  return true;
}

}  // namespace detail

// True when rounding with (mode, n) needs the exact 128-bit path rather than
// the round-to-odd double path.
EXMY_HD bool needs_wide_path(const Format& f, Round mode, int n) {
  return is_stochastic(mode) && f.M + n > 49;
}

// Rounds a positive finite magnitude given in round-to-odd form `y` (an exact
// double, or an odd double standing for a value strictly between its two
// neighbours). Valid when !needs_wide_path(f, mode, n). `neg` is the sign of
// the value being rounded (it matters for up/down).
EXMY_HD MagRound round_rto(const Format& f, double y, bool neg, Round mode, int n, uint32_t r) {
  const int h = is_stochastic(mode) ? n : 0;  // F carries h+1 bits
  uint64_t sig;
  int ey;
  detail::split(y, sig, ey);
  const int fl2 = ey + 52;  // floor(log2 y)
  if (!f.subnormals && fl2 < f.emin && f.M == 0) return {0u, false, false};  // below min: min
  int ee = fl2 < f.emin ? f.emin : fl2;
  int64_t code_base;
  uint64_t k_base;
  const bool top = detail::above_subnormal_max(f, y, ee, code_base, k_base);
  if (top && fl2 > ee + 1) return {f.max_mag, true, true};  // far past hi
  // W = floor(y * 2^(h+1) / 2^(ee-M)); the shift is always negative here.
  const int s = -(ey + h + 1 + f.M - ee);
  uint64_t W;
  bool sticky;
  if (s >= 64) {
    W = 0;
    sticky = true;
  } else {
    W = sig >> s;
    sticky = (sig & ((uint64_t{1} << s) - 1)) != 0;
  }
  const uint64_t k = W >> (h + 1);
  const uint64_t Fm = W & ((uint64_t{1} << (h + 1)) - 1);
  if (top) return detail::finish(f, code_base + static_cast<int64_t>(k - k_base), Fm, sticky, neg, mode, n, r);
  if (f.subnormals) {
    const int64_t code_lo = (static_cast<int64_t>(ee - f.emin) << f.M) + static_cast<int64_t>(k);
    return detail::finish(f, code_lo, Fm, sticky, neg, mode, n, r);
  }
  if (!detail::below_min_pos(f, fl2, k)) {
    const int64_t code_lo = (static_cast<int64_t>(ee - f.emin) << f.M) + static_cast<int64_t>(k) -
                            (int64_t{1} << f.M);
    return detail::finish(f, code_lo, Fm, sticky, neg, mode, n, r);
  }
  // No subnormals, M > 0, y below the smallest positive value
  // (2^M + 1) * 2^(emin - M): lo = 0, hi = min_pos.
  const uint64_t W2 = detail::fixed_div(sig, ey + h + 1 + f.M - f.emin, (uint64_t{1} << f.M) + 1, sticky);
  return detail::finish(f, 0, W2, sticky, neg, mode, n, r);
}

// Rounds the exact positive magnitude num/den (num >= 0 finite or +inf,
// den > 0 finite) to f.
EXMY_HD MagRound round_quotient(const Format& f, double num, double den, bool neg, Round mode, int n,
                                uint32_t r) {
  if (num == 0.0) return {0u, false, false};
  if (is_inf(num)) return {f.max_mag, true, true};
  if (!needs_wide_path(f, mode, n)) return round_rto(f, detail::rto_div(num, den), neg, mode, n, r);

  // Exact 128-bit path: W = floor(num * 2^(n+1) / (den * 2^(ee-M))).
  const double y = detail::rto_div(num, den);
  const int fl2 = ilog2(y);
  if (!f.subnormals && fl2 < f.emin && f.M == 0) return {0u, false, false};
  int ee = fl2 < f.emin ? f.emin : fl2;
  int64_t code_base;
  uint64_t k_base;
  const bool top = detail::above_subnormal_max(f, y, ee, code_base, k_base);
  if (top && fl2 > ee + 1) return {f.max_mag, true, true};
  uint64_t sn, sd;
  int en, ed;
  detail::split(num, sn, en);
  detail::split(den, sd, ed);
  bool sticky;
  const uint64_t W = detail::fixed_div(sn, en - ed + n + 1 + f.M - ee, sd, sticky);
  const uint64_t k = W >> (n + 1);
  const uint64_t Fm = W & ((uint64_t{1} << (n + 1)) - 1);
  if (top) return detail::finish(f, code_base + static_cast<int64_t>(k - k_base), Fm, sticky, neg, mode, n, r);
  if (f.subnormals) {
    const int64_t code_lo = (static_cast<int64_t>(ee - f.emin) << f.M) + static_cast<int64_t>(k);
    return detail::finish(f, code_lo, Fm, sticky, neg, mode, n, r);
  }
  if (!detail::below_min_pos(f, fl2, k)) {
    const int64_t code_lo = (static_cast<int64_t>(ee - f.emin) << f.M) + static_cast<int64_t>(k) -
                            (int64_t{1} << f.M);
    return detail::finish(f, code_lo, Fm, sticky, neg, mode, n, r);
  }
  const unsigned __int128 div = static_cast<unsigned __int128>(sd) * ((uint64_t{1} << f.M) + 1);
  const uint64_t W2 = detail::fixed_div(sn, en - ed + n + 1 + f.M - f.emin, div, sticky);
  return detail::finish(f, 0, W2, sticky, neg, mode, n, r);
}

// Encoding of a signed value into a full code.
struct Encoded {
  uint32_t code;
  bool above_max;       // |value| exceeded max (counts as `saturated`)
  bool unrepresentable; // overflow with saturation off and no Inf/NaN code
};

// Applies sign and the overflow policy to a rounded magnitude.
EXMY_HD Encoded sign_and_overflow(const Format& f, MagRound m, bool neg, bool saturate) {
  Encoded e{0u, m.above_max, false};
  uint32_t mag = m.mag;
  if (!f.is_signed && neg) {
    // Unsigned formats clamp negative values to their lowest value.
    e.code = 0u;
    return e;
  }
  if (m.overflow && !saturate) {
    if (f.has_inf) {
      mag = f.inf_mag();
    } else if (f.has_nan) {
      e.code = f.nan_code;
      return e;
    } else {
      e.unrepresentable = true;
    }
  }
  if (neg && f.is_signed && mag == 0 && !f.negzero && !f.has_zero) {
    // Without zero, magnitude code 0 is the smallest value, but its negative
    // code is taken by NaN: the negative side starts at magnitude code 1.
    mag = 1u;
  }
  e.code = mag;
  if (neg && f.is_signed) {
    if (mag == 0 && !f.negzero) e.code = 0u;  // no -0: the result is +0
    else e.code |= f.sign_bit;
  }
  return e;
}

// Rounds the exact real value (neg ? -1 : 1) * num / den to f.
EXMY_HD Encoded encode_quotient(const Format& f, bool neg, double num, double den, Round mode, int n,
                                uint32_t r, bool saturate) {
  return sign_and_overflow(f, round_quotient(f, num, den, neg, mode, n, r), neg, saturate);
}

// Rounds a double that holds the value exactly (a float, or an exact
// product of two floats).
EXMY_HD Encoded encode_exact(const Format& f, double v, Round mode, int n, uint32_t r, bool saturate) {
  const bool neg = sign_bit(v);
  return encode_quotient(f, neg, ::fabs(v), 1.0, mode, n, r, saturate);
}

// fp32 round-to-nearest-even of the exact quotient num/den (num >= 0, den > 0).
EXMY_HD float fp32_rne_div(double num, double den) {
  return static_cast<float>(detail::rto_div(num, den));
}

}  // namespace exmy

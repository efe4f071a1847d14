// The thresholds of the threshold loops (formats/fast/loops.hpp, ThrBlock):
// for the deterministic modes that treat x and -x alike, a block's
// magnitude code of |x| is the number of thresholds |x| exceeds, and each
// threshold is found with the scalar core itself (a search over float32 bit
// patterns), so a loop that compares with them makes the core's decisions.
// Plain header code, shared by the CPU's loops (formats/fast/constants.cpp)
// and the CUDA kernel (formats/cuda/quantize.cu), which computes them on
// the device once the tensor scale is known there.
#pragma once

#include <cstdint>

#include "formats/quant_core.hpp"

namespace exmy::detail {

// Least float32 bit pattern b in [0, 0x7f800000] with pred(b), for a pred
// that is false at 0, monotone in b, and taken as true at Inf; the search
// starts at `guess` and gallops outwards, so a close guess costs a few calls.
template <class Pred>
EXMY_HD uint32_t least_bits(uint32_t guess, Pred pred) {
  constexpr uint32_t kInf = 0x7f800000u;
  uint32_t lo, hi;  // pred(lo) is false, pred(hi) true
  const uint32_t g = guess < 1u ? 1u : guess > kInf - 1 ? kInf - 1 : guess;
  if (pred(g)) {
    hi = g;
    lo = 0;
    for (uint32_t d = 1; d <= g; d <<= 1) {
      if (!pred(g - d)) {
        lo = g - d;
        break;
      }
      hi = g - d;
      if (d > (1u << 30)) break;
    }
  } else {
    lo = g;
    hi = kInf;
    for (uint64_t d = 1; g + d < kInf; d <<= 1) {
      const uint32_t c = static_cast<uint32_t>(g + d);
      if (pred(c)) {
        hi = c;
        break;
      }
      lo = c;
    }
  }
  while (hi - lo > 1) {
    const uint32_t mid = lo + (hi - lo) / 2;
    if (pred(mid)) hi = mid;
    else lo = mid;
  }
  return hi;
}

// |x| (as float32 bits) at which a block with constants c maps to the
// element grid point v: v * s / t (exact) or v / m_b (fp32), clamped to a
// finite float. The searches start there.
EXMY_HD uint32_t threshold_guess(const QuantPlan& p, const BlockConsts& c, double v) {
  const double x = p.arith == Arith::exact ? v * c.s / p.t : v / static_cast<double>(c.mb);
  return bits_of(static_cast<float>(x < 3.0e38 ? x : 3.0e38));
}

// Threshold k of a block (k = 1 .. 7): the least |x| bits whose magnitude
// code is >= k, minus one (0x7f7fffff when k is past Fe's largest
// magnitude). Only for plans the threshold loops take (threshold_handles).
EXMY_HD int32_t element_threshold(const QuantPlan& p, const BlockConsts& c, uint32_t k) {
  const Format& f = p.fe;
  if (k > f.max_mag) return 0x7f7fffff;
  const double lo = f.mag_value(k - 1), hi = f.mag_value(k);
  // where the code becomes k: the midpoint (nearest modes), the upper value
  // (toward zero) or just past the lower one (to odd)
  const double v = p.round == Round::rtz ? hi : p.round == Round::odd ? lo : (lo + hi) / 2;
  const uint32_t mask = f.mag_mask();
  const uint32_t b = least_bits(threshold_guess(p, c, v), [&](uint32_t bb) {
    return (encode_element(p, c, float_of(bb), 0u).code & mask) >= k;
  });
  return static_cast<int32_t>(b - 1);
}

// The least |x| bits the scalar core counts as saturated, minus one.
EXMY_HD int32_t saturation_threshold(const QuantPlan& p, const BlockConsts& c) {
  const uint32_t b = least_bits(threshold_guess(p, c, p.fe.max), [&](uint32_t bb) {
    return (encode_element(p, c, float_of(bb), 0u).flags & kSaturated) != 0;
  });
  return static_cast<int32_t>(b - 1);
}

// Block scale codes by thresholds. With the tensor scale fixed (one call),
// a block's scale code never decreases as its amax b grows, and doubling b
// adds P = 2^M (scale format Fs = eMm) to every normal, unsaturated code:
// each rule computes from b t (or fl(b G)) with operations that commute with
// powers of two while nothing leaves the normal ranges. So for b in
// [t0, t0 + span) (as float32 bits) the code is
//   c_lo + P n + #{j >= 1 : r >= D_j},   d = bits(b) - t0, n = d >> 23,
//   r = d & (2^23 - 1),
// where t0 = the least b whose code is c_lo = P + 1 (the first code whose
// lower neighbour is normal too: the step from the largest subnormal to the
// smallest normal is not repeated), D_j = (least b with code c_lo + j) - t0, and span ends where the code would
// reach Fs's largest magnitude. The thresholds come from the scalar
// block_scale() (searches on float32 bit patterns), so the codes are its own.
struct ScaleThr {
  bool ok = false;
  uint32_t t0 = 0, span = 0;
  uint32_t c_lo = 0, m = 0;  // P + 1, log2 P
  int32_t d1[7] = {};        // D_j - 1 for j = 1 .. P-1; INT32_MAX when j >= P
};

// The least block amax (float32 bits) whose scale code, before the
// zero-scale guard, is >= c; the search starts where the rule's unrounded
// scale meets the boundary into code c.
EXMY_HD uint32_t scale_code_least(const QuantPlan& p, uint32_t c) {
  const Format& f = p.fs;
  const bool mx = p.rule == ScaleRule::mx_floor || p.rule == ScaleRule::mx_ceil || p.rule == ScaleRule::mx_even;
  const double v = f.decode(c), vp = f.decode(c - 1);
  const double y = p.rule == ScaleRule::amax_up || p.rule == ScaleRule::mx_ceil      ? vp
                   : p.rule == ScaleRule::amax_down || p.rule == ScaleRule::mx_floor ? v
                                                                                     : 0.5 * (v + vp);
  // (y * 2^max_exp: ldexp's value, the product being exact in double)
  const double b = mx                         ? y * pow2(p.fe.max_exp) / p.t
                   : p.arith == Arith::fp32 ? y / p.g_over_emax
                                              : y * p.fe.max / p.t;
  const uint32_t guess = bits_of(static_cast<float>(b < 0.0 ? 0.0 : b > 3.0e38 ? 3.0e38 : b));
  return least_bits(guess, [&](uint32_t bb) {
    const BlockScale s = block_scale(p, float_of(bb));
    return bb != 0 && !s.underflow && !s.zero && s.code >= c;
  });
}

// scale_code_thresholds in the three steps the CUDA kernel runs on separate
// lanes: the first threshold t0 and its code c0 (scale_thr_start), the
// searches for codes c0 + 1 .. c0 + P and Fs's largest magnitude (any order,
// scale_thr_code), and the checks that turn them into a ScaleThr
// (scale_thr_finish).
struct ScaleThrStart {
  bool ok = false;
  uint32_t t0 = 0, c0 = 0;
};

EXMY_HD ScaleThrStart scale_thr_start(const QuantPlan& p) {
  ScaleThrStart out;
  const Format& f = p.fs;
  const bool pow2_fmt = !f.subnormals && f.M == 0;
  // (dithered scales draw random bits per block: block_scale() alone)
  if (!p.has_scale || p.rule == ScaleRule::amax_sr || f.M > 3 || f.code_bytes() != 1 ||
      !((f.subnormals && f.has_zero) || pow2_fmt))
    return out;
  // c_lo: the first code whose lower neighbour is normal too (the boundary
  // between the largest subnormal and the smallest normal is not periodic)
  const uint32_t P = 1u << f.M;
  uint32_t c_lo = P + 1;
  // ... and no lower than the code above the one at the least normal float
  // b (float32 subnormals do not double by adding to the exponent field)
  {
    const BlockScale s = block_scale(p, float_of(0x00800000u));
    if (!s.underflow && !s.zero && s.code + 1 > c_lo) c_lo = s.code + 1;
  }
  if (f.max_mag < c_lo + P + 1) return out;
  const bool mx = p.rule == ScaleRule::mx_floor || p.rule == ScaleRule::mx_ceil || p.rule == ScaleRule::mx_even;
  // fp32 products (from the boundary into c_lo up) must be normal floats
  // for the doubling argument
  const double lo_product = mx ? f.decode(c_lo - 1) * pow2(p.fe.max_exp) : f.decode(c_lo - 1);
  if (p.arith == Arith::fp32 && lo_product < pow2(-126)) return out;
  const uint32_t t0 = scale_code_least(p, c_lo);
  if (t0 < 0x00800000u || t0 >= 0x7f000000u) return out;
  // the code at t0: c_lo, or above it where the rule skips codes (the MX
  // rules give powers of two only)
  const uint32_t c0 = block_scale(p, float_of(t0)).code;
  if (c0 < c_lo || c0 + P >= f.max_mag) return out;
  out.ok = true;
  out.t0 = t0;
  out.c0 = c0;
  return out;
}

// The code of search j = 1 .. P + 1 after a start s: c0 + j, and for
// j = P + 1 Fs's largest magnitude.
EXMY_HD uint32_t scale_thr_code(const QuantPlan& p, const ScaleThrStart& s, uint32_t j) {
  return j <= (1u << p.fs.M) ? s.c0 + j : p.fs.max_mag;
}

// least[j - 1] = scale_code_least(p, scale_thr_code(p, s, j)) for j = 1 .. P + 1.
EXMY_HD ScaleThr scale_thr_finish(const QuantPlan& p, const ScaleThrStart& s, const uint32_t* least) {
  ScaleThr out;
  if (!s.ok) return out;
  const uint32_t P = 1u << p.fs.M, t0 = s.t0, octave = t0 + (1u << 23);
  for (int j = 0; j < 7; ++j) out.d1[j] = 0x7fffffff;
  uint32_t prev = t0;
  for (uint32_t j = 1; j < P; ++j) {
    // a code the octave never reaches has its threshold in the next one:
    // D_j = 2^23, which r never reaches
    const uint32_t tj = least[j - 1] < octave ? least[j - 1] : octave;
    if (tj < prev) return ScaleThr{};
    out.d1[j - 1] = static_cast<int32_t>(tj - t0 - 1);
    prev = tj;
  }
  // the doubling, checked once: code c0 + P starts at 2 t0
  if (least[P - 1] != octave) return ScaleThr{};
  const uint32_t hi = least[P];
  if (hi <= octave) return ScaleThr{};
  out.t0 = t0;
  out.span = hi - t0;
  out.c_lo = s.c0;
  out.m = static_cast<uint32_t>(p.fs.M);
  out.ok = true;
  return out;
}

// Thresholds for plan p (its tensor scale set); ok false when Fs has more
// than 3 mantissa bits, codes wider than a byte, dithered scales, or ranges
// the derivation does not cover.
EXMY_HD ScaleThr scale_code_thresholds(const QuantPlan& p) {
  const ScaleThrStart s = scale_thr_start(p);
  uint32_t least[9] = {};
  if (s.ok)
    for (uint32_t j = 1; j <= (1u << p.fs.M) + 1; ++j) least[j - 1] = scale_code_least(p, scale_thr_code(p, s, j));
  return scale_thr_finish(p, s, least);
}

// The number of a block's seven thresholds t (ThrBlock::t) that |x| bits a
// exceed: its magnitude code. t is non-decreasing (t[k] is the least bits
// with code >= k+1, less one, and codes grow with |x|), so a > t[k] holds
// for a prefix of k, and three compares find the prefix's length where a
// count takes seven (on the device each compare and add is three
// instructions, most of an element's work).
EXMY_HD uint32_t thresholds_exceeded(const int32_t (&t)[7], int32_t a) {
  const bool hi = a > t[3];                 // code >= 4
  const bool mid = a > (hi ? t[5] : t[1]);  // code >= 6, or >= 2
  const int32_t last = hi ? (mid ? t[6] : t[4]) : (mid ? t[2] : t[0]);
  return (hi ? 4u : 0u) + (mid ? 2u : 0u) + (a > last ? 1u : 0u);
}

// Block amax bits m's scale code by the thresholds: true, with `code`, when
// m is in their range (a normal, unsaturated code, after the zero-scale
// guard too); false for block_scale() to decide.
EXMY_HD bool scale_code_by_thresholds(const ScaleThr& st, uint32_t m, uint32_t& code) {
  const uint32_t d = m - st.t0;
  if (!st.ok || d > st.span - 1) return false;
  const int32_t r = static_cast<int32_t>(d & 0x7fffffu);
  code = st.c_lo + ((d >> 23) << st.m);
  for (int k = 0; k < 7; ++k) code += r > st.d1[k];
  return true;
}

}  // namespace exmy::detail

// The per-call and per-block constants of the fast loops that need no
// vector unit: the FP4 magnitudes, the threshold loop's thresholds (searched
// with the scalar core), the scale-code thresholds and the 4-double loop's
// multipliers.
#include <algorithm>
#include <cfloat>
#include <cmath>

#include "formats/fast/loops.hpp"
#include "formats/thresholds.hpp"

namespace exmy::detail {

Fp4Magnitudes fp4_magnitudes(const QuantPlan& p) {
  Fp4Magnitudes m;
  for (uint32_t q = 0; q < 8; ++q) {
    m.idx[q] = -1;
    if (q > p.fe.max_mag) continue;
    double v = p.fe.mag_value(q);
    m.mag[q] = static_cast<float>(v);  // at most 4 significant bits: exact
    if (v == 0.0) continue;
    double pw = 1.0;
    // split v = odd * 2^k with an odd integer part
    while (v != std::floor(v)) {
      v *= 2;
      pw /= 2;
    }
    while (std::fmod(v, 2.0) == 0.0) {
      v /= 2;
      pw *= 2;
    }
    int k = 0;
    while (k < m.nodd && m.odd[k] != v) ++k;
    if (k == m.nodd) m.odd[m.nodd++] = v;
    m.idx[q] = k;
    m.pw[q] = pw;
  }
  return m;
}

void threshold_block(const QuantPlan& p, const BlockConsts& c, const Fp4Block& vb, ThrBlock& out) {
  std::copy(vb.table, vb.table + 8, out.table);
  for (uint32_t k = 1; k <= 7; ++k) out.t[k - 1] = element_threshold(p, c, k);
  out.sat = saturation_threshold(p, c);
}

ScaleThr scale_code_thresholds(const QuantPlan& p) {
  ScaleThr out;
  const Format& f = p.fs;
  const bool pow2_fmt = !f.subnormals && f.M == 0;
  if (!p.has_scale || f.M > 3 || f.code_bytes() != 1 || !((f.subnormals && f.has_zero) || pow2_fmt)) return out;
  // c_lo: the first code whose lower neighbour is normal too (the boundary
  // between the largest subnormal and the smallest normal is not periodic)
  const uint32_t P = 1u << f.M;
  uint32_t c_lo = P + 1;
  // ... and no lower than the code above the one at the least normal float
  // b (float32 subnormals do not double by adding to the exponent field)
  {
    const BlockScale s = block_scale(p, FLT_MIN);
    if (!s.underflow && !s.zero) c_lo = std::max(c_lo, s.code + 1);
  }
  if (f.max_mag < c_lo + P + 1) return out;
  const bool mx = p.rule == ScaleRule::mx_floor || p.rule == ScaleRule::mx_ceil || p.rule == ScaleRule::mx_even;
  const bool fp32 = p.arith == Arith::fp32;
  // fp32 products (from the boundary into c_lo up) must be normal floats
  // for the doubling argument
  const double lo_product = mx ? std::ldexp(f.decode(c_lo - 1), p.fe.max_exp) : f.decode(c_lo - 1);
  if (fp32 && lo_product < std::ldexp(1.0, -126)) return out;
  // b at which the rule's unrounded scale y meets the boundary into code c
  // (a guess: the search settles it)
  auto guess = [&](uint32_t c) {
    const double v = f.decode(c), vp = f.decode(c - 1);
    const double y = p.rule == ScaleRule::amax_up || p.rule == ScaleRule::mx_ceil      ? vp
                     : p.rule == ScaleRule::amax_down || p.rule == ScaleRule::mx_floor ? v
                                                                                       : 0.5 * (v + vp);
    const double b = mx ? std::ldexp(y, p.fe.max_exp) / p.t : fp32 ? y / p.g_over_emax : y * p.fe.max / p.t;
    return bits_of(static_cast<float>(std::clamp(b, 0.0, 3.0e38)));
  };
  // least b (bits) whose code before the zero-scale guard is >= c
  auto least = [&](uint32_t c) {
    return least_bits(guess(c), [&](uint32_t bb) {
      const BlockScale s = block_scale(p, float_of(bb));
      return bb != 0 && !s.underflow && !s.zero && s.code >= c;
    });
  };
  const uint32_t t0 = least(c_lo);
  if (t0 < 0x00800000u || t0 >= 0x7f000000u) return out;
  // the code at t0: c_lo, or above it where the rule skips codes (the MX
  // rules give powers of two only)
  const uint32_t c0 = block_scale(p, float_of(t0)).code;
  if (c0 < c_lo || c0 + P >= f.max_mag) return out;
  for (int j = 0; j < 7; ++j) out.d1[j] = INT32_MAX;
  uint32_t prev = t0;
  for (uint32_t j = 1; j < P; ++j) {
    // a code the octave never reaches has its threshold in the next one:
    // D_j = 2^23, which r never reaches
    const uint32_t tj = std::min(least(c0 + j), t0 + (1u << 23));
    if (tj < prev) return out;
    out.d1[j - 1] = static_cast<int32_t>(tj - t0 - 1);
    prev = tj;
  }
  // the doubling, checked once: code c0 + P starts at 2 t0
  if (least(c0 + P) != t0 + (1u << 23)) return out;
  const uint32_t hi = least(f.max_mag);
  if (hi <= t0 + (1u << 23)) return out;
  out.t0 = t0;
  out.span = hi - t0;
  out.c_lo = c0;
  out.m = static_cast<uint32_t>(f.M);
  out.ok = true;
  return out;
}

F64Block f64_block(const QuantPlan& p, const BlockConsts& c) {
  F64Block vb;
  vb.s = c.s;
  if (p.arith != Arith::exact) return vb;
  const double t = p.t;
  if (p.has_scale) {
    vb.r = t / c.s;
    vb.r_exact = std::fma(-vb.r, c.s, t) == 0.0;
    vb.u = c.s / t;
    vb.u_exact = std::fma(-vb.u, t, c.s) == 0.0;
  } else {
    vb.r = t;
    vb.r_exact = true;
    vb.u = 1.0 / t;
    vb.u_exact = std::fma(-vb.u, t, 1.0) == 0.0;
  }
  return vb;
}

}  // namespace exmy::detail

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

}  // namespace exmy::detail

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

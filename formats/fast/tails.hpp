// The scalar core for one element of a fast loop: the tails of blocks, the
// lanes a loop leaves (uncertain ones), and CPUs without the loop's vector
// unit. Internal to formats/fast/.
#pragma once

#include <vector>

#include "formats/fast/loops.hpp"

namespace exmy::detail {

// The scalar path for one element, used for tails and uncertain lanes.
inline void core_element(const QuantPlan& p, const BlockConsts& c, const float* x, int64_t i, int64_t j,
                           uint8_t* codes, float* values, RandomBits& rng, SpanCounts& cnt) {
  const uint32_t r = is_stochastic(p.round) ? rng(static_cast<uint64_t>(i)) : 0u;
  const ElemOut e = encode_element(p, c, x[j], r);
  cnt.saturated += (e.flags & kSaturated) ? 1 : 0;
  cnt.nonzero += x[j] != 0.0f;
  cnt.underflow += (x[j] != 0.0f && e.xhat == 0.0f);
  cnt.subnormal += p.fe.classify(e.code) == CodeClass::subnormal;
  if (codes) {
    if (p.fe.code_bytes() == 1) {
      codes[i] = static_cast<uint8_t>(e.code);
    } else {
      codes[2 * i] = static_cast<uint8_t>(e.code);
      codes[2 * i + 1] = static_cast<uint8_t>(e.code >> 8);
    }
  }
  values[i] = e.xhat;
}

// Elements j .. j+n-1 of block `block` of a row, which a threshold loop's
// steps left to the scalar core.
struct RowTail {
  int64_t block, j, n;
};

// The scalar core for the tails a threshold loop collected in one row.
inline void threshold_tails(const QuantPlan& p, const ThrRow& row, const std::vector<RowTail>& tails, uint8_t* codes,
                            float* values, SpanCounts& cnt) {
  RandomBits rng(p.seed, p.stream, 8);  // these modes draw no bits
  for (const RowTail& q : tails) {
    const float* x = row.x + q.block * row.bc;
    const int64_t i0 = row.i0 + q.block * row.bc;
    for (int64_t l = 0; l < q.n; ++l)
      core_element(p, row.consts[row.code[q.block]], x, i0 + q.j + l, q.j + l, codes, values, rng, cnt);
  }
}

}  // namespace exmy::detail

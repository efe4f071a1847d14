// The scalar core for one element of a fast loop: the tails of blocks, the
// lanes a loop leaves (uncertain ones), and CPUs without the loop's vector
// unit. Internal to formats/fast/.
#pragma once

#include <cstdint>
#include <vector>

#include "formats/fast/loops.hpp"
#include "formats/philox_cpu.hpp"

namespace exmy::detail {

// The scalar path for one element, used for tails and uncertain lanes.
// r: the element's random bits (stochastic modes; else unused).
inline void core_element_r(const QuantPlan& p, const BlockConsts& c, const float* x, int64_t i, int64_t j, uint32_t r,
                           uint8_t* codes, float* values, SpanCounts& cnt) {
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

inline void core_element(const QuantPlan& p, const BlockConsts& c, const float* x, int64_t i, int64_t j,
                         uint8_t* codes, float* values, RandomBits& rng, SpanCounts& cnt) {
  core_element_r(p, c, x, i, j, is_stochastic(p.round) ? rng(static_cast<uint64_t>(i)) : 0u, codes, values, cnt);
}

// The Philox words an FP4 loop's stochastic mode draws h bits per element
// from, for the whole row (element i of the call is element rng.first() + i
// of its tensor): words[k] is word j0 + k, with 32 words of slack past the
// row for vector loads. Returns j0.
inline uint64_t fp4_row_words(const QuantPlan& p, const Fp4Row& row, const RandomBits& rng, int h,
                              std::vector<uint32_t>& words) {
  const uint64_t i0 = rng.first() + static_cast<uint64_t>(row.i0);
  const uint64_t first = random_word_index(i0, h) & ~uint64_t{3};
  const uint64_t last = random_word_index(i0 + static_cast<uint64_t>(row.cols) - 1, h);
  words.resize(static_cast<size_t>(last - first + 1 + 32));
  philox_words(p.seed, p.stream, first, static_cast<int64_t>(last - first + 1), words.data());
  return first;
}

// Lanes a per-block FP4 loop leaves to the scalar core, collected during
// the loop and redone after it (a call inside the loop would make the
// compiler keep the vector state in memory): bit l of mask is element j + l
// of block `block`.
struct Fp4Pending {
  int64_t block, j;
  uint32_t mask;
};

// In stochastic modes the lanes' random bits come from the row's words
// (fp4_row_words: words[k] is word j0 + k), not from a Philox block each.
inline void fp4_redo_pending(const QuantPlan& p, const Fp4Row& row, const std::vector<Fp4Pending>& pending, size_t n,
                             int lanes, uint8_t* codes, float* values, RandomBits& rng, const uint32_t* words,
                             uint64_t j0, SpanCounts& cnt) {
  const bool sr = is_stochastic(p.round);
  const int h = rng.bits();
  for (size_t k = 0; k < n; ++k) {
    const Fp4Pending& q = pending[k];
    const float* x = row.x + q.block * row.bc;
    const int64_t i0 = row.i0 + q.block * row.bc;
    for (int l = 0; l < lanes; ++l) {
      if (!(q.mask & (1u << l))) continue;
      const int64_t i = i0 + q.j + l;
      uint32_t r = 0;
      if (sr) {
        const uint64_t g = rng.first() + static_cast<uint64_t>(i);
        r = random_bits_from_word(words[random_word_index(g, h) - j0], g, h);
      }
      core_element_r(p, row.consts[row.key(q.block)], x, i, q.j + l, r, codes, values, cnt);
    }
  }
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

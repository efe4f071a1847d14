// The walk of a threshold loop over the blocks of one row, shared by its
// widths. Include only after a width's `#pragma GCC target`, so that the
// walk and the block loop it is given are compiled (and inlined) together.
#pragma once

#include <algorithm>
#include <vector>

#include "formats/fast/tails.hpp"

namespace exmy::detail {
namespace {

// For each block of the row the loop takes (use[code]), prefetches one cache
// line of the next band per 16 elements (when row.prefetch is set) and runs
// `block(th, x, i0, n)`: the block's thresholds, its first input element,
// its flat index and length; `block` returns how many of the n elements it
// encoded. The rest of each block goes through the scalar core once the row
// is done.
template <class Block>
__attribute__((always_inline)) inline void walk_threshold_row(const QuantPlan& p, const ThrRow& row, uint8_t* codes,
                                                              float* values, SpanCounts& cnt, Block&& block) {
  thread_local std::vector<RowTail> tails;
  tails.clear();
  for (int64_t b = 0; b < row.nblocks; ++b) {
    const uint8_t sc = row.code[b];
    if (!row.use[sc]) continue;
    const int64_t i0 = row.i0 + b * row.bc;
    const int64_t n = std::min(row.bc, row.cols - b * row.bc);
    const float* x = row.x + b * row.bc;
    if (row.prefetch) prefetch_next_lines(row.prefetch, row.prefetch_half, b * row.bc, n);
    const int64_t done = block(row.thr[sc], x, i0, n);
    if (done < n) tails.push_back(RowTail{b, done, n - done});
  }
  threshold_tails(p, row, tails, codes, values, cnt);
}

}  // namespace
}  // namespace exmy::detail

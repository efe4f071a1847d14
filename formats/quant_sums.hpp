// The four double sums of one quantization call (docs/numerics.md §5):
// sum_sq, sum_sq_err, sum_err and sum_abs over (x, x-hat), in the fixed
// order of the specification. Plain header code, shared by the scalar
// reference, the threaded CPU path and the CUDA path, so that every backend
// forms the same sums from the same code.
//
// The order: each row of the [rows, cols] tensor is cut into segments of
// kSumSegment elements (the last one of a row may be shorter; a segment
// never crosses a row end); a segment's partial adds its terms one after
// another in column order from 0.0; the partials, listed in row-major order,
// are combined by the pairwise tree S(p[0..n)) = p[0] for n = 1, else
// S(p[0..h)) + S(p[h..n)) with h the largest power of two below n. It depends
// on neither the block shape nor the thread count nor the device.
#pragma once

#include <cmath>
#include <cstdint>

#include "formats/format.hpp"

namespace exmy {

inline constexpr int64_t kSumSegment = 4096;

// Segments of a [rows, cols] tensor, per row and in all.
EXMY_HD int64_t sum_segments_per_row(int64_t cols) { return (cols + kSumSegment - 1) / kSumSegment; }
EXMY_HD int64_t sum_segments(int64_t rows, int64_t cols) { return rows * sum_segments_per_row(cols); }

// Where segment `seg` (row-major numbering) of a [rows, cols] tensor lies:
// flat index of its first element, and its length.
struct SumSegment {
  int64_t begin, len;
};
EXMY_HD SumSegment sum_segment(int64_t cols, int64_t seg) {
  const int64_t per = sum_segments_per_row(cols);
  const int64_t c0 = (seg % per) * kSumSegment;
  return SumSegment{(seg / per) * cols + c0, cols - c0 < kSumSegment ? cols - c0 : kSumSegment};
}

// Partial sums of some terms, and whether any of their x-hat is +-Inf.
struct SumPartial {
  double sq = 0, sq_err = 0, err = 0, abs = 0;
  bool xh_inf = false;
};

// One node of the tree: a + b, sum by sum.
EXMY_HD SumPartial add_partials(const SumPartial& a, const SumPartial& b) {
  SumPartial s;
  s.sq = a.sq + b.sq;
  s.sq_err = a.sq_err + b.sq_err;
  s.err = a.err + b.err;
  s.abs = a.abs + b.abs;
  s.xh_inf = a.xh_inf || b.xh_inf;
  return s;
}

// Whether any of the segment's x-hat xh[0..n) is +-Inf, given its partial
// s: an infinite x-hat makes its term (x-hat - x)^2 Inf or NaN, and the sum
// of squares stays so, so a finite s.sq_err shows there is none.
EXMY_HD bool segment_has_inf(const SumPartial& s, const float* xh, int64_t n) {
  if (!is_inf(s.sq_err) && !is_nan(s.sq_err)) return false;
  for (int64_t i = 0; i < n; ++i)
    if (is_inf(xh[i])) return true;
  return false;
}

// A segment's partial: its n terms x*x, e*e, e and |x| for e = x-hat - x,
// each computed in double from the float32 values, added one after another
// from 0.0.
EXMY_HD SumPartial segment_partial(const float* x, const float* xh, int64_t n) {
  SumPartial s;
  for (int64_t i = 0; i < n; ++i) {
    const double xd = x[i], e = static_cast<double>(xh[i]) - xd;
    s.sq += xd * xd;
    s.sq_err += e * e;
    s.err += e;
    s.abs += ::fabs(xd);
  }
  s.xh_inf = segment_has_inf(s, xh, n);
  return s;
}

// The tree over partials pushed one after another in list order, without
// storing the list: a stack of complete subtrees of decreasing size (a
// binary counter), each pushed partial merging equal-sized subtrees as
// S(p[0..2^k)) = S(first half) + S(second half). At the end the stack holds
// the complete subtrees of n's binary digits, largest first, and
// S(p[0..n)) = T_0 + (T_1 + (... + T_last)) since h, the largest power of
// two below n, is the size of T_0 (for n not a power of two).
// P is any partial with an add_partials(P, P) (found by argument-dependent
// lookup): SumPartial here, the GEMM statistics' partial in sim/quant.
// Depth bounds the stack: 2^Depth - 1 pushes at most (a device thread that
// pushes a group of kTreeGroup keeps a small one).
template <class P, int Depth = 64>
class PartialTree {
 public:
  EXMY_HD void push(const P& p) {
    P cur = p;
    int level = 0;
    while (depth_ > 0 && level_[depth_ - 1] == level) {
      cur = add_partials(stack_[depth_ - 1], cur);
      --depth_;
      ++level;
    }
    stack_[depth_] = cur;
    level_[depth_] = level;
    ++depth_;
  }
  // S of everything pushed (zeros when nothing was).
  EXMY_HD P result() const {
    if (depth_ == 0) return P{};
    P acc = stack_[depth_ - 1];
    for (int k = depth_ - 2; k >= 0; --k) acc = add_partials(stack_[k], acc);
    return acc;
  }
  // The same with `tail` (the sum of what follows the pushed partials in
  // the list, formed apart) as the innermost term: T_0 + (... + (T_last +
  // tail)), the tree of the whole list when the pushed ones are complete
  // subtrees of sizes no smaller than the tail's (TreeLevels below).
  EXMY_HD P result_with(const P& tail) const {
    P acc = tail;
    for (int k = depth_ - 1; k >= 0; --k) acc = add_partials(stack_[k], acc);
    return acc;
  }

 private:
  P stack_[Depth];
  int level_[Depth] = {};
  int depth_ = 0;
};

using SumTree = PartialTree<SumPartial>;

// S(p[0..n)).
template <class P>
EXMY_HD P tree_sum_of(const P* p, int64_t n) {
  PartialTree<P> t;
  for (int64_t i = 0; i < n; ++i) t.push(p[i]);
  return t.result();
}
EXMY_HD SumPartial tree_sum(const SumPartial* p, int64_t n) { return tree_sum_of(p, n); }

// The same tree level by level, for a device (one thread per group, one
// launch per level). A level takes n items, each the sum of a complete
// subtree of one size (the partials themselves at the first level), and a
// tail, the sum of everything after them in the list (none at first).
// Groups of kTreeGroup consecutive items: a full group's items sum to one
// complete subtree, the next level's item g; the short last group (n not a
// multiple of kTreeGroup) is pushed on a PartialTree and its result_with
// the old tail is the new tail. Once n <= kTreeGroup, one group finishes
// the tree with the same rule. Every addition is one PartialTree makes in
// the same operand order, so the result equals tree_sum_of's bit for bit.
inline constexpr int64_t kTreeGroup = 32;
inline constexpr int kTreeGroupDepth = 6;  // the stack of at most kTreeGroup pushes

template <class P>
struct TreeTail {
  P sum{};
  int has = 0;
};

// Levels before the last: how many items the level after one of n has.
EXMY_HD int64_t tree_level_items(int64_t n) { return n / kTreeGroup; }
// Whether n items need a level before the final group.
EXMY_HD bool tree_needs_level(int64_t n) { return n > kTreeGroup; }

// Thread g of a level of n > kTreeGroup items in[]: out[g] for a full
// group, the new *tail for the short one; threads: ceil(n / kTreeGroup).
template <class P>
EXMY_HD void tree_level_group(const P* in, int64_t n, int64_t g, P* out, TreeTail<P>* tail) {
  const int64_t b = g * kTreeGroup, e = b + kTreeGroup < n ? b + kTreeGroup : n;
  PartialTree<P, kTreeGroupDepth> t;
  for (int64_t i = b; i < e; ++i) t.push(in[i]);
  if (e - b == kTreeGroup) {
    out[g] = t.result();
  } else {
    tail->sum = tail->has ? t.result_with(tail->sum) : t.result();
    tail->has = 1;
  }
}

// The last group (n <= kTreeGroup items): the tree's value.
template <class P>
EXMY_HD P tree_final(const P* in, int64_t n, const TreeTail<P>& tail) {
  PartialTree<P, kTreeGroupDepth> t;
  for (int64_t i = 0; i < n; ++i) t.push(in[i]);
  return tail.has ? t.result_with(tail.sum) : t.result();
}

// The partial of segment `seg` of a tensor with `cols` columns.
EXMY_HD SumPartial tensor_segment_partial(const float* x, const float* xh, int64_t cols, int64_t seg) {
  const SumSegment g = sum_segment(cols, seg);
  return segment_partial(x + g.begin, xh + g.begin, g.len);
}

// The four sums over (x, x-hat) of a [rows, cols] tensor, segment by segment
// in row-major order. The caller applies the Inf rule (final_sums).
EXMY_HD SumPartial tensor_sums(const float* x, const float* xh, int64_t rows, int64_t cols) {
  SumTree t;
  const int64_t n = sum_segments(rows, cols);
  for (int64_t i = 0; i < n; ++i) t.push(tensor_segment_partial(x, xh, cols, i));
  return t.result();
}

// The stored sums: where any x-hat is +-Inf, sum_sq_err and sum_err are +Inf
// whatever else; a NaN sum is the canonical quiet NaN (IEEE leaves the sign
// and payload of a NaN result to the operand order the compiler picks).
EXMY_HD SumPartial final_sums(SumPartial s) {
  const double inf = double_of(0x7ff0000000000000ull), nan = double_of(0x7ff8000000000000ull);
  if (s.xh_inf) s.sq_err = s.err = inf;
  if (is_nan(s.sq)) s.sq = nan;
  if (is_nan(s.sq_err)) s.sq_err = nan;
  if (is_nan(s.err)) s.err = nan;
  if (is_nan(s.abs)) s.abs = nan;
  return s;
}

}  // namespace exmy

// The per-item decisions of a quantized linear's statistics as plain
// EXMY_HD (host + device) code, shared by the CPU's functions in
// sim/quant/stats.cpp and the device's reductions in
// sim/quant/quant_launches.hpp (docs/architecture.md, "CPU and GPU share
// code"):
//
//   abs_bits          |x|'s bits, which order like the magnitudes with NaN
//                     above Inf (abs_max takes the max of them);
//   BlockRange        a block's max |x| and smallest non-zero |x|, kept as
//                     integer max/min over its elements (any order);
//   range_bin_of      the range-histogram bin of a finished block, or -1
//                     for a block the histogram does not count;
//   sampled_row       row i of the R rows the GEMM statistics compare;
//   GemmPartial       the GEMM statistics' six double sums over one segment
//                     of a compared row, and their order (below).
//
// Every one is integer arithmetic, one correctly rounded double division,
// or double sums in one fixed order, so the CPU and the device make the
// same decisions and sums bit for bit.
#pragma once

#include <cmath>
#include <cstdint>

#include "formats/format.hpp"  // EXMY_HD, bits_of, float_of, ilog2
#include "formats/quant_sums.hpp"  // PartialTree, the tree levels

namespace exmy::sim::quant {

// Bins of the block dynamic-range histogram (OperandStats::range_hist,
// sim/quant/stats.hpp says what they count).
inline constexpr int kRangeHistBins = 64;

EXMY_HD uint32_t abs_bits(float x) { return bits_of(x) & 0x7fffffffu; }

// The range bin of a block with max |x| = amax > 0 and smallest non-zero
// |x| = m, both finite: floor(log2(amax / m)) clamped to the bins. The
// quotient in double is exact enough for the floor (a quotient of two
// 24-bit significands below a power of two stays below it), and lies in
// [1, 2^277], a normal double, whose exponent field is the floor.
EXMY_HD int range_bin_hd(float amax, float m) {
  const int k = ilog2(static_cast<double>(amax) / static_cast<double>(m));
  return k < 0 ? 0 : k > kRangeHistBins - 1 ? kRangeHistBins - 1 : k;
}

// A block's extremes over its elements: hi the max of |x|'s bits (NaN above
// Inf, so hi >= 0x7f800000 means a non-finite element) and lo the min of
// (bits - 1), which sends zeros to the top: lo + 1 is the smallest non-zero
// |x|, or 0 for a block of zeros. Integer max and min, so the order of the
// elements does not matter (and the CPU's loops vectorise).
struct BlockRange {
  uint32_t hi = 0, lo = 0xffffffffu;
  EXMY_HD void add(float x) {
    const uint32_t a = abs_bits(x);
    hi = a > hi ? a : hi;
    lo = a - 1u < lo ? a - 1u : lo;
  }
};

// The bin a finished block adds to the range histogram: -1 for a block of
// zeros or one holding a NaN or Inf (not counted).
EXMY_HD int range_bin_of(uint32_t hi, uint32_t lo) {
  if (hi == 0 || hi >= 0x7f800000u) return -1;
  return range_bin_hd(float_of(hi), float_of(lo + 1u));
}

// Row i of R rows out of M, evenly spread: floor(i * M / R) (R = M: row i).
EXMY_HD int64_t sampled_row(int64_t i, int64_t M, int64_t R) { return i * M / R; }

// The GEMM statistics' sums (GemmStats, sim/quant/stats.hpp) over the
// compared rows of y-hat (quantized) and y (reference), in an order that
// does not depend on the thread count or the device: each compared row is
// cut into segments of kGemmSumSegment outputs (the last one shorter); a
// segment's partial adds its terms one after another in column order from
// 0.0 (y·y, ŷ·ŷ, ŷ·y, (ŷ−y)², |y|, |ŷ|, each in double from the floats);
// the partials, row 0's segments first, then row 1's, ..., are combined by
// docs/numerics.md §5's pairwise tree (formats/quant_sums.hpp's
// PartialTree). Segments shorter than §5's 4096 give a device enough
// threads for the few hundred rows a comparison takes.
inline constexpr int64_t kGemmSumSegment = 256;

struct GemmPartial {
  double y2 = 0, yhat2 = 0, y_yhat = 0, err2 = 0, abs_y = 0, abs_yhat = 0;
};

EXMY_HD GemmPartial add_partials(const GemmPartial& a, const GemmPartial& b) {
  GemmPartial s;
  s.y2 = a.y2 + b.y2;
  s.yhat2 = a.yhat2 + b.yhat2;
  s.y_yhat = a.y_yhat + b.y_yhat;
  s.err2 = a.err2 + b.err2;
  s.abs_y = a.abs_y + b.abs_y;
  s.abs_yhat = a.abs_yhat + b.abs_yhat;
  return s;
}

EXMY_HD int64_t gemm_segments_per_row(int64_t N) { return (N + kGemmSumSegment - 1) / kGemmSumSegment; }

// The partial of segment `seg` (row-major numbering over R compared rows
// of N outputs): yhat_row(i) and y_row(i) give compared row i's outputs.
template <class Rows>
EXMY_HD GemmPartial gemm_segment_partial(const Rows& rows, int64_t N, int64_t seg) {
  const int64_t per = gemm_segments_per_row(N), i = seg / per, c0 = (seg % per) * kGemmSumSegment;
  const int64_t c1 = c0 + kGemmSumSegment < N ? c0 + kGemmSumSegment : N;
  const float* a = rows.yhat_row(i);
  const float* b = rows.y_row(i);
  GemmPartial s;
  for (int64_t j = c0; j < c1; ++j) {
    const double ad = a[j], bd = b[j], e = ad - bd;
    s.y2 += bd * bd;
    s.yhat2 += ad * ad;
    s.y_yhat += ad * bd;
    s.err2 += e * e;
    s.abs_y += ::fabs(bd);
    s.abs_yhat += ::fabs(ad);
  }
  return s;
}

// Compared row i of y-hat: row rows[i] of an (M, N) output (rows null: row
// i), and row i of y (R, N).
struct GemmRows {
  const float *yhat, *y;
  const int64_t* rows;
  int64_t N;
  EXMY_HD const float* yhat_row(int64_t i) const { return yhat + (rows ? rows[i] : i) * N; }
  EXMY_HD const float* y_row(int64_t i) const { return y + i * N; }
};

}  // namespace exmy::sim::quant

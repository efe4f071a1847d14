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
//   sampled_row       row i of the R rows the GEMM statistics compare.
//
// Every one is integer arithmetic or one correctly rounded double division,
// so the CPU and the device make the same decisions bit for bit.
#pragma once

#include <cstdint>

#include "formats/format.hpp"  // EXMY_HD, bits_of, float_of, ilog2

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

}  // namespace exmy::sim::quant

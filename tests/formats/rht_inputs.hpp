// Inputs for the tests of the random Hadamard transform's launches (the host
// emulation in test_hadamard_launch.cpp, the device in test_cuda.cpp): a
// [rows, cols] tensor filled segment by segment along the transform's axis,
// each segment in one style, so that every path of rht_segment
// (formats/hadamard_segment.hpp) is taken: the exact butterflies, the
// 320-bit accumulator, signed zeros, Inf and NaN terms, bf16 overflow and
// subnormal inputs.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "formats/format.hpp"

namespace exmy::test {

enum RhtStyle : int {
  kRhtOrdinary,    // a few binades: the exact butterflies
  kRhtBinades,     // 2^-30 .. 2^30: either path, by the segment's span
  kRhtWide,        // 1e30 next to 1e-38 and subnormals: the accumulator
  kRhtZeros,       // +0 and -0 mixed
  kRhtNegZeros,    // every term -0 (-0 outputs only where all n terms are -0)
  kRhtSpecials,    // ordinary values with one Inf, -Inf or NaN
  kRhtOverflow,    // near FLT_MAX, one sign: bf16 overflow to Inf
  kRhtSubnormals,  // float subnormals only
  kRhtCancel,      // small integers: many exact zero sums
  kRhtStyles
};

// Flat index of element i of segment s (segments as rht_segment numbers them).
inline int64_t rht_at(int64_t cols, int n, int axis, int64_t s, int i) {
  return axis == 1 ? s * n + i : ((s / cols) * n + i) * cols + (s % cols);
}

// The tensor; styles (if non-null) receives each segment's style.
inline std::vector<float> rht_input(int64_t rows, int64_t cols, int n, int axis, uint64_t seed,
                                    std::vector<int>* styles = nullptr) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> binade(-30, 30), style_of(0, kRhtStyles - 1), small(-3, 3);
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> x(static_cast<size_t>(rows * cols));
  const int64_t nseg = rows * cols / n;
  if (styles) styles->assign(static_cast<size_t>(nseg), 0);
  for (int64_t s = 0; s < nseg; ++s) {
    const int style = style_of(rng);
    if (styles) (*styles)[static_cast<size_t>(s)] = style;
    const int special_at = static_cast<int>(rng() % static_cast<uint64_t>(n));
    for (int i = 0; i < n; ++i) {
      const float sg = (rng() & 1) ? -1.0f : 1.0f;
      float v;
      switch (style) {
        case kRhtOrdinary: v = normal(rng); break;
        case kRhtBinades: v = normal(rng) * std::ldexp(1.0f, binade(rng)); break;
        case kRhtWide:
          v = i % 3 == 0 ? sg * 1e30f : i % 3 == 1 ? sg * 3e-38f : float_of(static_cast<uint32_t>(rng() & 0x807fffffu));
          break;
        case kRhtZeros: v = sg * 0.0f; break;
        case kRhtNegZeros: v = -0.0f; break;
        case kRhtSpecials: {
          const float specials[3] = {inf, -inf, std::numeric_limits<float>::quiet_NaN()};
          v = i == special_at ? specials[rng() % 3] : normal(rng);
          break;
        }
        case kRhtOverflow: v = std::ldexp(1.0f + static_cast<float>(rng() % 128) / 128.0f, 127); break;
        case kRhtSubnormals: v = float_of(static_cast<uint32_t>(rng() & 0x807fffffu)); break;
        default: v = static_cast<float>(small(rng)); break;
      }
      x[static_cast<size_t>(rht_at(cols, n, axis, s, i))] = v;
    }
  }
  return x;
}

}  // namespace exmy::test

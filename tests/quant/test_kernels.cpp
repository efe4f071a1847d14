// The quantized linear's kernels against their references.
#include <gtest/gtest.h>

#include <bit>
#include <cfloat>
#include <cmath>
#include <random>

#include "formats/quantize.hpp"
#include "sim/parallel.hpp"
#include "sim/quant/kernels.hpp"

namespace exmy::sim::quant {
namespace {

TEST(Kernels, TransposeAnyShape) {
  parallel_min_work() = 0;
  for (auto [r, c] : {std::pair<int64_t, int64_t>{1, 1}, {3, 70}, {64, 32}, {100, 37}, {256, 96}}) {
    std::vector<float> a(static_cast<size_t>(r * c)), t(a.size());
    for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(i);
    transpose(t.data(), a.data(), r, c);
    for (int64_t i = 0; i < r; ++i)
      for (int64_t j = 0; j < c; ++j) ASSERT_EQ(t[j * r + i], a[i * c + j]) << r << "x" << c;
  }
  parallel_min_work() = int64_t{1} << 15;
}

// The threaded Hadamard transform used by the quantized linear against the
// formats library's exact reference, on edge cases of the bf16 rounding.
TEST(Kernels, HadamardEdgeCasesMatchReference) {
  std::mt19937_64 g(7);
  const int64_t rows = 64, cols = 96;
  for (int trial = 0; trial < 6; ++trial) {
    std::vector<float> x(static_cast<size_t>(rows * cols));
    std::normal_distribution<float> n(0.0f, 1.0f);
    for (auto& v : x) v = n(g);
    // Edge cases: zeros and negative zeros (all -0 segments), subnormals,
    // huge values (bf16 overflow), wide spans and Inf/NaN (the formats
    // library's own path), bf16 ties.
    for (int64_t k = 0; k < 16; ++k) x[static_cast<size_t>(k)] = -0.0f;
    for (int64_t k = 16; k < 32; ++k) x[static_cast<size_t>(k)] = (k & 1) ? 0.0f : -0.0f;
    for (int64_t k = 32; k < 48; ++k) x[static_cast<size_t>(k)] = std::ldexp(static_cast<float>(k), -140 - trial);
    for (int64_t k = 48; k < 64; ++k) x[static_cast<size_t>(k)] = FLT_MAX * ((k & 3) ? 1.0f : -0.5f);
    x[100] = std::ldexp(1.0f, 60);
    x[101] = std::ldexp(1.0f, -60);
    x[200] = INFINITY;
    x[300] = std::nanf("");
    for (int64_t k = 400; k < 416; ++k) x[static_cast<size_t>(k)] = 1.0f + std::ldexp(1.0f, -8) * static_cast<float>(k & 3);
    for (size_t i = 1000; i < x.size(); i += 31) x[i] *= std::ldexp(1.0f, static_cast<int>(g() % 200) - 100);
    const uint16_t signs = trial == 0 ? 0xD7E8 : static_cast<uint16_t>(g());
    std::vector<float> a = x, b = x;
    hadamard16(a.data(), rows, cols, 1, signs, 2);
    hadamard16_ref(b.data(), rows, cols, 1, signs);
    for (size_t i = 0; i < a.size(); ++i) {
      if (std::isnan(a[i])) {
        ASSERT_TRUE(std::isnan(b[i])) << i;
        continue;
      }
      ASSERT_EQ(std::bit_cast<uint32_t>(a[i]), std::bit_cast<uint32_t>(b[i])) << "trial " << trial << " element " << i
                                                                            << ": " << a[i] << " vs " << b[i];
    }
  }
}

}  // namespace
}  // namespace exmy::sim::quant

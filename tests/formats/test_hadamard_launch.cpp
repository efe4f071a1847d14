// The random Hadamard transform's kernel launches (apply_rht_launches,
// formats/hadamard_segment.hpp) in their host emulation, apply_rht_emulated,
// against the CPU's transforms bit for bit: apply_rht (the threaded loops,
// 1 and 3 threads) and apply_rht_ref (every output an independent exact sum:
// not the shared per-segment code, so a fault in it shows here), for every
// size (16, 32, 64, 128) and kind, several sign masks, both axes (1x16 and
// 16x1 blocks), row and column counts that are multiples of nothing else,
// and segments that reach every path (rht_inputs.hpp: exact butterflies,
// the accumulator, signed zeros, Inf, NaN, bf16 overflow, subnormals). The
// same launches run on a device in test_cuda (label gpu).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "formats/cuda/quantize_cuda.hpp"
#include "formats/error.hpp"
#include "formats/fast/loops.hpp"
#include "formats/hadamard_segment.hpp"
#include "formats/quantize.hpp"
#include "formats/spec.hpp"
#include "rht_inputs.hpp"
#include "test_support.hpp"

namespace exmy {
namespace {

using test::hex;

QuantSpec rht_spec(int n, RhtKind kind, uint16_t mask, int axis) {
  QuantSpec spec;
  spec.elem = parse_format("e2m1");
  spec.scale = parse_format("e4m3");
  spec.block_rows = axis == 1 ? 1 : 16;
  spec.block_cols = axis == 1 ? 16 : 1;
  spec.rht = true;
  spec.rht_size = n;
  spec.rht_kind = kind;
  spec.rht_signs = mask;
  return spec;
}

TEST(HadamardLaunch, EmulationEqualsCpuBitForBit) {
  uint64_t seed = 100;
  for (const int n : {16, 32, 64, 128}) {
    int64_t segments = 0, accumulator = 0, nan_out = 0, inf_out = 0, neg_zero_out = 0, subnormal_out = 0;
    for (const RhtKind kind : {RhtKind::random, RhtKind::deterministic})
      for (const uint16_t mask : {uint16_t{0xD7E8}, uint16_t{0x0001}, uint16_t{0xFFFF}, uint16_t{0x2B5C}})
        for (const int axis : {1, 0}) {
          ++seed;
          // Along rows: 7 or 1 rows of 3 or 5 segments; along columns: 2 or 3
          // row blocks of 13 or 1 columns.
          const int64_t rows = axis == 1 ? (seed % 2 ? 7 : 1) : n * (seed % 2 ? 2 : 3);
          const int64_t cols = axis == 1 ? n * (seed % 2 ? 3 : 5) : (seed % 2 ? 13 : 1);
          std::vector<int> styles;
          const std::vector<float> x = test::rht_input(rows, cols, n, axis, seed, &styles);
          const QuantSpec spec = rht_spec(n, kind, mask, axis);
          std::vector<float> emu = x, cpu1 = x, cpu3 = x, ref = x;
          apply_rht_emulated(spec, emu.data(), rows, cols);
          apply_rht(spec, cpu1.data(), rows, cols, 1);
          apply_rht(spec, cpu3.data(), rows, cols, 3);
          apply_rht_ref(spec, ref.data(), rows, cols);
          const std::string what = "n " + std::to_string(n) +
                                   (kind == RhtKind::random ? " random" : " deterministic") + " mask " +
                                   test::hexcode(mask) + " axis " + std::to_string(axis) + " " +
                                   std::to_string(rows) + "x" + std::to_string(cols);
          for (size_t i = 0; i < x.size(); ++i) {
            const int64_t s = axis == 1 ? static_cast<int64_t>(i) / n
                                        : (static_cast<int64_t>(i) / cols / n) * cols + static_cast<int64_t>(i) % cols;
            const std::string at = what + " element " + std::to_string(i) + " (segment style " +
                                   std::to_string(styles[static_cast<size_t>(s)]) + ", input " + hex(x[i]) + ")";
            ASSERT_EQ(bits_of(emu[i]), bits_of(ref[i])) << at << ": emulated " << hex(emu[i]) << ", apply_rht_ref "
                                                        << hex(ref[i]);
            ASSERT_EQ(bits_of(emu[i]), bits_of(cpu1[i])) << at << ": emulated " << hex(emu[i]) << ", apply_rht "
                                                         << hex(cpu1[i]);
            ASSERT_EQ(bits_of(emu[i]), bits_of(cpu3[i])) << at << ": emulated " << hex(emu[i])
                                                         << ", apply_rht (3 threads) " << hex(cpu3[i]);
            nan_out += std::isnan(emu[i]);
            inf_out += std::isinf(emu[i]);
            neg_zero_out += bits_of(emu[i]) == 0x80000000u;
            subnormal_out += std::fpclassify(emu[i]) == FP_SUBNORMAL;
          }
          segments += static_cast<int64_t>(styles.size());
          for (const int st : styles) accumulator += st == test::kRhtWide;
        }
    // Not vacuous: every path and every kind of output occurred.
    EXPECT_GT(segments, 100) << n;
    EXPECT_GT(accumulator, 5) << n;
    EXPECT_GT(nan_out, 0) << n;
    EXPECT_GT(inf_out, 0) << n;
    EXPECT_GT(neg_zero_out, 0) << n;
    EXPECT_GT(subnormal_out, 0) << n;
  }
}

// The CPU's transform on every vector width this machine has (the
// transforms have AVX-512 forms) equals the segment
// function's bits, segment by segment, over runs of segments that do not
// divide the tensor, every style of rht_input, on one and on three threads.
TEST(HadamardLaunch, EveryWidthGivesTheSegmentFunctionsBits) {
  const detail::Simd before = detail::simd_width();
  uint64_t seed = 7000;
  for (const detail::Simd w : {detail::Simd::scalar, detail::Simd::avx2, detail::Simd::avx512}) {
    if (w > detail::simd_available()) continue;
    detail::set_simd_width(w);
    for (const int n : {16, 32, 64, 128}) {
      for (const int axis : {1, 0}) {
        for (const uint16_t mask : {uint16_t{0x0000}, uint16_t{0xD7E8}, uint16_t{0xFFFF}}) {
          // along rows 37 x 41 segments: runs of 4096 elements and a partial
          // one; along columns 3 row blocks of 45 columns: runs of 64
          // segments across row blocks, steps of eight columns, a tail of five
          const int64_t rows = axis == 1 ? 37 : 3 * n, cols = axis == 1 ? n * 41 : 45;
          // every style of rht_input, segment by segment; then normal values
          // alone, so that every eight adjacent column segments take the fast
          // path together
          std::vector<float> x = test::rht_input(rows, cols, n, axis, ++seed);
          if (mask == 0xFFFF) {
            std::mt19937 rng(static_cast<uint32_t>(seed));
            std::normal_distribution<float> normal(0.0f, 1.0f);
            for (float& v : x) v = normal(rng);
          }
          const QuantSpec spec = rht_spec(n, RhtKind::random, mask, axis);
          std::vector<float> want = x, one = x, three = x;
          const RhtParams p = rht_params(spec, rows, cols);
          for (int64_t s = 0; s < rht_segment_count(rows, cols, p); ++s) rht_segment(want.data(), cols, p, s);
          apply_rht(spec, one.data(), rows, cols, 1);
          apply_rht(spec, three.data(), rows, cols, 3);
          const std::string what = std::string(detail::simd_name(w)) + " n " + std::to_string(n) + " axis " +
                                   std::to_string(axis) + " mask " + test::hexcode(mask);
          for (size_t i = 0; i < x.size(); ++i) {
            ASSERT_EQ(bits_of(one[i]), bits_of(want[i])) << what << " element " << i << " (input " << hex(x[i])
                                                         << "): " << hex(one[i]) << ", the segment function "
                                                         << hex(want[i]);
            ASSERT_EQ(bits_of(three[i]), bits_of(want[i])) << what << " element " << i << ", 3 threads";
          }
        }
      }
    }
  }
  detail::set_simd_width(before);
}

// Sums just off a bf16 tie at float precision, on the exact butterflies'
// path: x_0 = 4 (1 + 2^-8) and x_1 = -+2^-23 (25 binades apart) make the
// outputs 4 (1 + 2^-8 -+ 2^-25). Rounded to nearest float they land on the
// tie 1 + 2^-8 (one from below, one from above), so only the round-to-odd
// step (to_bf16: a float rounded away from zero steps back by one before
// its sticky bit) gives bf16 1 below and 1 + 2^-7 above the tie.
TEST(HadamardLaunch, EveryWidthRoundsSumsNextToABf16Tie) {
  const detail::Simd before = detail::simd_width();
  for (const detail::Simd w : {detail::Simd::scalar, detail::Simd::avx2, detail::Simd::avx512}) {
    if (w > detail::simd_available()) continue;
    detail::set_simd_width(w);
    for (const float d : {std::ldexp(1.0f, -23), -std::ldexp(1.0f, -23)}) {
      std::vector<float> x(16 * 300, 0.0f);  // 300 segments: more than a 16-lane run
      for (size_t s = 0; s < 300; ++s) x[16 * s] = 4.0f * (1.0f + std::ldexp(1.0f, -8)), x[16 * s + 1] = -d;
      const QuantSpec spec = rht_spec(16, RhtKind::deterministic, 0, 1);
      std::vector<float> got = x;
      apply_rht(spec, got.data(), 300, 16, 1);
      // output j: x_0 + (-1)^popcount(j & 1) x_1
      for (size_t i = 0; i < got.size(); ++i) {
        const bool below = (d > 0) == (i % 2 == 0);  // the sum 4 (1 + 2^-8) - 2^-23 ...
        const float want = below ? 1.0f : 1.0f + std::ldexp(1.0f, -7);
        ASSERT_EQ(bits_of(got[i]), bits_of(want)) << detail::simd_name(w) << " element " << i << ": " << hex(got[i]);
      }
    }
  }
  detail::set_simd_width(before);
}

// The launch's parameters carry the documented sign vector.
TEST(HadamardLaunch, ParamsHoldTheSignVector) {
  for (const int n : {16, 32, 64, 128})
    for (const RhtKind kind : {RhtKind::random, RhtKind::deterministic})
      for (const uint16_t mask : {uint16_t{0xD7E8}, uint16_t{0x0001}, uint16_t{0xFFFF}, uint16_t{0}}) {
        const Rht t{n, kind, mask};
        bool neg[kMaxRht];
        rht_sign_vector(t, neg);
        const RhtParams p = rht_params(t, 2, n, 1);
        EXPECT_EQ(p.size, n);
        EXPECT_EQ(p.axis, 1);
        int set = 0, set16 = 0;
        for (int i = 0; i < n; ++i) {
          EXPECT_EQ(p.negated(i), neg[i]) << n << " " << i;
          set += neg[i];
          set16 += i < 16 && neg[i];
        }
        for (int i = n; i < kMaxRht; ++i) EXPECT_FALSE(p.negated(i)) << n << " " << i;
        // s_i for i < 16 is the mask's bit i; the deterministic kind has none.
        const int want16 = kind == RhtKind::deterministic ? 0 : __builtin_popcount(mask);
        EXPECT_EQ(set16, want16) << n;
        if (kind == RhtKind::deterministic) {
          EXPECT_EQ(set, 0) << n;
        }
      }
}

// apply_rht_emulated fails as apply_rht does: the same one-line message.
TEST(HadamardLaunch, ShapeErrorsAreApplyRhtErrors) {
  const auto msg = [](auto f) { return test::error_message(f); };
  std::vector<float> x(64 * 3, 1.0f);
  for (const int axis : {1, 0}) {
    const QuantSpec spec = rht_spec(128, RhtKind::random, 0xD7E8, axis);
    const int64_t rows = axis == 1 ? 3 : 64, cols = axis == 1 ? 64 : 3;
    const std::string want = msg([&] { apply_rht(spec, x.data(), rows, cols, 1); });
    const std::string got = msg([&] { apply_rht_emulated(spec, x.data(), rows, cols); });
    EXPECT_FALSE(want.empty());
    EXPECT_EQ(got, want);
  }
  QuantSpec bad = rht_spec(16, RhtKind::random, 0xD7E8, 1);
  bad.rht_size = 48;
  EXPECT_EQ(msg([&] { apply_rht_emulated(bad, x.data(), 3, 64); }), msg([&] { apply_rht(bad, x.data(), 3, 64, 1); }));
  EXPECT_NE(msg([&] { apply_rht_emulated(bad, x.data(), 3, 64); }).find("Hadamard size 48"), std::string::npos);
}

}  // namespace
}  // namespace exmy

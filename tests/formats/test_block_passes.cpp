// The per-block passes of the fast CPU path, each against its plain
// definition: band_block_max_bits (block maxima of |x| as float32 bits) and
// block_scale_codes (scale codes, with the threshold form of ScaleThr)
// against block_scale(), the scalar core that quantize_ref uses.
//
// The whole-tensor tests (test_quantize_fast.cpp) reach these passes too,
// but only with the block maxima random data happens to produce; here the
// maxima sweep every binade of float32 and sit on, and one bit pattern
// either side of, every threshold the fast form uses.
#include <gtest/gtest.h>

#include <cmath>
#include <algorithm>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "formats/quantize.hpp"
#include "formats/fast/loops.hpp"
#include "formats/spec.hpp"
#include "test_support.hpp"

namespace exmy {
namespace {

using test::hex;

uint32_t abs_bits(float v) { return bits_of(v) & 0x7fffffffu; }

// Block maxima of a rows x cols band, by definition.
std::vector<uint32_t> block_max_ref(const std::vector<float>& x, int64_t rows, int64_t cols, int64_t bc) {
  std::vector<uint32_t> m(static_cast<size_t>((cols + bc - 1) / bc), 0u);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) m[c / bc] = std::max(m[c / bc], abs_bits(x[r * cols + c]));
  return m;
}

TEST(BlockPasses, BandBlockMaxEqualsDefinition) {
  std::mt19937_64 rng(7);
  const float specials[] = {0.0f, -0.0f, INFINITY, -INFINITY, std::numeric_limits<float>::quiet_NaN(),
                            -std::numeric_limits<float>::quiet_NaN(), 1e-45f, -3e38f};
  for (const int64_t bc : {8, 16, 24, 32, 64, 7, 1, 4}) {
    for (const int64_t rows : {1, 2, 3, 16, 17}) {
      for (const int64_t cols : {bc * 8, bc * 9 + 8, bc * 17, bc * 3 + 5, int64_t{8}, int64_t{48}, bc * 32}) {
        std::vector<float> x(static_cast<size_t>(rows * cols));
        std::uniform_int_distribution<uint32_t> any;
        for (auto& v : x) {
          const uint32_t b = any(rng);
          // random bit patterns, most of them finite, and some specials
          v = (b & 0xff) < 3 ? specials[(b >> 8) % 8] : float_of(b);
        }
        const std::vector<uint32_t> want = block_max_ref(x, rows, cols, bc);
        // out holds garbage before: the pass must overwrite every entry
        std::vector<uint32_t> acc(want.size());
        for (auto& a : acc) a = static_cast<uint32_t>(any(rng));
        detail::band_block_max_bits(x.data(), rows, cols, bc, acc.data());
        for (size_t j = 0; j < want.size(); ++j)
          ASSERT_EQ(acc[j], want[j]) << "bc " << bc << " rows " << rows << " cols " << cols << " block " << j;
      }
    }
  }
}

struct PlanCase {
  std::string name;
  QuantPlan p;
};

std::vector<PlanCase> scale_plans() {
  std::vector<PlanCase> v;
  const ScaleRule rules[] = {ScaleRule::amax_rne, ScaleRule::amax_up,  ScaleRule::amax_down,
                             ScaleRule::mx_floor, ScaleRule::mx_ceil, ScaleRule::mx_even};
  const double amaxes[] = {std::numeric_limits<double>::quiet_NaN(), 4.7, 3.1e-20, 7.3e25};
  for (const char* fs : {"ue5m3", "e4m3", "ue4m3", "ue8m0", "e5m2"}) {
    for (const ScaleRule rule : rules) {
      for (const Arith arith : {Arith::exact, Arith::fp32}) {
        for (const double amax : amaxes) {
          for (const ZeroScale zs : {ZeroScale::zero, ZeroScale::one}) {
            QuantSpec s;
            s.elem = parse_format("e2m1");
            s.scale = parse_format(fs);
            s.rule = rule;
            s.arith = arith;
            s.zero_scale = zs;
            if (!std::isnan(amax)) {
              s.amax_kind = AmaxKind::given;
              s.amax_value = amax;
              s.scale_target = 448.0;
            }
            QuantPlan p = s.plan();
            set_tensor_amax(p, amax);
            v.push_back({std::string(fs) + " " + std::string(scale_rule_name(rule)) +
                             (arith == Arith::exact ? " exact" : " fp32") + " amax " + std::to_string(amax) +
                             (zs == ZeroScale::one ? " zero-scale one" : ""),
                         p});
          }
        }
      }
    }
  }
  return v;
}

// Block maxima that probe the plan: a sweep over all finite float32 bit
// patterns, and every threshold of the fast form with its neighbours.
std::vector<uint32_t> probe_maxima(const detail::ScaleThr& thr, std::mt19937_64& rng) {
  std::vector<uint32_t> b;
  for (uint64_t k = 0; k < 0x7f800000u; k += 0x10001u) b.push_back(static_cast<uint32_t>(k));
  b.push_back(0u);
  b.push_back(1u);
  b.push_back(0x7f7fffffu);
  if (thr.ok) {
    for (uint64_t n = 0; thr.t0 + (n << 23) < uint64_t{thr.t0} + thr.span + (1u << 23); ++n) {
      for (int j = -1; j < 7; ++j) {
        const int64_t d = j < 0 ? 0 : int64_t{thr.d1[j]} + 1;
        if (d > (1 << 23)) continue;
        const int64_t at = int64_t{thr.t0} + (int64_t(n) << 23) + d;
        for (int64_t o = -2; o <= 2; ++o)
          if (at + o >= 0 && at + o < 0x7f800000) b.push_back(static_cast<uint32_t>(at + o));
      }
    }
    for (int64_t o = -2; o <= 2; ++o) b.push_back(static_cast<uint32_t>(int64_t{thr.t0} + thr.span + o) & 0x7fffffffu);
  }
  // in order: runs of eight inside the thresholds' range take the threshold
  // form, the others (and groups across its ends) the arithmetic
  for (auto& v : b) v = std::min(v, 0x7f7fffffu);
  std::sort(b.begin(), b.end());
  // and some random groups of eight mixed from the whole list
  std::uniform_int_distribution<size_t> pick(0, b.size() - 1);
  const size_t n = b.size();
  for (size_t k = 0; k < 4096; ++k) b.push_back(b[pick(rng)]);
  (void)n;
  return b;
}

TEST(BlockPasses, ScaleCodesEqualBlockScale) {
  if (detail::simd_width() < detail::Simd::avx2) GTEST_SKIP() << "block_scale_codes needs AVX2";
  std::mt19937_64 rng(11);
  int with_thresholds = 0, total = 0;
  bool main_case_ok = false;
  for (const PlanCase& c : scale_plans()) {
    const QuantPlan& p = c.p;
    const detail::ScaleThr thr = detail::scale_code_thresholds(p);
    ++total;
    with_thresholds += thr.ok;
    if (c.name.rfind("ue5m3 amax-rne exact amax 4.7", 0) == 0) main_case_ok = thr.ok;
    const std::vector<uint32_t> b = probe_maxima(thr, rng);
    const int64_t n = static_cast<int64_t>(b.size());
    std::vector<uint8_t> codes(b.size(), 0xa5);
    detail::ScaleCodeOut out;
    // ScaleVec does not cover every scale format; those plans are the scalar path's
    if (!detail::block_scale_codes(p, &thr, b.data(), n, codes.data(), out)) {
      EXPECT_FALSE(thr.ok && p.fs.subnormals) << c.name << ": thresholds made but the pass declined";
      continue;
    }
    uint64_t sat = 0, uf = 0, sub = 0;
    uint32_t cmin = 0xff, cmax = 0, mx = 0;
    for (int64_t i = 0; i < n; ++i) {
      const BlockScale s = block_scale(p, float_of(b[i]));
      ASSERT_EQ(codes[i], s.code) << c.name << " amax bits " << hex(float_of(b[i]));
      sat += s.saturated;
      uf += s.underflow;
      sub += p.fs.classify(s.code) == CodeClass::subnormal;
      cmin = std::min(cmin, s.code);
      cmax = std::max(cmax, s.code);
      mx = std::max(mx, b[i]);
    }
    EXPECT_EQ(out.saturated, sat) << c.name;
    EXPECT_EQ(out.underflow, uf) << c.name;
    EXPECT_EQ(out.subnormal, sub) << c.name;
    EXPECT_EQ(out.code_min, cmin) << c.name;
    EXPECT_EQ(out.code_max, cmax) << c.name;
    EXPECT_EQ(out.max_bits, mx) << c.name;
    if (thr.ok) EXPECT_GT(out.by_threshold, uint64_t(n / 32)) << c.name << ": the threshold form hardly ran";
    else EXPECT_EQ(out.by_threshold, 0u) << c.name;
  }
  // the fast form must actually be exercised, on the recipe that motivates it
  EXPECT_TRUE(main_case_ok);
  EXPECT_GT(with_thresholds, total / 2);
}

TEST(BlockPasses, ScaleCodesRefuseNonFiniteMaxima) {
  if (detail::simd_width() < detail::Simd::avx2) GTEST_SKIP() << "block_scale_codes needs AVX2";
  QuantSpec s;
  s.elem = parse_format("e2m1");
  s.scale = parse_format("ue5m3");
  QuantPlan p = s.plan();
  set_tensor_amax(p, std::numeric_limits<double>::quiet_NaN());
  const detail::ScaleThr thr = detail::scale_code_thresholds(p);
  ASSERT_TRUE(thr.ok);
  for (const uint32_t bad : {0x7f800000u, 0x7fc00000u}) {
    for (const int at : {0, 5, 8, 13, 17}) {
      std::vector<uint32_t> b(18, 0x3f800000u);
      b[static_cast<size_t>(at)] = bad;
      std::vector<uint8_t> codes(b.size());
      detail::ScaleCodeOut out;
      EXPECT_FALSE(detail::block_scale_codes(p, &thr, b.data(), 18, codes.data(), out)) << hex(float_of(bad)) << " at " << at;
    }
  }
}

}  // namespace
}  // namespace exmy

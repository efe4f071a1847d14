// Dithered block scales (scale rule amax-sr, docs/numerics.md §3 step 2):
// every block's scale code against a `_ref` written here from the
// definition, with the exact rational rounding of exact_ref.hpp: the scale
// value b·t/Fe.max (exact arithmetic; fp32: the float fl(b · fl(G ·
// fl(1/Fe.max)))) rounded into Fs by the `stochastic` mode with sr_bits
// random bits, those of the block's row-major index in the call's stream
// with its top bit flipped (docs/numerics.md §4). The fast path (which
// leaves these plans to the scalar core) and bands quantized on their own
// must give the reference's bits; over many streams the decoded scale's
// mean is the exact scale.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "exact_ref.hpp"
#include "formats/error.hpp"
#include "formats/philox.hpp"
#include "formats/quant_core.hpp"
#include "formats/quantize.hpp"
#include "formats/spec.hpp"
#include "quantize_outcome.hpp"
#include "test_support.hpp"

namespace exmy {
namespace {

// The scale codes of every block of x by the definition.
std::vector<uint32_t> codes_by_definition(const QuantSpec& s, const std::vector<float>& x, int64_t rows, int64_t cols,
                                          float t) {
  const Format& fs = *s.scale;
  const ref::Table table(fs);
  const int64_t gr = (rows + s.block_rows - 1) / s.block_rows, gc = (cols + s.block_cols - 1) / s.block_cols;
  std::vector<uint32_t> out;
  for (int64_t b = 0; b < gr * gc; ++b) {
    const int64_t r0 = (b / gc) * s.block_rows, c0 = (b % gc) * s.block_cols;
    float amax = 0;
    for (int64_t r = r0; r < std::min(rows, r0 + s.block_rows); ++r)
      for (int64_t c = c0; c < std::min(cols, c0 + s.block_cols); ++c)
        amax = std::max(amax, std::fabs(x[static_cast<size_t>(r * cols + c)]));
    ref::Rat v;
    if (s.arith == Arith::exact) {
      v = ref::exact(amax) * ref::exact(t) / ref::exact(s.elem.max);
    } else {
      const float inv = static_cast<float>(1.0 / s.elem.max);  // fl(1/Fe.max)
      const float g = static_cast<float>(static_cast<double>(t) * inv);
      v = ref::exact(amax * g);
    }
    const uint32_t r = random_bits(s.seed, s.stream ^ (uint64_t{1} << 63), static_cast<uint64_t>(b), s.sr_bits);
    out.push_back(ref::encode(table, ref::Located(table, false, v), ref::Mode::stochastic, s.sr_bits, r, true).code);
  }
  return out;
}

uint32_t code_at(const std::vector<uint8_t>& codes, int bytes, size_t b) {
  uint32_t c = 0;
  for (int k = 0; k < bytes; ++k) c |= static_cast<uint32_t>(codes[b * static_cast<size_t>(bytes) + k]) << (8 * k);
  return c;
}

TEST(DitheredScales, CodesEqualTheDefinitionOnEveryPath) {
  test::Rng rng(606);
  int compared = 0, differ_from_rne = 0;
  for (const char* fs : {"ue5m3", "e4m3", "ue8m0", "ue4m3", "bf16"})
    for (const char* block : {"1x16", "16x1", "16x16", "1x32"})
      for (const Arith arith : {Arith::exact, Arith::fp32})
        for (const int n : {1, 5, 8, 16}) {
          QuantSpec s;
          s.elem = parse_format("e2m1");
          s.scale = parse_format(fs);
          parse_block(block, s.block_rows, s.block_cols);
          s.rule = ScaleRule::amax_sr;
          s.arith = arith;
          s.sr_bits = n;
          s.round = (compared % 2) ? Round::stochastic : Round::rne;  // element rounding apart
          s.seed = 0x1234 + static_cast<uint64_t>(compared);
          s.stream = 77 + static_cast<uint64_t>(compared);
          s.amax_kind = AmaxKind::current;
          const int64_t rows = 37, cols = 70;  // partial edge blocks both ways
          std::vector<float> x(static_cast<size_t>(rows * cols));
          for (auto& v : x) v = std::ldexp(static_cast<float>(rng.uniform() * 2 - 1), static_cast<int>(rng.range(-12, 12)));
          const test::Outcome r = test::run(s, x, rows, cols, 0);
          ASSERT_FALSE(r.threw) << r.error;
          const auto want = codes_by_definition(s, x, rows, cols, r.info.t);
          const int sb = s.scale->code_bytes();
          const std::string what = std::string(fs) + " " + block + (arith == Arith::fp32 ? " fp32" : " exact") +
                                   " sr_bits " + std::to_string(n);
          ASSERT_EQ(r.scodes.size(), want.size() * static_cast<size_t>(sb)) << what;
          for (size_t b = 0; b < want.size(); ++b) ASSERT_EQ(code_at(r.scodes, sb, b), want[b]) << what << ", block " << b;
          for (const int threads : {1, 2})
            EXPECT_EQ(test::difference(r, test::run(s, x, rows, cols, threads), x), "") << what << ", " << threads
                                                                                        << " threads";
          test::Outcome bands = test::run_bands(s, x, rows, cols, 2 * s.block_rows, 2);
          bands.info = r.info;  // a band call decides nothing at tensor level
          EXPECT_EQ(test::difference(r, bands, x), "") << what << ", bands";
          QuantSpec rne = s;
          rne.rule = ScaleRule::amax_rne;
          differ_from_rne += test::run(rne, x, rows, cols, 0).scodes != r.scodes;
          ++compared;
        }
  EXPECT_GT(differ_from_rne, compared / 2);  // the dither is there
}

// One block whose exact scale lies a quarter of the way from one scale code
// to the next (representable in the random bits): over 4000 streams, only
// those two codes, in about 3 : 1, and the mean decoded scale is the exact one.
TEST(DitheredScales, UnbiasedOverStreams) {
  QuantSpec s;
  s.elem = parse_format("e2m1");
  s.scale = parse_format("ue5m3");
  s.rule = ScaleRule::amax_sr;
  s.sr_bits = 8;
  s.amax_kind = AmaxKind::none;  // t = 1: the scale is b / 6
  // ue5m3 codes 1.0 and 1.125 around 1.03125: b = 6 * 1.03125
  std::vector<float> x(16, 0.0f);
  x[3] = 6.0f * 1.03125f;
  double sum = 0;
  int hi = 0;
  const int kCalls = 4000;
  for (int k = 0; k < kCalls; ++k) {
    s.stream = static_cast<uint64_t>(k);
    const test::Outcome r = test::run(s, x, 1, 16, 1);
    ASSERT_FALSE(r.threw) << r.error;
    const double v = s.scale->decode(r.scodes[0]);
    ASSERT_TRUE(v == 1.0 || v == 1.125) << v;
    hi += v == 1.125;
    sum += v;
  }
  const double p = 0.25, sd = std::sqrt(p * (1 - p) / kCalls);
  EXPECT_NEAR(static_cast<double>(hi) / kCalls, p, 4 * sd);
  EXPECT_NEAR(sum / kCalls, 1.03125, 4 * sd * 0.125);
}

TEST(DitheredScales, Errors) {
  QuantSpec s;
  s.elem = parse_format("e2m1");
  s.scale = parse_format("ue5m3");
  s.rule = ScaleRule::amax_sr;
  s.four_over_six = FourSix::mse;
  EXPECT_THROW(
      {
        try {
          s.validate();
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("cannot be combined with --scale-rule amax-sr"), std::string::npos)
              << e.what();
          throw;
        }
      },
      Error);
  s.four_over_six = FourSix::off;
  s.sr_bits = 0;
  EXPECT_THROW(s.validate(), Error);  // the scale's random bits are sr_bits too
  s.sr_bits = 8;
  EXPECT_NO_THROW(s.validate());
  EXPECT_EQ(parse_scale_rule("amax-sr"), ScaleRule::amax_sr);
}

}  // namespace
}  // namespace exmy

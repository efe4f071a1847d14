// The worked examples of docs/numerics.md §6, each through the scalar reference, the
// threaded path (1 and 2 threads) and, where it is a single rounding, the
// rounding core directly.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "formats/philox.hpp"
#include "formats/quantize.hpp"
#include "formats/spec.hpp"
#include "test_support.hpp"

namespace exmy {
namespace {

using test::hex;

// Dequantized values of a 1xN tensor without a block scale, from every
// implementation; they must agree with each other bit for bit.
std::vector<float> run_all(const QuantSpec& spec, const std::vector<float>& x) {
  const auto n = static_cast<int64_t>(x.size());
  std::vector<float> ref(x.size()), fast1(x.size()), fast2(x.size());
  quantize_ref(spec, x.data(), 1, n, QuantOutput{ref.data(), nullptr, nullptr, nullptr});
  quantize(spec, x.data(), 1, n, QuantOutput{fast1.data(), nullptr, nullptr, nullptr}, 1);
  quantize(spec, x.data(), 1, n, QuantOutput{fast2.data(), nullptr, nullptr, nullptr}, 2);
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_EQ(bits_of(fast1[i]), bits_of(ref[i])) << "element " << i;
    EXPECT_EQ(bits_of(fast2[i]), bits_of(ref[i])) << "element " << i;
  }
  return ref;
}

void expect_values(const std::vector<float>& got, const std::vector<float>& want, const char* what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_EQ(bits_of(got[i]), bits_of(want[i])) << what << " element " << i << ": " << hex(got[i]) << ", expected "
                                                 << hex(want[i]);
}

TEST(WorkedExamples, E2m1Rne) {
  QuantSpec s;
  s.elem = parse_format("e2m1");
  const std::vector<float> x = {-100, -0.75f, -0.25f, 0, 0.25f, 0.5f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5, 100};
  const std::vector<float> want = {-6, -1, -0.0f, 0, 0, 0.5f, 1, 1, 2, 2, 4, 4, 6};
  expect_values(run_all(s, x), want, "e2m1 rne");
  // the rounding core agrees
  for (size_t i = 0; i < x.size(); ++i)
    EXPECT_EQ(bits_of(static_cast<float>(s.elem.decode(encode_exact(s.elem, x[i], Round::rne, 0, 0, true).code))),
              bits_of(want[i]))
        << hex(x[i]);
}

TEST(WorkedExamples, Ue5m3Rne) {
  QuantSpec s;
  s.elem = parse_format("ue5m3");
  const std::vector<float> x = {0, 0x1p-18f, 0x1p-17f, 0x1p-14f, 61440, 1e5f};
  const std::vector<float> want = {0, 0, 0x1p-17f, 0x1p-14f, 61440, 61440};
  expect_values(run_all(s, x), want, "ue5m3 rne");
}

TEST(WorkedExamples, E2m1StochasticFast8) {
  const Format f = parse_format("e2m1");
  EXPECT_EQ(f.decode(encode_exact(f, 0.75, Round::stochastic_fast, 8, 127, true).code), 0.5);
  EXPECT_EQ(f.decode(encode_exact(f, 0.75, Round::stochastic_fast, 8, 128, true).code), 1.0);
  // End to end: elements whose Philox bits (seed 0, stream 0) are 127 and 128.
  int64_t i127 = -1, i128 = -1;
  for (int64_t i = 0; i < 100000 && (i127 < 0 || i128 < 0); ++i) {
    const uint32_t r = random_bits(0, 0, static_cast<uint64_t>(i), 8);
    if (r == 127 && i127 < 0) i127 = i;
    if (r == 128 && i128 < 0) i128 = i;
  }
  ASSERT_GE(i127, 0);
  ASSERT_GE(i128, 0);
  QuantSpec s;
  s.elem = f;
  s.round = Round::stochastic_fast;
  s.sr_bits = 8;
  const std::vector<float> x(static_cast<size_t>(std::max(i127, i128) + 1), 0.75f);
  const std::vector<float> v = run_all(s, x);
  EXPECT_EQ(v[static_cast<size_t>(i127)], 0.5f);
  EXPECT_EQ(v[static_cast<size_t>(i128)], 1.0f);
}

// The 1x1 e2m1/ue5m3 example: fp32 arithmetic meets a tie in the block scale
// (resolved to even, 40960); exact arithmetic gives 36864.
TEST(WorkedExamples, Ue5m3ScaleFp32VersusExact) {
  const float x = 7.209771652307365e-15f;
  for (Arith a : {Arith::fp32, Arith::exact}) {
    QuantSpec s;
    s.elem = parse_format("e2m1");
    s.scale = parse_format("ue5m3");
    s.block_rows = 1;
    s.block_cols = 1;
    s.amax_kind = AmaxKind::given;
    s.amax_value = static_cast<double>(static_cast<float>(8.30072435974513e-17));
    s.scale_target = 448.0;
    s.arith = a;
    for (int impl = 0; impl < 3; ++impl) {
      uint8_t scode = 0xee, code = 0xee;
      float v = 0;
      const QuantOutput out{&v, &code, &scode, nullptr};
      if (impl == 0) quantize_ref(s, &x, 1, 1, out);
      else quantize(s, &x, 1, 1, out, impl);
      EXPECT_EQ(s.scale->decode(scode), a == Arith::fp32 ? 40960.0 : 36864.0)
          << (a == Arith::fp32 ? "fp32" : "exact") << " implementation " << impl << " scale code "
          << test::hexcode(scode);
    }
  }
}

}  // namespace
}  // namespace exmy

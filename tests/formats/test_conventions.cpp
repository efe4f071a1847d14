// Conventions of other implementations (formats/conventions.hpp): the codes
// Transformer Engine writes for zero-scale blocks and -0 inputs, and the
// scale-first FP32 dequantization of the UE5M3 reference's Torch path. Each
// expectation is derived here from the definition, on top of exmy's own
// outputs, and every backend (reference, threaded, CUDA emulation) must
// agree byte for byte.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "formats/conventions.hpp"
#include "formats/error.hpp"
#include "formats/quantize.hpp"
#include "formats/spec.hpp"
#ifdef EXMY_HAVE_CUDA
#include "formats/cuda/quantize_cuda.hpp"
#endif

namespace exmy {
namespace {

struct Out {
  std::vector<float> values;
  std::vector<uint8_t> codes, scales;
  QuantStats stats;
};

enum class Backend { ref, fast, cuda_emulated };

Out run(const QuantSpec& spec, const std::vector<float>& x, int64_t rows, int64_t cols, Backend b) {
  Out o;
  o.values.resize(x.size());
  o.codes.resize(x.size() * static_cast<size_t>(spec.elem.code_bytes()));
  o.scales.resize(static_cast<size_t>(block_count(spec, rows, cols)) * (spec.scale ? spec.scale->code_bytes() : 1));
  const QuantOutput out{o.values.data(), o.codes.data(), o.scales.data(), &o.stats};
  switch (b) {
    case Backend::ref: quantize_ref(spec, x.data(), rows, cols, out); break;
    case Backend::fast: quantize(spec, x.data(), rows, cols, out, 2); break;
    case Backend::cuda_emulated:
#ifdef EXMY_HAVE_CUDA
      quantize_cuda_emulated(spec, x.data(), rows, cols, out);
#else
      quantize(spec, x.data(), rows, cols, out, 1);
#endif
      break;
  }
  return o;
}

uint32_t bits(float f) { return std::bit_cast<uint32_t>(f); }

// NVFP4 with a given tensor amax so large that the blocks of small values
// get a zero E4M3 scale: block 0 holds -0, +0 and small values of both
// signs (its scale underflows), block 1 ordinary values with a -0 among
// them.
QuantSpec nvfp4(double amax) {
  QuantSpec s;
  s.elem = parse_format("e2m1");
  s.scale = parse_format("e4m3");
  s.block_cols = 16;
  s.arith = Arith::fp32;
  s.amax_kind = AmaxKind::given;
  s.amax_value = amax;
  return s;
}

std::vector<float> two_blocks() {
  std::vector<float> x(32);
  for (int i = 0; i < 16; ++i) x[i] = (i % 2 ? -1.0f : 1.0f) * 1e-6f * static_cast<float>(i + 1);
  x[3] = -0.0f;
  x[4] = 0.0f;
  for (int i = 16; i < 32; ++i) x[i] = (i % 3 ? 1.0f : -1.0f) * 0.25f * static_cast<float>(i - 15);
  x[20] = -0.0f;
  return x;
}

TEST(Conventions, TeCodesForZeroScaleBlocksAndMinusZero) {
  QuantSpec exmy_spec = nvfp4(1e6);
  QuantSpec te = exmy_spec;
  te.codes = CodeConvention::te;
  const auto x = two_blocks();
  const Out base = run(exmy_spec, x, 1, 32, Backend::ref);
  ASSERT_EQ(base.scales[0], 0u) << "block 0 must have a zero scale for this test";
  ASSERT_NE(base.scales[1], 0u);
  // The definition, applied to exmy's own bytes.
  std::vector<uint8_t> want = base.codes;
  std::vector<float> want_values = base.values;
  for (int i = 0; i < 32; ++i) {
    if (bits(x[i]) == 0x80000000u) {  // -0 encodes +0, its value is +0
      want[i] = 0;
      want_values[i] = 0.0f;
    } else if (i < 16 && x[i] != 0.0f) {  // zero scale: +-6 (code 0x7 / 0xF)
      want[i] = std::signbit(x[i]) ? 0xF : 0x7;
    }
  }
  ASSERT_NE(want, base.codes);
  for (Backend b : {Backend::ref, Backend::fast, Backend::cuda_emulated}) {
    const Out o = run(te, x, 1, 32, b);
    EXPECT_EQ(o.codes, want) << static_cast<int>(b);
    EXPECT_EQ(o.scales, base.scales) << static_cast<int>(b);
    for (int i = 0; i < 32; ++i) EXPECT_EQ(bits(o.values[i]), bits(want_values[i])) << i << " backend " << static_cast<int>(b);
    // Statistics describe exmy's decisions: unchanged.
    EXPECT_EQ(o.stats.underflow, base.stats.underflow);
    EXPECT_EQ(o.stats.scale_underflow, base.stats.scale_underflow);
    EXPECT_EQ(bits(static_cast<float>(o.stats.sum_sq_err)), bits(static_cast<float>(base.stats.sum_sq_err)));
  }
  // Without codes or scale codes asked for, the values are the same.
  std::vector<float> v(32);
  quantize(te, x.data(), 1, 32, QuantOutput{v.data(), nullptr, nullptr, nullptr}, 1);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(bits(v[i]), bits(want_values[i])) << i;
}

// x-hat = fl(q * fl(s * 1/G)) under scale-first: recomputed here from the
// codes and scale codes with this test's own decoding, and different from
// exmy's fl(fl(q * s) * 1/G) in some elements (by one ulp).
TEST(Conventions, ScaleFirstDequantization) {
  std::mt19937 g(5);
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::vector<float> x(64 * 64);
  for (auto& v : x) v = n(g) * std::exp(n(g));
  QuantSpec p = nvfp4(0);
  p.amax_kind = AmaxKind::current;
  p.scale = parse_format("ue5m3");
  p.scale_target = 448;
  QuantSpec sf = p;
  sf.dequant = DequantOrder::scale_first;
  const Out base = run(p, x, 64, 64, Backend::ref);
  const float e2m1[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  // UE5M3 (bias 15, subnormals): 2^(e-15) * (1 + m/8), or 2^-14 * m/8.
  auto ue5m3 = [](uint8_t c) {
    const int e = c >> 3, m = c & 7;
    return e == 0 ? std::ldexp(m / 8.0, -14) : std::ldexp(1.0 + m / 8.0, e - 15);
  };
  double amax = 0;
  for (float v : x) amax = std::max(amax, static_cast<double>(std::fabs(v)));
  const float G = static_cast<float>(6.0 * 448.0 / amax), ginv = 1.0f / G;
  int differ = 0;
  for (Backend b : {Backend::ref, Backend::fast, Backend::cuda_emulated}) {
    const Out o = run(sf, x, 64, 64, b);
    EXPECT_EQ(o.codes, base.codes);
    EXPECT_EQ(o.scales, base.scales);
    for (size_t i = 0; i < x.size(); ++i) {
      const uint8_t c = o.codes[i];
      const float s = static_cast<float>(ue5m3(o.scales[i / 16]));
      const float want = (c & 8 ? -1.0f : 1.0f) * (e2m1[c & 7] * (s * ginv));
      ASSERT_EQ(bits(o.values[i]), bits(want)) << i << " backend " << static_cast<int>(b);
      differ += bits(o.values[i]) != bits(base.values[i]);
    }
  }
  EXPECT_GT(differ, 0) << "the two orders never differed: the test shows nothing";
}

TEST(Conventions, OptionsAreCheckedAndNamed) {
  EXPECT_EQ(parse_code_convention("te"), CodeConvention::te);
  EXPECT_EQ(code_convention_name(CodeConvention::exmy), "exmy");
  EXPECT_EQ(parse_dequant_order("scale-first"), DequantOrder::scale_first);
  EXPECT_EQ(dequant_order_name(DequantOrder::product_first), "product-first");
  EXPECT_THROW(parse_code_convention("nv"), Error);
  EXPECT_THROW(parse_dequant_order("first"), Error);
  QuantSpec s = nvfp4(1.0);
  s.dequant = DequantOrder::scale_first;
  s.arith = Arith::exact;
  EXPECT_THROW(s.validate(), Error);
  QuantSpec u = nvfp4(1.0);
  u.elem = parse_format("ue4m3");
  u.codes = CodeConvention::te;
  EXPECT_THROW(u.validate(), Error);
}

}  // namespace
}  // namespace exmy

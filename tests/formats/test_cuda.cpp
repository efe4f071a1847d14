// The CUDA path (formats/cuda) against the CPU: every shared reference
// vector, and random tensors over formats, block shapes, scale rules,
// rounding modes, arithmetics and tensor-amax policies, compared with
// quantize_ref bit for bit (values, element codes, scale codes, statistics
// including the double sums, and the tensor-level decisions).
//
// Built twice:
// - test_cuda (CTest label "gpu") runs quantize_cuda on the device; without
//   a CUDA device every comparison reports SKIPPED (never passed);
// - test_cuda_emulated (label "unit", EXMY_TEST_EMULATED) runs
//   quantize_cuda_emulated, the kernels' per-block code on the host, so the
//   kernels' logic is checked on every machine.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "formats/cuda/quantize_cuda.hpp"
#include "formats/error.hpp"
#include "formats/pack.hpp"
#include "formats/conventions.hpp"
#include "formats/quantize.hpp"
#include "formats/spec.hpp"
#include "tests/formats/vectors.hpp"

namespace exmy {
namespace {

#if defined(EXMY_TEST_EMULATED)
constexpr auto kImpl = quantize_cuda_emulated;
#define EXMY_REQUIRE_CUDA() \
  do {                      \
  } while (0)
#else
constexpr auto kImpl = quantize_cuda;
#define EXMY_REQUIRE_CUDA()                                                                        \
  do {                                                                                             \
    if (!cuda_available()) GTEST_SKIP() << "needs a CUDA device: " << cuda_device_description(); \
  } while (0)
#endif

// All outputs of one call.
struct RunOut {
  std::vector<float> values;
  std::vector<uint8_t> codes, scales;
  QuantStats stats;
  QuantInfo info;
};

template <class F>
RunOut run(const QuantSpec& spec, int64_t rows, int64_t cols, F f) {
  RunOut r;
  const int64_t n = rows * cols;
  r.values.assign(static_cast<size_t>(n), -1.0f);
  r.codes.assign(static_cast<size_t>(n * spec.elem.code_bytes()), 0xAB);
  r.scales.assign(static_cast<size_t>(block_count(spec, rows, cols) * (spec.scale ? spec.scale->code_bytes() : 1)), 0xAB);
  r.info = f(QuantOutput{r.values.data(), r.codes.data(), r.scales.data(), &r.stats});
  return r;
}

std::string hex32(uint32_t v) {
  char b[16];
  std::snprintf(b, sizeof b, "%08x", v);
  return b;
}

// Compares `got` (CUDA) with `want` (CPU) and reports the first differences in hex.
void expect_same(const RunOut& got, const RunOut& want, const std::string& what) {
  ASSERT_EQ(got.values.size(), want.values.size()) << what;
  int bad = 0;
  for (size_t i = 0; i < want.values.size() && bad < 5; ++i) {
    if (bits_of(got.values[i]) != bits_of(want.values[i])) {
      ADD_FAILURE() << what << " element " << i << ": value " << hex32(bits_of(got.values[i])) << ", expected "
                    << hex32(bits_of(want.values[i]));
      ++bad;
    }
  }
  for (size_t i = 0; i < want.codes.size() && bad < 5; ++i) {
    if (got.codes[i] != want.codes[i]) {
      ADD_FAILURE() << what << " code byte " << i << ": " << int(got.codes[i]) << ", expected " << int(want.codes[i]);
      ++bad;
    }
  }
  for (size_t i = 0; i < want.scales.size() && bad < 5; ++i) {
    if (got.scales[i] != want.scales[i]) {
      ADD_FAILURE() << what << " scale code byte " << i << ": " << int(got.scales[i]) << ", expected "
                    << int(want.scales[i]);
      ++bad;
    }
  }
  const QuantStats &a = got.stats, &b = want.stats;
  EXPECT_EQ(a.elements, b.elements) << what;
  EXPECT_EQ(a.nonzero, b.nonzero) << what;
  EXPECT_EQ(a.underflow, b.underflow) << what;
  EXPECT_EQ(a.saturated, b.saturated) << what;
  EXPECT_EQ(a.subnormal, b.subnormal) << what;
  EXPECT_EQ(a.blocks, b.blocks) << what;
  EXPECT_EQ(a.scale_underflow, b.scale_underflow) << what;
  EXPECT_EQ(a.scale_subnormal, b.scale_subnormal) << what;
  EXPECT_EQ(a.scale_saturated, b.scale_saturated) << what;
  EXPECT_EQ(a.scale_four, b.scale_four) << what;
  EXPECT_EQ(bits_of(a.sum_sq), bits_of(b.sum_sq)) << what;
  EXPECT_EQ(bits_of(a.sum_sq_err), bits_of(b.sum_sq_err)) << what;
  EXPECT_EQ(bits_of(a.sum_err), bits_of(b.sum_err)) << what;
  EXPECT_EQ(bits_of(a.sum_abs), bits_of(b.sum_abs)) << what;
  EXPECT_EQ(bits_of(got.info.amax), bits_of(want.info.amax)) << what;
  EXPECT_EQ(bits_of(got.info.t), bits_of(want.info.t)) << what;
  EXPECT_EQ(got.info.block_grid_rows, want.info.block_grid_rows) << what;
  EXPECT_EQ(got.info.block_grid_cols, want.info.block_grid_cols) << what;
}

// Random float32 tensor mixing magnitudes over many binades with the special
// values docs/numerics.md names: exact zeros, -0, subnormals, huge values, and,
// when asked, +-Inf and NaN.
std::vector<float> random_tensor(int64_t n, uint64_t seed, bool specials) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> kind(0, 99), binade(-30, 20);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n));
  for (auto& v : x) {
    const int k = kind(rng);
    if (k < 70) {
      v = normal(rng) * std::ldexp(1.0f, binade(rng) / 4);
    } else if (k < 80) {
      v = normal(rng) * std::ldexp(1.0f, binade(rng));
    } else if (k < 85) {
      v = (k & 1) ? 0.0f : -0.0f;
    } else if (k < 88) {
      v = float_of(static_cast<uint32_t>(rng() & 0x807fffffu));  // subnormal or zero
    } else if (k < 91) {
      v = normal(rng) * 1e30f;
    } else if (specials && k < 93) {
      v = (k & 1) ? std::numeric_limits<float>::infinity() : -std::numeric_limits<float>::infinity();
    } else if (specials && k == 93 && (rng() % 8) == 0) {
      v = std::numeric_limits<float>::quiet_NaN();
    } else {
      v = normal(rng);
    }
  }
  return x;
}

// ---------------------------------------------------------------------------

#if !defined(EXMY_TEST_EMULATED)
TEST(CudaPath, NoDeviceIsAnError) {
  if (cuda_available()) GTEST_SKIP() << "a CUDA device is present: " << cuda_device_description();
  QuantSpec spec;
  spec.elem = parse_format("e2m1");
  const float x[16] = {1.0f};
  EXPECT_THROW(quantize_cuda(spec, x, 1, 16, QuantOutput{}), Error);
}
#endif

TEST(CudaVectors, AllCases) {
  EXMY_REQUIRE_CUDA();
  ASSERT_EQ(vectors::cases().size(), 306u);
  for (const auto& c : vectors::cases())
    vectors::check_case(c, [&](const QuantOutput& o) { kImpl(c.spec, c.input.data(), c.rows, c.cols, o); },
                        "cuda");
}

struct RandomConfig {
  const char* elem;
  const char* scale;  // nullptr: no block scale
  const char* block;
};

// Formats chosen to cover: FP4/FP6/FP8 elements, UE4M3/UE5M3/E8M0 scales,
// a format without subnormals, one without zero, 2-byte codes, and the
// 128-bit rounding path (M + sr_bits > 49).
const RandomConfig kConfigs[] = {
    {"e2m1", "ue4m3", "1x16"},  {"e2m1", "ue5m3", "1x16"},    {"e2m1", "ue8m0", "1x32"}, {"e4m3", "ue8m0", "32x1"},
    {"e2m3", "ue8m0", "16x16"}, {"e3m2", "ue4m3", "1x7"},     {"e5m2", "ue8m0", "3x3"},  {"e2m1", "ue5m3", "1x1"},
    {"e4m3", "ue5m3", "16x1"},  {"e3m4:nosub", "ue8m0", "1x4"}, {"e2m1", "e4m3", "2x2"}, {"e4m3", nullptr, "1x16"},
    {"fp16", nullptr, "1x16"},  {"e2m1", nullptr, "1x16"},    {"e5m20", nullptr, "1x16"}, {"bf16", "ue8m0", "1x64"},
};

TEST(CudaRandom, MatchesReference) {
  EXMY_REQUIRE_CUDA();
  const int64_t shapes[][2] = {{67, 97}, {1, 300}, {33, 16}, {128, 64}};
  const ScaleRule rules[] = {ScaleRule::amax_rne, ScaleRule::amax_up, ScaleRule::amax_down, ScaleRule::mx_floor,
                             ScaleRule::mx_ceil,  ScaleRule::mx_even, ScaleRule::amax_sr};
  const Round modes[] = {Round::rne,  Round::rna,        Round::rtz,             Round::up,
                         Round::down, Round::odd,        Round::stochastic,      Round::stochastic_fast,
                         Round::stochastic_fastest};
  int calls = 0;
  uint64_t seed = 1;
  QuantStats seen;
  size_t nan_values = 0;
  for (const auto& cfg : kConfigs) {
    for (const auto& shape : shapes) {
      for (int variant = 0; variant < 6; ++variant, ++seed) {
        QuantSpec spec;
        spec.elem = parse_format(cfg.elem);
        if (cfg.scale) spec.scale = parse_format(cfg.scale);
        parse_block(cfg.block, spec.block_rows, spec.block_cols);
        spec.rule = rules[(seed * 7) % 7];
        spec.round = modes[(seed * 5) % 9];
        spec.sr_bits = std::string(cfg.elem) == "e5m20" ? 32 : static_cast<int>(1 + (seed * 11) % 16);
        spec.seed = 0x9E3779B97F4A7C15ull * seed;
        spec.stream = seed * 1000003u;
        spec.arith = (variant & 1) ? Arith::fp32 : Arith::exact;
        spec.zero_scale = (variant % 3 == 2) ? ZeroScale::one : ZeroScale::zero;
        switch (variant % 3) {
          case 0: spec.amax_kind = AmaxKind::current; break;
          case 1: spec.amax_kind = AmaxKind::given; spec.amax_value = 3.5; break;
          default: spec.amax_kind = AmaxKind::none; break;
        }
        if (variant == 4 && spec.scale) spec.scale_target = 448.0;
        // Specials (Inf, NaN) only where the formats can hold a NaN block.
        const bool nan_ok = spec.elem.has_nan || (spec.scale && spec.scale->has_nan);
        const std::vector<float> x = random_tensor(shape[0] * shape[1], seed, nan_ok && variant != 5);
        const std::string what = std::string(cfg.elem) + "/" + (cfg.scale ? cfg.scale : "none") + " " + cfg.block +
                                 " " + std::to_string(shape[0]) + "x" + std::to_string(shape[1]) + " rule " +
                                 std::string(scale_rule_name(spec.rule)) + " round " +
                                 std::string(round_name(spec.round)) + " variant " + std::to_string(variant);
        const RunOut want = run(spec, shape[0], shape[1], [&](const QuantOutput& o) {
          return quantize_ref(spec, x.data(), shape[0], shape[1], o);
        });
        const RunOut got = run(spec, shape[0], shape[1], [&](const QuantOutput& o) {
          return kImpl(spec, x.data(), shape[0], shape[1], o);
        });
        expect_same(got, want, what);
        ++calls;
        seen.saturated += want.stats.saturated;
        seen.subnormal += want.stats.subnormal;
        seen.underflow += want.stats.underflow;
        seen.scale_underflow += want.stats.scale_underflow;
        seen.scale_subnormal += want.stats.scale_subnormal;
        seen.scale_saturated += want.stats.scale_saturated;
        for (float v : want.values) nan_values += std::isnan(v);
      }
    }
  }
  EXPECT_EQ(calls, static_cast<int>(std::size(kConfigs)) * 4 * 6);
  // The comparisons are not vacuous: every statistic and NaN blocks occurred.
  EXPECT_GT(seen.saturated, 0u);
  EXPECT_GT(seen.subnormal, 0u);
  EXPECT_GT(seen.underflow, 0u);
  EXPECT_GT(seen.scale_underflow, 0u);
  EXPECT_GT(seen.scale_subnormal, 0u);
  EXPECT_GT(seen.scale_saturated, 0u);
  EXPECT_GT(nan_values, 0u);
}

// The transform runs on the host; the quantization of the transformed tensor
// must still match, along rows (1x16) and columns (16x1).
// Four over six (docs/numerics.md §3): the kernel's lanes make the shared
// core's per-block choice, so the bits and scale_four are the reference's.
TEST(CudaRandom, FourOverSix) {
  EXMY_REQUIRE_CUDA();
  uint64_t seed = 7;
  uint64_t four = 0, blocks = 0;
  for (const char* scale : {"ue8m0", "e4m3", "ue5m3"}) {
    for (const char* block : {"1x16", "16x16", "16x1"}) {
      for (const FourSix m : {FourSix::mse, FourSix::mae, FourSix::always_4}) {
        for (const Round mode : {Round::rne, Round::stochastic_fastest}) {
          QuantSpec spec;
          spec.elem = parse_format("e2m1");
          spec.scale = parse_format(scale);
          parse_block(block, spec.block_rows, spec.block_cols);
          spec.four_over_six = m;
          spec.round = mode;
          spec.seed = ++seed;
          spec.amax_kind = AmaxKind::current;
          spec.arith = (seed & 1) ? Arith::fp32 : Arith::exact;
          if (std::string(scale) == "e4m3") spec.scale_target = 256.0;
          const std::vector<float> x = random_tensor(67 * 97, seed, false);
          const std::string what = std::string(scale) + " " + block + " " + std::to_string(int(m));
          const RunOut want = run(spec, 67, 97, [&](const QuantOutput& o) {
            return quantize_ref(spec, x.data(), 67, 97, o);
          });
          const RunOut got = run(spec, 67, 97, [&](const QuantOutput& o) {
            return kImpl(spec, x.data(), 67, 97, o);
          });
          expect_same(got, want, what);
          four += want.stats.scale_four;
          blocks += want.stats.blocks;
        }
      }
    }
  }
  EXPECT_GT(four, 0u);
  EXPECT_LT(four, blocks);
}

// e2m1 / e4m3 with a current amax, fp32 arithmetic and the RHT on `block`.
QuantSpec rht_spec(const char* block) {
  QuantSpec spec;
  spec.elem = parse_format("e2m1");
  spec.scale = parse_format("e4m3");
  parse_block(block, spec.block_rows, spec.block_cols);
  spec.amax_kind = AmaxKind::current;
  spec.arith = Arith::fp32;
  spec.rht = true;
  return spec;
}

TEST(CudaRandom, Hadamard) {
  EXMY_REQUIRE_CUDA();
  for (const char* block : {"1x16", "16x1"}) {
    QuantSpec spec = rht_spec(block);
    spec.round = Round::stochastic;
    const std::vector<float> x = random_tensor(64 * 48, 77, false);
    const RunOut want = run(spec, 64, 48, [&](const QuantOutput& o) { return quantize_ref(spec, x.data(), 64, 48, o); });
    const RunOut got = run(spec, 64, 48, [&](const QuantOutput& o) { return kImpl(spec, x.data(), 64, 48, o); });
    expect_same(got, want, std::string("rht ") + block);
  }
}

// The other sizes and the deterministic kind (the transform is applied on the
// host before upload, by exmy::apply_rht).
TEST(CudaRandom, HadamardSizesAndKinds) {
  EXMY_REQUIRE_CUDA();
  const std::vector<float> x = random_tensor(128 * 128, 78, false);
  for (const char* block : {"1x16", "16x1"})
    for (const int n : {32, 64, 128})
      for (const RhtKind kind : {RhtKind::random, RhtKind::deterministic}) {
        QuantSpec spec = rht_spec(block);
        spec.rht_size = n;
        spec.rht_kind = kind;
        const RunOut want =
            run(spec, 128, 128, [&](const QuantOutput& o) { return quantize_ref(spec, x.data(), 128, 128, o); });
        const RunOut got = run(spec, 128, 128, [&](const QuantOutput& o) { return kImpl(spec, x.data(), 128, 128, o); });
        expect_same(got, want, std::string("rht ") + block + " size " + std::to_string(n) +
                                   (kind == RhtKind::random ? " random" : " deterministic"));
      }
}

#if !defined(EXMY_TEST_EMULATED)
// Large enough for every grid-stride loop to wrap (more than 2^16 * 256
// threads of work), compared with the threaded CPU path (itself tested equal
// to quantize_ref).
TEST(CudaRandom, LargeTensor) {
  EXMY_REQUIRE_CUDA();
  const int64_t rows = 4096, cols = 4352;
  const std::vector<float> x = random_tensor(rows * cols, 5, true);
  for (int with_scale = 0; with_scale < 2; ++with_scale) {
    QuantSpec spec;
    spec.elem = parse_format("e4m3");
    if (with_scale) spec.scale = parse_format("ue8m0");
    spec.amax_kind = AmaxKind::current;
    spec.round = Round::stochastic_fast;
    const RunOut want = run(spec, rows, cols, [&](const QuantOutput& o) { return quantize(spec, x.data(), rows, cols, o); });
    const RunOut got = run(spec, rows, cols, [&](const QuantOutput& o) { return kImpl(spec, x.data(), rows, cols, o); });
    expect_same(got, want, with_scale ? "large, scaled" : "large, unscaled");
  }
}
#endif

// The double sums over rows of many 4096-element segments (the device makes
// one partial per segment, the host the tree) and the Inf rule: an infinite
// x-hat makes sum_sq_err and sum_err +Inf, also where +Inf and -Inf x-hat
// (or x-hat = x = Inf) would make IEEE sums NaN.
TEST(CudaRandom, SumSegmentsAndInfRule) {
  EXMY_REQUIRE_CUDA();
  for (const char* block : {"1x16", "16x16", "16x1"}) {
    QuantSpec spec;
    spec.elem = parse_format("e2m1");
    spec.scale = parse_format("ue5m3");
    parse_block(block, spec.block_rows, spec.block_cols);
    spec.amax_kind = AmaxKind::current;
    for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{3, 10000}, {1, 70000}}) {
      const std::vector<float> x = random_tensor(rows * cols, 99, false);
      const RunOut want = run(spec, rows, cols, [&](const QuantOutput& o) { return quantize_ref(spec, x.data(), rows, cols, o); });
      const RunOut got = run(spec, rows, cols, [&](const QuantOutput& o) { return kImpl(spec, x.data(), rows, cols, o); });
      expect_same(got, want, std::string("wide rows ") + block + " " + std::to_string(rows) + "x" + std::to_string(cols));
    }
  }
  QuantSpec spec;
  spec.elem = parse_format("e5m2");  // overflow gives Inf without saturation
  spec.saturate = false;
  std::vector<float> x = random_tensor(2 * 5000, 7, false);
  for (float& v : x) v = std::fmin(std::fmax(v, -1e4f), 1e4f);
  x[7] = 1e6f;
  x[6000] = -1e6f;
  x[9000] = std::numeric_limits<float>::infinity();
  const RunOut want = run(spec, 2, 5000, [&](const QuantOutput& o) { return quantize_ref(spec, x.data(), 2, 5000, o); });
  const RunOut got = run(spec, 2, 5000, [&](const QuantOutput& o) { return kImpl(spec, x.data(), 2, 5000, o); });
  expect_same(got, want, "infinite x-hat");
  EXPECT_EQ(bits_of(got.stats.sum_sq_err), bits_of(std::numeric_limits<double>::infinity()));
  EXPECT_EQ(bits_of(got.stats.sum_err), bits_of(std::numeric_limits<double>::infinity()));
}

// Null outputs are allowed, any combination.
TEST(CudaRandom, PartialOutputs) {
  EXMY_REQUIRE_CUDA();
  QuantSpec spec;
  spec.elem = parse_format("e2m1");
  spec.scale = parse_format("ue4m3");
  const std::vector<float> x = random_tensor(8 * 32, 3, false);
  QuantStats want, got;
  quantize_ref(spec, x.data(), 8, 32, QuantOutput{nullptr, nullptr, nullptr, &want});
  kImpl(spec, x.data(), 8, 32, QuantOutput{nullptr, nullptr, nullptr, &got});
  EXPECT_EQ(bits_of(got.sum_sq_err), bits_of(want.sum_sq_err));
  EXPECT_EQ(got, want);
  EXPECT_NO_THROW(kImpl(spec, x.data(), 8, 32, QuantOutput{}));
}

// The conventions of other implementations (TE's codes, scale-first
// dequantization) on the CUDA path: the reference's bytes.
TEST(CudaConventions, TeCodesAndScaleFirstMatchReference) {
  EXMY_REQUIRE_CUDA();
  QuantSpec spec;
  spec.elem = parse_format("e2m1");
  spec.scale = parse_format("e4m3");
  spec.arith = Arith::fp32;
  spec.amax_kind = AmaxKind::current;
  spec.codes = CodeConvention::te;
  spec.dequant = DequantOrder::scale_first;
  std::vector<float> x = random_tensor(16 * 64, 11, false);
  for (int i = 0; i < 16; ++i) x[static_cast<size_t>(i)] = i % 2 ? -1e-30f : -0.0f;  // a zero-scale block, -0s
  const size_t n = x.size();
  std::vector<float> v1(n), v2(n);
  std::vector<uint8_t> c1(n), c2(n), s1(n / 16), s2(n / 16);
  quantize_ref(spec, x.data(), 16, 64, QuantOutput{v1.data(), c1.data(), s1.data(), nullptr});
  kImpl(spec, x.data(), 16, 64, QuantOutput{v2.data(), c2.data(), s2.data(), nullptr});
  EXPECT_EQ(c1, c2);
  EXPECT_EQ(s1, s2);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(bits_of(v1[i]), bits_of(v2[i])) << i;
  EXPECT_EQ(c1[1], 0xF);  // -1e-30 in a zero-scale block: TE's -6
  EXPECT_EQ(c1[0], 0x0);  // -0: +0
}

// Unrepresentable elements: the same exmy::Error as the threaded CPU path
// (which names the lowest flat index).
TEST(CudaErrors, SameMessageAsCpu) {
  EXMY_REQUIRE_CUDA();
  struct ErrCase {
    const char* elem;
    const char* scale;
    const char* block;
    bool saturate;
    float bad;
  };
  const ErrCase cases[] = {
      {"e2m1", nullptr, "1x16", true, std::numeric_limits<float>::quiet_NaN()},
      {"e2m1", "ue4m3:nans=0", "4x4", true, std::numeric_limits<float>::quiet_NaN()},
      {"e2m1", nullptr, "1x16", false, 100.0f},
      {"e3m2", "ue8m0", "1x8", false, std::numeric_limits<float>::infinity()},
  };
  for (const auto& ec : cases) {
    QuantSpec spec;
    spec.elem = parse_format(ec.elem);
    if (ec.scale) spec.scale = parse_format(ec.scale);
    parse_block(ec.block, spec.block_rows, spec.block_cols);
    spec.saturate = ec.saturate;
    std::vector<float> x(12 * 20, 0.25f);
    x[5 * 20 + 13] = ec.bad;
    x[9 * 20 + 2] = ec.bad;
    std::string want, got;
    try {
      quantize(spec, x.data(), 12, 20, QuantOutput{}, 1);
    } catch (const Error& e) {
      want = e.what();
    }
    try {
      kImpl(spec, x.data(), 12, 20, QuantOutput{});
    } catch (const Error& e) {
      got = e.what();
    }
    EXPECT_FALSE(want.empty()) << ec.elem;
    EXPECT_EQ(got, want) << ec.elem;
  }
}

}  // namespace
}  // namespace exmy

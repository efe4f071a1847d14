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
// The random Hadamard transform runs on the device (the CudaQuantizer on
// device tensors, apply_rht_cuda) and in the emulation through the same
// launches; its emulation is also checked alone in test_hadamard_launch.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "formats/cuda/quantize_cuda.hpp"
#include "formats/quant_sums.hpp"
#include "formats/error.hpp"
#include "formats/pack.hpp"
#include "formats/conventions.hpp"
#include "formats/quantize.hpp"
#include "formats/spec.hpp"
#include "formats/thresholds.hpp"
#include "formats/vocab.hpp"
#include "tests/formats/rht_inputs.hpp"
#include "tests/formats/test_support.hpp"
#include "tests/formats/vectors.hpp"

#if !defined(EXMY_TEST_EMULATED)
#include <cuda_runtime.h>
#endif

namespace exmy {
namespace {

#if defined(EXMY_TEST_EMULATED)
constexpr auto kImpl = [](const QuantSpec& spec, const float* x, int64_t rows, int64_t cols, const QuantOutput& out) {
  return quantize_cuda_emulated(spec, x, rows, cols, out);
};
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
  // Row outer scales: every row's reference, max |x| and scale, and the
  // call's max |x| made from them (empty vectors otherwise).
  const QuantInfo &gi = got.info, &wi = want.info;
  ASSERT_EQ(gi.row_amax.size(), wi.row_amax.size()) << what;
  ASSERT_EQ(gi.row_abs_max.size(), wi.row_abs_max.size()) << what;
  ASSERT_EQ(gi.row_t.size(), wi.row_t.size()) << what;
  for (size_t r = 0; r < wi.row_t.size() && bad < 5; ++r) {
    if (bits_of(gi.row_amax[r]) != bits_of(wi.row_amax[r]) ||
        bits_of(gi.row_abs_max[r]) != bits_of(wi.row_abs_max[r]) || bits_of(gi.row_t[r]) != bits_of(wi.row_t[r])) {
      ADD_FAILURE() << what << " row " << r << ": amax " << gi.row_amax[r] << ", max |x| " << gi.row_abs_max[r]
                    << ", t " << hex32(bits_of(gi.row_t[r])) << "; expected " << wi.row_amax[r] << ", "
                    << wi.row_abs_max[r] << ", " << hex32(bits_of(wi.row_t[r]));
      ++bad;
    }
  }
  if (!wi.row_t.empty()) {
    ASSERT_TRUE(gi.abs_max.has_value()) << what;
    EXPECT_EQ(bits_of(*gi.abs_max), bits_of(*wi.abs_max)) << what;
  }
}

// The call on the CUDA path compared with quantize_ref's (expect_same);
// returns the reference's outputs.
RunOut expect_matches_ref(const QuantSpec& spec, const std::vector<float>& x, int64_t rows, int64_t cols,
                          const std::string& what) {
  const RunOut want =
      run(spec, rows, cols, [&](const QuantOutput& o) { return quantize_ref(spec, x.data(), rows, cols, o); });
  const RunOut got = run(spec, rows, cols, [&](const QuantOutput& o) { return kImpl(spec, x.data(), rows, cols, o); });
  expect_same(got, want, what);
  return want;
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
    {"e2m1", "ue5m3", "16x16"}, {"e2m1", "e4m3", "16x1"},     {"e2m1", "ue8m0", "32x32"},
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
        const RunOut want = expect_matches_ref(spec, x, shape[0], shape[1], what);
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

// spec with a given tensor amax, and its plan with the tensor scale set.
QuantPlan plan_with_given_amax(QuantSpec& spec, double amax) {
  spec.amax_kind = AmaxKind::given;
  spec.amax_value = amax;
  QuantPlan p = spec.plan();
  set_tensor_amax(p, amax);
  return p;
}

// The threshold path takes most blocks' scale codes from the call's
// scale-code thresholds (detail::ScaleThr) instead of block_scale(). Random
// tensors almost never put a block's amax on a threshold, so here every
// block's amax sits on, or one or two bit patterns either side of, a
// threshold of the form (in every octave of its range, and past both ends),
// against quantize_ref. On a device the kernel's ScaleThr is also compared
// with the CPU's, which a lane's slip could turn off without changing a bit.
TEST(CudaThresholdPath, ScaleCodesAtTheirThresholds) {
  EXMY_REQUIRE_CUDA();
  struct Case {
    const char* scale;
    ScaleRule rule;
    Arith arith;
    int br, bc;
    Round round;
  };
  const Case cases[] = {
      {"ue5m3", ScaleRule::amax_rne, Arith::exact, 1, 16, Round::rne},
      {"e4m3", ScaleRule::amax_rne, Arith::fp32, 1, 16, Round::rne},
      {"ue4m3", ScaleRule::amax_up, Arith::exact, 1, 16, Round::rtz},
      {"ue5m3", ScaleRule::amax_down, Arith::fp32, 1, 32, Round::odd},
      {"ue8m0", ScaleRule::mx_floor, Arith::exact, 1, 32, Round::rne},
      {"ue8m0", ScaleRule::mx_even, Arith::fp32, 1, 32, Round::rna},
      // row blocks of several rows (a lane group per block) and column blocks
      {"e4m3", ScaleRule::amax_rne, Arith::fp32, 16, 16, Round::rne},
      {"ue5m3", ScaleRule::amax_rne, Arith::exact, 32, 32, Round::odd},
      {"ue5m3", ScaleRule::amax_rne, Arith::exact, 16, 1, Round::rne},
      {"ue8m0", ScaleRule::mx_floor, Arith::fp32, 32, 1, Round::rtz},
  };
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<float> frac(0.0f, 1.0f);
  int with_thresholds = 0;
  for (const Case& c : cases) {
    QuantSpec spec;
    spec.elem = parse_format("e2m1");
    spec.scale = parse_format(c.scale);
    spec.block_rows = c.br;
    spec.block_cols = c.bc;
    spec.rule = c.rule;
    spec.arith = c.arith;
    spec.round = c.round;
    const QuantPlan p = plan_with_given_amax(spec, 4.7);
    const detail::ScaleThr thr = detail::scale_code_thresholds(p);
    const std::string what = std::string("e2m1/") + c.scale + " " + std::to_string(c.br) + "x" + std::to_string(c.bc) + " " +
                             std::string(scale_rule_name(c.rule)) + (c.arith == Arith::exact ? " exact" : " fp32");
    if (!thr.ok) continue;
    ++with_thresholds;
#if !defined(EXMY_TEST_EMULATED)
    const detail::ScaleThr dev = detail::scale_code_thresholds_cuda(p);
    EXPECT_TRUE(dev.ok) << what;
    EXPECT_EQ(dev.t0, thr.t0) << what;
    EXPECT_EQ(dev.span, thr.span) << what;
    EXPECT_EQ(dev.c_lo, thr.c_lo) << what;
    EXPECT_EQ(dev.m, thr.m) << what;
    for (int k = 0; k < 7; ++k) EXPECT_EQ(dev.d1[k], thr.d1[k]) << what << " D" << k + 1;
#endif
    // the maxima: t0 + n 2^23 + D_j (and t0 itself), -2 .. +2 bit patterns,
    // from an octave below the range to one above it
    std::vector<uint32_t> m;
    const int64_t octave = int64_t{1} << 23, lo = int64_t{thr.t0} - octave, hi = int64_t{thr.t0} + thr.span + octave;
    for (int64_t base = lo; base < hi; base += octave) {
      for (int j = -1; j < 7; ++j) {
        const int64_t d = j < 0 ? 0 : int64_t{thr.d1[j]} + 1;
        if (d > octave) continue;
        for (int64_t o = -2; o <= 2; ++o)
          if (base + d + o > 0 && base + d + o < 0x7f800000) m.push_back(static_cast<uint32_t>(base + d + o));
      }
    }
    for (int64_t o = -2; o <= 2; ++o) m.push_back(static_cast<uint32_t>(int64_t{thr.t0} + thr.span + o));
    // a block per maximum, its amax at a random place and sign, the other
    // elements below it; 8 more columns and 3 more rows than whole blocks,
    // so that the ends of the rows (row blocks) and of the tensor (blocks of
    // several rows) hold partial blocks
    const int64_t whole_cols = c.bc == 1 ? 256 : 256 / c.bc * c.bc, per_row = whole_cols / c.bc;
    const int64_t cols = whole_cols + 8;
    const int64_t rows = (static_cast<int64_t>(m.size()) + per_row - 1) / per_row * c.br + (c.br > 1 ? 3 : 0);
    std::vector<float> x(static_cast<size_t>(rows * cols));
    const int64_t nblocks = block_count(spec, rows, cols);
    for (int64_t blk = 0; blk < nblocks; ++blk) {
      const BlockGeom g = block_geom(p, rows, cols, blk);
      const float a = float_of(m[static_cast<size_t>(blk) % m.size()]);
      const int64_t at = static_cast<int64_t>(rng() % static_cast<uint64_t>(g.count));
      for (int64_t k = 0; k < g.count; ++k) {
        const float v = k == at ? a : a * frac(rng);
        x[static_cast<size_t>(g.flat(k))] = (rng() & 1) ? -v : v;
      }
    }
    expect_matches_ref(spec, x, rows, cols, what);
  }
  EXPECT_GE(with_thresholds, 7);
}

// The threshold path finds an element's magnitude code by bisection over
// the block's seven thresholds (detail::thresholds_exceeded), which equals
// the count of thresholds exceeded only where they are non-decreasing. For
// every scale code of several plans: the thresholds are non-decreasing, and
// the bisection equals the count at, and one bit pattern either side of,
// every threshold (where a wrong compare or a swapped threshold shows), at
// 0 and at the largest finite float. Then every non-decreasing array of
// seven values from {0, 1, 2, 3} (the ties of formats whose codes collapse),
// for every a in -1 .. 4.
TEST(CudaThresholdPath, BisectionCountsThresholds) {
  const auto count = [](const int32_t (&t)[7], int32_t a) {
    uint32_t q = 0;
    for (int k = 0; k < 7; ++k) q += a > t[k];
    return q;
  };
  struct Case {
    const char *elem, *scale;
    Round round;
    Arith arith;
  };
  const Case cases[] = {
      {"e2m1", "ue5m3", Round::rne, Arith::exact}, {"e2m1", "e4m3", Round::rne, Arith::fp32},
      {"e2m1", "ue8m0", Round::rtz, Arith::exact}, {"e2m1", "ue5m3", Round::odd, Arith::fp32},
      {"e2m1", "ue4m3", Round::rna, Arith::exact}, {"e1m2", "ue5m3", Round::rne, Arith::exact},
  };
  int64_t checked = 0;
  for (const Case& c : cases) {
    QuantSpec spec;
    spec.elem = parse_format(c.elem);
    spec.scale = parse_format(c.scale);
    spec.block_cols = 16;
    spec.round = c.round;
    spec.arith = c.arith;
    const QuantPlan p = plan_with_given_amax(spec, 4.7);
    for (uint32_t code = 0; code < (1u << p.fs.bits); ++code) {
      const double s = p.fs.decode(code);
      if (!(s > 0.0) || !std::isfinite(s)) continue;
      const BlockConsts bc = block_consts(p, s);
      int32_t t[7];
      for (uint32_t k = 0; k < 7; ++k) t[k] = detail::element_threshold(p, bc, k + 1);
      const std::string what = std::string(c.elem) + "/" + c.scale + " code " + std::to_string(code);
      for (int k = 1; k < 7; ++k) ASSERT_LE(t[k - 1], t[k]) << what << " threshold " << k;
      std::vector<int32_t> as = {0, 0x7f7fffff};
      for (int k = 0; k < 7; ++k)
        for (int32_t o = -1; o <= 1; ++o)
          if (int64_t{t[k]} + o >= 0 && int64_t{t[k]} + o <= 0x7f7fffff) as.push_back(t[k] + o);
      for (const int32_t a : as) {
        ASSERT_EQ(detail::thresholds_exceeded(t, a), count(t, a)) << what << " |x| bits " << a;
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 10000);
  // every non-decreasing t over {0..3}
  int arrays = 0;
  for (int mask = 0; mask < (1 << 14); ++mask) {
    int32_t t[7];
    bool sorted = true;
    for (int k = 0; k < 7; ++k) {
      t[k] = (mask >> (2 * k)) & 3;
      if (k > 0 && t[k] < t[k - 1]) sorted = false;
    }
    if (!sorted) continue;
    ++arrays;
    for (int32_t a = -1; a <= 4; ++a) ASSERT_EQ(detail::thresholds_exceeded(t, a), count(t, a)) << "mask " << mask;
  }
  EXPECT_EQ(arrays, 120);  // multisets of 7 from 4 values: C(10, 3)
}

// The FP4 step path (up, down and the stochastic modes of the calls the
// threshold path's shapes and formats cover): every such mode in both
// arithmetics, row blocks 1x16, 16x16, 1x32 and 32x32 and
// column blocks, partial blocks at the ends, several scale formats and
// random-bit widths, on tensors that mix random values with blocks of the
// element grid's points and midpoints at power-of-two scales (where exact
// arithmetic's step is unsure and hands elements to the scalar core), NaN
// and Inf blocks where the formats hold them, and exact arithmetic with a
// subnormal tensor scale. Each call must take the FP4 step path and give
// quantize_ref's bits.
TEST(CudaFp4Step, MatchesReference) {
  EXMY_REQUIRE_CUDA();
  struct Shape {
    int64_t rows, cols;
    int br, bc;
  };
  const Shape shapes[] = {{40, 96, 1, 16}, {37, 68, 16, 16}, {9, 72, 1, 32}, {70, 33, 16, 1}, {5, 1024, 1, 16},
                          {40, 96, 32, 32}};
  const Round modes[] = {Round::up, Round::down, Round::stochastic, Round::stochastic_fast,
                         Round::stochastic_fastest};
  uint64_t seed = 11;
  int calls = 0;
  for (const char* scale : {"ue5m3", "ue4m3", "ue8m0", "e4m3"}) {
    for (const Shape& sh : shapes) {
      for (const Round mode : modes) {
        for (const Arith arith : {Arith::fp32, Arith::exact}) {
          ++seed;
          QuantSpec spec;
          spec.elem = parse_format(seed % 5 == 0 ? "e1m2" : "e2m1");
          spec.scale = parse_format(scale);
          spec.block_rows = sh.br;
          spec.block_cols = sh.bc;
          spec.round = mode;
          spec.arith = arith;
          spec.sr_bits = seed % 3 == 0 ? 3 : seed % 3 == 1 ? 8 : 13;
          spec.seed = 0x9E3779B97F4A7C15ull * seed;
          spec.stream = seed;
          spec.zero_scale = seed % 4 == 0 ? ZeroScale::one : ZeroScale::zero;
          if (std::string(scale) == "ue8m0") {
            spec.rule = ScaleRule::mx_floor;  // power-of-two scales, t = 1
            spec.amax_kind = AmaxKind::none;
          } else {
            spec.amax_kind = seed % 2 ? AmaxKind::current : AmaxKind::given;
            spec.amax_value = 2.5;
          }
          const std::string what = format_name(spec.elem) + "/" + scale + " " + std::to_string(sh.br) + "x" +
                                   std::to_string(sh.bc) + " " + std::string(round_name(mode)) +
                                   (arith == Arith::exact ? " exact" : " fp32") + " h " + std::to_string(spec.sr_bits);
          EXPECT_EQ(std::string(detail::quantize_path_cuda(spec, sh.rows, sh.cols)),
                    sh.bc == 1 ? "quantize FP4 step path, column blocks" : "quantize FP4 step path")
              << what;
          const bool nan_ok = spec.scale->has_nan;
          std::vector<float> x = random_tensor(sh.rows * sh.cols, seed, nan_ok && seed % 2 == 0);
          // Rows of grid points and midpoints times powers of two (each
          // row's own), and elements a float away from them.
          const float grid[] = {0.0f, 0.25f, 0.5f, 0.75f, 1.0f, 1.25f, 1.5f, 1.75f, 2.0f, 2.5f, 3.0f, 3.5f,
                                4.0f, 5.0f, 6.0f, 7.0f};
          std::mt19937_64 rng(seed);
          for (int64_t r = 0; r < sh.rows; r += 3) {
            const float scale_of_row = std::ldexp(1.0f, static_cast<int>(rng() % 24) - 12);
            for (int64_t c = 0; c < sh.cols; ++c) {
              float v = grid[rng() % 16] * scale_of_row * ((rng() & 1) ? -1.0f : 1.0f);
              if (rng() % 4 == 0) v = float_of(bits_of(v) + ((rng() & 1) ? 1u : static_cast<uint32_t>(-1)));
              x[static_cast<size_t>(r * sh.cols + c)] = v;
            }
          }
          expect_matches_ref(spec, x, sh.rows, sh.cols, what);
          ++calls;
          if (HasFailure()) return;
        }
      }
    }
  }
  EXPECT_EQ(calls, 4 * 6 * 5 * 2);
  // Exact arithmetic where fl(t / s) is a subnormal float (a held reference
  // of 1e45 makes t subnormal; zero-scale blocks take s = 1): such blocks
  // take the scalar core, as the CPU's fp4_blocks leaves them to it.
  for (const Round mode : modes) {
    QuantSpec spec;
    spec.elem = parse_format("e2m1");
    spec.scale = parse_format("ue5m3");
    spec.block_cols = 16;
    spec.round = mode;
    spec.arith = Arith::exact;
    spec.zero_scale = ZeroScale::one;
    spec.amax_kind = AmaxKind::given;
    spec.amax_value = 1e45;
    spec.seed = 5;
    std::vector<float> x = random_tensor(24 * 64, 77, false);
    for (float& v : x) v = std::fmin(std::fmax(v * 1e36f, -3e38f), 3e38f);
    ASSERT_EQ(std::string(detail::quantize_path_cuda(spec, 24, 64)), "quantize FP4 step path");
    expect_matches_ref(spec, x, 24, 64, std::string("subnormal t, ") + std::string(round_name(mode)));
  }
}

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

// Rows as row outer scales (docs/numerics.md §3, "Row outer scales") meet
// them: each row's magnitudes 2^-20..2^20 from the next's, with zeros, -0
// and subnormal inputs; row 1 tiny (subnormal inputs), row 3 all zero, row 5
// one huge element every 7 columns (its neighbours underflow), and with
// `specials` a NaN in row 6 and an infinity in rows 7 and 8.
std::vector<float> row_tensor(int64_t rows, int64_t cols, uint64_t seed, bool specials) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    const float row_scale = std::ldexp(1.0f, static_cast<int>(rng() % 41) - 20);
    for (int64_t c = 0; c < cols; ++c) {
      float& v = x[static_cast<size_t>(r * cols + c)];
      const int k = static_cast<int>(rng() % 100);
      v = k < 4 ? ((k & 1) ? 0.0f : -0.0f) : normal(rng) * row_scale;
      if (r == 1) v = float_of(static_cast<uint32_t>(rng() & 0x803fffffu));
      if (r == 3) v = 0.0f;
      if (r == 5 && c % 7 == 0) v *= 1e6f;
    }
  }
  if (specials && rows > 8 && cols > 5) {
    x[static_cast<size_t>(6 * cols + 2)] = std::numeric_limits<float>::quiet_NaN();
    x[static_cast<size_t>(7 * cols + 5)] = std::numeric_limits<float>::infinity();
    x[static_cast<size_t>(8 * cols)] = -std::numeric_limits<float>::infinity();
  }
  return x;
}

// Given row references for row_tensor: per row its own max |x| times 1,
// 1e-3 (the row saturates), 1e3, or NaN, 0 or +Inf (no scale for the row).
std::vector<double> row_references(const std::vector<float>& x, int64_t rows, int64_t cols) {
  std::vector<double> ref(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    float m = 0.0f;
    for (int64_t c = 0; c < cols; ++c) m = std::fmax(m, std::fabs(x[static_cast<size_t>(r * cols + c)]));
    const double f[] = {1.0, 1e-3, 1e3, std::nan(""), 0.0, std::numeric_limits<double>::infinity()};
    ref[static_cast<size_t>(r)] = r % 6 >= 3 ? f[r % 6] : static_cast<double>(m) * f[r % 6];
  }
  return ref;
}

// Row outer scales: the kernels take each row's plan (its reference, the
// row's max |x| or a given value, or none), so the bits, the statistics
// and every row's reference, max |x| and scale are the reference's; over
// formats, 1xB block widths (partial blocks, no block scale), scale rules
// (dithered scales too), rounding modes, arithmetics and zero-row rules.
TEST(CudaRowScales, MatchReference) {
  EXMY_REQUIRE_CUDA();
  struct RowConfig {
    const char *elem, *scale, *block;
    ScaleRule rule;
  };
  const RowConfig configs[] = {
      {"e2m1", "ue4m3", "1x16", ScaleRule::amax_rne},  {"e2m1", "e4m3", "1x16", ScaleRule::amax_rne},
      {"e2m1", "ue5m3", "1x32", ScaleRule::amax_up},   {"e2m1", "ue8m0", "1x32", ScaleRule::mx_floor},
      {"e4m3", "ue8m0", "1x32", ScaleRule::mx_even},   {"e3m2", "ue4m3", "1x7", ScaleRule::amax_down},
      {"e2m3", "ue8m0", "1x1", ScaleRule::mx_ceil},    {"e2m1", "ue5m3", "1x16", ScaleRule::amax_sr},
      {"e3m4:nosub", "ue8m0", "1x4", ScaleRule::amax_rne}, {"bf16", "ue8m0", "1x64", ScaleRule::amax_rne},
      {"e4m3", nullptr, "1x16", ScaleRule::amax_rne},  {"e2m1", nullptr, "1x16", ScaleRule::amax_rne},
      {"e5m20", nullptr, "1x16", ScaleRule::amax_rne},
  };
  const int64_t shapes[][2] = {{9, 70}, {17, 48}, {1, 300}, {64, 64}};
  const Round modes[] = {Round::rne, Round::stochastic, Round::rtz, Round::stochastic_fast, Round::odd,
                         Round::stochastic_fastest};
  const AmaxKind kinds[] = {AmaxKind::current, AmaxKind::given, AmaxKind::none};
  uint64_t seed = 300;
  int calls = 0;
  QuantStats seen;
  size_t nan_rows = 0, unscaled_rows = 0, rows_seen = 0, calls_with_distinct_t = 0, scaled_calls = 0;
  for (const RowConfig& cfg : configs)
    for (const auto& shape : shapes)
      for (const AmaxKind kind : kinds) {
        ++seed;
        const int64_t rows = shape[0], cols = shape[1];
        QuantSpec spec;
        spec.elem = parse_format(cfg.elem);
        if (cfg.scale) spec.scale = parse_format(cfg.scale);
        parse_block(cfg.block, spec.block_rows, spec.block_cols);
        spec.outer = OuterScale::row;
        spec.rule = cfg.rule;
        spec.round = modes[seed % 6];
        spec.sr_bits = std::string(cfg.elem) == "e5m20" ? 32 : static_cast<int>(1 + (seed * 11) % 16);
        spec.seed = 0x9E3779B97F4A7C15ull * seed;
        spec.stream = seed * 1000003u;
        spec.arith = (seed & 1) ? Arith::fp32 : Arith::exact;
        spec.zero_scale = (seed % 3 == 2) ? ZeroScale::one : ZeroScale::zero;
        if (spec.scale && seed % 4 == 1) spec.scale_target = 448.0;
        const bool nan_ok = spec.elem.has_nan || (spec.scale && spec.scale->has_nan);
        const std::vector<float> x = row_tensor(rows, cols, seed, nan_ok);
        spec.amax_kind = kind;
        if (kind == AmaxKind::given) spec.row_amax = row_references(x, rows, cols);
        const std::string what = std::string(cfg.elem) + "/" + (cfg.scale ? cfg.scale : "none") + " " + cfg.block +
                                 " " + std::to_string(rows) + "x" + std::to_string(cols) + " rule " +
                                 std::string(scale_rule_name(spec.rule)) + " round " +
                                 std::string(round_name(spec.round)) + " amax " +
                                 std::string(tensor_amax_options().name(kind));
        const RunOut want = expect_matches_ref(spec, x, rows, cols, what);
        ++calls;
        seen.saturated += want.stats.saturated;
        seen.underflow += want.stats.underflow;
        seen.scale_saturated += want.stats.scale_saturated;
        seen.scale_underflow += want.stats.scale_underflow;
        ASSERT_EQ(want.info.row_t.size(), static_cast<size_t>(rows)) << what;
        for (int64_t r = 0; r < rows; ++r) {
          nan_rows += std::isnan(want.info.row_abs_max[static_cast<size_t>(r)]);
          unscaled_rows += want.info.row_t[static_cast<size_t>(r)] == 1.0f;
        }
        rows_seen += static_cast<size_t>(rows);
        const auto [lo, hi] = std::minmax_element(want.info.row_t.begin(), want.info.row_t.end());
        calls_with_distinct_t += *lo != *hi;
        scaled_calls += rows > 1 && kind != AmaxKind::none;
      }
  EXPECT_EQ(calls, static_cast<int>(std::size(configs) * std::size(shapes) * std::size(kinds)));
  // Not vacuous: rows saturated and underflowed, rows held a NaN, rows had
  // no scale (none, NaN, 0 or Inf references) and most had one, and every
  // call of several rows with references gave its rows different scales.
  EXPECT_GT(seen.saturated, 0u);
  EXPECT_GT(seen.underflow, 0u);
  EXPECT_GT(seen.scale_saturated, 0u);
  EXPECT_GT(seen.scale_underflow, 0u);
  EXPECT_GT(nan_rows, 0u);
  EXPECT_GT(unscaled_rows, 0u);
  EXPECT_LT(unscaled_rows, rows_seen * 2 / 3);
  EXPECT_EQ(calls_with_distinct_t, scaled_calls);
  EXPECT_GT(scaled_calls, 0u);
}

// Row outer scales with four over six (each row's plan makes its blocks'
// choice) and with the RHT (the rows' amax measured on the rotated tensor),
// as nvfp4-row-scaled's wgrad operands take it.
TEST(CudaRowScales, FourOverSixAndHadamard) {
  EXMY_REQUIRE_CUDA();
  uint64_t seed = 500;
  uint64_t four = 0;
  for (const FourSix m : {FourSix::mse, FourSix::mae, FourSix::always_4})
    for (const Round mode : {Round::rne, Round::stochastic_fastest}) {
      QuantSpec spec;
      spec.elem = parse_format("e2m1");
      spec.scale = parse_format("e4m3");
      spec.outer = OuterScale::row;
      spec.amax_kind = AmaxKind::current;
      spec.four_over_six = m;
      spec.round = mode;
      spec.seed = ++seed;
      spec.arith = (seed & 1) ? Arith::fp32 : Arith::exact;
      const std::vector<float> x = row_tensor(19, 80, seed, true);
      const std::string what = "four over six " + std::to_string(int(m)) + " " + std::string(round_name(mode));
      const RunOut want = expect_matches_ref(spec, x, 19, 80, what);
      four += want.stats.scale_four;
    }
  EXPECT_GT(four, 0u);
  for (const Round mode : {Round::rne, Round::stochastic_fastest}) {
    QuantSpec spec = rht_spec("1x16");
    spec.outer = OuterScale::row;
    spec.round = mode;
    spec.seed = ++seed;
    const std::vector<float> x = row_tensor(12, 64, seed, false);
    expect_matches_ref(spec, x, 12, 64, std::string("rht, row outer scales, ") + std::string(round_name(mode)));
  }
}

// The transform (on the device, or its launches on the host) and the
// quantization of the transformed tensor, along rows (1x16) and columns
// (16x1).
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

// The other sizes and the deterministic kind.
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
  for (const OuterScale outer : {OuterScale::tensor, OuterScale::row}) {  // (scale-first x-hat takes each row's t)
    QuantSpec spec;
    spec.elem = parse_format("e2m1");
    spec.scale = parse_format("e4m3");
    spec.arith = Arith::fp32;
    spec.amax_kind = AmaxKind::current;
    spec.codes = CodeConvention::te;
    spec.dequant = DequantOrder::scale_first;
    spec.outer = outer;
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
    const std::string want = test::error_message([&] { quantize(spec, x.data(), 12, 20, QuantOutput{}, 1); });
    const std::string got = test::error_message([&] { kImpl(spec, x.data(), 12, 20, QuantOutput{}); });
    EXPECT_FALSE(want.empty()) << ec.elem;
    EXPECT_EQ(got, want) << ec.elem;
  }
}

// Row outer scales: the first unrepresentable element under its own row's
// scale, with the CPU's message. Row 7's reference 0.5 makes its 1.0
// overflow e2m1 (1.0 * 6 / 0.5 > 6) while row 2's 5.0 fits under row 2's
// reference 8 (it would overflow under row 0's); a NaN without a NaN code
// in row 4 fails whatever the scales.
TEST(CudaRowScales, ErrorsNameTheSameElement) {
  EXMY_REQUIRE_CUDA();
  for (const bool nan : {false, true}) {
    QuantSpec spec;
    spec.elem = parse_format("e2m1");
    if (nan) spec.scale = parse_format("ue4m3:nans=0");
    spec.outer = OuterScale::row;
    spec.amax_kind = AmaxKind::given;
    spec.saturate = false;
    spec.row_amax.assign(12, 1.0);
    spec.row_amax[2] = 8.0;
    spec.row_amax[7] = 0.5;
    std::vector<float> x(12 * 20, 0.25f);
    x[2 * 20 + 3] = 5.0f;
    x[7 * 20 + 11] = 1.0f;
    if (nan) x[4 * 20 + 6] = std::numeric_limits<float>::quiet_NaN();
    const std::string want = test::error_message([&] { quantize(spec, x.data(), 12, 20, QuantOutput{}, 1); });
    const std::string got = test::error_message([&] { kImpl(spec, x.data(), 12, 20, QuantOutput{}); });
    EXPECT_NE(want.find(nan ? "element (4, 6)" : "element (7, 11)"), std::string::npos) << want;
    EXPECT_EQ(got, want);
  }
  // Too few given references: the CPU's message, before any work.
  QuantSpec spec;
  spec.elem = parse_format("e2m1");
  spec.scale = parse_format("ue4m3");
  spec.outer = OuterScale::row;
  spec.amax_kind = AmaxKind::given;
  spec.row_amax.assign(3, 1.0);
  const std::vector<float> x(4 * 16, 1.0f);
  const std::string want = test::error_message([&] { quantize(spec, x.data(), 4, 16, QuantOutput{}); });
  const std::string got = test::error_message([&] { kImpl(spec, x.data(), 4, 16, QuantOutput{}); });
  EXPECT_NE(want.find("3 row references for a tensor of 4 rows"), std::string::npos) << want;
  EXPECT_EQ(got, want);
}


// ---------------------------------------------------------------------------
// The random Hadamard transform on device tensors
// ---------------------------------------------------------------------------

#if !defined(EXMY_TEST_EMULATED)
// A device copy of a host vector, freed on scope exit.
template <class T>
struct DeviceArray {
  T* ptr = nullptr;
  size_t n = 0;
  explicit DeviceArray(const std::vector<T>& host) : n(host.size()) {
    EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&ptr), std::max<size_t>(n, 1) * sizeof(T)), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(ptr, host.data(), n * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~DeviceArray() { cudaFree(ptr); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  std::vector<T> get() const {
    std::vector<T> host(n);
    EXPECT_EQ(cudaMemcpy(host.data(), ptr, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return host;
  }
};
#endif

// One quantization of device tensors: a CudaQuantizer's run on device copies
// of x and of every output (the device build; `q` keeps its scratch from
// call to call), or quantize_cuda_emulated on the host (the emulation).
// x_kept: whether the input tensor still holds x afterwards.
#if !defined(EXMY_TEST_EMULATED)
RunOut run_device_tensors(CudaQuantizer& q, const QuantSpec& spec, const std::vector<float>& x, int64_t rows,
                          int64_t cols, bool& x_kept) {
  RunOut r = run(spec, rows, cols, [](const QuantOutput&) { return QuantInfo{}; });  // the host buffers
  DeviceArray<float> dx(x), dv(r.values);
  DeviceArray<uint8_t> dc(r.codes), ds(r.scales);
  r.info = q.run(spec, dx.ptr, rows, cols, QuantOutput{dv.ptr, dc.ptr, ds.ptr, &r.stats});
  r.values = dv.get();
  r.codes = dc.get();
  r.scales = ds.get();
  const std::vector<float> after = dx.get();
  x_kept = after.size() == x.size() && std::memcmp(after.data(), x.data(), sizeof(float) * x.size()) == 0;
  return r;
}
#else
struct CudaQuantizerStandIn {};  // the emulation keeps no device scratch
using CudaQuantizer = CudaQuantizerStandIn;
RunOut run_device_tensors(CudaQuantizer&, const QuantSpec& spec, const std::vector<float>& x, int64_t rows,
                          int64_t cols, bool& x_kept) {
  const std::vector<float> copy = x;
  RunOut r = run(spec, rows, cols,
                 [&](const QuantOutput& o) { return quantize_cuda_emulated(spec, copy.data(), rows, cols, o); });
  x_kept = std::memcmp(copy.data(), x.data(), sizeof(float) * x.size()) == 0;
  return r;
}
#endif

// Without values and statistics (QuantizedLinear asks for codes alone when
// its GEMM reads the encoded operands) the quantizer writes no values and
// gives the same codes, scale codes and tensor decisions as with them, on
// every path: the threshold path's row blocks (1x16, 16x16) and column
// blocks (16x1), the general block kernel (UE8M0 1x32, four over six), no
// block scale, row outer scales, stochastic rounding.
TEST(CudaRandom, CodesWithoutValues) {
  EXMY_REQUIRE_CUDA();
  struct Case {
    const char *elem, *scale;
    int br, bc;
    const char* what;
  };
  const int64_t rows = 48, cols = 64;
  const std::vector<float> x = random_tensor(rows * cols, 9, false);
  for (const Case c : {Case{"e2m1", "ue4m3", 1, 16, ""}, Case{"e2m1", "ue5m3", 16, 16, ""},
                       Case{"e2m1", "ue4m3", 16, 1, ""}, Case{"e2m1", "ue8m0", 1, 32, "mx"},
                       Case{"e2m1", "ue4m3", 1, 16, "4over6"}, Case{"e4m3", "", 1, 1, ""},
                       Case{"e2m1", "ue4m3", 1, 16, "rows"}, Case{"e2m1", "ue4m3", 1, 16, "sr"}}) {
    SCOPED_TRACE(std::string(c.elem) + "/" + c.scale + " " + std::to_string(c.br) + "x" + std::to_string(c.bc) + " " +
                 c.what);
    QuantSpec spec;
    spec.elem = parse_format(c.elem);
    if (*c.scale) spec.scale = parse_format(c.scale), spec.block_rows = c.br, spec.block_cols = c.bc;
    spec.amax_kind = AmaxKind::current;
    const std::string what = c.what;
    if (what == "mx") spec.rule = ScaleRule::mx_floor, spec.amax_kind = AmaxKind::none;
    if (what == "4over6") spec.four_over_six = FourSix::mse;
    if (what == "rows") spec.outer = OuterScale::row;
    if (what == "sr") spec.round = Round::stochastic_fast, spec.sr_bits = 8, spec.seed = 3;
    const RunOut want =
        run(spec, rows, cols, [&](const QuantOutput& o) { return quantize_ref(spec, x.data(), rows, cols, o); });
    std::vector<uint8_t> codes(want.codes.size(), 0xAB), scales(want.scales.size(), 0xAB);
    QuantInfo info;
#if defined(EXMY_TEST_EMULATED)
    info = quantize_cuda_emulated(spec, x.data(), rows, cols, QuantOutput{nullptr, codes.data(), scales.data(), nullptr});
#else
    {
      CudaQuantizer q;
      DeviceArray<float> dx(x);
      DeviceArray<uint8_t> dc(codes), ds(scales);
      info = q.run(spec, dx.ptr, rows, cols, QuantOutput{nullptr, dc.ptr, ds.ptr, nullptr});
      codes = dc.get();
      scales = ds.get();
    }
#endif
    EXPECT_EQ(codes, want.codes);
    EXPECT_EQ(scales, want.scales);
    EXPECT_EQ(bits_of(info.t), bits_of(want.info.t));
    EXPECT_EQ(info.row_t, want.info.row_t);
  }
}

// A call's statistics left where its kernels ran (QuantRecord: a training
// step's statistics, collected once at its end): the counts, the four sums
// (the segment partials combined by the tree's levels, formats/
// tree_launches.hpp), the reference amax and the tensor scale equal
// quantize()'s bit for bit, on the paths (threshold rows and columns, FP4
// step, general kernel, no scale), with current, given and no references,
// the RHT, stochastic rounding, Inf and NaN sums, rows of more than one
// segment and more partials than two tree levels take. On a device the
// call does not wait (need_info false), and its info's amax and t are NaN
// for a current reference while the record holds them.
TEST(CudaRecord, StatisticsLeftWhereTheKernelsRanEqualQuantizes) {
  EXMY_REQUIRE_CUDA();
  struct Case {
    const char *elem, *scale;
    int br, bc;
    int64_t rows, cols;
    const char* what;
  };
  for (const Case c : {Case{"e2m1", "ue4m3", 1, 16, 48, 64, ""}, Case{"e2m1", "ue5m3", 16, 16, 64, 64, "given"},
                       Case{"e2m1", "ue4m3", 16, 1, 32, 48, "none"}, Case{"e2m1", "ue8m0", 1, 32, 40, 96, "mx"},
                       Case{"e4m3", "", 1, 1, 9, 33, ""}, Case{"e2m1", "ue4m3", 1, 16, 16, 64, "sr"},
                       Case{"e2m1", "ue4m3", 1, 16, 16, 64, "rht"}, Case{"e2m1", "ue4m3", 1, 16, 3, 9000, "wide"},
                       Case{"e2m1", "ue4m3", 1, 16, 1100, 16, "many"}, Case{"e5m2", "", 1, 1, 2, 5000, "inf"},
                       Case{"e2m1", "ue4m3", 1, 16, 8, 64, "nan"}}) {
    const std::string what = std::string(c.elem) + "/" + c.scale + " " + std::to_string(c.rows) + "x" +
                             std::to_string(c.cols) + " " + c.what;
    SCOPED_TRACE(what);
    QuantSpec spec;
    spec.elem = parse_format(c.elem);
    if (*c.scale) spec.scale = parse_format(c.scale), spec.block_rows = c.br, spec.block_cols = c.bc;
    spec.amax_kind = AmaxKind::current;
    const std::string w = c.what;
    std::vector<float> x = random_tensor(c.rows * c.cols, static_cast<uint64_t>(c.rows + c.cols), false);
    if (w == "given") spec.amax_kind = AmaxKind::given, spec.amax_value = 2.5;
    if (w == "none") spec.amax_kind = AmaxKind::none;
    if (w == "mx") spec.rule = ScaleRule::mx_floor, spec.amax_kind = AmaxKind::none;
    if (w == "sr") spec.round = Round::stochastic_fast, spec.sr_bits = 8, spec.seed = 3, spec.stream = 11;
    if (w == "rht") spec.rht = true, spec.rht_size = 16, spec.seed = 5;
    if (w == "inf") {  // overflow gives an infinite x-hat without saturation
      spec.amax_kind = AmaxKind::none;
      spec.saturate = false;
      for (float& v : x) v = std::fmin(std::fmax(v, -1e4f), 1e4f);
      x[7] = 1e6f;
      x[6000] = -std::numeric_limits<float>::infinity();
    }
    if (w == "nan") spec.amax_kind = AmaxKind::given, spec.amax_value = std::nan("");
    const RunOut want =
        run(spec, c.rows, c.cols, [&](const QuantOutput& o) { return quantize(spec, x.data(), c.rows, c.cols, o, 1); });
    QuantRecord rec;
    rec.amax = -1;
    QuantInfo info;
    std::vector<uint8_t> codes(want.codes.size(), 0xAB);
#if defined(EXMY_TEST_EMULATED)
    info = quantize_cuda_emulated(spec, x.data(), c.rows, c.cols, QuantOutput{nullptr, codes.data(), nullptr, nullptr},
                                  &rec);
#else
    {
      CudaQuantizer q;
      DeviceArray<float> dx(x);
      DeviceArray<uint8_t> dc(codes);
      DeviceArray<QuantRecord> dr(std::vector<QuantRecord>(1));
      info = q.run(spec, dx.ptr, c.rows, c.cols, QuantOutput{nullptr, dc.ptr, nullptr, nullptr}, /*wait=*/false,
                   /*need_info=*/false, nullptr, dr.ptr);
      q.check();
      rec = dr.get()[0];
      codes = dc.get();
      if (spec.amax_kind == AmaxKind::current) {
        EXPECT_TRUE(std::isnan(info.amax));  // (the call did not wait)
      }
    }
#endif
    EXPECT_EQ(codes, want.codes);
    RunOut got = want;
    got.stats = rec.stats;
    expect_same(got, want, what);
    EXPECT_EQ(rec.stats, want.stats);
    EXPECT_EQ(bits_of(rec.t), bits_of(want.info.t));
    EXPECT_EQ(std::isnan(rec.amax), std::isnan(want.info.amax));
    if (!std::isnan(want.info.amax)) {
      EXPECT_EQ(rec.amax, want.info.amax);
    }
    if (w == "inf") {
      EXPECT_TRUE(std::isinf(want.stats.sum_sq_err));  // the inputs reach what they test
    }
    if (w == "wide" || w == "many") {
      EXPECT_GT(sum_segments(c.rows, c.cols), w == "many" ? 1024 : 2);
    }
  }
}

#if !defined(EXMY_TEST_EMULATED)
// Calls that do not wait (CudaQuantizer::run with wait = false, as the
// training ops call it): the same codes, values and, where the host knows
// the reference (given, none), the same info as a call that waits; a
// current reference with need_info = false reports NaN amax and t. An
// unrepresentable element is reported by check() (or by the next call that
// waits), with the CPU's message, and only once; calls with statistics or
// row scales wait.
TEST(CudaDeferred, SameResultsAndErrorsAtTheCheck) {
  EXMY_REQUIRE_CUDA();
  const int64_t rows = 12, cols = 32;
  const std::vector<float> x = random_tensor(rows * cols, 4, false);
  CudaQuantizer q;
  for (const AmaxKind kind : {AmaxKind::given, AmaxKind::none, AmaxKind::current}) {
    SCOPED_TRACE(static_cast<int>(kind));
    QuantSpec spec;
    spec.elem = parse_format("e2m1");
    spec.scale = parse_format("ue4m3");
    spec.block_cols = 16;
    spec.amax_kind = kind;
    spec.amax_value = 3.5;
    bool kept = false;
    const RunOut want = run_device_tensors(q, spec, x, rows, cols, kept);
    DeviceArray<float> dx(x), dv(want.values);
    DeviceArray<uint8_t> dc(want.codes), ds(want.scales);
    const QuantInfo info = q.run(spec, dx.ptr, rows, cols, QuantOutput{dv.ptr, dc.ptr, ds.ptr, nullptr},
                                 /*wait=*/false, /*need_info=*/false);
    q.check();
    EXPECT_EQ(dv.get(), want.values);
    EXPECT_EQ(dc.get(), want.codes);
    EXPECT_EQ(ds.get(), want.scales);
    if (kind == AmaxKind::current) {
      EXPECT_TRUE(std::isnan(info.amax));
      EXPECT_TRUE(std::isnan(info.t));
    } else {
      EXPECT_EQ(bits_of(info.t), bits_of(want.info.t));
      EXPECT_EQ(std::isnan(info.amax), std::isnan(want.info.amax));
      if (!std::isnan(info.amax)) {
        EXPECT_EQ(info.amax, want.info.amax);
      }
      EXPECT_EQ(info.block_grid_cols, want.info.block_grid_cols);
    }
  }
  // A NaN that e2m1 cannot hold: no error until the check, then quantize's.
  QuantSpec spec;
  spec.elem = parse_format("e2m1");
  spec.amax_kind = AmaxKind::given;
  spec.amax_value = 2.0;
  std::vector<float> bad(x);
  bad[5 * cols + 13] = std::numeric_limits<float>::quiet_NaN();
  const std::string want = test::error_message([&] { quantize(spec, bad.data(), rows, cols, QuantOutput{}, 1); });
  ASSERT_FALSE(want.empty());
  DeviceArray<float> dgood(x), dbad(bad);
  DeviceArray<float> dv(std::vector<float>(x.size()));
  EXPECT_NO_THROW(q.run(spec, dgood.ptr, rows, cols, QuantOutput{dv.ptr, nullptr, nullptr, nullptr}, false, false));
  EXPECT_NO_THROW(q.run(spec, dbad.ptr, rows, cols, QuantOutput{dv.ptr, nullptr, nullptr, nullptr}, false, false));
  EXPECT_EQ(test::error_message([&] { q.check(); }), want);
  EXPECT_NO_THROW(q.check());  // reported once
  // ... or at the next call that waits, before its own work
  EXPECT_NO_THROW(q.run(spec, dbad.ptr, rows, cols, QuantOutput{dv.ptr, nullptr, nullptr, nullptr}, false, false));
  EXPECT_EQ(test::error_message([&] { q.run(spec, dgood.ptr, rows, cols, QuantOutput{dv.ptr, nullptr, nullptr, nullptr}); }),
            want);
  // with statistics a call waits: its own error at once
  QuantStats st;
  EXPECT_EQ(test::error_message(
                [&] { q.run(spec, dbad.ptr, rows, cols, QuantOutput{dv.ptr, nullptr, nullptr, &st}, false, false); }),
            want);
}
#endif

// The specs of the recipes' transformed operands (experiments/recipes):
// te-nvfp4's wgrad-dy and wgrad-x (the 16-point transform, TE's signs),
// nvfp4-h32-wgrad's wgrad-dy (32 points) and its deterministic variant,
// along columns 16x1 blocks with 64 and 128 points, and nvfp4-row-scaled's
// wgrad-dy and fprop-x (row outer scales). A CudaQuantizer on
// device tensors gives quantize()'s (and quantize_ref's) bits, statistics
// and tensor decisions (of the rotated tensor, which all of them quantize),
// and leaves x as it was.
TEST(CudaRht, RecipeSpecsOnDeviceTensorsMatchQuantize) {
  EXMY_REQUIRE_CUDA();
  const Knobs nvfp4 = {{"elem", "e2m1"},         {"scale", "ue4m3"},   {"block", "1x16"},
                       {"scale_rule", "amax-rne"}, {"arith", "fp32"},   {"round", "rne"},
                       {"sr_bits", "8"},           {"zero_scale", "zero"}, {"saturate", "true"},
                       {"tensor_amax", "auto"},    {"rht", "true"}};
  struct Case {
    const char* name;
    Knobs knobs;
  };
  const Case cases[] = {
      {"te-nvfp4 wgrad-dy", {{"round", "stochastic-fastest"}}},
      {"te-nvfp4 wgrad-x", {}},
      {"nvfp4-h32-wgrad wgrad-dy", {{"round", "stochastic-fastest"}, {"rht_size", "32"}}},
      {"nvfp4-h32-wgrad wgrad-dy, deterministic", {{"round", "stochastic-fastest"}, {"rht_size", "32"},
                                                   {"rht_kind", "deterministic"}}},
      {"16x1, 64 points", {{"block", "16x1"}, {"rht_size", "64"}}},
      {"16x1, 128 points, ue8m0", {{"block", "16x1"}, {"rht_size", "128"}, {"scale", "ue8m0"}}},
      {"nvfp4-row-scaled wgrad-dy", {{"round", "stochastic-fastest"}, {"outer_scale", "row"}}},
      {"nvfp4-row-scaled fprop-x", {{"rht", "false"}, {"outer_scale", "row"}}},
  };
  CudaQuantizer q;  // one quantizer for every call: its scratch grows, never shrinks
  uint64_t seed = 40;
  int compared = 0;
  for (const Case& c : cases) {
    Knobs knobs = nvfp4;
    knobs.insert(knobs.end(), c.knobs.begin(), c.knobs.end());
    QuantSpec spec = spec_from_knobs(knobs);
    const bool rows_axis = spec.block_rows == 1;
    // A small call, a larger one (the scratch grows), the small one again.
    const int64_t along[] = {2 * spec.rht_size, 4 * spec.rht_size, 2 * spec.rht_size};
    const int64_t across[] = {3, 67, 5};
    for (int k = 0; k < 3; ++k) {
      const int64_t rows = rows_axis ? across[k] : along[k], cols = rows_axis ? along[k] : across[k];
      spec.seed = ++seed;
      spec.stream = seed * 7919;
      const std::vector<float> x = random_tensor(rows * cols, seed, k == 1);
      const RunOut want =
          run(spec, rows, cols, [&](const QuantOutput& o) { return quantize(spec, x.data(), rows, cols, o); });
      // quantize_ref transforms with apply_rht_ref, not the shared per-segment
      // code: a fault there shows against it.
      const RunOut want_ref =
          run(spec, rows, cols, [&](const QuantOutput& o) { return quantize_ref(spec, x.data(), rows, cols, o); });
      bool kept = false;
      const RunOut got = run_device_tensors(q, spec, x, rows, cols, kept);
      const std::string what = std::string(c.name) + " " + std::to_string(rows) + "x" + std::to_string(cols);
      expect_same(got, want, what + " (quantize)");
      expect_same(got, want_ref, what + " (quantize_ref)");
      EXPECT_TRUE(kept) << what << ": the input tensor was modified";
      ++compared;
    }
  }
  EXPECT_EQ(compared, 24);
}

#if !defined(EXMY_TEST_EMULATED)
// apply_rht_cuda against the CPU's apply_rht, bit for bit: every size and
// kind, both axes, segments reaching every path (rht_inputs.hpp).
TEST(CudaRht, ApplyRhtCudaMatchesCpu) {
  EXMY_REQUIRE_CUDA();
  uint64_t seed = 900;
  int64_t compared = 0;
  for (const int n : {16, 32, 64, 128})
    for (const RhtKind kind : {RhtKind::random, RhtKind::deterministic})
      for (const int axis : {1, 0}) {
        ++seed;
        QuantSpec spec;
        spec.elem = parse_format("e2m1");
        spec.scale = parse_format("ue4m3");
        spec.block_rows = axis == 1 ? 1 : 16;
        spec.block_cols = axis == 1 ? 16 : 1;
        spec.rht = true;
        spec.rht_size = n;
        spec.rht_kind = kind;
        spec.rht_signs = static_cast<uint16_t>(seed * 40503u);
        const int64_t rows = axis == 1 ? 37 : 3 * n, cols = axis == 1 ? 5 * n : 37;
        const std::vector<float> x = test::rht_input(rows, cols, n, axis, seed);
        std::vector<float> want = x;
        apply_rht(spec, want.data(), rows, cols);
        DeviceArray<float> dx(x);
        apply_rht_cuda(spec, dx.ptr, rows, cols);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        const std::vector<float> got = dx.get();
        for (size_t i = 0; i < x.size(); ++i)
          ASSERT_EQ(bits_of(got[i]), bits_of(want[i]))
              << "n " << n << (kind == RhtKind::random ? " random" : " deterministic") << " axis " << axis
              << " element " << i << ": device " << hex32(bits_of(got[i])) << ", apply_rht "
              << hex32(bits_of(want[i])) << " (input " << hex32(bits_of(x[i])) << ")";
        compared += static_cast<int64_t>(x.size());
      }
  EXPECT_GT(compared, 100000);
  // A bad shape is apply_rht's error, before any launch.
  QuantSpec spec;
  spec.elem = parse_format("e2m1");
  spec.rht_size = 64;
  EXPECT_THROW(apply_rht_cuda(spec, nullptr, 2, 48), Error);
}
#endif

}  // namespace
}  // namespace exmy

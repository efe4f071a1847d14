// The four double sums of a quantization call (docs/numerics.md §5):
// segments of 4096 elements per row, each added in column order, the
// partials combined by the fixed pairwise tree, +Inf for sum_sq_err and
// sum_err where any x-hat is infinite.
//
// The expected sums come from a small implementation of the definition
// written here (a recursive tree over per-segment loops), fed the x and the
// x-hat of the call; the checks also show that the order matters for the
// data used (a plain sequential sum or the old block order gives other
// bits), so they could not pass with another order.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "formats/quant_sums.hpp"
#include "formats/tree_launches.hpp"
#include "formats/quantize.hpp"
#include "formats/fast/loops.hpp"
#include "formats/spec.hpp"
#include "test_support.hpp"

namespace exmy {
namespace {

using test::hex;

// --- the definition, written independently of formats/quant_sums.hpp --------

struct Four {
  double v[4] = {0, 0, 0, 0};  // sq, sq_err, err, abs
};

Four plus(const Four& a, const Four& b) {
  Four s;
  for (int k = 0; k < 4; ++k) s.v[k] = a.v[k] + b.v[k];
  return s;
}

// S(p[lo..hi)) = p[lo] for one element, else S(first h) + S(rest) with h the
// largest power of two below hi - lo.
Four tree(const std::vector<Four>& p, size_t lo, size_t hi) {
  const size_t n = hi - lo;
  if (n == 1) return p[lo];
  size_t h = 1;
  while (2 * h < n) h *= 2;
  return plus(tree(p, lo, lo + h), tree(p, lo + h, hi));
}

Four term(float x, float xh) {
  const double xd = x, e = static_cast<double>(xh) - xd;
  Four t;
  t.v[0] = xd * xd;
  t.v[1] = e * e;
  t.v[2] = e;
  t.v[3] = std::fabs(xd);
  return t;
}

// The partials of every 4096-element segment of every row, row-major.
std::vector<Four> segment_list(const float* x, const float* xh, int64_t rows, int64_t cols) {
  std::vector<Four> p;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c0 = 0; c0 < cols; c0 += 4096) {
      Four s;
      for (int64_t c = c0; c < std::min(cols, c0 + 4096); ++c) s = plus(s, term(x[r * cols + c], xh[r * cols + c]));
      p.push_back(s);
    }
  return p;
}

// The stored sums by the definition (no Inf or NaN in these inputs).
Four definition(const float* x, const float* xh, int64_t rows, int64_t cols) {
  const std::vector<Four> p = segment_list(x, xh, rows, cols);
  return p.empty() ? Four{} : tree(p, 0, p.size());
}

// Other orders, to show that the data tell orders apart.
Four sequential(const float* x, const float* xh, int64_t n) {
  Four s;
  for (int64_t i = 0; i < n; ++i) s = plus(s, term(x[i], xh[i]));
  return s;
}

Four block_order(const float* x, const float* xh, int64_t rows, int64_t cols, int br, int bc) {
  Four s;
  for (int64_t r0 = 0; r0 < rows; r0 += br)
    for (int64_t c0 = 0; c0 < cols; c0 += bc)
      for (int64_t r = r0; r < std::min(rows, r0 + br); ++r)
        for (int64_t c = c0; c < std::min(cols, c0 + bc); ++c) s = plus(s, term(x[r * cols + c], xh[r * cols + c]));
  return s;
}

bool same_sums(const Four& a, const Four& b) {
  for (int k = 0; k < 4; ++k)
    if (bits_of(a.v[k]) != bits_of(b.v[k])) return false;
  return true;
}

Four of(const QuantStats& s) { return Four{{s.sum_sq, s.sum_sq_err, s.sum_err, s.sum_abs}}; }

std::string show(const Four& f) {
  return "sum_sq " + hex(f.v[0]) + " sum_sq_err " + hex(f.v[1]) + " sum_err " + hex(f.v[2]) + " sum_abs " + hex(f.v[3]);
}

// Values over many binades, so that a different order rounds differently.
std::vector<float> wide_values(test::Rng& rng, int64_t n) {
  std::vector<float> x(static_cast<size_t>(n));
  for (float& v : x) v = (rng.coin() ? -1.0f : 1.0f) * rng.float_in(-12, 12);
  return x;
}

struct Call {
  std::vector<float> values;
  std::vector<uint8_t> codes, scales;
  QuantStats stats;
};

// impl 0: quantize_ref; k > 0: quantize on k threads.
Call call(const QuantSpec& s, const std::vector<float>& x, int64_t rows, int64_t cols, int impl) {
  Call c;
  const int64_t n = rows * cols;
  c.values.assign(static_cast<size_t>(n), 0.0f);
  c.codes.assign(static_cast<size_t>(n * s.elem.code_bytes()), 0);
  c.scales.assign(static_cast<size_t>(block_count(s, rows, cols) * (s.scale ? s.scale->code_bytes() : 1)), 0);
  const QuantOutput out{c.values.data(), c.codes.data(), c.scales.data(), &c.stats};
  if (impl == 0) quantize_ref(s, x.data(), rows, cols, out);
  else quantize(s, x.data(), rows, cols, out, impl);
  return c;
}

QuantSpec nvfp4_like(int br, int bc) {
  QuantSpec s;
  s.elem = parse_format("e2m1");
  s.scale = parse_format("ue5m3");
  s.block_rows = br;
  s.block_cols = bc;
  s.amax_kind = AmaxKind::current;
  s.scale_target = 448.0;
  s.arith = Arith::fp32;
  return s;
}

// ---------------------------------------------------------------------------

// The tree of quant_sums.hpp (its streaming form) against the recursion, for
// every list length up to 130 and around larger powers of two, on partials
// whose sums depend on the grouping.
TEST(SumTree, EqualsTheRecursiveDefinition) {
  test::Rng rng(31);
  std::vector<int64_t> lengths;
  for (int64_t n = 1; n <= 130; ++n) lengths.push_back(n);
  for (int64_t n : {255, 256, 257, 1023, 1024, 1025, 3000}) lengths.push_back(n);
  int order_matters = 0;
  for (const int64_t n : lengths) {
    std::vector<Four> p(static_cast<size_t>(n));
    std::vector<SumPartial> q(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      for (int k = 0; k < 4; ++k)
        p[static_cast<size_t>(i)].v[k] = (rng.coin() ? -1.0 : 1.0) * std::ldexp(1.0 + rng.uniform(), static_cast<int>(rng.range(-30, 30)));
      const Four& f = p[static_cast<size_t>(i)];
      q[static_cast<size_t>(i)] = SumPartial{f.v[0], f.v[1], f.v[2], f.v[3], false};
    }
    const Four want = tree(p, 0, p.size());
    const SumPartial got = tree_sum(q.data(), n);
    EXPECT_TRUE(same_sums(Four{{got.sq, got.sq_err, got.err, got.abs}}, want)) << "n = " << n;
    Four seq;
    for (const Four& f : p) seq = plus(seq, f);
    order_matters += !same_sums(seq, want);
  }
  // the data distinguish the tree from a left-to-right sum
  EXPECT_GT(order_matters, 100);
  EXPECT_EQ(bits_of(tree_sum(nullptr, 0).sq), bits_of(0.0));
}

// The tree level by level (formats/tree_launches.hpp, as a device runs it:
// a thread per group, a launch per level, here with the host's launcher)
// against the recursion, for lengths around the group size's powers, with
// and without short groups at each level.
TEST(SumTree, LevelsEqualTheRecursiveDefinition) {
  test::Rng rng(32);
  std::vector<int64_t> lengths = {0, 1, 2, 31, 32, 33, 63, 64, 65, 100, 1023, 1024, 1025, 32 * 32 + 31,
                                  32 * 32 * 32, 32 * 32 * 32 + 1, 32 * 32 * 33 + 37 * 32 + 5};
  for (int k = 0; k < 20; ++k) lengths.push_back(rng.range(2, 40000));
  for (const int64_t n : lengths) {
    std::vector<Four> p(static_cast<size_t>(n));
    std::vector<SumPartial> a(static_cast<size_t>(std::max<int64_t>(1, n)));
    for (int64_t i = 0; i < n; ++i) {
      for (int k = 0; k < 4; ++k)
        p[static_cast<size_t>(i)].v[k] =
            (rng.coin() ? -1.0 : 1.0) * std::ldexp(1.0 + rng.uniform(), static_cast<int>(rng.range(-30, 30)));
      const Four& f = p[static_cast<size_t>(i)];
      a[static_cast<size_t>(i)] = SumPartial{f.v[0], f.v[1], f.v[2], f.v[3], false};
    }
    std::vector<SumPartial> b(static_cast<size_t>(tree_scratch_items(n)));
    TreeTail<SumPartial> tail;  // (the levels start it: what it holds before must not count)
    tail.sum = SumPartial{1e300, 1e300, 1e300, 1e300, true};
    tail.has = 7;
    int64_t m = n;
    const SumPartial* last = tree_levels(HostLaunch{}, a.data(), b.data(), m, &tail);
    ASSERT_LE(m, kTreeGroup);
    const SumPartial got = tree_final(last, m, tail);
    const Four want = n > 0 ? tree(p, 0, p.size()) : Four{};
    EXPECT_TRUE(same_sums(Four{{got.sq, got.sq_err, got.err, got.abs}}, want)) << "n = " << n;
  }
}

// The lane kernels of the fast path (four lanes, and eight with AVX-512)
// against segment_partial lane by lane: lengths that are and are not
// multiples of 8 and 4, lanes that overlap, and specials (zeros of both
// signs, subnormals, huge values, Inf, NaN).
static void check_segment_lanes(int lanes, void (*kernel)(const float* const*, const float* const*, int64_t, SumPartial*)) {
  test::Rng rng(77);
  const float specials[] = {0.0f, -0.0f, 1e-40f, -3e-39f, 3e38f, -3e38f, std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()};
  int inf_lanes = 0, nan_lanes = 0;
  const int64_t L = lanes;
  for (const int64_t n : {0, 1, 3, 4, 5, 7, 8, 9, 12, 17, 4095, 4096}) {
    for (int variant = 0; variant < 4; ++variant) {
      std::vector<float> x = wide_values(rng, L * n + 8), xh = wide_values(rng, L * n + 8);
      // variant 1: finite specials; 2: also an infinite x-hat in lane 1's
      // range; 3: any specials, and a NaN x in lane 2's range
      if (variant > 0)
        for (int k = 0; k < 6 * lanes / 4 && n > 0; ++k) {
          auto& v = rng.coin() ? x : xh;
          v[static_cast<size_t>(rng.range(0, L * n - 1))] = specials[rng.range(0, variant == 1 ? 5 : 8)];
        }
      if (variant == 2 && n > 0) xh[static_cast<size_t>(n + rng.range(0, n - 1))] = -specials[6];
      if (variant == 3 && n > 0) x[static_cast<size_t>(2 * n + rng.range(0, n - 1))] = specials[8];
      const float* xs[8];
      const float* hs[8];
      for (int k = 0; k < lanes; ++k) {
        const int64_t at = k == lanes - 1 ? 1 : k * n;  // the last lane overlaps lane 0
        xs[k] = x.data() + at;
        hs[k] = xh.data() + at;
      }
      SumPartial got[8];
      kernel(xs, hs, n, got);
      for (int k = 0; k < lanes; ++k) {
        const SumPartial want = segment_partial(xs[k], hs[k], n);
        const std::string what = std::to_string(lanes) + " lanes, n " + std::to_string(n) + " variant " +
                                 std::to_string(variant) + " lane " + std::to_string(k);
        // a NaN sum may carry either operand's NaN: compare NaN as NaN
        auto eq = [](double a, double b) { return std::isnan(a) ? std::isnan(b) : bits_of(a) == bits_of(b); };
        EXPECT_TRUE(eq(got[k].sq, want.sq)) << what;
        EXPECT_TRUE(eq(got[k].sq_err, want.sq_err)) << what;
        EXPECT_TRUE(eq(got[k].err, want.err)) << what;
        EXPECT_TRUE(eq(got[k].abs, want.abs)) << what;
        EXPECT_EQ(got[k].xh_inf, want.xh_inf) << what;
        inf_lanes += want.xh_inf;
        nan_lanes += std::isnan(want.sq);
      }
    }
  }
  EXPECT_GT(inf_lanes, 3);
  EXPECT_GT(nan_lanes, 3);
}

TEST(SegmentPartials, FourLanesEachEqualSegmentPartial) {
  check_segment_lanes(4, [](const float* const* x, const float* const* xh, int64_t n, SumPartial* out) {
    detail::segment_partials4(x, xh, n, out);
  });
}

TEST(SegmentPartials, EightLanesEachEqualSegmentPartial) {
  if (detail::simd_available() != detail::Simd::avx512) GTEST_SKIP() << "this CPU has no AVX-512";
  check_segment_lanes(8, [](const float* const* x, const float* const* xh, int64_t n, SumPartial* out) {
    detail::avx512::segment_partials8(x, xh, n, out);
  });
}

// Rows longer than a segment: many segments per row, a shorter last one, and
// (on three rows) batches of the fast path's four lanes that straddle rows
// or are left short. Reference, fast path on 1-3 threads and the definition
// written above must agree bit for bit.
TEST(Sums, WideRowsFollowTheSegmentTree) {
  test::Rng rng(4096);
  struct Shape {
    int64_t rows, cols;
    int br, bc;
  };
  // (7 x 4500: 14 segments, three complete subtrees at the end of the tree)
  const Shape shapes[] = {{3, 10000, 1, 16}, {1, 70000, 1, 16}, {2, 8192, 16, 16},
                          {5, 4097, 16, 1},  {4, 12288, 1, 32}, {7, 4500, 1, 16}};
  for (const Shape& sh : shapes) {
    QuantSpec s = nvfp4_like(sh.br, sh.bc);
    const std::vector<float> x = wide_values(rng, sh.rows * sh.cols);
    const Call ref = call(s, x, sh.rows, sh.cols, 0);
    const std::string shape = std::to_string(sh.rows) + "x" + std::to_string(sh.cols);
    const Four want = definition(x.data(), ref.values.data(), sh.rows, sh.cols);
    EXPECT_TRUE(same_sums(of(ref.stats), want)) << shape << " reference " << show(of(ref.stats)) << ", definition "
                                           << show(want);
    // another order would give other bits on these data
    EXPECT_FALSE(same_sums(sequential(x.data(), ref.values.data(), sh.rows * sh.cols), want)) << shape;
    for (int threads : {1, 2, 3}) {
      const Call f = call(s, x, sh.rows, sh.cols, threads);
      const std::string what = shape + ", " + std::to_string(threads) + " thread(s)";
      ASSERT_EQ(std::memcmp(f.values.data(), ref.values.data(), sizeof(float) * f.values.size()), 0) << what;
      EXPECT_TRUE(same_sums(of(f.stats), want)) << what << ": " << show(of(f.stats)) << ", definition " << show(want);
      EXPECT_EQ(f.stats, ref.stats) << what;
    }
  }
}

// The order does not depend on the block shape. On this tensor every 1x16
// block, every 16x1 block and every 16x16 tile holds an element of the same
// largest magnitude (x[r][c] = +-M where c - r is a multiple of 16), so every
// block gets the same scale and the three shapes give the same x-hat: the
// sums must then be the same bits, the definition's, although the old block
// order over 16x16 tiles rounds differently.
TEST(Sums, SameForEveryBlockShape) {
  test::Rng rng(1616);
  const int64_t rows = 32, cols = 4096 + 512;
  std::vector<float> x = wide_values(rng, rows * cols);
  for (float& v : x) v = std::ldexp(v, -13);  // below M
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = r % 16; c < cols; c += 16) x[static_cast<size_t>(r * cols + c)] = rng.coin() ? 6.0f : -6.0f;
  const Call a = call(nvfp4_like(1, 16), x, rows, cols, 2);
  const Call b = call(nvfp4_like(16, 16), x, rows, cols, 2);
  const Call c = call(nvfp4_like(16, 1), x, rows, cols, 2);
  ASSERT_EQ(std::memcmp(a.values.data(), b.values.data(), sizeof(float) * a.values.size()), 0);
  ASSERT_EQ(std::memcmp(a.values.data(), c.values.data(), sizeof(float) * a.values.size()), 0);
  const Four want = definition(x.data(), a.values.data(), rows, cols);
  EXPECT_GT(want.v[1], 0.0);  // the x-hat are not all exact
  for (const Call* k : {&a, &b, &c}) EXPECT_TRUE(same_sums(of(k->stats), want)) << show(of(k->stats));
  EXPECT_TRUE(same_sums(of(call(nvfp4_like(16, 16), x, rows, cols, 0).stats), want));
  EXPECT_FALSE(same_sums(block_order(x.data(), a.values.data(), rows, cols, 16, 16), want));
}

// Without a block scale (bands of 64 rows) and with x-hat = x (an fp16
// grid): reference, fast path and tensor_sums give the definition's sums.
TEST(Sums, UnscaledExactFormat) {
  test::Rng rng(5);
  const int64_t rows = 3, cols = 9000;
  std::vector<float> x(static_cast<size_t>(rows * cols));
  for (float& v : x) v = static_cast<float>(rng.range(-2048, 2048)) * 0.125f;  // exact in fp16
  QuantSpec s;
  s.elem = parse_format("fp16");
  const Four want = definition(x.data(), x.data(), rows, cols);
  for (int impl : {0, 1, 2}) {
    const Call f = call(s, x, rows, cols, impl);
    EXPECT_TRUE(same_sums(of(f.stats), want)) << impl;
    EXPECT_EQ(bits_of(f.stats.sum_sq_err), bits_of(0.0));
  }
  const SumPartial t = tensor_sums(x.data(), x.data(), rows, cols);
  EXPECT_TRUE(same_sums(Four{{t.sq, t.sq_err, t.err, t.abs}}, want));
}

// Where any x-hat is +-Inf, sum_sq_err and sum_err are +Inf, also where IEEE
// arithmetic would give NaN (+Inf and -Inf x-hat, x-hat = x = Inf) or -Inf,
// and with a NaN elsewhere; sum_sq and sum_abs keep their arithmetic value.
TEST(Sums, InfiniteXHatRule) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  struct Case {
    const char* what;
    std::vector<std::pair<int64_t, float>> put;  // (flat index, x)
    bool sq_nan;                                 // sum_sq and sum_abs NaN (a NaN input), else checked finite/Inf
  };
  const int64_t rows = 2, cols = 5000;
  const Case cases[] = {
      {"one overflow to +Inf", {{7, 1e6f}}, false},
      {"only -Inf x-hat", {{7, -1e6f}, {4999, -2e6f}}, false},
      {"+Inf and -Inf x-hat in different segments", {{7, 1e6f}, {6000, -1e6f}}, false},
      {"x = +Inf, x-hat = +Inf", {{9000, inf}}, false},
      {"x = -Inf and an overflow", {{10, -inf}, {4500, 3e5f}}, false},
      {"Inf x-hat and a NaN element", {{3, 1e6f}, {8000, nan}}, true},
  };
  for (const Case& k : cases) {
    std::vector<float> x(static_cast<size_t>(rows * cols));
    test::Rng rng(8);
    for (float& v : x) v = static_cast<float>(rng.uniform() * 2 - 1);
    for (const auto& [i, v] : k.put) x[static_cast<size_t>(i)] = v;
    QuantSpec s;
    s.elem = parse_format("e5m2");  // has Inf; no saturation: overflow gives Inf
    s.saturate = false;
    for (int impl : {0, 1, 2, 3}) {
      const Call f = call(s, x, rows, cols, impl);
      const std::string what = std::string(k.what) + ", impl " + std::to_string(impl);
      bool any_inf = false;
      for (float v : f.values) any_inf = any_inf || std::isinf(v);
      ASSERT_TRUE(any_inf) << what;
      EXPECT_EQ(bits_of(f.stats.sum_sq_err), bits_of(static_cast<double>(inf))) << what;
      EXPECT_EQ(bits_of(f.stats.sum_err), bits_of(static_cast<double>(inf))) << what;
      if (k.sq_nan) {
        EXPECT_EQ(bits_of(f.stats.sum_sq), bits_of(std::numeric_limits<double>::quiet_NaN())) << what;
        EXPECT_EQ(bits_of(f.stats.sum_abs), bits_of(std::numeric_limits<double>::quiet_NaN())) << what;
      } else {
        // Σx² and Σ|x| of the definition (Inf only where some x is)
        const Four d = definition(x.data(), x.data(), rows, cols);
        EXPECT_EQ(bits_of(f.stats.sum_sq), bits_of(d.v[0])) << what;
        EXPECT_EQ(bits_of(f.stats.sum_abs), bits_of(d.v[3])) << what;
      }
    }
  }
  // Without an infinite x-hat a NaN element makes every sum the canonical NaN.
  std::vector<float> x(100, 0.5f);
  x[42] = nan;
  QuantSpec s;
  s.elem = parse_format("e5m2");
  for (int impl : {0, 1, 2}) {
    const Call f = call(s, x, 1, 100, impl);
    for (double v : {f.stats.sum_sq, f.stats.sum_sq_err, f.stats.sum_err, f.stats.sum_abs})
      EXPECT_EQ(bits_of(v), bits_of(std::numeric_limits<double>::quiet_NaN())) << impl;
  }
}

}  // namespace
}  // namespace exmy

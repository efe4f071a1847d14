// The Hadamard transforms of every size (16, 32, 64, 128) and kind (random,
// deterministic) of docs/numerics.md §3.
//
// The oracle here is written from the definition alone: the Sylvester matrix
// built by its recursion H_2m = [[H_m, H_m], [H_m, -H_m]], the sign vector by
// its documented expansion (a splitmix64 of its own), the exact sum in a
// Boost integer in units of 2^-149, then the stated rounding: for n = 16 and
// 64 one rne to bf16 of S / sqrt(n); for n = 32 and 128 S rounded to odd at
// 53 bits, multiplied in double by the double nearest 1/sqrt(2), then one rne
// to bf16 of that times 1/4 or 1/8. hadamard (1 and 2 threads) and
// hadamard_ref must equal it bit for bit on both axes and several shapes,
// exact-path and accumulator-path segments, zeros of both signs, overflow,
// Inf and NaN. Quantization with the knobs equals quantize_ref (threaded and
// in bands), and the knobs fail with one-line errors.
#include <gtest/gtest.h>

#include <boost/multiprecision/cpp_int.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "quantize_outcome.hpp"
#include "formats/error.hpp"
#include "formats/quantize.hpp"
#include "formats/spec.hpp"
#include "formats/vocab.hpp"
#include "test_support.hpp"

namespace exmy {
namespace {

using boost::multiprecision::cpp_int;
using test::hex;

constexpr int kSizes[] = {16, 32, 64, 128};

// H_n by the Sylvester recursion, entries +1 / -1.
std::vector<std::vector<int>> sylvester(int n) {
  std::vector<std::vector<int>> h = {{1}};
  for (int m = 1; m < n; m *= 2) {
    std::vector<std::vector<int>> g(2 * m, std::vector<int>(2 * m));
    for (int i = 0; i < m; ++i)
      for (int j = 0; j < m; ++j) {
        g[i][j] = g[i][j + m] = g[i + m][j] = h[i][j];
        g[i + m][j + m] = -h[i][j];
      }
    h = g;
  }
  return h;
}

// The documented sign vector: +1 or -1 per i.
std::vector<int> signs_of(int n, RhtKind kind, uint16_t mask) {
  uint64_t state = mask;
  uint64_t w[2];
  for (uint64_t& word : w) {
    state += 0x9E3779B97F4A7C15ull;
    uint64_t z = state;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    word = z ^ (z >> 31);
  }
  std::vector<int> s(n, 1);
  if (kind == RhtKind::deterministic) return s;
  for (int i = 0; i < n; ++i) {
    const bool bit = i < 16 ? (mask >> i) & 1 : (w[i / 64] >> (i % 64)) & 1;
    if (bit) s[i] = -1;
  }
  return s;
}

// A finite float as an integer count of 2^-149.
cpp_int units(float f) {
  const uint32_t b = bits_of(f);
  const int e = static_cast<int>((b >> 23) & 0xff);
  cpp_int m = b & 0x7fffffu;
  if (e != 0) m += 0x800000u;
  if (e > 1) m <<= (e - 1);
  return (b >> 31) ? cpp_int(-m) : m;
}

int top_bit(const cpp_int& m) { return static_cast<int>(boost::multiprecision::msb(m)); }

// rne of |v| (an integer count of 2^-(149+k)) to bf16, sign neg.
float bf16_of_units(bool neg, cpp_int v, int k) {
  const int t = top_bit(v);
  const int q = std::max(t - 7, 16 + k);  // bf16's last bit: 8 significant bits, or 2^-133
  if (q > 0) {
    const cpp_int unit = cpp_int(1) << q;
    const cpp_int rem = v & (unit - 1);
    v >>= q;
    const cpp_int half = unit >> 1;
    if (rem > half || (rem == half && (v & 1) != 0)) v += 1;
    v <<= q;
  }
  if (v == 0) return neg ? -0.0f : 0.0f;
  // v * 2^-(149+k), exact in double for the top 9 bits' range used here
  const int tb = top_bit(v);
  const int shift = std::max(0, tb - 60);
  const double d = std::ldexp(static_cast<double>(static_cast<uint64_t>(v >> shift)), shift - 149 - k);
  const float f = d > 3.3895313892515355e38 ? std::numeric_limits<float>::infinity() : static_cast<float>(d);
  return neg ? -f : f;
}

// rne of a double to bf16 (directly).
float bf16_of_double(double d) {
  if (d == 0) return static_cast<float>(d);
  const bool neg = d < 0;
  const double a = std::fabs(d);
  const int q = std::max(std::ilogb(a) - 7, -133);
  const double r = std::ldexp(std::nearbyint(std::ldexp(a, -q)), q);
  const float f = r > 3.3895313892515355e38 ? std::numeric_limits<float>::infinity() : static_cast<float>(r);
  return neg ? -f : f;
}

// Output j of one segment by the definition.
float oracle_output(const std::vector<float>& in, const std::vector<std::vector<int>>& h, const std::vector<int>& s,
                    int j) {
  const int n = static_cast<int>(in.size());
  std::vector<float> u(n);
  bool finite = true, all_neg_zero = true;
  for (int i = 0; i < n; ++i) {
    u[i] = s[i] * h[i][j] < 0 ? -in[i] : in[i];
    finite = finite && std::isfinite(u[i]);
    all_neg_zero = all_neg_zero && bits_of(u[i]) == 0x80000000u;
  }
  if (!finite) {
    double sum = 0;
    for (float v : u) sum += v;
    return static_cast<float>(sum);  // Inf of one sign, or NaN
  }
  cpp_int sum = 0;
  for (float v : u) sum += units(v);
  if (sum == 0) return all_neg_zero ? -0.0f : 0.0f;
  const bool neg = sum < 0;
  const cpp_int mag = neg ? cpp_int(-sum) : sum;
  const int k = n <= 32 ? 2 : 3;  // the power of two of 1/sqrt(n)
  if (n == 16 || n == 64) return bf16_of_units(neg, mag, k);
  // rto at 53 bits, times the double nearest 1/sqrt(2), times 2^-k
  const int t = top_bit(mag);
  double r;
  if (t < 53) {
    r = std::ldexp(static_cast<double>(static_cast<uint64_t>(mag)), -149);
  } else {
    const int drop = t - 52;
    cpp_int sig = mag >> drop;
    if ((mag & ((cpp_int(1) << drop) - 1)) != 0) sig |= 1;
    r = std::ldexp(static_cast<double>(static_cast<uint64_t>(sig)), drop - 149);
  }
  const double p = r * 0x1.6a09e667f3bcdp-1;
  const float out = bf16_of_double(std::ldexp(p, -k));
  return neg ? -out : out;
}

float draw_elem(test::Rng& rng, int kind, int i) {
  const float sg = rng.coin() ? -1.0f : 1.0f;
  switch (kind) {
    case 0: return sg * rng.float_in(-3, 3);                                      // ordinary
    case 1: return sg * rng.float_in(-100, 100);                                  // huge spread
    case 2: return rng.coin() ? -0.0f : 0.0f;                                     // zeros
    case 3: return (i % 2 ? 1e30f : -3e-38f) * sg;                                // accumulator path
    case 4: return float_of(static_cast<uint32_t>(rng.range(0, 0x7fffff)) | (rng.coin() ? 0x80000000u : 0u));
    case 5: return sg * rng.float_in(120, 127);                                   // bf16 overflow
    case 6: return static_cast<float>(rng.range(-3, 3));                          // cancellations to 0
    case 8: return sg * std::ldexp(rng.coin() ? 1.0f : 1.5f, static_cast<int>(rng.range(-24, 24)));  // near the exact-path bound
    default:
      return i == 5 ? (rng.coin() ? std::numeric_limits<float>::infinity() : std::numeric_limits<float>::quiet_NaN())
                    : rng.float_in(-3, 3);
  }
}

bool same(float a, float b) { return std::isnan(a) ? std::isnan(b) : bits_of(a) == bits_of(b); }

TEST(HadamardSizes, FastAndReferenceEqualTheDefinition) {
  test::Rng rng(2020);
  for (const int n : kSizes) {
    const auto h = sylvester(n);
    for (const RhtKind kind : {RhtKind::random, RhtKind::deterministic}) {
      int segments = 0, accumulator = 0, nonzero = 0;
      for (int t = 0; t < 24; ++t) {
        const int axis = t % 2;
        const int64_t rows = axis == 1 ? rng.range(1, 4) : n * rng.range(1, 2);
        const int64_t cols = axis == 1 ? n * rng.range(1, 3) : rng.range(1, 4);
        const Rht tr{n, kind, t % 3 == 0 ? uint16_t{0xD7E8} : static_cast<uint16_t>(rng.u32())};
        const auto s = signs_of(n, kind, tr.signs);
        std::vector<float> x(static_cast<size_t>(rows * cols));
        const int64_t nseg = rows * cols / n;
        auto at = [&](int64_t seg, int i) {
          return static_cast<size_t>(axis == 1 ? seg * n + i : ((seg / cols) * n + i) * cols + (seg % cols));
        };
        std::vector<int> kinds(static_cast<size_t>(nseg));
        for (int64_t g = 0; g < nseg; ++g) {
          kinds[g] = static_cast<int>(rng.range(0, 8));
          accumulator += kinds[g] == 1 || kinds[g] == 3 || kinds[g] == 8;
          for (int i = 0; i < n; ++i) x[at(g, i)] = draw_elem(rng, kinds[g], i);
        }
        std::vector<float> a = x, b = x, c = x;
        hadamard_ref(a.data(), rows, cols, axis, tr);
        hadamard(b.data(), rows, cols, axis, tr, 1);
        hadamard(c.data(), rows, cols, axis, tr, 2);
        for (int64_t g = 0; g < nseg; ++g) {
          std::vector<float> in(n);
          for (int i = 0; i < n; ++i) in[i] = x[at(g, i)];
          for (int j = 0; j < n; ++j) {
            const float want = oracle_output(in, h, s, j);
            const size_t e = at(g, j);
            const std::string what = "n " + std::to_string(n) + (kind == RhtKind::random ? " random" : " deterministic") +
                                     " axis " + std::to_string(axis) + " " + std::to_string(rows) + "x" +
                                     std::to_string(cols) + " segment kind " + std::to_string(kinds[g]) + " output " +
                                     std::to_string(j) + ": want " + hex(want);
            ASSERT_TRUE(same(want, a[e])) << what << ", hadamard_ref " << hex(a[e]);
            ASSERT_TRUE(same(want, b[e])) << what << ", hadamard " << hex(b[e]);
            ASSERT_TRUE(same(want, c[e])) << what << ", hadamard (2 threads) " << hex(c[e]);
            nonzero += want != 0;
          }
          ++segments;
        }
      }
      EXPECT_GT(segments, 40) << n;
      EXPECT_GT(accumulator, 5) << n;
      EXPECT_GT(nonzero, segments * n / 2) << n;
    }
  }
}

// Size 16, random, is hadamard16 with the same mask; the deterministic kind
// is the random kind with mask 0 at size 16.
TEST(HadamardSizes, Size16IsHadamard16) {
  test::Rng rng(16);
  std::vector<float> x(8 * 32);
  for (size_t i = 0; i < x.size(); ++i) x[i] = draw_elem(rng, static_cast<int>(i / 16 % 7), static_cast<int>(i));
  for (const int axis : {0, 1}) {
    std::vector<float> a = x, b = x, c = x, d = x;
    const int64_t rows = axis == 1 ? 8 : 32, cols = axis == 1 ? 32 : 8;
    hadamard16(a.data(), rows, cols, axis, 0x1234, 1);
    hadamard(b.data(), rows, cols, axis, Rht{16, RhtKind::random, 0x1234}, 1);
    hadamard16(c.data(), rows, cols, axis, 0, 1);
    hadamard(d.data(), rows, cols, axis, Rht{16, RhtKind::deterministic, 0x1234}, 1);
    for (size_t i = 0; i < x.size(); ++i) {
      EXPECT_TRUE(same(a[i], b[i])) << i;
      EXPECT_TRUE(same(c[i], d[i])) << i;
    }
  }
}

TEST(HadamardSizes, LengthsAndSizesAreCheckedWithOneLineErrors) {
  std::vector<float> x(64 * 3, 1.0f);
  const auto msg = [](auto f) { return test::error_message(f); };
  std::string m = msg([&] { hadamard(x.data(), 3, 64, 1, Rht{128}, 1); });
  EXPECT_NE(m.find("row length 64 is not a multiple of 128"), std::string::npos) << m;
  m = msg([&] { hadamard_ref(x.data(), 64, 3, 0, Rht{128}); });
  EXPECT_NE(m.find("column length 64 is not a multiple of 128"), std::string::npos) << m;
  m = msg([&] { hadamard(x.data(), 3, 64, 1, Rht{48}, 1); });
  EXPECT_NE(m.find("Hadamard size 48 is not one of 16, 32, 64, 128"), std::string::npos) << m;
  QuantSpec s;
  s.elem = parse_format("e2m1");
  s.rht = true;
  for (const char* bad : {"8", "48", "256", "0", "x"}) {
    m = msg([&] { set_knob(s, "rht_size", bad); });
    EXPECT_FALSE(m.empty()) << bad;
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  }
  m = msg([&] { set_knob(s, "rht_kind", "fixed"); });
  EXPECT_FALSE(m.empty());
  EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  set_knob(s, "rht-size", "32");
  set_knob(s, "rht-kind", "deterministic");
  EXPECT_EQ(s.rht_size, 32);
  EXPECT_EQ(s.rht_kind, RhtKind::deterministic);
  s.rht_size = 40;
  m = msg([&] { s.validate(); });
  EXPECT_NE(m.find("Hadamard size 40"), std::string::npos) << m;
  // quantize states the row length against the size
  s.rht_size = 64;
  const std::vector<float> y(2 * 48, 1.0f);
  const test::Outcome r = test::run(s, y, 2, 48, 1);
  EXPECT_TRUE(r.threw);
  EXPECT_NE(r.error.find("not a multiple of 64"), std::string::npos) << r.error;
}

// Quantization with every size and kind: quantize (1 and 2 threads) and the
// bands of BandQuantizer equal quantize_ref, on 1x16 and 16x1 blocks.
TEST(HadamardSizes, QuantizeEqualsReferenceThreadedAndInBands) {
  test::Rng rng(6464);
  int compared = 0;
  for (const int n : kSizes)
    for (const RhtKind kind : {RhtKind::random, RhtKind::deterministic})
      for (const bool rows16 : {true, false})
        for (const char* scale : {"ue4m3", "ue8m0"}) {
          QuantSpec s;
          s.elem = parse_format("e2m1");
          s.scale = parse_format(scale);
          s.block_rows = rows16 ? 1 : 16;
          s.block_cols = rows16 ? 16 : 1;
          s.amax_kind = AmaxKind::current;
          s.round = rng.coin() ? Round::rne : Round::stochastic;
          s.seed = rng.u64();
          s.rht = true;
          s.rht_size = n;
          s.rht_kind = kind;
          s.rht_signs = static_cast<uint16_t>(rng.u32());
          const int64_t rows = rows16 ? 48 : 2 * n, cols = rows16 ? 2 * n : 40;
          std::vector<float> x(static_cast<size_t>(rows * cols));
          for (size_t i = 0; i < x.size(); ++i) x[i] = draw_elem(rng, i % 97 == 0 ? 2 : 0, static_cast<int>(i));
          const test::Outcome want = test::run(s, x, rows, cols, 0);
          ASSERT_FALSE(want.threw) << want.error;
          const std::string what = std::to_string(n) + (kind == RhtKind::random ? " random " : " deterministic ") +
                                   (rows16 ? "1x16 " : "16x1 ") + scale;
          for (int threads : {1, 2}) {
            EXPECT_EQ(test::difference(want, test::run(s, x, rows, cols, threads), x), "") << what << threads;
            test::Outcome bands = test::run_bands(s, x, rows, cols, rows16 ? 16 : n, threads);
            bands.info = want.info;
            EXPECT_EQ(test::difference(want, bands, x), "") << what << " bands, " << threads << " thread(s)";
            ++compared;
          }
          // the transform is the one quantized: a different size gives other values
          QuantSpec o = s;
          o.rht_size = n == 16 ? 32 : 16;
          EXPECT_NE(test::run(o, x, rows, cols, 1).values, want.values) << what;
        }
  EXPECT_EQ(compared, 64);
}

}  // namespace
}  // namespace exmy

// The grouped GEMM output model: the exact accumulator against rational
// arithmetic, the reference against a rational re-derivation, and the fast
// blocked kernel against the reference, bit for bit.
#include <gtest/gtest.h>
#include <omp.h>

#include <bit>
#include <boost/multiprecision/cpp_int.hpp>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <random>

#include "formats/quantize.hpp"
#include "formats/spec.hpp"
#include "sim/parallel.hpp"
#include "sim/quant/grouped_gemm.hpp"

namespace exmy::sim::quant {
namespace {

using Int = boost::multiprecision::cpp_int;
using Rat = boost::multiprecision::cpp_rational;

Rat exact(double d) {
  if (d == 0.0) return Rat(0);
  int e = 0;
  const double m = std::frexp(std::fabs(d), &e);
  const Int sig = Int(static_cast<uint64_t>(std::ldexp(m, 53)));
  const int sh = e - 53;
  Rat r = sh >= 0 ? Rat(sig << sh) : Rat(sig, Int(1) << -sh);
  return d < 0 ? Rat(-r) : r;
}

// The float32 rounding of an exact rational (rne or rtz), by search over
// the neighbouring floats with exact comparisons.
float round_rat(const Rat& v, bool rtz) {
  if (v == 0) return 0.0f;
  const bool neg = v < 0;
  const Rat a = neg ? Rat(-v) : v;
  float lo = std::fmin(static_cast<float>(std::fabs(a.convert_to<double>())), FLT_MAX);
  while (lo > 0 && exact(lo) > a) lo = std::nextafter(lo, 0.0f);
  while (lo < FLT_MAX && exact(std::nextafter(lo, INFINITY)) <= a) lo = std::nextafter(lo, INFINITY);
  float r = lo;
  if (!rtz && exact(lo) != a) {
    const float hi = std::nextafter(lo, INFINITY);  // Inf past FLT_MAX
    const Rat hiv = std::isinf(hi) ? Rat(Int(1) << 128) : exact(hi);
    const Rat dlo = a - exact(lo), dhi = hiv - a;
    const bool lo_even = (std::bit_cast<uint32_t>(lo) & 1u) == 0;
    r = dlo < dhi || (dlo == dhi && lo_even) ? lo : hi;
  }
  return neg ? -r : r;
}

double random_double(std::mt19937_64& g, int emin, int emax) {
  std::uniform_int_distribution<int> e(emin, emax);
  std::uniform_int_distribution<uint64_t> m(0, (uint64_t{1} << 52) - 1);
  const double v = std::ldexp(1.0 + std::ldexp(static_cast<double>(m(g)), -52), e(g));
  return (g() & 1) ? -v : v;
}

TEST(ExactSum, MatchesRationalArithmetic) {
  std::mt19937_64 g(1);
  for (int trial = 0; trial < 300; ++trial) {
    ExactSum es;
    Rat sum = 0;
    const int terms = 1 + static_cast<int>(g() % 40);
    // Narrow exponent ranges produce cancellation; wide ones, sticky bits
    // far below the result; some trials reach float overflow and underflow.
    const int spread = trial % 3 == 0 ? 4 : trial % 3 == 1 ? 80 : 600;
    const int centre = static_cast<int>(g() % 260) - 130;
    for (int t = 0; t < terms; ++t) {
      const double a = random_double(g, centre / 2 - spread / 2, centre / 2 + spread / 2);
      const double b = random_double(g, centre / 2 - 2, centre / 2 + 2);
      es.add_product(a, b);
      sum += exact(a) * exact(b);
      if (t == 3 && trial % 5 == 0) {  // exact cancellation of everything so far
        es.add_product(-a, b);
        sum -= exact(a) * exact(b);
      }
    }
    for (bool rtz : {false, true}) {
      const float want = round_rat(sum, rtz), got = es.round(rtz ? Round::rtz : Round::rne);
      ASSERT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(want))
          << "trial " << trial << (rtz ? " rtz " : " rne ") << got << " vs " << want;
    }
  }
  // Subnormal doubles and specials.
  ExactSum es;
  es.add_product(4.9406564584124654e-324, 3.0);
  es.add_product(std::ldexp(1.0, -1000), std::ldexp(1.0, -1000));
  EXPECT_EQ(es.round(Round::rne), 0.0f);
  es.add_product(1.5, 2.0);
  EXPECT_EQ(es.round(Round::rne), 3.0f);
  es.add_product(INFINITY, 1.0);
  EXPECT_EQ(es.round(Round::rne), INFINITY);
  es.add_product(-INFINITY, 2.0);
  EXPECT_TRUE(std::isnan(es.round(Round::rne)));
  ExactSum z;
  z.add_product(INFINITY, 0.0);
  EXPECT_TRUE(std::isnan(z.round(Round::rtz)));
  ExactSum ov;
  ov.add_product(FLT_MAX, 2.0);
  EXPECT_EQ(ov.round(Round::rne), INFINITY);
  EXPECT_EQ(ov.round(Round::rtz), FLT_MAX);
}

TEST(ExactSum, FloatAdditionRtz) {
  std::mt19937_64 g(2);
  for (int trial = 0; trial < 3000; ++trial) {
    const float a = static_cast<float>(random_double(g, -140, 127));
    const float b = static_cast<float>(random_double(g, -140, 127)) * ((trial & 1) ? 1.0f : std::ldexp(1.0f, -30));
    if (!std::isfinite(a) || !std::isfinite(b)) continue;
    const Rat s = exact(a) + exact(b);
    ASSERT_EQ(std::bit_cast<uint32_t>(add_float(a, b, Round::rtz)), std::bit_cast<uint32_t>(round_rat(s, true)))
        << a << " + " << b;
    ASSERT_EQ(std::bit_cast<uint32_t>(add_float(a, b, Round::rne)), std::bit_cast<uint32_t>(round_rat(s, false)));
  }
  EXPECT_EQ(add_float(FLT_MAX, FLT_MAX, Round::rtz), FLT_MAX);
  EXPECT_EQ(add_float(FLT_MAX, FLT_MAX, Round::rne), INFINITY);
}

// Encoded operands from a real quantization: (rows, K) float data quantized
// with `spec`, then payload x block scale.
std::vector<double> encoded(const QuantSpec& spec, int64_t rows, int64_t K, uint32_t seed, float* t = nullptr,
                            double outlier = 1.0) {
  std::mt19937 g(seed);
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(rows * K));
  for (auto& v : x) v = n(g);
  for (size_t i = 0; i < x.size(); i += 97) x[i] *= static_cast<float>(outlier);  // spread the block scales
  QuantInfo info;
  std::vector<float> dq;
  const std::vector<double> v = quantize_encoded(spec, x.data(), rows, K, &info, &dq);
  if (t) *t = info.t;
  // encode_operand agrees with the decoded values up to the tensor scale
  for (size_t i = 0; i < v.size(); i += 13)
    if (std::isfinite(v[i]) && spec.arith == Arith::exact) {
      EXPECT_EQ(dq[i], fp32_rne_div(std::fabs(v[i]), info.t) * (v[i] < 0 ? -1.0f : 1.0f)) << i;
    }
  return v;
}

QuantSpec nvfp4_like(int br, int bc, const char* scale = "ue5m3") {
  QuantSpec s;
  s.elem = parse_format("e2m1");
  s.scale = parse_format(scale);
  s.block_rows = br;
  s.block_cols = bc;
  s.amax_kind = AmaxKind::current;
  s.scale_target = 448;
  return s;
}

void expect_same(const std::vector<float>& a, const std::vector<float>& b, const char* what) {
  ASSERT_EQ(a.size(), b.size());
  int nz = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    nz += a[i] != 0;
    ASSERT_EQ(std::bit_cast<uint32_t>(a[i]), std::bit_cast<uint32_t>(b[i]))
        << what << " element " << i << ": " << a[i] << " vs " << b[i];
  }
  EXPECT_GT(nz, static_cast<int>(a.size() / 2)) << what << ": mostly zeros, the test would be vacuous";
}

TEST(GroupedGemm, ReferenceMatchesRationalDerivation) {
  const int64_t M = 5, N = 6, K = 100;
  float ta = 1, tb = 1;
  const auto A = encoded(nvfp4_like(1, 16), M, K, 1, &ta, 50.0);
  const auto B = encoded(nvfp4_like(16, 16), N, K, 2, &tb);
  const float alpha = tensor_decode_alpha(ta, tb);
  for (const GemmModel m : {GemmModel{GemmModel::Kind::grouped, 64, Round::rne, Round::rtz, 1024},
                            GemmModel{GemmModel::Kind::grouped, 7, Round::rtz, Round::rne, 0},
                            GemmModel{GemmModel::Kind::grouped, 200, Round::rne, Round::rne, 3}}) {
    std::vector<float> C(M * N);
    grouped_gemm_ref(C.data(), A.data(), B.data(), M, N, K, m, alpha);
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) {
        float acc = 0.0f;
        for (int64_t k0 = 0; k0 < K; k0 += m.group) {
          Rat s = 0;
          for (int64_t k = k0; k < std::min(K, k0 + m.group); ++k) s += exact(A[i * K + k]) * exact(B[j * K + k]);
          const float gsum = round_rat(s, m.group_round == Round::rtz);
          acc = round_rat(exact(acc) + exact(gsum), m.accumulate == Round::rtz);
        }
        if (m.grid) {
          // RNE(d c) / d, ties to even, then rounded once to float
          const Rat dc = exact(acc) * m.grid;
          Int q = boost::multiprecision::numerator(dc) / boost::multiprecision::denominator(dc);
          Rat frac = dc - Rat(q);
          if (frac < 0) {
            q -= 1;
            frac += 1;
          }
          if (frac > Rat(1, 2) || (frac == Rat(1, 2) && (q & 1) != 0)) q += 1;
          acc = round_rat(Rat(q) / m.grid, false);
          if (acc == 0) acc = 0.0f;
        }
        const float want = acc * alpha;
        ASSERT_EQ(std::bit_cast<uint32_t>(C[i * N + j]), std::bit_cast<uint32_t>(want)) << i << "," << j;
      }
  }
}

TEST(GroupedGemm, FastMatchesReferenceBitForBit) {
  parallel_min_work() = 0;  // every loop threaded
  struct Case {
    int64_t M, N, K;
    GemmModel m;
    double outlier;
    const char* scale;
  };
  const std::vector<Case> cases = {
      {37, 45, 200, {GemmModel::Kind::grouped, 64, Round::rne, Round::rtz, 1024}, 1.0, "ue5m3"},
      {130, 260, 96, {GemmModel::Kind::grouped, 64, Round::rne, Round::rtz, 1024}, 1e4, "ue5m3"},
      {33, 20, 48, {GemmModel::Kind::grouped, 64, Round::rne, Round::rne, 0}, 1.0, "ue4m3"},  // K < G
      {24, 19, 160, {GemmModel::Kind::grouped, 16, Round::rtz, Round::rtz, 1024}, 1e30, "ue8m0"},
      {17, 31, 150, {GemmModel::Kind::grouped, 5, Round::rne, Round::rtz, 7}, 1e6, "ue8m0"},
  };
  GroupedGemmPaths& paths = grouped_gemm_paths();
  uint64_t f32_group = 0, f32_split = 0, f64 = 0;
  for (const auto& c : cases) {
    SCOPED_TRACE(testing::Message() << c.M << "x" << c.N << "x" << c.K << " G=" << c.m.group << " " << c.scale);
    paths.zero();
    float ta = 1, tb = 1;
    QuantSpec sa = nvfp4_like(1, 16, c.scale), sb = nvfp4_like(16, 16, c.scale);
    if (std::string(c.scale) == "ue8m0") {
      sa.rule = sb.rule = ScaleRule::mx_floor;
      sa.amax_kind = sb.amax_kind = AmaxKind::none;
    }
    const auto A = encoded(sa, c.M, c.K, 3, &ta, c.outlier);
    const auto B = encoded(sb, c.N, c.K, 4, &tb);
    const float alpha = tensor_decode_alpha(ta, tb);
    std::vector<float> ref(c.M * c.N), fast(c.M * c.N), fast1(c.M * c.N);
    grouped_gemm_ref(ref.data(), A.data(), B.data(), c.M, c.N, c.K, c.m, alpha);
    grouped_gemm(fast.data(), A.data(), B.data(), c.M, c.N, c.K, c.m, alpha);
    expect_same(fast, ref, "fast vs ref");
    omp_set_num_threads(1);
    grouped_gemm(fast1.data(), A.data(), B.data(), c.M, c.N, c.K, c.m, alpha);
    omp_set_num_threads(omp_get_num_procs());
    expect_same(fast1, ref, "one thread vs ref");
    std::printf("paths: f32 group %llu, f32 sub-blocks %llu, f64 %llu\n", static_cast<unsigned long long>(paths.f32_group.load()),
                static_cast<unsigned long long>(paths.f32_split.load()), static_cast<unsigned long long>(paths.f64.load()));
    f32_group += paths.f32_group;
    f32_split += paths.f32_split;
    f64 += paths.f64;
  }
  // The cases drive every path of the fast implementation.
  EXPECT_GT(f32_group, 0u);
  EXPECT_GT(f32_split, 0u);
  EXPECT_GT(f64, 0u);
  parallel_min_work() = int64_t{1} << 15;
}

TEST(GroupedGemm, ExtremeSpreadsAndSpecialsTakeTheExactPath) {
  // Groups whose products span far more than 53 bits (the double GEMM would
  // round), non-finite operands, and all-zero rows.
  const int64_t M = 6, N = 5, K = 70;
  std::vector<double> A(M * K), B(N * K);
  std::mt19937_64 g(5);
  for (auto& v : A) v = random_double(g, -3, 3);
  for (auto& v : B) v = random_double(g, -3, 3);
  A[0 * K + 3] = std::ldexp(1.0, 90);
  A[0 * K + 4] = std::ldexp(1.0, -90);
  A[1 * K + 10] = std::ldexp(1.5, -1000);
  A[2 * K + 65] = INFINITY;
  B[3 * K + 65] = 0.0;
  A[3 * K + 1] = std::nan("");
  for (int64_t k = 0; k < K; ++k) A[4 * K + k] = (k & 1) ? -0.0 : 0.0;
  B[1 * K + 2] = -INFINITY;
  for (const GemmModel m : {GemmModel{GemmModel::Kind::grouped, 64, Round::rne, Round::rtz, 1024},
                            GemmModel{GemmModel::Kind::grouped, 16, Round::rtz, Round::rne, 0}}) {
    std::vector<float> ref(M * N), fast(M * N);
    grouped_gemm_ref(ref.data(), A.data(), B.data(), M, N, K, m, 0.75f);
    grouped_gemm(fast.data(), A.data(), B.data(), M, N, K, m, 0.75f);
    for (size_t i = 0; i < ref.size(); ++i)
      ASSERT_EQ(std::bit_cast<uint32_t>(fast[i]), std::bit_cast<uint32_t>(ref[i])) << i << ": " << fast[i] << " vs " << ref[i];
    EXPECT_TRUE(std::isnan(ref[3 * N + 0]));
    EXPECT_TRUE(std::isnan(ref[2 * N + 3]));  // Inf x 0
    EXPECT_EQ(std::bit_cast<uint32_t>(ref[4 * N + 0]), 0u);  // +0
  }
}

TEST(GroupedGemm, FloatPathAccumulatorOverflowAndCancellation) {
  // Narrow operands near 2^60: every group fits the float32 path, the group
  // sums reach ~2^124 and their accumulation overflows (RTZ: ±FLT_MAX,
  // RNE: ±Inf) or cancels, in vector lanes and the scalar tail (N = 13).
  const int64_t M = 5, N = 13, K = 256;
  std::vector<double> A(M * K), B(N * K);
  std::mt19937 g(9);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t k = 0; k < K; ++k) A[i * K + k] = std::ldexp((g() & 1) ? 1.5 : 1.0, 60) * (i == 1 ? -1 : 1);
  for (int64_t j = 0; j < N; ++j)
    for (int64_t k = 0; k < K; ++k) {
      const double sign = j % 3 == 2 ? ((k / 16) % 2 ? -1.0 : 1.0) : 1.0;  // every third column cancels group by group
      B[j * K + k] = sign * std::ldexp((g() & 1) ? 1.25 : 1.0, 60 - (j % 5));
    }
  for (const Round acc : {Round::rtz, Round::rne}) {
    const GemmModel m{GemmModel::Kind::grouped, 16, Round::rne, acc, 0};
    std::vector<float> ref(M * N), fast(M * N);
    grouped_gemm_paths().zero();
    grouped_gemm_ref(ref.data(), A.data(), B.data(), M, N, K, m, 1.0f);
    grouped_gemm(fast.data(), A.data(), B.data(), M, N, K, m, 1.0f);
    EXPECT_EQ(grouped_gemm_paths().f32_group, static_cast<uint64_t>(K / 16));
    for (size_t i = 0; i < ref.size(); ++i)
      ASSERT_EQ(std::bit_cast<uint32_t>(fast[i]), std::bit_cast<uint32_t>(ref[i])) << i << ": " << fast[i] << " vs " << ref[i];
    // Overflow in a vector lane (column 0) and in the scalar tail (column 10).
    const float top = acc == Round::rtz ? FLT_MAX : INFINITY;
    EXPECT_EQ(ref[0], top);
    EXPECT_EQ(ref[10], top);
    EXPECT_EQ(ref[1 * N + 0], -top);
  }
}

}  // namespace
}  // namespace exmy::sim::quant

namespace exmy::sim::quant {
namespace {

// Row outer scales: C with alpha = 1, then apply_outer_alpha, equals the
// definition element by element: the 1x1 GEMM of row m of A and row n of B
// with the epilogue's alpha = tensor_decode_alpha(t_a[m], t_b[n]) (an
// operand without row scales: its tensor scale for every row).
TEST(GroupedGemm, OuterAlphaPerRowIsEachElementsOwnEpilogue) {
  const int64_t M = 7, N = 5, K = 80;
  float ta = 1, tb = 1;
  const auto A = encoded(nvfp4_like(1, 16), M, K, 3, &ta, 40.0);
  const auto B = encoded(nvfp4_like(1, 16), N, K, 4, &tb);
  std::vector<float> row_ta(M), row_tb(N);
  for (int64_t i = 0; i < M; ++i) row_ta[i] = std::ldexp(1.5f, static_cast<int>(i) * 7 - 20);
  for (int64_t j = 0; j < N; ++j) row_tb[j] = std::ldexp(1.25f, 30 - static_cast<int>(j) * 9);
  row_ta[2] = FLT_MAX;  // an alpha that underflows
  const GemmModel m{GemmModel::Kind::grouped, 16, Round::rne, Round::rne, 0};
  for (const bool a_rows : {true, false})
    for (const bool b_rows : {true, false}) {
      std::vector<float> C(M * N);
      grouped_gemm(C.data(), A.data(), B.data(), M, N, K, m, 1.0f);
      apply_outer_alpha(C.data(), M, N, ta, a_rows ? row_ta.data() : nullptr, tb, b_rows ? row_tb.data() : nullptr);
      for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < N; ++j) {
          float want = 0;
          const float alpha = tensor_decode_alpha(a_rows ? row_ta[i] : ta, b_rows ? row_tb[j] : tb);
          grouped_gemm_ref(&want, A.data() + i * K, B.data() + j * K, 1, 1, K, m, alpha);
          ASSERT_EQ(std::bit_cast<uint32_t>(C[i * N + j]), std::bit_cast<uint32_t>(want))
              << i << "," << j << " rows " << a_rows << b_rows;
        }
    }
}

}  // namespace
}  // namespace exmy::sim::quant

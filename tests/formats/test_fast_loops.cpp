// The fast path's declared loops (formats/fast/loops.hpp): for every
// rounding mode, block shape, arithmetic and element format below (and with
// four over six, which only the scalar core takes), on every
// vector width this CPU has, the call must be served by the loop the
// declarations give it (every band of it, or the loop the threshold loops
// hand bands with Inf to), that loop's declaration must list the case, and
// the result must equal quantize_ref bit for bit. Widths the CPU lacks are
// reported as skipped.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "formats/fast/loops.hpp"
#include "formats/spec.hpp"
#include "quantize_outcome.hpp"
#include "test_support.hpp"

namespace exmy {
namespace {

using detail::Loop;
using detail::Simd;

// Restores the process's vector width when a test ends.
class WidthScope {
 public:
  WidthScope() : saved_(detail::simd_width()) {}
  ~WidthScope() { detail::set_simd_width(saved_); }

 private:
  Simd saved_;
};

struct Shape {
  int br, bc;
};
const Shape kShapes[] = {{1, 16}, {1, 32}, {16, 16}, {16, 1}, {1, 8}, {8, 8}, {1, 4}, {4, 4}, {1, 12}};
const Simd kWidths[] = {Simd::scalar, Simd::avx2, Simd::avx512};

struct LoopCase {
  const char* elem;
  const char* scale;
};
// FP4 (threshold and fp4x8 loops), wider formats (f64x4), and e2m0, whose
// rne and odd no vector loop takes (its code parity is not its index's).
const LoopCase kLoopCases[] = {{"e2m1", "ue5m3"},
                               {"e2m1", "e4m3"}, {"e2m1", "ue8m0"}, {"e4m3", "ue8m0"}, {"e2m0", "ue8m0"}};

std::string name_of(const QuantSpec& s, Simd w) {
  return std::string(detail::simd_name(w)) + " " + format_name(s.elem) + "/" + format_name(*s.scale) + " " +
         std::to_string(s.block_rows) + "x" + std::to_string(s.block_cols) + " " + test::mode_name(s.round) + " " +
         (s.arith == Arith::exact ? "exact" : "fp32");
}

class FastLoops : public ::testing::TestWithParam<Simd> {};

TEST_P(FastLoops, EachCaseServedByTheLoopThatClaimsItAndEqualToReference) {
  const Simd w = GetParam();
  if (detail::simd_available() < w) GTEST_SKIP() << "this CPU has no " << detail::simd_name(w);
  WidthScope keep;
  ASSERT_EQ(detail::set_simd_width(w), w);
  test::Rng rng(16 + static_cast<uint64_t>(w));
  const int64_t rows = 64,
                cols = 512;  // kThresholdMinElements: the threshold loops take part
  static_assert(64 * 512 >= detail::kThresholdMinElements);
  int compared = 0;
  int by_loop[detail::kLoopKinds] = {};
  for (const LoopCase& cs : kLoopCases) {
    for (const Shape& sh : kShapes) {
      for (const Round mode : test::kAllModes) {
        for (const Arith arith : {Arith::exact, Arith::fp32})
        for (const FourSix four : {FourSix::off, FourSix::mse}) {
          QuantSpec s = test::block_spec(cs.elem, cs.scale, sh.br, sh.bc, mode, arith);
          s.sr_bits = 8;
          s.seed = 5 + static_cast<uint64_t>(compared);
          // Four over six (no loop declares it: the scalar core), on the
          // formats it takes, with one deterministic and one stochastic mode.
          s.four_over_six = four;
          if (four != FourSix::off &&
              (s.elem.max == pow2(s.elem.max_exp) || (mode != Round::rne && mode != Round::stochastic_fastest)))
            continue;
          const QuantPlan p = s.plan();
          const Loop want = detail::choose_loop(p, rows * cols, w);
          const detail::LoopDecl& d = detail::loop_decl(want);
          const std::string what = name_of(s, w) + (four != FourSix::off ? " four-over-six" : "") + " -> " + d.name;
          if (four != FourSix::off) {
            EXPECT_EQ(want, Loop::scalar_core) << what;
          }
          // the loop's declaration lists the case
          if (want != Loop::scalar_core) {
            EXPECT_LE(d.needs, w) << what;
            EXPECT_TRUE(d.modes & detail::mode_bit(mode)) << what;
            EXPECT_TRUE(d.ariths & detail::arith_bit(arith)) << what;
            EXPECT_EQ(sh.bc % d.bc_multiple == 0, !d.bc_other) << what;
          }
          // no earlier row claims it (the first claiming row wins)
          for (int k = 0; k < detail::kLoopCount && detail::kLoops[k].loop != want; ++k)
            EXPECT_FALSE(detail::loop_claims(detail::kLoops[k], p, rows * cols, w)) << what;
          std::vector<float> x(static_cast<size_t>(rows * cols));
          for (float& v : x) v = (rng.coin() ? -1.0f : 1.0f) * rng.float_in(-12, 6);
          const test::Outcome ref = test::run(s, x, rows, cols, 0);
          detail::loop_use_reset();
          const test::Outcome got = test::run(s, x, rows, cols, 2);
          uint64_t use[detail::kLoopKinds];
          detail::loop_use(use);
          for (int k = 0; k < detail::kLoopKinds; ++k)
            EXPECT_EQ(use[k] != 0, k == static_cast<int>(want))
                << what << ": " << use[k] << " bands served by " << detail::loop_decl(static_cast<Loop>(k)).name;
          EXPECT_EQ(test::difference(ref, got, x), "") << what;
          ++by_loop[static_cast<int>(want)];
          ++compared;
        }
      }
    }
  }
  // not vacuous: every loop written for this width has served some case
  // (a narrower loop may be shadowed here by its wider form, as
  // threshold-lanes-x8 is by threshold-lanes-x16: its own width's run
  // checks it)
  for (int k = 0; k < detail::kLoopCount; ++k) {
    if (detail::kLoops[k].needs != w) continue;
    EXPECT_GT(by_loop[static_cast<int>(detail::kLoops[k].loop)], 0) << detail::kLoops[k].name;
  }
  EXPECT_GT(by_loop[static_cast<int>(Loop::scalar_core)], 0);
}

// A band with Inf goes from a threshold loop to its declared band fallback;
// the other bands stay with the threshold loop.
TEST_P(FastLoops, ThresholdLoopsHandBandsWithInfToTheirFallback) {
  const Simd w = GetParam();
  if (detail::simd_available() < w) GTEST_SKIP() << "this CPU has no " << detail::simd_name(w);
  if (w == Simd::scalar) GTEST_SKIP() << "no threshold loop without a vector unit";
  WidthScope keep;
  detail::set_simd_width(w);
  QuantSpec s = test::block_spec("e2m1", "e4m3", 1, 16, Round::rne, Arith::exact);
  s.amax_kind = AmaxKind::given;
  s.amax_value = 100.0;
  const int64_t rows = 128, cols = 512;
  test::Rng rng(7);
  std::vector<float> x(static_cast<size_t>(rows * cols));
  for (float& v : x) v = (rng.coin() ? -1.0f : 1.0f) * rng.float_in(-8, 6);
  x[static_cast<size_t>(3 * cols + 7)] = std::numeric_limits<float>::infinity();
  const Loop want = detail::choose_loop(s.plan(), rows * cols, w);
  ASSERT_TRUE(want == Loop::threshold_x8 || want == Loop::threshold_x16);
  const test::Outcome ref = test::run(s, x, rows, cols, 0);
  detail::loop_use_reset();
  const test::Outcome got = test::run(s, x, rows, cols, 1);
  uint64_t use[detail::kLoopKinds];
  detail::loop_use(use);
  EXPECT_EQ(use[static_cast<int>(detail::loop_decl(want).band_fallback)], 1u);
  EXPECT_EQ(use[static_cast<int>(want)], static_cast<uint64_t>(rows - 1));
  EXPECT_EQ(test::difference(ref, got, x), "");
}

INSTANTIATE_TEST_SUITE_P(Widths, FastLoops, ::testing::ValuesIn(kWidths),
                         [](const ::testing::TestParamInfo<Simd>& i) { return detail::simd_name(i.param); });

// Hand-written expectations, independent of the table's order: the loops
// the benchmark's configurations take on each width.
TEST(FastLoopTable, BenchmarkConfigurations) {
  auto plan = [](const char* elem, const char* scale, int br, int bc, Round r) {
    QuantSpec s = test::block_spec(elem, scale, br, bc, r, Arith::exact);
    s.sr_bits = 8;
    return s.plan();
  };
  const int64_t n = int64_t{1} << 26;
  const QuantPlan nv = plan("e2m1", "ue5m3", 1, 16, Round::rne), col = plan("e2m1", "ue5m3", 16, 1, Round::rne);
  const QuantPlan sr = plan("e2m1", "ue5m3", 1, 16, Round::stochastic_fast),
                  e4 = plan("e4m3", "ue8m0", 1, 32, Round::rne);
  EXPECT_EQ(detail::choose_loop(nv, n, Simd::avx512), Loop::threshold_x16);
  EXPECT_EQ(detail::choose_loop(nv, n, Simd::avx2), Loop::threshold_x8);
  EXPECT_EQ(detail::choose_loop(nv, 1000, Simd::avx2),
            Loop::fp4x8);  // too small for the thresholds' search
  EXPECT_EQ(detail::choose_loop(col, n, Simd::avx512), Loop::threshold_lanes_x16);
  EXPECT_EQ(detail::choose_loop(col, n, Simd::avx2), Loop::threshold_lanes_x8);
  EXPECT_EQ(detail::choose_loop(sr, n, Simd::avx512), Loop::fp4x16);
  EXPECT_EQ(detail::choose_loop(sr, n, Simd::avx2), Loop::fp4x8);
  EXPECT_EQ(detail::choose_loop(e4, n, Simd::avx512), Loop::f64x4);
  for (const QuantPlan& p : {nv, col, sr, e4}) EXPECT_EQ(detail::choose_loop(p, n, Simd::scalar), Loop::scalar_core);
}

// A rounding mode no row lists (as a mode added to Round but not to the
// loops would be) takes the scalar core, never a neighbour's loop.
TEST(FastLoopTable, UnlistedModeTakesTheScalarCore) {
  QuantSpec s;
  s.elem = parse_format("e2m1");
  s.scale = parse_format("ue5m3");
  QuantPlan p = s.plan();
  p.round = static_cast<Round>(15);
  for (const Simd w : kWidths) EXPECT_EQ(detail::choose_loop(p, int64_t{1} << 26, w), Loop::scalar_core);
}

// EXMY_SIMD, when set for the test binary, names a width: a run forced to a
// width this CPU lacks reports it as skipped (the other tests then ran at
// the widest the CPU has).
TEST(FastLoopTable, RequestedWidthIsAvailable) {
  const char* e = std::getenv("EXMY_SIMD");
  if (!e) GTEST_SKIP() << "EXMY_SIMD not set";
  const std::string want(e);
  if (want == "avx512" && detail::simd_available() < Simd::avx512) GTEST_SKIP() << "this CPU has no avx512";
  if (want == "avx2" && detail::simd_available() < Simd::avx2) GTEST_SKIP() << "this CPU has no avx2";
  EXPECT_EQ(std::string(detail::simd_name(detail::simd_width())), want);
}

}  // namespace
}  // namespace exmy

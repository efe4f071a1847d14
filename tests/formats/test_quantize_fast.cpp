// The threaded path against the scalar reference, and the Hadamard transform.
//
// exmy::quantize with 1 and 2 threads must equal exmy::quantize_ref bit for
// bit (values, element codes, scale codes, every statistic, the tensor-level
// info, and the error message when one is thrown) over random tensors and
// random specs: shapes that are and are not multiples of the block, 1xB, Bx1
// and BxB blocks for B in {1, 2, 4, 16, 32}, every scale rule, both
// arithmetics, every rounding mode and several random-bit widths, zero-scale
// zero/one, tensor amax none/auto/given, scale targets, saturation off with
// formats that have Inf/NaN, inputs with -0.0, zeros, float subnormals, huge
// values, +-Inf and NaN, and the RHT on 1x16 and 16x1 blocks.
//
// hadamard16 must equal hadamard16_ref bit for bit (segments with a huge
// exponent spread take the exact accumulator), and both must equal an
// independent rational computation of (1/4) sum_i s_i x_i H_ij rounded once
// to bf16. Errors: NaN without any NaN code, and overflow with saturation
// off and neither Inf nor NaN, throw exmy::Error naming the element.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "exact_ref.hpp"
#include "quantize_outcome.hpp"
#include "formats/error.hpp"
#include "formats/pack.hpp"
#include "formats/quantize.hpp"
#include "formats/spec.hpp"
#include "test_support.hpp"

namespace exmy {
namespace {

using test::hex;

using test::difference;
using test::Outcome;
using test::run;
using test::run_bands;

// ---------------------------------------------------------------------------
// Random specs and tensors
// ---------------------------------------------------------------------------

struct Config {
  QuantSpec spec;
  int64_t rows = 1, cols = 1;
  std::vector<float> x;
  std::string desc;
  bool has_nan = false, has_inf = false;
};

const std::vector<std::string> kElems = {"e2m1", "e2m1", "e2m3", "e3m2", "e4m3", "e4m3", "e5m2", "fp16", "bf16",
                                         "e3m2:nosub", "e2m1:inf", "e4m3:bias=8,nans=0,nonegzero", "ue4m3",
                                         "e5m20", "e0m3", "e2m0", "e3m0"};
const std::vector<std::string> kScales = {"none", "ue8m0", "ue8m0", "ue5m3", "ue5m3", "e4m3", "ue4m3", "bf16",
                                          "ue5m3:nans=0", "e5m2", "e8m0"};
const ScaleRule kRules[] = {ScaleRule::amax_rne, ScaleRule::amax_up,  ScaleRule::amax_down, ScaleRule::mx_floor,
                            ScaleRule::mx_ceil,  ScaleRule::mx_even, ScaleRule::amax_sr};

// A float of the tensor: mostly values spread over a few binades around a
// centre, with zeros of both signs, float subnormals, huge values, and (if
// allowed) Inf and NaN mixed in.
float draw(test::Rng& rng, int centre, int spread, bool inf, bool nan) {
  const double u = rng.uniform();
  const float sign = rng.coin() ? -1.0f : 1.0f;
  if (u < 0.04) return sign * 0.0f;
  if (u < 0.06) return sign * float_of(static_cast<uint32_t>(rng.range(1, 0x7fffff)));  // subnormal
  if (u < 0.07) return sign * FLT_MAX * static_cast<float>(rng.uniform());
  if (inf && u < 0.08) return sign * std::numeric_limits<float>::infinity();
  if (nan && u < 0.09) return std::numeric_limits<float>::quiet_NaN();
  return sign * rng.float_in(centre - spread, centre + spread);
}

Config random_config(test::Rng& rng) {
  Config c;
  QuantSpec& s = c.spec;
  const std::string elem = rng.pick(kElems), scale = rng.pick(kScales);
  s.elem = parse_format(elem);
  if (scale != "none") s.scale = parse_format(scale);
  const int Bs[] = {1, 2, 4, 16, 32};
  const int B = Bs[rng.range(0, 4)];
  switch (rng.range(0, 2)) {
    case 0: s.block_rows = 1, s.block_cols = B; break;
    case 1: s.block_rows = B, s.block_cols = 1; break;
    default: s.block_rows = B, s.block_cols = B; break;
  }
  // sizes around the block: exact multiples, partial edge blocks, single rows/columns
  auto dim = [&](int b) -> int64_t {
    switch (rng.range(0, 3)) {
      case 0: return b * rng.range(1, 3);
      case 1: return rng.range(1, 3 * b + 5);
      case 2: return 1;
      default: return rng.range(1, 70);
    }
  };
  c.rows = dim(s.block_rows);
  c.cols = dim(s.block_cols);
  while (c.rows * c.cols > 6000) c.rows = (c.rows + 1) / 2;
  if ((s.block_rows == 1 && s.block_cols == 16) || (s.block_rows == 16 && s.block_cols == 1)) {
    if (rng.coin(0.7)) {
      s.rht = true;
      if (rng.coin(0.3)) s.rht_signs = static_cast<uint16_t>(rng.u32());
      int64_t& len = s.block_cols == 16 ? c.cols : c.rows;
      len = 16 * rng.range(1, 4);
    }
  }
  s.rule = kRules[rng.range(0, 6)];
  s.arith = rng.coin() ? Arith::exact : Arith::fp32;
  s.round = test::kAllModes[rng.range(0, 8)];
  const int bits[] = {1, 2, 4, 8, 8, 12, 16, 16, 23, 24, 32};
  s.sr_bits = bits[rng.range(0, 10)];
  s.seed = rng.u64();
  s.stream = rng.coin() ? rng.u64() : static_cast<uint64_t>(rng.range(0, 10));
  s.zero_scale = rng.coin(0.3) ? ZeroScale::one : ZeroScale::zero;
  s.saturate = rng.coin(0.8);

  const int centre = static_cast<int>(rng.range(-40, 40)), spread = static_cast<int>(rng.range(0, 30));
  c.has_inf = rng.coin(0.15);
  c.has_nan = rng.coin(0.1);
  c.x.resize(static_cast<size_t>(c.rows * c.cols));
  for (float& v : c.x) v = draw(rng, centre, spread, c.has_inf, c.has_nan);
  // some all-zero or tiny rows: zero blocks and scale underflow
  if (rng.coin(0.3))
    for (int64_t j = 0; j < c.cols; ++j) c.x[static_cast<size_t>(j)] = rng.coin() ? 0.0f : 1e-40f;

  switch (rng.range(0, 2)) {
    case 0: s.amax_kind = AmaxKind::none; break;
    case 1: s.amax_kind = AmaxKind::current; break;
    default:
      s.amax_kind = AmaxKind::given;
      s.amax_value = static_cast<double>(rng.float_in(centre - 10, centre + 10));
  }
  if (rng.coin(0.4)) {
    const double targets[] = {448.0, 2048.0, 1.0, 6.0, static_cast<double>(rng.float_in(-5, 20))};
    s.scale_target = targets[rng.range(0, 4)];
  }
  std::ostringstream d;
  d << c.rows << "x" << c.cols << " elem " << elem << " scale " << scale << " block " << s.block_rows << "x"
    << s.block_cols << " rule " << scale_rule_name(s.rule) << " arith " << (s.arith == Arith::exact ? "exact" : "fp32")
    << " round " << test::mode_name(s.round) << " bits " << s.sr_bits << " seed " << s.seed << " stream " << s.stream
    << " zero-scale " << (s.zero_scale == ZeroScale::one ? "one" : "zero") << " amax "
    << (s.amax_kind == AmaxKind::none ? "none" : s.amax_kind == AmaxKind::current ? "auto" : "given")
    << (s.scale_target ? " target " + std::to_string(*s.scale_target) : std::string())
    << (s.saturate ? "" : " no-saturate") << (s.rht ? " rht" : "");
  c.desc = d.str();
  return c;
}

// Element and scale format by name ("none": no block scale), a br x bc block.
QuantSpec spec_of(const char* elem, const char* scale, int br, int bc) {
  QuantSpec s;
  s.elem = parse_format(elem);
  if (std::string(scale) != "none") s.scale = parse_format(scale);
  s.block_rows = br;
  s.block_cols = bc;
  return s;
}

TEST(QuantizeFast, RandomConfigsMatchReference) {
  test::Rng rng(2024);
  int ok = 0, threw = 0, with_nan = 0, with_inf = 0, rht = 0, stochastic = 0, fp32 = 0, saturated = 0,
      scale_underflow = 0, unsaturated = 0, compared = 0;
  int rules[7] = {};
  int mismatches = 0;
  for (int k = 0; k < 400; ++k) {
    const Config c = random_config(rng);
    const Outcome r = run(c.spec, c.x, c.rows, c.cols, 0);
    bool good = true;
    for (int threads : {1, 2}) {
      const std::string diff = difference(r, run(c.spec, c.x, c.rows, c.cols, threads), c.x);
      if (diff.empty()) continue;
      good = false;
      // the first few in full; the count at the end
      if (++mismatches <= 10)
        ADD_FAILURE() << "config " << k << " (" << c.desc << "), " << threads << " thread(s): " << diff;
    }
    ++compared;
    if (!good) continue;
    if (r.threw) {
      ++threw;
      continue;
    }
    ++ok;
    with_nan += c.has_nan;
    with_inf += c.has_inf;
    rht += c.spec.rht;
    stochastic += is_stochastic(c.spec.round);
    fp32 += c.spec.arith == Arith::fp32;
    saturated += r.stats.saturated > 0;
    scale_underflow += r.stats.scale_underflow > 0;
    unsaturated += !c.spec.saturate;
    if (c.spec.scale) ++rules[static_cast<int>(c.spec.rule)];
  }
  EXPECT_EQ(mismatches, 0) << mismatches << " runs differ from the reference";
  // Not vacuous: most configurations ran, and each feature was exercised.
  EXPECT_GT(ok, compared / 2);
  EXPECT_GT(threw, 5);
  EXPECT_GT(with_nan, 10);
  EXPECT_GT(with_inf, 20);
  EXPECT_GT(rht, 20);
  EXPECT_GT(stochastic, 100);
  EXPECT_GT(fp32, 100);
  EXPECT_GT(saturated, 50);
  EXPECT_GT(scale_underflow, 10);
  EXPECT_GT(unsaturated, 30);
  for (int n : rules) EXPECT_GT(n, 20);
}

// Tensors of a few hundred thousand elements: the fast path's threads take
// runs of bands and make the segment partials of the double sums as they go,
// so these cover many runs, a last run shorter than the others, and more
// threads than cores. The sums must still be the reference's (the segment
// tree of docs/numerics.md §5); abs_max must be max |x| (NaN when x holds a
// NaN).
TEST(QuantizeFast, LargeTensorsMatchReferenceOverManyRuns) {
  test::Rng rng(4242);
  struct Shape {
    const char* elem;
    const char* scale;
    int br, bc;
    int64_t rows, cols;
  };
  const Shape shapes[] = {
      {"e2m1", "ue5m3", 1, 16, 301, 1000},    // 1x16 blocks, partial edge block in every row
      {"e2m1", "ue4m3", 16, 16, 333, 1030},   // 16x16 tiles, partial tiles on both edges
      {"e4m3", "ue8m0", 32, 1, 1000, 290},    // Bx1 blocks: bands of 32 rows
      {"e5m2", "none", 1, 16, 1111, 257},     // no block scale: bands of 64 rows
      {"e2m1", "ue5m3", 1, 16, 3, 70001},     // rows of many sum segments
  };
  for (const Shape& sh : shapes) {
    for (int variant = 0; variant < 3; ++variant) {
      QuantSpec s = spec_of(sh.elem, sh.scale, sh.br, sh.bc);
      s.arith = variant == 1 ? Arith::exact : Arith::fp32;
      s.round = variant == 2 ? Round::stochastic_fast : Round::rne;
      s.seed = 9;
      s.amax_kind = variant == 0 ? AmaxKind::given : AmaxKind::current;
      s.amax_value = 3.0;
      std::vector<float> x(static_cast<size_t>(sh.rows * sh.cols));
      for (float& v : x) v = draw(rng, 0, 6, false, false);
      if (variant == 2) x[x.size() / 2] = std::numeric_limits<float>::quiet_NaN();
      float m = 0;
      for (float v : x) m = std::max(m, std::fabs(v));
      const Outcome r = run(s, x, sh.rows, sh.cols, 0);
      ASSERT_FALSE(r.threw) << r.error;
      for (int threads : {1, 2, 3}) {
        const Outcome f = run(s, x, sh.rows, sh.cols, threads);
        const std::string what = std::string(sh.elem) + "/" + sh.scale + " " + std::to_string(sh.rows) + "x" +
                                 std::to_string(sh.cols) + " variant " + std::to_string(variant) + ", " +
                                 std::to_string(threads) + " thread(s)";
        EXPECT_EQ(difference(r, f, x), "") << what;
        ASSERT_TRUE(f.info.abs_max.has_value()) << what;
        if (variant == 2) EXPECT_TRUE(std::isnan(*f.info.abs_max)) << what;
        else EXPECT_EQ(*f.info.abs_max, static_cast<double>(m)) << what;
      }
    }
  }
}

// BandQuantizer (a tensor streamed in bands of rows) gives the whole-tensor
// call's bits: the random configurations in bands of 1-3 block rows (a last
// band shorter than the others), 1 and 2 threads; and, large enough for the
// threshold loops and rows of several sum segments, 1x16, 16x1, 16x16 and
// mx 1x32 blocks with current, given and no tensor amax, no block scale,
// rne and stochastic rounding, the RHT, conventions, four over six and a
// NaN element.
TEST(QuantizeBands, BandsEqualTheWholeTensorCall) {
  test::Rng rng(1616);
  int compared = 0, threw = 0, several = 0;
  for (int k = 0; k < 400; ++k) {
    const Config c = random_config(rng);
    const int64_t band = c.spec.block_rows * rng.range(1, 3);
    for (int threads : {1, 2}) {
      const Outcome whole = run(c.spec, c.x, c.rows, c.cols, threads);
      Outcome bands = run_bands(c.spec, c.x, c.rows, c.cols, band, threads);
      bands.info = whole.info;
      EXPECT_EQ(difference(whole, bands, c.x), "") << "config " << k << " (" << c.desc << "), bands of " << band
                                                   << " rows, " << threads << " thread(s)";
      ++compared;
      threw += whole.threw;
      several += c.rows > band;
    }
  }
  EXPECT_GT(threw, 5);
  EXPECT_GT(several, compared / 3);

  struct Case {
    const char* elem;
    const char* scale;
    int br, bc;
    AmaxKind amax;
    Round round;
    bool rht;
    FourSix four = FourSix::off;
  };
  const Case cases[] = {
      {"e2m1", "e4m3", 1, 16, AmaxKind::current, Round::rne, false, FourSix::mse},
      {"e2m1", "ue5m3", 16, 16, AmaxKind::given, Round::stochastic, false, FourSix::mae},
      {"e2m1", "ue5m3", 1, 16, AmaxKind::current, Round::rne, false},
      {"e2m1", "ue5m3", 1, 16, AmaxKind::given, Round::stochastic, false},
      {"e2m1", "ue5m3", 1, 16, AmaxKind::current, Round::stochastic_fast, true},
      {"e2m1", "ue4m3", 16, 1, AmaxKind::current, Round::rne, true},
      {"e4m3", "ue8m0", 16, 16, AmaxKind::none, Round::stochastic, false},
      {"e2m1", "ue8m0", 1, 32, AmaxKind::none, Round::rne, false},
      {"e5m2", "none", 1, 16, AmaxKind::current, Round::stochastic_fast, false},
  };
  for (const Case& cs : cases) {
    for (int variant = 0; variant < 3; ++variant) {
      QuantSpec s = spec_of(cs.elem, cs.scale, cs.br, cs.bc);
      if (std::string(cs.scale) == "ue8m0") s.rule = ScaleRule::mx_floor;
      s.amax_kind = cs.amax;
      s.amax_value = 2.5;
      s.round = cs.round;
      s.sr_bits = variant == 1 ? 16 : 8;
      s.seed = 77;
      s.stream = 5;
      s.rht = cs.rht;
      s.four_over_six = cs.four;
      if (variant == 2 && cs.four == FourSix::off) s.codes = CodeConvention::te, s.dequant = DequantOrder::scale_first;
      const int64_t rows = 16 * 5 + (cs.br == 1 ? 5 : 0), cols = 4096 + 64;  // rows of two sum segments
      std::vector<float> x(static_cast<size_t>(rows * cols));
      for (float& v : x) v = draw(rng, 0, 8, false, false);
      for (int64_t j = 0; j < cols; ++j) x[static_cast<size_t>(40 * cols + j)] = 0.0f;  // zero blocks
      if (variant == 1 && !s.elem.has_nan && !(s.scale && s.scale->has_nan))
        x[static_cast<size_t>(67 * cols + 33)] = std::numeric_limits<float>::quiet_NaN();
      const std::string what = std::string(cs.elem) + "/" + cs.scale + " " + std::to_string(cs.br) + "x" +
                               std::to_string(cs.bc) + " variant " + std::to_string(variant);
      for (int threads : {1, 2}) {
        const Outcome whole = run(s, x, rows, cols, threads);
        for (const int64_t band : {int64_t{16}, int64_t{48}, rows}) {
          Outcome bands = run_bands(s, x, rows, cols, band, threads);
          bands.info = whole.info;
          EXPECT_EQ(difference(whole, bands, x), "") << what << ", bands of " << band << ", " << threads << " thread(s)";
        }
      }
    }
  }
}

// Without statistics, threads take runs of consecutive bands, and where a
// band measures its own block maxima (a given tensor amax) the element loop
// prefetches the next band of its run. Runs of several bands, a last run and
// a last band shorter than the others, 1-3 threads: values, codes and scale
// codes must still be the reference's.
TEST(QuantizeFast, RunsOfBandsWithoutStatisticsMatchReference) {
  test::Rng rng(777);
  struct Shape {
    const char* scale;
    int br, bc;
    int64_t rows, cols;
    Arith arith;
  };
  const Shape shapes[] = {
      {"ue5m3", 1, 16, 701, 1000, Arith::exact},   // 1x16, partial edge block in every row
      {"ue8m0", 1, 32, 555, 992, Arith::exact},    // mx-style 1x32
      {"e4m3", 16, 16, 333, 1030, Arith::fp32},    // 16x16 tiles, partial tiles on both edges
      {"ue5m3", 16, 1, 1000, 130, Arith::exact},   // Bx1 blocks: bands of 16 rows
  };
  for (const Shape& sh : shapes) {
    for (const AmaxKind amax : {AmaxKind::given, AmaxKind::current}) {
      QuantSpec s;
      s.elem = parse_format("e2m1");
      s.scale = parse_format(sh.scale);
      s.block_rows = sh.br;
      s.block_cols = sh.bc;
      s.arith = sh.arith;
      s.amax_kind = amax;
      s.amax_value = 5.5;
      if (std::string(sh.scale) == "ue8m0") s.rule = ScaleRule::mx_floor;
      const int64_t n = sh.rows * sh.cols;
      std::vector<float> x(static_cast<size_t>(n));
      for (float& v : x) v = draw(rng, 0, 6, false, false);
      const int64_t nb = block_count(s, sh.rows, sh.cols);
      std::vector<float> want(static_cast<size_t>(n));
      std::vector<uint8_t> want_codes(static_cast<size_t>(n)), want_sc(static_cast<size_t>(nb));
      quantize_ref(s, x.data(), sh.rows, sh.cols, QuantOutput{want.data(), want_codes.data(), want_sc.data(), nullptr});
      for (int threads : {1, 2, 3}) {
        std::vector<float> got(static_cast<size_t>(n), float_of(0xdeadbeefu));
        std::vector<uint8_t> codes(static_cast<size_t>(n), 0xa5), sc(static_cast<size_t>(nb), 0xa5);
        quantize(s, x.data(), sh.rows, sh.cols, QuantOutput{got.data(), codes.data(), sc.data(), nullptr}, threads);
        const std::string what = std::string(sh.scale) + " " + std::to_string(sh.br) + "x" + std::to_string(sh.bc) +
                                 ", " + (amax == AmaxKind::given ? "given" : "current") + " amax, " +
                                 std::to_string(threads) + " thread(s)";
        EXPECT_EQ(std::memcmp(got.data(), want.data(), sizeof(float) * static_cast<size_t>(n)), 0) << what;
        EXPECT_EQ(codes, want_codes) << what;
        EXPECT_EQ(sc, want_sc) << what;
      }
    }
  }
}

// FP4-class payloads take a loop that counts the thresholds |x| reaches
// (found per scale code with the scalar core) instead of computing v = |x| t
// / s. These inputs sit on and within a few float32 ulps of every decision
// point of every block: grid values, midpoints and max, as |x| = v s / t
// from the block's own decode scale (taken from the reference run). Each
// block keeps its largest element, so its scale and the tensor amax do not
// move. Every symmetric mode, both arithmetics, several scale formats,
// targets and block shapes (with partial edge blocks), with statistics; each
// at its own size (below 32 Ki elements: the multiply-and-convert loop) and
// with enough rows to take the threshold loop.
TEST(QuantizeFast, FP4ThresholdLoopAtDecisionPoints) {
  test::Rng rng(5150);
  struct Case {
    const char* elem;
    const char* scale;
    int br, bc;
    int64_t rows, cols;
    double target;  // 0: none
  };
  const Case cases[] = {
      {"e2m1", "ue5m3", 1, 16, 24, 200, 448.0},  {"e2m1", "e4m3", 1, 16, 20, 96, 0.0},
      {"e2m1", "ue8m0", 1, 32, 16, 100, 0.0},    {"e2m1", "e4m3", 16, 16, 40, 72, 0.0},
      {"e1m2", "ue5m3", 1, 16, 12, 64, 2048.0},  {"e2m1", "ue4m3", 1, 8, 16, 60, 6.0},
      {"e2m0", "ue5m3", 1, 16, 10, 48, 0.0},     {"e2m1", "ue5m3", 1, 24, 16, 100, 1.0},
      // widths that are not a multiple of 8: the loop with a block per lane
      {"e2m1", "ue5m3", 16, 1, 48, 83, 448.0},   {"e2m1", "e4m3", 4, 4, 20, 100, 0.0},
      {"e2m1", "ue5m3", 1, 12, 16, 100, 0.0},    {"e1m2", "ue8m0", 32, 1, 40, 64, 0.0},
  };
  const Round modes[] = {Round::rne, Round::rna, Round::rtz, Round::odd};
  int compared = 0, at_points = 0;
  for (const Case& base : cases) {
   for (const bool large : {false, true}) {
    Case cs = base;
    if (large) cs.rows *= (40000 + cs.rows * cs.cols - 1) / (cs.rows * cs.cols);
    for (const Round mode : modes) {
      for (const Arith arith : {Arith::exact, Arith::fp32}) {
        QuantSpec s = test::block_spec(cs.elem, cs.scale, cs.br, cs.bc, mode, arith);
        if (cs.target > 0) s.scale_target = cs.target;
        const std::string what = std::string(cs.elem) + "/" + cs.scale + " " + std::to_string(cs.br) + "x" +
                                 std::to_string(cs.bc) + " " + test::mode_name(mode) +
                                 (arith == Arith::exact ? " exact" : " fp32") + " " + std::to_string(cs.rows) + "x" +
                                 std::to_string(cs.cols);
        // block amaxes spread over many binades, so the scale codes vary
        std::vector<float> x(static_cast<size_t>(cs.rows * cs.cols));
        for (float& v : x) v = draw(rng, 0, 12, false, false);
        const Outcome first = run(s, x, cs.rows, cs.cols, 0);
        ASSERT_FALSE(first.threw) << what << ": " << first.error;
        // the decision points of the element format, in v = |x| t / s
        std::vector<double> pts;
        const Format& fe = s.elem;
        for (uint32_t q = 0; q <= fe.max_mag; ++q) {
          pts.push_back(fe.mag_value(q));
          if (q > 0) pts.push_back((fe.mag_value(q - 1) + fe.mag_value(q)) / 2);
        }
        const int64_t gc = (cs.cols + cs.bc - 1) / cs.bc;
        for (int64_t r = 0; r < cs.rows; ++r) {
          for (int64_t c = 0; c < cs.cols; ++c) {
            const int64_t bi = r / cs.br, bj = c / cs.bc;
            const double sc = s.scale->decode(first.scodes[static_cast<size_t>(bi * gc + bj)]);
            if (!(sc > 0)) continue;
            // keep each block's largest element
            float bmax = 0;
            for (int64_t rr = bi * cs.br; rr < std::min(cs.rows, (bi + 1) * cs.br); ++rr)
              for (int64_t cc = bj * cs.bc; cc < std::min(cs.cols, (bj + 1) * cs.bc); ++cc)
                bmax = std::max(bmax, std::fabs(x[static_cast<size_t>(rr * cs.cols + cc)]));
            float& e = x[static_cast<size_t>(r * cs.cols + c)];
            if (std::fabs(e) == bmax) continue;
            const double v = pts[static_cast<size_t>(rng.range(0, static_cast<int64_t>(pts.size()) - 1))];
            const float at = static_cast<float>(v * sc / first.info.t);
            const int32_t off = static_cast<int32_t>(rng.range(-3, 3));
            const float y = float_of(static_cast<uint32_t>(static_cast<int32_t>(bits_of(at)) + off));
            if (!(y < bmax)) continue;
            e = rng.coin() ? -y : y;
            ++at_points;
          }
        }
        const Outcome r = run(s, x, cs.rows, cs.cols, 0);
        ASSERT_FALSE(r.threw) << what << ": " << r.error;
        ASSERT_EQ(r.scodes, first.scodes) << what << ": moving elements changed a block scale";
        for (int threads : {1, 2}) EXPECT_EQ(difference(r, run(s, x, cs.rows, cs.cols, threads), x), "") << what;
        ++compared;
      }
    }
   }
  }
  EXPECT_EQ(compared, 192);
  EXPECT_GT(at_points, 750000);
}

// The FP4 loops' uncertainty rule in the stochastic modes, whose decisions
// fall on a finer grid than the nearest modes': the h+1 bits below a
// magnitude's lower neighbour (docs/numerics.md, "How the fast CPU path stays
// exact"). Inputs on and within a few float32 ulps of points of that grid in
// every step between neighbouring magnitudes, as in the test above, for each
// stochastic mode, several random-bit widths and both arithmetics: the
// loops (1 and 2 threads) must give the reference's bits.
TEST(QuantizeFast, FP4LoopsAtStochasticDecisionPoints) {
  test::Rng rng(6061);
  struct Case {
    const char* elem;
    const char* scale;
    int br, bc;
    int64_t rows, cols;
    double target;  // 0: none
  };
  const Case cases[] = {
      {"e2m1", "ue5m3", 1, 16, 48, 400, 448.0}, {"e2m1", "e4m3", 1, 16, 20, 96, 0.0},
      {"e2m1", "ue8m0", 1, 32, 16, 100, 0.0},   {"e2m1", "e4m3", 16, 16, 40, 72, 0.0},
      {"e1m2", "ue5m3", 1, 16, 12, 64, 2048.0}, {"e2m1", "ue5m3", 1, 8, 16, 60, 6.0},
  };
  const Round modes[] = {Round::stochastic, Round::stochastic_fast, Round::stochastic_fastest};
  int compared = 0, at_points = 0;
  for (const Case& cs : cases) {
    for (const Round mode : modes) {
      for (const int h : {2, 8, 13, 18}) {  // (a word shared by 4, 2 and 1 elements)
        for (const Arith arith : {Arith::exact, Arith::fp32}) {
          QuantSpec s = test::block_spec(cs.elem, cs.scale, cs.br, cs.bc, mode, arith);
          if (cs.target > 0) s.scale_target = cs.target;
          s.sr_bits = h;
          s.seed = 77;
          s.stream = 3;
          const std::string what = std::string(cs.elem) + "/" + cs.scale + " " + std::to_string(cs.br) + "x" +
                                   std::to_string(cs.bc) + " " + test::mode_name(mode) + " h=" + std::to_string(h) +
                                   (arith == Arith::exact ? " exact" : " fp32");
          std::vector<float> x(static_cast<size_t>(cs.rows * cs.cols));
          // ordinary values over a dozen binades (no huge ones: the scales
          // of the blocks, and so fl(t / s), stay ordinary)
          for (float& v : x) v = (rng.coin() ? -1.0f : 1.0f) * rng.float_in(-6, 6);
          const Outcome first = run(s, x, cs.rows, cs.cols, 0);
          ASSERT_FALSE(first.threw) << what << ": " << first.error;
          const Format& fe = s.elem;
          const int64_t gc = (cs.cols + cs.bc - 1) / cs.bc;
          const double grid = std::ldexp(1.0, h + 1);
          for (int64_t r = 0; r < cs.rows; ++r) {
            for (int64_t c = 0; c < cs.cols; ++c) {
              const int64_t bi = r / cs.br, bj = c / cs.bc;
              const double sc = s.scale->decode(first.scodes[static_cast<size_t>(bi * gc + bj)]);
              if (!(sc > 0)) continue;
              float bmax = 0;  // keep each block's largest element (and so its scale)
              for (int64_t rr = bi * cs.br; rr < std::min(cs.rows, (bi + 1) * cs.br); ++rr)
                for (int64_t cc = bj * cs.bc; cc < std::min(cs.cols, (bj + 1) * cs.bc); ++cc)
                  bmax = std::max(bmax, std::fabs(x[static_cast<size_t>(rr * cs.cols + cc)]));
              float& e = x[static_cast<size_t>(r * cs.cols + c)];
              if (std::fabs(e) == bmax) continue;
              // a point m / 2^(h+1) of the way from magnitude q-1 to q
              const uint32_t q = static_cast<uint32_t>(rng.range(1, static_cast<int64_t>(fe.max_mag)));
              const double lo = fe.mag_value(q - 1), hi = fe.mag_value(q);
              const double m = static_cast<double>(rng.range(0, static_cast<int64_t>(grid)));
              const double v = lo + (hi - lo) * m / grid;
              const float at = static_cast<float>(v * sc / first.info.t);
              const int32_t off = static_cast<int32_t>(rng.range(-3, 3));
              const float y = float_of(static_cast<uint32_t>(static_cast<int32_t>(bits_of(at)) + off));
              if (!(y < bmax) || !(y > 0)) continue;
              e = rng.coin() ? -y : y;
              ++at_points;
            }
          }
          const Outcome ref = run(s, x, cs.rows, cs.cols, 0);
          ASSERT_FALSE(ref.threw) << what << ": " << ref.error;
          ASSERT_EQ(ref.scodes, first.scodes) << what << ": moving elements changed a block scale";
          for (int threads : {1, 2}) EXPECT_EQ(difference(ref, run(s, x, cs.rows, cs.cols, threads), x), "") << what;
          ++compared;
        }
      }
    }
  }
  EXPECT_EQ(compared, 144);
  EXPECT_GT(at_points, 80000);
}

// The UE5M3 paper's element and block format: e2m1 with ue5m3 1x16 scales,
// current tensor amax, scale target 448, rne, exact arithmetic.
QuantSpec ue5m3_1x16() {
  QuantSpec s;
  s.elem = parse_format("e2m1");
  s.scale = parse_format("ue5m3");
  s.block_rows = 1;
  s.block_cols = 16;
  s.amax_kind = AmaxKind::current;
  s.scale_target = 448.0;
  return s;
}

// Tensors big enough for the threshold loop with blocks it leaves to the
// scalar core: all-zero blocks, and blocks so small next to the tensor amax
// that their scale rounds to zero (zero-scale policy zero: encoded as zero
// blocks; one: scale 1), next to ordinary ones, with statistics. 1x16
// blocks, and 16x1 blocks (the loop with a block per lane, where such blocks
// sit in lanes next to ordinary ones).
TEST(QuantizeFast, ThresholdLoopWithZeroScaleBlocks) {
  test::Rng rng(8080);
  int compared = 0, zero_blocks = 0;
  for (const int br : {1, 16}) {
  for (const ZeroScale zs : {ZeroScale::zero, ZeroScale::one}) {
    for (const Arith arith : {Arith::exact, Arith::fp32}) {
      for (const Round mode : {Round::rne, Round::rtz}) {
        QuantSpec s = ue5m3_1x16();
        s.block_rows = br;
        s.block_cols = br == 1 ? 16 : 1;
        s.zero_scale = zs;
        s.arith = arith;
        s.round = mode;
        const int64_t rows = 40, cols = 1024;
        std::vector<float> x(static_cast<size_t>(rows * cols));
        for (float& v : x) v = draw(rng, 0, 8, false, false);
        // what becomes of each block: u < 0.05 all zero, u < 0.10 scale underflow
        const int64_t gr = (rows + s.block_rows - 1) / s.block_rows, gc = cols / s.block_cols;
        std::vector<double> u(static_cast<size_t>(gr * gc));
        for (double& v : u) v = rng.uniform();
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t c = 0; c < cols; ++c) {
            const double ub = u[static_cast<size_t>((r / s.block_rows) * gc + c / s.block_cols)];
            float& v = x[static_cast<size_t>(r * cols + c)];
            if (ub < 0.05) v = rng.coin() ? 0.0f : -0.0f;
            else if (ub < 0.10) v = (rng.coin() ? -1.0f : 1.0f) * 1e-30f * static_cast<float>(rng.uniform());
          }
        }
        const Outcome r = run(s, x, rows, cols, 0);
        ASSERT_FALSE(r.threw) << r.error;
        zero_blocks += static_cast<int>(r.stats.scale_underflow);
        for (int threads : {1, 2})
          EXPECT_EQ(difference(r, run(s, x, rows, cols, threads), x), "")
              << br << (br == 1 ? "x16 " : "x1 ") << (zs == ZeroScale::one ? "zero-scale one " : "zero-scale zero ")
              << (arith == Arith::exact ? "exact " : "fp32 ") << test::mode_name(mode);
        ++compared;
      }
    }
  }
  }
  EXPECT_EQ(compared, 16);
  EXPECT_GT(zero_blocks, 16 * 50);
}

// Bx1 blocks whose scale codes span few values in a band, as Gaussian data
// gives (the 16-lane loop then lays out its thresholds from a palette of the
// band's codes), and spans around the palette's limit of 32 codes: column c
// of band b is scaled by 2^(spread_b * c / cols) for spreads from 0 to 6
// binades (8 UE5M3 or E4M3 codes a binade), so the bands' spans run from a
// few codes to past 32, some bands with blocks of zeros or tiny values among
// them. Where a palette is taken, x-hat comes from two units per block
// wherever the band's tables allow it (band_units checks every entry).
// Compared with the reference bit for bit, statistics included.
TEST(QuantizeFast, BlockPerLaneLoopOverNarrowCodeSpans) {
  test::Rng rng(3141);
  int compared = 0;
  for (const char* scale : {"ue5m3", "e4m3"}) {
    for (const Arith arith : {Arith::exact, Arith::fp32}) {
      for (const Round mode : {Round::rne, Round::rtz, Round::odd}) {
        QuantSpec s = ue5m3_1x16();
        s.scale = parse_format(scale);
        if (s.scale->is_signed) s.scale_target = std::nullopt;
        s.block_rows = 16;
        s.block_cols = 1;
        s.arith = arith;
        s.round = mode;
        const int64_t rows = 16 * 12, cols = 1024;
        const double spreads[] = {0.0, 0.5, 2.0, 3.5, 3.8, 3.9, 4.0, 4.1, 4.3, 6.0, 3.0, 1.0};
        std::vector<float> x(static_cast<size_t>(rows * cols));
        for (int64_t r = 0; r < rows; ++r) {
          const double spread = spreads[r / 16];
          for (int64_t c = 0; c < cols; ++c) {
            // a Gaussian-like magnitude: the sum of four uniforms, centred
            double g = 0.0;
            for (int k = 0; k < 4; ++k) g += rng.uniform();
            float v = static_cast<float>((g - 2.0) * std::exp2(spread * static_cast<double>(c) / cols));
            // bands 10 and 11: some blocks all zero or tiny (zero scale)
            if (r >= 16 * 10 && c % 97 == 3) v = 0.0f;
            if (r >= 16 * 11 && c % 89 == 5) v = 1e-30f * v;
            x[static_cast<size_t>(r * cols + c)] = v;
          }
        }
        const Outcome r = run(s, x, rows, cols, 0);
        ASSERT_FALSE(r.threw) << r.error;
        for (int threads : {1, 2})
          EXPECT_EQ(difference(r, run(s, x, rows, cols, threads), x), "")
              << scale << " " << (arith == Arith::exact ? "exact " : "fp32 ") << test::mode_name(mode);
        ++compared;
      }
    }
  }
  EXPECT_EQ(compared, 12);
  // Zero-scale blocks (policy zero: scale code 0, which the loop leaves to
  // the scalar core) inside a palette's span: a given amax so far above the
  // data that the other blocks' codes are small too (UE5M3 codes 1 .. 31).
  int in_span = 0;
  for (const double amax : {1e6, 3e6, 1e7, 3e7, 1e8}) {
    QuantSpec s = ue5m3_1x16();
    s.block_rows = 16;
    s.block_cols = 1;
    s.amax_kind = AmaxKind::given;
    s.amax_value = amax;
    const int64_t rows = 32, cols = 1024;
    std::vector<float> x(static_cast<size_t>(rows * cols));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c)
        x[static_cast<size_t>(r * cols + c)] =
            c % 7 == 2 ? 0.0f : static_cast<float>((rng.uniform() - 0.5) * std::exp2(2.0 * static_cast<double>(c) / cols));
    const Outcome r = run(s, x, rows, cols, 0);
    ASSERT_FALSE(r.threw) << r.error;
    const uint8_t top = *std::max_element(r.scodes.begin(), r.scodes.end());
    const bool zero_scale = std::count(r.scodes.begin(), r.scodes.end(), 0) > 0;
    in_span += top > 0 && top < 32 && zero_scale;
    for (int threads : {1, 2}) EXPECT_EQ(difference(r, run(s, x, rows, cols, threads), x), "") << "amax " << amax;
  }
  EXPECT_GT(in_span, 0);
}

// Blocks whose width is not a multiple of 8 in the modes outside the
// threshold loop (and in all modes on tensors too small for it): the 8-lane
// loop with a block per lane, each lane gathering its block's multiplier and
// x-hat. Every mode, both arithmetics, three scale formats; rows whose length
// is and is not a multiple of 8 (misaligned random words, a scalar tail);
// all-zero blocks (lanes the loop must leave alone, in the steps and in the
// tail) and blocks of tiny values (scale underflow) among ordinary ones.
TEST(QuantizeFast, BlockPerLaneLoopMatchesReference) {
  test::Rng rng(1611);
  int compared = 0, zero_blocks = 0;
  struct Shape {
    int br, bc;
    int64_t rows, cols;
  };
  // (the second shape has the first's row length: the per-thread cache of
  // each column's block must follow the block width too)
  const Shape shapes[] = {{16, 1, 48, 203}, {1, 3, 8, 203}, {16, 1, 32, 256}, {4, 4, 24, 130},
                          {2, 2, 10, 517},  {1, 4, 12, 1000}, {1, 12, 9, 301}, {3, 1, 13, 77}};
  const char* scales[] = {"ue5m3", "ue8m0", "e4m3"};
  const int bits[] = {8, 16, 23, 4};
  int k = 0;
  for (const Shape& sh : shapes) {
    for (const Round mode : test::kAllModes) {
      for (const Arith arith : {Arith::exact, Arith::fp32}) {
        QuantSpec s = ue5m3_1x16();
        s.scale = parse_format(scales[k % 3]);
        if (k % 3 == 1) s.rule = ScaleRule::mx_floor;
        s.block_rows = sh.br;
        s.block_cols = sh.bc;
        s.arith = arith;
        s.round = mode;
        s.sr_bits = bits[k % 4];
        s.seed = 77 + static_cast<uint64_t>(k);
        s.stream = static_cast<uint64_t>(k % 5);
        ++k;
        std::vector<float> x(static_cast<size_t>(sh.rows * sh.cols));
        for (float& v : x) v = draw(rng, 0, 8, false, false);
        const int64_t gc = (sh.cols + sh.bc - 1) / sh.bc;
        for (int64_t r = 0; r < sh.rows; ++r) {
          for (int64_t c = 0; c < sh.cols; ++c) {
            // the same pseudo-random choice for every element of a block
            const uint64_t blk = static_cast<uint64_t>((r / sh.br) * gc + c / sh.bc);
            const uint64_t h = (blk + 1) * 0x9E3779B97F4A7C15ull >> 58;  // 0..63
            float& v = x[static_cast<size_t>(r * sh.cols + c)];
            if (h < 4) v = rng.coin() ? 0.0f : -0.0f;
            else if (h < 7) v = (rng.coin() ? -1.0f : 1.0f) * 1e-30f * static_cast<float>(rng.uniform());
          }
        }
        const Outcome r = run(s, x, sh.rows, sh.cols, 0);
        ASSERT_FALSE(r.threw) << r.error;
        zero_blocks += static_cast<int>(r.stats.scale_underflow);
        for (int threads : {1, 2})
          EXPECT_EQ(difference(r, run(s, x, sh.rows, sh.cols, threads), x), "")
              << sh.rows << "x" << sh.cols << " block " << sh.br << "x" << sh.bc << " " << scales[(k - 1) % 3] << " "
              << (arith == Arith::exact ? "exact " : "fp32 ") << test::mode_name(mode) << " bits " << s.sr_bits;
        ++compared;
      }
    }
  }
  EXPECT_EQ(compared, 8 * 9 * 2);
  EXPECT_GT(zero_blocks, 8 * 9 * 2 * 4);
}

// The threshold loop's search must find thresholds anywhere in float32: in
// the subnormal range (tiny tensors, or a given amax far above them) and up
// to FLT_MAX, where the saturation threshold can lie past every finite |x|.
TEST(QuantizeFast, ThresholdLoopAtExtremeMagnitudes) {
  test::Rng rng(2718);
  int compared = 0;
  struct Case {
    int lo, hi;   // binades of the elements
    double amax;  // given tensor amax (0: current)
    const char* scale;
  };
  const Case cases[] = {
      {-149, -120, 0.0, "ue5m3"},  {-149, -126, 1.0, "ue5m3"},   {-140, -110, 0.0, "e4m3"},
      {100, 127, 0.0, "ue5m3"},    {110, 127, 1e-10, "ue5m3"},   {-30, 127, 0.0, "e4m3"},
      {-149, 127, 0.0, "ue8m0"},   {120, 127, 0.0, "e4m3"},
  };
  for (const Case& c : cases) {
    for (const Arith arith : {Arith::exact, Arith::fp32}) {
      QuantSpec s = ue5m3_1x16();
      s.scale = parse_format(c.scale);
      s.arith = arith;
      if (c.amax > 0) {
        s.amax_kind = AmaxKind::given;
        s.amax_value = static_cast<double>(static_cast<float>(c.amax));
      }
      const int64_t rows = 36, cols = 1024;
      std::vector<float> x(static_cast<size_t>(rows * cols));
      for (float& v : x) {
        const int e = static_cast<int>(rng.range(c.lo, c.hi));
        const float m = e < -126 ? float_of(static_cast<uint32_t>(rng.range(1, 0x7fffff)))  // float subnormal
                                 : rng.float_in(e, e);
        v = (rng.coin() ? -1.0f : 1.0f) * std::min(m, FLT_MAX);
      }
      const Outcome r = run(s, x, rows, cols, 0);
      ASSERT_FALSE(r.threw) << r.error;
      for (int threads : {1, 2})
        EXPECT_EQ(difference(r, run(s, x, rows, cols, threads), x), "")
            << "binades " << c.lo << ".." << c.hi << " scale " << c.scale << " amax " << c.amax
            << (arith == Arith::exact ? " exact" : " fp32");
      ++compared;
    }
  }
  EXPECT_EQ(compared, 16);
}

// With M = 0 the parity of a code is not the parity of its index inside the
// binade, so ties (rne) and round-to-odd must follow the code: values on
// every tie and between every pair of neighbours, without a block scale and
// in blocks that also hold an Inf (so no FP4 threshold loop takes them).
TEST(QuantizeFast, M0FormatsFollowTheCodeParity) {
  int compared = 0;
  for (const char* elem : {"e2m0", "e3m0", "e4m0"}) {
    for (const Round mode : {Round::rne, Round::odd}) {
      for (const bool scaled : {false, true}) {
        QuantSpec s;
        s.elem = parse_format(elem);
        if (scaled) s.scale = parse_format("ue8m0");
        s.block_rows = 1;
        s.block_cols = 32;
        s.round = mode;
        std::vector<float> x;
        for (int e = -12; e <= 12; ++e)
          for (const float f : {1.0f, 1.25f, 1.5f, 1.75f})
            for (const float sg : {1.0f, -1.0f}) x.push_back(sg * std::ldexp(f, e));
        while (x.size() % 32 != 0) x.push_back(0.5f);
        if (scaled)
          for (size_t b = 0; b < x.size(); b += 32) x[b + 31] = std::numeric_limits<float>::infinity();
        const int64_t cols = 32, rows = static_cast<int64_t>(x.size()) / cols;
        const Outcome r = run(s, x, rows, cols, 0);
        ASSERT_FALSE(r.threw) << r.error;
        for (int threads : {1, 2})
          EXPECT_EQ(difference(r, run(s, x, rows, cols, threads), x), "")
              << elem << " " << test::mode_name(mode) << (scaled ? " ue8m0 1x32" : " no scale");
        ++compared;
      }
    }
  }
  EXPECT_EQ(compared, 12);
}

// Outputs of 64 MiB or more (counting 5 bytes per element) are written with
// non-temporal stores when the values are 16-byte aligned (a whole line per
// store where a step starts one: offset 0; 16-byte pieces at offset 4); the
// result must not change. Also a misaligned value buffer (regular stores), a row
// length that is not a multiple of 4, and 16x1 blocks (the loop with a block
// per lane, rows a multiple of 4 but not of 8). Rounding to nearest takes
// the threshold loop; the stochastic modes the FP4 multiply-and-convert
// loops (streamed by the 16-lane one).
TEST(QuantizeFast, StreamedOutputsMatchReference) {
  test::Rng rng(31337);
  struct Shape {
    int64_t rows, cols;
    size_t offset;  // floats the value buffer starts past a 64-byte boundary
    int br, bc;
    Round mode;
    int sr_bits;
  };
  for (const Shape sh :
       {Shape{3300, 4096, 0, 1, 16, Round::rne, 0}, Shape{3300, 4096, 4, 1, 16, Round::rne, 0},
        Shape{3300, 4096, 1, 1, 16, Round::rne, 0}, Shape{3300, 4096, 4, 16, 1, Round::rne, 0},
        Shape{3300, 4096, 4, 1, 16, Round::stochastic_fast, 8},
        Shape{2690, 5001, 0, 1, 16, Round::rne, 0}, Shape{3300, 4092, 0, 16, 1, Round::rne, 0},
        Shape{3300, 4096, 0, 1, 16, Round::stochastic_fast, 8}, Shape{3300, 4096, 1, 1, 16, Round::stochastic, 16},
        Shape{3300, 4092, 0, 1, 16, Round::stochastic_fast, 8}}) {
    QuantSpec s = ue5m3_1x16();
    s.block_rows = sh.br;
    s.block_cols = sh.bc;
    s.round = sh.mode;
    if (sh.sr_bits) {
      s.sr_bits = sh.sr_bits;
      s.seed = 4242;
      s.stream = 7;
    }
    const int64_t n = sh.rows * sh.cols;
    ASSERT_GE(n * 5, int64_t{64} << 20);
    std::vector<float> x(static_cast<size_t>(n));
    for (float& v : x) v = draw(rng, 0, 6, false, false);
    std::vector<float> want(static_cast<size_t>(n));
    std::vector<uint8_t> want_codes(static_cast<size_t>(n)), want_sc(static_cast<size_t>(block_count(s, sh.rows, sh.cols)));
    quantize_ref(s, x.data(), sh.rows, sh.cols, QuantOutput{want.data(), want_codes.data(), want_sc.data(), nullptr});
    std::vector<float> buf(static_cast<size_t>(n) + 32);
    float* got = buf.data();
    while (reinterpret_cast<uintptr_t>(got) % 64 != 0) ++got;
    got += sh.offset;
    for (int threads : {1, 2}) {
      std::vector<uint8_t> codes(static_cast<size_t>(n), 0xa5), sc(want_sc.size(), 0xa5);
      std::fill(got, got + n, float_of(0xdeadbeefu));
      quantize(s, x.data(), sh.rows, sh.cols, QuantOutput{got, codes.data(), sc.data(), nullptr}, threads);
      const std::string what = std::string(test::mode_name(sh.mode)) + " " + std::to_string(sh.br) + "x" + std::to_string(sh.bc) +
                               " blocks, " +
                               std::to_string(sh.rows) + "x" + std::to_string(sh.cols) + " offset " +
                               std::to_string(sh.offset) + ", " + std::to_string(threads) + " thread(s)";
      EXPECT_EQ(std::memcmp(got, want.data(), sizeof(float) * static_cast<size_t>(n)), 0) << what;
      EXPECT_EQ(codes, want_codes) << what;
      EXPECT_EQ(sc, want_sc) << what;
    }
  }
}

// The packed form decodes to the same values as the reference.
TEST(QuantizeFast, PackedMatchesReference) {
  test::Rng rng(77);
  int checked = 0;
  for (int k = 0; k < 150; ++k) {
    Config c = random_config(rng);
    const Outcome r = run(c.spec, c.x, c.rows, c.cols, 0);
    if (r.threw) continue;
    const PackedTensor p = quantize_packed(c.spec, c.x.data(), c.rows, c.cols, 2);
    const std::vector<float> v = p.dequantize();
    ASSERT_EQ(v.size(), r.values.size());
    for (size_t i = 0; i < v.size(); ++i)
      ASSERT_EQ(bits_of(v[i]), bits_of(r.values[i])) << "config " << k << " (" << c.desc << ") element " << i;
    ++checked;
  }
  EXPECT_GT(checked, 80);
}

// ---------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------

// Every implementation throws exmy::Error with the same message, containing
// each of `tokens`.
void expect_error(const QuantSpec& s, const std::vector<float>& x, int64_t rows, int64_t cols,
                  const std::vector<std::string>& tokens, const std::string& what) {
  const Outcome r = run(s, x, rows, cols, 0);
  ASSERT_TRUE(r.threw) << what << ": the reference did not throw";
  for (const auto& t : tokens) EXPECT_NE(r.error.find(t), std::string::npos) << what << ": '" << r.error << "' lacks '" << t << "'";
  for (int threads : {1, 2}) {
    const Outcome f = run(s, x, rows, cols, threads);
    EXPECT_TRUE(f.threw) << what << ": " << threads << " thread(s) did not throw";
    EXPECT_EQ(f.error, r.error) << what << ": " << threads << " thread(s)";
  }
}

TEST(QuantizeErrors, NaNWithoutNaNCodes) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  QuantSpec s;
  s.elem = parse_format("e2m1");
  expect_error(s, {1.0f, nan, 2.0f}, 1, 3, {"NaN", "(0, 1)"}, "e2m1 without scale");
  s.scale = parse_format("ue5m3:nans=0");
  s.block_cols = 2;
  expect_error(s, {1.0f, 2.0f, 3.0f, nan, 2.0f, nan}, 2, 3, {"NaN", "(1, 0)"}, "e2m1 / ue5m3-nonan");
  // With a NaN code somewhere the block becomes NaN instead.
  s.scale = parse_format("ue8m0");
  const Outcome r = run(s, {1.0f, 2.0f, nan, 4.0f}, 1, 4, 0);
  ASSERT_FALSE(r.threw) << r.error;
  EXPECT_EQ(r.scodes[1], 0xff);
  EXPECT_TRUE(std::isnan(r.values[2]) && std::isnan(r.values[3]));
  EXPECT_EQ(r.values[0], 1.0f);
  s.elem = parse_format("e4m3");
  s.scale.reset();
  const Outcome q = run(s, {1.0f, nan}, 1, 2, 0);
  ASSERT_FALSE(q.threw);
  EXPECT_EQ(q.codes[1] & 0x7f, 0x7f);
}

TEST(QuantizeErrors, OverflowWithoutInfOrNaN) {
  QuantSpec s;
  s.elem = parse_format("e2m1");
  s.saturate = false;
  expect_error(s, {1.0f, 2.0f, 100.0f, 200.0f}, 2, 2, {"(1, 0)", "e2m1"}, "e2m1 no-saturate");
  expect_error(s, {1.0f, std::numeric_limits<float>::infinity()}, 1, 2, {"(0, 1)"}, "e2m1 no-saturate Inf");
  // with a block scale rounded down the scaled elements overflow too
  s.scale = parse_format("ue8m0");
  s.rule = ScaleRule::amax_down;
  s.block_cols = 4;
  expect_error(s, {7.0f, 1.0f, 1.0f, 1.0f}, 1, 4, {"(0, 0)"}, "e2m1/ue8m0 amax-down no-saturate");
  // Inf and NaN codes absorb it; saturation clamps it
  s.scale.reset();
  for (const char* spec : {"e5m2", "e4m3", "e2m1:inf"}) {
    s.elem = parse_format(spec);
    const Outcome r = run(s, {1e6f, -1e6f}, 1, 2, 0);
    ASSERT_FALSE(r.threw) << spec << ": " << r.error;
    EXPECT_TRUE(std::isinf(r.values[0]) || std::isnan(r.values[0])) << spec;
    EXPECT_EQ(r.stats.saturated, 2u) << spec;
  }
  s.elem = parse_format("e2m1");
  s.saturate = true;
  const Outcome r = run(s, {1e6f, -std::numeric_limits<float>::infinity()}, 1, 2, 0);
  ASSERT_FALSE(r.threw);
  EXPECT_EQ(r.values[0], 6.0f);
  EXPECT_EQ(r.values[1], -6.0f);
}

// The first offending element is named the same way by every implementation,
// whatever the block shape: the message must not depend on the walk order.
TEST(QuantizeErrors, FirstOffendingElementIndependentOfBlockOrder) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (int shape = 0; shape < 3; ++shape) {
    QuantSpec s;
    s.elem = parse_format("e2m1");
    s.scale = parse_format("ue5m3:nans=0");
    s.block_rows = shape == 0 ? 2 : shape == 1 ? 2 : 1;
    s.block_cols = shape == 0 ? 2 : shape == 1 ? 1 : 2;
    // 4x4: NaN at (0, 3) and (1, 0); (0, 3) is first in row-major order,
    // (1, 0) lies in an earlier block for the 2x2 and 2x1 shapes.
    std::vector<float> x(16, 1.0f);
    x[3] = nan;
    x[4] = nan;
    const std::string what = "block " + std::to_string(s.block_rows) + "x" + std::to_string(s.block_cols);
    expect_error(s, x, 4, 4, {"NaN"}, what + " NaN");
    // the same with overflow: saturation off, an amax-down ue8m0 scale, so
    // that a block holding 7 gets scale 1 and 7 overflows e2m1 (the 1.5s
    // alone get scale 0.25 and encode exactly)
    s.scale = parse_format("ue8m0");
    s.rule = ScaleRule::amax_down;
    s.saturate = false;
    std::vector<float> y(16, 1.5f);
    y[3] = 7.0f;
    y[4] = 7.0f;
    expect_error(s, y, 4, 4, {"overflows"}, what + " overflow");
  }
}

// ---------------------------------------------------------------------------
// Hadamard transform
// ---------------------------------------------------------------------------

// One 16-element segment of a given kind.
void fill_segment(test::Rng& rng, float* seg, int kind) {
  for (int i = 0; i < 16; ++i) {
    switch (kind) {
      case 0: seg[i] = (rng.coin() ? -1.0f : 1.0f) * rng.float_in(-3, 3); break;           // ordinary
      case 1: seg[i] = (rng.coin() ? -1.0f : 1.0f) * rng.float_in(-100, 100); break;       // huge spread
      case 2: seg[i] = rng.coin() ? -0.0f : 0.0f; break;                                    // zeros
      case 3: seg[i] = (i % 2 ? 1e30f : -3e-38f) * (rng.coin() ? 1.0f : -1.0f); break;     // spread > 48 binades
      case 4: seg[i] = float_of(static_cast<uint32_t>(rng.range(0, 0x7fffff)) | (rng.coin() ? 0x80000000u : 0u)); break;
      case 5: seg[i] = (rng.coin() ? -1.0f : 1.0f) * rng.float_in(120, 127); break;        // near FLT_MAX: bf16 overflow
      case 6: seg[i] = static_cast<float>(rng.range(-3, 3)); break;                         // cancellations to 0
      default: seg[i] = i == 5 ? (rng.coin() ? std::numeric_limits<float>::infinity() : std::numeric_limits<float>::quiet_NaN())
                               : rng.float_in(-3, 3);
    }
  }
}

TEST(Hadamard, FastEqualsReference) {
  test::Rng rng(5);
  int segments = 0, exact_path = 0;
  for (int t = 0; t < 60; ++t) {
    const int axis = t % 2;
    const int64_t rows = axis == 1 ? rng.range(1, 9) : 16 * rng.range(1, 3);
    const int64_t cols = axis == 1 ? 16 * rng.range(1, 3) : rng.range(1, 9);
    std::vector<float> x(static_cast<size_t>(rows * cols));
    // fill segment by segment along the axis
    const int64_t nseg = rows * cols / 16;
    for (int64_t sidx = 0; sidx < nseg; ++sidx) {
      float seg[16];
      const int kind = static_cast<int>(rng.range(0, 7));
      fill_segment(rng, seg, kind);
      exact_path += kind == 1 || kind == 3;
      for (int i = 0; i < 16; ++i) {
        const int64_t idx = axis == 1 ? sidx * 16 + i : ((sidx / cols) * 16 + i) * cols + (sidx % cols);
        x[static_cast<size_t>(idx)] = seg[i];
      }
      ++segments;
    }
    const uint16_t signs = t % 3 == 0 ? 0xD7E8 : static_cast<uint16_t>(rng.u32());
    std::vector<float> a = x, b = x, c = x;
    hadamard16_ref(a.data(), rows, cols, axis, signs);
    hadamard16(b.data(), rows, cols, axis, signs, 1);
    hadamard16(c.data(), rows, cols, axis, signs, 2);
    for (size_t i = 0; i < x.size(); ++i) {
      const bool nan = std::isnan(a[i]);
      // NaN results: any NaN, compared by class (NaN payloads are not specified)
      EXPECT_TRUE(nan ? std::isnan(b[i]) : bits_of(b[i]) == bits_of(a[i]))
          << "axis " << axis << " element " << i << ": fast " << hex(b[i]) << ", reference " << hex(a[i]);
      EXPECT_TRUE(nan ? std::isnan(c[i]) : bits_of(c[i]) == bits_of(a[i]))
          << "axis " << axis << " element " << i << " (2 threads): fast " << hex(c[i]) << ", reference " << hex(a[i]);
    }
  }
  EXPECT_GT(segments, 300);
  EXPECT_GT(exact_path, 40);
}

// The transform against exact rational arithmetic: x'_j = 1/4 sum_i s_i x_i
// H_ij, rounded once to bf16 with rne (overflow to Inf: bf16 has it), by the
// reference of exact_ref.hpp.
TEST(Hadamard, MatchesRationalComputation) {
  const Format bf16 = parse_format("bf16");
  const ref::Table t(bf16);
  test::Rng rng(8);
  int checked = 0, nonzero = 0, inexact = 0;
  for (int k = 0; k < 300; ++k) {
    float seg[16];
    const int kind = static_cast<int>(rng.range(0, 6));  // finite kinds only
    fill_segment(rng, seg, kind);
    const uint16_t signs = k % 2 ? 0xD7E8 : static_cast<uint16_t>(rng.u32());
    float out[16], out_fast[16];
    std::copy(seg, seg + 16, out);
    std::copy(seg, seg + 16, out_fast);
    hadamard16_ref(out, 1, 16, 1, signs);
    hadamard16(out_fast, 1, 16, 1, signs, 1);
    for (int j = 0; j < 16; ++j) {
      ref::Rat sum = 0;
      for (int i = 0; i < 16; ++i) {
        const bool neg = (((signs >> i) & 1) != 0) != ((__builtin_popcount(static_cast<unsigned>(i & j)) & 1) != 0);
        const ref::Rat term = ref::exact(static_cast<double>(seg[i]));
        sum += neg ? ref::Rat(-term) : term;
      }
      sum /= 4;
      const bool neg = sum < 0;
      const ref::Located l(t, neg, neg ? ref::Rat(-sum) : sum);
      const ref::Result want = ref::encode(t, l, ref::Mode::rne, 0, 0, /*saturate=*/false);
      const uint32_t want_bits = want.code << 16;
      for (const float* got : {out, out_fast}) {
        const uint32_t gb = bits_of(got[j]);
        // an exact zero sum has no sign of its own: either zero is accepted here
        const bool ok = sum == 0 ? (gb & 0x7fffffffu) == 0 : gb == want_bits;
        EXPECT_TRUE(ok) << "segment " << k << " (kind " << kind << ") output " << j << ": " << hex(got[j])
                        << ", exact rounding " << hex(float_of(want_bits)) << " of " << ref::str(sum);
      }
      ++checked;
      nonzero += sum != 0;
      inexact += !l.past() && l.delta() != 0;
    }
  }
  EXPECT_GT(checked, 4000);
  EXPECT_GT(nonzero, 3000);
  EXPECT_GT(inexact, 1000);
}

// Exact zero sums: the sign must at least be the same in both implementations
// (docs/numerics.md: every backend produces the same bits).
TEST(Hadamard, ZeroSegmentsSameSignInBothPaths) {
  int checked = 0;
  for (uint32_t signs : {0x0000u, 0xD7E8u, 0xFFFFu, 0x0001u}) {
    for (float z : {0.0f, -0.0f}) {
      float a[16], b[16];
      for (int i = 0; i < 16; ++i) a[i] = b[i] = (i % 3 == 0) ? -z : z;
      hadamard16_ref(a, 1, 16, 1, static_cast<uint16_t>(signs));
      hadamard16(b, 1, 16, 1, static_cast<uint16_t>(signs), 1);
      for (int j = 0; j < 16; ++j) {
        EXPECT_EQ(bits_of(b[j]), bits_of(a[j])) << "signs " << test::hexcode(signs) << " zero " << hex(z)
                                                << " output " << j;
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, 128);
  // and through quantization with the RHT: zero inputs, zero outputs of the
  // same sign in quantize and quantize_ref
  QuantSpec s;
  s.elem = parse_format("e2m1");
  s.scale = parse_format("ue8m0");
  s.rht = true;
  for (uint16_t signs : {uint16_t{0}, uint16_t{0xD7E8}}) {
    s.rht_signs = signs;
    for (float z : {0.0f, -0.0f}) {
      const std::vector<float> x(32, z);
      const std::string diff = difference(run(s, x, 2, 16, 0), run(s, x, 2, 16, 1), x);
      EXPECT_TRUE(diff.empty()) << "RHT signs " << test::hexcode(signs) << " of " << hex(z) << ": " << diff;
    }
  }
}

}  // namespace
}  // namespace exmy

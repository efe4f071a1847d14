// Row outer scales (outer_scale = row, docs/numerics.md §3): one encode
// scale t_r per row, from the row's own reference amax. By the definition, a
// deterministic call is its rows quantized one at a time as tensors of one
// row with a tensor scale from the same reference; the reference path is
// checked against that, and the fast path (every vector width this CPU has,
// 1 and 2 threads, bands) against the reference bit for bit in every mode.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "formats/error.hpp"
#include "formats/fast/loops.hpp"
#include "formats/quantize.hpp"
#include "formats/spec.hpp"
#include "formats/vocab.hpp"
#include "quantize_outcome.hpp"
#include "test_support.hpp"

namespace exmy {
namespace {

// Rows whose magnitudes differ by up to 2^±20 (a tensor scale would leave
// the small rows in the scale format's underflow), a zero row and a row with
// one huge element.
std::vector<float> spread_rows(test::Rng& rng, int64_t rows, int64_t cols) {
  std::vector<float> x(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    const int e = static_cast<int>(rng.range(-20, 20));
    for (int64_t c = 0; c < cols; ++c)
      x[static_cast<size_t>(r * cols + c)] =
          r == 3 ? 0.0f : std::ldexp(static_cast<float>(rng.uniform() * 2 - 1), e) * (c % 7 == 0 && r == 5 ? 1e6f : 1.0f);
  }
  return x;
}

QuantSpec row_spec(const char* elem, const char* scale, const char* block, Round mode, Arith arith) {
  QuantSpec s;
  s.elem = parse_format(elem);
  if (scale) s.scale = parse_format(scale);
  parse_block(block, s.block_rows, s.block_cols);
  s.round = mode;
  s.arith = arith;
  s.amax_kind = AmaxKind::current;
  s.outer = OuterScale::row;
  return s;
}

TEST(RowScales, EachRowIsItsOwnTensorCall) {
  test::Rng rng(4141);
  struct Case {
    const char *elem, *scale, *block;
    Arith arith;
    ScaleRule rule;
  };
  const Case cases[] = {{"e2m1", "ue5m3", "1x16", Arith::exact, ScaleRule::amax_rne},
                        {"e2m1", "e4m3", "1x16", Arith::fp32, ScaleRule::amax_rne},
                        {"e2m1", "ue8m0", "1x32", Arith::exact, ScaleRule::mx_floor},
                        {"e4m3", "ue8m0", "1x32", Arith::exact, ScaleRule::amax_up},
                        {"e4m3", nullptr, "1x16", Arith::exact, ScaleRule::amax_rne}};
  for (const Case& k : cases)
    for (const Round mode : {Round::rne, Round::rtz}) {
      QuantSpec s = row_spec(k.elem, k.scale, k.block, mode, k.arith);
      s.rule = k.rule;
      const int64_t rows = 9, cols = 70;  // a partial last block
      const std::vector<float> x = spread_rows(rng, rows, cols);
      const test::Outcome got = test::run(s, x, rows, cols, 0);
      ASSERT_FALSE(got.threw) << got.error;
      QuantSpec one = s;
      one.outer = OuterScale::tensor;
      const std::string what = std::string(k.elem) + "/" + (k.scale ? k.scale : "none") + " " + k.block;
      QuantStats sum;
      int64_t blk = 0;
      const int sb = s.scale ? s.scale->code_bytes() : 1;
      for (int64_t r = 0; r < rows; ++r) {
        const std::vector<float> row(x.begin() + r * cols, x.begin() + (r + 1) * cols);
        const test::Outcome want = test::run(one, row, 1, cols, 0);
        ASSERT_FALSE(want.threw) << want.error;
        for (int64_t c = 0; c < cols; ++c) {
          const size_t i = static_cast<size_t>(r * cols + c);
          ASSERT_EQ(bits_of(got.values[i]), bits_of(want.values[static_cast<size_t>(c)])) << what << " (" << r << ", " << c << ")";
          ASSERT_EQ(got.codes[i], want.codes[static_cast<size_t>(c)]) << what << " (" << r << ", " << c << ")";
        }
        for (size_t b = 0; b < want.scodes.size(); ++b)
          ASSERT_EQ(got.scodes[static_cast<size_t>(blk * sb) + b], want.scodes[b]) << what << " row " << r;
        blk += static_cast<int64_t>(want.scodes.size()) / sb;
        EXPECT_EQ(bits_of(got.info.row_t[static_cast<size_t>(r)]), bits_of(want.info.t)) << what << " row " << r;
        EXPECT_EQ(bits_of(got.info.row_amax[static_cast<size_t>(r)]), bits_of(want.info.amax)) << what << " row " << r;
        sum.add_counts(want.stats);
      }
      QuantStats counts = got.stats;
      counts.sum_sq = counts.sum_sq_err = counts.sum_err = counts.sum_abs = 0;
      EXPECT_EQ(counts, sum) << what;
      // the zero row has no reference (t = 1); the call's summary is the
      // largest reference and the smallest scale
      EXPECT_EQ(got.info.row_t[3], 1.0f);
      double amax = 0;
      float t = std::numeric_limits<float>::max();
      for (int64_t r = 0; r < rows; ++r) {
        amax = std::max(amax, got.info.row_amax[static_cast<size_t>(r)]);
        t = std::min(t, got.info.row_t[static_cast<size_t>(r)]);
      }
      EXPECT_EQ(got.info.amax, amax);
      EXPECT_EQ(got.info.t, t);
      // and it differs from one tensor scale
      QuantSpec whole = s;
      whole.outer = OuterScale::tensor;
      EXPECT_NE(test::run(whole, x, rows, cols, 0).values, got.values) << what;
    }
}

// A held (given) reference per row: row r's scale is the tensor scale of
// reference row_amax[r]; NaN and 0 mean no scale for the row.
TEST(RowScales, GivenReferencesPerRow) {
  test::Rng rng(4242);
  QuantSpec s = row_spec("e2m1", "ue5m3", "1x16", Round::rne, Arith::exact);
  const int64_t rows = 6, cols = 48;
  const std::vector<float> x = spread_rows(rng, rows, cols);
  s.amax_kind = AmaxKind::given;
  s.row_amax = {1.0, 0.5, std::nan(""), 0.0, 1e6, 3.25};
  const test::Outcome got = test::run(s, x, rows, cols, 0);
  ASSERT_FALSE(got.threw) << got.error;
  for (int64_t r = 0; r < rows; ++r) {
    QuantSpec one = s;
    one.outer = OuterScale::tensor;
    one.row_amax.clear();
    const double a = s.row_amax[static_cast<size_t>(r)];
    one.amax_value = a;
    one.amax_kind = std::isnan(a) || a == 0 ? AmaxKind::none : AmaxKind::given;
    const std::vector<float> row(x.begin() + r * cols, x.begin() + (r + 1) * cols);
    const test::Outcome want = test::run(one, row, 1, cols, 0);
    ASSERT_FALSE(want.threw) << want.error;
    EXPECT_EQ(bits_of(got.info.row_t[static_cast<size_t>(r)]), bits_of(want.info.t)) << "row " << r;
    for (int64_t c = 0; c < cols; ++c)
      ASSERT_EQ(bits_of(got.values[static_cast<size_t>(r * cols + c)]), bits_of(want.values[static_cast<size_t>(c)]))
          << "row " << r << ", column " << c;
  }
  EXPECT_TRUE(std::isnan(got.info.amax));  // a row without a reference
  for (const int threads : {1, 2}) EXPECT_EQ(test::difference(got, test::run(s, x, rows, cols, threads), x), "");
  // one reference too few
  s.row_amax.pop_back();
  const test::Outcome short_refs = test::run(s, x, rows, cols, 2);
  ASSERT_TRUE(short_refs.threw);
  EXPECT_NE(short_refs.error.find("5 row references for a tensor of 6 rows"), std::string::npos) << short_refs.error;
  EXPECT_EQ(test::difference(test::run(s, x, rows, cols, 0), short_refs, x), "");
}

// Every mode the knobs offer, on every vector width: the fast path, its
// bands and its threads give the reference's bits (values, codes, scale
// codes, statistics, per-row scales).
TEST(RowScales, FastPathEqualsReferenceOnEveryWidth) {
  const detail::Simd saved = detail::simd_width();
  test::Rng rng(4343);
  int compared = 0;
  for (const detail::Simd w : {detail::Simd::scalar, detail::Simd::avx2, detail::Simd::avx512}) {
    if (detail::simd_available() < w) continue;
    detail::set_simd_width(w);
    for (const Round mode : {Round::rne, Round::rtz, Round::stochastic, Round::stochastic_fast, Round::up})
      for (const Arith arith : {Arith::exact, Arith::fp32})
        for (const char* variant : {"plain", "rht", "four-over-six", "amax-sr", "te", "scale-first", "no-scale"}) {
          const std::string v = variant;
          QuantSpec s = row_spec("e2m1", v == "no-scale" ? nullptr : "ue5m3", "1x16", mode, arith);
          if (v == "rht") s.rht = true;
          if (v == "four-over-six") s.four_over_six = FourSix::mse;
          if (v == "amax-sr") s.rule = ScaleRule::amax_sr;
          if (v == "te") s.codes = CodeConvention::te;
          if (v == "scale-first") {
            if (arith != Arith::fp32) continue;
            s.dequant = DequantOrder::scale_first;
          }
          if (v == "no-scale") s.elem = parse_format("e4m3");
          s.seed = 99;
          s.stream = static_cast<uint64_t>(compared);
          // small rows (the 8-lane loops) and rows long enough for the
          // threshold loops (kThresholdMinElements)
          for (const int64_t cols : {int64_t{96}, int64_t{detail::kThresholdMinElements}}) {
            if (cols > 96 && !(v == "plain" && (mode == Round::rne || mode == Round::stochastic))) continue;
            const int64_t rows = cols > 1000 ? 3 : 21;
            std::vector<float> x = spread_rows(rng, rows, cols);
            if (compared % 5 == 0) x[static_cast<size_t>(cols + 17)] = std::numeric_limits<float>::quiet_NaN();
            const test::Outcome ref = test::run(s, x, rows, cols, 0);
            ASSERT_FALSE(ref.threw) << ref.error;
            const std::string what = std::string(detail::simd_name(w)) + " " + test::mode_name(mode) + " " +
                                     (arith == Arith::exact ? "exact " : "fp32 ") + v + " cols " + std::to_string(cols);
            for (const int threads : {1, 2}) {
              const test::Outcome got = test::run(s, x, rows, cols, threads);
              EXPECT_EQ(test::difference(ref, got, x), "") << what << ", " << threads << " threads";
              EXPECT_EQ(got.info.row_t, ref.info.row_t) << what;
              for (size_t r = 0; r < ref.info.row_amax.size(); ++r) {
                EXPECT_EQ(bits_of(got.info.row_amax[r]), bits_of(ref.info.row_amax[r])) << what << " row " << r;
                EXPECT_EQ(bits_of(got.info.row_abs_max[r]), bits_of(ref.info.row_abs_max[r])) << what << " row " << r;
              }
            }
            test::Outcome bands = test::run_bands(s, x, rows, cols, 2, 2);
            bands.info = ref.info;  // a band call decides nothing at tensor level
            EXPECT_EQ(test::difference(ref, bands, x), "") << what << ", bands";
            ++compared;
          }
        }
  }
  detail::set_simd_width(saved);
  EXPECT_GT(compared, 100);
}

TEST(RowScales, KnobAndErrors) {
  QuantSpec s = row_spec("e2m1", "ue5m3", "16x16", Round::rne, Arith::exact);
  try {
    s.validate();
    ADD_FAILURE() << "a 16x16 block with row scales was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--outer-scale row needs blocks along rows (1xB), got 16x16"), std::string::npos)
        << e.what();
  }
  s.block_rows = 1;
  s.amax_kind = AmaxKind::given;
  s.amax_value = 2.0;
  EXPECT_THROW(s.validate(), Error);  // one value for every row: say auto or none
  s.amax_kind = AmaxKind::current;
  EXPECT_NO_THROW(s.validate());
  // the knob reads back, and `exmy quantize` options show it
  QuantSpec t;
  set_knob(t, "outer_scale", "row");
  EXPECT_EQ(t.outer, OuterScale::row);
  EXPECT_EQ(find_quant_knob("outer-scale")->print(t), "row");
  EXPECT_NE(quantize_options(s).find("--outer-scale row"), std::string::npos) << quantize_options(s);
  EXPECT_EQ(quantize_options(QuantSpec{}).find("outer-scale"), std::string::npos);
  EXPECT_THROW(set_knob(t, "outer_scale", "column"), Error);
}

}  // namespace
}  // namespace exmy

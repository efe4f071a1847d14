// Four over six (docs/numerics.md §3, "Four over six"): exmy's per-block
// choice against a `_ref` written here from the definition. The `_ref`
// quantizes every block twice with quantize_ref, the usual scale
// (four_over_six = off) and the 4 scale (always-4), and adds up each
// candidate's error over the block itself, in the block's row-major order,
// from the values those calls stored; the lower error wins, ties keep the
// usual scale. Deterministic modes quantize each block alone (a tensor of
// its own, with the whole tensor's amax given), so every output, every
// count and the sums can be assembled from the chosen calls; stochastic
// modes depend on the element's flat index, so there the two candidates
// are whole-tensor calls and values, codes, scale codes and scale_four are
// compared. The threaded path must give the reference's bits at every
// thread count. (That the fast loops leave these plans to the scalar core
// is part of FastLoops.EachCaseServedByTheLoopThatClaimsItAndEqualToReference.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "formats/error.hpp"
#include "formats/quant_sums.hpp"
#include "formats/quantize.hpp"
#include "formats/spec.hpp"
#include "quantize_outcome.hpp"
#include "test_support.hpp"

namespace exmy {
namespace {

struct Ref {
  test::Outcome out;
  uint64_t ties = 0;  // blocks whose two errors were equal (the usual scale kept)
};

double block_error(FourSix m, const std::vector<float>& x, const std::vector<float>& xh, const std::vector<int64_t>& idx) {
  double e = 0.0;
  for (const int64_t i : idx) {
    const double d = static_cast<double>(xh[static_cast<size_t>(i)]) - static_cast<double>(x[static_cast<size_t>(i)]);
    e += m == FourSix::mse ? d * d : std::fabs(d);
  }
  return e;
}

// The flat indices of block (bi, bj), row-major within the block.
std::vector<int64_t> block_indices(const QuantSpec& s, int64_t rows, int64_t cols, int64_t bi, int64_t bj) {
  std::vector<int64_t> v;
  for (int64_t r = bi * s.block_rows; r < std::min(rows, (bi + 1) * s.block_rows); ++r)
    for (int64_t c = bj * s.block_cols; c < std::min(cols, (bj + 1) * s.block_cols); ++c) v.push_back(r * cols + c);
  return v;
}

// The tensor's reference amax as the call sees it, for the blocks alone.
QuantSpec with_tensor_amax(QuantSpec s, const std::vector<float>& x) {
  if (s.amax_kind == AmaxKind::current) {
    float a = 0.0f;
    for (const float v : x) a = std::max(a, std::fabs(v));
    if (a > 0.0f) {
      s.amax_kind = AmaxKind::given;
      s.amax_value = a;
    } else {
      s.amax_kind = AmaxKind::none;  // A = 0: t = 1, as for none
    }
  }
  return s;
}

// Deterministic modes: every block alone, both ways.
Ref four_over_six_ref(const QuantSpec& spec, const std::vector<float>& x, int64_t rows, int64_t cols) {
  const QuantSpec base = with_tensor_amax(spec, x);
  QuantSpec six = base, four = base;
  six.four_over_six = FourSix::off;
  four.four_over_six = FourSix::always_4;
  Ref ref;
  test::Outcome& o = ref.out;
  const int cb = spec.elem.code_bytes(), sb = spec.scale->code_bytes();
  o.values.assign(static_cast<size_t>(rows * cols), 0.0f);
  o.codes.assign(static_cast<size_t>(rows * cols * cb), 0);
  const int64_t gr = (rows + spec.block_rows - 1) / spec.block_rows, gc = (cols + spec.block_cols - 1) / spec.block_cols;
  o.scodes.assign(static_cast<size_t>(gr * gc * sb), 0);
  QuantStats& st = o.stats;
  for (int64_t bi = 0; bi < gr; ++bi) {
    for (int64_t bj = 0; bj < gc; ++bj) {
      const std::vector<int64_t> idx = block_indices(spec, rows, cols, bi, bj);
      const int64_t br = std::min(rows, (bi + 1) * spec.block_rows) - bi * spec.block_rows;
      const int64_t bc = static_cast<int64_t>(idx.size()) / br;
      std::vector<float> xb;
      for (const int64_t i : idx) xb.push_back(x[static_cast<size_t>(i)]);
      const test::Outcome q6 = test::run(six, xb, br, bc, 0), q4 = test::run(four, xb, br, bc, 0);
      EXPECT_FALSE(q6.threw || q4.threw) << q6.error << q4.error;
      std::vector<int64_t> own(idx.size());
      for (size_t k = 0; k < own.size(); ++k) own[k] = static_cast<int64_t>(k);
      const double e6 = block_error(spec.four_over_six, xb, q6.values, own);
      const double e4 = block_error(spec.four_over_six, xb, q4.values, own);
      const bool pick4 = e4 < e6;
      ref.ties += e4 == e6;
      const test::Outcome& q = pick4 ? q4 : q6;
      for (size_t k = 0; k < idx.size(); ++k) {
        const auto i = static_cast<size_t>(idx[k]);
        o.values[i] = q.values[k];
        for (int b = 0; b < cb; ++b) o.codes[i * cb + b] = q.codes[k * cb + b];
      }
      for (int b = 0; b < sb; ++b) o.scodes[static_cast<size_t>((bi * gc + bj) * sb + b)] = q.scodes[static_cast<size_t>(b)];
      st.elements += q.stats.elements;
      st.nonzero += q.stats.nonzero;
      st.underflow += q.stats.underflow;
      st.saturated += q.stats.saturated;
      st.subnormal += q.stats.subnormal;
      st.blocks += q.stats.blocks;
      st.scale_underflow += q.stats.scale_underflow;
      st.scale_subnormal += q.stats.scale_subnormal;
      st.scale_saturated += q.stats.scale_saturated;
      st.scale_four += pick4;
    }
  }
  // The sums of docs/numerics.md §5 over the assembled values; the
  // tensor-level info does not depend on the choice.
  detail::store_sums(tensor_sums(x.data(), o.values.data(), rows, cols), st);
  QuantSpec whole = spec;
  whole.four_over_six = FourSix::off;
  o.info = test::run(whole, x, rows, cols, 0).info;
  return ref;
}

// Any mode: the two candidates as whole-tensor calls (the same flat
// indices, so the same random bits), chosen block by block.
Ref four_over_six_whole_ref(const QuantSpec& spec, const std::vector<float>& x, int64_t rows, int64_t cols) {
  QuantSpec six = spec, four = spec;
  six.four_over_six = FourSix::off;
  four.four_over_six = FourSix::always_4;
  const test::Outcome q6 = test::run(six, x, rows, cols, 0), q4 = test::run(four, x, rows, cols, 0);
  Ref ref;
  ref.out = q6;
  const int cb = spec.elem.code_bytes(), sb = spec.scale->code_bytes();
  const int64_t gr = (rows + spec.block_rows - 1) / spec.block_rows, gc = (cols + spec.block_cols - 1) / spec.block_cols;
  ref.out.stats.scale_four = 0;
  for (int64_t bi = 0; bi < gr; ++bi) {
    for (int64_t bj = 0; bj < gc; ++bj) {
      const std::vector<int64_t> idx = block_indices(spec, rows, cols, bi, bj);
      const double e6 = block_error(spec.four_over_six, x, q6.values, idx);
      const double e4 = block_error(spec.four_over_six, x, q4.values, idx);
      ref.ties += e4 == e6;
      if (!(e4 < e6)) continue;
      ++ref.out.stats.scale_four;
      for (const int64_t i : idx) {
        ref.out.values[static_cast<size_t>(i)] = q4.values[static_cast<size_t>(i)];
        for (int b = 0; b < cb; ++b) ref.out.codes[static_cast<size_t>(i * cb + b)] = q4.codes[static_cast<size_t>(i * cb + b)];
      }
      for (int b = 0; b < sb; ++b) {
        const auto k = static_cast<size_t>((bi * gc + bj) * sb + b);
        ref.out.scodes[k] = q4.scodes[k];
      }
    }
  }
  return ref;
}

// Activation-like rows: mostly small values, some outliers, zero blocks
// (ties: both errors 0) and runs of one repeated value.
std::vector<float> random_input(test::Rng& rng, int64_t rows, int64_t cols) {
  std::vector<float> x(static_cast<size_t>(rows * cols));
  for (float& v : x) v = (rng.coin() ? -1.0f : 1.0f) * rng.float_in(-10, 3);
  for (int k = 0; k < 6; ++k) x[static_cast<size_t>(rng.range(0, rows * cols - 1))] *= 64.0f;
  const int64_t z0 = rng.range(0, rows * cols - 40);
  for (int64_t i = z0; i < z0 + 40; ++i) x[static_cast<size_t>(i)] = 0.0f;
  const int64_t c0 = rng.range(0, rows * cols - 40);
  for (int64_t i = c0; i < c0 + 40; ++i) x[static_cast<size_t>(i)] = 3.0f;
  return x;
}

struct FourSixShape {
  int br, bc;
};
constexpr FourSixShape kFourSixShapes[] = {{1, 16}, {1, 32}, {16, 1}, {16, 16}, {4, 4}};
const char* const kFourSixScales[] = {"ue8m0", "e4m3", "ue5m3"};

std::string spec_name(const QuantSpec& s) {
  return format_name(s.elem) + "/" + format_name(*s.scale) + " " + std::to_string(s.block_rows) + "x" +
         std::to_string(s.block_cols) + " " + test::mode_name(s.round) + " " +
         (s.arith == Arith::exact ? "exact" : "fp32") + " " + std::string(scale_rule_name(s.rule)) + " measure " +
         std::to_string(static_cast<int>(s.four_over_six));
}

TEST(FourOverSix, EqualsTheBlockwiseRefBitForBit) {
  test::Rng rng(46);
  const int64_t rows = 37, cols = 83;  // partial edge blocks both ways
  uint64_t four = 0, blocks = 0, ties = 0;
  int cases = 0;
  for (const char* scale : kFourSixScales) {
    for (const FourSixShape& sh : kFourSixShapes) {
      for (const FourSix m : {FourSix::mse, FourSix::mae}) {
        for (const Round mode : {Round::rne, Round::rtz, Round::up}) {
          QuantSpec s = test::block_spec("e2m1", scale, sh.br, sh.bc, mode, cases % 2 ? Arith::fp32 : Arith::exact);
          s.four_over_six = m;
          s.rule = cases % 3 == 0 ? ScaleRule::amax_rne : cases % 3 == 1 ? ScaleRule::amax_up : ScaleRule::amax_down;
          s.amax_kind = cases % 4 == 3 ? AmaxKind::none : AmaxKind::current;
          if (std::string(scale) == "e4m3" && cases % 2) s.scale_target = 256.0;  // the paper's E4M3 range
          if (cases % 5 == 4) s.zero_scale = ZeroScale::one;
          const std::vector<float> x = random_input(rng, rows, cols);
          const Ref ref = four_over_six_ref(s, x, rows, cols);
          const test::Outcome got = test::run(s, x, rows, cols, 0);
          const std::string what = spec_name(s);
          EXPECT_EQ(test::difference(ref.out, got, x), "") << what;
          EXPECT_EQ(got.stats.scale_four, ref.out.stats.scale_four) << what;
          for (const int threads : {1, 2, 3, 7})
            EXPECT_EQ(test::difference(got, test::run(s, x, rows, cols, threads), x), "") << what << " " << threads;
          four += got.stats.scale_four;
          blocks += got.stats.blocks;
          ties += ref.ties;
          ++cases;
        }
      }
    }
  }
  // Not vacuous: both choices and ties occurred.
  EXPECT_GT(four, blocks / 10);
  EXPECT_LT(four, blocks);
  EXPECT_GT(ties, 0u);
}

TEST(FourOverSix, StochasticModesEqualTheWholeTensorRef) {
  test::Rng rng(64);
  const int64_t rows = 32, cols = 80;
  uint64_t four = 0;
  for (const char* scale : kFourSixScales) {
    for (const FourSixShape& sh : kFourSixShapes) {
      for (const FourSix m : {FourSix::mse, FourSix::mae}) {
        for (const Round mode : {Round::stochastic, Round::stochastic_fastest}) {
          QuantSpec s = test::block_spec("e2m1", scale, sh.br, sh.bc, mode, Arith::exact);
          s.four_over_six = m;
          s.sr_bits = 8;
          s.seed = rng.u64();
          s.stream = 3;
          s.amax_kind = AmaxKind::current;
          const std::vector<float> x = random_input(rng, rows, cols);
          const Ref ref = four_over_six_whole_ref(s, x, rows, cols);
          const test::Outcome got = test::run(s, x, rows, cols, 0);
          const std::string what = spec_name(s);
          EXPECT_EQ(got.values, ref.out.values) << what;
          EXPECT_EQ(got.codes, ref.out.codes) << what;
          EXPECT_EQ(got.scodes, ref.out.scodes) << what;
          EXPECT_EQ(got.stats.scale_four, ref.out.stats.scale_four) << what;
          for (const int threads : {1, 4})
            EXPECT_EQ(test::difference(got, test::run(s, x, rows, cols, threads), x), "") << what << " " << threads;
          // bands quantized on their own draw their tensor's random bits
          test::Outcome bands = test::run_bands(s, x, rows, cols, 2 * s.block_rows, 2);
          bands.info = got.info;  // a band call decides nothing at tensor level
          EXPECT_EQ(test::difference(got, bands, x), "") << what << ", bands";
          four += got.stats.scale_four;
        }
      }
    }
  }
  EXPECT_GT(four, 0u);
}

// With the knob off nothing changes: scale_four is 0 and the bits are those
// of a spec that never heard of it (the default is off).
TEST(FourOverSix, OffCountsNothing) {
  test::Rng rng(5);
  const std::vector<float> x = random_input(rng, 16, 64);
  QuantSpec s = test::block_spec("e2m1", "e4m3", 1, 16, Round::rne, Arith::exact);
  s.amax_kind = AmaxKind::current;
  const test::Outcome a = test::run(s, x, 16, 64, 0);
  EXPECT_EQ(a.stats.scale_four, 0u);
  QuantSpec four = s;
  four.four_over_six = FourSix::always_4;
  const test::Outcome b = test::run(four, x, 16, 64, 2);
  EXPECT_EQ(b.stats.scale_four, b.stats.blocks);
}

TEST(FourOverSix, RejectedCombinationsAreOneLineErrors) {
  auto error_of = [](const QuantSpec& s) {
    try {
      s.validate();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  QuantSpec s = test::block_spec("e2m1", "e4m3", 1, 16, Round::rne, Arith::exact);
  s.four_over_six = FourSix::mse;
  EXPECT_EQ(error_of(s), "");
  QuantSpec none = s;
  none.scale.reset();
  EXPECT_NE(error_of(none).find("needs a block scale"), std::string::npos);
  QuantSpec mx = s;
  mx.rule = ScaleRule::mx_floor;
  EXPECT_NE(error_of(mx).find("amax-* scale rule"), std::string::npos);
  QuantSpec pow2max = s;
  pow2max.elem = parse_format("e2m0");  // max 4: F4 would be max itself
  EXPECT_NE(error_of(pow2max).find("not a power of two"), std::string::npos) << error_of(pow2max);
  QuantSpec sf = s;
  sf.arith = Arith::fp32;
  sf.dequant = DequantOrder::scale_first;
  EXPECT_NE(error_of(sf).find("scale-first"), std::string::npos);
  for (const QuantSpec& bad : {none, mx, pow2max, sf}) EXPECT_EQ(error_of(bad).find('\n'), std::string::npos);
}

}  // namespace
}  // namespace exmy

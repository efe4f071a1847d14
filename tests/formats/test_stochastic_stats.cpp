// Statistics of stochastic rounding (in the manner of CPFloat's tests): many
// copies of a value between two neighbours, quantized with distinct element
// indices, so that each copy draws its own Philox bits.
//
// Per element the result must be exactly the decision of docs/numerics.md §2
// for that element's r (§4). Over all elements only the two neighbours
// occur, the frequency of rounding away lies within a 5-sigma binomial bound
// of the mode's exact probability at n-bit resolution, and the mean error
// within 5 sigma of its exact expectation; the exact probability itself is
// within the mode's resolution of δ (each mode is unbiased up to n bits).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "exact_ref.hpp"
#include "formats/philox.hpp"
#include "formats/quantize.hpp"
#include "formats/spec.hpp"
#include "test_support.hpp"

namespace exmy {
namespace {

using ref::Int;
using ref::Rat;

// The integers of the stochastic rules of docs/numerics.md §2 for one δ and n, from the
// rational δ directly: rne(δ·2^n), floor(δ·2^(n+1)), floor(δ·2^n).
struct Rule {
  int n;
  uint64_t rne_n, floor_n1, floor_n;
  Rule(const Rat& delta, int bits)
      : n(bits),
        rne_n(static_cast<uint64_t>(ref::rne_nonneg(delta * ref::pow2(bits)))),
        floor_n1(static_cast<uint64_t>(ref::floor_nonneg(delta * ref::pow2(bits + 1)))),
        floor_n(static_cast<uint64_t>(ref::floor_nonneg(delta * ref::pow2(bits)))) {}

  // Does the mode go away with random bits r?
  bool away(Round m, uint64_t r) const {
    const uint64_t two_n = uint64_t{1} << n;
    switch (m) {
      case Round::stochastic: return rne_n + r >= two_n;
      case Round::stochastic_fast: return floor_n1 + 2 * r + 1 >= 2 * two_n;
      case Round::stochastic_fastest: return floor_n + r >= two_n;
      default: return false;
    }
  }

  // The exact probability of going away when r is uniform on [0, 2^n): the
  // number of r that go away, counted one by one, over 2^n.
  double probability(Round m) const {
    const uint64_t two_n = uint64_t{1} << n;
    uint64_t count = 0;
    for (uint64_t r = 0; r < two_n; ++r) count += away(m, r);
    return static_cast<double>(count) / static_cast<double>(two_n);
  }
};

struct Setting {
  const char* elem;
  float value;  // lies strictly between two neighbours of elem
};

TEST(StochasticStats, FrequencyAndBiasWithinBinomialBounds) {
  // δ with many bits at several positions in (0, 1), in two formats, and
  // negative: 1.0375 in e4m3 (δ ~ 0.3), 1.12 (δ ~ 0.96), 1.0009 (δ ~ 0.0072,
  // below 2^-4 so that coarse modes never go away), 0.4137 in e2m1 (δ ~ 0.83
  // between 0 and 0.5), -2.7 in e2m1 (δ ~ 0.7).
  const Setting settings[] = {
      {"e4m3", 1.0375f}, {"e4m3", 1.12f}, {"e4m3", 1.0009f}, {"e2m1", 0.4137f}, {"e2m1", -2.7f},
  };
  constexpr int64_t kN = 20000;
  int both_directions = 0, distinct_modes = 0, cases = 0;
  for (const Setting& st : settings) {
    const Format f = parse_format(st.elem);
    const ref::Table t(f);
    const Rat mag = ref::exact(std::fabs(static_cast<double>(st.value)));
    const ref::Located l(t, st.value < 0, mag);
    ASSERT_FALSE(l.past() || l.below_min());
    ASSERT_TRUE(l.hi_code().has_value());
    const Rat delta = l.delta();
    ASSERT_TRUE(delta > 0 && delta < 1) << st.elem << " " << st.value;
    const double lo = f.decode(l.lo_code()), hi = f.decode(*l.hi_code()), v = std::fabs(static_cast<double>(st.value));
    const double sign = st.value < 0 ? -1.0 : 1.0;
    for (int n : {1, 4, 8, 16}) {
      const Rule rule(delta, n);
      double p_modes[3];
      int mi = 0;
      for (Round m : test::kStochastic) {
        QuantSpec s;
        s.elem = f;
        s.round = m;
        s.sr_bits = n;
        s.seed = 0x1234567u + static_cast<uint64_t>(n);
        s.stream = static_cast<uint64_t>(mi) * 77u;
        const std::vector<float> x(static_cast<size_t>(kN), st.value);
        std::vector<float> out(x.size());
        quantize_ref(s, x.data(), 1, kN, QuantOutput{out.data(), nullptr, nullptr, nullptr});

        const double p = rule.probability(m);
        p_modes[mi++] = p;
        // resolution: |p - δ| <= 2^-(n+1) for the rounding modes, 2^-n for the truncating one
        const double res = m == Round::stochastic_fastest ? std::ldexp(1.0, -n) : std::ldexp(1.0, -n - 1);
        EXPECT_LE(std::fabs(p - ref::to_double(delta)), res) << st.elem << " " << st.value << " n=" << n;

        int64_t away_count = 0, per_element_bad = 0;
        double err_sum = 0;
        for (int64_t i = 0; i < kN; ++i) {
          const double q = out[static_cast<size_t>(i)];
          ASSERT_TRUE(q == sign * lo || q == sign * hi)
              << test::mode_name(m) << " n=" << n << " element " << i << " gave " << test::hex(static_cast<float>(q));
          const bool went_away = q == sign * hi;
          away_count += went_away;
          err_sum += q - static_cast<double>(st.value);
          // exactly the specified decision for this element's own r
          const uint32_t r = random_bits(s.seed, s.stream, static_cast<uint64_t>(i), n);
          per_element_bad += went_away != rule.away(m, r);
        }
        EXPECT_EQ(per_element_bad, 0) << st.elem << " " << st.value << " " << test::mode_name(m) << " n=" << n;

        const double N = static_cast<double>(kN);
        const double sigma = std::sqrt(N * p * (1 - p));
        EXPECT_LE(std::fabs(static_cast<double>(away_count) - N * p), 5 * sigma + (p > 0 && p < 1 ? 1 : 0))
            << st.elem << " " << st.value << " " << test::mode_name(m) << " n=" << n << ": " << away_count
            << " of " << kN << " away, expected p = " << p;
        // mean error: its expectation is sign * ((p - δ)(hi - lo)) exactly
        const double mean_err = err_sum / N;
        const double want_err = sign * (p * (hi - lo) + lo - v);
        const double err_sigma = (hi - lo) * std::sqrt(p * (1 - p) / N);
        EXPECT_LE(std::fabs(mean_err - want_err), 5 * err_sigma + 1e-12)
            << st.elem << " " << st.value << " " << test::mode_name(m) << " n=" << n << ": mean error " << mean_err
            << ", expected " << want_err;
        both_directions += away_count > 0 && away_count < kN;
        ++cases;
      }
      distinct_modes += p_modes[0] != p_modes[2] || p_modes[1] != p_modes[2];
    }
  }
  // Not vacuous: most cases round both ways, and the modes' probabilities
  // differ where n is small.
  EXPECT_GT(both_directions, cases / 2);
  EXPECT_GT(distinct_modes, 3);
}

}  // namespace
}  // namespace exmy

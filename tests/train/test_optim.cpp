// AdamW against hand-computed steps and a double-precision reference, the
// global norm and clipping, and the LR schedules.
#include <gtest/gtest.h>
#include <omp.h>

#include <bit>
#include <cmath>
#include <numbers>
#include <random>

#include "sim/optim.hpp"
#include "sim/parallel.hpp"
#include "tests/train/test_support.hpp"

namespace exmy::sim {
namespace {

// Two views: "w" (decayed, 2 elements) and "norm.weight" (no decay, 1).
ArenaLayout two_views() {
  ArenaLayout L;
  L.add("w", {2}, true);
  L.add("norm.weight", {1}, false);
  return L;
}

TEST(AdamW, MatchesHandComputedSteps) {
  const ArenaLayout L = two_views();
  AdamWConfig c;
  c.beta1 = 0.9;
  c.beta2 = 0.999;
  c.eps = 1e-8;
  c.weight_decay = 0.1;
  AdamW opt(L, c);
  Buf<float> p(static_cast<size_t>(L.size()), 0.0f), g(p.size(), 0.0f);
  const int64_t w = L.get("w").offset, n = L.get("norm.weight").offset;
  p[w] = 1.0f, p[w + 1] = -1.0f, p[n] = 2.0f;
  g[w] = 0.5f, g[w + 1] = -2.0f, g[n] = 0.25f;
  // Step 1: decay p *= 1 - lr*wd = 0.99; m_hat = g and v_hat = g^2, so the
  // update is lr * sign(g) (up to eps): 0.99 - 0.1 = 0.89, -0.99 + 0.1 = -0.89;
  // the no-decay element moves 2 - 0.1 = 1.9.
  opt.step(p, g, 0.1, 1.0);
  EXPECT_NEAR(p[w], 0.89, 2e-7);
  EXPECT_NEAR(p[w + 1], -0.89, 2e-7);
  EXPECT_NEAR(p[n], 1.9, 2e-7);
  // Step 2 with the same gradient: m_hat = g and v_hat = g^2 again (the bias
  // corrections undo the moments exactly), so 0.89 * 0.99 - 0.1 = 0.7811.
  opt.step(p, g, 0.1, 1.0);
  EXPECT_NEAR(p[w], 0.7811, 3e-7);
  EXPECT_NEAR(p[w + 1], -0.7811, 3e-7);
  EXPECT_NEAR(p[n], 1.8, 3e-7);
  EXPECT_EQ(opt.steps(), 2);
  // Moments after two steps of g = 0.5: m = 0.095, v = 0.00049975.
  EXPECT_NEAR(opt.exp_avg()[static_cast<size_t>(w)], 0.095, 1e-8);
  EXPECT_NEAR(opt.exp_avg_sq()[static_cast<size_t>(w)], 0.00049975, 1e-10);
  // Padding between views stays exactly zero.
  for (int64_t i = w + 2; i < n; ++i) EXPECT_EQ(p[static_cast<size_t>(i)], 0.0f);
}

TEST(AdamW, MatchesDoubleReferenceWithGradScale) {
  ArenaLayout L;
  L.add("a", {7, 5}, true);
  L.add("b.bias", {9}, false);
  L.add("c", {33}, true);
  AdamWConfig c;  // defaults: 0.9, 0.95, 1e-8, 0.1
  AdamW opt(L, c);
  std::mt19937 gen(3);
  std::normal_distribution<double> nd;
  Buf<float> p(static_cast<size_t>(L.size()), 0.0f), g(p.size(), 0.0f);
  std::vector<double> rp(p.size()), rm(p.size(), 0.0), rv(p.size(), 0.0);
  for (const auto& v : L.views())
    for (int64_t i = v.offset; i < v.offset + v.numel; ++i) rp[static_cast<size_t>(i)] = p[static_cast<size_t>(i)] = static_cast<float>(nd(gen));
  const double lrs[3] = {1e-2, 3e-3, 5e-4}, scales[3] = {0.5, 1.0, 0.25};
  for (int t = 1; t <= 3; ++t) {
    for (const auto& v : L.views())
      for (int64_t i = v.offset; i < v.offset + v.numel; ++i) g[static_cast<size_t>(i)] = static_cast<float>(nd(gen));
    opt.step(p, g, lrs[t - 1], scales[t - 1]);
    const double lr = lrs[t - 1];
    const double bc1 = 1 - std::pow(c.beta1, t), bc2 = 1 - std::pow(c.beta2, t);
    for (const auto& v : L.views())
      for (int64_t i = v.offset; i < v.offset + v.numel; ++i) {
        const size_t k = static_cast<size_t>(i);
        const double gi = static_cast<double>(g[k]) * scales[t - 1];
        if (v.weight_decay) rp[k] *= 1 - lr * c.weight_decay;
        rm[k] = c.beta1 * rm[k] + (1 - c.beta1) * gi;
        rv[k] = c.beta2 * rv[k] + (1 - c.beta2) * gi * gi;
        rp[k] -= lr / bc1 * rm[k] / (std::sqrt(rv[k]) / std::sqrt(bc2) + c.eps);
      }
  }
  for (size_t k = 0; k < p.size(); ++k) EXPECT_NEAR(p[k], rp[k], 1e-6 * (1 + std::fabs(rp[k]))) << k;
}

TEST(GlobalNorm, ValueScaleAndThreadIndependence) {
  std::vector<float> g = {3.0f, 4.0f};
  EXPECT_DOUBLE_EQ(global_norm(g), 5.0);
  EXPECT_DOUBLE_EQ(global_norm(g, 0.5), 2.5);
  std::vector<float> big(100003);
  std::mt19937 gen(5);
  std::normal_distribution<float> nd;
  for (auto& x : big) x = nd(gen);
  const int64_t saved = parallel_min_work();
  const int threads = omp_get_max_threads();
  parallel_min_work() = 0;
  omp_set_num_threads(1);
  const double a = global_norm(big);
  omp_set_num_threads(2);
  const double b = global_norm(big);
  omp_set_num_threads(threads);
  parallel_min_work() = saved;
  EXPECT_EQ(std::bit_cast<uint64_t>(a), std::bit_cast<uint64_t>(b));
  EXPECT_GT(a, 0);
}

TEST(GlobalNorm, ClipFactor) {
  EXPECT_DOUBLE_EQ(clip_factor(0.5, 1.0), 1.0);
  EXPECT_DOUBLE_EQ(clip_factor(2.0, 1.0), 1.0 / (2.0 + 1e-6));
  EXPECT_DOUBLE_EQ(clip_factor(100.0, 0.0), 1.0);  // off
}

TEST(LrSchedule, ConstantWithWarmup) {
  LrSchedule s;
  s.kind = LrKind::constant;
  s.peak = 1.0;
  s.warmup = 4;
  s.total = 10;
  EXPECT_DOUBLE_EQ(s.at(0), 0.25);
  EXPECT_DOUBLE_EQ(s.at(1), 0.5);
  EXPECT_DOUBLE_EQ(s.at(3), 1.0);
  EXPECT_DOUBLE_EQ(s.at(9), 1.0);
}

TEST(LrSchedule, Cosine) {
  LrSchedule s;
  s.kind = LrKind::cosine;
  s.peak = 1.0;
  s.total = 10;
  s.min_ratio = 0.1;
  EXPECT_DOUBLE_EQ(s.at(0), 1.0);
  EXPECT_NEAR(s.at(5), 0.55, 1e-15);
  EXPECT_NEAR(s.at(9), 0.1 + 0.9 * 0.5 * (1 + std::cos(0.9 * std::numbers::pi)), 1e-15);
  EXPECT_NEAR(s.at(10), 0.1, 1e-15);
  s.warmup = 2;  // the cosine starts after the warmup
  EXPECT_DOUBLE_EQ(s.at(0), 0.5);
  EXPECT_DOUBLE_EQ(s.at(2), 1.0);
  EXPECT_NEAR(s.at(6), 0.55, 1e-15);
}

TEST(LrSchedule, WarmupStableDecayAsInTheUe5m3Paper) {
  LrSchedule s;
  s.kind = LrKind::wsd;
  s.peak = 2.0;
  s.warmup = 10;
  s.total = 100;
  EXPECT_EQ(s.decay_steps(), 15);  // the last 15%
  EXPECT_DOUBLE_EQ(s.at(0), 0.2);
  EXPECT_DOUBLE_EQ(s.at(9), 2.0);
  EXPECT_DOUBLE_EQ(s.at(50), 2.0);
  EXPECT_DOUBLE_EQ(s.at(84), 2.0);
  EXPECT_NEAR(s.at(85), 2.0 * (1 - 0.99 / 15), 1e-15);
  EXPECT_NEAR(s.at(92), 2.0 * (1 - 0.99 * 8 / 15), 1e-15);
  EXPECT_NEAR(s.at(99), 0.02, 1e-15);  // 1% of the peak on the last step
  for (int64_t i = 85; i < 100; ++i) EXPECT_LT(s.at(i), s.at(i - 1));
}

TEST(LrSchedule, BadSchedulesAreRejected) {
  test::expect_error([] { parse_lr_kind("linear"); }, "expected constant, cosine or wsd");
  LrSchedule s;
  s.total = 10;
  s.warmup = -1;
  test::expect_error([&] { s.validate(); }, "optim.warmup_steps");
  s.warmup = 0;
  s.min_ratio = 1.5;
  test::expect_error([&] { s.validate(); }, "optim.min_lr_ratio");
  s.min_ratio = 0.1;
  s.total = 0;
  test::expect_error([&] { s.validate(); }, "train.steps");
}

TEST(LrSchedule, RunsShorterThanTheWarmup) {
  LrSchedule s;
  s.peak = 1.0;
  s.warmup = 10;
  s.total = 4;  // cosine: the run ends during the warmup
  EXPECT_DOUBLE_EQ(s.at(3), 0.4);
  s.kind = LrKind::wsd;  // wsd: the decay of the last step multiplies the ramp
  EXPECT_EQ(s.decay_steps(), 1);
  EXPECT_DOUBLE_EQ(s.at(2), 0.3);
  EXPECT_NEAR(s.at(3), 0.4 * 0.01, 1e-15);
}

}  // namespace
}  // namespace exmy::sim

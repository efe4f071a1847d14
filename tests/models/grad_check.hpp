// Finite-difference gradient checks in double precision.
//
// A layer's backward is checked on the scalar L = sum(w ∘ outputs) with
// random weights w: its analytic gradient with respect to an input is what
// backward produces from dout = w, and the numerical one is the central
// difference (L(x+h) - L(x-h)) / 2h. In double with h = 1e-5 the difference
// quotient errs by about h^2 |L'''| + 1e-16 |L| / h, below 1e-9 for the O(1)
// values used here, so a mismatch above 1e-6 (relative to the largest
// gradient of the tensor) is a bug, not noise.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace exmy::test {

inline std::vector<double> randn(size_t n, uint32_t seed, double scale = 1.0, double mean = 0.0) {
  std::mt19937 g(seed);
  std::normal_distribution<double> d(mean, scale);
  std::vector<double> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

inline std::vector<double> uniform(size_t n, uint32_t seed, double lo, double hi) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<double> d(lo, hi);
  std::vector<double> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

inline double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// Compares analytic[i] with the central difference of loss() in x[i], for
// every i (or `max_checks` evenly spaced ones). x is restored afterwards.
inline void check_grad(const std::string& what, std::vector<double>& x, const std::vector<double>& analytic,
                       const std::function<double()>& loss, size_t max_checks = 400, double h = 1e-5,
                       double rtol = 1e-6) {
  ASSERT_EQ(x.size(), analytic.size()) << what;
  double scale = 0;
  for (double g : analytic) scale = std::max(scale, std::abs(g));
  // A gradient that is zero everywhere would pass vacuously.
  ASSERT_GT(scale, 1e-8) << what << ": analytic gradient is all zero";
  const size_t n = x.size(), step = std::max<size_t>(1, n / max_checks);
  double worst = 0;
  size_t worst_i = 0;
  for (size_t i = 0; i < n; i += step) {
    const double keep = x[i];
    x[i] = keep + h;
    const double lp = loss();
    x[i] = keep - h;
    const double lm = loss();
    x[i] = keep;
    const double num = (lp - lm) / (2 * h);
    const double err = std::abs(num - analytic[i]);
    if (err > worst) worst = err, worst_i = i;
  }
  EXPECT_LE(worst, rtol * scale + 1e-10) << what << ": worst element " << worst_i << " analytic " << analytic[worst_i]
                                         << " (gradient scale " << scale << ")";
}

}  // namespace exmy::test

// The comparisons of the kernel tests whose device results carry an FP32
// budget from test::RunErr (tests/models/run_error.hpp): test_ssd_cuda.cpp
// and test_attention_cuda.cpp, each built twice (tests/models/kernel_test.hpp).
// In the emulated build a kernel must equal the CPU bit for bit, and the
// CPU must lie within 2 u E of the exact value (u = 2^-24, E the RunErr bound
// of the same element): the premise of the device budget, checked in CI. On
// a device each element must lie within 4 u E of the CPU's (the CPU and the
// device each within u E of the exact result, twice for the terms beyond
// first order and E's own double evaluation), plus 2^-126 absolute (the
// subnormal range). compare_reordered holds a kernel with its own order of
// sums to the two sides' bounds added; compare_within_budget holds a kernel
// to the device budget also on the host.
//
// Included first by its tests: run_error.hpp must come before the item
// headers (its sim::hd_* overloads are found where the templates are defined).
#pragma once

#include "tests/models/run_error.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "sim/tensor.hpp"
#include "tests/models/kernel_test.hpp"

namespace exmy::models {
namespace {

using test::RunErr;
using Bound = std::vector<RunErr>;
// The CPU's arrays 64-byte aligned, as the kernels' buffers: Eigen's small
// products may choose their vectorized path by alignment.
using AVec = sim::Buf<float>;
AVec aligned(const Vec& v) { return AVec(v.begin(), v.end()); }
Vec plain(const AVec& v) { return Vec(v.begin(), v.end()); }

template <class T, class V>
std::vector<T> to(const V& v) {
  return std::vector<T>(v.begin(), v.end());
}

constexpr double kU = 0x1p-24, kTiny = 0x1p-126;  // u = 2^-24; the subnormal range

// Every element of got within lim(i) of want's (the CPU's).
template <class Lim>
void expect_close(const Vec& got, const Vec& want, Lim lim, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int bad = 0;
  for (size_t i = 0; i < want.size() && bad < 5; ++i)
    if (!(std::fabs(static_cast<double>(got[i]) - want[i]) <= lim(i))) {
      ADD_FAILURE() << what << " element " << i << ": " << got[i] << ", CPU " << want[i] << ", budget " << lim(i);
      ++bad;
    }
}

// The premise of a budget: values (the CPU's, or a kernel's emulation)
// within 2 u E of the exact value, E their own algorithm's bound.
void expect_exact_within_bound(const Vec& values, const Bound& bound, const std::string& what) {
  ASSERT_EQ(values.size(), bound.size()) << what;
  int bad = 0;
  for (size_t i = 0; i < values.size() && bad < 5; ++i)
    if (!(std::fabs(static_cast<double>(values[i]) - bound[i].v) <= 2 * kU * bound[i].e + kTiny)) {
      ADD_FAILURE() << what << " element " << i << ": " << values[i] << ", exact " << bound[i].v << ", bound "
                    << 2 * kU * bound[i].e;
      ++bad;
    }
}

// A kernel whose sums run in another order than the CPU's, in its own
// algorithm (the attention row kernels): got_bound is the RunErr evaluation
// of that algorithm, cpu_bound of the CPU's. Each side lies within 2 u E of
// the exact value, E its own bound (as above), so got lies within
// 2 u (E_got + E_cpu) + 2^-126 of the CPU's; in the emulated build both
// premises are checked as well.
inline void compare_reordered(const Vec& got, const Vec& cpu, const Bound& got_bound, const Bound& cpu_bound,
                       const std::string& what) {
  ASSERT_EQ(got.size(), cpu.size()) << what;
  ASSERT_EQ(got_bound.size(), cpu.size()) << what;
  ASSERT_EQ(cpu_bound.size(), cpu.size()) << what;
  if (!kOnDevice) {
    expect_exact_within_bound(got, got_bound, what + " (against its own bound)");
    expect_exact_within_bound(cpu, cpu_bound, what + " (CPU against its bound)");
  }
  expect_close(
      got, cpu, [&](size_t i) { return 2 * kU * (got_bound[i].e + cpu_bound[i].e) + kTiny; }, what);
}

// The emulation bit for bit; a device within its budget. The budget's
// premise is checked on the CPU in the emulated build.
inline void compare(const Vec& got, const Vec& cpu, const Bound& bound, const std::string& what) {
  if (!kOnDevice) {
    expect_bits(got, cpu, what);
    expect_exact_within_bound(cpu, bound, what + " (CPU against its bound)");
  } else {
    expect_close(got, cpu, [&](size_t i) { return 4 * kU * bound[i].e + kTiny; }, what);
  }
}

// A kernel whose operations are the item kernels' with NaiveGemm (the SSD
// scan's thread kernels): held to the device budget of compare() in both
// builds, 4 u E of the CPU's plus 2^-126, E the items' bound; in the
// emulated build the CPU's premise is checked as well.
inline void compare_within_budget(const Vec& got, const Vec& cpu, const Bound& bound, const std::string& what) {
  if (!kOnDevice) expect_exact_within_bound(cpu, bound, what + " (CPU against its bound)");
  expect_close(got, cpu, [&](size_t i) { return 4 * kU * bound[i].e + kTiny; }, what);
}

}  // namespace
}  // namespace exmy::models

// The comparisons of the kernel tests whose device results carry an FP32
// budget from test::RunErr (tests/models/run_error.hpp): test_ssd_cuda.cpp
// and test_attention_cuda.cpp, each built twice (tests/models/kernel_test.hpp).
// In the emulated build a kernel must equal the CPU bit for bit, and the
// CPU must lie within 2 u E of the exact value (u = 2^-24, E the RunErr bound
// of the same element): the premise of the device budget, checked in CI. On
// a device each element must lie within 4 u E of the CPU's (the CPU and the
// device each within u E of the exact result, twice for the terms beyond
// first order and E's own double evaluation), plus 2^-126 absolute (the
// subnormal range).
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

// Every element of got within the device budget of want (the CPU's), with
// bound the RunErr evaluation of the same output.
void expect_within(const Vec& got, const Vec& want, const Bound& bound, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  const double u = std::ldexp(1.0, -24), tiny = std::ldexp(1.0, -126);
  int bad = 0;
  for (size_t i = 0; i < want.size() && bad < 5; ++i) {
    const double lim = 4 * u * bound[i].e + tiny;
    if (!(std::fabs(static_cast<double>(got[i]) - want[i]) <= lim)) {
      ADD_FAILURE() << what << " element " << i << ": " << got[i] << ", CPU " << want[i] << ", budget " << lim;
      ++bad;
    }
  }
}

// The premise of the budget, on the CPU: within 2 u E of the exact value.
void expect_cpu_within_bound(const Vec& cpu, const Bound& bound, const std::string& what) {
  ASSERT_EQ(cpu.size(), bound.size()) << what;
  const double u = std::ldexp(1.0, -24), tiny = std::ldexp(1.0, -126);
  int bad = 0;
  for (size_t i = 0; i < cpu.size() && bad < 5; ++i)
    if (!(std::fabs(static_cast<double>(cpu[i]) - bound[i].v) <= 2 * u * bound[i].e + tiny)) {
      ADD_FAILURE() << what << " element " << i << ": CPU " << cpu[i] << ", exact " << bound[i].v << ", bound "
                    << 2 * u * bound[i].e;
      ++bad;
    }
}

// The emulation bit for bit; a device within its budget. The budget's
// premise is checked on the CPU in the emulated build.
void compare(const Vec& got, const Vec& cpu, const Bound& bound, const std::string& what) {
  if (!kOnDevice) {
    expect_bits(got, cpu, what);
    expect_cpu_within_bound(cpu, bound, what + " (CPU against its bound)");
  } else {
    expect_within(got, cpu, bound, what);
  }
}

}  // namespace
}  // namespace exmy::models

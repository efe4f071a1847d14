// What the kernel tests of tests/models/ share (test_layers_cuda.cpp,
// test_ssd_cuda.cpp, test_attention_cuda.cpp; also
// tests/quant/test_grouped_cuda.cpp), each built twice: with
// EXMY_TEST_EMULATED (label "unit", the launches run on the host) and
// against the device (label "gpu", SKIPPED without a CUDA device). Buffers
// are host vectors for the emulation and device copies for the kernels;
// KERNEL(name) picks name_emulated or name_cuda.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "sim/tensor.hpp"  // sim::Buf

#if !defined(EXMY_TEST_EMULATED)
#include <cuda_runtime.h>

#include "tests/require_cuda.hpp"
#endif

namespace exmy::models {
namespace {

using Vec = std::vector<float>;

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

inline void expect_bits(const Vec& got, const Vec& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int bad = 0;
  for (size_t i = 0; i < want.size() && bad < 5; ++i)
    if (bits(got[i]) != bits(want[i])) {
      ADD_FAILURE() << what << " element " << i << ": " << got[i] << " (0x" << std::hex << bits(got[i])
                    << "), CPU " << want[i] << " (0x" << bits(want[i]) << std::dec << ")";
      ++bad;
    }
}

Vec randn(size_t n, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, scale);
  Vec v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}

// Buffers the implementation under test works on: host vectors for the
// emulation, device copies for the kernels.
#if defined(EXMY_TEST_EMULATED)
#define EXMY_REQUIRE_CUDA() \
  do {                      \
  } while (0)
#define KERNEL(name) name##_emulated
constexpr bool kOnDevice = false;
template <class T>
struct BufferOf {
  sim::Buf<T> v;  // 64-byte aligned, as device memory
  template <class V>
  explicit BufferOf(const V& init) : v(init.begin(), init.end()) {}
  T* ptr() { return v.data(); }
  std::vector<T> get() const { return std::vector<T>(v.begin(), v.end()); }
};
#else
#define KERNEL(name) name##_cuda
constexpr bool kOnDevice = true;
template <class T>
struct BufferOf {
  T* d = nullptr;
  size_t n;
  template <class V>
  explicit BufferOf(const V& init) : n(init.size()) {
    EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&d), std::max<size_t>(1, n) * sizeof(T)), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(d, init.data(), n * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~BufferOf() { cudaFree(d); }
  T* ptr() { return d; }
  std::vector<T> get() const {
    std::vector<T> v(n);
    EXPECT_EQ(cudaMemcpy(v.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
  }
};
#endif
using Buffer = BufferOf<float>;

#if !defined(EXMY_TEST_EMULATED)
// The device times of a forward and a backward launch sequence, in ms: the
// median of 3 runs after a warm-up, timed with events on the default stream.
struct FwdBwdMs {
  float fwd, bwd;
};
template <class F, class B>
FwdBwdMs time_forward_backward(F forward, B backward) {
  cudaEvent_t t0, t1, t2;
  EXPECT_EQ(cudaEventCreate(&t0), cudaSuccess);
  EXPECT_EQ(cudaEventCreate(&t1), cudaSuccess);
  EXPECT_EQ(cudaEventCreate(&t2), cudaSuccess);
  std::vector<float> fwd_ms, bwd_ms;
  for (int rep = 0; rep < 4; ++rep) {  // the first is the warm-up
    cudaEventRecord(t0);
    forward();
    cudaEventRecord(t1);
    backward();
    cudaEventRecord(t2);
    EXPECT_EQ(cudaEventSynchronize(t2), cudaSuccess);
    float f = 0, b = 0;
    cudaEventElapsedTime(&f, t0, t1);
    cudaEventElapsedTime(&b, t1, t2);
    if (rep) fwd_ms.push_back(f), bwd_ms.push_back(b);
  }
  cudaEventDestroy(t0), cudaEventDestroy(t1), cudaEventDestroy(t2);
  std::sort(fwd_ms.begin(), fwd_ms.end());
  std::sort(bwd_ms.begin(), bwd_ms.end());
  return {fwd_ms[1], bwd_ms[1]};
}
#endif

}  // namespace
}  // namespace exmy::models

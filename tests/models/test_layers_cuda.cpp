// The layer and AdamW kernels (models/cuda/layers_cuda.hpp,
// sim/adamw_update.hpp) against the CPU implementations, bit for bit: the
// CPU defines every order (row sums in column order, weight-gradient
// partials per 32-row block added in block order), and the kernels follow it.
//
// Built twice:
// - test_layers_cuda_emulated (label "unit"): the kernels' launches with
//   their threads run on the host (sim::HostLaunch), on every machine;
// - test_layers_cuda (label "gpu", only with CUDA): the real kernels on the
//   device; every test reports SKIPPED without a CUDA device.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "models/cuda/layers_cuda.hpp"
#include "models/layers.hpp"
#include "sim/adamw_update.hpp"
#include "sim/arena.hpp"
#include "sim/optim.hpp"

#if !defined(EXMY_TEST_EMULATED)
#include <cuda_runtime.h>
#endif

namespace exmy::models {
namespace {

using Vec = std::vector<float>;

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

void expect_bits(const Vec& got, const Vec& want, const std::string& what) {
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
struct Buffer {
  Vec v;
  explicit Buffer(const Vec& init) : v(init) {}
  float* ptr() { return v.data(); }
  Vec get() const { return v; }
};
#else
#define EXMY_REQUIRE_CUDA()                                                           \
  do {                                                                                \
    int n = 0;                                                                        \
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {                            \
      cudaGetLastError();                                                             \
      GTEST_SKIP() << "needs a CUDA device";                                          \
    }                                                                                 \
  } while (0)
#define KERNEL(name) name##_cuda
struct Buffer {
  float* d = nullptr;
  size_t n;
  explicit Buffer(const Vec& init) : n(init.size()) {
    EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&d), std::max<size_t>(1, n) * 4), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(d, init.data(), n * 4, cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~Buffer() { cudaFree(d); }
  float* ptr() { return d; }
  Vec get() const {
    Vec v(n);
    EXPECT_EQ(cudaMemcpy(v.data(), d, n * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
  }
};
#endif

// Shapes with a partial last row block (N % 32 != 0), one row, one block.
const int64_t kShapes[][2] = {{67, 96}, {1, 5}, {32, 33}, {130, 17}};

TEST(LayerKernels, RmsNormForward) {
  EXMY_REQUIRE_CUDA();
  for (const auto& [N, C] : kShapes) {
    const Vec x = randn(static_cast<size_t>(N * C), 1 + N), w = randn(static_cast<size_t>(C), 2, 0.5f);
    Vec out(x.size()), rstd(static_cast<size_t>(N));
    rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, 1e-5);
    Buffer dx(x), dw(w), dout(Vec(x.size(), -1.0f)), drstd(Vec(rstd.size(), -1.0f));
    KERNEL(rmsnorm_forward)(dout.ptr(), drstd.ptr(), dx.ptr(), dw.ptr(), N, C, 1e-5);
    const std::string what = "rmsnorm forward " + std::to_string(N) + "x" + std::to_string(C);
    expect_bits(dout.get(), out, what + " out");
    expect_bits(drstd.get(), rstd, what + " rstd");
  }
}

TEST(LayerKernels, RmsNormBackwardAccumulates) {
  EXMY_REQUIRE_CUDA();
  for (const auto& [N, C] : kShapes) {
    const size_t n = static_cast<size_t>(N * C);
    const Vec x = randn(n, 3 + N), w = randn(static_cast<size_t>(C), 4, 0.5f), g = randn(n, 5 + N);
    Vec out(n), rstd(static_cast<size_t>(N));
    rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, 1e-5);
    // both gradients start non-zero: the kernels add, as the CPU does
    Vec dx = randn(n, 6), dw = randn(static_cast<size_t>(C), 7);
    Buffer kdx(dx), kdw(dw), kg(g), kx(x), kw(w), kr(rstd);
    Buffer scratch(Vec(static_cast<size_t>(rmsnorm_backward_scratch(N, C)), 0.0f));
    rmsnorm_backward(dx.data(), dw.data(), g.data(), x.data(), w.data(), rstd.data(), N, C);
    KERNEL(rmsnorm_backward)(kdx.ptr(), kdw.ptr(), kg.ptr(), kx.ptr(), kw.ptr(), kr.ptr(), N, C, scratch.ptr());
    const std::string what = "rmsnorm backward " + std::to_string(N) + "x" + std::to_string(C);
    expect_bits(kdx.get(), dx, what + " dx");
    expect_bits(kdw.get(), dw, what + " dw");
  }
}

TEST(LayerKernels, SquaredRelu) {
  EXMY_REQUIRE_CUDA();
  Vec in = randn(1000, 8, 3.0f);
  in[0] = 0.0f, in[1] = -0.0f, in[2] = 1e30f, in[3] = -1e30f, in[4] = std::numeric_limits<float>::denorm_min();
  const Vec g = randn(in.size(), 9);
  Vec out(in.size()), din = randn(in.size(), 10);
  Buffer kin(in), kg(g), kout(Vec(in.size(), -1.0f)), kdin(din);
  relu2_forward(out.data(), in.data(), static_cast<int64_t>(in.size()));
  relu2_backward(din.data(), g.data(), in.data(), static_cast<int64_t>(in.size()));
  KERNEL(relu2_forward)(kout.ptr(), kin.ptr(), static_cast<int64_t>(in.size()));
  KERNEL(relu2_backward)(kdin.ptr(), kg.ptr(), kin.ptr(), static_cast<int64_t>(in.size()));
  expect_bits(kout.get(), out, "relu2 forward");
  expect_bits(kdin.get(), din, "relu2 backward");
  EXPECT_TRUE(std::isinf(out[2]));  // the overflow is the CPU's too
}

// Three AdamW steps of an arena with decayed and exempt views against
// sim::AdamW::step, parameters and both moments bit for bit.
TEST(LayerKernels, AdamW) {
  EXMY_REQUIRE_CUDA();
  sim::ArenaLayout L;
  L.add("a.weight", {37, 5}, true);
  L.add("norm.weight", {19}, false);
  L.add("b.weight", {300}, true);
  sim::AdamWConfig cfg;
  sim::AdamW opt(L, cfg);
  const size_t n = static_cast<size_t>(L.size());
  Vec p = randn(n, 11), m(n, 0.0f), v(n, 0.0f);
  Buffer kp(p), km(m), kv(v);
  for (int64_t t = 1; t <= 3; ++t) {
    const Vec g = randn(n, 20 + static_cast<uint64_t>(t), 0.1f);
    const double lr = 3e-3 * static_cast<double>(t), scale = 0.5;
    opt.step(p, g, lr, scale);
    Buffer kg(g);
    const sim::AdamWScalars s = sim::adamw_scalars(cfg, t, lr, scale);
    for (const auto& view : L.views())
      sim::KERNEL(adamw_update)(kp.ptr() + view.offset, km.ptr() + view.offset, kv.ptr() + view.offset,
                                kg.ptr() + view.offset, view.numel, view.weight_decay ? s.decay : 1.0f, s);
  }
  expect_bits(kp.get(), p, "adamw params");
  expect_bits(km.get(), Vec(opt.exp_avg().begin(), opt.exp_avg().end()), "adamw exp_avg");
  expect_bits(kv.get(), Vec(opt.exp_avg_sq().begin(), opt.exp_avg_sq().end()), "adamw exp_avg_sq");
}

}  // namespace
}  // namespace exmy::models

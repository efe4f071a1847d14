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

#include <algorithm>
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
constexpr bool kOnDevice = false;
template <class T>
struct BufferOf {
  std::vector<T> v;
  explicit BufferOf(const std::vector<T>& init) : v(init) {}
  T* ptr() { return v.data(); }
  std::vector<T> get() const { return v; }
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
constexpr bool kOnDevice = true;
template <class T>
struct BufferOf {
  T* d = nullptr;
  size_t n;
  explicit BufferOf(const std::vector<T>& init) : n(init.size()) {
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

// Embedding: the forward copies; the backward, with tokens repeated many
// times (the order of the adds then matters), equals the CPU's
// channel-block loop bit for bit without atomics.
TEST(LayerKernels, Embedding) {
  EXMY_REQUIRE_CUDA();
  const int64_t N = 300, C = 70, Vocab = 50;
  std::vector<int32_t> tokens(static_cast<size_t>(N));
  std::mt19937 rng(40);
  for (auto& t : tokens) t = static_cast<int32_t>(rng() % 9 == 0 ? rng() % Vocab : rng() % 5);  // skewed
  const Vec wte = randn(static_cast<size_t>(Vocab * C), 41), dout = randn(static_cast<size_t>(N * C), 42, 3.0f);
  Vec out(static_cast<size_t>(N * C)), dwte = randn(wte.size(), 43);
  embedding_forward(out.data(), tokens.data(), wte.data(), N, C);
  const TokenGroups g = group_tokens(tokens.data(), N);
  ASSERT_EQ(g.starts.back(), N);
  BufferOf<int32_t> ktokens(tokens), krows(g.rows);
  BufferOf<int64_t> kstarts(g.starts), kpos(g.positions);
  Buffer kwte(wte), kout(Vec(out.size(), -1.0f)), kdout(dout), kdwte(dwte);
  embedding_backward(dwte.data(), dout.data(), tokens.data(), N, C);
  KERNEL(embedding_forward)(kout.ptr(), ktokens.ptr(), kwte.ptr(), N, C);
  KERNEL(embedding_backward)(kdwte.ptr(), kdout.ptr(), krows.ptr(), kstarts.ptr(), kpos.ptr(),
                             static_cast<int64_t>(g.rows.size()), C);
  expect_bits(kout.get(), out, "embedding forward");
  expect_bits(kdwte.get(), dwte, "embedding backward");
}

// Cross-entropy: the emulation bit for bit; on a device within the budget
// its exp and log leave (sim/hd_math.hpp). The budget: CUDA's expf is within
// 2 ulp and glibc's within 1, so each term exp(l - max) differs by at most
// 3 ulp, a relative 3 * 2^-23 (the max is exact on both). The double sum of
// these positive terms then differs by at most that relative amount (its
// own rounding, ~2^-53 per add, is negligible), so log(sum), and with it a
// row's loss and the mean, differ by at most 3 * 2^-23 absolute (plus the
// two double logs' ~2^-52 relative): tested with 4 * 2^-23. A gradient term
// sc * (exp(l - max) * inv): exp 3 * 2^-23 relative, inv = fl(1 / sum) 3 *
// 2^-23 from the sum plus a rounding each side, the two products a rounding
// each side: at most 9 * 2^-23 relative of the term; the += into dlogits and
// the -= scale at the target add a rounding of the result on each side:
// tested with 10 * 2^-23 |term| + 2 ulp(|dlogits|).
TEST(LayerKernels, CrossEntropy) {
  EXMY_REQUIRE_CUDA();
  const int64_t N = 45, V = 300;
  const Vec logits = randn(static_cast<size_t>(N * V), 30, 4.0f);
  std::vector<int32_t> targets(static_cast<size_t>(N));
  for (int64_t n = 0; n < N; ++n) targets[static_cast<size_t>(n)] = n % 7 == 3 ? -1 : static_cast<int32_t>((n * 37) % V);
  std::vector<double> losses(static_cast<size_t>(N));
  int64_t counted = 0;
  const double mean = cross_entropy_forward(losses.data(), &counted, logits.data(), targets.data(), N, V);
  const double scale = 1.0 / static_cast<double>(counted);
  Vec dl = randn(logits.size(), 31, 1e-3f);
  BufferOf<double> klosses(std::vector<double>(losses.size(), -1.0)), kmean(std::vector<double>(1, -1.0));
  BufferOf<int64_t> kcounted(std::vector<int64_t>(1, -1));
  BufferOf<int32_t> ktargets(targets);
  Buffer klogits(logits), kdl(dl), scratch(Vec(static_cast<size_t>(cross_entropy_backward_scratch(N)), 0.0f));
  cross_entropy_backward(dl.data(), logits.data(), targets.data(), N, V, scale);
  KERNEL(cross_entropy_forward)(klosses.ptr(), kmean.ptr(), kcounted.ptr(), klogits.ptr(), ktargets.ptr(), N, V);
  KERNEL(cross_entropy_backward)(kdl.ptr(), klogits.ptr(), ktargets.ptr(), N, V, scale, scratch.ptr());
  EXPECT_EQ(kcounted.get()[0], counted);
  EXPECT_LT(counted, N);  // ignored rows were there
  const std::vector<double> got_losses = klosses.get();
  const Vec got_dl = kdl.get();
  if (!kOnDevice) {
    EXPECT_EQ(std::memcmp(got_losses.data(), losses.data(), losses.size() * sizeof(double)), 0) << "row losses";
    EXPECT_EQ(std::memcmp(kmean.get().data(), &mean, sizeof mean), 0) << "mean loss";
    expect_bits(got_dl, dl, "cross-entropy dlogits");
    return;
  }
  const double loss_tol = 4.0 * std::ldexp(1.0, -23);
  for (int64_t n = 0; n < N; ++n) EXPECT_NEAR(got_losses[static_cast<size_t>(n)], losses[static_cast<size_t>(n)], loss_tol) << n;
  EXPECT_NEAR(kmean.get()[0], mean, loss_tol);
  for (int64_t n = 0; n < N; ++n) {
    if (targets[static_cast<size_t>(n)] < 0) continue;
    const float* l = logits.data() + n * V;
    const double mx = *std::max_element(l, l + V);
    double s = 0;
    for (int64_t v = 0; v < V; ++v) s += std::exp(static_cast<double>(l[v]) - mx);
    for (int64_t v = 0; v < V; ++v) {
      const size_t i = static_cast<size_t>(n * V + v);
      const double term = scale * std::exp(static_cast<double>(l[v]) - mx) / s;
      const double tol = 10.0 * std::ldexp(1.0, -23) * std::fabs(term) +
                         2.0 * std::fabs(std::nextafter(dl[i], INFINITY) - dl[i]);
      ASSERT_NEAR(got_dl[i], dl[i], tol) << "row " << n << " column " << v;
    }
  }
}

}  // namespace
}  // namespace exmy::models

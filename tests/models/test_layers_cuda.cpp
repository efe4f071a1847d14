// The layer and AdamW kernels (models/cuda/layers_cuda.hpp,
// sim/adamw_update.hpp) against the CPU implementations (models/layers.hpp,
// Mamba's time step of models/ssd.hpp, sim::round_bf16), bit for bit: the
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
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "models/cuda/layers_cuda.hpp"
#include "models/layers.hpp"
#include "models/ssd.hpp"
#include "sim/adamw_update.hpp"
#include "sim/arena.hpp"
#include "sim/linear.hpp"
#include "sim/optim.hpp"
#include "tests/models/kernel_test.hpp"

namespace exmy::models {
namespace {

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

// An arena of decayed and exempt views, for the AdamW kernels.
sim::ArenaLayout adamw_layout() {
  sim::ArenaLayout L;
  L.add("a.weight", {37, 5}, true);
  L.add("norm.weight", {19}, false);
  L.add("b.weight", {300}, true);
  return L;
}

// Three AdamW steps of an arena with decayed and exempt views against
// sim::AdamW::step, parameters and both moments bit for bit.
TEST(LayerKernels, AdamW) {
  EXMY_REQUIRE_CUDA();
  const sim::ArenaLayout L = adamw_layout();
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

// BF16 working weights: three steps of the fused kernel (the update on the
// FP32 master, its BF16 rounding into the arena) against sim::AdamW with
// WorkingWeights::bf16: the arena, the master and both moments bit for bit.
TEST(LayerKernels, AdamWBf16WorkingWeights) {
  EXMY_REQUIRE_CUDA();
  const sim::ArenaLayout L = adamw_layout();
  sim::AdamWConfig cfg;
  sim::AdamW opt(L, cfg, sim::whole_arena(L), sim::host_memory(), {}, nullptr, sim::WorkingWeights::bf16);
  const size_t n = static_cast<size_t>(L.size());
  Vec master = randn(n, 12), p = master, m(n, 0.0f), v(n, 0.0f);
  opt.take_master(p);
  for (float& x : p) x = sim::round_bf16_hd(x);
  Buffer kp(p), kw(master), km(m), kv(v);
  for (int64_t t = 1; t <= 3; ++t) {
    const Vec g = randn(n, 40 + static_cast<uint64_t>(t), 0.1f);
    const double lr = 3e-3 * static_cast<double>(t), scale = 0.5;
    opt.step(p, g, lr, scale);
    Buffer kg(g);
    const sim::AdamWScalars s = sim::adamw_scalars(cfg, t, lr, scale);
    for (const auto& view : L.views())
      sim::KERNEL(adamw_bf16_update)(kp.ptr() + view.offset, kw.ptr() + view.offset, km.ptr() + view.offset,
                                     kv.ptr() + view.offset, kg.ptr() + view.offset, view.numel,
                                     view.weight_decay ? s.decay : 1.0f, s);
  }
  expect_bits(kp.get(), p, "working weights");
  const Vec want_master(opt.master_of(0), opt.master_of(0) + n);
  const Vec got_master = kw.get();
  for (const auto& view : L.views())  // the padding is no view's
    for (int64_t i = view.offset; i < view.offset + view.numel; ++i)
      ASSERT_EQ(std::bit_cast<uint32_t>(got_master[static_cast<size_t>(i)]),
                std::bit_cast<uint32_t>(want_master[static_cast<size_t>(i)])) << "master " << i;
  expect_bits(km.get(), Vec(opt.exp_avg().begin(), opt.exp_avg().end()), "adamw exp_avg");
  expect_bits(kv.get(), Vec(opt.exp_avg_sq().begin(), opt.exp_avg_sq().end()), "adamw exp_avg_sq");
}

// The global gradient norm's block sums (a partial last block, values
// spread over many binades so that the order of the double sums matters)
// finished on the host: sim::global_norm's value bit for bit.
TEST(LayerKernels, GlobalNorm) {
  EXMY_REQUIRE_CUDA();
  const int64_t n = 3 * sim::kNormBlock + 123;
  Vec g = randn(static_cast<size_t>(n), 31);
  for (int64_t i = 0; i < n; ++i) g[static_cast<size_t>(i)] *= std::ldexp(1.0f, static_cast<int>(i % 23) - 11);
  Buffer kg(g);
  BufferOf<double> kpart(std::vector<double>(static_cast<size_t>(sim::norm_blocks(n)), -1.0));
  sim::KERNEL(global_norm_partials)(kg.ptr(), n, kpart.ptr());
  const std::vector<double> part = kpart.get();
  for (double scale : {1.0, 0.25, -3.0}) {
    const double want = sim::global_norm(g, scale), got = sim::global_norm_of_partials(part, scale);
    EXPECT_EQ(std::memcmp(&want, &got, sizeof want), 0) << "scale " << scale << ": " << got << " vs " << want;
  }
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

// Gated grouped RMSNorm, forward and backward (strided y and z, as the
// mixer passes them): the emulation bit for bit. On a device silu goes
// through exp, so a budget, in u = 2^-23 (at least an ulp, relative): exp
// within 3u (2 ulp CUDA, 1 ulp glibc), sigmoid = 1 / (1 + e) adds a rounding
// per operation on each side, 5u; silu 6u; g = y silu(z) 7u; the squares
// 14u, their sum likewise (positive terms), rstd = 1 / sqrt(ss / gs + eps)
// half of that plus three roundings, 10u; out = w (g rstd) 19u: tested with
// 24u relative. Backward: every input of a term (s, silu, g, rstd) within
// 24u; the group mean m within 24u of M = mean |dout w g rstd| (not of |m|,
// which may cancel); dg = r (dout w - gh m) then within 24u of r (|dout w| +
// |gh| M) plus its four roundings, and each term a product or two more, all
// well inside 64u of its magnitude S (computed in double below), plus a
// rounding of the += result on each side (2 ulp of the result); dw sums such
// terms: 64u of the sum of |terms| plus 2 ulp.
TEST(LayerKernels, GatedRmsNorm) {
  EXMY_REQUIRE_CUDA();
  const int64_t N = 70, D = 48, G = 3, ldy = 60, ldz = 52, gs = D / G;
  const double eps = 1e-5;
  const Vec y = randn(static_cast<size_t>(N * ldy), 50), z = randn(static_cast<size_t>(N * ldz), 51, 2.0f),
            w = randn(static_cast<size_t>(D), 52, 0.5f), dout = randn(static_cast<size_t>(N * D), 53);
  Vec out(static_cast<size_t>(N * D)), rstd(static_cast<size_t>(N * G));
  gated_rmsnorm_forward(out.data(), rstd.data(), y.data(), ldy, z.data(), ldz, w.data(), N, D, G, eps);
  Vec dy = randn(y.size(), 54, 0.1f), dz = randn(z.size(), 55, 0.1f), dw = randn(w.size(), 56);
  Buffer ky(y), kz(z), kw(w), kdout(dout), kout(Vec(out.size(), -1.0f)), kr(Vec(rstd.size(), -1.0f));
  Buffer kdy(dy), kdz(dz), kdw(dw), scratch(Vec(static_cast<size_t>(gated_rmsnorm_backward_scratch(N, D, G)), 0.0f));
  KERNEL(gated_rmsnorm_forward)(kout.ptr(), kr.ptr(), ky.ptr(), ldy, kz.ptr(), ldz, kw.ptr(), N, D, G, eps);
  // the backward of both from the CPU's rstd, so that only the backward is compared
  Buffer kcpu_r(rstd);
  const Vec dy0 = dy, dw0 = dw;
  gated_rmsnorm_backward(dy.data(), ldy, dz.data(), ldz, dw.data(), dout.data(), y.data(), ldy, z.data(), ldz,
                         w.data(), rstd.data(), N, D, G);
  KERNEL(gated_rmsnorm_backward)(kdy.ptr(), ldy, kdz.ptr(), ldz, kdw.ptr(), kdout.ptr(), ky.ptr(), ldy, kz.ptr(), ldz,
                                 kw.ptr(), kcpu_r.ptr(), N, D, G, scratch.ptr());
  if (!kOnDevice) {
    expect_bits(kout.get(), out, "gated rmsnorm out");
    expect_bits(kr.get(), rstd, "gated rmsnorm rstd");
    expect_bits(kdy.get(), dy, "gated rmsnorm dy");
    expect_bits(kdz.get(), dz, "gated rmsnorm dz");
    expect_bits(kdw.get(), dw, "gated rmsnorm dw");
    return;
  }
  const double u = std::ldexp(1.0, -23);
  auto ulp = [](float f) { return static_cast<double>(std::fabs(std::nextafter(f, INFINITY) - f)); };
  const Vec gout = kout.get(), gr = kr.get(), gdy = kdy.get(), gdz = kdz.get(), gdw = kdw.get();
  for (size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(gout[i], out[i], 24 * u * std::fabs(out[i]) + ulp(out[i])) << i;
  for (size_t i = 0; i < rstd.size(); ++i) ASSERT_NEAR(gr[i], rstd[i], 24 * u * rstd[i]) << i;
  std::vector<double> dw_mag(static_cast<size_t>(D), 0.0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t g = 0; g < G; ++g) {
      const double r = rstd[static_cast<size_t>(n * G + g)];
      auto sig = [](double v) { return 1.0 / (1.0 + std::exp(-v)); };
      double M = 0;
      for (int64_t c = g * gs; c < (g + 1) * gs; ++c) {
        const double zc = z[static_cast<size_t>(n * ldz + c)], gh = y[static_cast<size_t>(n * ldy + c)] * zc * sig(zc) * r;
        M += std::fabs(dout[static_cast<size_t>(n * D + c)] * w[static_cast<size_t>(c)] * gh);
      }
      M /= static_cast<double>(gs);
      for (int64_t c = g * gs; c < (g + 1) * gs; ++c) {
        const size_t iy = static_cast<size_t>(n * ldy + c), iz = static_cast<size_t>(n * ldz + c);
        const double zc = z[iz], s = sig(zc), sz = zc * s, gh = y[iy] * sz * r;
        const double go = dout[static_cast<size_t>(n * D + c)];
        const double dg_mag = r * (std::fabs(go * w[static_cast<size_t>(c)]) + std::fabs(gh) * M);
        const double dsilu = std::fabs(s * (1 + zc * (1 - s)));
        ASSERT_NEAR(gdy[iy], dy[iy], 64 * u * dg_mag * std::fabs(sz) + 2 * ulp(dy[iy])) << n << "," << c;
        ASSERT_NEAR(gdz[iz], dz[iz], 64 * u * dg_mag * std::fabs(y[iy]) * dsilu + 2 * ulp(dz[iz])) << n << "," << c;
        dw_mag[static_cast<size_t>(c)] += std::fabs(go * gh);
      }
    }
  for (int64_t c = 0; c < D; ++c)
    ASSERT_NEAR(gdw[static_cast<size_t>(c)], dw[static_cast<size_t>(c)],
                64 * u * (dw_mag[static_cast<size_t>(c)] + std::fabs(dw0[static_cast<size_t>(c)])) + 2 * ulp(dw[static_cast<size_t>(c)]))
        << c;
  // the strided columns past D are untouched
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = D; c < ldy; ++c) ASSERT_EQ(bits(gdy[static_cast<size_t>(n * ldy + c)]), bits(dy0[static_cast<size_t>(n * ldy + c)]));
}

// Causal depthwise conv1d + SiLU, with and without bias, a strided input
// and a sequence shorter than the kernel: the emulation bit for bit. On a
// device, in u = 2^-23: the pre-activation is the CPU's exactly (IEEE + and
// * in its order); silu within 6u (exp 3u, then the add, the division and
// the product, a rounding each side), tested with 8u relative. Backward:
// silu'(p) = s (1 + p (1 - s)) may cancel, so the gradient at the
// pre-activation is within 16u of its magnitude |dout| s (1 + |p| |1 - s|)
// (s within 5u, four more operations); dx, dw and dbias add products of
// those with exact factors: within 16u of the sum of the terms' magnitudes,
// plus a rounding of each += result (2 ulp of the result).
TEST(LayerKernels, Conv1dSilu) {
  EXMY_REQUIRE_CUDA();
  struct Shape {
    int64_t B, T, Cc, K, ldx;
    bool bias;
  };
  for (const Shape& sh : {Shape{2, 37, 20, 4, 26, true}, Shape{3, 2, 9, 4, 9, false}}) {
    const auto [B, T, Cc, K, ldx, with_bias] = sh;
    const size_t n = static_cast<size_t>(B * T * Cc);
    const Vec x = randn(static_cast<size_t>(B * T * ldx), 60, 1.5f), w = randn(static_cast<size_t>(Cc * K), 61, 0.7f),
              bias = randn(static_cast<size_t>(Cc), 62), dout = randn(n, 63);
    const float* bp = with_bias ? bias.data() : nullptr;
    Vec out(n), dx = randn(x.size(), 64, 0.1f), dw = randn(w.size(), 65, 0.1f), dbias = randn(bias.size(), 66, 0.1f);
    Buffer kx(x), kw(w), kb(bias), kdout(dout), kout(Vec(n, -1.0f)), kdx(dx), kdw(dw), kdb(dbias);
    Buffer scratch(Vec(static_cast<size_t>(conv1d_silu_backward_scratch(B, T, Cc)), 0.0f));
    float* kbp = with_bias ? kb.ptr() : nullptr;
    const Vec db0 = dbias;
    conv1d_silu_forward(out.data(), x.data(), ldx, w.data(), bp, B, T, Cc, K);
    conv1d_silu_backward(dx.data(), ldx, dw.data(), with_bias ? dbias.data() : nullptr, dout.data(), x.data(), ldx,
                         w.data(), bp, B, T, Cc, K);
    KERNEL(conv1d_silu_forward)(kout.ptr(), kx.ptr(), ldx, kw.ptr(), kbp, B, T, Cc, K);
    KERNEL(conv1d_silu_backward)(kdx.ptr(), ldx, kdw.ptr(), with_bias ? kdb.ptr() : nullptr, kdout.ptr(), kx.ptr(), ldx,
                                 kw.ptr(), kbp, B, T, Cc, K, scratch.ptr());
    const std::string what = "conv1d T=" + std::to_string(T) + (with_bias ? " bias" : " no bias");
    if (!kOnDevice) {
      expect_bits(kout.get(), out, what + " out");
      expect_bits(kdx.get(), dx, what + " dx");
      expect_bits(kdw.get(), dw, what + " dw");
      expect_bits(kdb.get(), dbias, what + " dbias");
      continue;
    }
    const double u = std::ldexp(1.0, -23);
    auto ulp = [](float f) { return static_cast<double>(std::fabs(std::nextafter(f, INFINITY) - f)); };
    const Vec gout = kout.get(), gdx = kdx.get(), gdw = kdw.get(), gdb = kdb.get();
    for (size_t i = 0; i < n; ++i) ASSERT_NEAR(gout[i], out[i], 8 * u * std::fabs(out[i]) + ulp(out[i])) << what << " " << i;
    // magnitudes of the gradient at the pre-activation, then of the sums
    std::vector<double> mdp(n);
    for (int64_t bt = 0; bt < B * T; ++bt)
      for (int64_t c = 0; c < Cc; ++c) {
        double p = bp ? bp[c] : 0.0;
        for (int64_t k = 0; k < K; ++k)
          if (bt % T + k - (K - 1) >= 0) p += static_cast<double>(w[static_cast<size_t>(c * K + k)]) * x[static_cast<size_t>((bt + k - (K - 1)) * ldx + c)];
        const double s = 1.0 / (1.0 + std::exp(-p));
        mdp[static_cast<size_t>(bt * Cc + c)] = std::fabs(dout[static_cast<size_t>(bt * Cc + c)]) * s * (1 + std::fabs(p) * std::fabs(1 - s));
      }
    std::vector<double> mdx(x.size(), 0.0), mdw(w.size(), 0.0), mdb(bias.size(), 0.0);
    for (int64_t bt = 0; bt < B * T; ++bt)
      for (int64_t c = 0; c < Cc; ++c) {
        const double m = mdp[static_cast<size_t>(bt * Cc + c)];
        mdb[static_cast<size_t>(c)] += m;
        for (int64_t k = 0; k < K; ++k) {
          if (bt % T + k - (K - 1) < 0) continue;
          const size_t ix = static_cast<size_t>((bt + k - (K - 1)) * ldx + c);
          mdx[ix] += m * std::fabs(w[static_cast<size_t>(c * K + k)]);
          mdw[static_cast<size_t>(c * K + k)] += m * std::fabs(x[ix]);
        }
      }
    for (size_t i = 0; i < x.size(); ++i) ASSERT_NEAR(gdx[i], dx[i], 16 * u * mdx[i] + 2 * ulp(dx[i])) << what << " dx " << i;
    for (size_t i = 0; i < w.size(); ++i) ASSERT_NEAR(gdw[i], dw[i], 16 * u * mdw[i] + 2 * ulp(dw[i])) << what << " dw " << i;
    if (with_bias)
      for (size_t i = 0; i < bias.size(); ++i) ASSERT_NEAR(gdb[i], dbias[i], 16 * u * mdb[i] + 2 * ulp(dbias[i])) << what << " dbias " << i;
    else
      for (size_t i = 0; i < bias.size(); ++i) ASSERT_EQ(bits(gdb[i]), bits(db0[i])) << what;
  }
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
// Rows of one segment (V = 300) and of several (layer_rows.hpp's
// kCeSegment columns each, the last one partial), so that the segments'
// maxima and sums, and their combination, are checked too.
class LayerKernelsCrossEntropy : public ::testing::TestWithParam<std::pair<int64_t, int64_t>> {};
INSTANTIATE_TEST_SUITE_P(Shapes, LayerKernelsCrossEntropy,
                         ::testing::Values(std::pair<int64_t, int64_t>{45, 300},
                                           std::pair<int64_t, int64_t>{9, 2 * kCeSegment + 77}));

TEST_P(LayerKernelsCrossEntropy, MatchesTheCpu) {
  EXMY_REQUIRE_CUDA();
  const auto [N, V] = GetParam();
  Vec logits = randn(static_cast<size_t>(N * V), 30, 4.0f);
  if (V > kCeSegment) {  // a row's max in its last segment, another's in its first element
    logits[static_cast<size_t>(1 * V + V - 3)] = 40.0f;
    logits[static_cast<size_t>(2 * V)] = 41.0f;
  }
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
  // the scratch starts as NaN: a read of what no launch wrote shows
  const Vec nan_scratch(static_cast<size_t>(cross_entropy_scratch(N, V)), std::numeric_limits<float>::quiet_NaN());
  Buffer klogits(logits), kdl(dl), fscratch(nan_scratch), bscratch(nan_scratch);
  cross_entropy_backward(dl.data(), logits.data(), targets.data(), N, V, scale);
  KERNEL(cross_entropy_forward)(klosses.ptr(), kmean.ptr(), kcounted.ptr(), klogits.ptr(), ktargets.ptr(), N, V,
                                fscratch.ptr());
  KERNEL(cross_entropy_backward)(kdl.ptr(), klogits.ptr(), ktargets.ptr(), N, V, scale, bscratch.ptr());
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


// The residual add: IEEE additions, so the device's bits are the CPU's too,
// except a NaN's (the device makes its own NaN for Inf - Inf); specials,
// signed zeros and an overflow included, out in place of a as the model
// calls it.
TEST(LayerKernels, ResidualAdd) {
  EXMY_REQUIRE_CUDA();
  const float inf = std::numeric_limits<float>::infinity(), big = std::numeric_limits<float>::max();
  Vec a = randn(1001, 70, 3.0f), b = randn(a.size(), 71, 1e-3f);
  const float sa[] = {-0.0f, -0.0f, 0.0f, big, inf, inf, -inf, std::numeric_limits<float>::denorm_min(), 1.0f};
  const float sb[] = {-0.0f, 0.0f, -0.0f, big, -inf, 1.0f, 2.0f, std::numeric_limits<float>::denorm_min(), -1.0f};
  for (size_t i = 0; i < std::size(sa); ++i) a[i] = sa[i], b[i] = sb[i];
  const int64_t n = static_cast<int64_t>(a.size());
  Vec out(a.size()), inplace = a;
  add_forward(out.data(), a.data(), b.data(), n);
  add_forward(inplace.data(), inplace.data(), b.data(), n);
  Buffer ka(a), kb(b), kout(Vec(a.size(), -1.0f)), kin(a);
  KERNEL(add_forward)(kout.ptr(), ka.ptr(), kb.ptr(), n);
  KERNEL(add_forward)(kin.ptr(), kin.ptr(), kb.ptr(), n);
  EXPECT_TRUE(std::isnan(out[4]) && std::isinf(out[3]) && std::signbit(out[0]) && !std::signbit(out[1]));
  if (!kOnDevice) {
    expect_bits(kout.get(), out, "residual add");
    expect_bits(kin.get(), inplace, "residual add in place");
    return;
  }
  for (const auto& [got, want] : {std::pair{kout.get(), out}, std::pair{kin.get(), inplace}})
    for (size_t i = 0; i < want.size(); ++i)
      if (std::isnan(want[i])) EXPECT_TRUE(std::isnan(got[i])) << i;
      else EXPECT_EQ(bits(got[i]), bits(want[i])) << i;
}

// Rounding to bfloat16 (sim::round_bf16): integer operations on the bits,
// so the device's bits are the CPU's for every input, NaNs included. Ties
// to even and odd (0x8000 below the kept bits), their neighbours, carries
// into the exponent, subnormals, FLT_MAX (to Inf), +-Inf, +-0, quiet and
// signalling NaNs with payloads; once in place.
TEST(LayerKernels, RoundBf16) {
  EXMY_REQUIRE_CUDA();
  std::vector<uint32_t> cases;
  for (uint32_t sign : {0u, 1u})
    for (uint32_t e : {0u, 1u, 2u, 100u, 126u, 127u, 128u, 200u, 253u, 254u})
      for (uint32_t m : {0x00u, 0x01u, 0x40u, 0x7eu, 0x7fu})
        for (uint32_t low : {0x0000u, 0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu})
          cases.push_back((sign << 31) | (e << 23) | (m << 16) | low);
  for (uint32_t special : {0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00000u, 0x7f800001u, 0x7fbfffffu,
                           0xff812345u, 0x7fc0ffffu, 0x7f7fffffu, 0xff7fffffu, 0x00000001u, 0x80008000u})
    cases.push_back(special);
  std::mt19937 rng(72);
  for (int i = 0; i < 3000; ++i) cases.push_back(static_cast<uint32_t>(rng()));
  Vec in(cases.size());
  for (size_t i = 0; i < cases.size(); ++i) std::memcpy(&in[i], &cases[i], 4);
  const int64_t n = static_cast<int64_t>(in.size());
  Vec out(in.size()), inplace = in;
  sim::round_bf16(out.data(), in.data(), n);
  sim::round_bf16(inplace.data(), inplace.data(), n);
  Buffer kin(in), kout(Vec(in.size(), -1.0f)), kinplace(in);
  KERNEL(round_bf16)(kout.ptr(), kin.ptr(), n);
  KERNEL(round_bf16)(kinplace.ptr(), kinplace.ptr(), n);
  expect_bits(kout.get(), out, "round_bf16");
  expect_bits(kinplace.get(), inplace, "round_bf16 in place");
  // the cases reach what they are for: ties both ways, Inf from FLT_MAX, NaNs kept
  EXPECT_EQ(bits(out[3]), 0u);  // 0x00008000, a tie below the smallest bf16 subnormal: even, 0
  EXPECT_TRUE(std::isinf(sim::round_bf16(std::numeric_limits<float>::max())));
  int nans = 0;
  for (size_t i = 0; i < in.size(); ++i) nans += std::isnan(in[i]) && std::isnan(out[i]);
  EXPECT_GE(nans, 6);
}

// Mamba-2's time step: shapes with ld > H (dt_raw is a column slice of the
// in_proj rows), N not a multiple of 32, one row; limits the model's default
// [0, inf), a window that clamps on both sides, and a window whose ends are
// two elements' own softplus values (sp == lo and sp == hi are not clamped).
// Column 1 holds the softplus threshold (v = 20 exactly and one ulp either
// side), column 0 very negative v (exp(-v) overflows in sigmoid, exp(v) is
// subnormal or 0), +-Inf and one NaN (so column 0's bias gradient is NaN).
struct DtShape {
  int64_t N, H, ld;
};
const DtShape kDtShapes[] = {{67, 8, 13}, {1, 3, 3}, {32, 5, 9}, {130, 17, 24}};

struct DtInputs {
  Vec raw, bias, ddt;
  std::vector<std::pair<double, double>> limits;
};

DtInputs dt_inputs(const DtShape& s, uint64_t seed) {
  const auto [N, H, ld] = s;
  DtInputs in;
  in.raw = randn(static_cast<size_t>(N * ld), seed, 4.0f);
  in.bias = randn(static_cast<size_t>(H), seed + 1);
  in.ddt = randn(static_cast<size_t>(N * H), seed + 2);
  const float inf = std::numeric_limits<float>::infinity();
  in.bias[0] = 0.5f, in.bias[1] = -1.0f;  // exact: v = raw + bias is what the cases say
  const float col0[] = {-90.0f, -200.0f, -88.5f, inf, -inf, 30.0f};
  const float col1[] = {21.0f, std::nextafter(21.0f, inf), std::nextafter(21.0f, -inf), 19.0f, 22.0f};
  for (int64_t n = 0; n < N; ++n) {
    in.raw[static_cast<size_t>(n * ld)] = col0[n % 6];
    in.raw[static_cast<size_t>(n * ld + 1)] = col1[n % 5];
  }
  in.raw[static_cast<size_t>((N - 1) * ld)] = std::numeric_limits<float>::quiet_NaN();
  // the limits: the default, a window, and two elements' softplus values
  std::vector<float> sp;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t h = 0; h < H; ++h) {
      const float v = softplus(in.raw[static_cast<size_t>(n * ld + h)] + in.bias[static_cast<size_t>(h)]);
      if (std::isfinite(v)) sp.push_back(v);
    }
  std::sort(sp.begin(), sp.end());
  in.limits = {{0.0, std::numeric_limits<double>::infinity()},
               {0.05, 3.0},
               {sp[sp.size() / 4], sp[3 * sp.size() / 4]}};
  return in;
}

// The device's budget for the time step, in u = 2^-23 (at least an ulp,
// relative) and d = 2^-149 (the smallest subnormal). v = raw + bias is the
// same on both sides, and so is softplus above the threshold (v itself).
// Below it: expf is within 2 ulp on the device and 1 in glibc, so e =
// exp(v) differs by 3u relative (3d where it is subnormal); log1p has
// condition number e / ((1 + e) log1p(e)) <= 1 and is within 2 ulp on
// either side: softplus within 7u |sp| + 7d, tested with 8u |sp| + 8d; the
// clamp to the same lo, hi moves nothing further apart. An element whose
// softplus is within that of lo or hi may be clamped on one side only
// ("ambiguous"): there either decision is accepted. The gradient: sigmoid =
// 1 / (1 + exp(-v)), exp 3u, the add and the division a rounding on each
// side, 7u of s (or both under 2^-127 where exp(-v) overflows on one side),
// times ddt a rounding each side: tol_g = 10u |g| + 2^-126 |ddt| + 2d.
// ddt_raw += g adds a rounding of the result on each side (2 ulp). The bias
// gradient sums the terms in the CPU's order on both sides: at each add the
// difference grows by the terms' difference and by the two results'
// roundings, bounded by walking that order with the CPU's partials.
struct DtBudget {
  double u = std::ldexp(1.0, -23), d = std::ldexp(1.0, -149);
  static double ulp(float f) {
    if (!std::isfinite(f)) return 0.0;
    const float a = std::fabs(f), up = std::nextafter(a, std::numeric_limits<float>::infinity());
    return std::isfinite(up) ? static_cast<double>(up) - a : static_cast<double>(a) - std::nextafter(a, 0.0f);
  }
  double sp_tol(float sp) const { return 8 * u * std::fabs(sp) + 8 * d; }
  double g_tol(double g, float ddt) const { return 10 * u * std::fabs(g) + std::ldexp(1.0, -126) * std::fabs(ddt) + 2 * d; }
  static bool near(float got, float want, double tol) {
    if (std::isnan(want)) return std::isnan(got);
    if (!std::isfinite(want)) return got == want;
    return std::fabs(static_cast<double>(got) - want) <= tol;
  }
};

// Forward and backward against the budget (on a device; the emulation,
// which equals the CPU, must pass it too).
void expect_dt_within_budget(const DtShape& s, const DtInputs& in, double lo, double hi, const Vec& dt,
                             const Vec& got_dt, const Vec& draw0, const Vec& draw, const Vec& got_draw,
                             const Vec& dbias0, const Vec& dbias, const Vec& got_dbias) {
  const auto [N, H, ld] = s;
  const DtBudget B;
  const float lof = static_cast<float>(lo), hif = static_cast<float>(hi);
  std::vector<double> acc_tol(static_cast<size_t>(H), 0.0), part_tol(static_cast<size_t>(H), 0.0);
  Vec acc = dbias0, part(static_cast<size_t>(H), 0.0f);
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t h = 0; h < H; ++h) {
      const size_t i = static_cast<size_t>(n * H + h), r = static_cast<size_t>(n * ld + h);
      const float v = in.raw[r] + in.bias[static_cast<size_t>(h)], sp = softplus(v);
      const double tsp = v > 20.0f ? 0.0 : B.sp_tol(sp);
      ASSERT_TRUE(DtBudget::near(got_dt[i], dt[i], tsp)) << "dt " << n << "," << h << ": " << got_dt[i] << " vs " << dt[i];
      const bool live = !(sp < lof || sp > hif);
      const bool ambiguous =
          tsp > 0 && (std::fabs(static_cast<double>(sp) - lof) <= tsp || std::fabs(static_cast<double>(sp) - hif) <= tsp);
      const float g = in.ddt[i] * (v > 20.0f ? 1.0f : sigmoid(v));  // the CPU's term
      const double tg = v > 20.0f ? 0.0 : B.g_tol(static_cast<double>(in.ddt[i]) / (1.0 + std::exp(-static_cast<double>(v))), in.ddt[i]);
      // ddt_raw: the CPU's value, or where the decision may differ, the other one
      const float alt = live ? draw0[r] : draw0[r] + g;
      const bool ok = DtBudget::near(got_draw[r], draw[r], tg + 2 * DtBudget::ulp(draw[r])) ||
                      (ambiguous && DtBudget::near(got_draw[r], alt, tg + 2 * DtBudget::ulp(alt)));
      ASSERT_TRUE(ok) << "ddt_raw " << n << "," << h << ": " << got_draw[r] << " vs " << draw[r];
      // the bias gradient's row-block partial, in the CPU's order
      const float term = live ? g : 0.0f;
      const float p = part[static_cast<size_t>(h)] + term;
      const double dterm = ambiguous ? std::fabs(static_cast<double>(g)) + tg : (live ? tg : 0.0);
      part_tol[static_cast<size_t>(h)] = (part_tol[static_cast<size_t>(h)] + dterm) * (1 + 2 * B.u) + 2 * DtBudget::ulp(p) + B.d;
      part[static_cast<size_t>(h)] = p;
    }
    if ((n + 1) % 32 == 0 || n + 1 == N)  // a row block ends: acc += its partial
      for (int64_t h = 0; h < H; ++h) {
        const size_t c = static_cast<size_t>(h);
        const float a = acc[c] + part[c];
        acc_tol[c] = (acc_tol[c] + part_tol[c]) * (1 + 2 * B.u) + 2 * DtBudget::ulp(a) + B.d;
        acc[c] = a, part[c] = 0.0f, part_tol[c] = 0.0;
      }
  }
  for (int64_t h = 0; h < H; ++h) {
    const size_t c = static_cast<size_t>(h);
    ASSERT_TRUE(bits(acc[c]) == bits(dbias[c]) || (std::isnan(acc[c]) && std::isnan(dbias[c])))
        << "the budget's walk is the CPU's order, column " << h;
    ASSERT_TRUE(DtBudget::near(got_dbias[c], dbias[c], acc_tol[c])) << "ddt_bias " << h << ": " << got_dbias[c] << " vs " << dbias[c];
  }
  // the columns of dt_raw's rows past H are untouched
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = H; c < ld; ++c)
      ASSERT_EQ(bits(got_draw[static_cast<size_t>(n * ld + c)]), bits(draw0[static_cast<size_t>(n * ld + c)]));
}

TEST(LayerKernels, MambaTimeStep) {
  EXMY_REQUIRE_CUDA();
  int at_lo = 0, below_lo = 0, at_hi = 0, above_hi = 0, live = 0;
  for (const DtShape& s : kDtShapes) {
    const auto [N, H, ld] = s;
    const DtInputs in = dt_inputs(s, 80 + static_cast<uint64_t>(N));
    for (const auto& [lo, hi] : in.limits) {
      const std::string what = "time step " + std::to_string(N) + "x" + std::to_string(H) + " ld " +
                               std::to_string(ld) + " [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
      Vec dt(static_cast<size_t>(N * H));
      mamba_dt_forward(dt.data(), in.raw.data(), ld, in.bias.data(), N, H, lo, hi);
      // gradients start non-zero (the kernels add, as the CPU does), whole rows of ddt_raw at -0
      Vec draw0 = randn(in.raw.size(), 90, 0.1f), dbias0 = randn(in.bias.size(), 91);
      for (int64_t n = 2; n < N; n += 5)
        for (int64_t c = 0; c < ld; ++c) draw0[static_cast<size_t>(n * ld + c)] = -0.0f;
      Vec draw = draw0, dbias = dbias0;
      mamba_dt_backward(draw.data(), ld, dbias.data(), in.ddt.data(), in.raw.data(), in.bias.data(), N, H, lo, hi);
      Buffer kraw(in.raw), kbias(in.bias), kddt(in.ddt), kdt(Vec(dt.size(), -1.0f)), kdraw(draw0), kdbias(dbias0);
      Buffer scratch(Vec(static_cast<size_t>(mamba_dt_backward_scratch(N, H)), std::numeric_limits<float>::quiet_NaN()));
      KERNEL(mamba_dt_forward)(kdt.ptr(), kraw.ptr(), ld, kbias.ptr(), N, H, lo, hi);
      KERNEL(mamba_dt_backward)(kdraw.ptr(), ld, kdbias.ptr(), kddt.ptr(), kraw.ptr(), kbias.ptr(), N, H, lo, hi,
                                scratch.ptr());
      const Vec got_dt = kdt.get(), got_draw = kdraw.get(), got_dbias = kdbias.get();
      if (!kOnDevice) {
        expect_bits(got_dt, dt, what + " dt");
        expect_bits(got_draw, draw, what + " ddt_raw");
        expect_bits(got_dbias, dbias, what + " ddt_bias");
      }
      SCOPED_TRACE(what);
      expect_dt_within_budget(s, in, lo, hi, dt, got_dt, draw0, draw, got_draw, dbias0, dbias, got_dbias);
      for (int64_t n = 0; n < N; ++n)
        for (int64_t h = 0; h < H; ++h) {
          const float sp = softplus(in.raw[static_cast<size_t>(n * ld + h)] + in.bias[static_cast<size_t>(h)]);
          at_lo += sp == static_cast<float>(lo) && lo > 0, below_lo += sp < static_cast<float>(lo);
          at_hi += sp == static_cast<float>(hi), above_hi += sp > static_cast<float>(hi);
          live += !(sp < static_cast<float>(lo) || sp > static_cast<float>(hi));
        }
    }
  }
  // the cases reach both clamps, their exact ends and the gradient's path
  EXPECT_GT(at_lo, 0);
  EXPECT_GT(below_lo, 0);
  EXPECT_GT(at_hi, 0);
  EXPECT_GT(above_hi, 0);
  EXPECT_GT(live, 0);
}

}  // namespace
}  // namespace exmy::models

// The device's `fp32` and `bf16` Linears (sim/cuda/linear_cuda.hpp) against
// the CPU's (sim::make_linear_factory<float>): each of the three GEMMs,
// forward Y = X W^T, dgrad dX += dY W, wgrad dW += dY^T X, within a derived
// budget of the CPU's result and of the exact product; the same calls twice
// give the same bits; recompute_forward gives forward's bits; backward
// without dX gives the same dW; the operand rounding kernel equals
// sim::round_bf16 bit for bit. Label "gpu", SKIPPED without a device.
//
// The budget (tests/sim/test_gemm_cuda.cpp's derivation). Each output is a
// sum of n = K products (K = in for forward, out for dgrad, tokens for
// wgrad), plus the old dX or dW when accumulating (n = K + 1). Summed in
// float arithmetic in any order, with or without fused multiply-adds, the
// computed value is within gamma_n * (sum_k |a_k b_k| + |c|), gamma_n =
// n u / (1 - n u), of the exact one (Higham, Accuracy and Stability of
// Numerical Algorithms, 2nd ed., §3.1). The device's FP32 GEMM rounds to
// nearest: u = 2^-24; its BF16 GEMM runs on the tensor cores, whose FP32
// accumulation truncates (Fasi, Higham, Mikaitis, Pranesh, PeerJ CS 2021):
// u = 2^-23. The CPU's float GEMM: u = 2^-24. The a_k, b_k are the operands
// both sides multiply: as given for `fp32`, rounded to bfloat16 for `bf16`
// (products of bfloat16 values are exact in float on both sides). So the
// device is within gamma_dev * mag of the exact product (computed in double
// from the same operands), and within (gamma_dev + gamma_cpu) * mag of the
// CPU. Had the device not rounded an operand to bfloat16 (or rounded one
// the CPU keeps), the difference would be of the order of 2^-9 of the
// terms, far outside this budget for every shape below.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "formats/error.hpp"
#include "sim/cuda/gemm_cuda.hpp"
#include "sim/cuda/linear_cuda.hpp"
#include "sim/linear.hpp"
#include "tests/require_cuda.hpp"

namespace exmy::sim {
namespace {

using Vec = std::vector<float>;

void ok(cudaError_t e) { ASSERT_EQ(e, cudaSuccess) << cudaGetErrorString(e); }

// A device copy of a host vector.
template <class T>
class DeviceVec {
 public:
  explicit DeviceVec(const std::vector<T>& v) : n_(v.size()) {
    EXPECT_EQ(cudaMalloc(&p_, sizeof(T) * std::max<size_t>(n_, 1)), cudaSuccess);
    set(v);
  }
  ~DeviceVec() { cudaFree(p_); }
  DeviceVec(const DeviceVec&) = delete;
  DeviceVec& operator=(const DeviceVec&) = delete;
  T* ptr() { return p_; }
  void set(const std::vector<T>& v) {
    EXPECT_EQ(v.size(), n_);
    if (n_) {
      EXPECT_EQ(cudaMemcpy(p_, v.data(), sizeof(T) * n_, cudaMemcpyHostToDevice), cudaSuccess);
    }
  }
  std::vector<T> get() const {
    std::vector<T> v(n_);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    if (n_) {
      EXPECT_EQ(cudaMemcpy(v.data(), p_, sizeof(T) * n_, cudaMemcpyDeviceToHost), cudaSuccess);
    }
    return v;
  }

 private:
  T* p_ = nullptr;
  size_t n_;
};

Vec randn(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, scale);
  Vec v(n);
  for (float& x : v) x = d(g);
  return v;
}

bool same_bits(const Vec& a, const Vec& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), sizeof(float) * a.size()) == 0);
}

struct Shape {
  int64_t tokens, in, out;
};
// One element; odd sizes; K of each GEMM up to 1000; a wide and a long one.
const Shape kShapes[] = {{1, 1, 1}, {3, 7, 5}, {37, 29, 23}, {130, 96, 64}, {64, 1000, 33}, {512, 64, 384}, {8, 256, 512}};

// One layer's operands: X (tokens, in), W (out, in), dY (tokens, out), and
// the old dX, dW backward adds to.
struct Operands {
  Vec X, W, dY, dX0, dW0;
  Operands(const Shape& s, uint32_t seed)
      : X(randn(static_cast<size_t>(s.tokens * s.in), seed)),
        W(randn(static_cast<size_t>(s.out * s.in), seed + 1, 0.25f)),
        dY(randn(static_cast<size_t>(s.tokens * s.out), seed + 2)),
        dX0(randn(static_cast<size_t>(s.tokens * s.in), seed + 3, 4.0f)),
        dW0(randn(static_cast<size_t>(s.out * s.in), seed + 4, 4.0f)) {}
};

// The CPU's results of one layer.
struct Results {
  Vec Y, dX, dW;
};

Results cpu_results(std::string_view policy, const LinearInfo& info, const Operands& o, int64_t tokens) {
  auto lin = make_linear_factory<float>(policy)->make(info);
  Results r{Vec(o.dY.size()), o.dX0, o.dW0};
  lin->forward(r.Y.data(), o.X.data(), o.W.data(), tokens);
  lin->backward(r.dX.data(), r.dW.data(), o.dY.data(), o.X.data(), o.W.data(), tokens);
  return r;
}

// Checks dev (M x N) against the exact product sum_k a(i,k) b(k,j) (+ c0)
// of the operands q() makes, within the device's budget, and against the
// CPU's result cpu within the sum of both budgets. Returns the largest
// error as a fraction of the device's budget.
template <class A, class B>
double check_gemm(const std::string& what, const Vec& dev, const Vec& cpu, const Vec* c0, int64_t M, int64_t N,
                  int64_t K, A a, B b, bool bf16) {
  const double u_dev = bf16 ? std::ldexp(1.0, -23) : std::ldexp(1.0, -24), u_cpu = std::ldexp(1.0, -24);
  const double n = static_cast<double>(K + (c0 ? 1 : 0));
  const double g_dev = n * u_dev / (1 - n * u_dev), g_cpu = n * u_cpu / (1 - n * u_cpu);
  auto q = [&](float v) { return bf16 ? static_cast<double>(round_bf16(v)) : static_cast<double>(v); };
  double worst = 0;
  int bad = 0;
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      const size_t at = static_cast<size_t>(i * N + j);
      double exact = c0 ? (*c0)[at] : 0.0, mag = c0 ? std::fabs((*c0)[at]) : 0.0;
      for (int64_t k = 0; k < K; ++k) {
        const double p = q(a(i, k)) * q(b(k, j));
        exact += p;
        mag += std::fabs(p);
      }
      const double err = std::fabs(dev[at] - exact), budget = g_dev * mag;
      worst = std::max(worst, budget > 0 ? err / budget : err);
      if (err > budget && bad++ < 5)
        ADD_FAILURE() << what << "(" << i << "," << j << ") = " << dev[at] << ", exact " << exact << ", error " << err
                      << " > budget " << budget;
      const double to_cpu = std::fabs(static_cast<double>(dev[at]) - cpu[at]);
      if (to_cpu > (g_dev + g_cpu) * mag && bad++ < 5)
        ADD_FAILURE() << what << "(" << i << "," << j << ") = " << dev[at] << " differs from the CPU's " << cpu[at]
                      << " by " << to_cpu << " > budget " << (g_dev + g_cpu) * mag;
    }
  return worst;
}

// The device's three GEMMs of one layer against the CPU's.
void check_results(const std::string& policy, const Shape& s, const Operands& o, const Results& dev,
                   const Results& cpu) {
  const bool bf16 = policy == "bf16";
  const int64_t T = s.tokens, I = s.in, O = s.out;
  const std::string tag = policy + " " + std::to_string(T) + "x" + std::to_string(I) + "->" + std::to_string(O) + " ";
  const double wy = check_gemm(
      tag + "Y", dev.Y, cpu.Y, nullptr, T, O, I, [&](int64_t t, int64_t i) { return o.X[t * I + i]; },
      [&](int64_t i, int64_t k) { return o.W[k * I + i]; }, bf16);
  const double wx = check_gemm(
      tag + "dX", dev.dX, cpu.dX, &o.dX0, T, I, O, [&](int64_t t, int64_t k) { return o.dY[t * O + k]; },
      [&](int64_t k, int64_t i) { return o.W[k * I + i]; }, bf16);
  const double ww = check_gemm(
      tag + "dW", dev.dW, cpu.dW, &o.dW0, O, I, T, [&](int64_t k, int64_t t) { return o.dY[t * O + k]; },
      [&](int64_t t, int64_t i) { return o.X[t * I + i]; }, bf16);
  std::printf("  %s: largest error of its budget: Y %.3g, dX %.3g, dW %.3g\n", tag.c_str(), wy, wx, ww);
}

LinearInfo info_of(const Shape& s, int layer) {
  return LinearInfo{"layers." + std::to_string(layer) + ".mixer.up_proj", layer, LinearKind::mlp_up, s.in, s.out};
}

// Every shape as one layer of a model, all made by one factory (so the
// `bf16` Linears share their scratch, which grows and is reused): forwards
// in layer order, backwards in reverse, each checked against the CPU.
void check_policy(const std::string& policy) {
  CudaGemm gemm;
  auto factory = make_cuda_linear_factory(policy, gemm);
  EXPECT_EQ(factory->policy(), policy);
  const size_t L = std::size(kShapes);
  std::vector<std::unique_ptr<Linear<float>>> lins;
  std::vector<Operands> ops;
  std::vector<Results> cpu;
  for (size_t l = 0; l < L; ++l) {
    lins.push_back(factory->make(info_of(kShapes[l], static_cast<int>(l))));
    EXPECT_EQ(lins.back()->info().name, info_of(kShapes[l], static_cast<int>(l)).name);
    ops.emplace_back(kShapes[l], static_cast<uint32_t>(100 + 10 * l));
    cpu.push_back(cpu_results(policy, lins.back()->info(), ops.back(), kShapes[l].tokens));
  }
  struct Dev {
    DeviceVec<float> X, W, dY, Y, dX, dW;
  };
  std::vector<std::unique_ptr<Dev>> dev;
  for (size_t l = 0; l < L; ++l)
    dev.emplace_back(new Dev{DeviceVec<float>(ops[l].X), DeviceVec<float>(ops[l].W), DeviceVec<float>(ops[l].dY),
                             DeviceVec<float>(Vec(ops[l].dY.size(), NAN)), DeviceVec<float>(ops[l].dX0),
                             DeviceVec<float>(ops[l].dW0)});
  for (size_t l = 0; l < L; ++l) lins[l]->forward(dev[l]->Y.ptr(), dev[l]->X.ptr(), dev[l]->W.ptr(), kShapes[l].tokens);
  for (size_t l = L; l-- > 0;)
    lins[l]->backward(dev[l]->dX.ptr(), dev[l]->dW.ptr(), dev[l]->dY.ptr(), dev[l]->X.ptr(), dev[l]->W.ptr(),
                      kShapes[l].tokens);
  for (size_t l = 0; l < L; ++l) {
    const Results got{dev[l]->Y.get(), dev[l]->dX.get(), dev[l]->dW.get()};
    check_results(policy, kShapes[l], ops[l], got, cpu[l]);
  }
}

TEST(CudaLinear, Fp32GemmsWithinBudgetOfTheCpu) {
  EXMY_REQUIRE_CUDA();
  check_policy("fp32");
}

TEST(CudaLinear, Bf16GemmsWithinBudgetOfTheCpu) {
  EXMY_REQUIRE_CUDA();
  check_policy("bf16");
}

// The same calls twice give the same bits; recompute_forward gives
// forward's; backward without dX gives the same dW.
TEST(CudaLinear, DeterministicRecomputeAndNoDx) {
  EXMY_REQUIRE_CUDA();
  CudaGemm gemm;
  for (const std::string policy : {"fp32", "bf16"}) {
    auto factory = make_cuda_linear_factory(policy, gemm);
    for (const Shape& s : {Shape{130, 96, 64}, Shape{64, 1000, 33}}) {
      SCOPED_TRACE(policy + " " + std::to_string(s.tokens) + "x" + std::to_string(s.in) + "->" + std::to_string(s.out));
      auto lin = factory->make(info_of(s, 0));
      const Operands o(s, 7);
      DeviceVec<float> X(o.X), W(o.W), dY(o.dY), Y(Vec(o.dY.size(), NAN)), dX(o.dX0), dW(o.dW0);
      auto step = [&] {
        dX.set(o.dX0);
        dW.set(o.dW0);
        lin->forward(Y.ptr(), X.ptr(), W.ptr(), s.tokens);
        lin->backward(dX.ptr(), dW.ptr(), dY.ptr(), X.ptr(), W.ptr(), s.tokens);
        return Results{Y.get(), dX.get(), dW.get()};
      };
      const Results a = step(), b = step();
      EXPECT_TRUE(same_bits(a.Y, b.Y)) << "forward differs between two calls";
      EXPECT_TRUE(same_bits(a.dX, b.dX)) << "dgrad differs between two calls";
      EXPECT_TRUE(same_bits(a.dW, b.dW)) << "wgrad differs between two calls";
      Y.set(Vec(o.dY.size(), NAN));
      lin->recompute_forward(Y.ptr(), X.ptr(), W.ptr(), s.tokens);
      EXPECT_TRUE(same_bits(Y.get(), a.Y)) << "recompute_forward differs from forward";
      dW.set(o.dW0);
      lin->backward(nullptr, dW.ptr(), dY.ptr(), X.ptr(), W.ptr(), s.tokens);
      EXPECT_TRUE(same_bits(dW.get(), a.dW)) << "dW differs without dX";
    }
  }
}

// No tokens: forward writes nothing, backward adds nothing.
TEST(CudaLinear, NoTokensChangesNothing) {
  EXMY_REQUIRE_CUDA();
  CudaGemm gemm;
  for (const std::string policy : {"fp32", "bf16"}) {
    auto lin = make_cuda_linear_factory(policy, gemm)->make(info_of(Shape{0, 5, 3}, 0));
    const Vec w = randn(15, 1), dw0 = randn(15, 2);
    DeviceVec<float> W(w), dW(dw0), X(Vec{}), dY(Vec{}), Y(Vec{}), dX(Vec{});
    lin->forward(Y.ptr(), X.ptr(), W.ptr(), 0);
    lin->backward(dX.ptr(), dW.ptr(), dY.ptr(), X.ptr(), W.ptr(), 0);
    EXPECT_TRUE(same_bits(dW.get(), dw0)) << policy;
  }
}

// The operand rounding on the device is sim::round_bf16's, bit for bit:
// every exponent, both signs, the patterns of the dropped bits around a
// tie, random floats, and the specials (NaN with payloads, Inf, FLT_MAX).
TEST(CudaLinear, RoundingKernelIsRoundBf16) {
  EXMY_REQUIRE_CUDA();
  std::vector<uint32_t> cases;
  std::mt19937 g(5);
  for (uint32_t sign : {0u, 1u})
    for (uint32_t e = 0; e < 256; ++e)
      for (uint32_t hi : {0u, 1u, 0x7eu, 0x7fu, 0x55u})
        for (uint32_t lo : {0x0000u, 0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu, static_cast<uint32_t>(g() & 0xffffu)})
          cases.push_back((sign << 31) | (e << 23) | (hi << 16) | lo);
  for (int i = 0; i < 100000; ++i) cases.push_back(g());
  Vec x(cases.size());
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::bit_cast<float>(cases[i]);
  DeviceVec<float> in(x);
  DeviceVec<uint16_t> out(std::vector<uint16_t>(x.size(), 0));
  bf16_bits_cuda(out.ptr(), in.ptr(), static_cast<int64_t>(x.size()));
  ok(cudaGetLastError());
  const std::vector<uint16_t> got = out.get();
  int bad = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const uint32_t want = std::bit_cast<uint32_t>(round_bf16(x[i]));
    if ((static_cast<uint32_t>(got[i]) << 16) != want && bad++ < 5)
      ADD_FAILURE() << std::hex << "input 0x" << cases[i] << ": device 0x" << got[i] << ", CPU 0x" << (want >> 16);
  }
}

TEST(CudaLinear, UnknownPolicyIsAOneLineError) {
  EXMY_REQUIRE_CUDA();
  CudaGemm gemm;
  try {
    make_cuda_linear_factory("fp8", gemm);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "unknown precision policy 'fp8' (expected fp32 or bf16)");
  }
}

}  // namespace
}  // namespace exmy::sim

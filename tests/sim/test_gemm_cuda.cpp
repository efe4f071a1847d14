// sim::CudaGemm (cuBLASLt) on a CUDA device, against a double-precision
// product of the same operands and against the CPU's sim::gemm; label
// "gpu", SKIPPED without a device.
//
// The budget. Each output is a sum of n = K products, plus C when
// accumulating (n = K + 1). Summed in float arithmetic in any order, with
// or without fused multiply-adds, the computed value is within
//   gamma_n * (sum_k |a_ik b_kj| + |c_ij|),  gamma_n = n u / (1 - n u),
// of the exact one (Higham, Accuracy and Stability of Numerical Algorithms,
// 2nd ed., §3.1: every path from a term to the result passes at most n
// roundings, each a factor (1 + d) with |d| <= u). FP32 operands run on the
// CUDA cores with round-to-nearest: u = 2^-24. BF16 operands run on the
// tensor cores, whose products of BF16 values are exact in FP32 but whose
// FP32 accumulation truncates when it aligns and normalises (Fasi, Higham,
// Mikaitis, Pranesh, "Numerical behavior of NVIDIA tensor cores", PeerJ CS
// 2021): each rounding is then toward zero, |d| < 2^-23, so u = 2^-23. The
// reference is the exact product (in double: K <= 4096 terms of 16-bit or
// 24-bit significand products, whose double sum errs by far less than the
// budget) of the very operands the device got (BF16: the inputs rounded to
// BF16 first). The CPU's float result obeys the same bound with u = 2^-24,
// so device and CPU differ by at most the sum of the two budgets.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>
#include <type_traits>
#include <vector>

#include "sim/cuda/gemm_cuda.hpp"
#include "sim/gemm.hpp"
#include "tests/require_cuda.hpp"

namespace exmy::sim {
namespace {

void ok(cudaError_t e) { ASSERT_EQ(e, cudaSuccess) << cudaGetErrorString(e); }

// bfloat16 bits of x, rounded to nearest even (finite x).
uint16_t bf16_bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
float bf16_value(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

// v on the device, `offset` elements past a cudaMalloc'd (256-byte aligned)
// start; free with release(p, offset).
template <class T>
T* upload(const std::vector<T>& v, int64_t offset = 0) {
  T* d = nullptr;
  EXPECT_EQ(cudaMalloc(&d, sizeof(T) * (v.size() + static_cast<size_t>(offset))), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(d + offset, v.data(), sizeof(T) * v.size(), cudaMemcpyHostToDevice), cudaSuccess);
  return d + offset;
}
template <class T>
void release(T* p, int64_t offset) {
  cudaFree(const_cast<std::remove_const_t<T>*>(p) - offset);
}

// v rounded to bfloat16 in place; returns the bfloat16 bits, which a BF16
// GEMM reads.
std::vector<uint16_t> to_bf16(std::vector<float>& v) {
  std::vector<uint16_t> bits(v.size());
  for (size_t i = 0; i < v.size(); ++i) v[i] = bf16_value(bits[i] = bf16_bits(v[i]));
  return bits;
}

std::vector<float> download(const float* d, size_t n) {
  std::vector<float> v(n);
  EXPECT_EQ(cudaMemcpy(v.data(), d, sizeof(float) * n, cudaMemcpyDeviceToHost), cudaSuccess);
  return v;
}

struct Case {
  int64_t M, N, K;
  Op opA, opB;
  bool accumulate;
  int64_t pad;  // extra elements per row of every matrix
  int64_t offset = 0;  // every matrix starts this many elements past a 256-byte boundary
};

// One product on the device, checked against the exact product within the
// budget, run twice for identical bits, and (FP32) against the CPU.
void check_case(CudaGemm& g, const Case& c, GemmOperands kind, std::mt19937& rng) {
  const int64_t M = c.M, N = c.N, K = c.K;
  const int64_t ar = c.opA == Op::N ? M : K, ac = c.opA == Op::N ? K : M;
  const int64_t br = c.opB == Op::N ? K : N, bc = c.opB == Op::N ? N : K;
  const int64_t lda = ac + c.pad, ldb = bc + c.pad, ldc = N + c.pad;
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> A(static_cast<size_t>(ar * lda)), B(static_cast<size_t>(br * ldb)), C0(static_cast<size_t>(M * ldc));
  for (float& v : A) v = normal(rng);
  for (float& v : B) v = normal(rng) * 0.25f;
  for (float& v : C0) v = normal(rng) * 4.0f;
  std::vector<uint16_t> Ab, Bb;
  if (kind == GemmOperands::bf16) Ab = to_bf16(A), Bb = to_bf16(B);
  const int64_t off = c.offset;
  const void* dA = kind == GemmOperands::bf16 ? static_cast<const void*>(upload(Ab, off)) : upload(A, off);
  const void* dB = kind == GemmOperands::bf16 ? static_cast<const void*>(upload(Bb, off)) : upload(B, off);
  float* dC = upload(C0, off);
  g.run(dC, ldc, dA, lda, c.opA, dB, ldb, c.opB, M, N, K, c.accumulate, kind);
  ok(cudaDeviceSynchronize());
  const std::vector<float> got = download(dC, C0.size());
  // the same call again on the same inputs: the same bits
  ok(cudaMemcpy(dC, C0.data(), sizeof(float) * C0.size(), cudaMemcpyHostToDevice));
  g.run(dC, ldc, dA, lda, c.opA, dB, ldb, c.opB, M, N, K, c.accumulate, kind);
  ok(cudaDeviceSynchronize());
  const std::vector<float> again = download(dC, C0.size());
  EXPECT_EQ(std::memcmp(got.data(), again.data(), sizeof(float) * got.size()), 0) << "two runs differ";

  std::vector<float> cpu = C0;
  if (kind == GemmOperands::fp32) gemm(cpu.data(), ldc, A.data(), lda, c.opA, B.data(), ldb, c.opB, M, N, K, c.accumulate);
  const double u = kind == GemmOperands::bf16 ? std::ldexp(1.0, -23) : std::ldexp(1.0, -24);
  const double n = static_cast<double>(K + (c.accumulate ? 1 : 0));
  const double gamma = n * u / (1 - n * u), gamma_cpu = n * std::ldexp(1.0, -24) / (1 - n * std::ldexp(1.0, -24));
  auto a_at = [&](int64_t i, int64_t k) { return c.opA == Op::N ? A[i * lda + k] : A[k * lda + i]; };
  auto b_at = [&](int64_t k, int64_t j) { return c.opB == Op::N ? B[k * ldb + j] : B[j * ldb + k]; };
  int bad = 0;
  double worst = 0;  // the largest error as a fraction of its budget
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double exact = c.accumulate ? C0[i * ldc + j] : 0.0, mag = c.accumulate ? std::fabs(C0[i * ldc + j]) : 0.0;
      for (int64_t k = 0; k < K; ++k) {
        const double p = static_cast<double>(a_at(i, k)) * b_at(k, j);
        exact += p;
        mag += std::fabs(p);
      }
      const double err = std::fabs(got[i * ldc + j] - exact), budget = gamma * mag;
      worst = std::max(worst, budget > 0 ? err / budget : err);
      if (err > budget && bad++ < 5)
        ADD_FAILURE() << "C(" << i << "," << j << ") = " << got[i * ldc + j] << ", exact " << exact << ", error " << err
                      << " > budget " << budget;
      if (kind == GemmOperands::fp32 && std::fabs(got[i * ldc + j] - cpu[i * ldc + j]) > (gamma + gamma_cpu) * mag &&
          bad++ < 5)
        ADD_FAILURE() << "C(" << i << "," << j << ") differs from the CPU's " << cpu[i * ldc + j];
    }
  // columns past N (the padding) are untouched
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = N; j < ldc; ++j) ASSERT_EQ(got[i * ldc + j], C0[i * ldc + j]) << "padding written";
  std::printf("  %lldx%lldx%lld: largest error %.3g of its budget\n", static_cast<long long>(M), static_cast<long long>(N),
              static_cast<long long>(K), worst);
  if (kind == GemmOperands::bf16) {
    release(static_cast<const uint16_t*>(dA), off);
    release(static_cast<const uint16_t*>(dB), off);
  } else {
    release(static_cast<const float*>(dA), off);
    release(static_cast<const float*>(dB), off);
  }
  release(dC, off);
}

const Case kCases[] = {
    {1, 1, 1, Op::N, Op::N, false, 0},      {3, 5, 7, Op::N, Op::T, true, 1},
    {17, 33, 65, Op::T, Op::N, false, 3},   {64, 128, 256, Op::T, Op::T, true, 0},
    {130, 70, 1000, Op::N, Op::N, true, 5}, {8, 4096, 64, Op::N, Op::T, false, 0},
    {256, 96, 4096, Op::T, Op::N, true, 0},
    // matrices that start off a 256-byte boundary (cuBLASLt's heuristic is
    // told their alignment): 4, 16 and 64 bytes in (fp32), 2, 8, 32 (bf16)
    {200, 136, 128, Op::N, Op::T, false, 0, 1}, {96, 64, 256, Op::T, Op::N, true, 0, 4},
    {128, 128, 64, Op::N, Op::N, false, 0, 16},
};

// Every case of kCases with operands of one kind.
void check_cases(GemmOperands kind, uint32_t seed) {
  CudaGemm g;
  std::mt19937 rng(seed);
  for (const Case& c : kCases) {
    SCOPED_TRACE(testing::Message() << c.M << "x" << c.N << "x" << c.K << " op " << int(c.opA) << int(c.opB)
                                    << (c.accumulate ? " accumulate" : ""));
    check_case(g, c, kind, rng);
  }
}

TEST(CudaGemm, Fp32WithinBudgetDeterministicAndNearTheCpu) {
  EXMY_REQUIRE_CUDA();
  check_cases(GemmOperands::fp32, 11);
}

TEST(CudaGemm, Bf16OperandsWithinBudgetAndDeterministic) {
  EXMY_REQUIRE_CUDA();
  check_cases(GemmOperands::bf16, 12);
}

// Strided batches (run_batched: attention's and the SSD scan's products on
// a device; BF16 operands: attention's products of bfloat16 pieces,
// models/split_gemm.hpp): each entry within the budget of its exact
// product (the accumulation's unit 2^-23 for BF16, which tensor cores
// truncate), the elements between the entries untouched, and the same bits
// twice.
void check_batches(GemmOperands kind, uint32_t seed) {
  CudaGemm g;
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const Case cases[] = {{64, 200, 128, Op::N, Op::T, false, 2},
                        {200, 128, 64, Op::T, Op::N, true, 0},
                        {5, 3, 7, Op::N, Op::N, true, 1}};
  for (const Case& c : cases) {
    SCOPED_TRACE(testing::Message() << c.M << "x" << c.N << "x" << c.K);
    const int64_t M = c.M, N = c.N, K = c.K, count = 3;
    const int64_t ar = c.opA == Op::N ? M : K, ac = c.opA == Op::N ? K : M;
    const int64_t br = c.opB == Op::N ? K : N, bc = c.opB == Op::N ? N : K;
    const int64_t lda = ac + c.pad, ldb = bc + c.pad, ldc = N + c.pad;
    // each entry followed by a gap of 5 elements
    const int64_t sa = ar * lda + 5, sb = br * ldb + 5, sc = M * ldc + 5;
    std::vector<float> A(static_cast<size_t>(count * sa)), B(static_cast<size_t>(count * sb)),
        C0(static_cast<size_t>(count * sc));
    for (float& v : A) v = normal(rng);
    for (float& v : B) v = normal(rng);
    for (float& v : C0) v = normal(rng);
    std::vector<uint16_t> Ab, Bb;
    if (kind == GemmOperands::bf16) Ab = to_bf16(A), Bb = to_bf16(B);
    const void* dA = kind == GemmOperands::bf16 ? static_cast<const void*>(upload(Ab)) : upload(A);
    const void* dB = kind == GemmOperands::bf16 ? static_cast<const void*>(upload(Bb)) : upload(B);
    float* dC = upload(C0);
    g.run_batched(count, dC, ldc, sc, dA, lda, sa, c.opA, dB, ldb, sb, c.opB, M, N, K, c.accumulate, kind);
    ok(cudaDeviceSynchronize());
    const std::vector<float> got = download(dC, C0.size());
    ok(cudaMemcpy(dC, C0.data(), sizeof(float) * C0.size(), cudaMemcpyHostToDevice));
    g.run_batched(count, dC, ldc, sc, dA, lda, sa, c.opA, dB, ldb, sb, c.opB, M, N, K, c.accumulate, kind);
    ok(cudaDeviceSynchronize());
    EXPECT_EQ(std::memcmp(got.data(), download(dC, C0.size()).data(), sizeof(float) * got.size()), 0)
        << "two runs differ";
    const double u = std::ldexp(1.0, kind == GemmOperands::bf16 ? -23 : -24);
    const double n = static_cast<double>(K + (c.accumulate ? 1 : 0));
    const double gamma = n * u / (1 - n * u);
    int bad = 0;
    for (int64_t t = 0; t < count; ++t) {
      const float* a = A.data() + t * sa;
      const float* b = B.data() + t * sb;
      const int64_t c0 = t * sc;
      for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < ldc; ++j) {
          const size_t at = static_cast<size_t>(c0 + i * ldc + j);
          if (j >= N) {  // the padding
            if (got[at] != C0[at] && bad++ < 5) ADD_FAILURE() << "entry " << t << ": padding written";
            continue;
          }
          double exact = c.accumulate ? C0[at] : 0.0, mag = std::fabs(exact);
          for (int64_t k = 0; k < K; ++k) {
            const double p = static_cast<double>(c.opA == Op::N ? a[i * lda + k] : a[k * lda + i]) *
                             (c.opB == Op::N ? b[k * ldb + j] : b[j * ldb + k]);
            exact += p;
            mag += std::fabs(p);
          }
          if (std::fabs(got[at] - exact) > gamma * mag && bad++ < 5)
            ADD_FAILURE() << "entry " << t << " C(" << i << "," << j << ") = " << got[at] << ", exact " << exact;
        }
      for (int64_t e = M * ldc; e < sc && c0 + e < static_cast<int64_t>(got.size()); ++e)
        if (got[static_cast<size_t>(c0 + e)] != C0[static_cast<size_t>(c0 + e)] && bad++ < 5)
          ADD_FAILURE() << "entry " << t << ": the gap after it was written";
    }
    cudaFree(const_cast<void*>(dA));
    cudaFree(const_cast<void*>(dB));
    cudaFree(dC);
  }
}

TEST(CudaGemm, Fp32BatchesWithinBudgetAndDeterministic) {
  EXMY_REQUIRE_CUDA();
  check_batches(GemmOperands::fp32, 13);
}
TEST(CudaGemm, Bf16BatchesWithinBudgetAndDeterministic) {
  EXMY_REQUIRE_CUDA();
  check_batches(GemmOperands::bf16, 14);
}

// Not a check: the rates of large products on this device (printed; the
// figures in docs/benchmarks.md come from here), the median of 10 timed
// runs after 3 warm-up runs, on normal random operands.
TEST(CudaGemm, RatesOfLargeProducts) {
  EXMY_REQUIRE_CUDA();
  CudaGemm g;
  const int64_t n = 8192;
  std::mt19937 rng(13);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n * n));
  for (float& v : x) v = normal(rng);
  std::vector<uint16_t> xb(x.size());
  for (size_t i = 0; i < x.size(); ++i) xb[i] = bf16_bits(x[i]);
  float* A = upload(x);
  float* C = upload(x);
  uint16_t* Ab = upload(xb);
  cudaEvent_t t0, t1;
  ok(cudaEventCreate(&t0));
  ok(cudaEventCreate(&t1));
  for (GemmOperands kind : {GemmOperands::bf16, GemmOperands::fp32}) {
    const void* a = kind == GemmOperands::bf16 ? static_cast<const void*>(Ab) : A;
    std::vector<float> ms;
    for (int r = 0; r < 13; ++r) {
      ok(cudaEventRecord(t0));
      g.run(C, n, a, n, Op::N, a, n, Op::T, n, n, n, false, kind);
      ok(cudaEventRecord(t1));
      ok(cudaEventSynchronize(t1));
      float t = 0;
      ok(cudaEventElapsedTime(&t, t0, t1));
      if (r >= 3) ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    const double med = 0.5 * (ms[4] + ms[5]);
    std::printf("CudaGemm %s %lldx%lldx%lld: %.3f ms, %.1f TFLOP/s (median of 10)\n",
                kind == GemmOperands::bf16 ? "bf16 operands, fp32 accumulation" : "fp32", static_cast<long long>(n),
                static_cast<long long>(n), static_cast<long long>(n), med, 2.0 * n * n * n / (med * 1e-3) / 1e12);
  }
  cudaFree(A);
  cudaFree(C);
  cudaFree(Ab);
}

}  // namespace
}  // namespace exmy::sim

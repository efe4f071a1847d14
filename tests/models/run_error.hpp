// A number type that carries, next to its value (in double), a first-order
// bound on the rounding error an FP32 evaluation of the same computation may
// have made, in units of u = 2^-24 (Wilkinson's running error bound): each
// + - * / and sqrt adds |result| (one rounding), exp adds 4 |result| (CUDA's
// expf is within 2 ulp, glibc's within 1, and an ulp is at most 2u of the
// value) and turns its argument's bound e into e |result|, log adds 2
// |result| (CUDA's logf and glibc's are within 1 ulp) and turns e into e /
// |argument|, and max carries the larger of its operands' bounds (the max of
// perturbed values is off by at most the largest perturbation). RunErrGemm
// bounds a product's element for ANY order of its K-term sum, with or
// without fused multiply-adds: (K + 1) u times the sum of |terms| (the sum's
// order-free bound K u, the product's rounding u), plus the inputs' bounds
// carried through. Running a kernel's own item functions
// (models/ssd_items.hpp, models/attention_items.hpp) on this type gives
// every output element the error bound of the algorithm as the CPU and the
// device evaluate it.
//
// Included before the item headers: their sim::hd_* calls are qualified
// names, found where the templates are defined.
#pragma once

#include <cmath>
#include <cstdint>

#include "models/split_gemm.hpp"
#include "sim/gemm.hpp"
#include "sim/hd_math.hpp"

namespace exmy::test {

struct RunErr {
  double v = 0, e = 0;
  RunErr() = default;
  RunErr(double value, double err = 0) : v(value), e(err) {}  // NOLINT: converts like a float
};
inline RunErr operator+(RunErr a, RunErr b) { return {a.v + b.v, a.e + b.e + std::fabs(a.v + b.v)}; }
inline RunErr operator-(RunErr a, RunErr b) { return {a.v - b.v, a.e + b.e + std::fabs(a.v - b.v)}; }
inline RunErr operator-(RunErr a) { return {-a.v, a.e}; }
inline RunErr operator*(RunErr a, RunErr b) {
  return {a.v * b.v, std::fabs(a.v) * b.e + std::fabs(b.v) * a.e + std::fabs(a.v * b.v)};
}
inline RunErr operator/(RunErr a, RunErr b) {
  const double r = a.v / b.v;
  return {r, (a.e + std::fabs(r) * b.e) / std::fabs(b.v) + std::fabs(r)};
}
inline RunErr& operator+=(RunErr& a, RunErr b) { return a = a + b; }
inline RunErr& operator-=(RunErr& a, RunErr b) { return a = a - b; }
inline RunErr& operator*=(RunErr& a, RunErr b) { return a = a * b; }

// Output (i, j) of op(A) op(B) in double, added in k order to `d`: its
// value, the inputs' bounds carried through (|a| e_b + |b| e_a summed), the
// terms' magnitude, and the operands' |values| summed along k.
struct RunErrDot {
  double v = 0, e = 0, mag = 0, sum_a = 0, sum_b = 0;
};
inline RunErrDot run_err_dot(RunErrDot d, const RunErr* A, int64_t lda, sim::Op opA, const RunErr* B, int64_t ldb,
                             sim::Op opB, int64_t i, int64_t j, int64_t K) {
  for (int64_t k = 0; k < K; ++k) {
    const RunErr a = opA == sim::Op::N ? A[i * lda + k] : A[k * lda + i];
    const RunErr b = opB == sim::Op::N ? B[k * ldb + j] : B[j * ldb + k];
    d.v += a.v * b.v;
    d.e += std::fabs(a.v) * b.e + std::fabs(b.v) * a.e;
    d.mag += std::fabs(a.v * b.v);
    d.sum_a += std::fabs(a.v), d.sum_b += std::fabs(b.v);
  }
  return d;
}

struct RunErrGemm {
  void operator()(RunErr* C, int64_t ldc, const RunErr* A, int64_t lda, sim::Op opA, const RunErr* B, int64_t ldb,
                  sim::Op opB, int64_t M, int64_t N, int64_t K, bool accumulate) const {
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) {
        const RunErr c0 = accumulate ? C[i * ldc + j] : RunErr(0);
        const RunErrDot d = run_err_dot({c0.v, c0.e, std::fabs(c0.v)}, A, lda, opA, B, ldb, opB, i, j, K);
        C[i * ldc + j] = {d.v, d.e + static_cast<double>(K + 1) * d.mag};
      }
  }
};

// The bound of a batched product on bfloat16 pieces (models/split_gemm.hpp's
// SplitGemm; LoopGemm's signature, and the hint of which operands hold
// bfloat16 values), in units of u, per output with mag = sum |a b| over k:
// - the pairs of pieces dropped (both operands in three pieces): at most
//   2.01 u |a b| a term;
// - the pieces' magnitudes: the kept pairs' |a_i b_j| add up to at most
//   (1 + 2^-5) |a b| a term (|p0| <= (1 + 2^-8)|x|, |p1| <= 2^-8 (1 + 2^-8)|x|,
//   |p2| <= 2^-16 |x|);
// - the pairs' sums, a pair a product or all pairs as one product of
//   npairs x K terms (SplitGemm takes either): on a device the tensor
//   cores' FP32 accumulation, which truncates (2u an addition) and aligns
//   the products of a group to its largest before adding them, bounded by
//   (2 npairs K + 16) u their magnitude and |C0|'s (a kernel may start
//   its accumulator from C); in the emulation (HostBf16Gemm) a double sum
//   rounded once, (1 + npairs K 2^-29) u their magnitude;
// - each product's addition into C (all but the first when not
//   accumulating; at most npairs): u (|C0| + the pairs' magnitude);
// - a split operand below 2^-110 in magnitude loses at most 2^-134 in its
//   last piece: 2^-110 u (x 2 for the rest) times the other operand's
//   |values| summed.
// Exact products otherwise (bfloat16 x bfloat16 fits FP32), and the
// inputs' bounds carried through as in RunErrGemm.
// How a product on pieces sums its pairs' products: the tensor cores (a
// device), a double sum rounded once (HostBf16Gemm, the emulation of
// SplitGemm), or one chain of MMAs from C0 in double rounded once
// (mma_chain: the fused attention kernel's emulation, sim::mma_m16n8k16_host
// on double accumulators: at most u (|C0| + the pairs' magnitude) besides
// the double sum's own error).
enum class SplitSum { device, host, mma_chain };

// One output of a product on pieces (pa, pb pieces of A and B) from its
// run_err_dot over K terms started from c0 (accumulate: C0 is part of the
// result), with the bound above.
inline RunErr run_err_split(const RunErrDot& d, RunErr c0, bool accumulate, int pa, int pb, int64_t K, SplitSum how) {
  const int pairs = models::split_pairs(pa, pb).n;
  const double grow = 1 + 0x1p-5, kd = static_cast<double>(K);
  const double sum = how == SplitSum::device ? 2 * pairs * kd + 16 : 1 + pairs * kd * 0x1p-29;
  const double adds = how == SplitSum::mma_chain ? 0 : accumulate ? pairs : pairs - 1;
  const double per_mag = sum * grow + adds * grow + (pa > 1 && pb > 1 ? 2.01 : 0);
  const double lost = 0x1p-109 * ((pa > 1 ? d.sum_b : 0) + (pb > 1 ? d.sum_a : 0));
  const double c0_in_sum = how != SplitSum::host && accumulate ? sum * std::fabs(c0.v) : 0;
  return {d.v, d.e + per_mag * d.mag + adds * std::fabs(c0.v) + c0_in_sum + lost};
}

struct RunErrSplitGemm {
  bool device = true;  // the device's accumulation, else the emulation's
  void operator()(int64_t count, RunErr* C, int64_t ldc, int64_t sc, const RunErr* A, int64_t lda, int64_t sa,
                  sim::Op opA, const RunErr* B, int64_t ldb, int64_t sb, sim::Op opB, int64_t M, int64_t N, int64_t K,
                  bool accumulate) const {
    hinted({}, count, C, ldc, sc, A, lda, sa, opA, B, ldb, sb, opB, M, N, K, accumulate);
  }
  void hinted(models::Bf16Operands h, int64_t count, RunErr* C, int64_t ldc, int64_t sc, const RunErr* A,
              int64_t lda, int64_t sa, sim::Op opA, const RunErr* B, int64_t ldb, int64_t sb, sim::Op opB, int64_t M,
              int64_t N, int64_t K, bool accumulate) const {
    const int pa = h.a ? 1 : models::kBf16Pieces, pb = h.b ? 1 : models::kBf16Pieces;
    for (int64_t t = 0; t < count; ++t)
      for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < N; ++j) {
          RunErr& c = C[t * sc + i * ldc + j];
          const RunErr c0 = accumulate ? c : RunErr(0);
          const RunErrDot d = run_err_dot({c0.v, c0.e}, A + t * sa, lda, opA, B + t * sb, ldb, opB, i, j, K);
          c = run_err_split(d, c0, accumulate, pa, pb, K, device ? SplitSum::device : SplitSum::host);
        }
  }
};

}  // namespace exmy::test

namespace exmy::sim {
inline test::RunErr hd_exp(test::RunErr a) {
  const double x = std::exp(a.v);
  return {x, x * (a.e + 4)};
}
inline test::RunErr hd_log(test::RunErr a) {
  const double x = std::log(a.v);
  return {x, a.e / std::fabs(a.v) + 2 * std::fabs(x)};
}
inline test::RunErr hd_sqrt(test::RunErr a) {
  const double x = std::sqrt(a.v);
  return {x, a.e / (2 * x) + x};
}
inline test::RunErr hd_max(test::RunErr a, test::RunErr b) {
  return {a.v < b.v ? b.v : a.v, std::fmax(a.e, b.e)};
}
}  // namespace exmy::sim

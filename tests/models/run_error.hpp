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

struct RunErrGemm {
  void operator()(RunErr* C, int64_t ldc, const RunErr* A, int64_t lda, sim::Op opA, const RunErr* B, int64_t ldb,
                  sim::Op opB, int64_t M, int64_t N, int64_t K, bool accumulate) const {
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) {
        const RunErr c0 = accumulate ? C[i * ldc + j] : RunErr(0);
        double s = c0.v, e = c0.e, mag = std::fabs(c0.v);
        for (int64_t k = 0; k < K; ++k) {
          const RunErr a = opA == sim::Op::N ? A[i * lda + k] : A[k * lda + i];
          const RunErr b = opB == sim::Op::N ? B[k * ldb + j] : B[j * ldb + k];
          s += a.v * b.v;
          e += std::fabs(a.v) * b.e + std::fabs(b.v) * a.e;
          mag += std::fabs(a.v * b.v);
        }
        C[i * ldc + j] = {s, e + static_cast<double>(K + 1) * mag};
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

#include "sim/gemm.hpp"

#include "sim/parallel.hpp"

#include <Eigen/Core>

#include <cstddef>

#ifndef EIGEN_DONT_PARALLELIZE
#error "exmy_nn must be built with EIGEN_DONT_PARALLELIZE (see sim/gemm.hpp)"
#endif

namespace exmy::sim {
namespace {

template <class T>
using RowMat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class T>
using ConstMap = Eigen::Map<const RowMat<T>, Eigen::Unaligned, Eigen::OuterStride<>>;
template <class T>
using MutMap = Eigen::Map<RowMat<T>, Eigen::Unaligned, Eigen::OuterStride<>>;

template <class T, class L, class R>
void assign(MutMap<T>& c, const L& a, const R& b, bool accumulate) {
  if (accumulate) c.noalias() += a * b;
  else c.noalias() = a * b;
}

template <class T>
void gemm_block(T* C, int64_t ldc, const T* A, int64_t lda, Op opA, const T* B, int64_t ldb, Op opB, int64_t M,
                int64_t N, int64_t K, bool accumulate) {
  if (M <= 0 || N <= 0) return;
  fix_gemm_cache_sizes();
  MutMap<T> c(C, M, N, Eigen::OuterStride<>(ldc));
  if (K <= 0) {
    if (!accumulate) c.setZero();
    return;
  }
  if (opA == Op::N) {
    ConstMap<T> a(A, M, K, Eigen::OuterStride<>(lda));
    if (opB == Op::N) assign<T>(c, a, ConstMap<T>(B, K, N, Eigen::OuterStride<>(ldb)), accumulate);
    else assign<T>(c, a, ConstMap<T>(B, N, K, Eigen::OuterStride<>(ldb)).transpose(), accumulate);
  } else {
    ConstMap<T> a(A, K, M, Eigen::OuterStride<>(lda));
    if (opB == Op::N) assign<T>(c, a.transpose(), ConstMap<T>(B, K, N, Eigen::OuterStride<>(ldb)), accumulate);
    else assign<T>(c, a.transpose(), ConstMap<T>(B, N, K, Eigen::OuterStride<>(ldb)).transpose(), accumulate);
  }
}

}  // namespace

void fix_gemm_cache_sizes() {
  static const bool fixed = [] {
    Eigen::setCpuCacheSizes(kGemmCacheL1, kGemmCacheL2, kGemmCacheL3);
    return true;
  }();
  (void)fixed;
}

template <class T>
void gemm_serial(T* C, int64_t ldc, const T* A, int64_t lda, Op opA, const T* B, int64_t ldb, Op opB, int64_t M,
                 int64_t N, int64_t K, bool accumulate) {
  gemm_block(C, ldc, A, lda, opA, B, ldb, opB, M, N, K, accumulate);
}

template <class T>
void gemm(T* C, int64_t ldc, const T* A, int64_t lda, Op opA, const T* B, int64_t ldb, Op opB, int64_t M, int64_t N,
          int64_t K, bool accumulate) {
  const int64_t tm = (M + kGemmTile - 1) / kGemmTile, tn = (N + kGemmTile - 1) / kGemmTile;
  const int64_t tiles = tm * tn;
#pragma omp parallel for schedule(dynamic, 1) if (tiles > 1 && M * N * K >= parallel_min_work())
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t m0 = (t / tn) * kGemmTile, n0 = (t % tn) * kGemmTile;
    const int64_t mb = std::min(kGemmTile, M - m0), nb = std::min(kGemmTile, N - n0);
    // Sub-blocks of op(A) rows [m0, m0+mb) and op(B) columns [n0, n0+nb).
    const T* a = opA == Op::N ? A + m0 * lda : A + m0;
    const T* b = opB == Op::N ? B + n0 : B + n0 * ldb;
    gemm_block(C + m0 * ldc + n0, ldc, a, lda, opA, b, ldb, opB, mb, nb, K, accumulate);
  }
}

template void gemm<float>(float*, int64_t, const float*, int64_t, Op, const float*, int64_t, Op, int64_t, int64_t,
                          int64_t, bool);
template void gemm<double>(double*, int64_t, const double*, int64_t, Op, const double*, int64_t, Op, int64_t, int64_t,
                           int64_t, bool);
template void gemm_serial<float>(float*, int64_t, const float*, int64_t, Op, const float*, int64_t, Op, int64_t,
                                 int64_t, int64_t, bool);
template void gemm_serial<double>(double*, int64_t, const double*, int64_t, Op, const double*, int64_t, Op, int64_t,
                                  int64_t, int64_t, bool);

}  // namespace exmy::sim

// Dense GEMM on row-major buffers, via Eigen, with a thread decomposition that
// never changes a result.
//
// Why the tiling: Eigen chooses its k-blocking (and so the order in which each
// output element's sum is accumulated) from the shape of the product and, in
// its own OpenMP mode, from the thread count. exmy promises bit-identical
// training for any thread count, so Eigen's threading is switched off
// (EIGEN_DONT_PARALLELIZE, set for every target that links exmy_nn) and gemm()
// splits C into a fixed grid of tiles that depends on the shape only. Each tile
// is one single-threaded Eigen product; OpenMP hands out whole tiles. Every
// output element is therefore computed by the same instruction sequence
// whichever thread runs it.
#pragma once

#include <cstdint>

namespace exmy::sim {

enum class Op : uint8_t { N, T };

// C (M,N) = op(A) · op(B), or C += op(A) · op(B) when `accumulate`.
// op(A) is (M,K): A is stored (M,K) with row stride lda for Op::N, or (K,M)
// for Op::T. op(B) is (K,N): B is stored (K,N) with row stride ldb for Op::N,
// or (N,K) for Op::T. C is stored (M,N) with row stride ldc.
template <class T>
void gemm(T* C, int64_t ldc, const T* A, int64_t lda, Op opA, const T* B, int64_t ldb, Op opB, int64_t M, int64_t N,
          int64_t K, bool accumulate);

// The same product as one Eigen call on the calling thread, for small
// products inside a parallel region (SSD chunks, attention heads).
template <class T>
void gemm_serial(T* C, int64_t ldc, const T* A, int64_t lda, Op opA, const T* B, int64_t ldb, Op opB, int64_t M,
                 int64_t N, int64_t K, bool accumulate);

// Tile edge of gemm()'s fixed grid (rows and columns of C).
inline constexpr int64_t kGemmTile = 256;

}  // namespace exmy::sim

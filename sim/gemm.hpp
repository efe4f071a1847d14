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

#include <cstddef>
#include <cstdint>

namespace exmy::sim {

enum class Op : uint8_t { N, T };

// The FLOPs of an M x N x K product (a multiply and an add each).
inline double gemm_flops(int64_t M, int64_t N, int64_t K) {
  return 2.0 * static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K);
}

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

// The cache sizes Eigen plans its blocking with, fixed for every machine.
// Eigen reads them from the CPU (cpuid) and cuts K into panels sized from
// the L1 (at most 288 floats for 32 KiB, 432 for 48 KiB, with AVX2), so the same
// product summed in different panels, and rounded differently, on machines
// with different caches: a training run on a 16-core Xeon (48 KiB L1) and on
// the project's Zen 1 (32 KiB) gave different loss curves. With
// fixed sizes the blocking depends on the shape alone, so results are the
// same on any x86-64 with the same instruction set. The values are what
// Eigen reads on the project machine, so its results did not change.
inline constexpr std::ptrdiff_t kGemmCacheL1 = std::ptrdiff_t{32} << 10;
inline constexpr std::ptrdiff_t kGemmCacheL2 = std::ptrdiff_t{512} << 10;
inline constexpr std::ptrdiff_t kGemmCacheL3 = std::ptrdiff_t{64} << 20;

// Sets Eigen's cache sizes to the above, once per process; gemm() and
// gemm_serial() call it before their first product.
void fix_gemm_cache_sizes();

}  // namespace exmy::sim

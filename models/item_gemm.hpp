// What the kernels' work items share (models/ssd_items.hpp,
// models/attention_items.hpp): the GEMM functors an item forms its small
// products with, and the padding of its scratch arrays.
//
// A functor has sim::gemm_serial's signature: the CPU and the host emulation
// pass SerialGemm (one Eigen call, so the emulation equals the CPU bit for
// bit). NaiveGemm sums each output element over k in order from +0 (or from
// C when accumulating), which is not Eigen's order: the SSD scan's thread
// kernels (models/ssd_threads.hpp), which a device runs, keep that order,
// and tests/models/test_ssd_cuda.cpp checks them against the items run with
// NaiveGemm on the host. The items themselves run only in the emulation: on
// a device attention has row kernels (models/attention_rows.hpp) and the SSD
// scan thread kernels of their own.
#pragma once

#include <cstdint>

#include "formats/format.hpp"  // EXMY_HD
#include "sim/gemm.hpp"

namespace exmy::models {

// The CPU's product: one single-threaded Eigen call (host only).
struct SerialGemm {
  template <class T>
  void operator()(T* C, int64_t ldc, const T* A, int64_t lda, sim::Op opA, const T* B, int64_t ldb, sim::Op opB,
                  int64_t M, int64_t N, int64_t K, bool accumulate) const {
    sim::gemm_serial(C, ldc, A, lda, opA, B, ldb, opB, M, N, K, accumulate);
  }
};

// The product in k order: each element of C summed over k in order (from
// +0, or from C when accumulating); the order of the SSD thread kernels.
struct NaiveGemm {
  template <class T>
  EXMY_HD void operator()(T* C, int64_t ldc, const T* A, int64_t lda, sim::Op opA, const T* B, int64_t ldb,
                          sim::Op opB, int64_t M, int64_t N, int64_t K, bool accumulate) const {
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) {
        T s = accumulate ? C[i * ldc + j] : T(0);
        for (int64_t k = 0; k < K; ++k) {
          const T a = opA == sim::Op::N ? A[i * lda + k] : A[k * lda + i];
          const T b = opB == sim::Op::N ? B[k * ldb + j] : B[j * ldb + k];
          s += a * b;
        }
        C[i * ldc + j] = s;
      }
  }
};

// A batched GEMM functor: gemm(count, C, ldc, sc, A, lda, sa, opA, B, ldb, sb,
// opB, M, N, K, accumulate) forms entry t as C + t sc = op(A + t sa) op(B +
// t sb) (+= with accumulate), sim::gemm's shapes. LoopGemm runs the entries
// one after another through an item functor (SerialGemm on the host, an
// error-bound one in the tests); a device passes cuBLASLt's strided batch
// (models/cuda/attention.cu, models/cuda/ssd.cu).
template <class G>
struct LoopGemm {
  G g;
  template <class T>
  void operator()(int64_t count, T* C, int64_t ldc, int64_t sc, const T* A, int64_t lda, int64_t sa, sim::Op opA,
                  const T* B, int64_t ldb, int64_t sb, sim::Op opB, int64_t M, int64_t N, int64_t K,
                  bool accumulate) const {
    for (int64_t t = 0; t < count; ++t)
      g(C + t * sc, ldc, A + t * sa, lda, opA, B + t * sb, ldb, opB, M, N, K, accumulate);
  }
};

// Scratch arrays start 16 elements apart (64 bytes for float) from a
// 64-byte-aligned base, as the CPU's separate buffers (sim::Buf) do: Eigen's
// small products may choose their vectorized path by the operands'
// alignment, so an array aligned differently could give other bits.
EXMY_HD int64_t item_pad(int64_t n) { return (n + 15) / 16 * 16; }

}  // namespace exmy::models

// GEMMs on a CUDA device through cuBLASLt, in sim::gemm's terms (row-major
// C = op(A) · op(B), or C += op(A) · op(B); sim/gemm.hpp): FP32 operands
// with FP32 arithmetic (CUBLAS_COMPUTE_32F: no TF32), or BF16 operands with
// FP32 accumulation and an FP32 C (the `bf16` policy's GEMMs, and the
// `fp32` model's in BF16: encoded operands q·s that BF16 holds exactly, the
// tensor scales as the epilogue's alpha). A result differs from
// the CPU's only in the order of each output's sums: tests/sim/test_gemm_cuda.cpp
// states the budget and checks it. Deterministic: a shape's algorithm is
// the heuristic's first for a fixed workspace and the operands' alignment
// (told to the heuristic, which otherwise assumes 256-byte aligned
// matrices), chosen once per CudaGemm and kept, and no algorithm with
// atomics is asked for, so the same call gives the same bits.
#pragma once

#include <cstdint>
#include <memory>

#include "sim/gemm.hpp"

namespace exmy::sim {

enum class GemmOperands : uint8_t { fp32, bf16 };

class CudaGemm {
 public:
  // The cuBLASLt handle, a workspace of `workspace_bytes` on the current device.
  explicit CudaGemm(size_t workspace_bytes = size_t{32} << 20);
  ~CudaGemm();
  CudaGemm(const CudaGemm&) = delete;
  CudaGemm& operator=(const CudaGemm&) = delete;

  // Device pointers. A and B hold float32 (fp32) or bfloat16 bits (bf16),
  // shaped as in sim::gemm; C is float32. Enqueued on the default stream.
  // With alpha, C = fl(alpha · sum) (+ C when accumulating): cuBLASLt's
  // epilogue scale, one FP32 multiplication of each output's sum.
  void run(float* C, int64_t ldc, const void* A, int64_t lda, Op opA, const void* B, int64_t ldb, Op opB, int64_t M,
           int64_t N, int64_t K, bool accumulate, GemmOperands operands, float alpha = 1.0f);
  // `count` products at once (cuBLASLt's strided batch), FP32 or BF16
  // operands: entry t is C + t sc = op(A + t sa) · op(B + t sb) (+= with
  // accumulate), strides in elements; each entry's result is that of run()
  // on it up to the order of each output's sums. A batch the heuristic has
  // no algorithm for runs as one call per entry.
  void run_batched(int64_t count, float* C, int64_t ldc, int64_t sc, const void* A, int64_t lda, int64_t sa, Op opA,
                   const void* B, int64_t ldb, int64_t sb, Op opB, int64_t M, int64_t N, int64_t K, bool accumulate,
                   GemmOperands operands = GemmOperands::fp32);
  // C = fl(*alpha · sum) with alpha a device pointer (cuBLASLt's device
  // pointer mode: the host never reads it), C overwritten.
  void run_device_alpha(float* C, int64_t ldc, const void* A, int64_t lda, Op opA, const void* B, int64_t ldb, Op opB,
                        int64_t M, int64_t N, int64_t K, GemmOperands operands, const float* alpha);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The block launches' batched products (models/attention_blocks.hpp,
// models/ssd_blocks.hpp; the functor shape of models/item_gemm.hpp's
// LoopGemm) as CudaGemm::run_batched on one cuBLASLt handle for the
// process's device (exmy runs one device per process), with no workspace,
// so that it needs no memory beyond the plan's (cuBLASLt then takes
// algorithms without split-K). The handle is made at the first call and
// never destroyed (a static's destructor could run after the CUDA
// runtime's teardown).
// The bfloat16 form (operands as bfloat16 bits) is models/split_gemm.hpp's
// products of pieces.
struct DeviceBatchedGemm {
  void operator()(int64_t count, float* C, int64_t ldc, int64_t sc, const float* A, int64_t lda, int64_t sa, Op opA,
                  const float* B, int64_t ldb, int64_t sb, Op opB, int64_t M, int64_t N, int64_t K,
                  bool accumulate) const;
  void operator()(int64_t count, float* C, int64_t ldc, int64_t sc, const uint16_t* A, int64_t lda, int64_t sa,
                  Op opA, const uint16_t* B, int64_t ldb, int64_t sb, Op opB, int64_t M, int64_t N, int64_t K,
                  bool accumulate) const;
};

}  // namespace exmy::sim

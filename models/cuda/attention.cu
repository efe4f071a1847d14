// Causal GQA attention on a CUDA device: the block launches of
// models/attention_blocks.hpp (DeviceLaunch, the products as cuBLASLt's
// strided batches) and the row launches of models/attention_launches.hpp
// with sim::DeviceLaunch (the launch shape only; the arithmetic is
// models/attention_rows.hpp and attention_items.hpp's row steps, which the
// host emulation runs too).
#include "models/cuda/attention_cuda.hpp"
#include "sim/cuda/gemm_cuda.hpp"

namespace exmy::models {
namespace {

// The block launches' products, one cuBLASLt handle for the process's
// device (exmy runs one device per process), with no workspace, so that it
// needs no memory beyond the plan's (cuBLASLt then takes algorithms without
// split-K). Made at the first call, never destroyed (a static's destructor
// could run after the CUDA runtime's teardown).
struct DeviceBatchedGemm {
  void operator()(int64_t count, float* C, int64_t ldc, int64_t sc, const float* A, int64_t lda, int64_t sa,
                  sim::Op opA, const float* B, int64_t ldb, int64_t sb, sim::Op opB, int64_t M, int64_t N, int64_t K,
                  bool accumulate) const {
    static sim::CudaGemm* const gemm = new sim::CudaGemm(0);
    gemm->run_batched(count, C, ldc, sc, A, lda, sa, opA, B, ldb, sb, opB, M, N, K, accumulate);
  }
};

}  // namespace

void attention_blocks_forward_cuda(float* out, float* lse, const float* q, const float* k, const float* v,
                                   const AttnDims& d, const AttnBlocking& blocking, float* scratch) {
  attention_blocks_forward_launches(sim::DeviceLaunch{}, DeviceBatchedGemm{}, out, lse, q, k, v, d, blocking, scratch);
}
void attention_blocks_backward_cuda(float* dq, float* dk, float* dv, const float* dout, const float* out,
                                    const float* lse, const float* q, const float* k, const float* v,
                                    const AttnDims& d, const AttnBlocking& blocking, float* scratch) {
  attention_blocks_backward_launches(sim::DeviceLaunch{}, DeviceBatchedGemm{}, dq, dk, dv, dout, out, lse, q, k, v, d,
                                     blocking, scratch);
}

}  // namespace exmy::models

#define EXMY_LAUNCHER sim::DeviceLaunch
#define EXMY_SUFFIX cuda
#include "models/cuda/attention_define.hpp"

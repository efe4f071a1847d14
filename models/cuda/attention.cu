// Causal GQA attention on a CUDA device: the block launches of
// models/attention_blocks.hpp (DeviceLaunch, the products as cuBLASLt's
// strided batches, on bfloat16 pieces with bf16_pieces: SplitGemm) and
// the row launches of models/attention_launches.hpp with sim::DeviceLaunch
// (the launch shape only; the arithmetic is models/attention_rows.hpp and
// attention_items.hpp's row steps, which the host emulation runs too).
#include "models/cuda/attention_cuda.hpp"
#include "sim/cuda/gemm_cuda.hpp"

namespace exmy::models {

void attention_blocks_forward_cuda(float* out, float* lse, const float* q, const float* k, const float* v,
                                   const AttnDims& d, const AttnBlocking& blocking, float* scratch) {
  with_block_gemm<sim::DeviceLaunch>(d, blocking, false, scratch, sim::DeviceBatchedGemm{}, sim::DeviceBatchedGemm{},
                                     [&](const auto& gemm) {
                                       attention_blocks_forward_launches(sim::DeviceLaunch{}, gemm, out, lse, q, k, v,
                                                                         d, blocking, scratch);
                                     });
}
void attention_blocks_backward_cuda(float* dq, float* dk, float* dv, const float* dout, const float* out,
                                    const float* lse, const float* q, const float* k, const float* v,
                                    const AttnDims& d, const AttnBlocking& blocking, float* scratch) {
  with_block_gemm<sim::DeviceLaunch>(d, blocking, true, scratch, sim::DeviceBatchedGemm{}, sim::DeviceBatchedGemm{},
                                     [&](const auto& gemm) {
                                       attention_blocks_backward_launches(sim::DeviceLaunch{}, gemm, dq, dk, dv, dout,
                                                                          out, lse, q, k, v, d, blocking, scratch);
                                     });
}

}  // namespace exmy::models

#define EXMY_LAUNCHER sim::DeviceLaunch
#define EXMY_SUFFIX cuda
#include "models/cuda/attention_define.hpp"

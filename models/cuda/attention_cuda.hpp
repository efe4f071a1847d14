// Causal GQA attention's kernels, float32, with the arguments of
// models/attention.hpp's attention_* plus a scratch, in two builds each:
// *_cuda on the current CUDA device (device pointers, the default stream,
// asynchronous; a failed launch throws exmy::Error naming the kernel), only
// where exmy is built with CUDA (EXMY_HAVE_CUDA); *_emulated, the same
// launches with the threads run one after another on the host, always
// built, so that CI holds them to the CPU.
// - attention_blocks_*: the block launches (models/attention_blocks.hpp);
//   the emulated backend runs them with attn_cpu_blocking() (the CPU's
//   bits), the CUDA backend with attn_device_blocking(d) (its products on
//   bfloat16 pieces: models/split_gemm.hpp).
// - attention_rows_*: the row launches (models/attention_launches.hpp), the
//   backward with a scratch of attention_rows_backward_scratch(d) floats;
//   the CUDA backend's other family. Heads wider than kAttnRowMaxDim (128)
//   are refused (exmy::Error).
// - attention_fused_*: the forward as one fused kernel on the BF16 tensor
//   cores and the backward as a launch and two (models/attention_fused.hpp,
//   scratch attention_fused_backward_scratch(d) floats), heads of at most
//   128; wider ones are refused (exmy::Error). The CUDA backend's with
//   EXMY_CUDA_ATTENTION=fused.
// Results on a device, and the emulation at other blockings, are within
// the FP32 budget of tests/models/test_attention_cuda.cpp of the CPU
// (another summation order; on a device also the device's exp and log).
#pragma once

#include <cstdint>

#include "models/attention_blocks.hpp"    // the scratch sizes
#include "models/attention_launches.hpp"

namespace exmy::models {

// The block launches (models/attention_blocks.hpp) with a blocking (rows
// per query block, keys per row part) and a scratch of
// attention_blocks_*_scratch(d, blocking) floats: *_emulated on the host
// (HostLaunch, LoopGemm<SerialGemm>: the CPU's bits with
// attn_cpu_blocking()), *_cuda on the current device (DeviceLaunch,
// cuBLASLt's strided batches, on the default stream): within the FP32 budget
// of tests/models/test_attention_cuda.cpp.
#define EXMY_ATTENTION_BLOCK_KERNELS(suffix)                                                                        \
  void attention_blocks_forward_##suffix(float* out, float* lse, const float* q, const float* k, const float* v,  \
                                         const AttnDims& d, const AttnBlocking& blocking, float* scratch);         \
  void attention_blocks_backward_##suffix(float* dq, float* dk, float* dv, const float* dout, const float* out,   \
                                          const float* lse, const float* q, const float* k, const float* v,       \
                                          const AttnDims& d, const AttnBlocking& blocking, float* scratch);
EXMY_ATTENTION_BLOCK_KERNELS(emulated)
#if defined(EXMY_HAVE_CUDA)
EXMY_ATTENTION_BLOCK_KERNELS(cuda)
#endif
#undef EXMY_ATTENTION_BLOCK_KERNELS

// Which family the CUDA backend runs: the block launches, unless the
// environment sets EXMY_CUDA_ATTENTION=rows (the row kernels; kept until a
// device has timed both, docs/benchmarks.md). Read once.
bool attention_rows_chosen();
// EXMY_CUDA_ATTENTION=fused: the fused kernels where they apply (head_dim
// <= 128).
bool attention_fused_chosen();
// The block launches' blocking on the CUDA backend: attn_device_blocking(d),
// its products on bfloat16 pieces unless EXMY_CUDA_ATTENTION=fp32 (FP32
// cuBLASLt products, for a comparison in one sitting).
AttnBlocking attention_device_blocking_chosen(const AttnDims& d);
// The scratch (floats) a device backend's attention may ask for: the
// largest of the row kernels' and the fused kernels' backward and the block
// launches' forward and backward with the CPU's and the device's blocking.
int64_t attention_device_scratch(const AttnDims& d);

#define EXMY_ATTENTION_FUSED_KERNELS(suffix)                                                                      \
  void attention_fused_forward_##suffix(float* out, float* lse, const float* q, const float* k, const float* v,   \
                                        const AttnDims& d);                                                        \
  void attention_fused_backward_##suffix(float* dq, float* dk, float* dv, const float* dout, const float* out,    \
                                         const float* lse, const float* q, const float* k, const float* v,        \
                                         const AttnDims& d, float* scratch);
EXMY_ATTENTION_FUSED_KERNELS(emulated)
#if defined(EXMY_HAVE_CUDA)
EXMY_ATTENTION_FUSED_KERNELS(cuda)
#endif
#undef EXMY_ATTENTION_FUSED_KERNELS

#define EXMY_ATTENTION_ROW_KERNELS(suffix)                                                                         \
  void attention_rows_forward_##suffix(float* out, float* lse, const float* q, const float* k, const float* v,    \
                                       const AttnDims& d);                                                         \
  void attention_rows_backward_##suffix(float* dq, float* dk, float* dv, const float* dout, const float* out,     \
                                        const float* lse, const float* q, const float* k, const float* v,         \
                                        const AttnDims& d, float* scratch);

EXMY_ATTENTION_ROW_KERNELS(emulated)
#if defined(EXMY_HAVE_CUDA)
EXMY_ATTENTION_ROW_KERNELS(cuda)
#endif
#undef EXMY_ATTENTION_ROW_KERNELS

}  // namespace exmy::models

// Causal GQA attention's kernels of models/attention_launches.hpp, float32,
// with the arguments of models/attention.hpp's attention_* plus a scratch:
// - attention_forward_emulated / attention_backward_emulated: the item
//   launches on the host (HostLaunch, SerialGemm), host pointers, scratch
//   attention_forward_scratch(d) / attention_backward_scratch(d) floats.
//   They equal the CPU attention bit for bit (the same item functions, the
//   same Eigen products, the host's exp and log); the emulated device
//   backend runs them. Always built.
// - attention_rows_forward_* / attention_rows_backward_*: the row launches
//   (models/attention_rows.hpp), the backward with a scratch of
//   attention_rows_backward_scratch(d) floats, in two builds:
//   *_cuda on the current CUDA device, device pointers, the default stream
//   (asynchronous; a failed launch throws exmy::Error naming the kernel),
//   only where exmy is built with CUDA (EXMY_HAVE_CUDA): the CUDA backend
//   runs these; *_emulated, the same launches with the threads run one after
//   another on the host, always built, so that CI holds them to the budget.
//   Both are within the FP32 budget of tests/models/test_attention_cuda.cpp
//   of the CPU (another summation order; on a device also the device's exp
//   and log). Heads wider than kAttnRowMaxDim (128) are refused (exmy::Error).
#pragma once

#include <cstdint>

#include "models/attention_launches.hpp"  // the scratch sizes

namespace exmy::models {

void attention_forward_emulated(float* out, float* lse, const float* q, const float* k, const float* v,
                                const AttnDims& d, float* scratch);
void attention_backward_emulated(float* dq, float* dk, float* dv, const float* dout, const float* out,
                                 const float* lse, const float* q, const float* k, const float* v, const AttnDims& d,
                                 float* scratch);

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

// Causal GQA attention's kernels of models/attention_launches.hpp, float32,
// in two builds, with the arguments of models/attention.hpp's attention_*
// plus a scratch of attention_forward_scratch(d) /
// attention_backward_scratch(d) floats:
// - *_cuda: on the current CUDA device, device pointers, the default stream
//   (asynchronous; a failed launch throws exmy::Error naming the kernel).
//   Only where exmy is built with CUDA (EXMY_HAVE_CUDA).
// - *_emulated: the same launches with the threads run one after another on
//   the host, host pointers; always built, so CI compares them with the CPU
//   attention (tests/models/test_attention_cuda.cpp).
//
// Bits: the emulation equals the CPU bit for bit (the same item functions,
// the same Eigen products, the host's exp and log). On a device the products
// are summed in k order and exp and log are the device's, so the results are
// within the FP32 budget tests/models/test_attention_cuda.cpp derives.
#pragma once

#include <cstdint>

#include "models/attention_launches.hpp"  // attention_forward_scratch, attention_backward_scratch

namespace exmy::models {

#define EXMY_ATTENTION_KERNELS(suffix)                                                                             \
  void attention_forward_##suffix(float* out, float* lse, const float* q, const float* k, const float* v,         \
                                  const AttnDims& d, float* scratch);                                              \
  void attention_backward_##suffix(float* dq, float* dk, float* dv, const float* dout, const float* out,          \
                                   const float* lse, const float* q, const float* k, const float* v,              \
                                   const AttnDims& d, float* scratch);

EXMY_ATTENTION_KERNELS(emulated)
#if defined(EXMY_HAVE_CUDA)
EXMY_ATTENTION_KERNELS(cuda)
#endif
#undef EXMY_ATTENTION_KERNELS

}  // namespace exmy::models

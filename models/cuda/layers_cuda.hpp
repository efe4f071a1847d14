// The layer kernels of models/layer_launches.hpp, float32, in two builds:
// - *_cuda: on the current CUDA device, device pointers, the default
//   stream (asynchronous; a failed launch throws exmy::Error naming the
//   kernel). Only where exmy is built with CUDA (EXMY_HAVE_CUDA).
// - *_emulated: the same launches with the threads run one after another on
//   the host, host pointers; always built, so CI compares them with the CPU
//   layers (tests/models/test_layers_cuda.cpp).
// Shapes and accumulation (+=) as in models/layers.hpp; scratch is
// rmsnorm_backward_scratch(N, C) floats.
#pragma once

#include <cstdint>

#include "models/layer_launches.hpp"  // rmsnorm_backward_scratch

namespace exmy::models {

#define EXMY_LAYER_KERNELS(suffix)                                                                                  \
  void rmsnorm_forward_##suffix(float* out, float* rstd, const float* x, const float* w, int64_t N, int64_t C,      \
                                double eps);                                                                        \
  void rmsnorm_backward_##suffix(float* dx, float* dw, const float* dout, const float* x, const float* w,           \
                                 const float* rstd, int64_t N, int64_t C, float* scratch);                          \
  void relu2_forward_##suffix(float* out, const float* in, int64_t n);                                              \
  void relu2_backward_##suffix(float* din, const float* dout, const float* in, int64_t n);

EXMY_LAYER_KERNELS(emulated)
#if defined(EXMY_HAVE_CUDA)
EXMY_LAYER_KERNELS(cuda)
#endif
#undef EXMY_LAYER_KERNELS

}  // namespace exmy::models

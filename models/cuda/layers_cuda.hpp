// The layer kernels of models/layer_launches.hpp, float32, in two builds:
// - *_cuda: on the current CUDA device, device pointers, the default
//   stream (asynchronous; a failed launch throws exmy::Error naming the
//   kernel). Only where exmy is built with CUDA (EXMY_HAVE_CUDA).
// - *_emulated: the same launches with the threads run one after another on
//   the host, host pointers; always built, so CI compares them with the CPU
//   layers (tests/models/test_layers_cuda.cpp).
// Shapes and accumulation (+=) as in models/layers.hpp (mamba_dt_* as in
// models/ssd.hpp, round_bf16 as sim::round_bf16 of sim/linear.hpp); scratch
// is rmsnorm_backward_scratch(N, C), gated_rmsnorm_backward_scratch(N, D, G),
// conv1d_silu_backward_scratch(B, T, Cc), cross_entropy_scratch(N, V) (both
// cross-entropy kernels; 8-byte aligned) and mamba_dt_backward_scratch(N, H)
// floats. cross_entropy_forward writes
// the mean loss and the counted rows to *mean and *counted (device memory
// for the kernels).
//
// Bits: the emulation equals the CPU bit for bit everywhere. On a device,
// RMSNorm, squared ReLU, the embedding, the residual add, round_bf16 and
// AdamW equal it too (IEEE +, *, /, sqrt in the CPU's order, integer bit
// operations); cross-entropy, the gated norm, the conv1d and Mamba's time
// step go through exp (and log, log1p), whose device versions are not the
// host libm's, so they carry FP32 budgets (tests/models/test_layers_cuda.cpp
// derives them).
#pragma once

#include <cstdint>
#include <vector>

#include "models/layer_launches.hpp"  // rmsnorm_backward_scratch

namespace exmy::models {

// The positions of a token batch grouped by token, for embedding_backward:
// rows[k] is the k-th distinct token (increasing), positions[starts[k] ..
// starts[k + 1]) the positions holding it, increasing. Made on the host
// (the host feeds the token batches).
struct TokenGroups {
  std::vector<int32_t> rows;
  std::vector<int64_t> starts;  // rows.size() + 1
  std::vector<int64_t> positions;
};
TokenGroups group_tokens(const int32_t* tokens, int64_t N);

#define EXMY_LAYER_KERNELS(suffix)                                                                                  \
  void rmsnorm_forward_##suffix(float* out, float* rstd, const float* x, const float* w, int64_t N, int64_t C,      \
                                double eps);                                                                        \
  void rmsnorm_backward_##suffix(float* dx, float* dw, const float* dout, const float* x, const float* w,           \
                                 const float* rstd, int64_t N, int64_t C, float* scratch);                          \
  void relu2_forward_##suffix(float* out, const float* in, int64_t n);                                              \
  void relu2_backward_##suffix(float* din, const float* dout, const float* in, int64_t n);                          \
  void cross_entropy_forward_##suffix(double* losses, double* mean, int64_t* counted, const float* logits,           \
                                      const int32_t* targets, int64_t N, int64_t V, float* scratch);                 \
  void cross_entropy_backward_##suffix(float* dlogits, const float* logits, const int32_t* targets, int64_t N,        \
                                       int64_t V, double scale, float* scratch);                                     \
  void embedding_forward_##suffix(float* out, const int32_t* tokens, const float* wte, int64_t N, int64_t C);       \
  void embedding_backward_##suffix(float* dwte, const float* dout, const int32_t* rows, const int64_t* starts,       \
                                   const int64_t* positions, int64_t distinct, int64_t C);                           \
  void gated_rmsnorm_forward_##suffix(float* out, float* rstd, const float* y, int64_t ldy, const float* z,           \
                                      int64_t ldz, const float* w, int64_t N, int64_t D, int64_t G, double eps);     \
  void gated_rmsnorm_backward_##suffix(float* dy, int64_t lddy, float* dz, int64_t lddz, float* dw,                  \
                                       const float* dout, const float* y, int64_t ldy, const float* z, int64_t ldz,  \
                                       const float* w, const float* rstd, int64_t N, int64_t D, int64_t G,           \
                                       float* scratch);                                                              \
  void conv1d_silu_forward_##suffix(float* out, const float* x, int64_t ldx, const float* w, const float* bias,      \
                                    int64_t B, int64_t T, int64_t Cc, int64_t K);                                    \
  void conv1d_silu_backward_##suffix(float* dx, int64_t lddx, float* dw, float* dbias, const float* dout,            \
                                     const float* x, int64_t ldx, const float* w, const float* bias, int64_t B,      \
                                     int64_t T, int64_t Cc, int64_t K, float* scratch);                              \
  void mamba_dt_forward_##suffix(float* dt, const float* dt_raw, int64_t ld, const float* dt_bias, int64_t N,        \
                                 int64_t H, double lo, double hi);                                                   \
  void mamba_dt_backward_##suffix(float* ddt_raw, int64_t ld, float* ddt_bias, const float* ddt,                     \
                                  const float* dt_raw, const float* dt_bias, int64_t N, int64_t H, double lo,        \
                                  double hi, float* scratch);                                                        \
  void add_forward_##suffix(float* out, const float* a, const float* b, int64_t n);                                  \
  void round_bf16_##suffix(float* out, const float* in, int64_t n);

EXMY_LAYER_KERNELS(emulated)
#if defined(EXMY_HAVE_CUDA)
EXMY_LAYER_KERNELS(cuda)
#endif
#undef EXMY_LAYER_KERNELS

}  // namespace exmy::models

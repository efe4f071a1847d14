// Defines the entry points of models/cuda/layers_cuda.hpp for one launcher:
// included by models/cuda/layers.cu (DeviceLaunch, suffix cuda) and
// models/layers_emulated.cpp (HostLaunch, suffix emulated) with
// EXMY_LAUNCHER and EXMY_SUFFIX defined.
#include "models/layer_launches.hpp"

#define EXMY_CAT2(a, b) a##_##b
#define EXMY_CAT(a, b) EXMY_CAT2(a, b)

namespace exmy::models {

void EXMY_CAT(rmsnorm_forward, EXMY_SUFFIX)(float* out, float* rstd, const float* x, const float* w, int64_t N,
                                            int64_t C, double eps) {
  rmsnorm_forward_launches(EXMY_LAUNCHER{}, out, rstd, x, w, N, C, eps);
}
void EXMY_CAT(rmsnorm_backward, EXMY_SUFFIX)(float* dx, float* dw, const float* dout, const float* x, const float* w,
                                             const float* rstd, int64_t N, int64_t C, float* scratch) {
  rmsnorm_backward_launches(EXMY_LAUNCHER{}, dx, dw, dout, x, w, rstd, N, C, scratch);
}
void EXMY_CAT(relu2_forward, EXMY_SUFFIX)(float* out, const float* in, int64_t n) {
  relu2_forward_launches(EXMY_LAUNCHER{}, out, in, n);
}
void EXMY_CAT(relu2_backward, EXMY_SUFFIX)(float* din, const float* dout, const float* in, int64_t n) {
  relu2_backward_launches(EXMY_LAUNCHER{}, din, dout, in, n);
}

void EXMY_CAT(cross_entropy_forward, EXMY_SUFFIX)(double* losses, double* mean, int64_t* counted, const float* logits,
                                                  const int32_t* targets, int64_t N, int64_t V, float* scratch) {
  cross_entropy_forward_launches(EXMY_LAUNCHER{}, losses, mean, counted, logits, targets, N, V, scratch);
}
void EXMY_CAT(cross_entropy_backward, EXMY_SUFFIX)(float* dlogits, const float* logits, const int32_t* targets,
                                                   int64_t N, int64_t V, double scale, float* scratch) {
  cross_entropy_backward_launches(EXMY_LAUNCHER{}, dlogits, logits, targets, N, V, scale, scratch);
}

void EXMY_CAT(embedding_forward, EXMY_SUFFIX)(float* out, const int32_t* tokens, const float* wte, int64_t N,
                                              int64_t C) {
  embedding_forward_launches(EXMY_LAUNCHER{}, out, tokens, wte, N, C);
}
void EXMY_CAT(embedding_backward, EXMY_SUFFIX)(float* dwte, const float* dout, const int32_t* rows,
                                               const int64_t* starts, const int64_t* positions, int64_t distinct,
                                               int64_t C) {
  embedding_backward_launches(EXMY_LAUNCHER{}, dwte, dout, rows, starts, positions, distinct, C);
}

void EXMY_CAT(gated_rmsnorm_forward, EXMY_SUFFIX)(float* out, float* rstd, const float* y, int64_t ldy,
                                                  const float* z, int64_t ldz, const float* w, int64_t N, int64_t D,
                                                  int64_t G, double eps) {
  gated_rmsnorm_forward_launches(EXMY_LAUNCHER{}, out, rstd, y, ldy, z, ldz, w, N, D, G, eps);
}
void EXMY_CAT(gated_rmsnorm_backward, EXMY_SUFFIX)(float* dy, int64_t lddy, float* dz, int64_t lddz, float* dw,
                                                   const float* dout, const float* y, int64_t ldy, const float* z,
                                                   int64_t ldz, const float* w, const float* rstd, int64_t N,
                                                   int64_t D, int64_t G, float* scratch) {
  gated_rmsnorm_backward_launches(EXMY_LAUNCHER{}, dy, lddy, dz, lddz, dw, dout, y, ldy, z, ldz, w, rstd, N, D, G,
                                  scratch);
}

void EXMY_CAT(conv1d_silu_forward, EXMY_SUFFIX)(float* out, const float* x, int64_t ldx, const float* w,
                                                const float* bias, int64_t B, int64_t T, int64_t Cc, int64_t K) {
  conv1d_silu_forward_launches(EXMY_LAUNCHER{}, out, x, ldx, w, bias, B, T, Cc, K);
}
void EXMY_CAT(conv1d_silu_backward, EXMY_SUFFIX)(float* dx, int64_t lddx, float* dw, float* dbias, const float* dout,
                                                 const float* x, int64_t ldx, const float* w, const float* bias,
                                                 int64_t B, int64_t T, int64_t Cc, int64_t K, float* scratch) {
  conv1d_silu_backward_launches(EXMY_LAUNCHER{}, dx, lddx, dw, dbias, dout, x, ldx, w, bias, B, T, Cc, K, scratch);
}

void EXMY_CAT(mamba_dt_forward, EXMY_SUFFIX)(float* dt, const float* dt_raw, int64_t ld, const float* dt_bias,
                                             int64_t N, int64_t H, double lo, double hi) {
  mamba_dt_forward_launches(EXMY_LAUNCHER{}, dt, dt_raw, ld, dt_bias, N, H, lo, hi);
}
void EXMY_CAT(mamba_dt_backward, EXMY_SUFFIX)(float* ddt_raw, int64_t ld, float* ddt_bias, const float* ddt,
                                              const float* dt_raw, const float* dt_bias, int64_t N, int64_t H,
                                              double lo, double hi, float* scratch) {
  mamba_dt_backward_launches(EXMY_LAUNCHER{}, ddt_raw, ld, ddt_bias, ddt, dt_raw, dt_bias, N, H, lo, hi, scratch);
}

void EXMY_CAT(add_forward, EXMY_SUFFIX)(float* out, const float* a, const float* b, int64_t n) {
  add_forward_launches(EXMY_LAUNCHER{}, out, a, b, n);
}
void EXMY_CAT(round_bf16, EXMY_SUFFIX)(float* out, const float* in, int64_t n) {
  round_bf16_launches(EXMY_LAUNCHER{}, out, in, n);
}

}  // namespace exmy::models

#undef EXMY_CAT
#undef EXMY_CAT2

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

}  // namespace exmy::models

#undef EXMY_CAT
#undef EXMY_CAT2

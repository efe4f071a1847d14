// Defines the thread kernels' entry points of models/cuda/ssd_cuda.hpp for
// one launcher: included by models/cuda/ssd.cu (DeviceLaunch, suffix cuda)
// and models/ssd_emulated.cpp (HostLaunch, suffix emulated) with
// EXMY_LAUNCHER and EXMY_SUFFIX defined.
#include "models/ssd_launches.hpp"

#define EXMY_CAT2(a, b) a##_##b
#define EXMY_CAT(a, b) EXMY_CAT2(a, b)

namespace exmy::models {

void EXMY_CAT(ssd_parallel_forward, EXMY_SUFFIX)(float* y, float* acs, float* states, const float* x, int64_t ldx,
                                                 const float* Bm, const float* Cm, int64_t ldbc, const float* dt,
                                                 const float* A_log, const float* D, const SsdDims& d,
                                                 float* scratch) {
  ssd_parallel_forward_launches(EXMY_LAUNCHER{}, y, acs, states, x, ldx, Bm, Cm, ldbc, dt, A_log, D, d, scratch);
}
void EXMY_CAT(ssd_parallel_backward, EXMY_SUFFIX)(float* dx, float* dB, float* dC, float* ddt, float* dA_log,
                                                  float* dD, const float* dy, const float* x, int64_t ldx,
                                                  const float* Bm, const float* Cm, int64_t ldbc, const float* dt,
                                                  const float* A_log, const float* D, const float* acs,
                                                  const float* states, const SsdDims& d, float* scratch) {
  ssd_parallel_backward_launches(EXMY_LAUNCHER{}, dx, dB, dC, ddt, dA_log, dD, dy, x, ldx, Bm, Cm, ldbc, dt, A_log,
                                 D, acs, states, d, scratch);
}

}  // namespace exmy::models

#undef EXMY_CAT
#undef EXMY_CAT2

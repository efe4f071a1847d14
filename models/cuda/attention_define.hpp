// Defines the row kernels' entry points of models/cuda/attention_cuda.hpp
// for one launcher: included by models/cuda/attention.cu (DeviceLaunch,
// suffix cuda) and models/attention_emulated.cpp (HostLaunch, suffix
// emulated) with EXMY_LAUNCHER and EXMY_SUFFIX defined.
#include "models/attention_launches.hpp"

#define EXMY_CAT2(a, b) a##_##b
#define EXMY_CAT(a, b) EXMY_CAT2(a, b)

namespace exmy::models {

void EXMY_CAT(attention_rows_forward, EXMY_SUFFIX)(float* out, float* lse, const float* q, const float* k,
                                                   const float* v, const AttnDims& d) {
  attention_rows_forward_launches(EXMY_LAUNCHER{}, out, lse, q, k, v, d);
}
void EXMY_CAT(attention_rows_backward, EXMY_SUFFIX)(float* dq, float* dk, float* dv, const float* dout,
                                                    const float* out, const float* lse, const float* q,
                                                    const float* k, const float* v, const AttnDims& d,
                                                    float* scratch) {
  attention_rows_backward_launches(EXMY_LAUNCHER{}, dq, dk, dv, dout, out, lse, q, k, v, d, scratch);
}

}  // namespace exmy::models

#undef EXMY_CAT
#undef EXMY_CAT2

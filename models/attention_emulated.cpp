// The host emulation of causal GQA attention's kernels: the item launches of
// models/attention_launches.hpp with sim::HostLaunch (threads one after
// another) and SerialGemm (the CPU's Eigen products), which the emulated
// device backend runs; and the row launches, which the CUDA backend runs,
// with sim::HostLaunch, for the tests.
#include "models/cuda/attention_cuda.hpp"

namespace exmy::models {

void attention_forward_emulated(float* out, float* lse, const float* q, const float* k, const float* v,
                                const AttnDims& d, float* scratch) {
  attention_forward_launches(sim::HostLaunch{}, SerialGemm{}, out, lse, q, k, v, d, scratch);
}
void attention_backward_emulated(float* dq, float* dk, float* dv, const float* dout, const float* out,
                                 const float* lse, const float* q, const float* k, const float* v, const AttnDims& d,
                                 float* scratch) {
  attention_backward_launches(sim::HostLaunch{}, SerialGemm{}, dq, dk, dv, dout, out, lse, q, k, v, d, scratch);
}

}  // namespace exmy::models

#define EXMY_LAUNCHER sim::HostLaunch
#define EXMY_SUFFIX emulated
#include "models/cuda/attention_define.hpp"

// The host emulation of causal GQA attention's kernels: the block launches
// of models/attention_blocks.hpp with sim::HostLaunch (threads one after
// another) and LoopGemm<SerialGemm> (the CPU's Eigen products), which the
// emulated device backend runs at the CPU's blocking; and the row launches
// of models/attention_launches.hpp, for the tests.
#include "models/cuda/attention_cuda.hpp"

#include <algorithm>
#include <cstdlib>
#include <string_view>

namespace exmy::models {

void attention_blocks_forward_emulated(float* out, float* lse, const float* q, const float* k, const float* v,
                                       const AttnDims& d, const AttnBlocking& blocking, float* scratch) {
  attention_blocks_forward_launches(sim::HostLaunch{}, LoopGemm<SerialGemm>{}, out, lse, q, k, v, d, blocking, scratch);
}
void attention_blocks_backward_emulated(float* dq, float* dk, float* dv, const float* dout, const float* out,
                                        const float* lse, const float* q, const float* k, const float* v,
                                        const AttnDims& d, const AttnBlocking& blocking, float* scratch) {
  attention_blocks_backward_launches(sim::HostLaunch{}, LoopGemm<SerialGemm>{}, dq, dk, dv, dout, out, lse, q, k, v,
                                     d, blocking, scratch);
}

bool attention_rows_chosen() {
  static const bool rows = [] {
    const char* v = std::getenv("EXMY_CUDA_ATTENTION");
    return v && std::string_view(v) == "rows";
  }();
  return rows;
}

}  // namespace exmy::models

#define EXMY_LAUNCHER sim::HostLaunch
#define EXMY_SUFFIX emulated
#include "models/cuda/attention_define.hpp"

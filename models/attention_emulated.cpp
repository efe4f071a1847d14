// The host emulation of causal GQA attention's kernels: the block launches
// of models/attention_blocks.hpp with sim::HostLaunch (threads one after
// another) and LoopGemm<SerialGemm> (the CPU's Eigen products), which the
// emulated device backend runs at the CPU's blocking, or with bf16_pieces
// SplitGemm over HostBf16Gemm (the device's products on pieces, emulated);
// the row launches of models/attention_launches.hpp, and the fused
// kernels' host emulations (models/attention_fused.hpp), for the tests and
// the emulated backend with EXMY_CUDA_ATTENTION=fused.
#include "models/cuda/attention_cuda.hpp"

#include <algorithm>
#include <cstdlib>
#include <string_view>

#include "models/attention_fused.hpp"

namespace exmy::models {

void attention_blocks_forward_emulated(float* out, float* lse, const float* q, const float* k, const float* v,
                                       const AttnDims& d, const AttnBlocking& blocking, float* scratch) {
  with_block_gemm<sim::HostLaunch>(d, blocking, false, scratch, LoopGemm<SerialGemm>{}, HostBf16Gemm{},
                                   [&](const auto& gemm) {
                                     attention_blocks_forward_launches(sim::HostLaunch{}, gemm, out, lse, q, k, v, d,
                                                                       blocking, scratch);
                                   });
}
void attention_blocks_backward_emulated(float* dq, float* dk, float* dv, const float* dout, const float* out,
                                        const float* lse, const float* q, const float* k, const float* v,
                                        const AttnDims& d, const AttnBlocking& blocking, float* scratch) {
  with_block_gemm<sim::HostLaunch>(d, blocking, true, scratch, LoopGemm<SerialGemm>{}, HostBf16Gemm{},
                                   [&](const auto& gemm) {
                                     attention_blocks_backward_launches(sim::HostLaunch{}, gemm, dq, dk, dv, dout, out,
                                                                        lse, q, k, v, d, blocking, scratch);
                                   });
}

void attention_fused_forward_emulated(float* out, float* lse, const float* q, const float* k, const float* v,
                                      const AttnDims& d) {
  attention_fused_require(d, "attention_fused_forward");
  const FusedArgs a{out, lse, q, k, v, d};
  fused_dispatch(d, [&]<int kDh, int kP>() { attention_fused_forward_host<kDh, kP>(a); });
}

void attention_fused_backward_emulated(float* dq, float* dk, float* dv, const float* dout, const float* out,
                                       const float* lse, const float* q, const float* k, const float* v,
                                       const AttnDims& d, float* scratch) {
  attention_fused_require(d, "attention_fused_backward");
  fused_rowsum_launch(sim::HostLaunch{}, scratch, dout, out, d);
  const FusedBwdArgs a{dq, dk, dv, dout, lse, q, k, v, scratch, d};
  fused_dispatch(d, [&]<int kDh, int kP>() { attention_fused_backward_host<kDh, kP>(a); });
}

namespace {
// EXMY_CUDA_ATTENTION, read once ("" when unset).
std::string_view attention_env() {
  static const std::string_view v = [] {
    const char* e = std::getenv("EXMY_CUDA_ATTENTION");
    return std::string_view(e ? e : "");
  }();
  return v;
}
}  // namespace

bool attention_rows_chosen() { return attention_env() == "rows"; }
bool attention_fused_chosen() { return attention_env() == "fused"; }

AttnBlocking attention_device_blocking_chosen(const AttnDims& d) {
  AttnBlocking k = attn_device_blocking(d);
  if (attention_env() == "fp32") k.bf16_pieces = false;
  return k;
}

}  // namespace exmy::models

#define EXMY_LAUNCHER sim::HostLaunch
#define EXMY_SUFFIX emulated
#include "models/cuda/attention_define.hpp"

// The host emulation of the chunked SSD scan's kernels: the item launches of
// models/ssd_launches.hpp with sim::HostLaunch (threads one after another)
// and SerialGemm (the CPU's Eigen products), which the emulated device
// backend runs; and the block launches (models/ssd_blocks.hpp, with
// LoopGemm<SerialGemm>; with their products on bfloat16 pieces, SplitGemm
// over HostBf16Gemm; the forward also with the fused output kernel's
// emulation, models/ssd_fused.hpp, and the backward with the fused
// diagonal kernels' emulations, models/ssd_fused_bwd.hpp) and the thread
// launches, the CUDA backend's families, with sim::HostLaunch, for the tests
// and the emulated backend where EXMY_CUDA_SSD chooses them.
#include "models/cuda/ssd_cuda.hpp"
#include "models/ssd_fused_bwd.hpp"

namespace exmy::models {

void ssd_chunk_scan_forward_emulated(float* y, float* acs, float* states, const float* x, int64_t ldx,
                                     const float* Bm, const float* Cm, int64_t ldbc, const float* dt,
                                     const float* A_log, const float* D, const SsdDims& d, float* scratch) {
  ssd_chunk_scan_forward_launches(sim::HostLaunch{}, SerialGemm{}, y, acs, states, x, ldx, Bm, Cm, ldbc, dt, A_log, D,
                                  d, scratch);
}
void ssd_chunk_scan_backward_emulated(float* dx, float* dB, float* dC, float* ddt, float* dA_log, float* dD,
                                      const float* dy, const float* x, int64_t ldx, const float* Bm, const float* Cm,
                                      int64_t ldbc, const float* dt, const float* A_log, const float* D,
                                      const float* acs, const float* states, const SsdDims& d, float* scratch) {
  ssd_chunk_scan_backward_launches(sim::HostLaunch{}, SerialGemm{}, dx, dB, dC, ddt, dA_log, dD, dy, x, ldx, Bm, Cm,
                                   ldbc, dt, A_log, D, acs, states, d, scratch);
}

void ssd_blocks_forward_emulated(float* y, float* acs, float* states, const float* x, int64_t ldx, const float* Bm,
                                 const float* Cm, int64_t ldbc, const float* dt, const float* A_log, const float* D,
                                 const SsdDims& d, float* scratch) {
  ssd_blocks_forward_launches(sim::HostLaunch{}, LoopGemm<SerialGemm>{}, y, acs, states, x, ldx, Bm, Cm, ldbc, dt,
                              A_log, D, d, scratch);
}
void ssd_blocks_backward_emulated(float* dx, float* dB, float* dC, float* ddt, float* dA_log, float* dD,
                                  const float* dy, const float* x, int64_t ldx, const float* Bm, const float* Cm,
                                  int64_t ldbc, const float* dt, const float* A_log, const float* D, const float* acs,
                                  const float* states, const SsdDims& d, float* scratch) {
  ssd_blocks_backward_launches(sim::HostLaunch{}, LoopGemm<SerialGemm>{}, dx, dB, dC, ddt, dA_log, dD, dy, x, ldx, Bm,
                               Cm, ldbc, dt, A_log, D, acs, states, d, scratch);
}

void ssd_pieces_forward_emulated(float* y, float* acs, float* states, const float* x, int64_t ldx, const float* Bm,
                                 const float* Cm, int64_t ldbc, const float* dt, const float* A_log, const float* D,
                                 const SsdDims& d, float* scratch) {
  ssd_blocks_forward_launches(sim::HostLaunch{}, SplitGemm<sim::HostLaunch, HostBf16Gemm>{}, y, acs, states, x, ldx,
                              Bm, Cm, ldbc, dt, A_log, D, d, scratch);
}
void ssd_pieces_backward_emulated(float* dx, float* dB, float* dC, float* ddt, float* dA_log, float* dD,
                                  const float* dy, const float* x, int64_t ldx, const float* Bm, const float* Cm,
                                  int64_t ldbc, const float* dt, const float* A_log, const float* D, const float* acs,
                                  const float* states, const SsdDims& d, float* scratch) {
  ssd_blocks_backward_launches(sim::HostLaunch{}, SplitGemm<sim::HostLaunch, HostBf16Gemm>{}, dx, dB, dC, ddt, dA_log,
                               dD, dy, x, ldx, Bm, Cm, ldbc, dt, A_log, D, acs, states, d, scratch);
}

void ssd_fused_forward_emulated(float* y, float* acs, float* states, const float* x, int64_t ldx, const float* Bm,
                                const float* Cm, int64_t ldbc, const float* dt, const float* A_log, const float* D,
                                const SsdDims& d, float* scratch) {
  ssd_fused_require(d, "ssd_fused_forward");
  const auto host = [](const SsdFusedArgs& a) {
    ssd_fused_dispatch(a.d, [&]<int kN, int kP>() { ssd_fused_output_host<kN, kP>(a); });
  };
  ssd_blocks_forward_launches(sim::HostLaunch{}, LoopGemm<SerialGemm>{}, y, acs, states, x, ldx, Bm, Cm, ldbc, dt,
                              A_log, D, d, scratch, kSsdSlabFloats, SsdFusedOutput<decltype(host)>{host});
}

void ssd_fused_backward_emulated(float* dx, float* dB, float* dC, float* ddt, float* dA_log, float* dD,
                                 const float* dy, const float* x, int64_t ldx, const float* Bm, const float* Cm,
                                 int64_t ldbc, const float* dt, const float* A_log, const float* D, const float* acs,
                                 const float* states, const SsdDims& d, float* scratch) {
  ssd_fused_require(d, "ssd_fused_backward");
  ssd_blocks_backward_launches(sim::HostLaunch{}, LoopGemm<SerialGemm>{}, dx, dB, dC, ddt, dA_log, dD, dy, x, ldx, Bm,
                               Cm, ldbc, dt, A_log, D, acs, states, d, scratch, kSsdSlabFloats,
                               SsdFusedDiagonal<SsdFusedDiagonalHost>{});
}
void ssd_fused_pieces_backward_emulated(float* dx, float* dB, float* dC, float* ddt, float* dA_log, float* dD,
                                        const float* dy, const float* x, int64_t ldx, const float* Bm,
                                        const float* Cm, int64_t ldbc, const float* dt, const float* A_log,
                                        const float* D, const float* acs, const float* states, const SsdDims& d,
                                        float* scratch) {
  ssd_fused_require(d, "ssd_fused_backward");
  ssd_blocks_backward_launches(sim::HostLaunch{}, SplitGemm<sim::HostLaunch, HostBf16Gemm>{}, dx, dB, dC, ddt, dA_log,
                               dD, dy, x, ldx, Bm, Cm, ldbc, dt, A_log, D, acs, states, d, scratch, kSsdSlabFloats,
                               SsdFusedDiagonal<SsdFusedDiagonalHost>{});
}

}  // namespace exmy::models

#define EXMY_LAUNCHER sim::HostLaunch
#define EXMY_SUFFIX emulated
#include "models/cuda/ssd_define.hpp"

// The chunked SSD scan on a CUDA device: the block launches of
// models/ssd_blocks.hpp (DeviceLaunch, the products as cuBLASLt's strided
// batches) and the thread launches of models/ssd_launches.hpp with
// sim::DeviceLaunch (the launch shape only; the arithmetic is
// models/ssd_threads.hpp, which the host emulation runs too).
#include "models/cuda/ssd_cuda.hpp"
#include "sim/cuda/gemm_cuda.hpp"

namespace exmy::models {

void ssd_blocks_forward_cuda(float* y, float* acs, float* states, const float* x, int64_t ldx, const float* Bm,
                             const float* Cm, int64_t ldbc, const float* dt, const float* A_log, const float* D,
                             const SsdDims& d, float* scratch) {
  ssd_blocks_forward_launches(sim::DeviceLaunch{}, sim::DeviceBatchedGemm{}, y, acs, states, x, ldx, Bm, Cm, ldbc, dt,
                              A_log, D, d, scratch);
}
void ssd_blocks_backward_cuda(float* dx, float* dB, float* dC, float* ddt, float* dA_log, float* dD, const float* dy,
                              const float* x, int64_t ldx, const float* Bm, const float* Cm, int64_t ldbc,
                              const float* dt, const float* A_log, const float* D, const float* acs,
                              const float* states, const SsdDims& d, float* scratch) {
  ssd_blocks_backward_launches(sim::DeviceLaunch{}, sim::DeviceBatchedGemm{}, dx, dB, dC, ddt, dA_log, dD, dy, x, ldx,
                               Bm, Cm, ldbc, dt, A_log, D, acs, states, d, scratch);
}

}  // namespace exmy::models

#define EXMY_LAUNCHER sim::DeviceLaunch
#define EXMY_SUFFIX cuda
#include "models/cuda/ssd_define.hpp"

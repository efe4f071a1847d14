// The host emulation of the grouped GEMM kernels: the launches of
// sim/quant/grouped_launches.hpp and sim/quant/grouped_mma.hpp with
// sim::HostLaunch (threads one after another), the MMA kernel's CTAs by
// grouped_mma_host and the CPU's float32 GEMM (HostFloatGemm); and the
// choice between the MMA kernel and the float32 tiles.
#include <cstdlib>
#include <cstring>

#include "sim/quant/cuda/grouped_gemm_cuda.hpp"

namespace exmy::sim::quant {

bool grouped_tiles_chosen() {
  static const bool tiles = [] {
    const char* v = std::getenv("EXMY_CUDA_GROUPED");
    return v && std::strcmp(v, "tiles") == 0;
  }();
  return tiles;
}

namespace {
void run_mma_host(const MmaArgs& p) {
  if (p.group_rtz)
    p.acc_rtz ? grouped_mma_host<true, true>(p) : grouped_mma_host<true, false>(p);
  else
    p.acc_rtz ? grouped_mma_host<false, true>(p) : grouped_mma_host<false, false>(p);
}
}  // namespace

}  // namespace exmy::sim::quant

#define EXMY_LAUNCHER sim::HostLaunch
#define EXMY_FLOAT_GEMM HostFloatGemm
#define EXMY_MMA_RUN run_mma_host
#define EXMY_SUFFIX emulated
#include "sim/quant/cuda/grouped_define.hpp"

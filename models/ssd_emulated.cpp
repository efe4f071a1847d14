// The host emulation of the chunked SSD scan's kernels: the launches of
// models/ssd_launches.hpp with sim::HostLaunch (threads one after another)
// and SerialGemm (the CPU's Eigen products).
#include "models/cuda/ssd_cuda.hpp"

#define EXMY_LAUNCHER sim::HostLaunch
#define EXMY_GEMM SerialGemm
#define EXMY_SUFFIX emulated
#include "models/cuda/ssd_define.hpp"

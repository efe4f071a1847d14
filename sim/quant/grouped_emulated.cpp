// The host emulation of the grouped GEMM kernels: the launches of
// sim/quant/grouped_launches.hpp with sim::HostLaunch (threads one after
// another) and the CPU's float32 GEMM (HostFloatGemm).
#include "sim/quant/cuda/grouped_gemm_cuda.hpp"

#define EXMY_LAUNCHER sim::HostLaunch
#define EXMY_FLOAT_GEMM HostFloatGemm
#define EXMY_SUFFIX emulated
#include "sim/quant/cuda/grouped_define.hpp"

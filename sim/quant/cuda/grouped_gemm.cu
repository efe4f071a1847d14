// The grouped GEMM output model on a CUDA device: the launches of
// sim/quant/grouped_launches.hpp with sim::DeviceLaunch (the launch shape
// only; the arithmetic is sim/quant/grouped_items.hpp, shared with the CPU).
#include "sim/quant/cuda/grouped_gemm_cuda.hpp"

#define EXMY_LAUNCHER sim::DeviceLaunch
#define EXMY_SUFFIX cuda
#include "sim/quant/cuda/grouped_define.hpp"

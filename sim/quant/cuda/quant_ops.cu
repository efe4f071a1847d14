// The quantized linear's small kernels on a CUDA device (the launches of
// sim/quant/quant_launches.hpp with sim::DeviceLaunch).
#define EXMY_LAUNCHER exmy::sim::DeviceLaunch
#define EXMY_SUFFIX cuda
#include "sim/quant/quant_launches_define.hpp"

// The quantized linear's small kernels with the threads run on the host.
#define EXMY_LAUNCHER exmy::sim::HostLaunch
#define EXMY_SUFFIX emulated
#include "sim/quant/quant_launches_define.hpp"

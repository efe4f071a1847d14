// The launchers of formats/kernel_launch.hpp (HostLaunch, and DeviceLaunch in
// CUDA compilation; EXMY_HD_LAMBDA) under the simulator's namespace, where
// the layers' and the optimizer's launch sequences name them.
#pragma once

#include "formats/kernel_launch.hpp"

namespace exmy::sim {

using exmy::HostLaunch;
#if defined(__CUDACC__)
using exmy::DeviceLaunch;
#endif

}  // namespace exmy::sim

// The host emulation of the layer kernels: the launches of
// models/layer_launches.hpp with sim::HostLaunch (threads one after another).
#include "models/cuda/layers_cuda.hpp"
#include "sim/parallel.hpp"

#define EXMY_LAUNCHER sim::HostLaunch
#define EXMY_SUFFIX emulated
#include "models/cuda/layers_define.hpp"

// The kernels' weight-gradient partials follow the CPU's row blocks.
static_assert(exmy::models::kGradRowBlock == exmy::sim::kRowBlock);

// The layer kernels on a CUDA device: the launches of
// models/layer_launches.hpp with sim::DeviceLaunch (the launch shape only;
// the arithmetic is models/layer_rows.hpp, shared with the CPU).
#include "models/cuda/layers_cuda.hpp"

#define EXMY_LAUNCHER sim::DeviceLaunch
#define EXMY_SUFFIX cuda
#include "models/cuda/layers_define.hpp"

// The chunked SSD scan on a CUDA device: the thread launches of
// models/ssd_launches.hpp with sim::DeviceLaunch (the launch shape only; the
// arithmetic is models/ssd_threads.hpp, which the host emulation runs too).
#include "models/cuda/ssd_cuda.hpp"

#define EXMY_LAUNCHER sim::DeviceLaunch
#define EXMY_SUFFIX cuda
#include "models/cuda/ssd_define.hpp"

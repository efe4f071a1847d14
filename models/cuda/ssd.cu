// The chunked SSD scan on a CUDA device: the launches of
// models/ssd_launches.hpp with sim::DeviceLaunch and NaiveGemm (the launch
// shape only; the arithmetic is models/ssd_items.hpp, shared with the CPU).
#include "models/cuda/ssd_cuda.hpp"

#define EXMY_LAUNCHER sim::DeviceLaunch
#define EXMY_GEMM NaiveGemm
#define EXMY_SUFFIX cuda
#include "models/cuda/ssd_define.hpp"

// Causal GQA attention on a CUDA device: the row launches of
// models/attention_launches.hpp with sim::DeviceLaunch (the launch shape
// only; the arithmetic is models/attention_rows.hpp, which the host
// emulation runs too).
#include "models/cuda/attention_cuda.hpp"

#define EXMY_LAUNCHER sim::DeviceLaunch
#define EXMY_SUFFIX cuda
#include "models/cuda/attention_define.hpp"

// Causal GQA attention on a CUDA device: the launches of
// models/attention_launches.hpp with sim::DeviceLaunch and NaiveGemm (the
// launch shape only; the arithmetic is models/attention_items.hpp, shared
// with the CPU).
#include "models/cuda/attention_cuda.hpp"

#define EXMY_LAUNCHER sim::DeviceLaunch
#define EXMY_GEMM NaiveGemm
#define EXMY_SUFFIX cuda
#include "models/cuda/attention_define.hpp"

// The host emulation of causal GQA attention's kernels: the launches of
// models/attention_launches.hpp with sim::HostLaunch (threads one after
// another) and SerialGemm (the CPU's Eigen products).
#include "models/cuda/attention_cuda.hpp"

#define EXMY_LAUNCHER sim::HostLaunch
#define EXMY_GEMM SerialGemm
#define EXMY_SUFFIX emulated
#include "models/cuda/attention_define.hpp"

// The chunked SSD scan's kernels of models/ssd_launches.hpp, float32, with
// the arguments of models/ssd.hpp's ssd_chunk_scan_* plus a scratch:
// - ssd_chunk_scan_forward_emulated / ssd_chunk_scan_backward_emulated: the
//   item launches on the host (HostLaunch, SerialGemm), host pointers,
//   scratch ssd_forward_scratch(d) / ssd_backward_scratch(d) floats. They
//   equal the CPU scan bit for bit (the same item functions, the same Eigen
//   products, the host's exp); the emulated device backend runs them.
//   Always built.
// - ssd_parallel_forward_* / ssd_parallel_backward_*: the thread launches
//   (models/ssd_threads.hpp), scratch ssd_parallel_forward_scratch(d) /
//   ssd_parallel_backward_scratch(d) floats, in two builds: *_cuda on the
//   current CUDA device, device pointers, the default stream (asynchronous;
//   a failed launch throws exmy::Error naming the kernel), only where exmy
//   is built with CUDA (EXMY_HAVE_CUDA): the CUDA backend runs these;
//   *_emulated, the same launches with the threads run one after another on
//   the host, always built, so that CI holds them to the budget. Their sums
//   are NaiveGemm's, not Eigen's, and on a device exp is the device's: within
//   the FP32 budget of tests/models/test_ssd_cuda.cpp of the CPU.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "models/ssd_blocks.hpp"    // the scratch sizes
#include "models/ssd_fused.hpp"     // ssd_fused_applies
#include "models/ssd_launches.hpp"

namespace exmy::models {

void ssd_chunk_scan_forward_emulated(float* y, float* acs, float* states, const float* x, int64_t ldx,
                                     const float* Bm, const float* Cm, int64_t ldbc, const float* dt,
                                     const float* A_log, const float* D, const SsdDims& d, float* scratch);
void ssd_chunk_scan_backward_emulated(float* dx, float* dB, float* dC, float* ddt, float* dA_log, float* dD,
                                      const float* dy, const float* x, int64_t ldx, const float* Bm, const float* Cm,
                                      int64_t ldbc, const float* dt, const float* A_log, const float* D,
                                      const float* acs, const float* states, const SsdDims& d, float* scratch);

#define EXMY_SSD_PARALLEL_KERNELS(suffix)                                                                            \
  void ssd_parallel_forward_##suffix(float* y, float* acs, float* states, const float* x, int64_t ldx,              \
                                     const float* Bm, const float* Cm, int64_t ldbc, const float* dt,               \
                                     const float* A_log, const float* D, const SsdDims& d, float* scratch);         \
  void ssd_parallel_backward_##suffix(float* dx, float* dB, float* dC, float* ddt, float* dA_log, float* dD,        \
                                      const float* dy, const float* x, int64_t ldx, const float* Bm,                \
                                      const float* Cm, int64_t ldbc, const float* dt, const float* A_log,           \
                                      const float* D, const float* acs, const float* states, const SsdDims& d,      \
                                      float* scratch);

EXMY_SSD_PARALLEL_KERNELS(emulated)
#if defined(EXMY_HAVE_CUDA)
EXMY_SSD_PARALLEL_KERNELS(cuda)
#endif
#undef EXMY_SSD_PARALLEL_KERNELS

// The block launches (models/ssd_blocks.hpp), scratch
// ssd_blocks_forward_scratch(d) / ssd_blocks_backward_scratch(d) floats:
// *_emulated on the host (HostLaunch, LoopGemm<SerialGemm>: the CPU's
// products entry by entry, the CPU's exp: the CPU's bits), *_cuda on the
// current device (DeviceLaunch, cuBLASLt's strided batches, the default
// stream): within the FP32 budget of tests/models/test_ssd_cuda.cpp of the
// CPU.
#define EXMY_SSD_BLOCK_KERNELS(suffix)                                                                               \
  void ssd_blocks_forward_##suffix(float* y, float* acs, float* states, const float* x, int64_t ldx,                \
                                   const float* Bm, const float* Cm, int64_t ldbc, const float* dt,                 \
                                   const float* A_log, const float* D, const SsdDims& d, float* scratch);           \
  void ssd_blocks_backward_##suffix(float* dx, float* dB, float* dC, float* ddt, float* dA_log, float* dD,          \
                                    const float* dy, const float* x, int64_t ldx, const float* Bm, const float* Cm, \
                                    int64_t ldbc, const float* dt, const float* A_log, const float* D,              \
                                    const float* acs, const float* states, const SsdDims& d, float* scratch);
EXMY_SSD_BLOCK_KERNELS(emulated)
#if defined(EXMY_HAVE_CUDA)
EXMY_SSD_BLOCK_KERNELS(cuda)
#endif
#undef EXMY_SSD_BLOCK_KERNELS

// The forward with each chunk's output as one fused kernel on the BF16
// tensor cores (models/ssd_fused.hpp; scratch ssd_fused_forward_scratch(d)
// floats): acs and states as the block launches' (the same launches),
// y within the budget of tests/models/test_ssd_cuda.cpp of the CPU.
// *_emulated on the host (HostLaunch, LoopGemm<SerialGemm>, the kernel's
// emulation), *_cuda on the current device. Heads wider than 64 or states
// wider than 128 are refused (exmy::Error).
#define EXMY_SSD_FUSED_KERNELS(suffix)                                                                              \
  void ssd_fused_forward_##suffix(float* y, float* acs, float* states, const float* x, int64_t ldx,                \
                                  const float* Bm, const float* Cm, int64_t ldbc, const float* dt,                 \
                                  const float* A_log, const float* D, const SsdDims& d, float* scratch);
EXMY_SSD_FUSED_KERNELS(emulated)
#if defined(EXMY_HAVE_CUDA)
EXMY_SSD_FUSED_KERNELS(cuda)
#endif
#undef EXMY_SSD_FUSED_KERNELS

// EXMY_CUDA_SSD, read once ("" when unset).
inline std::string_view ssd_env() {
  static const std::string_view v = [] {
    const char* e = std::getenv("EXMY_CUDA_SSD");
    return std::string_view(e ? e : "");
  }();
  return v;
}
// Which family the CUDA backend runs: the block launches, unless the
// environment sets EXMY_CUDA_SSD=threads (the thread kernels; kept until a
// device has timed both, docs/benchmarks.md).
inline bool ssd_threads_chosen() { return ssd_env() == "threads"; }
// EXMY_CUDA_SSD=fused: the forward's chunk outputs as the fused kernel where
// it applies (ssd_fused_applies), the backward the block launches'.
inline bool ssd_fused_chosen(const SsdDims& d) { return ssd_env() == "fused" && ssd_fused_applies(d); }
// The scratch (floats) the CUDA backend's scan asks for: the larger of the
// forward's and the backward's of the family it runs (the emulated
// backend runs the block launches, or the fused forward, and asks for the
// same). Inline: the
// memory plan (models/mamba2.cpp) needs no kernels.
inline int64_t ssd_device_scratch(const SsdDims& d) {
  if (ssd_threads_chosen()) return std::max(ssd_parallel_forward_scratch(d), ssd_parallel_backward_scratch(d));
  if (ssd_fused_chosen(d)) return std::max(ssd_fused_forward_scratch(d), ssd_blocks_backward_scratch(d));
  return std::max(ssd_blocks_forward_scratch(d), ssd_blocks_backward_scratch(d));
}

}  // namespace exmy::models

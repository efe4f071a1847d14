// The chunked SSD scan's kernels of models/ssd_launches.hpp, float32, in two
// builds, with the arguments of models/ssd.hpp's ssd_chunk_scan_* plus a
// scratch of ssd_forward_scratch(d) / ssd_backward_scratch(d) floats:
// - *_cuda: on the current CUDA device, device pointers, the default stream
//   (asynchronous; a failed launch throws exmy::Error naming the kernel).
//   Only where exmy is built with CUDA (EXMY_HAVE_CUDA).
// - *_emulated: the same launches with the threads run one after another on
//   the host, host pointers; always built, so CI compares them with the CPU
//   scan (tests/models/test_ssd_cuda.cpp).
//
// Bits: the emulation equals the CPU bit for bit (the same item functions,
// the same Eigen products, the host's exp). On a device the products are
// summed in k order and exp is the device's, so the results are within the
// FP32 budget tests/models/test_ssd_cuda.cpp derives.
#pragma once

#include <cstdint>

#include "models/ssd_launches.hpp"  // ssd_forward_scratch, ssd_backward_scratch

namespace exmy::models {

#define EXMY_SSD_KERNELS(suffix)                                                                                    \
  void ssd_chunk_scan_forward_##suffix(float* y, float* acs, float* states, const float* x, int64_t ldx,           \
                                       const float* Bm, const float* Cm, int64_t ldbc, const float* dt,             \
                                       const float* A_log, const float* D, const SsdDims& d, float* scratch);       \
  void ssd_chunk_scan_backward_##suffix(float* dx, float* dB, float* dC, float* ddt, float* dA_log, float* dD,      \
                                        const float* dy, const float* x, int64_t ldx, const float* Bm,              \
                                        const float* Cm, int64_t ldbc, const float* dt, const float* A_log,         \
                                        const float* D, const float* acs, const float* states, const SsdDims& d,    \
                                        float* scratch);

EXMY_SSD_KERNELS(emulated)
#if defined(EXMY_HAVE_CUDA)
EXMY_SSD_KERNELS(cuda)
#endif
#undef EXMY_SSD_KERNELS

}  // namespace exmy::models

// The small kernels a quantized linear needs on a device, over a launcher
// (sim/kernel_launch.hpp): data movement and elementwise arithmetic whose
// bits equal the CPU's (the transpose moves floats; the BF16 rounding is
// sim/bf16.hpp's function; the add is one float addition per element).
// Instantiated with HostLaunch (quant_launches_emulated.cpp) and DeviceLaunch
// (sim/quant/cuda/quant_ops.cu).
#pragma once

#include <cstdint>

#include "sim/bf16.hpp"
#include "sim/kernel_launch.hpp"

namespace exmy::sim::quant {

template <class L>
void transpose_launches(const L& launch, float* dst, const float* src, int64_t rows, int64_t cols) {
  launch("transpose", rows * cols, [=] EXMY_HD_LAMBDA(int64_t i) {
    const int64_t c = i / rows, r = i % rows;  // consecutive threads write consecutive dst
    dst[i] = src[r * cols + c];
  });
}

template <class L>
void round_bf16_launches(const L& launch, float* dst, const float* src, int64_t n) {
  launch("round_bf16", n, [=] EXMY_HD_LAMBDA(int64_t i) { dst[i] = round_bf16_hd(src[i]); });
}

template <class L>
void add_launches(const L& launch, float* dst, const float* src, int64_t n) {
  launch("add", n, [=] EXMY_HD_LAMBDA(int64_t i) { dst[i] += src[i]; });
}

#define EXMY_QUANT_KERNELS(suffix)                                                          \
  void transpose_##suffix(float* dst, const float* src, int64_t rows, int64_t cols);        \
  void round_bf16_##suffix(float* dst, const float* src, int64_t n);                        \
  void add_##suffix(float* dst, const float* src, int64_t n);

EXMY_QUANT_KERNELS(emulated)
#if defined(EXMY_HAVE_CUDA)
EXMY_QUANT_KERNELS(cuda)
#endif
#undef EXMY_QUANT_KERNELS

}  // namespace exmy::sim::quant

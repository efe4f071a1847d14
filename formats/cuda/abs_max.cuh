// The tensor amax pass on a CUDA device: the max of the bits of |x| over a
// tensor (as unsigned integers, which order non-NaN magnitudes like floats
// and put every NaN above +Inf), shared by the quantize kernels
// (quantize.cu) and the benchmark's memory floor (sim/cuda/memory_floor.cu).
// Include from one .cu file per library: the kernel has internal linkage.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

namespace exmy {
namespace {

// Each thread takes a grid-stride share of x (16-byte loads where x is
// 16-byte aligned), the block reduces its threads' maxima, and one atomic
// per block meets the other blocks' in *result (which starts at 0). The
// grid of abs_max_grid(n) keeps the atomics few: one per thread block, not
// one per warp on a single address.
__global__ void abs_bits_max_kernel(const float* x, int64_t n, unsigned int* result) {
  constexpr unsigned kAbs = 0x7fffffffu;
  __shared__ unsigned int warp_max[32];
  unsigned int m = 0;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  int64_t head = 0;
  if (reinterpret_cast<uintptr_t>(x) % 16 == 0) {
    const int64_t n4 = n / 4;
    const uint4* x4 = reinterpret_cast<const uint4*>(x);
    for (int64_t i = tid; i < n4; i += stride) {
      const uint4 v = x4[i];
      m = max(m, max(max(v.x & kAbs, v.y & kAbs), max(v.z & kAbs, v.w & kAbs)));
    }
    head = n4 * 4;
  }
  for (int64_t i = head + tid; i < n; i += stride) m = max(m, __float_as_uint(x[i]) & kAbs);
  for (int off = 16; off > 0; off >>= 1) m = max(m, __shfl_down_sync(0xffffffffu, m, off));
  const unsigned int warp = threadIdx.x / 32, warps = (blockDim.x + 31) / 32;
  if (threadIdx.x % 32 == 0) warp_max[warp] = m;
  __syncthreads();
  if (warp == 0) {
    m = threadIdx.x < warps ? warp_max[threadIdx.x] : 0u;
    for (int off = 16; off > 0; off >>= 1) m = max(m, __shfl_down_sync(0xffffffffu, m, off));
    if (threadIdx.x == 0 && m != 0) atomicMax(result, m);
  }
}

// Thread blocks of `threads` for the amax pass over n elements: enough to
// fill a large device several times over, at most 1024.
inline int abs_max_grid(int64_t n, int threads) {
  return static_cast<int>(std::clamp<int64_t>((n / 4 + threads - 1) / threads, 1, 1024));
}

}  // namespace
}  // namespace exmy

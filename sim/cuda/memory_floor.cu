// The device memory floors of the quantize benchmark (memory_floor.hpp).
#include "sim/cuda/memory_floor.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "formats/cuda/abs_max.cuh"
#include "formats/cuda/cuda_check.hpp"
#include "formats/error.hpp"

namespace exmy::sim {
namespace {

constexpr int kThreads = 256;

int grid_for(int64_t n) { return static_cast<int>(std::clamp<int64_t>((n + kThreads - 1) / kThreads, 1, 1 << 16)); }

__global__ void floor_write_kernel(const float* x, float* y, uint8_t* codes, int64_t n, const unsigned* amax_bits) {
  const float k = amax_bits && *amax_bits > 0x7f800000u ? 0.0f : 1.0f;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    y[i] = x[i] * k;
    codes[i] = static_cast<uint8_t>(i);
  }
}

}  // namespace

void cuda_memory_floor(const float* x, float* y, uint8_t* codes, int64_t n, bool amax_pass, unsigned* scratch) {
  if (amax_pass) {
    cuda_check(cudaMemsetAsync(scratch, 0, sizeof(unsigned)), "cudaMemset");
    abs_bits_max_kernel<<<abs_max_grid(n, kThreads), kThreads>>>(x, n, scratch);
    cuda_check(cudaGetLastError(), "memory floor amax kernel");
  }
  floor_write_kernel<<<grid_for(n), kThreads>>>(x, y, codes, n, amax_pass ? scratch : nullptr);
  cuda_check(cudaGetLastError(), "memory floor kernel");
}

}  // namespace exmy::sim

// The fused kernels' MMA chains on a device (models/attention_fused.hpp,
// models/ssd_fused.hpp; their host emulations: fused_rows_product_host,
// fused_regs_product_host), included by the CUDA sources that define them.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "formats/error.hpp"
#include "formats/kernel_launch.hpp"  // cuda_sync_launches
#include "models/attention_fused.hpp"
#include "sim/mma_bf16.hpp"

namespace exmy::models {

// The kernels' MMA chains (the host's: fused_rows_product_host,
// fused_regs_product_host): c[nt] += A's rows [ar0, ar0 + 16) times B's 64
// rows transposed over kDh; c[dt] += x's A fragments (three pieces) times B
// held [k][n].
template <int kDh, int kPa, int kPb>
__device__ __forceinline__ void fused_rows_product(const uint16_t* A, const uint16_t* B, int ps, int ld, int ar0,
                                                   int lane, float (&c)[fused::kNt][4]) {
  EXMY_MMA_UNROLL
  for (int ks = 0; ks < kDh; ks += 16)
    fused_for_pairs<kPa, kPb>([&](int i, int j) {
      uint32_t fa[4];
      sim::mma_frag_a(A + i * ps, ld, ar0, ks, lane, fa);
      EXMY_MMA_UNROLL
      for (int nt = 0; nt < fused::kNt; ++nt) {
        uint32_t fb[2];
        sim::mma_frag_b(B + j * ps, ld, nt * 8, ks, lane, fb);
        sim::mma_bf16_16816(c[nt], fa, fb);
      }
    });
}
template <int kDh, int kPb>
__device__ __forceinline__ void fused_regs_product(const float (&x)[fused::kNt][4], const uint16_t* B, int ps, int ld,
                                                   int lane, float (&c)[kDh / 8][4]) {
  EXMY_MMA_UNROLL
  for (int kk = 0; kk < fused::kKeys / 16; ++kk) {
    uint32_t pf[fused::kPPieces][4];
    fused_p_frags(x, kk, pf);
    fused_for_pairs<fused::kPPieces, kPb>([&](int i, int j) {
      EXMY_MMA_UNROLL
      for (int dt = 0; dt < kDh / 8; ++dt) {
        uint32_t fb[2];
        sim::mma_frag_b_kn(B + j * ps, ld, dt * 8, kk * 16, lane, fb);
        sim::mma_bf16_16816(c[dt], pf[i], fb);
      }
    });
  }
}

// A fused kernel's launch with `bytes` of dynamic shared memory (more than
// the default 48 KiB needs the kernel's attribute, which the device may
// refuse: one line naming the kernel).
template <class Args>
void launch_fused(void (*kernel)(Args), const char* name, size_t bytes, dim3 grid, const Args& a,
                  int threads = fused::kThreads) {
  const cudaError_t attr =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
  if (attr != cudaSuccess)
    throw Error(std::string("CUDA error in kernel ") + name + ": " + std::to_string(bytes) +
                " bytes of shared memory refused (" + cudaGetErrorString(attr) + ")");
  kernel<<<grid, threads, bytes>>>(a);
}

// After a fused kernel's launch: a failed launch (or, with EXMY_CUDA_SYNC=1,
// a failed run) as one line naming the kernel.
inline void fused_sync(const char* what) {
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess && cuda_sync_launches()) e = cudaDeviceSynchronize();
  if (e != cudaSuccess) throw Error(std::string("CUDA error in kernel ") + what + ": " + cudaGetErrorString(e));
}

}  // namespace exmy::models

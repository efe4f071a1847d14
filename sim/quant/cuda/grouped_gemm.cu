// The grouped GEMM output model on a CUDA device: the MMA kernel
// (sim/quant/grouped_mma.hpp: BF16 tensor-core MMAs where a group's sum is
// exact in them, the accumulation in the same kernel), and the launches of
// sim/quant/grouped_launches.hpp with sim::DeviceLaunch and cuBLASLt's
// float32 GEMM for the other groups or EXMY_CUDA_GROUPED=tiles (the launch
// shape only; the arithmetic is sim/quant/grouped_items.hpp, shared with
// the CPU).
#include <cuda_runtime.h>

#include <string>

#include "formats/error.hpp"
#include "formats/kernel_launch.hpp"  // DeviceProfileScope, cuda_sync_launches
#include "sim/cuda/gemm_cuda.hpp"
#include "sim/quant/cuda/grouped_gemm_cuda.hpp"
#include "sim/quant/grouped_mma.hpp"

namespace exmy::sim::quant {
namespace {

// One float32 product on cuBLASLt (FP32 arithmetic, no TF32), through the
// block launches' handle (sim::DeviceBatchedGemm, one entry).
struct DeviceFloatGemm {
  void operator()(float* C, int64_t ldc, const float* A, int64_t lda, Op opA, const float* B, int64_t ldb, Op opB,
                  int64_t M, int64_t N, int64_t K) const {
    sim::DeviceBatchedGemm{}(1, C, ldc, 0, A, lda, 0, opA, B, ldb, 0, opB, M, N, K, false);
  }
};

// A CTA per (128 rows of A, 128 rows of B), 8 warps of 64 x 32 outputs;
// per group in K order, by its class (mma_group_class): the group's columns
// staged in chunks of kChunk, the MMAs chained into the thread's group
// product, then mma_group_step; or (kMmaBlocks) the group staged whole and,
// for each m16 row block of the warp's, each block's MMAs from zero added
// into double sums, rounded once into the accumulator. At the end the
// epilogue's stores. Grid: x over B's tiles, y over A's.
template <bool kGroupRtz, bool kAccRtz, int kChunk>
__global__ void __launch_bounds__(mma::kThreads, 1) grouped_mma_kernel(const MmaArgs p) {
  using namespace mma;
  __shared__ __align__(16) uint16_t As[kTile * kLd];
  __shared__ __align__(16) uint16_t Bs[kTile * kLd];
  const int tid = static_cast<int>(threadIdx.x), warp = tid / 32, lane = tid % 32;
  const int64_t bm = blockIdx.y, bn = blockIdx.x, m0 = bm * kTile, n0 = bn * kTile;
  float acc[kElems], grp[kElems];
  EXMY_MMA_UNROLL
  for (int e = 0; e < kElems; ++e) acc[e] = 0.0f;
  for (int64_t g = 0; g < p.l.ng; ++g) {
    const int64_t k0 = g * p.G, gk = group_cols(p.K, p.G, g);
    const int cls = mma_group_class(p, bm, bn, g);
    if (kChunk == p.G && cls == kMmaBlocks) {  // the group staged whole
      mma_stage_both(tid, p, m0, n0, k0, kChunk, As, Bs);
      __syncthreads();
      EXMY_MMA_UNROLL
      for (int h = 0; h < kMi; ++h) {
        double gd[kPart];
        EXMY_MMA_UNROLL
        for (int e = 0; e < kPart; ++e) gd[e] = 0.0;
        EXMY_MMA_UNROLL
        for (int ks = 0; ks < kChunk; ks += 16) {
          if (ks >= gk) break;
          float blk[kPart];
          EXMY_MMA_UNROLL
          for (int e = 0; e < kPart; ++e) blk[e] = 0.0f;
          uint32_t a[4], b[kNi][2];
          mma_load_a(As, (warp / 4) * kWarpRows + h * 16, ks, lane, a);
          EXMY_MMA_UNROLL
          for (int ni = 0; ni < kNi; ++ni) mma_load_b(Bs, (warp % 4) * kWarpCols + ni * 8, ks, lane, b[ni]);
          EXMY_MMA_UNROLL
          for (int ni = 0; ni < kNi; ++ni) mma_bf16_16816(blk + ni * 4, a, b[ni]);
          mma_block_add(gd, blk);
        }
        mma_blocks_finish<kGroupRtz, kAccRtz>(acc + h * kPart, gd);
      }
      __syncthreads();
      continue;
    }
    EXMY_MMA_UNROLL
    for (int e = 0; e < kElems; ++e) grp[e] = 0.0f;
    for (int64_t kc = k0; kc < k0 + gk; kc += kChunk) {
      mma_stage_both(tid, p, m0, n0, kc, kChunk, As, Bs);
      __syncthreads();
      EXMY_MMA_UNROLL
      for (int ks = 0; ks < kChunk; ks += 16) {
        uint32_t a[kMi][4], b[kNi][2];
        EXMY_MMA_UNROLL
        for (int mi = 0; mi < kMi; ++mi) mma_load_a(As, (warp / 4) * kWarpRows + mi * 16, ks, lane, a[mi]);
        EXMY_MMA_UNROLL
        for (int ni = 0; ni < kNi; ++ni) mma_load_b(Bs, (warp % 4) * kWarpCols + ni * 8, ks, lane, b[ni]);
        EXMY_MMA_UNROLL
        for (int mi = 0; mi < kMi; ++mi)
          EXMY_MMA_UNROLL
          for (int ni = 0; ni < kNi; ++ni) mma_bf16_16816(grp + (mi * kNi + ni) * 4, a[mi], b[ni]);
      }
      __syncthreads();
    }
    mma_group_step<kGroupRtz, kAccRtz>(p, m0, n0, g, cls == kMmaChain, warp, lane, acc, grp);
  }
  mma_store(p, m0, n0, warp, lane, acc);
}

template <bool kGroupRtz, bool kAccRtz>
void launch_mma(const MmaArgs& p, dim3 grid) {
  switch (mma::chunk_of(p.G)) {
    case 64: grouped_mma_kernel<kGroupRtz, kAccRtz, 64><<<grid, mma::kThreads>>>(p); break;
    case 32: grouped_mma_kernel<kGroupRtz, kAccRtz, 32><<<grid, mma::kThreads>>>(p); break;
    default: grouped_mma_kernel<kGroupRtz, kAccRtz, 16><<<grid, mma::kThreads>>>(p); break;
  }
}

void run_mma_cuda(const MmaArgs& p) {
  if (p.l.tm > 65535) throw Error("grouped_mma: " + std::to_string(p.M) + " rows of A exceed the kernel's grid");
  const dim3 grid(static_cast<unsigned>(p.l.tn), static_cast<unsigned>(p.l.tm));
  {
    DeviceProfileScope timed("grouped_mma", 2.0 * static_cast<double>(p.M) * p.N * p.K);
    if (p.group_rtz)
      p.acc_rtz ? launch_mma<true, true>(p, grid) : launch_mma<true, false>(p, grid);
    else
      p.acc_rtz ? launch_mma<false, true>(p, grid) : launch_mma<false, false>(p, grid);
  }
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess && cuda_sync_launches()) e = cudaDeviceSynchronize();
  if (e != cudaSuccess) throw Error(std::string("CUDA error in kernel grouped_mma: ") + cudaGetErrorString(e));
}

}  // namespace
}  // namespace exmy::sim::quant

#define EXMY_LAUNCHER sim::DeviceLaunch
#define EXMY_FLOAT_GEMM DeviceFloatGemm
#define EXMY_MMA_RUN run_mma_cuda
#define EXMY_SUFFIX cuda
#include "sim/quant/cuda/grouped_define.hpp"

// Causal GQA attention on a CUDA device: the block launches of
// models/attention_blocks.hpp (DeviceLaunch, the products as cuBLASLt's
// strided batches, on bfloat16 pieces with bf16_pieces: SplitGemm) and
// the row launches of models/attention_launches.hpp with sim::DeviceLaunch
// (the launch shape only; the arithmetic is models/attention_rows.hpp and
// attention_items.hpp's row steps, which the host emulation runs too).
#include <cuda_runtime.h>

#include <string>

#include "formats/error.hpp"
#include "formats/kernel_launch.hpp"  // DeviceProfileScope, cuda_sync_launches
#include "models/attention_fused.hpp"
#include "models/cuda/attention_cuda.hpp"
#include "sim/cuda/gemm_cuda.hpp"

namespace exmy::models {

void attention_blocks_forward_cuda(float* out, float* lse, const float* q, const float* k, const float* v,
                                   const AttnDims& d, const AttnBlocking& blocking, float* scratch) {
  with_block_gemm<sim::DeviceLaunch>(d, blocking, false, scratch, sim::DeviceBatchedGemm{}, sim::DeviceBatchedGemm{},
                                     [&](const auto& gemm) {
                                       attention_blocks_forward_launches(sim::DeviceLaunch{}, gemm, out, lse, q, k, v,
                                                                         d, blocking, scratch);
                                     });
}
void attention_blocks_backward_cuda(float* dq, float* dk, float* dv, const float* dout, const float* out,
                                    const float* lse, const float* q, const float* k, const float* v,
                                    const AttnDims& d, const AttnBlocking& blocking, float* scratch) {
  with_block_gemm<sim::DeviceLaunch>(d, blocking, true, scratch, sim::DeviceBatchedGemm{}, sim::DeviceBatchedGemm{},
                                     [&](const auto& gemm) {
                                       attention_blocks_backward_launches(sim::DeviceLaunch{}, gemm, dq, dk, dv, dout,
                                                                          out, lse, q, k, v, d, blocking, scratch);
                                     });
}

namespace {

// The fused forward (models/attention_fused.hpp): a CTA per (query tile,
// query head, batch), the longest causal rows' tiles first; the steps of
// attention_fused_forward_host with the MMAs and the quads' shuffles on the
// device.
template <int kDh, int kP>
__global__ void __launch_bounds__(fused::kThreads) attention_fused_forward_kernel(const FusedArgs a) {
  using namespace fused;
  using L = FusedSmem<kDh, kP>;
  extern __shared__ __align__(16) uint16_t sm[];
  const int tid = static_cast<int>(threadIdx.x), warp = tid / 32, lane = tid % 32;
  const int64_t S = a.d.seqlen, i0 = static_cast<int64_t>(gridDim.x - 1 - blockIdx.x) * kRows;
  const int64_t h = blockIdx.y, b = blockIdx.z, kvh = h / (a.d.q_heads / a.d.kv_heads);
  const int64_t kend = i0 + kRows < S ? i0 + kRows : S;
  const float scale = attn_scale<float>(a.d);
  FusedRegs<kDh> R;
  fused_init(R);
  fused_stage_q<kDh, kP>(tid, a, b, h, i0, sm);
  for (int64_t j0 = 0; j0 < kend; j0 += kKeys) {
    __syncthreads();  // the previous tile's fragments read
    fused_stage_kv<kDh, kP>(tid, a, b, kvh, j0, sm);
    __syncthreads();
    EXMY_MMA_UNROLL
    for (int nt = 0; nt < kNt; ++nt)
      EXMY_MMA_UNROLL
      for (int e = 0; e < 4; ++e) R.s[nt][e] = 0.0f;
    EXMY_MMA_UNROLL
    for (int ks = 0; ks < kDh; ks += 16)
      fused_for_pairs<kP, kP>([&](int i, int j) {
        uint32_t fa[4];
        sim::mma_frag_a(sm + L::q_at + i * kRows * L::ld, L::ld, warp * 16, ks, lane, fa);
        EXMY_MMA_UNROLL
        for (int nt = 0; nt < kNt; ++nt) {
          uint32_t fb[2];
          sim::mma_frag_b(sm + L::k_at + j * kKeys * L::ld, L::ld, nt * 8, ks, lane, fb);
          sim::mma_bf16_16816(R.s[nt], fa, fb);
        }
      });
    float mt[2];
    fused_scale_mask(R, warp, lane, i0, j0, S, scale, mt);
    EXMY_MMA_UNROLL
    for (int step = 1; step <= 2; step *= 2)
      EXMY_MMA_UNROLL
      for (int row = 0; row < 2; ++row) mt[row] = sim::hd_max(mt[row], __shfl_xor_sync(0xffffffffu, mt[row], step));
    fused_softmax_step(R, mt, j0 == 0);
    EXMY_MMA_UNROLL
    for (int kk = 0; kk < kKeys / 16; ++kk) {
      uint32_t pf[kPPieces][4];
      fused_p_frags(R, kk, pf);
      fused_for_pairs<kPPieces, kP>([&](int i, int j) {
        EXMY_MMA_UNROLL
        for (int dt = 0; dt < kDh / 8; ++dt) {
          uint32_t fb[2];
          sim::mma_frag_b(sm + L::v_at + j * kDh * kLdV, kLdV, dt * 8, kk * 16, lane, fb);
          sim::mma_bf16_16816(R.o[dt], pf[i], fb);
        }
      });
    }
  }
  float l[2] = {R.l[0], R.l[1]};
  EXMY_MMA_UNROLL
  for (int step = 1; step <= 2; step *= 2)
    EXMY_MMA_UNROLL
    for (int row = 0; row < 2; ++row) l[row] += __shfl_xor_sync(0xffffffffu, l[row], step);
  fused_store(R, l, a, b, h, i0, warp, lane);
}

template <int kDh, int kP>
void launch_fused_forward(const FusedArgs& a) {
  const auto kernel = attention_fused_forward_kernel<kDh, kP>;
  constexpr size_t bytes = FusedSmem<kDh, kP>::bytes;
  static const cudaError_t attr =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
  if (attr != cudaSuccess)
    throw Error("CUDA error in kernel attention_fused_forward: " + std::to_string(bytes) +
                " bytes of shared memory refused (" + cudaGetErrorString(attr) + ")");
  const dim3 grid(static_cast<unsigned>((a.d.seqlen + fused::kRows - 1) / fused::kRows),
                  static_cast<unsigned>(a.d.q_heads), static_cast<unsigned>(a.d.batch));
  kernel<<<grid, fused::kThreads, bytes>>>(a);
}

}  // namespace

void attention_fused_forward_cuda(float* out, float* lse, const float* q, const float* k, const float* v,
                                  const AttnDims& d) {
  if (!attention_fused_applies(d))
    throw Error("attention_fused_forward: head_dim " + std::to_string(d.head_dim) + " is wider than 128");
  if (d.q_heads > 65535 || d.batch > 65535 || (d.seqlen + fused::kRows - 1) / fused::kRows > 0x7fffffff)
    throw Error("attention_fused_forward: the shape exceeds the kernel's grid");
  const FusedArgs a{out, lse, q, k, v, d};
  {
    const double pairs = static_cast<double>(d.seqlen) * static_cast<double>(d.seqlen + 1) / 2;
    DeviceProfileScope timed("attention_fused_forward",
                             4.0 * static_cast<double>(d.head_dim * d.q_heads * d.batch) * pairs);
    fused_dispatch(d, [&]<int kDh, int kP>() { launch_fused_forward<kDh, kP>(a); });
  }
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess && cuda_sync_launches()) e = cudaDeviceSynchronize();
  if (e != cudaSuccess) throw Error(std::string("CUDA error in kernel attention_fused_forward: ") + cudaGetErrorString(e));
}

}  // namespace exmy::models

#define EXMY_LAUNCHER sim::DeviceLaunch
#define EXMY_SUFFIX cuda
#include "models/cuda/attention_define.hpp"

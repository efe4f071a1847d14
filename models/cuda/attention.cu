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
#include "models/cuda/fused_mma.cuh"
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
  fused_stage_q<kDh, kP, L>(tid, a, b, h, i0, sm);
  for (int64_t j0 = 0; j0 < kend; j0 += kKeys) {
    __syncthreads();  // the previous tile's fragments read
    fused_stage_kv<kDh, kP, L>(tid, a, b, kvh, j0, sm);
    __syncthreads();
    fused_zero(R.s);
    fused_rows_product<kDh, kP, kP>(sm + L::q_at, sm + L::k_at, L::rows, L::ld, warp * 16, lane, R.s);
    float mt[2];
    fused_scale_mask(R, warp, lane, i0, j0, S, scale, mt);
    EXMY_MMA_UNROLL
    for (int step = 1; step <= 2; step *= 2)
      EXMY_MMA_UNROLL
      for (int row = 0; row < 2; ++row) mt[row] = sim::hd_max(mt[row], __shfl_xor_sync(0xffffffffu, mt[row], step));
    fused_softmax_step(R, mt, j0 == 0);
    fused_regs_product<kDh, kP>(R.s, sm + L::v_at, L::rows, L::ld, lane, R.o);
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
  const dim3 grid(static_cast<unsigned>((a.d.seqlen + fused::kRows - 1) / fused::kRows),
                  static_cast<unsigned>(a.d.q_heads), static_cast<unsigned>(a.d.batch));
  launch_fused(attention_fused_forward_kernel<kDh, kP>, "attention_fused_forward", FusedSmem<kDh, kP>::bytes, grid,
               a);
}

// The backward's dq kernel: a CTA per (query tile, query head, batch), the
// longest rows' tiles first (attention_fused_backward_host's first loop).
template <int kDh, int kP>
__global__ void __launch_bounds__(fused::kThreads) attention_fused_dq_kernel(const FusedBwdArgs a) {
  using namespace fused;
  using L = FusedBwdSmem<kDh, kP>;
  extern __shared__ __align__(16) uint16_t sm[];
  const int tid = static_cast<int>(threadIdx.x), warp = tid / 32, lane = tid % 32;
  const int64_t S = a.d.seqlen, Dh = a.d.head_dim, Hq = a.d.q_heads, ldq = Hq * Dh;
  const int64_t i0 = static_cast<int64_t>(gridDim.x - 1 - blockIdx.x) * kRows, h = blockIdx.y, b = blockIdx.z;
  const int64_t kvh = h / (Hq / a.d.kv_heads), kend = i0 + kRows < S ? i0 + kRows : S, row = (b * Hq + h) * S;
  const float scale = attn_scale<float>(a.d);
  FusedBwdRegs<kDh> R;
  fused_bwd_init(R);
  fused_bwd_stage_q<kDh, kP, kThreads>(tid, a, b, h, i0, sm);
  for (int64_t j0 = 0; j0 < kend; j0 += kKeys) {
    __syncthreads();  // the previous tile's fragments read
    fused_stage_kv<kDh, kP, L, kThreads>(tid, a, b, kvh, j0, sm);
    __syncthreads();
    fused_bwd_zero_tile(R);
    fused_rows_product<kDh, kP, kP>(sm + L::q_at, sm + L::k_at, L::rows, L::ld, warp * 16, lane, R.s);
    fused_rows_product<kDh, kPPieces, kP>(sm + L::do_at, sm + L::v_at, L::rows, L::ld, warp * 16, lane, R.dp);
    fused_bwd_step<false>(R, warp, lane, i0, j0, S, scale, a.lse + row, a.D + row);
    fused_regs_product<kDh, kP>(R.dp, sm + L::k_at, L::rows, L::ld, lane, R.acc);
  }
  fused_bwd_store<kDh>(R.acc, a.dq + b * S * ldq + h * Dh, ldq, i0, S, Dh, warp, lane);
}

// The backward's dkv kernel: a CTA per (key tile, kv head, batch), the
// first keys' tiles (the most query tiles) first; warps w and w + 4 on keys
// 16 w.., the first summing dV = P^T dO, the second dK = dS^T Q (each its
// own S; only the second forms dP).
template <int kDh, int kP>
__global__ void __launch_bounds__(fused::kKvThreads) attention_fused_dkv_kernel(const FusedBwdArgs a) {
  using namespace fused;
  using L = FusedBwdSmem<kDh, kP>;
  extern __shared__ __align__(16) uint16_t sm[];
  const int tid = static_cast<int>(threadIdx.x), warp = tid / 32, lane = tid % 32, wrow = warp % 4;
  const bool dk_warp = warp >= 4;
  const int64_t S = a.d.seqlen, Dh = a.d.head_dim, Hq = a.d.q_heads, ldkv = a.d.kv_heads * Dh;
  const int64_t j0 = static_cast<int64_t>(blockIdx.x) * kKeys, kvh = blockIdx.y, b = blockIdx.z;
  const int64_t rep = Hq / a.d.kv_heads;
  const float scale = attn_scale<float>(a.d);
  FusedBwdRegs<kDh> R;
  fused_bwd_init(R);
  fused_stage_kv<kDh, kP, L, kKvThreads>(tid, a, b, kvh, j0, sm);
  for (int64_t h = kvh * rep; h < (kvh + 1) * rep; ++h) {
    const int64_t row = (b * Hq + h) * S;
    for (int64_t i0 = j0; i0 < S; i0 += kRows) {
      __syncthreads();  // the previous tile's fragments read
      fused_bwd_stage_q<kDh, kP, kKvThreads>(tid, a, b, h, i0, sm);
      __syncthreads();
      fused_bwd_zero_tile(R);
      fused_rows_product<kDh, kP, kP>(sm + L::k_at, sm + L::q_at, L::rows, L::ld, wrow * 16, lane, R.s);
      if (dk_warp)
        fused_rows_product<kDh, kP, kPPieces>(sm + L::v_at, sm + L::do_at, L::rows, L::ld, wrow * 16, lane, R.dp);
      fused_bwd_step<true>(R, wrow, lane, j0, i0, S, scale, a.lse + row, a.D + row);
      if (dk_warp)
        fused_regs_product<kDh, kP>(R.dp, sm + L::q_at, L::rows, L::ld, lane, R.acc);
      else
        fused_regs_product<kDh, kPPieces>(R.s, sm + L::do_at, L::rows, L::ld, lane, R.acc);
    }
  }
  fused_bwd_store<kDh>(R.acc, (dk_warp ? a.dk : a.dv) + b * S * ldkv + kvh * Dh, ldkv, j0, S, Dh, wrow, lane);
}

template <int kDh, int kP>
void launch_fused_backward(const FusedBwdArgs& a) {
  const unsigned tiles = static_cast<unsigned>((a.d.seqlen + fused::kRows - 1) / fused::kRows);
  constexpr size_t bytes = FusedBwdSmem<kDh, kP>::bytes;
  launch_fused(attention_fused_dq_kernel<kDh, kP>, "attention_fused_backward dq", bytes,
               dim3(tiles, static_cast<unsigned>(a.d.q_heads), static_cast<unsigned>(a.d.batch)), a);
  launch_fused(attention_fused_dkv_kernel<kDh, kP>, "attention_fused_backward dkv", bytes,
               dim3(tiles, static_cast<unsigned>(a.d.kv_heads), static_cast<unsigned>(a.d.batch)), a,
               fused::kKvThreads);
}

// The shape's checks before any launch: the head width, the grid.
void fused_check(const AttnDims& d, const char* what) {
  attention_fused_require(d, what);
  if (d.q_heads > 65535 || d.batch > 65535 || (d.seqlen + fused::kRows - 1) / fused::kRows > 0x7fffffff)
    throw Error(std::string(what) + ": the shape exceeds the kernel's grid");
}
// Causal attention's model FLOPs (models/attention.cpp's count): 4 Dh per
// (query, key <= query) pair and head forward, twice that backward.
double fused_flops(const AttnDims& d) {
  const double pairs = static_cast<double>(d.seqlen) * static_cast<double>(d.seqlen + 1) / 2;
  return 4.0 * static_cast<double>(d.head_dim * d.q_heads * d.batch) * pairs;
}

}  // namespace

void attention_fused_backward_cuda(float* dq, float* dk, float* dv, const float* dout, const float* out,
                                   const float* lse, const float* q, const float* k, const float* v,
                                   const AttnDims& d, float* scratch) {
  fused_check(d, "attention_fused_backward");
  fused_rowsum_launch(sim::DeviceLaunch{}, scratch, dout, out, d);
  const FusedBwdArgs a{dq, dk, dv, dout, lse, q, k, v, scratch, d};
  {
    DeviceProfileScope timed("attention_fused_backward", 2 * fused_flops(d));
    fused_dispatch(d, [&]<int kDh, int kP>() { launch_fused_backward<kDh, kP>(a); });
  }
  fused_sync("attention_fused_backward");
}

void attention_fused_forward_cuda(float* out, float* lse, const float* q, const float* k, const float* v,
                                  const AttnDims& d) {
  fused_check(d, "attention_fused_forward");
  const FusedArgs a{out, lse, q, k, v, d};
  {
    DeviceProfileScope timed("attention_fused_forward", fused_flops(d));
    fused_dispatch(d, [&]<int kDh, int kP>() { launch_fused_forward<kDh, kP>(a); });
  }
  fused_sync("attention_fused_forward");
}

}  // namespace exmy::models

#define EXMY_LAUNCHER sim::DeviceLaunch
#define EXMY_SUFFIX cuda
#include "models/cuda/attention_define.hpp"

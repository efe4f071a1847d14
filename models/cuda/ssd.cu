// The chunked SSD scan on a CUDA device: the block launches of
// models/ssd_blocks.hpp (DeviceLaunch, the products as cuBLASLt's strided
// batches, FP32 or on bfloat16 pieces through SplitGemm), the forward with
// the chunks' outputs as the fused kernel of models/ssd_fused.hpp, and the
// thread launches of models/ssd_launches.hpp with sim::DeviceLaunch (the
// launch shape only; the arithmetic is models/ssd_threads.hpp, which the
// host emulation runs too).
#include "models/cuda/fused_mma.cuh"
#include "models/cuda/ssd_cuda.hpp"
#include "models/ssd_fused.hpp"
#include "sim/cuda/gemm_cuda.hpp"

namespace exmy::models {

void ssd_blocks_forward_cuda(float* y, float* acs, float* states, const float* x, int64_t ldx, const float* Bm,
                             const float* Cm, int64_t ldbc, const float* dt, const float* A_log, const float* D,
                             const SsdDims& d, float* scratch) {
  ssd_blocks_forward_launches(sim::DeviceLaunch{}, sim::DeviceBatchedGemm{}, y, acs, states, x, ldx, Bm, Cm, ldbc, dt,
                              A_log, D, d, scratch);
}
void ssd_blocks_backward_cuda(float* dx, float* dB, float* dC, float* ddt, float* dA_log, float* dD, const float* dy,
                              const float* x, int64_t ldx, const float* Bm, const float* Cm, int64_t ldbc,
                              const float* dt, const float* A_log, const float* D, const float* acs,
                              const float* states, const SsdDims& d, float* scratch) {
  ssd_blocks_backward_launches(sim::DeviceLaunch{}, sim::DeviceBatchedGemm{}, dx, dB, dC, ddt, dA_log, dD, dy, x, ldx,
                               Bm, Cm, ldbc, dt, A_log, D, acs, states, d, scratch);
}

void ssd_pieces_forward_cuda(float* y, float* acs, float* states, const float* x, int64_t ldx, const float* Bm,
                             const float* Cm, int64_t ldbc, const float* dt, const float* A_log, const float* D,
                             const SsdDims& d, float* scratch) {
  ssd_blocks_forward_launches(sim::DeviceLaunch{}, SplitGemm<sim::DeviceLaunch, sim::DeviceBatchedGemm>{}, y, acs,
                              states, x, ldx, Bm, Cm, ldbc, dt, A_log, D, d, scratch);
}
void ssd_pieces_backward_cuda(float* dx, float* dB, float* dC, float* ddt, float* dA_log, float* dD, const float* dy,
                              const float* x, int64_t ldx, const float* Bm, const float* Cm, int64_t ldbc,
                              const float* dt, const float* A_log, const float* D, const float* acs,
                              const float* states, const SsdDims& d, float* scratch) {
  ssd_blocks_backward_launches(sim::DeviceLaunch{}, SplitGemm<sim::DeviceLaunch, sim::DeviceBatchedGemm>{}, dx, dB,
                               dC, ddt, dA_log, dD, dy, x, ldx, Bm, Cm, ldbc, dt, A_log, D, acs, states, d, scratch);
}

namespace {

// The fused output kernel (models/ssd_fused.hpp): a CTA per (64 rows of a
// chunk, head, batch x chunk), the rows nearest a chunk's end (the most key
// tiles) first; the steps of ssd_fused_output_host with the MMAs on a device.
template <int kN, int kP>
__global__ void __launch_bounds__(fused::kThreads) ssd_fused_output_kernel(const SsdFusedArgs a) {
  using namespace fused;
  using Lay = SsdFusedSmem<kN, kP>;
  extern __shared__ __align__(16) uint16_t sm[];
  float* const f = reinterpret_cast<float*>(reinterpret_cast<unsigned char*>(sm) + Lay::f_at);
  const int tid = static_cast<int>(threadIdx.x), warp = tid / 32, lane = tid % 32;
  const SsdFusedCta c = ssd_fused_cta(a.d, gridDim.x - 1 - blockIdx.x, blockIdx.y, blockIdx.z);
  if (c.r0 >= c.len) return;  // a short chunk's tile past its rows (the whole CTA)
  float s[kNt][4], yd[kNt][4], off[kNt][4];
  EXMY_MMA_UNROLL
  for (int nt = 0; nt < kNt; ++nt)
    EXMY_MMA_UNROLL
    for (int e = 0; e < 4; ++e) yd[nt][e] = 0.0f, off[nt][e] = 0.0f;
  ssd_fused_stage_rows<kN, kP>(tid, a, c, sm, f);
  __syncthreads();
  fused_rows_product<kN, kP, kPPieces>(sm + Lay::c_at, sm + Lay::u_at, Lay::rows, Lay::ld, warp * 16, lane, off);
  for (int64_t s0 = 0; s0 <= c.r0; s0 += kKeys) {
    __syncthreads();  // the state's (then the previous tile's) fragments read
    ssd_fused_stage_keys<kN, kP>(tid, a, c, s0, sm, f);
    __syncthreads();
    EXMY_MMA_UNROLL
    for (int nt = 0; nt < kNt; ++nt)
      EXMY_MMA_UNROLL
      for (int e = 0; e < 4; ++e) s[nt][e] = 0.0f;
    fused_rows_product<kN, kP, kP>(sm + Lay::c_at, sm + Lay::u_at, Lay::rows, Lay::ld, warp * 16, lane, s);
    ssd_fused_weigh<kN, kP>(s, f, warp, lane, c.r0, s0, c.len);
    fused_regs_product<kSsdFusedHead, kP>(s, sm + Lay::x_at, Lay::x_rows, Lay::ldx, lane, yd);
  }
  ssd_fused_store<kN, kP>(yd, off, f, a, c, warp, lane);
}

template <int kN, int kP>
void launch_ssd_fused_output(const SsdFusedArgs& a) {
  const dim3 grid(static_cast<unsigned>(ssd_fused_row_tiles(a.d)), static_cast<unsigned>(a.d.heads),
                  static_cast<unsigned>(a.d.batch * a.d.chunks()));
  launch_fused(ssd_fused_output_kernel<kN, kP>, "ssd_fused_output", SsdFusedSmem<kN, kP>::bytes, grid, a);
}

// The chunk outputs' model FLOPs (models/mamba2.cpp's count, less the end
// states' 2 P N a token and head): per token and head 2 L N / (heads per
// group) + 2 L P + 2 P N.
double ssd_fused_output_flops(const SsdDims& d) {
  const double L = static_cast<double>(d.chunk), P = static_cast<double>(d.head_dim),
               N = static_cast<double>(d.state), hpg = static_cast<double>(d.heads / d.groups);
  return static_cast<double>(d.batch * d.seqlen * d.heads) * (2 * L * N / hpg + 2 * L * P + 2 * P * N);
}

// The fused kernel's launch, SsdFusedOutput's runner (a type at namespace
// scope: nvcc takes no function-local type as a template argument of a
// function with extended lambdas).
struct FusedOutputLaunch {
  void operator()(const SsdFusedArgs& a) const {
    {
      DeviceProfileScope timed("ssd_fused_output", ssd_fused_output_flops(a.d));
      ssd_fused_dispatch(a.d, [&]<int kN, int kP>() { launch_ssd_fused_output<kN, kP>(a); });
    }
    fused_sync("ssd_fused_output");
  }
};

}  // namespace

void ssd_fused_forward_cuda(float* y, float* acs, float* states, const float* x, int64_t ldx, const float* Bm,
                            const float* Cm, int64_t ldbc, const float* dt, const float* A_log, const float* D,
                            const SsdDims& d, float* scratch) {
  ssd_fused_require(d, "ssd_fused_forward");
  if (d.heads > 65535 || d.batch * d.chunks() > 65535)
    throw Error("ssd_fused_forward: the shape exceeds the kernel's grid");
  ssd_blocks_forward_launches(sim::DeviceLaunch{}, sim::DeviceBatchedGemm{}, y, acs, states, x, ldx, Bm, Cm, ldbc, dt,
                              A_log, D, d, scratch, kSsdSlabFloats, SsdFusedOutput<FusedOutputLaunch>{});
}

}  // namespace exmy::models

#define EXMY_LAUNCHER sim::DeviceLaunch
#define EXMY_SUFFIX cuda
#include "models/cuda/ssd_define.hpp"

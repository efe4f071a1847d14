// The chunked SSD scan on a CUDA device: the block launches of
// models/ssd_blocks.hpp (DeviceLaunch, the products as cuBLASLt's strided
// batches, FP32 or on bfloat16 pieces through SplitGemm), the forward with
// the chunks' outputs as the fused kernel of models/ssd_fused.hpp, the
// backward with the diagonal blocks as the fused kernels of
// models/ssd_fused_bwd.hpp, and the thread launches of
// models/ssd_launches.hpp with sim::DeviceLaunch (the launch shape only;
// the arithmetic is models/ssd_threads.hpp, which the host emulation runs
// too).
#include "models/cuda/fused_mma.cuh"
#include "models/cuda/ssd_cuda.hpp"
#include "models/ssd_fused.hpp"
#include "models/ssd_fused_bwd.hpp"
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
  fused_zero(yd);
  fused_zero(off);
  ssd_fused_stage_rows<kN, kP>(tid, a, c, sm, f);
  __syncthreads();
  fused_rows_product<kN, kP, kPPieces>(sm + Lay::c_at, sm + Lay::u_at, Lay::rows, Lay::ld, warp * 16, lane, off);
  for (int64_t s0 = 0; s0 <= c.r0; s0 += kKeys) {
    __syncthreads();  // the state's (then the previous tile's) fragments read
    ssd_fused_stage_keys<kN, kP>(tid, a, c, s0, sm, f);
    __syncthreads();
    fused_zero(s);
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

// The diagonal kernels (models/ssd_fused_bwd.hpp): a CTA per (64 rows or
// columns of a chunk, group, chunk of the slab), the tiles with the most
// work first; the steps of ssd_diag_rows_host and ssd_diag_cols_host with
// the MMAs and the quads' shuffles on the device.
__device__ __forceinline__ void ssd_diag_quad(float (&part)[2]) {
  EXMY_MMA_UNROLL
  for (int step = 1; step <= 2; step *= 2)
    EXMY_MMA_UNROLL
    for (int row = 0; row < 2; ++row) part[row] += __shfl_xor_sync(0xffffffffu, part[row], step);
}

template <int kN, int kP>
__global__ void __launch_bounds__(fused::kThreads) ssd_diag_rows_kernel(const SsdDiagonalSlab<float> a) {
  using namespace fused;
  using Lay = SsdDiagSmem<kN, kP>;
  extern __shared__ __align__(16) uint16_t sm[];
  float* const f = reinterpret_cast<float*>(reinterpret_cast<unsigned char*>(sm) + Lay::f_at);
  const int tid = static_cast<int>(threadIdx.x), warp = tid / 32, lane = tid % 32;
  const SsdDiagCta c = ssd_diag_cta(a, gridDim.x - 1 - blockIdx.x, blockIdx.y, blockIdx.z);
  if (c.r0 >= c.len) return;  // a short chunk's tile past its rows (the whole CTA)
  const int64_t H = a.d.heads, hpg = H / a.d.groups;
  float s[kNt][4], dm[kNt][4], acc[kN / 8][4], part[2];
  fused_zero(acc);
  ssd_diag_stage_bc<kN, kP, kThreads>(tid, a, c, a.Cm, c.r0, sm + Lay::own_at);
  for (int64_t h = c.g * hpg; h < (c.g + 1) * hpg; ++h) {
    __syncthreads();  // the previous head's reads of dy and acs done
    ssd_diag_stage_dy<kN, kP, kThreads>(tid, a, c, h, c.r0, sm + Lay::own_h_at);
    ssd_diag_stage_acs<kThreads>(tid, a, c, h, c.r0, f + Lay::acs_own);
    part[0] = part[1] = 0.0f;
    for (int64_t s0 = 0; s0 <= c.r0; s0 += kKeys) {
      __syncthreads();  // the previous tile's fragments read
      ssd_diag_stage_bc<kN, kP, kThreads>(tid, a, c, a.Bm, s0, sm + Lay::other_at);
      ssd_diag_stage_xdt<kN, kP, kThreads>(tid, a, c, h, s0, sm + Lay::other_h_at);
      ssd_diag_stage_acs<kThreads>(tid, a, c, h, s0, f + Lay::acs_other);
      __syncthreads();
      fused_zero(s);
      fused_zero(dm);
      fused_rows_product<kN, kP, kP>(sm + Lay::own_at, sm + Lay::other_at, Lay::rows, Lay::ld, warp * 16, lane, s);
      fused_rows_product<kSsdFusedHead, kPPieces, kPPieces>(sm + Lay::own_h_at, sm + Lay::other_h_at, Lay::hrows,
                                                            Lay::ldh, warp * 16, lane, dm);
      ssd_diag_step<false, true>(s, dm, part, f + Lay::acs_own, f + Lay::acs_other, warp, lane, c.r0, s0, c.len);
      fused_regs_product<kN, kP>(dm, sm + Lay::other_at, Lay::rows, Lay::ld, lane, acc);
    }
    ssd_diag_quad(part);
    ssd_diag_store_sums(part, a.rows + (c.cl * H + h) * a.L1, c.r0, c.len, warp, lane);
  }
  ssd_diag_store<kN>(acc, a.dCg + (c.cl * a.d.groups + c.g) * a.LN, a.d.state, c.r0, c.len, a.d.state, warp, lane);
}

// Warps 0-3 sum dXDT in the first 64 columns' share of acc (zeroed per
// head), warps 4-7 dBg in all of it.
template <int kN, int kP>
__global__ void __launch_bounds__(fused::kKvThreads) ssd_diag_cols_kernel(const SsdDiagonalSlab<float> a) {
  using namespace fused;
  using Lay = SsdDiagSmem<kN, kP>;
  extern __shared__ __align__(16) uint16_t sm[];
  float* const f = reinterpret_cast<float*>(reinterpret_cast<unsigned char*>(sm) + Lay::f_at);
  const int tid = static_cast<int>(threadIdx.x), warp = tid / 32, lane = tid % 32, w4 = warp % 4;
  const SsdDiagCta c = ssd_diag_cta(a, blockIdx.x, blockIdx.y, blockIdx.z);
  if (c.r0 >= c.len) return;
  const int64_t H = a.d.heads, hpg = H / a.d.groups, P = a.d.head_dim;
  float s[kNt][4], dm[kNt][4], acc[kN / 8][4], part[2];
  auto& accx = reinterpret_cast<float (&)[kSsdFusedHead / 8][4]>(acc);
  fused_zero(acc);
  ssd_diag_stage_bc<kN, kP, kKvThreads>(tid, a, c, a.Bm, c.r0, sm + Lay::own_at);
  for (int64_t h = c.g * hpg; h < (c.g + 1) * hpg; ++h) {
    __syncthreads();  // the previous head's reads of dt x and acs done
    ssd_diag_stage_xdt<kN, kP, kKvThreads>(tid, a, c, h, c.r0, sm + Lay::own_h_at);
    ssd_diag_stage_acs<kKvThreads>(tid, a, c, h, c.r0, f + Lay::acs_own);
    part[0] = part[1] = 0.0f;
    if (warp < 4) fused_zero(accx);
    for (int64_t t0 = c.r0; t0 < c.len; t0 += kRows) {
      __syncthreads();  // the previous tile's fragments read
      ssd_diag_stage_bc<kN, kP, kKvThreads>(tid, a, c, a.Cm, t0, sm + Lay::other_at);
      ssd_diag_stage_dy<kN, kP, kKvThreads>(tid, a, c, h, t0, sm + Lay::other_h_at);
      ssd_diag_stage_acs<kKvThreads>(tid, a, c, h, t0, f + Lay::acs_other);
      __syncthreads();
      fused_zero(s);
      fused_zero(dm);
      fused_rows_product<kN, kP, kP>(sm + Lay::own_at, sm + Lay::other_at, Lay::rows, Lay::ld, w4 * 16, lane, s);
      if (warp < 4) {  // dXDT += M^T dy
        ssd_diag_step<true, false>(s, dm, part, f + Lay::acs_own, f + Lay::acs_other, w4, lane, c.r0, t0, c.len);
        fused_regs_product<kSsdFusedHead, kPPieces>(s, sm + Lay::other_h_at, Lay::hrows, Lay::ldh, lane, accx);
      } else {  // the column sums, dBg += dS^T C
        fused_rows_product<kSsdFusedHead, kPPieces, kPPieces>(sm + Lay::own_h_at, sm + Lay::other_h_at, Lay::hrows,
                                                              Lay::ldh, w4 * 16, lane, dm);
        ssd_diag_step<true, true>(s, dm, part, f + Lay::acs_own, f + Lay::acs_other, w4, lane, c.r0, t0, c.len);
        fused_regs_product<kN, kP>(dm, sm + Lay::other_at, Lay::rows, Lay::ld, lane, acc);
      }
    }
    const int64_t el = c.cl * H + h;
    if (warp < 4) {
      ssd_diag_store<kSsdFusedHead>(accx, a.dXDT + el * a.LP, P, c.r0, c.len, P, warp, lane);
    } else {
      ssd_diag_quad(part);
      ssd_diag_store_sums(part, a.cols + el * a.L1, c.r0, c.len, w4, lane);
    }
  }
  if (warp >= 4)
    ssd_diag_store<kN>(acc, a.dBg + (c.cl * a.d.groups + c.g) * a.LN, a.d.state, c.r0, c.len, a.d.state, w4, lane);
}

// The diagonal blocks' model FLOPs on a slab: per token and head, over the
// keys s <= t (L / 2 on average), dM and M^T dy (2 P each); per token and
// group, S, dCB B and dCB^T C (2 N each).
double ssd_fused_diagonal_flops(const SsdDiagonalSlab<float>& a) {
  const SsdDims& d = a.d;
  const double tokens = static_cast<double>(a.count * d.chunk), half = static_cast<double>(d.chunk) / 2;
  return tokens * half *
         (static_cast<double>(d.heads) * 4 * static_cast<double>(d.head_dim) +
          static_cast<double>(d.groups) * 6 * static_cast<double>(d.state));
}

// Both kernels' launches on a slab, SsdFusedDiagonal's runner.
struct FusedDiagonalLaunch {
  void operator()(const SsdDiagonalSlab<float>& a) const {
    const dim3 grid(static_cast<unsigned>(ssd_diag_tiles(a.d)), static_cast<unsigned>(a.d.groups),
                    static_cast<unsigned>(a.count));
    {
      DeviceProfileScope timed("ssd_fused_diagonal", ssd_fused_diagonal_flops(a));
      ssd_fused_dispatch(a.d, [&]<int kN, int kP>() {
        launch_fused(ssd_diag_rows_kernel<kN, kP>, "ssd_fused_diagonal rows", SsdDiagSmem<kN, kP>::bytes, grid, a);
        fused_sync("ssd_fused_diagonal rows");
        launch_fused(ssd_diag_cols_kernel<kN, kP>, "ssd_fused_diagonal cols", SsdDiagSmem<kN, kP>::bytes, grid, a,
                     fused::kKvThreads);
      });
    }
    fused_sync("ssd_fused_diagonal cols");
  }
};

void ssd_fused_backward_require(const SsdDims& d) {
  ssd_fused_require(d, "ssd_fused_backward");
  if (d.groups > 65535 || d.batch * d.chunks() > 65535)
    throw Error("ssd_fused_backward: the shape exceeds the kernels' grid");
}

}  // namespace

void ssd_fused_backward_cuda(float* dx, float* dB, float* dC, float* ddt, float* dA_log, float* dD, const float* dy,
                             const float* x, int64_t ldx, const float* Bm, const float* Cm, int64_t ldbc,
                             const float* dt, const float* A_log, const float* D, const float* acs,
                             const float* states, const SsdDims& d, float* scratch) {
  ssd_fused_backward_require(d);
  ssd_blocks_backward_launches(sim::DeviceLaunch{}, sim::DeviceBatchedGemm{}, dx, dB, dC, ddt, dA_log, dD, dy, x, ldx,
                               Bm, Cm, ldbc, dt, A_log, D, acs, states, d, scratch, kSsdSlabFloats,
                               SsdFusedDiagonal<FusedDiagonalLaunch>{});
}
void ssd_fused_pieces_backward_cuda(float* dx, float* dB, float* dC, float* ddt, float* dA_log, float* dD,
                                    const float* dy, const float* x, int64_t ldx, const float* Bm, const float* Cm,
                                    int64_t ldbc, const float* dt, const float* A_log, const float* D,
                                    const float* acs, const float* states, const SsdDims& d, float* scratch) {
  ssd_fused_backward_require(d);
  ssd_blocks_backward_launches(sim::DeviceLaunch{}, SplitGemm<sim::DeviceLaunch, sim::DeviceBatchedGemm>{}, dx, dB,
                               dC, ddt, dA_log, dD, dy, x, ldx, Bm, Cm, ldbc, dt, A_log, D, acs, states, d, scratch,
                               kSsdSlabFloats, SsdFusedDiagonal<FusedDiagonalLaunch>{});
}

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

// The chunked SSD scan's backward (models/ssd.hpp) with each chunk's
// diagonal block as two fused kernels on the BF16 tensor cores: what the
// block launches (models/ssd_blocks.hpp, section (d)) form as chunk x chunk
// arrays in memory (CB = C B^T, M = CB L with L = exp(acs_t - acs_s) for s
// <= t, dM = dy (dt x)^T, dCB = the sum over the group's heads of dM L) and
// five batched products over them stays in a CTA's registers and shared
// memory, as the attention backward's (models/attention_fused.hpp), whose
// staging, MMA chains and fragments these use. Everything else in the
// backward is the block launches' own (ssd_blocks_backward_launches with a
// diagonal functor): these kernels add into the slab's dXDT, dCg and dBg and
// write dacs's two diagonal sums, from which one launch finishes dacs.
//
// rows  a CTA per (64 rows t of a chunk, group, chunk of the slab), 4 warps
//       of 16 rows. C's rows once; per head of the group in order, dy's rows
//       and per key tile [s0, s0 + 64) up to the diagonal B's rows and dt x
//       (staged as dt_s x_s): S = C B^T, dM = dy (dt x)^T; each element for
//       s <= t < len: l = exp(acs_t - acs_s), the row's sum += dM (S l)
//       where s < t, dS = dM l; then dCg += dS B (dS in three pieces, B's
//       from shared memory along its rows). At each head's end the row sums
//       (over each quad of lanes) into rows; at the end dCg += the sum.
// cols  a CTA per (64 columns s, group, chunk), 8 warps: warps w and w + 4
//       on columns 16 w.. B's rows once; per head, dt x's rows and per tile
//       [t0, t0 + 64) from the CTA's own on to the chunk's end C's and dy's
//       rows: both warps form S^T = B C^T and, for s <= t < len, M^T = S^T
//       l; the first adds dXDT += M^T dy (over the head: dXDT += it at the
//       head's end); the second forms dM^T = (dt x) dy^T, the column's sum
//       += dM M where t > s, dS^T = dM^T l, and adds dBg += dS^T C; at each
//       head's end the column sums into cols, at the end dBg += the sum.
// Zeros stand for rows past the chunk and columns past N and P. No atomics:
// every output is one thread's, its sums in a fixed order.
//
// Bits: not the CPU's (the products are on pieces summed by the tensor
// cores, dCB is never formed: each head's dS goes into dCg and dBg, and
// dacs's diagonal terms are summed as two sums). tests/models/
// test_ssd_cuda.cpp holds the emulation and a device to the CPU within the
// sum of both algorithms' bounds, this one's from a RunErr run of the same
// steps.
#pragma once

#include <cstdint>
#include <vector>

#include "models/attention_fused.hpp"
#include "models/ssd.hpp"
#include "models/ssd_blocks.hpp"  // SsdDiagonalSlab
#include "models/ssd_fused.hpp"   // kSsdFusedHead, ssd_fused_state, ssd_fused_pieces
#include "models/ssd_items.hpp"   // ssd_chunk_of
#include "sim/hd_math.hpp"

namespace exmy::models {

// A CTA's shared memory, in uint16 elements: `own`, its 64 rows of C (rows
// kernel) or B (cols), of kN + 8, in kP pieces; `other`, a tile's rows of
// B (rows) or C (cols), the same; `own_h`, its rows of dy (rows) or dt x
// (cols), of kSsdFusedHead + 8, in three pieces; `other_h`, a tile's rows
// of dt x (rows) or dy (cols); then, from byte f_at, floats: acs of its own
// rows and of the tile's (64 each).
template <int kN, int kP>
struct SsdDiagSmem {
  static constexpr int ld = kN + 8, rows = fused::kRows * ld;
  static constexpr int ldh = kSsdFusedHead + 8, hrows = fused::kRows * ldh;
  static constexpr int own_at = 0, other_at = kP * rows, own_h_at = 2 * kP * rows,
                       other_h_at = own_h_at + fused::kPPieces * hrows, elems = other_h_at + fused::kPPieces * hrows;
  static constexpr int f_at = (elems * 2 + 15) / 16 * 16;
  static constexpr int acs_own = 0, acs_other = fused::kRows, floats = 2 * fused::kRows;
  static constexpr size_t bytes = static_cast<size_t>(f_at) + floats * sizeof(float);
};

// A CTA's place: its 64 rows [r0, r0 + 64) of chunk c0 + cl (batch row b,
// tokens [t0, t0 + len)), group g; tile, g, cl its grid coordinates.
struct SsdDiagCta {
  int64_t b, t0, len, g, cl, r0;
};
EXMY_HD SsdDiagCta ssd_diag_cta(const SsdDiagonalSlab<float>& a, int64_t tile, int64_t g, int64_t cl) {
  const int64_t bq = a.c0 + cl;
  const SsdChunk c = ssd_chunk_of(a.d, bq / a.d.chunks(), bq % a.d.chunks());
  return {c.b, c.t0, c.len, g, cl, tile * fused::kRows};
}

// Staging (thread tid of kThreadsOf): 64 rows from row0 of the chunk of C
// or B (src: a.Cm or a.Bm) of the CTA's group; of dy of head h; of dt x of
// head h (each element dt_t x_t, the block launches' XDT); and acs of head
// h for 64 rows from row0, at f[at].
template <int kN, int kP, int kThreadsOf>
EXMY_HD void ssd_diag_stage_bc(int tid, const SsdDiagonalSlab<float>& a, const SsdDiagCta& c, const float* src,
                               int64_t row0, uint16_t* out) {
  using Lay = SsdDiagSmem<kN, kP>;
  const int64_t N = a.d.state;
  fused_stage<kN, kP, kThreadsOf>(tid, src + (c.b * a.d.seqlen + c.t0) * a.ldbc + c.g * N, a.ldbc, row0, c.len, N,
                                  fused::kRows, out, Lay::ld, 1, Lay::rows);
}
template <int kN, int kP, int kThreadsOf>
EXMY_HD void ssd_diag_stage_dy(int tid, const SsdDiagonalSlab<float>& a, const SsdDiagCta& c, int64_t h, int64_t row0,
                               uint16_t* out) {
  using Lay = SsdDiagSmem<kN, kP>;
  const int64_t P = a.d.head_dim, ldy = a.d.heads * P;
  fused_stage<kSsdFusedHead, fused::kPPieces, kThreadsOf>(tid, a.dy + (c.b * a.d.seqlen + c.t0) * ldy + h * P, ldy,
                                                          row0, c.len, P, fused::kRows, out, Lay::ldh, 1, Lay::hrows);
}
template <int kN, int kP, int kThreadsOf>
EXMY_HD void ssd_diag_stage_xdt(int tid, const SsdDiagonalSlab<float>& a, const SsdDiagCta& c, int64_t h,
                                int64_t row0, uint16_t* out) {
  using Lay = SsdDiagSmem<kN, kP>;
  const int64_t P = a.d.head_dim, H = a.d.heads;
  for (int u = tid; u < fused::kRows * kSsdFusedHead; u += kThreadsOf) {
    const int r = u / kSsdFusedHead, p = u % kSsdFusedHead;
    const int64_t t = row0 + r, row = c.b * a.d.seqlen + c.t0 + t;
    const float v = t < c.len && p < P ? a.dt[row * H + h] * a.x[row * a.ldx + h * P + p] : 0.0f;
    bf16_pieces(v, fused::kPPieces, out + r * Lay::ldh + p, Lay::hrows);
  }
}
template <int kThreadsOf>
EXMY_HD void ssd_diag_stage_acs(int tid, const SsdDiagonalSlab<float>& a, const SsdDiagCta& c, int64_t h,
                                int64_t row0, float* f) {
  const float* const ac = a.acs + (c.b * a.d.heads + h) * a.d.seqlen + c.t0;
  for (int u = tid; u < fused::kRows; u += kThreadsOf) f[u] = row0 + u < c.len ? ac[row0 + u] : 0.0f;
}

// The element step on a warp's tile (its rows from r0 + 16 warp, the
// tile's columns from c0): s holds S (C_t . B_s), with kDm dm holds dM
// (dy_t . dt_s x_s); kT: the rows are s and the columns t (the cols
// kernel), else the other way. For s <= t < len: l = exp(acs_t - acs_s),
// s becomes m = S l and, with kDm, part[row] += dM m where s < t and dm
// becomes dM l; elsewhere both +0. f_own, f_other: acs of the rows and of
// the columns.
template <bool kT, bool kDm>
EXMY_HD void ssd_diag_step(float (&s)[fused::kNt][4], float (&dm)[fused::kNt][4], float (&part)[2],
                           const float* f_own, const float* f_other, int warp, int lane, int64_t r0, int64_t c0,
                           int64_t len) {
  const int g = lane >> 2, tq = lane & 3;
  EXMY_MMA_UNROLL
  for (int nt = 0; nt < fused::kNt; ++nt)
    EXMY_MMA_UNROLL
    for (int e = 0; e < 4; ++e) {
      const int row = warp * 16 + g + 8 * (e >> 1), col = nt * 8 + 2 * tq + (e & 1);
      const int64_t t = kT ? c0 + col : r0 + row, si = kT ? r0 + row : c0 + col;
      if (si <= t && t < len) {
        const float l = sim::hd_exp(kT ? f_other[col] - f_own[row] : f_own[row] - f_other[col]);
        const float m = s[nt][e] * l;
        if constexpr (kDm) {
          if (si < t) part[e >> 1] += dm[nt][e] * m;
          dm[nt][e] = dm[nt][e] * l;
        }
        s[nt][e] = m;
      } else {
        s[nt][e] = 0.0f;
        if constexpr (kDm) dm[nt][e] = 0.0f;
      }
    }
}

// acc (the rows from r0 + 16 warp inside the chunk, kW columns below
// `cols`) added into out + row ld.
template <int kW>
EXMY_HD void ssd_diag_store(const float (&acc)[kW / 8][4], float* out, int64_t ld, int64_t r0, int64_t len,
                            int64_t cols, int warp, int lane) {
  const int g = lane >> 2, tq = lane & 3;
  EXMY_MMA_UNROLL
  for (int row = 0; row < 2; ++row) {
    const int64_t r = r0 + warp * 16 + g + 8 * row;
    if (r >= len) continue;
    EXMY_MMA_UNROLL
    for (int nt = 0; nt < kW / 8; ++nt)
      EXMY_MMA_UNROLL
      for (int e = 0; e < 2; ++e) {
        const int64_t col = nt * 8 + 2 * tq + e;
        if (col < cols) out[r * ld + col] += acc[nt][2 * row + e];
      }
  }
}
// A quad's summed parts (lane 0 of the quad's) into sums (rows from r0 +
// 16 warp inside the chunk).
EXMY_HD void ssd_diag_store_sums(const float (&part)[2], float* sums, int64_t r0, int64_t len, int warp, int lane) {
  if ((lane & 3) != 0) return;
  for (int row = 0; row < 2; ++row) {
    const int64_t r = r0 + warp * 16 + (lane >> 2) + 8 * row;
    if (r < len) sums[r] = part[row];
  }
}

// The grid of either kernel over a slab: (row tiles, groups, chunks).
EXMY_HD int64_t ssd_diag_tiles(const SsdDims& d) { return (d.chunk + fused::kRows - 1) / fused::kRows; }

// ---------------------------------------------------------------------------
// The host emulations: the CTAs one after another, their warps and lanes in
// turn, in the kernels' order of stages, MMAs and steps. They leave out
// what cannot change a stored output (models/attention_fused.hpp's limits
// of the host chains): a warp whose 16 rows all lie past the chunk (it
// stores nothing), the rows products' k-steps past the state or the head
// (both operands staged as zeros), and the n-tiles of a sum past N or P
// (never stored).
// ---------------------------------------------------------------------------

template <int kN>
struct SsdDiagRegs {
  float s[fused::kNt][4], dm[fused::kNt][4], acc[kN / 8][4], part[2];
  float accx[kSsdFusedHead / 8][4];  // the cols kernel's dXDT warps (the device's share acc)
};

// f(cta) for a slab's CTAs with rows, in grid order (chunk, group, tile).
template <class F>
void ssd_diag_for_ctas_host(const SsdDiagonalSlab<float>& a, F&& f) {
  for (int64_t cl = 0; cl < a.count; ++cl)
    for (int64_t g = 0; g < a.d.groups; ++g)
      for (int64_t tile = 0; tile < ssd_diag_tiles(a.d); ++tile) {
        const SsdDiagCta c = ssd_diag_cta(a, tile, g, cl);
        if (c.r0 < c.len) f(c);
      }
}

template <int kN>
void ssd_diag_quad_host(SsdDiagRegs<kN>* W) {
  float v[32][2];
  for (int lane = 0; lane < 32; ++lane) v[lane][0] = W[lane].part[0], v[lane][1] = W[lane].part[1];
  fused_quad_host(v, [](float x, float y) { return x + y; });
  for (int lane = 0; lane < 32; ++lane) W[lane].part[0] = v[lane][0], W[lane].part[1] = v[lane][1];
}

template <int kN, int kP>
void ssd_diag_rows_host(const SsdDiagonalSlab<float>& a) {
  using namespace fused;
  using Lay = SsdDiagSmem<kN, kP>;
  const SsdDims& d = a.d;
  const int64_t G = d.groups, H = d.heads, hpg = H / G;
  const int N = static_cast<int>(d.state), P = static_cast<int>(d.head_dim);
  std::vector<uint16_t> sm(Lay::elems);
  std::vector<float> f(Lay::floats);
  std::vector<SsdDiagRegs<kN>> regs(kThreads);
  ssd_diag_for_ctas_host(a, [&](const SsdDiagCta& c) {
    const int64_t cl = c.cl, g = c.g;
    for (int tid = 0; tid < kThreads; ++tid)
      ssd_diag_stage_bc<kN, kP, kThreads>(tid, a, c, a.Cm, c.r0, sm.data() + Lay::own_at);
    for (auto& R : regs) fused_zero(R.acc);
    for (int64_t h = g * hpg; h < (g + 1) * hpg; ++h) {
      for (int tid = 0; tid < kThreads; ++tid) {
        ssd_diag_stage_dy<kN, kP, kThreads>(tid, a, c, h, c.r0, sm.data() + Lay::own_h_at);
        ssd_diag_stage_acs<kThreads>(tid, a, c, h, c.r0, f.data() + Lay::acs_own);
      }
      for (auto& R : regs) R.part[0] = R.part[1] = 0.0f;
      for (int64_t s0 = 0; s0 <= c.r0; s0 += kKeys) {
        for (int tid = 0; tid < kThreads; ++tid) {
          ssd_diag_stage_bc<kN, kP, kThreads>(tid, a, c, a.Bm, s0, sm.data() + Lay::other_at);
          ssd_diag_stage_xdt<kN, kP, kThreads>(tid, a, c, h, s0, sm.data() + Lay::other_h_at);
          ssd_diag_stage_acs<kThreads>(tid, a, c, h, s0, f.data() + Lay::acs_other);
        }
        for (int warp = 0; warp < kThreads / 32 && c.r0 + warp * 16 < c.len; ++warp) {
          SsdDiagRegs<kN>* const W = regs.data() + warp * 32;
          fused_rows_chain_host<kN, kP, kP>(sm.data() + Lay::own_at, sm.data() + Lay::other_at, Lay::rows, Lay::ld,
                                            warp * 16, [&](int lane) -> auto& { return W[lane].s; }, N);
          fused_rows_chain_host<kSsdFusedHead, kPPieces, kPPieces>(
              sm.data() + Lay::own_h_at, sm.data() + Lay::other_h_at, Lay::hrows, Lay::ldh, warp * 16,
              [&](int lane) -> auto& { return W[lane].dm; }, P);
          for (int lane = 0; lane < 32; ++lane)
            ssd_diag_step<false, true>(W[lane].s, W[lane].dm, W[lane].part, f.data() + Lay::acs_own,
                                       f.data() + Lay::acs_other, warp, lane, c.r0, s0, c.len);
          fused_regs_chain_host<kN, kP>([&](int lane) -> auto& { return W[lane].dm; }, sm.data() + Lay::other_at,
                                        Lay::rows, Lay::ld, [&](int lane) -> auto& { return W[lane].acc; }, N);
        }
      }
      const int64_t el = cl * H + h;
      for (int warp = 0; warp < kThreads / 32; ++warp) {
        ssd_diag_quad_host(regs.data() + warp * 32);
        for (int lane = 0; lane < 32; ++lane)
          ssd_diag_store_sums(regs[warp * 32 + lane].part, a.rows + el * a.L1, c.r0, c.len, warp, lane);
      }
    }
    for (int tid = 0; tid < kThreads; ++tid)
      ssd_diag_store<kN>(regs[tid].acc, a.dCg + (cl * G + g) * a.LN, d.state, c.r0, c.len, d.state, tid / 32,
                         tid % 32);
  });
}

template <int kN, int kP>
void ssd_diag_cols_host(const SsdDiagonalSlab<float>& a) {
  using namespace fused;
  using Lay = SsdDiagSmem<kN, kP>;
  const SsdDims& d = a.d;
  const int64_t G = d.groups, H = d.heads, hpg = H / G;
  const int N = static_cast<int>(d.state), P = static_cast<int>(d.head_dim);
  std::vector<uint16_t> sm(Lay::elems);
  std::vector<float> f(Lay::floats);
  std::vector<SsdDiagRegs<kN>> regs(kKvThreads);
  ssd_diag_for_ctas_host(a, [&](const SsdDiagCta& c) {
    const int64_t cl = c.cl, g = c.g;
    for (int tid = 0; tid < kKvThreads; ++tid)
      ssd_diag_stage_bc<kN, kP, kKvThreads>(tid, a, c, a.Bm, c.r0, sm.data() + Lay::own_at);
    for (auto& R : regs) fused_zero(R.acc);
    for (int64_t h = g * hpg; h < (g + 1) * hpg; ++h) {
      for (int tid = 0; tid < kKvThreads; ++tid) {
        ssd_diag_stage_xdt<kN, kP, kKvThreads>(tid, a, c, h, c.r0, sm.data() + Lay::own_h_at);
        ssd_diag_stage_acs<kKvThreads>(tid, a, c, h, c.r0, f.data() + Lay::acs_own);
      }
      for (auto& R : regs) {
        R.part[0] = R.part[1] = 0.0f;
        fused_zero(R.accx);
      }
      for (int64_t t0 = c.r0; t0 < c.len; t0 += kRows) {
        for (int tid = 0; tid < kKvThreads; ++tid) {
          ssd_diag_stage_bc<kN, kP, kKvThreads>(tid, a, c, a.Cm, t0, sm.data() + Lay::other_at);
          ssd_diag_stage_dy<kN, kP, kKvThreads>(tid, a, c, h, t0, sm.data() + Lay::other_h_at);
          ssd_diag_stage_acs<kKvThreads>(tid, a, c, h, t0, f.data() + Lay::acs_other);
        }
        for (int warp = 0; warp < kKvThreads / 32; ++warp) {
          SsdDiagRegs<kN>* const W = regs.data() + warp * 32;
          const int w4 = warp % 4;
          if (c.r0 + w4 * 16 >= c.len) continue;
          fused_rows_chain_host<kN, kP, kP>(sm.data() + Lay::own_at, sm.data() + Lay::other_at, Lay::rows, Lay::ld,
                                            w4 * 16, [&](int lane) -> auto& { return W[lane].s; }, N);
          if (warp < 4) {  // dXDT += M^T dy
            for (int lane = 0; lane < 32; ++lane)
              ssd_diag_step<true, false>(W[lane].s, W[lane].dm, W[lane].part, f.data() + Lay::acs_own,
                                         f.data() + Lay::acs_other, w4, lane, c.r0, t0, c.len);
            fused_regs_chain_host<kSsdFusedHead, kPPieces>(
                [&](int lane) -> auto& { return W[lane].s; }, sm.data() + Lay::other_h_at, Lay::hrows, Lay::ldh,
                [&](int lane) -> auto& { return W[lane].accx; }, P);
          } else {  // the column sums, dBg += dS^T C
            fused_rows_chain_host<kSsdFusedHead, kPPieces, kPPieces>(
                sm.data() + Lay::own_h_at, sm.data() + Lay::other_h_at, Lay::hrows, Lay::ldh, w4 * 16,
                [&](int lane) -> auto& { return W[lane].dm; }, P);
            for (int lane = 0; lane < 32; ++lane)
              ssd_diag_step<true, true>(W[lane].s, W[lane].dm, W[lane].part, f.data() + Lay::acs_own,
                                        f.data() + Lay::acs_other, w4, lane, c.r0, t0, c.len);
            fused_regs_chain_host<kN, kP>([&](int lane) -> auto& { return W[lane].dm; },
                                          sm.data() + Lay::other_at, Lay::rows, Lay::ld,
                                          [&](int lane) -> auto& { return W[lane].acc; }, N);
          }
        }
      }
      const int64_t el = cl * H + h;
      for (int warp = 0; warp < kKvThreads / 32; ++warp) {
        SsdDiagRegs<kN>* const W = regs.data() + warp * 32;
        if (warp < 4) {
          for (int lane = 0; lane < 32; ++lane)
            ssd_diag_store<kSsdFusedHead>(W[lane].accx, a.dXDT + el * a.LP, P, c.r0, c.len, P, warp, lane);
        } else {
          ssd_diag_quad_host(W);
          for (int lane = 0; lane < 32; ++lane)
            ssd_diag_store_sums(W[lane].part, a.cols + el * a.L1, c.r0, c.len, warp - 4, lane);
        }
      }
    }
    for (int tid = 4 * 32; tid < kKvThreads; ++tid)
      ssd_diag_store<kN>(regs[tid].acc, a.dBg + (cl * G + g) * a.LN, d.state, c.r0, c.len, d.state,
                         tid / 32 - 4, tid % 32);
  });
}

// The diagonal functor ssd_blocks_backward_launches takes, from a runner of
// both kernels on a slab (run(const SsdDiagonalSlab<float>&): the CUDA
// launches or the host emulations).
template <class Run>
struct SsdFusedDiagonal {
  Run run;
  void operator()(const SsdDiagonalSlab<float>& a) const { run(a); }
};
// The host emulations' runner: both kernels on a slab, in launch order.
struct SsdFusedDiagonalHost {
  void operator()(const SsdDiagonalSlab<float>& a) const {
    ssd_fused_dispatch(a.d, [&]<int kN, int kP>() {
      ssd_diag_rows_host<kN, kP>(a);
      ssd_diag_cols_host<kN, kP>(a);
    });
  }
};

}  // namespace exmy::models

// The chunked SSD scan's forward (models/ssd.hpp) with each chunk's output
// as one fused kernel on the BF16 tensor cores: what the block launches
// (models/ssd_blocks.hpp) form as four batched products and three element
// passes over chunk x chunk arrays (CB = C B^T, M = CB exp(acs_t - acs_s),
// Yd = M (dt x), off = C state^T, y) stays in a CTA's registers and shared
// memory. The launches before it are the block launches' own (acs and W,
// the chunks' end states as batched products, the state passing:
// ssd_blocks_forward_launches with an output functor), so acs and states
// are the block launches' bits; only y comes from here. The per-thread work
// is EXMY_HD code shared by the CUDA kernel (models/cuda/ssd.cu) and its
// host emulation (ssd_fused_output_host), as models/attention_fused.hpp's,
// whose staging, MMA chains and fragments it uses.
//
// A CTA per (64 rows of a chunk, head, batch x chunk): 4 warps of 16 rows.
//   1. C's rows of the tile (group g's, kN columns: the state padded to 64
//      or 128) as bfloat16 pieces (three, or one where x, B and C hold
//      bfloat16 values: SsdDims::xbc_bf16), the state entering the chunk
//      (head h's, P x N, padded to 64 rows) in three, and the rows' acs.
//   2. off = C state^T: pairs of pieces chained into each thread's FP32
//      accumulators over kN in steps of 16.
//   3. Per key tile [s0, s0 + 64) up to the diagonal: B's and x's rows of
//      the tile as pieces (the state's shared memory then holds B), their
//      acs and dt; S = C B^T; each element m = (S exp(acs_t - acs_s)) dt_s
//      where s <= t (else 0); Yd += m x (m as three pieces, made in
//      registers as MMA A fragments; x's from shared memory along its rows).
//   4. y = (Yd + exp(acs_t) off) + D x (rows and columns in the tensor).
// Zeros stand for rows past the chunk and columns past N and P.
//
// Bits: not the CPU's (dt folds into m rather than into x, and the products
// are on pieces summed by the tensor cores). tests/models/test_ssd_cuda.cpp
// holds the emulation and a device to the CPU within the sum of both
// algorithms' bounds, this one's from a RunErr run of the same steps.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "formats/error.hpp"
#include "models/attention_fused.hpp"  // fused_stage, fused_for_pairs, fused_p_frags, the host chains
#include "models/ssd.hpp"
#include "models/ssd_items.hpp"  // ssd_chunk_of
#include "sim/hd_math.hpp"

namespace exmy::models {

// The head width the kernel runs in (zeros past head_dim), and the state
// width (64 or 128), or 0 where the state is wider than it takes.
inline constexpr int kSsdFusedHead = 64;
EXMY_HD int ssd_fused_state(int64_t N) { return N <= 64 ? 64 : N <= 128 ? 128 : 0; }
inline bool ssd_fused_applies(const SsdDims& d) {
  return d.head_dim <= kSsdFusedHead && ssd_fused_state(d.state) != 0;
}
// One line naming `what` where the kernel does not apply (before any launch).
inline void ssd_fused_require(const SsdDims& d, const char* what) {
  if (!ssd_fused_applies(d))
    throw Error(std::string(what) + ": head_dim " + std::to_string(d.head_dim) + " and state " +
                std::to_string(d.state) + " exceed the fused kernel's 64 and 128");
}
// Pieces of x, B and C: one where they hold bfloat16 values.
inline int ssd_fused_pieces(const SsdDims& d) { return d.xbc_bf16 ? 1 : kBf16Pieces; }

// A CTA's shared memory, in uint16 elements: C's 64 rows (of kN + 8) in kP
// pieces; U, 64 rows of kN + 8 in three pieces (the state, then B's rows in
// kP); x's 64 rows (of kSsdFusedHead + 8) in kP; then, from byte f_at,
// floats: the rows' acs, the key tile's acs and dt (64 each).
template <int kN, int kP>
struct SsdFusedSmem {
  static constexpr int ld = kN + 8, rows = fused::kRows * ld;
  static constexpr int ldx = kSsdFusedHead + 8, x_rows = fused::kKeys * ldx;
  static constexpr int c_at = 0, u_at = kP * rows, x_at = u_at + fused::kPPieces * rows, elems = x_at + kP * x_rows;
  static constexpr int f_at = (elems * 2 + 15) / 16 * 16;
  static constexpr int acs_rows = 0, acs_keys = fused::kRows, dt_keys = acs_keys + fused::kKeys,
                       floats = dt_keys + fused::kKeys;
  static constexpr size_t bytes = static_cast<size_t>(f_at) + floats * sizeof(float);
};

struct SsdFusedArgs {
  float* y = nullptr;
  const float* acs = nullptr;     // (B,H,T), the chunks' cumulative sums of dt A
  const float* states = nullptr;  // (B,Q,H,P,N), the state entering each chunk
  const float* x = nullptr;
  int64_t ldx = 0;
  const float* Bm = nullptr;
  const float* Cm = nullptr;
  int64_t ldbc = 0;
  const float* dt = nullptr;
  const float* D = nullptr;
  SsdDims d;
};

// A CTA's place: batch row b, chunk (t0, len), head h of group g, its rows
// [r0, r0 + 64) of the chunk; e = (b Q + q) H + h, the chunk's state.
struct SsdFusedCta {
  int64_t b, t0, len, h, g, r0, e;
};
// CTA (tile, h, bq) (bq = b Q + q); the tiles of a chunk are ceil(chunk /
// 64), those past a short chunk's rows have nothing to do (len <= r0).
EXMY_HD SsdFusedCta ssd_fused_cta(const SsdDims& d, int64_t tile, int64_t h, int64_t bq) {
  const SsdChunk c = ssd_chunk_of(d, bq / d.chunks(), bq % d.chunks());
  return {c.b, c.t0, c.len, h, h / (d.heads / d.groups), tile * fused::kRows, bq * d.heads + h};
}
EXMY_HD int64_t ssd_fused_row_tiles(const SsdDims& d) { return (d.chunk + fused::kRows - 1) / fused::kRows; }

// Step 1 (thread tid's share of kThreads): C's rows, the state, the rows' acs.
template <int kN, int kP>
EXMY_HD void ssd_fused_stage_rows(int tid, const SsdFusedArgs& a, const SsdFusedCta& c, uint16_t* sm, float* f) {
  using Lay = SsdFusedSmem<kN, kP>;
  const SsdDims& d = a.d;
  const int64_t S = d.seqlen, N = d.state, P = d.head_dim;
  fused_stage<kN, kP>(tid, a.Cm + (c.b * S + c.t0) * a.ldbc + c.g * N, a.ldbc, c.r0, c.len, N, fused::kRows,
                      sm + Lay::c_at, Lay::ld, 1, Lay::rows);
  fused_stage<kN, fused::kPPieces>(tid, a.states + c.e * P * N, N, 0, P, N, fused::kRows, sm + Lay::u_at, Lay::ld, 1,
                                   Lay::rows);
  const float* const ac = a.acs + (c.b * d.heads + c.h) * S + c.t0;
  for (int u = tid; u < fused::kRows; u += fused::kThreads)
    f[Lay::acs_rows + u] = c.r0 + u < c.len ? ac[c.r0 + u] : 0.0f;
}
// Step 3's staging: B's and x's rows [s0, s0 + 64) of the chunk, their acs and dt.
template <int kN, int kP>
EXMY_HD void ssd_fused_stage_keys(int tid, const SsdFusedArgs& a, const SsdFusedCta& c, int64_t s0, uint16_t* sm,
                                  float* f) {
  using Lay = SsdFusedSmem<kN, kP>;
  const SsdDims& d = a.d;
  const int64_t S = d.seqlen, N = d.state, P = d.head_dim, H = d.heads;
  fused_stage<kN, kP>(tid, a.Bm + (c.b * S + c.t0) * a.ldbc + c.g * N, a.ldbc, s0, c.len, N, fused::kKeys,
                      sm + Lay::u_at, Lay::ld, 1, Lay::rows);
  fused_stage<kSsdFusedHead, kP>(tid, a.x + (c.b * S + c.t0) * a.ldx + c.h * P, a.ldx, s0, c.len, P, fused::kKeys,
                                 sm + Lay::x_at, Lay::ldx, 1, Lay::x_rows);
  const float* const ac = a.acs + (c.b * H + c.h) * S + c.t0;
  const float* const dtc = a.dt + (c.b * S + c.t0) * H + c.h;
  for (int u = tid; u < fused::kKeys; u += fused::kThreads) {
    const bool in = s0 + u < c.len;
    f[Lay::acs_keys + u] = in ? ac[s0 + u] : 0.0f;
    f[Lay::dt_keys + u] = in ? dtc[(s0 + u) * H] : 0.0f;
  }
}

// Step 3's element step on a thread's S (warp's rows from r0 + 16 warp):
// m = (S exp(acs_t - acs_s)) dt_s for s <= t < len, else +0.
template <int kN, int kP>
EXMY_HD void ssd_fused_weigh(float (&s)[fused::kNt][4], const float* f, int warp, int lane, int64_t r0, int64_t s0,
                             int64_t len) {
  using Lay = SsdFusedSmem<kN, kP>;
  const int g = lane >> 2, t = lane & 3;
  EXMY_MMA_UNROLL
  for (int nt = 0; nt < fused::kNt; ++nt)
    EXMY_MMA_UNROLL
    for (int e = 0; e < 4; ++e) {
      const int row = warp * 16 + g + 8 * (e >> 1), col = nt * 8 + 2 * t + (e & 1);
      const int64_t i = r0 + row, j = s0 + col;
      s[nt][e] = j <= i && i < len
                     ? (s[nt][e] * sim::hd_exp(f[Lay::acs_rows + row] - f[Lay::acs_keys + col])) * f[Lay::dt_keys + col]
                     : 0.0f;
    }
}

// Step 4: y = (Yd + exp(acs_t) off) + D x for the thread's rows and columns.
template <int kN, int kP>
EXMY_HD void ssd_fused_store(const float (&yd)[fused::kNt][4], const float (&off)[fused::kNt][4], const float* f,
                             const SsdFusedArgs& a, const SsdFusedCta& c, int warp, int lane) {
  using Lay = SsdFusedSmem<kN, kP>;
  const SsdDims& d = a.d;
  const int g = lane >> 2, t = lane & 3;
  const int64_t P = d.head_dim, ldy = d.heads * P;
  const float Dh = a.D[c.h];
  EXMY_MMA_UNROLL
  for (int row = 0; row < 2; ++row) {
    const int lr = warp * 16 + g + 8 * row;
    const int64_t i = c.r0 + lr;
    if (i >= c.len) continue;
    const int64_t tok = c.b * d.seqlen + c.t0 + i;
    const float ex = sim::hd_exp(f[Lay::acs_rows + lr]);
    EXMY_MMA_UNROLL
    for (int nt = 0; nt < fused::kNt; ++nt)
      EXMY_MMA_UNROLL
      for (int e = 0; e < 2; ++e) {
        const int p = nt * 8 + 2 * t + e;
        if (p < P)
          a.y[tok * ldy + c.h * P + p] =
              (yd[nt][2 * row + e] + ex * off[nt][2 * row + e]) + Dh * a.x[tok * a.ldx + c.h * P + p];
      }
  }
}

// ---------------------------------------------------------------------------
// The host emulation: the CTAs one after another, their warps and lanes in
// turn, in the kernel's order of stages, MMAs and steps (the MMA chains in
// double, rounded where the kernel's steps read them).
// ---------------------------------------------------------------------------

template <int kN, int kP>
void ssd_fused_output_host(const SsdFusedArgs& a) {
  using namespace fused;
  using Lay = SsdFusedSmem<kN, kP>;
  const SsdDims& d = a.d;
  std::vector<uint16_t> sm(Lay::elems);
  std::vector<float> f(Lay::floats);
  struct Regs {
    float s[kNt][4], yd[kNt][4], off[kNt][4];
  };
  std::vector<Regs> regs(kThreads);
  const int64_t tiles = ssd_fused_row_tiles(d);
  for (int64_t bq = 0; bq < d.batch * d.chunks(); ++bq)
    for (int64_t h = 0; h < d.heads; ++h)
      for (int64_t tile = 0; tile < tiles; ++tile) {
        const SsdFusedCta c = ssd_fused_cta(d, tile, h, bq);
        if (c.r0 >= c.len) continue;
        for (int tid = 0; tid < kThreads; ++tid) ssd_fused_stage_rows<kN, kP>(tid, a, c, sm.data(), f.data());
        for (int warp = 0; warp < kThreads / 32; ++warp) {
          Regs* const W = regs.data() + warp * 32;
          fused_rows_chain_host<kN, kP, kPPieces>(sm.data() + Lay::c_at, sm.data() + Lay::u_at, Lay::rows, Lay::ld,
                                                  warp * 16, [&](int lane) -> auto& { return W[lane].off; });
          for (int lane = 0; lane < 32; ++lane)
            for (auto& r : W[lane].yd)
              for (float& v : r) v = 0.0f;
        }
        for (int64_t s0 = 0; s0 <= c.r0; s0 += kKeys) {
          for (int tid = 0; tid < kThreads; ++tid) ssd_fused_stage_keys<kN, kP>(tid, a, c, s0, sm.data(), f.data());
          for (int warp = 0; warp < kThreads / 32; ++warp) {
            Regs* const W = regs.data() + warp * 32;
            fused_rows_chain_host<kN, kP, kP>(sm.data() + Lay::c_at, sm.data() + Lay::u_at, Lay::rows, Lay::ld,
                                              warp * 16, [&](int lane) -> auto& { return W[lane].s; });
            for (int lane = 0; lane < 32; ++lane)
              ssd_fused_weigh<kN, kP>(W[lane].s, f.data(), warp, lane, c.r0, s0, c.len);
            fused_regs_chain_host<kSsdFusedHead, kP>([&](int lane) -> auto& { return W[lane].s; },
                                                     sm.data() + Lay::x_at, Lay::x_rows, Lay::ldx,
                                                     [&](int lane) -> auto& { return W[lane].yd; });
          }
        }
        for (int warp = 0; warp < kThreads / 32; ++warp)
          for (int lane = 0; lane < 32; ++lane) {
            const Regs& R = regs[warp * 32 + lane];
            ssd_fused_store<kN, kP>(R.yd, R.off, f.data(), a, c, warp, lane);
          }
      }
}

// The output functor ssd_blocks_forward_launches takes, from a runner of
// the kernel on its arguments (run(const SsdFusedArgs&): the CUDA launch or
// the host emulation).
template <class Run>
struct SsdFusedOutput {
  Run run;
  void operator()(float* y, const float* acs, const float* states, const float* x, int64_t ldx, const float* Bm,
                  const float* Cm, int64_t ldbc, const float* dt, const float* D, const SsdDims& d) const {
    run(SsdFusedArgs{y, acs, states, x, ldx, Bm, Cm, ldbc, dt, D, d});
  }
};

// f.template operator()<kN, kP>() for d's state width and pieces.
template <class F>
void ssd_fused_dispatch(const SsdDims& d, F&& f) {
  const int w = ssd_fused_state(d.state), p = ssd_fused_pieces(d);
  if (w == 64) p == 1 ? f.template operator()<64, 1>() : f.template operator()<64, 3>();
  else p == 1 ? f.template operator()<128, 1>() : f.template operator()<128, 3>();
}

}  // namespace exmy::models

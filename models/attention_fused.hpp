// Causal GQA attention as fused kernels on the BF16 tensor cores
// (FlashAttention's way): the forward, a CTA per (batch, query head, 64
// query rows), keeps its scores and probabilities in registers and walks
// the keys in tiles of 64 with an online softmax, so nothing S x S (nor a
// block of it) is ever written; the backward's two kernels (below) recompute
// them from the saved lse the same way. The per-thread work here is
// EXMY_HD code shared by the CUDA kernels (models/cuda/attention.cu) and
// their host emulations (attention_fused_forward_host,
// attention_fused_backward_host, which CI runs); they differ only in who
// runs the threads and who does the MMAs (the instruction on a device,
// sim::mma_m16n8k16_host on the host, which sums each chain of MMAs in
// double and rounds it once).
//
// The forward, per CTA (4 warps, 16 query rows each) and key tile
// [j0, j0 + 64):
//   1. K's and V's rows of the tile are staged in shared memory as
//      bfloat16 pieces (models/split_gemm.hpp: three a float, or one where
//      q, k and v hold bfloat16 values, qkv_bf16); Q's rows once per CTA.
//      Columns past head_dim and rows past the sequence are zeros.
//   2. S = Q K^T: the pairs of pieces (i + j <= 2) chained into each
//      thread's FP32 accumulators, head_dim in steps of 16.
//   3. Each score times 1/sqrt(Dh); keys j > i (or past the sequence)
//      masked; the row's tile max over the quad of lanes holding the row;
//      the running max m' = max(m, tile max) (the first tile's max sets
//      m); l and the output sum o scaled by exp(m - m'); p = exp(s - m')
//      added into the thread's part of l, in key order.
//   4. o += P V: each p as three bfloat16 pieces, made in registers as the
//      A fragments of the MMA (a C fragment of m16n8 is half an A fragment
//      of m16k16), V's pieces from shared memory read along its rows
//      (sim::mma_frag_b_kn), as the backward reads dO, Q and K.
// At the end l is the sum of the quad's parts, (l0 + l1) + (l2 + l3);
// out = o times 1/l and lse = m + log l, as the row kernels
// (models/attention_rows.hpp) finish. Any backward (the block launches',
// the fused one's) takes this lse and out as the CPU's.
//
// Bits: not the CPU's (another algorithm: an online softmax, products on
// pieces summed by the tensor cores). tests/models/test_attention_cuda.cpp
// holds the emulation and the device to the CPU within the sum of both
// algorithms' bounds, this one's from a RunErr run of the same steps.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "formats/error.hpp"
#include "models/attention.hpp"
#include "models/attention_items.hpp"  // attn_scale
#include "models/split_gemm.hpp"       // bf16_pieces
#include "sim/hd_math.hpp"
#include "sim/mma_bf16.hpp"

namespace exmy::models {

namespace fused {
inline constexpr int kRows = 64;     // query rows a CTA: 4 warps of 16
inline constexpr int kKeys = 64;     // keys a tile
inline constexpr int kThreads = 128;
// The backward's dK, dV kernel: 8 warps, warps w and w + 4 on the same 16
// keys, the first four summing dV and the others dK (one 16 x head sum a
// warp: no spills at head_dim 128).
inline constexpr int kKvThreads = 256;
inline constexpr int kNt = kKeys / 8;      // n8 tiles of a warp's scores
inline constexpr int kPPieces = 3;         // pieces of a probability
}  // namespace fused

// The width (32, 64 or 128) the kernel runs a head of Dh in (zeros past
// Dh), or 0 where Dh is wider than it takes.
EXMY_HD int fused_head_dim(int64_t Dh) { return Dh <= 32 ? 32 : Dh <= 64 ? 64 : Dh <= 128 ? 128 : 0; }
inline bool attention_fused_applies(const AttnDims& d) { return fused_head_dim(d.head_dim) != 0; }
// One line naming `what` where the kernels do not apply (before any launch).
inline void attention_fused_require(const AttnDims& d, const char* what) {
  if (!attention_fused_applies(d))
    throw Error(std::string(what) + ": head_dim " + std::to_string(d.head_dim) + " is wider than 128");
}
// Pieces of q, k and v: one where they hold bfloat16 values.
inline int fused_pieces(const AttnDims& d) { return d.qkv_bf16 ? 1 : kBf16Pieces; }

// The shared memory of a forward CTA, in uint16 elements: 64 rows (of
// kDh + 8: 16 bytes' multiples, 4 banks apart) each of Q's pieces, K's and
// V's (kP each), a piece `rows` after the one before.
template <int kDh, int kP>
struct FusedSmem {
  static_assert(fused::kRows == fused::kKeys);  // a tile of queries and of keys alike
  static constexpr int ld = kDh + 8, rows = fused::kRows * ld;
  static constexpr int q_at = 0, k_at = kP * rows, v_at = k_at + kP * rows, elems = v_at + kP * rows;
  static constexpr size_t bytes = static_cast<size_t>(elems) * sizeof(uint16_t);
};

struct FusedArgs {
  float* out = nullptr;
  float* lse = nullptr;
  const float* q = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
  AttnDims d;
};

// Zeros into a thread's register tile (n8 tiles of four floats).
template <int kTiles>
EXMY_HD void fused_zero(float (&x)[kTiles][4]) {
  EXMY_MMA_UNROLL
  for (int nt = 0; nt < kTiles; ++nt)
    EXMY_MMA_UNROLL
    for (int e = 0; e < 4; ++e) x[nt][e] = 0.0f;
}

// A thread's registers: its scores (then probabilities) of the tile, its
// output sums, and per row (groupID and groupID + 8 of its warp's 16) the
// running max and its part of the sum; `valid` bit 4 nt + e: element e of
// n8 tile nt is a key the row sees.
template <int kDh>
struct FusedRegs {
  float s[fused::kNt][4];
  float o[kDh / 8][4];
  float m[2], l[2];
  uint32_t valid;
};

template <int kDh>
EXMY_HD void fused_init(FusedRegs<kDh>& R) {
  fused_zero(R.o);
  R.m[0] = R.m[1] = R.l[0] = R.l[1] = 0.0f;
}

// Thread tid's share (of kThreadsOf) of staging n rows of a head (row r at
// x + (row0 + r) ld, Dh columns; rows from S on and columns from Dh on as
// zeros) as kP pieces: element (r, c) at out + r rs + c cs, piece p at + p
// ps.
template <int kDh, int kP, int kThreadsOf = fused::kThreads>
EXMY_HD void fused_stage(int tid, const float* x, int64_t ld, int64_t row0, int64_t S, int64_t Dh, int n,
                         uint16_t* out, int rs, int cs, int ps) {
  for (int u = tid; u < n * kDh; u += kThreadsOf) {
    const int r = u / kDh, c = u % kDh;
    bf16_pieces(row0 + r < S && c < Dh ? x[(row0 + r) * ld + c] : 0.0f, kP, out + r * rs + c * cs, ps);
  }
}
// Q's 64 rows from row0 of query head h, and K's and V's of kv head kvh,
// into a CTA's shared memory of layout L (FusedSmem or FusedBwdSmem), by
// kThreadsOf threads.
template <int kDh, int kP, class L, int kThreadsOf = fused::kThreads, class Args>
EXMY_HD void fused_stage_q(int tid, const Args& a, int64_t b, int64_t h, int64_t row0, uint16_t* sm) {
  const int64_t S = a.d.seqlen, Dh = a.d.head_dim, ldq = a.d.q_heads * Dh;
  fused_stage<kDh, kP, kThreadsOf>(tid, a.q + b * S * ldq + h * Dh, ldq, row0, S, Dh, fused::kRows, sm + L::q_at,
                                   L::ld, 1, L::rows);
}
template <int kDh, int kP, class L, int kThreadsOf = fused::kThreads, class Args>
EXMY_HD void fused_stage_kv(int tid, const Args& a, int64_t b, int64_t kvh, int64_t row0, uint16_t* sm) {
  const int64_t S = a.d.seqlen, Dh = a.d.head_dim, ldkv = a.d.kv_heads * Dh, at = b * S * ldkv + kvh * Dh;
  fused_stage<kDh, kP, kThreadsOf>(tid, a.k + at, ldkv, row0, S, Dh, fused::kKeys, sm + L::k_at, L::ld, 1, L::rows);
  fused_stage<kDh, kP, kThreadsOf>(tid, a.v + at, ldkv, row0, S, Dh, fused::kKeys, sm + L::v_at, L::ld, 1, L::rows);
}

// Step 3's first half, after the scores of key tile j0 (warp's rows from
// i0 + 16 warp): each score scaled, the keys the rows see marked, the
// thread's max of each row (-inf where it sees none).
template <int kDh>
EXMY_HD void fused_scale_mask(FusedRegs<kDh>& R, int warp, int lane, int64_t i0, int64_t j0, int64_t S, float scale,
                              float tmax[2]) {
  const int g = lane >> 2, t = lane & 3;
  tmax[0] = tmax[1] = -INFINITY;
  R.valid = 0;
  EXMY_MMA_UNROLL
  for (int nt = 0; nt < fused::kNt; ++nt)
    EXMY_MMA_UNROLL
    for (int e = 0; e < 4; ++e) {
      const int row = e >> 1;
      const int64_t i = i0 + warp * 16 + g + 8 * row, j = j0 + nt * 8 + 2 * t + (e & 1);
      if (j <= i && j < S) {
        const float x = R.s[nt][e] * scale;
        R.s[nt][e] = x;
        tmax[row] = sim::hd_max(tmax[row], x);
        R.valid |= 1u << (4 * nt + e);
      }
    }
}

// Step 3's second half, with each row's max over the tile (mt): the running
// max, l and o rescaled (not after the first tile, which sets m), the
// probabilities into s (0 where masked), added into l in key order.
template <int kDh>
EXMY_HD void fused_softmax_step(FusedRegs<kDh>& R, const float mt[2], bool first) {
  EXMY_MMA_UNROLL
  for (int row = 0; row < 2; ++row) {
    if (first) {
      R.m[row] = mt[row];
      continue;
    }
    const float m1 = sim::hd_max(R.m[row], mt[row]), alpha = sim::hd_exp(R.m[row] - m1);
    R.l[row] *= alpha;
    EXMY_MMA_UNROLL
    for (int dt = 0; dt < kDh / 8; ++dt) R.o[dt][2 * row] *= alpha, R.o[dt][2 * row + 1] *= alpha;
    R.m[row] = m1;
  }
  EXMY_MMA_UNROLL
  for (int nt = 0; nt < fused::kNt; ++nt)
    EXMY_MMA_UNROLL
    for (int e = 0; e < 4; ++e) {
      const int row = e >> 1;
      const float p = (R.valid >> (4 * nt + e)) & 1u ? sim::hd_exp(R.s[nt][e] - R.m[row]) : 0.0f;
      R.s[nt][e] = p;
      R.l[row] += p;
    }
}

// The A fragments (pieces 0, 1, 2) of a tile's values s (probabilities,
// or the backward's dS) over columns [16 kk, 16 kk + 16): n8 tiles 2 kk
// and 2 kk + 1 of the thread's C fragments, element pairs (0, 1) and (2, 3).
EXMY_HD void fused_p_frags(const float (&s)[fused::kNt][4], int kk, uint32_t a[fused::kPPieces][4]) {
  uint16_t pc[8][fused::kPPieces];
  EXMY_MMA_UNROLL
  for (int x = 0; x < 8; ++x) bf16_pieces(s[2 * kk + x / 4][x % 4], fused::kPPieces, pc[x], 1);
  EXMY_MMA_UNROLL
  for (int p = 0; p < fused::kPPieces; ++p)
    EXMY_MMA_UNROLL
    for (int r = 0; r < 4; ++r) a[p][r] = sim::mma_pack(pc[2 * r][p], pc[2 * r + 1][p]);
}

// The end, with each row's whole sum l: out = o times 1/l, lse = m + log l
// (lane 0 of the quad), rows and columns inside the tensor.
template <int kDh>
EXMY_HD void fused_store(const FusedRegs<kDh>& R, const float l[2], const FusedArgs& a, int64_t b, int64_t h,
                         int64_t i0, int warp, int lane) {
  const int g = lane >> 2, t = lane & 3;
  const int64_t S = a.d.seqlen, Dh = a.d.head_dim, ldq = a.d.q_heads * Dh;
  EXMY_MMA_UNROLL
  for (int row = 0; row < 2; ++row) {
    const int64_t i = i0 + warp * 16 + g + 8 * row;
    if (i >= S) continue;
    const float inv = 1.0f / l[row];
    float* const orow = a.out + (b * S + i) * ldq + h * Dh;
    EXMY_MMA_UNROLL
    for (int dt = 0; dt < kDh / 8; ++dt)
      EXMY_MMA_UNROLL
      for (int e = 0; e < 2; ++e) {
        const int c = dt * 8 + 2 * t + e;
        if (c < Dh) orow[c] = R.o[dt][2 * row + e] * inv;
      }
    if (t == 0) a.lse[(b * a.d.q_heads + h) * S + i] = R.m[row] + sim::hd_log(l[row]);
  }
}

// The pairs of pieces (pa pieces of A, pb of B) a product keeps, as
// split_pairs orders them, for f(i, j): unrolled on a device.
template <int kPa, int kPb, class F>
EXMY_HD void fused_for_pairs(F&& f) {
  EXMY_MMA_UNROLL
  for (int s = 2; s >= 0; --s)
    EXMY_MMA_UNROLL
    for (int i = 2; i >= 0; --i)
      if (i <= s && i < kPa && s - i < kPb) f(i, s - i);
}

// ---------------------------------------------------------------------------
// The host emulation: the kernel's CTAs one after another, their warps and
// lanes in turn, in the kernel's order of stages, MMAs and steps.
// ---------------------------------------------------------------------------

// The host emulation's MMA chains, one warp's 32 lanes, in double (rounded
// to float32 by the caller where the steps read them):
//   rows product  c[nt] += A's rows [ar0, ar0 + 16) times B's rows [0, 64)
//                 transposed, over kDh columns, pairs of pieces (kPa, kPb)
//                 (A, B: piece 0 of each, pieces ps apart, row stride ld);
//   regs product  c[dt] += the lanes' A fragments of columns [16 kk, 16 kk
//                 + 16) (pf: three pieces a lane) times B held [k][n] (rows
//                 16 kk.. of B, kDh columns).
// A caller may stop the rows product's k-steps at k_end where both
// operands hold zeros from there on (its staging's padding: the products
// are exact zeros, and adding them leaves the double chain as it is), and
// the regs product's n-tiles at n_end where it never reads the outputs
// past it; either gives the outputs it reads the full instruction
// sequence's values, in less time.
template <int kDh, int kPa, int kPb>
void fused_rows_product_host(const uint16_t* A, const uint16_t* B, int ps, int ld, int ar0,
                             double (*c)[fused::kNt][4], int k_end = kDh) {
  uint32_t fa[32][4], fb[32][2];
  double cc[32][4];
  for (int ks = 0; ks < kDh && ks < k_end; ks += 16)
    fused_for_pairs<kPa, kPb>([&](int i, int j) {
      for (int lane = 0; lane < 32; ++lane) sim::mma_frag_a(A + i * ps, ld, ar0, ks, lane, fa[lane]);
      for (int nt = 0; nt < fused::kNt; ++nt) {
        for (int lane = 0; lane < 32; ++lane) {
          sim::mma_frag_b(B + j * ps, ld, nt * 8, ks, lane, fb[lane]);
          for (int e = 0; e < 4; ++e) cc[lane][e] = c[lane][nt][e];
        }
        sim::mma_m16n8k16_host(fa, fb, cc);
        for (int lane = 0; lane < 32; ++lane)
          for (int e = 0; e < 4; ++e) c[lane][nt][e] = cc[lane][e];
      }
    });
}
template <int kDh, int kPb>
void fused_regs_product_host(const uint32_t (*pf)[fused::kPPieces][4], const uint16_t* B, int ps, int ld, int kk,
                             double (*c)[kDh / 8][4], int n_end = kDh) {
  uint32_t fa[32][4], fb[32][2];
  double cc[32][4];
  fused_for_pairs<fused::kPPieces, kPb>([&](int i, int j) {
    for (int dt = 0; dt < kDh / 8 && dt * 8 < n_end; ++dt) {
      for (int lane = 0; lane < 32; ++lane) {
        for (int r = 0; r < 4; ++r) fa[lane][r] = pf[lane][i][r];
        sim::mma_frag_b_kn(B + j * ps, ld, dt * 8, kk * 16, lane, fb[lane]);
        for (int e = 0; e < 4; ++e) cc[lane][e] = c[lane][dt][e];
      }
      sim::mma_m16n8k16_host(fa, fb, cc);
      for (int lane = 0; lane < 32; ++lane)
        for (int e = 0; e < 4; ++e) c[lane][dt][e] = cc[lane][e];
    }
  });
}

// The same as a warp's steps read them: out(lane) (a float[kNt][4]) = the
// rows product from zero, rounded; acc(lane) (a float[kDh / 8][4]) += the
// A fragments of x(lane) (a tile's values, float[kNt][4]) over the tile's
// 64 columns times B, the chain from acc in double, rounded at its end.
template <int kDh, int kPa, int kPb, class Out>
void fused_rows_chain_host(const uint16_t* A, const uint16_t* B, int ps, int ld, int ar0, Out&& out,
                           int k_end = kDh) {
  double c[32][fused::kNt][4] = {};
  fused_rows_product_host<kDh, kPa, kPb>(A, B, ps, ld, ar0, c, k_end);
  for (int lane = 0; lane < 32; ++lane)
    for (int nt = 0; nt < fused::kNt; ++nt)
      for (int e = 0; e < 4; ++e) out(lane)[nt][e] = static_cast<float>(c[lane][nt][e]);
}
template <int kDh, int kPb, class X, class Acc>
void fused_regs_chain_host(X&& x, const uint16_t* B, int ps, int ld, Acc&& acc, int n_end = kDh) {
  double c[32][kDh / 8][4];
  for (int lane = 0; lane < 32; ++lane)
    for (int dt = 0; dt < kDh / 8; ++dt)
      for (int e = 0; e < 4; ++e) c[lane][dt][e] = acc(lane)[dt][e];
  for (int kk = 0; kk < fused::kKeys / 16; ++kk) {
    uint32_t pf[32][fused::kPPieces][4];
    for (int lane = 0; lane < 32; ++lane) fused_p_frags(x(lane), kk, pf[lane]);
    fused_regs_product_host<kDh, kPb>(pf, B, ps, ld, kk, c, n_end);
  }
  for (int lane = 0; lane < 32; ++lane)
    for (int dt = 0; dt < kDh / 8; ++dt)
      for (int e = 0; e < 4; ++e) acc(lane)[dt][e] = static_cast<float>(c[lane][dt][e]);
}

// The device's two shuffle steps over each quad of lanes (xor 1, then xor
// 2), v[lane][row] = op(v[lane][row], v[partner][row]) for all lanes at once.
template <class Op>
void fused_quad_host(float (*v)[2], Op op) {
  for (int step = 1; step <= 2; step *= 2) {
    float w[32][2];
    for (int lane = 0; lane < 32; ++lane)
      for (int row = 0; row < 2; ++row) w[lane][row] = op(v[lane][row], v[lane ^ step][row]);
    for (int lane = 0; lane < 32; ++lane) v[lane][0] = w[lane][0], v[lane][1] = w[lane][1];
  }
}

template <int kDh, int kP>
void attention_fused_forward_host(const FusedArgs& a) {
  using namespace fused;
  using L = FusedSmem<kDh, kP>;
  const AttnDims& d = a.d;
  const int64_t S = d.seqlen, rep = d.q_heads / d.kv_heads;
  const float scale = attn_scale<float>(d);
  std::vector<uint16_t> sm(L::elems);
  std::vector<FusedRegs<kDh>> regs(kThreads);
  for (int64_t b = 0; b < d.batch; ++b)
    for (int64_t h = 0; h < d.q_heads; ++h)
      for (int64_t i0 = 0; i0 < S; i0 += kRows) {
        const int64_t kvh = h / rep, kend = i0 + kRows < S ? i0 + kRows : S;
        for (int tid = 0; tid < kThreads; ++tid) fused_stage_q<kDh, kP, L>(tid, a, b, h, i0, sm.data());
        for (auto& R : regs) fused_init(R);
        for (int64_t j0 = 0; j0 < kend; j0 += kKeys) {
          for (int tid = 0; tid < kThreads; ++tid) fused_stage_kv<kDh, kP, L>(tid, a, b, kvh, j0, sm.data());
          for (int warp = 0; warp < kThreads / 32; ++warp) {
            FusedRegs<kDh>* const W = regs.data() + warp * 32;
            fused_rows_chain_host<kDh, kP, kP>(sm.data() + L::q_at, sm.data() + L::k_at, L::rows, L::ld, warp * 16,
                                               [&](int lane) -> auto& { return W[lane].s; });
            float mt[32][2];
            for (int lane = 0; lane < 32; ++lane)
              fused_scale_mask(W[lane], warp, lane, i0, j0, S, scale, mt[lane]);
            fused_quad_host(mt, [](float x, float y) { return sim::hd_max(x, y); });
            for (int lane = 0; lane < 32; ++lane) fused_softmax_step(W[lane], mt[lane], j0 == 0);
            fused_regs_chain_host<kDh, kP>([&](int lane) -> auto& { return W[lane].s; }, sm.data() + L::v_at, L::rows,
                                           L::ld, [&](int lane) -> auto& { return W[lane].o; });
          }
        }
        for (int warp = 0; warp < kThreads / 32; ++warp) {
          FusedRegs<kDh>* const W = regs.data() + warp * 32;
          float l[32][2];
          for (int lane = 0; lane < 32; ++lane) l[lane][0] = W[lane].l[0], l[lane][1] = W[lane].l[1];
          fused_quad_host(l, [](float x, float y) { return x + y; });
          for (int lane = 0; lane < 32; ++lane) fused_store(W[lane], l[lane], a, b, h, i0, warp, lane);
        }
      }
}

// ---------------------------------------------------------------------------
// The backward, from the forward's out and lse (the CPU's, or the fused
// forward's): a launch for D_i = dO_i · O_i (attn_row_dot, the CPU's), then
//   dq   a CTA per (batch, query head, 64 query rows), as the forward, over
//        the key tiles it sees: S = Q K^T, P = exp(S scale - lse_i), dP =
//        dO V^T, dS = P (dP - D_i) scale (attn_prob_saved, attn_dscore),
//        its dQ += dS K; at the end dq += dQ;
//   dkv  a CTA per (batch, kv head, 64 key rows), over the kv head's query
//        heads in order and each one's query tiles from the diagonal on, 8
//        warps: warp w and w + 4 on keys 16 w.., each forming S^T = K Q^T
//        and P^T; the first adds dV += P^T dO, the second forms dP^T = V
//        dO^T and dS^T and adds dK += dS^T Q; at the end dk += dK, dv += dV.
// The products on pieces as the forward's (dO, P and dS in three). No
// atomics: every output is one thread's, its sums in a fixed order.
// ---------------------------------------------------------------------------

// Floats of the backward's scratch: D (batch, query head, row).
inline int64_t attention_fused_backward_scratch(const AttnDims& d) { return d.batch * d.q_heads * d.seqlen; }

// The shared memory of a backward CTA: the forward's (Q, K, V), then dO's
// 64 rows in three pieces.
template <int kDh, int kP>
struct FusedBwdSmem : FusedSmem<kDh, kP> {
  using F = FusedSmem<kDh, kP>;
  static constexpr int do_at = F::elems, elems = do_at + fused::kPPieces * F::rows;
  static constexpr size_t bytes = static_cast<size_t>(elems) * sizeof(uint16_t);
};

struct FusedBwdArgs {
  float* dq = nullptr;
  float* dk = nullptr;
  float* dv = nullptr;
  const float* dout = nullptr;
  const float* lse = nullptr;
  const float* q = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
  const float* D = nullptr;  // the rowsum launch's
  AttnDims d;
};

// A backward thread's registers: a tile's scores then probabilities (s),
// dP then dS (dp), and its warp's output sum (dQ, dV or dK).
template <int kDh>
struct FusedBwdRegs {
  float s[fused::kNt][4], dp[fused::kNt][4];
  float acc[kDh / 8][4];
};
template <int kDh>
EXMY_HD void fused_bwd_init(FusedBwdRegs<kDh>& R) {
  fused_zero(R.acc);
}
template <int kDh>
EXMY_HD void fused_bwd_zero_tile(FusedBwdRegs<kDh>& R) {
  fused_zero(R.s);
  fused_zero(R.dp);
}

// Q's and dO's 64 rows from row0 of query head h (the dq kernel's once,
// the dkv kernel's per query tile), by kThreadsOf threads.
template <int kDh, int kP, int kThreadsOf>
EXMY_HD void fused_bwd_stage_q(int tid, const FusedBwdArgs& a, int64_t b, int64_t h, int64_t row0, uint16_t* sm) {
  using L = FusedBwdSmem<kDh, kP>;
  const int64_t S = a.d.seqlen, Dh = a.d.head_dim, ldq = a.d.q_heads * Dh;
  fused_stage_q<kDh, kP, L, kThreadsOf>(tid, a, b, h, row0, sm);
  fused_stage<kDh, fused::kPPieces, kThreadsOf>(tid, a.dout + b * S * ldq + h * Dh, ldq, row0, S, Dh, fused::kRows,
                                                sm + L::do_at, L::ld, 1, L::rows);
}

// The backward's element step on a tile (rows from r0 + 16 warp, columns
// from c0): s -> p = exp(s scale - lse_i), dp -> dS = p (dp - D_i) scale,
// both 0 where masked (j > i, or a query past the sequence). kT: the rows
// are keys and the columns queries (the dkv kernel), else the other way.
// lse and D: the head's rows.
template <bool kT, int kDh>
EXMY_HD void fused_bwd_step(FusedBwdRegs<kDh>& R, int warp, int lane, int64_t r0, int64_t c0, int64_t S, float scale,
                            const float* lse, const float* D) {
  const int g = lane >> 2, t = lane & 3;
  EXMY_MMA_UNROLL
  for (int nt = 0; nt < fused::kNt; ++nt)
    EXMY_MMA_UNROLL
    for (int e = 0; e < 4; ++e) {
      const int64_t row = r0 + warp * 16 + g + 8 * (e >> 1), col = c0 + nt * 8 + 2 * t + (e & 1);
      const int64_t i = kT ? col : row, j = kT ? row : col;
      float p = 0.0f, ds = 0.0f;
      if (i < S && j <= i) {
        p = attn_prob_saved(R.s[nt][e], i, j, scale, lse[i]);
        ds = attn_dscore(p, R.dp[nt][e], i, j, D[i], scale);
      }
      R.s[nt][e] = p;
      R.dp[nt][e] = ds;
    }
}

// acc (its rows from r0 + 16 warp, inside the tensor; columns below Dh)
// added into the gradient rows out + row ld.
template <int kDh>
EXMY_HD void fused_bwd_store(const float (&acc)[kDh / 8][4], float* out, int64_t ld, int64_t r0, int64_t S, int64_t Dh,
                             int warp, int lane) {
  const int g = lane >> 2, t = lane & 3;
  EXMY_MMA_UNROLL
  for (int row = 0; row < 2; ++row) {
    const int64_t r = r0 + warp * 16 + g + 8 * row;
    if (r >= S) continue;
    EXMY_MMA_UNROLL
    for (int dt = 0; dt < kDh / 8; ++dt)
      EXMY_MMA_UNROLL
      for (int e = 0; e < 2; ++e) {
        const int c = dt * 8 + 2 * t + e;
        if (c < Dh) out[r * ld + c] += acc[dt][2 * row + e];
      }
  }
}

// D_i = dO_i · O_i for every (batch, query head, row), a thread each.
template <class L>
void fused_rowsum_launch(const L& launch, float* D, const float* dout, const float* out, const AttnDims& d) {
  const int64_t S = d.seqlen, Hq = d.q_heads, Dh = d.head_dim, ldq = Hq * Dh;
  launch("attention_fused_backward rowsum", d.batch * Hq * S, [=] EXMY_HD_LAMBDA(int64_t u) {
    const int64_t b = u / (Hq * S), h = (u / S) % Hq, i = u % S, at = (b * S + i) * ldq + h * Dh;
    D[u] = attn_row_dot(dout + at, out + at, Dh);
  });
}

// One warp's tile of the backward on the host (rows from r0 + 16 wrow):
// s from zero as the rows product A1 B1^T (pieces kP x kP) and, where the
// warp's sum needs dS (a2 >= 0), dp as A2 B2^T (kPa2 x kPb2), rounded; the
// element step; then acc += the A fragments of the probabilities (probs)
// or of dS times B_out ([k][n], pieces kPout), chained in double from acc
// and rounded at the tile's end.
template <bool kT, int kDh, int kP, int kPa2, int kPb2, int kPout>
void fused_bwd_tile_host(FusedBwdRegs<kDh>* W, const uint16_t* sm, int ld, int ps, int a1, int b1, int a2, int b2,
                         bool probs, int b_out, int wrow, int64_t r0, int64_t c0, int64_t S, float scale,
                         const float* lse, const float* D) {
  fused_rows_chain_host<kDh, kP, kP>(sm + a1, sm + b1, ps, ld, wrow * 16, [&](int lane) -> auto& { return W[lane].s; });
  if (a2 >= 0)
    fused_rows_chain_host<kDh, kPa2, kPb2>(sm + a2, sm + b2, ps, ld, wrow * 16,
                                           [&](int lane) -> auto& { return W[lane].dp; });
  else  // as the kernel's zeroed tile
    for (int lane = 0; lane < 32; ++lane)
      for (auto& row : W[lane].dp)
        for (float& x : row) x = 0.0f;
  for (int lane = 0; lane < 32; ++lane) fused_bwd_step<kT>(W[lane], wrow, lane, r0, c0, S, scale, lse, D);
  fused_regs_chain_host<kDh, kPout>([&](int lane) -> auto& { return probs ? W[lane].s : W[lane].dp; }, sm + b_out, ps,
                                    ld, [&](int lane) -> auto& { return W[lane].acc; });
}

template <int kDh, int kP>
void attention_fused_backward_host(const FusedBwdArgs& a) {
  using namespace fused;
  using L = FusedBwdSmem<kDh, kP>;
  const AttnDims& d = a.d;
  const int64_t S = d.seqlen, Hq = d.q_heads, rep = Hq / d.kv_heads, Dh = d.head_dim;
  const int64_t ldq = Hq * Dh, ldkv = d.kv_heads * Dh;
  const float scale = attn_scale<float>(d);
  std::vector<uint16_t> sm(L::elems);
  std::vector<FusedBwdRegs<kDh>> regs(kKvThreads);
  // dq: dS K (K held [key][dim]: B of [k][n])
  for (int64_t b = 0; b < d.batch; ++b)
    for (int64_t h = 0; h < Hq; ++h)
      for (int64_t i0 = 0; i0 < S; i0 += kRows) {
        const int64_t kvh = h / rep, kend = i0 + kRows < S ? i0 + kRows : S, row = (b * Hq + h) * S;
        for (int tid = 0; tid < kThreads; ++tid) fused_bwd_stage_q<kDh, kP, kThreads>(tid, a, b, h, i0, sm.data());
        for (auto& R : regs) fused_bwd_init(R);
        for (int64_t j0 = 0; j0 < kend; j0 += kKeys) {
          for (int tid = 0; tid < kThreads; ++tid)
            fused_stage_kv<kDh, kP, L, kThreads>(tid, a, b, kvh, j0, sm.data());
          for (int warp = 0; warp < kThreads / 32; ++warp)
            fused_bwd_tile_host<false, kDh, kP, kPPieces, kP, kP>(regs.data() + warp * 32, sm.data(), L::ld, L::rows,
                                                                  L::q_at, L::k_at, L::do_at, L::v_at, false, L::k_at,
                                                                  warp, i0, j0, S, scale, a.lse + row, a.D + row);
        }
        for (int tid = 0; tid < kThreads; ++tid)
          fused_bwd_store<kDh>(regs[tid].acc, a.dq + b * S * ldq + h * Dh, ldq, i0, S, Dh, tid / 32, tid % 32);
      }
  // dkv: warps 0-3 P^T dO (dV), warps 4-7 dS^T Q (dK), dO and Q held [query][dim]
  for (int64_t b = 0; b < d.batch; ++b)
    for (int64_t kvh = 0; kvh < d.kv_heads; ++kvh)
      for (int64_t j0 = 0; j0 < S; j0 += kKeys) {
        for (int tid = 0; tid < kKvThreads; ++tid)
          fused_stage_kv<kDh, kP, L, kKvThreads>(tid, a, b, kvh, j0, sm.data());
        for (auto& R : regs) fused_bwd_init(R);
        for (int64_t h = kvh * rep; h < (kvh + 1) * rep; ++h) {
          const int64_t row = (b * Hq + h) * S;
          for (int64_t i0 = j0; i0 < S; i0 += kRows) {
            for (int tid = 0; tid < kKvThreads; ++tid)
              fused_bwd_stage_q<kDh, kP, kKvThreads>(tid, a, b, h, i0, sm.data());
            for (int warp = 0; warp < kKvThreads / 32; ++warp) {
              FusedBwdRegs<kDh>* const W = regs.data() + warp * 32;
              if (warp < 4)
                fused_bwd_tile_host<true, kDh, kP, kP, kPPieces, kPPieces>(
                    W, sm.data(), L::ld, L::rows, L::k_at, L::q_at, -1, 0, true, L::do_at, warp, j0, i0, S, scale,
                    a.lse + row, a.D + row);
              else
                fused_bwd_tile_host<true, kDh, kP, kP, kPPieces, kP>(W, sm.data(), L::ld, L::rows, L::k_at, L::q_at,
                                                                     L::v_at, L::do_at, false, L::q_at, warp - 4, j0,
                                                                     i0, S, scale, a.lse + row, a.D + row);
            }
          }
        }
        for (int tid = 0; tid < kKvThreads; ++tid) {
          const int warp = tid / 32;
          fused_bwd_store<kDh>(regs[tid].acc, (warp < 4 ? a.dv : a.dk) + b * S * ldkv + kvh * Dh, ldkv, j0, S, Dh,
                               warp % 4, tid % 32);
        }
      }
}

// The kernel's dispatch over (head width, pieces): f.template operator()<kDh, kP>().
template <class F>
void fused_dispatch(const AttnDims& d, F&& f) {
  const int w = fused_head_dim(d.head_dim), p = fused_pieces(d);
  if (w == 32) p == 1 ? f.template operator()<32, 1>() : f.template operator()<32, 3>();
  else if (w == 64) p == 1 ? f.template operator()<64, 1>() : f.template operator()<64, 3>();
  else p == 1 ? f.template operator()<128, 1>() : f.template operator()<128, 3>();
}

}  // namespace exmy::models

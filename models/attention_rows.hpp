// The row kernels of causal GQA attention (models/attention.hpp): the
// per-thread work of the CUDA backend's parallel attention as plain EXMY_HD
// functions, one call per thread, launched by models/attention_launches.hpp
// (on a device, and on the host in the emulation CI runs).
//
// Threads and what each keeps in its own arrays (S = seqlen, Dh = head_dim):
//   forward   attn_fwd_row       (b, h, i):   query row i of head h: the
//             online softmax over the keys j <= i (running max and sum,
//             FP32), its output row and lse_i; q_i and the output in arrays
//   backward  attn_bwd_rowsum    (b, h, i):   D_i = rowsum(dO_i ∘ O_i)
//             attn_bwd_kv_row    (b, h, j):   key row j's part of dK_j, dV_j
//             from query head h: the sums over its rows i >= j, from S - 1
//             down; k_j, v_j and both sums in arrays
//             attn_bwd_kv_add    (b, j, kvh, e): dK_j, dV_j += the parts of
//             the query heads of kv head kvh, in head order
//             attn_bwd_q_row     (b, h, i):   dQ_i += over the keys j <= i;
//             q_i, dO_i and the sum in arrays
// Every thread writes only its own rows, and every sum runs in a fixed
// order, so the results do not depend on the launch (no atomics), and
// nothing is S x S: the backward's scratch is D (B,Hq,S) and the per-head
// parts of dK, dV (B,S,Hq*Dh each, the shape of q). A thread per query head
// rather than per kv head for dK, dV gives GQA's kv heads (the 8B's 4
// query heads each) as many threads as the other launches.
//
// Threads are numbered with the row index fastest, so the 32 threads of a
// warp are 32 neighbouring rows of one head and walk the same key (or
// query) rows in the same order: their loads of k, v (q, dO) are the same
// address at the same time. The forward and dQ walk the keys from 0 up, the
// dK, dV rows walk the queries from S - 1 down, so the threads of a warp
// part only at their last step.
//
// Bits: these sums are not the CPU's (Eigen's blocked products, a softmax
// normalized after its max), so the results are within the FP32 budget of
// tests/models/test_attention_cuda.cpp, not equal to the CPU's; the
// emulated device backend runs the block launches with the CPU's blocking
// instead (models/attention_blocks.hpp), and so, by default, does the CUDA
// backend with its own.
#pragma once

#include <cstdint>

#include "formats/format.hpp"  // EXMY_HD
#include "models/attention.hpp"
#include "models/attention_items.hpp"  // attn_scale
#include "sim/hd_math.hpp"

// Loops over a tile's compile-time width, unrolled on a device so that the
// tile's scores stay in registers.
#if defined(__CUDA_ARCH__)
#define EXMY_TILE_LOOP _Pragma("unroll")
#else
#define EXMY_TILE_LOOP
#endif

namespace exmy::models {

// The widest head a row thread holds in its arrays (the 8B's and the GPU
// proxies' head_dim is 128).
inline constexpr int64_t kAttnRowMaxDim = 128;
// Rows of the other side a thread takes per step: the scores of a tile are
// formed together, so each element of the thread's own arrays is read once
// per tile rather than once per row.
inline constexpr int kAttnRowTile = 16;

EXMY_HD int64_t attn_tile_rows(int64_t left) { return left < kAttnRowTile ? left : kAttnRowTile; }

// s[t] = x · rows[t] and, when y, r[t] = y · rows2[t], for t < n (the tile's
// row t at rows + t * ld); each dot summed over e in order from +0.
template <class T>
EXMY_HD void attn_tile_dots(T* s, const T* x, const T* rows, T* r, const T* y, const T* rows2, int64_t ld, int64_t step,
                            int n, int64_t Dh) {
  EXMY_TILE_LOOP
  for (int t = 0; t < kAttnRowTile; ++t) s[t] = r[t] = T(0);
  for (int64_t e = 0; e < Dh; ++e) {
    const T xe = x[e];
    EXMY_TILE_LOOP
    for (int t = 0; t < kAttnRowTile; ++t)
      if (t < n) s[t] += xe * rows[t * step * ld + e];
    if (y) {
      const T ye = y[e];
      EXMY_TILE_LOOP
      for (int t = 0; t < kAttnRowTile; ++t)
        if (t < n) r[t] += ye * rows2[t * step * ld + e];
    }
  }
}

// acc[e] += w[t] rows[t][e] for t < n in order, each e on its own.
template <class T>
EXMY_HD void attn_tile_axpy(T* acc, const T* w, const T* rows, int64_t ld, int64_t step, int n, int64_t Dh) {
  for (int64_t e = 0; e < Dh; ++e) {
    T a = acc[e];
    EXMY_TILE_LOOP
    for (int t = 0; t < kAttnRowTile; ++t)
      if (t < n) a += w[t] * rows[t * step * ld + e];
    acc[e] = a;
  }
}

// Forward, thread (b, h, i): the softmax of query row i's scaled scores over
// the keys j <= i, tile by tile, with a running max m and sum l: a tile's
// scores raise m to m', the sum and the output so far are multiplied by
// exp(m - m'), and the tile adds its exp(s_j - m') and exp(s_j - m') V_j.
// The first tile sets m (key 0 is in every row). At the end out_i = acc / l
// (as the CPU, times 1 / l) and lse_i = m + log l.
template <class T>
EXMY_HD void attn_fwd_row(T* out, T* lse, const T* q, const T* k, const T* v, const AttnDims& d, int64_t b,
                          int64_t h, int64_t i) {
  const int64_t S = d.seqlen, Dh = d.head_dim, Hq = d.q_heads, ldq = Hq * Dh, ldkv = d.kv_heads * Dh;
  const int64_t kvh = h / (Hq / d.kv_heads);
  const T scale = attn_scale<T>(d);
  const T* kh = k + b * S * ldkv + kvh * Dh;
  const T* vh = v + b * S * ldkv + kvh * Dh;
  const T* qi = q + (b * S + i) * ldq + h * Dh;
  T qr[kAttnRowMaxDim], acc[kAttnRowMaxDim];
  for (int64_t e = 0; e < Dh; ++e) qr[e] = qi[e], acc[e] = T(0);
  T m = T(0), l = T(0);
  for (int64_t j0 = 0; j0 <= i; j0 += kAttnRowTile) {
    const int n = static_cast<int>(attn_tile_rows(i + 1 - j0));
    T s[kAttnRowTile], unused[kAttnRowTile];
    attn_tile_dots(s, qr, kh + j0 * ldkv, unused, static_cast<const T*>(nullptr), static_cast<const T*>(nullptr),
                   ldkv, 1, n, Dh);
    T mt = s[0] * scale;
    EXMY_TILE_LOOP
    for (int t = 0; t < kAttnRowTile; ++t)
      if (t < n) s[t] = s[t] * scale, mt = sim::hd_max(mt, s[t]);
    if (j0 == 0) {
      m = mt;
    } else {
      const T m1 = sim::hd_max(m, mt), alpha = sim::hd_exp(m - m1);
      l *= alpha;
      for (int64_t e = 0; e < Dh; ++e) acc[e] *= alpha;
      m = m1;
    }
    EXMY_TILE_LOOP
    for (int t = 0; t < kAttnRowTile; ++t)
      if (t < n) s[t] = sim::hd_exp(s[t] - m), l += s[t];
    attn_tile_axpy(acc, s, vh + j0 * ldkv, ldkv, 1, n, Dh);
  }
  const T inv = T(1) / l;
  T* oi = out + (b * S + i) * ldq + h * Dh;
  for (int64_t e = 0; e < Dh; ++e) oi[e] = acc[e] * inv;
  lse[(b * Hq + h) * S + i] = m + sim::hd_log(l);
}

// Backward, thread (b, h, i): D_i = sum_e dO_ie O_ie in e order (the CPU's
// own loop, so its bits) into D (B,Hq,S).
template <class T>
EXMY_HD void attn_bwd_rowsum(T* D, const T* dout, const T* out, const AttnDims& d, int64_t b, int64_t h, int64_t i) {
  const int64_t S = d.seqlen, Dh = d.head_dim, ldq = d.q_heads * Dh;
  const T* doi = dout + (b * S + i) * ldq + h * Dh;
  const T* oi = out + (b * S + i) * ldq + h * Dh;
  T di = T(0);
  for (int64_t e = 0; e < Dh; ++e) di += doi[e] * oi[e];
  D[(b * d.q_heads + h) * S + i] = di;
}

// The softmax backward of one score: p = exp(s scale - lse_i) recomputed,
// dS = p (dO_i · V_j - D_i) scale; p into s, dS into dp.
template <class T>
EXMY_HD void attn_tile_dscores(T* s, T* dp, const T* lse_i, const T* D_i, int64_t step, int n, T scale) {
  EXMY_TILE_LOOP
  for (int t = 0; t < kAttnRowTile; ++t)
    if (t < n) {
      s[t] = sim::hd_exp(s[t] * scale - lse_i[t * step]);
      dp[t] = s[t] * (dp[t] - D_i[t * step]) * scale;
    }
}

// Backward, thread (b, h, j): query head h's part of dK_j and dV_j, summed
// over its query rows i = S - 1 down to j, a tile at a time, from +0:
// dV_j += p_ij dO_i and dK_j += dS_ij Q_i, into dkp, dvp (B,S,Hq*Dh) at
// row j, head h.
template <class T>
EXMY_HD void attn_bwd_kv_row(T* dkp, T* dvp, const T* dout, const T* lse, const T* D, const T* q, const T* k,
                             const T* v, const AttnDims& d, int64_t b, int64_t h, int64_t j) {
  const int64_t S = d.seqlen, Dh = d.head_dim, Hq = d.q_heads, ldq = Hq * Dh, ldkv = d.kv_heads * Dh;
  const int64_t kvh = h / (Hq / d.kv_heads), row = (b * S + j) * ldkv + kvh * Dh;
  const T scale = attn_scale<T>(d);
  const T* qh = q + b * S * ldq + h * Dh;
  const T* doh = dout + b * S * ldq + h * Dh;
  const T* lse_h = lse + (b * Hq + h) * S;
  const T* D_h = D + (b * Hq + h) * S;
  T kr[kAttnRowMaxDim], vr[kAttnRowMaxDim], dkr[kAttnRowMaxDim], dvr[kAttnRowMaxDim];
  for (int64_t e = 0; e < Dh; ++e) kr[e] = k[row + e], vr[e] = v[row + e], dkr[e] = dvr[e] = T(0);
  for (int64_t i0 = S - 1; i0 >= j; i0 -= kAttnRowTile) {
    // The tile's rows are i0, i0 - 1, ..., i0 - n + 1 (a step of -1 row).
    const int n = static_cast<int>(attn_tile_rows(i0 + 1 - j));
    T s[kAttnRowTile], dp[kAttnRowTile];
    attn_tile_dots(s, kr, qh + i0 * ldq, dp, vr, doh + i0 * ldq, ldq, -1, n, Dh);
    attn_tile_dscores(s, dp, lse_h + i0, D_h + i0, -1, n, scale);
    attn_tile_axpy(dvr, s, doh + i0 * ldq, ldq, -1, n, Dh);
    attn_tile_axpy(dkr, dp, qh + i0 * ldq, ldq, -1, n, Dh);
  }
  const int64_t prow = (b * S + j) * ldq + h * Dh;
  for (int64_t e = 0; e < Dh; ++e) dkp[prow + e] = dkr[e], dvp[prow + e] = dvr[e];
}

// Backward, thread (b, j, kvh, e): dk and dv (B,S,Hkv*Dh) at row j, kv head
// kvh, column e += the parts of its query heads, in head order.
template <class T>
EXMY_HD void attn_bwd_kv_add(T* dk, T* dv, const T* dkp, const T* dvp, const AttnDims& d, int64_t b, int64_t j,
                             int64_t kvh, int64_t e) {
  const int64_t Dh = d.head_dim, rep = d.q_heads / d.kv_heads;
  const int64_t at = (b * d.seqlen + j) * d.kv_heads * Dh + kvh * Dh + e;
  const int64_t p0 = (b * d.seqlen + j) * d.q_heads * Dh + kvh * rep * Dh + e;
  T sk = dk[at], sv = dv[at];
  for (int64_t r = 0; r < rep; ++r) sk += dkp[p0 + r * Dh], sv += dvp[p0 + r * Dh];
  dk[at] = sk, dv[at] = sv;
}

// Backward, thread (b, h, i): dQ_i += sum over the keys j <= i, from 0 up,
// of dS_ij K_j, starting from what dq holds.
template <class T>
EXMY_HD void attn_bwd_q_row(T* dq, const T* dout, const T* lse, const T* D, const T* q, const T* k, const T* v,
                            const AttnDims& d, int64_t b, int64_t h, int64_t i) {
  const int64_t S = d.seqlen, Dh = d.head_dim, Hq = d.q_heads, ldq = Hq * Dh, ldkv = d.kv_heads * Dh;
  const int64_t kvh = h / (Hq / d.kv_heads), row = (b * S + i) * ldq + h * Dh, lrow = (b * Hq + h) * S + i;
  const T scale = attn_scale<T>(d);
  const T* kh = k + b * S * ldkv + kvh * Dh;
  const T* vh = v + b * S * ldkv + kvh * Dh;
  T qr[kAttnRowMaxDim], dor[kAttnRowMaxDim], dqr[kAttnRowMaxDim];
  for (int64_t e = 0; e < Dh; ++e) qr[e] = q[row + e], dor[e] = dout[row + e], dqr[e] = dq[row + e];
  for (int64_t j0 = 0; j0 <= i; j0 += kAttnRowTile) {
    const int n = static_cast<int>(attn_tile_rows(i + 1 - j0));
    T s[kAttnRowTile], dp[kAttnRowTile];
    attn_tile_dots(s, qr, kh + j0 * ldkv, dp, dor, vh + j0 * ldkv, ldkv, 1, n, Dh);
    attn_tile_dscores(s, dp, lse + lrow, D + lrow, 0, n, scale);
    attn_tile_axpy(dqr, dp, kh + j0 * ldkv, ldkv, 1, n, Dh);
  }
  for (int64_t e = 0; e < Dh; ++e) dq[row + e] = dqr[e];
}

}  // namespace exmy::models

#undef EXMY_TILE_LOOP

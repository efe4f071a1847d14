// The thread kernels of the chunked SSD scan (models/ssd.hpp): the
// per-thread work of the CUDA backend's parallel scan as plain EXMY_HD
// functions, one call per thread, launched by models/ssd_launches.hpp (on a
// device, and on the host in the emulation CI runs).
//
// Each thread owns one element (or one row) of an item's small products or
// elementwise steps (models/ssd_items.hpp), and sums over k in the order
// NaiveGemm (models/item_gemm.hpp) does: from +0 (or from the value being
// accumulated onto), k ascending, one rounding per multiply and per add.
// Terms the causal mask makes zero are skipped (which can change only the
// sign of an exact zero). So a thread computes the very operations of the
// one-thread-per-item kernels with NaiveGemm, and the results are those
// kernels' bits: within the FP32 budget of tests/models/test_ssd_cuda.cpp
// of the CPU, which also checks them against the item kernels with NaiveGemm
// bit for bit on the host.
//
// Threads (L = the chunk's length, P = head_dim, N = state; (b, q) a chunk,
// g a group, h a head; every write is the thread's own element):
//   forward  ssd_thr_acs          (b, h, q):       acs (cumsum of dt A) and W = exp(acs_last - acs)
//            ssd_thr_cb           (b, q, g, t, s): CB = C_t . B_s (s <= t)
//            ssd_thr_m_dm         (b, q, h, t, s): M = CB exp(acs_t - acs_s) (s <= t), no dM
//            ssd_thr_own_state    (b, q, h, p, n): the chunk's own end state, sum over s
//            ssd_thr_pass_states  (b, h, p, n):    the state entering each chunk, over the chunks in order
//            ssd_thr_output       (b, q, h, t, p): y = (M . dt x + exp(acs_t) C_t . state) + D x
//   backward ssd_thr_exp_acs      (b, h, t):       E = exp(acs), W as the forward's
//            ssd_thr_dstates      (b, q, h, p, n): dstates from the outputs, sum over t
//            ssd_thr_pass_dstates (b, h, p, n):    back through the state passing, last chunk first
//            ssd_thr_dlast        (b, h, q):       dlast = decay (dstates . states), over p n in order
//            ssd_thr_cb           (b, q, g, t, s): as the forward's
//            ssd_thr_m_dm         (b, q, h, t, s): M and dM = dy_t . (dt x)_s (s <= t)
//            ssd_thr_dcb          (b, q, g, t, s): dCB = sum over the group's heads of dM exp(..), in place of CB
//            ssd_thr_dx_row       (b, q, h, s):    row s of dx (and dXDT), ddt's dt x part, dw_s
//            ssd_thr_dacs         (b, q, h, t):    dacs_t, its terms in the item's order
//            ssd_thr_dacs_scan    (b, q, h):       ddt += the reverse cumsum of dacs times A; the partials pA, pD
//            ssd_thr_dc           (b, q, g, t, n): dC += the heads' parts in order, then dCB . B
//            ssd_thr_db           (b, q, g, s, n): dB += the heads' parts in order, then dCB^T . C
//   then ssd_bwd_param_sums (models/ssd_items.hpp), a thread per head.
//
// Scratch (models/ssd_launches.hpp lays it out): the forward CB per (b, q, g)
// and M per (b, q, h) (chunk^2 each) and W (B,H,T); the backward dstates,
// dlast, E and W, CB (then dCB), M and dM, dw and dacs (chunk per (b, q, h))
// and the partials pA, pD: nothing of chunk x head_dim per head, less than
// the item kernels' scratch (SsdThreadKernels.ScratchIsNoMoreThanTheItemKernels).
#pragma once

#include <cstdint>

#include "formats/format.hpp"  // EXMY_HD
#include "models/ssd.hpp"
#include "models/ssd_items.hpp"  // SsdChunk, ssd_chunk_of, ssd_chunk_decay
#include "sim/hd_math.hpp"

namespace exmy::models {

// ---- forward ----

// (b, h, q): acs over the chunk (the item's running sum) and W_t =
// exp(acs_last - acs_t) (B,H,T), the weight of token t in the chunk's end state.
template <class T>
EXMY_HD void ssd_thr_acs(T* acs, T* W, const T* dt, const T* A_log, const SsdDims& d, int64_t b, int64_t h,
                         int64_t q) {
  const int64_t S = d.seqlen, H = d.heads;
  const SsdChunk c = ssd_chunk_of(d, b, q);
  const int64_t row0 = b * S + c.t0;
  const T A = -sim::hd_exp(A_log[h]);
  T* ac = acs + (b * H + h) * S + c.t0;
  T run = 0;
  for (int64_t t = 0; t < c.len; ++t) {
    run += dt[(row0 + t) * H + h] * A;
    ac[t] = run;
  }
  T* w = W + (b * H + h) * S + c.t0;
  for (int64_t t = 0; t < c.len; ++t) w[t] = sim::hd_exp(ac[c.len - 1] - ac[t]);
}

// (b, q, g, t, s), s <= t: CB[t, s] = C_t . B_s over n in order. CB is the
// (b, q, g) item's (chunk x chunk) array, row stride chunk.
template <class T>
EXMY_HD void ssd_thr_cb(T* CB, const T* Bm, const T* Cm, int64_t ldbc, const SsdDims& d, int64_t b, int64_t q,
                        int64_t g, int64_t t, int64_t s) {
  const SsdChunk c = ssd_chunk_of(d, b, q);
  if (t >= c.len || s > t) return;
  const int64_t N = d.state, row0 = b * d.seqlen + c.t0;
  const T* Ct = Cm + (row0 + t) * ldbc + g * N;
  const T* Bs = Bm + (row0 + s) * ldbc + g * N;
  T v = 0;
  for (int64_t n = 0; n < N; ++n) v += Ct[n] * Bs[n];
  CB[t * d.chunk + s] = v;
}

// (b, q, h, t, s), s <= t: M[t, s] = CB[t, s] exp(acs_t - acs_s) (CB the
// head's group's), and with dy the gradient dM[t, s] = dy_t . (dt_s x_s)
// over p in order.
template <class T>
EXMY_HD void ssd_thr_m_dm(T* M, T* dM, const T* CB, const T* dy, const T* x, int64_t ldx, const T* dt,
                          const T* acs, const SsdDims& d, int64_t b, int64_t q, int64_t h, int64_t t, int64_t s) {
  const SsdChunk c = ssd_chunk_of(d, b, q);
  if (t >= c.len || s > t) return;
  const int64_t S = d.seqlen, H = d.heads, P = d.head_dim, Lm = d.chunk, row0 = b * S + c.t0;
  const T* ac = acs + (b * H + h) * S + c.t0;
  M[t * Lm + s] = CB[t * Lm + s] * sim::hd_exp(ac[t] - ac[s]);
  if (!dM) return;
  const T dts = dt[(row0 + s) * H + h];
  const T* dyt = dy + (row0 + t) * (H * P) + h * P;
  const T* xs = x + (row0 + s) * ldx + h * P;
  T v = 0;
  for (int64_t p = 0; p < P; ++p) v += dyt[p] * (dts * xs[p]);
  dM[t * Lm + s] = v;
}

// (b, q, h, p, n): the chunk's own end state sum_s (dt_s x_s W_s) B_s^T,
// over s in order, into states (B,Q,H,P,N).
template <class T>
EXMY_HD void ssd_thr_own_state(T* states, const T* x, int64_t ldx, const T* Bm, int64_t ldbc, const T* dt,
                               const T* W, const SsdDims& d, int64_t b, int64_t q, int64_t h, int64_t p, int64_t n) {
  const int64_t S = d.seqlen, H = d.heads, P = d.head_dim, N = d.state, g = h / (H / d.groups);
  const SsdChunk c = ssd_chunk_of(d, b, q);
  const int64_t row0 = b * S + c.t0;
  const T* w = W + (b * H + h) * S + c.t0;
  T v = 0;
  for (int64_t s = 0; s < c.len; ++s)
    v += (dt[(row0 + s) * H + h] * x[(row0 + s) * ldx + h * P + p]) * w[s] * Bm[(row0 + s) * ldbc + g * N + n];
  states[((b * d.chunks() + q) * H + h) * P * N + p * N + n] = v;
}

// (b, h, i) with i = p N + n: the item's state passing for one element;
// states[q] becomes the state entering chunk q.
template <class T>
EXMY_HD void ssd_thr_pass_states(T* states, const T* acs, const SsdDims& d, int64_t b, int64_t h, int64_t i) {
  const int64_t H = d.heads, PN = d.head_dim * d.state, Q = d.chunks();
  T cur = 0;
  for (int64_t q = 0; q < Q; ++q) {
    const T decay = ssd_chunk_decay(acs, d, b, q, h);
    T* st = states + ((b * Q + q) * H + h) * PN + i;
    const T own = *st;
    *st = cur;
    cur = decay * cur + own;
  }
}

// (b, q, h, t, p): y = (sum_{s <= t} M[t, s] dt_s x_s + exp(acs_t) C_t .
// state) + D x, the sums in order (the item's diagonal block, then its
// chunk output).
template <class T>
EXMY_HD void ssd_thr_output(T* y, const T* M, const T* x, int64_t ldx, const T* Cm, int64_t ldbc, const T* dt,
                            const T* D, const T* acs, const T* states, const SsdDims& d, int64_t b, int64_t q,
                            int64_t h, int64_t t, int64_t p) {
  const SsdChunk c = ssd_chunk_of(d, b, q);
  if (t >= c.len) return;
  const int64_t S = d.seqlen, H = d.heads, P = d.head_dim, N = d.state, g = h / (H / d.groups);
  const int64_t row0 = b * S + c.t0;
  const T* Mt = M + t * d.chunk;
  T diag = 0;
  for (int64_t s = 0; s <= t; ++s) diag += Mt[s] * (dt[(row0 + s) * H + h] * x[(row0 + s) * ldx + h * P + p]);
  const T* Ct = Cm + (row0 + t) * ldbc + g * N;
  const T* st = states + ((b * d.chunks() + q) * H + h) * P * N + p * N;
  T off = 0;
  for (int64_t n = 0; n < N; ++n) off += Ct[n] * st[n];
  const T e = sim::hd_exp(acs[(b * H + h) * S + c.t0 + t]);
  y[(row0 + t) * (H * P) + h * P + p] = (diag + e * off) + D[h] * x[(row0 + t) * ldx + h * P + p];
}

// ---- backward ----

// (b, h, t): E = exp(acs_t) and W = exp(acs_last - acs_t) (B,H,T), acs_last
// the last of t's chunk (as ssd_thr_acs's W).
template <class T>
EXMY_HD void ssd_thr_exp_acs(T* E, T* W, const T* acs, const SsdDims& d, int64_t b, int64_t h, int64_t t) {
  const SsdChunk c = ssd_chunk_of(d, b, t / d.chunk);
  const T* ac = acs + (b * d.heads + h) * d.seqlen;
  const int64_t i = (b * d.heads + h) * d.seqlen + t;
  E[i] = sim::hd_exp(ac[t]);
  W[i] = sim::hd_exp(ac[c.t0 + c.len - 1] - ac[t]);
}

// (b, q, h, p, n): dstates = sum_t (dy_t E_t) C_t^T over t in order (the
// gradient of the state entering chunk q from the chunk's outputs).
template <class T>
EXMY_HD void ssd_thr_dstates(T* dstates, const T* dy, const T* Cm, int64_t ldbc, const T* E, const SsdDims& d,
                             int64_t b, int64_t q, int64_t h, int64_t p, int64_t n) {
  const int64_t S = d.seqlen, H = d.heads, P = d.head_dim, N = d.state, g = h / (H / d.groups);
  const SsdChunk c = ssd_chunk_of(d, b, q);
  const int64_t row0 = b * S + c.t0;
  const T* e = E + (b * H + h) * S + c.t0;
  T v = 0;
  for (int64_t t = 0; t < c.len; ++t)
    v += (dy[(row0 + t) * (H * P) + h * P + p] * e[t]) * Cm[(row0 + t) * ldbc + g * N + n];
  dstates[((b * d.chunks() + q) * H + h) * P * N + p * N + n] = v;
}

// (b, h, i) with i = p N + n: back through the state passing for one
// element, last chunk first; dstates[q] becomes the gradient of chunk q's
// own end state (the item's `next` as it reaches chunk q).
template <class T>
EXMY_HD void ssd_thr_pass_dstates(T* dstates, const T* acs, const SsdDims& d, int64_t b, int64_t h, int64_t i) {
  const int64_t H = d.heads, PN = d.head_dim * d.state, Q = d.chunks();
  T next = 0;
  for (int64_t q = Q - 1; q >= 0; --q) {
    const T decay = ssd_chunk_decay(acs, d, b, q, h);
    T* ds = dstates + ((b * Q + q) * H + h) * PN + i;
    const T own = *ds;
    *ds = next;
    next = own + decay * next;
  }
}

// (b, h, q): dlast (B,H,Q) = decay (dstates[q] . states[q]) over p n in
// order, after the pass above (dstates[q] is then the item's `next`).
template <class T>
EXMY_HD void ssd_thr_dlast(T* dlast, const T* dstates, const T* acs, const T* states, const SsdDims& d, int64_t b,
                           int64_t h, int64_t q) {
  const int64_t H = d.heads, PN = d.head_dim * d.state, Q = d.chunks();
  const T* ds = dstates + ((b * Q + q) * H + h) * PN;
  const T* hin = states + ((b * Q + q) * H + h) * PN;
  T dot = 0;
  for (int64_t i = 0; i < PN; ++i) dot += ds[i] * hin[i];
  dlast[(b * H + h) * Q + q] = ssd_chunk_decay(acs, d, b, q, h) * dot;
}

// dCB[t, s] of chunk c, s <= t: sum over group g's heads in order of dM[t,
// s] exp(acs_t - acs_s), from +0 (the item's order). dM the first head's
// (chunk x chunk) array, heads `hstride` apart.
template <class T>
EXMY_HD T ssd_dcb_value(const T* dM, int64_t hstride, const T* acs, const SsdDims& d, const SsdChunk& c, int64_t g,
                        int64_t t, int64_t s) {
  const int64_t S = d.seqlen, H = d.heads, hpg = H / d.groups, Lm = d.chunk;
  T v = 0;
  for (int64_t k = 0; k < hpg; ++k) {
    const T* ac = acs + (c.b * H + g * hpg + k) * S + c.t0;
    v += dM[k * hstride + t * Lm + s] * sim::hd_exp(ac[t] - ac[s]);
  }
  return v;
}

// (b, q, g, t, s), s <= t: dCB[t, s] = sum over the group's heads in order
// of dM[t, s] exp(acs_t - acs_s), written over CB (which the heads' M hold
// by now). dM the first head's array of the group, heads `hstride` apart.
template <class T>
EXMY_HD void ssd_thr_dcb(T* CB, const T* dM, int64_t hstride, const T* acs, const SsdDims& d, int64_t b, int64_t q,
                         int64_t g, int64_t t, int64_t s) {
  const SsdChunk c = ssd_chunk_of(d, b, q);
  if (t >= c.len || s > t) return;
  CB[t * d.chunk + s] = ssd_dcb_value(dM, hstride, acs, d, c, g, t, s);
}

// (b, q, h, s): row s of the head's dXDT = W_s (B_s . dS) + sum_{t >= s}
// M[t, s] dy_t, element by element in p order, and with it dx_s += D dy_s,
// then += dt_s dXDT_s; ddt_s += x_s . dXDT_s; and dw[s] = (dt_s x_s) . (B_s
// . dS), dS the gradient of the chunk's own end state.
template <class T>
EXMY_HD void ssd_thr_dx_row(T* dx, T* ddt, T* dw, const T* M, const T* dy, const T* x, int64_t ldx, const T* Bm,
                            int64_t ldbc, const T* dt, const T* D, const T* W, const T* dstates, const SsdDims& d,
                            int64_t b, int64_t q, int64_t h, int64_t s) {
  const SsdChunk c = ssd_chunk_of(d, b, q);
  if (s >= c.len) return;
  const int64_t S = d.seqlen, H = d.heads, P = d.head_dim, N = d.state, g = h / (H / d.groups), Lm = d.chunk;
  const int64_t row0 = b * S + c.t0, ldy = H * P;
  const T* Bs = Bm + (row0 + s) * ldbc + g * N;
  const T* dS = dstates + ((b * d.chunks() + q) * H + h) * P * N;
  const T* xs = x + (row0 + s) * ldx + h * P;
  const T* dys = dy + (row0 + s) * ldy + h * P;
  T* dxs = dx + (row0 + s) * ldx + h * P;
  const T dts = dt[(row0 + s) * H + h], ws = W[(b * H + h) * S + c.t0 + s];
  T dwv = 0, dd = 0;
  for (int64_t p = 0; p < P; ++p) {
    T tmp = 0;
    for (int64_t n = 0; n < N; ++n) tmp += Bs[n] * dS[p * N + n];
    dwv += (dts * xs[p]) * tmp;
    T dX = ws * tmp;
    for (int64_t t = s; t < c.len; ++t) dX += M[t * Lm + s] * dy[(row0 + t) * ldy + h * P + p];
    dxs[p] += D[h] * dys[p];
    dxs[p] += dts * dX;
    dd += xs[p] * dX;
  }
  ddt[(row0 + s) * H + h] += dd;
  dw[s] = dwv;
}

// dacs_t of head h in chunk c from st = dy_t . (C_t hin) (the incoming
// state's dot), its terms added in the order the item adds them
// (ssd_bwd_chunk_head: the incoming state's exp(acs_t) st, the own end
// state's dw_s W_s, dlast, then the diagonal block's row t and column t).
// M and dM the head's (chunk x chunk) arrays, dw the head's (chunk).
//
// ssd_dacs_outer is its part before the diagonal block's (the terms of the
// incoming and the own end state and dlast), which the fused diagonal
// kernels (models/ssd_fused_bwd.hpp) complete with their row and column sums.
template <class T>
EXMY_HD T ssd_dacs_outer(T st, const T* dw, const T* E, const T* W, const T* dlast, const SsdDims& d,
                         const SsdChunk& c, int64_t h, int64_t t) {
  const int64_t S = d.seqlen, H = d.heads, last = c.len - 1;
  const T* w = W + (c.b * H + h) * S + c.t0;
  T v = 0;
  v += E[(c.b * H + h) * S + c.t0 + t] * st;
  // (c) The own end state: + dw_s W_s for every s at the last token, - at t.
  for (int64_t s = 0; s < c.len; ++s) {
    if (t == last) v += dw[s] * w[s];
    if (s == t) v -= dw[s] * w[s];
  }
  if (t == last) v += dlast[(c.b * H + h) * d.chunks() + c.q];
  return v;
}
template <class T>
EXMY_HD T ssd_dacs_value(T st, const T* M, const T* dM, const T* dw, const T* E, const T* W, const T* dlast,
                         const SsdDims& d, const SsdChunk& c, int64_t h, int64_t t) {
  const int64_t Lm = d.chunk;
  T v = ssd_dacs_outer(st, dw, E, W, dlast, d, c, h, t);
  // (d) The diagonal block: + row t, - column t.
  for (int64_t s = 0; s <= t; ++s) {
    v += dM[t * Lm + s] * M[t * Lm + s];
    if (s == t) v -= dM[t * Lm + t] * M[t * Lm + t];
  }
  for (int64_t u = t + 1; u < c.len; ++u) v -= dM[u * Lm + t] * M[u * Lm + t];
  return v;
}

// (b, q, h, t): dacs_t, its terms added in the order the item adds them
// (ssd_bwd_chunk_head: the incoming state's, the own end state's, dlast,
// then the diagonal block's row t and column t), into dacs (chunk).
template <class T>
EXMY_HD void ssd_thr_dacs(T* dacs, const T* M, const T* dM, const T* dw, const T* dy, const T* Cm, int64_t ldbc,
                          const T* E, const T* W, const T* states, const T* dlast, const SsdDims& d, int64_t b,
                          int64_t q, int64_t h, int64_t t) {
  const SsdChunk c = ssd_chunk_of(d, b, q);
  if (t >= c.len) return;
  const int64_t S = d.seqlen, H = d.heads, P = d.head_dim, N = d.state, g = h / (H / d.groups);
  const int64_t row0 = b * S + c.t0, Q = d.chunks();
  const T* hin = states + ((b * Q + q) * H + h) * P * N;
  const T* Ct = Cm + (row0 + t) * ldbc + g * N;
  const T* dyt = dy + (row0 + t) * (H * P) + h * P;
  // (b) The incoming state: exp(acs_t) dy_t . (C_t hin).
  T st = 0;
  for (int64_t p = 0; p < P; ++p) {
    T tmp = 0;
    for (int64_t n = 0; n < N; ++n) tmp += Ct[n] * hin[p * N + n];
    st += dyt[p] * tmp;
  }
  dacs[t] = ssd_dacs_value(st, M, dM, dw, E, W, dlast, d, c, h, t);
}

// (b, q, h): the reverse cumulative sum of dacs into ddt (times A), and the
// head's partial gradients of A_log and D (pA, pD: (B,Q,H)).
template <class T>
EXMY_HD void ssd_thr_dacs_scan(T* ddt, T* pA, T* pD, const T* dacs, const T* dy, const T* x, int64_t ldx,
                               const T* dt, const T* A_log, const SsdDims& d, int64_t b, int64_t q, int64_t h) {
  const SsdChunk c = ssd_chunk_of(d, b, q);
  const int64_t S = d.seqlen, H = d.heads, P = d.head_dim, row0 = b * S + c.t0, ldy = H * P;
  const T A = -sim::hd_exp(A_log[h]);
  T dDh = 0;
  for (int64_t t = 0; t < c.len; ++t)
    for (int64_t p = 0; p < P; ++p) dDh += dy[(row0 + t) * ldy + h * P + p] * x[(row0 + t) * ldx + h * P + p];
  T run = 0, dA = 0;
  for (int64_t s = c.len - 1; s >= 0; --s) {
    run += dacs[s];
    const T dts = dt[(row0 + s) * H + h];
    ddt[(row0 + s) * H + h] += run * A;
    dA += run * dts;
  }
  const int64_t part = (b * d.chunks() + q) * H + h;
  pA[part] = dA * A;
  pD[part] = dDh;
}

// (b, q, g, t, n): dC_t[n] += (sum over the group's heads in order of
// (dy_t E_t) . hin[:, n], then sum_{s <= t} dCB[t, s] B_s[n]).
template <class T>
EXMY_HD void ssd_thr_dc(T* dC, const T* dCB, const T* dy, const T* Bm, int64_t ldbc, const T* E, const T* states,
                        const SsdDims& d, int64_t b, int64_t q, int64_t g, int64_t t, int64_t n) {
  const SsdChunk c = ssd_chunk_of(d, b, q);
  if (t >= c.len) return;
  const int64_t S = d.seqlen, H = d.heads, P = d.head_dim, N = d.state, hpg = H / d.groups, Q = d.chunks();
  const int64_t row0 = b * S + c.t0;
  T v = 0;
  for (int64_t h = g * hpg; h < (g + 1) * hpg; ++h) {
    const T e = E[(b * H + h) * S + c.t0 + t];
    const T* dyt = dy + (row0 + t) * (H * P) + h * P;
    const T* hin = states + ((b * Q + q) * H + h) * P * N + n;
    for (int64_t p = 0; p < P; ++p) v += (dyt[p] * e) * hin[p * N];
  }
  for (int64_t s = 0; s <= t; ++s) v += dCB[t * d.chunk + s] * Bm[(row0 + s) * ldbc + g * N + n];
  dC[(row0 + t) * ldbc + g * N + n] += v;
}

// (b, q, g, s, n): dB_s[n] += (sum over the group's heads in order of
// (W_s dt_s x_s) . dS[:, n], then sum_{t >= s} dCB[t, s] C_t[n]).
template <class T>
EXMY_HD void ssd_thr_db(T* dB, const T* dCB, const T* x, int64_t ldx, const T* Cm, int64_t ldbc, const T* dt,
                        const T* W, const T* dstates, const SsdDims& d, int64_t b, int64_t q, int64_t g, int64_t s,
                        int64_t n) {
  const SsdChunk c = ssd_chunk_of(d, b, q);
  if (s >= c.len) return;
  const int64_t S = d.seqlen, H = d.heads, P = d.head_dim, N = d.state, hpg = H / d.groups, Q = d.chunks();
  const int64_t row0 = b * S + c.t0;
  T v = 0;
  for (int64_t h = g * hpg; h < (g + 1) * hpg; ++h) {
    const T ws = W[(b * H + h) * S + c.t0 + s], dts = dt[(row0 + s) * H + h];
    const T* xs = x + (row0 + s) * ldx + h * P;
    const T* dS = dstates + ((b * Q + q) * H + h) * P * N + n;
    for (int64_t p = 0; p < P; ++p) v += (ws * (dts * xs[p])) * dS[p * N];
  }
  for (int64_t t = s; t < c.len; ++t) v += dCB[t * d.chunk + s] * Cm[(row0 + t) * ldbc + g * N + n];
  dB[(row0 + s) * ldbc + g * N + n] += v;
}

}  // namespace exmy::models

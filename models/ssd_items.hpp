// The work items of the chunked SSD scan (models/ssd.hpp) as plain EXMY_HD
// (host + device) functions: the CPU's OpenMP loops in models/ssd.cpp call
// them, one call per item, and so do the item launches of
// models/ssd_launches.hpp (one thread per item), which the emulated device
// backend runs, so both run the same operations in the same order
// (docs/architecture.md, "CPU and GPU share code"). A CUDA device runs the
// same operations split into thread kernels (models/ssd_threads.hpp).
//
// The small products inside an item go through a GEMM functor `gemm`
// (models/item_gemm.hpp): SerialGemm on the CPU and in the host emulation;
// with NaiveGemm the items compute what the thread kernels do, bit for bit,
// and on test::RunErr their FP32 budget (tests/models/test_ssd_cuda.cpp).
//
// Items and scratch (every pointer is the item's own; L = the chunk's length
// Lc, P = head_dim, N = state):
//   forward  1. ssd_fwd_chunk_group  (b, q, g): acs, diagonal-block y, own end states;
//                                    scratch CB, M (L*L), XDT (L*P)
//            2. ssd_fwd_pass_states  (b, h):    states[q] := state entering chunk q; cur (P*N)
//            3. ssd_fwd_chunk_output (b, q, h): y += exp(acs) C state + D x; off (L*P)
//   backward 1. ssd_bwd_dstates_from_outputs (b, q, h): dye (L*P)
//            2. ssd_bwd_dstates_passing      (b, h):    next (P*N)
//            3. ssd_bwd_chunk_group          (b, q, g): SsdGroupScratch
//            4. ssd_bwd_param_sums           (h):       dA_log[h], dD[h] += partials in (b, q) order
#pragma once

#include <cstdint>

#include "formats/format.hpp"  // EXMY_HD
#include "models/item_gemm.hpp"
#include "models/ssd.hpp"
#include "sim/hd_math.hpp"

namespace exmy::models {

// One (b, chunk q): its first token and length (the last chunk may be short).
struct SsdChunk {
  int64_t b, q, t0, len;
};

EXMY_HD SsdChunk ssd_chunk_of(const SsdDims& d, int64_t b, int64_t q) {
  const int64_t t0 = q * d.chunk;
  const int64_t left = d.seqlen - t0;
  return {b, q, t0, d.chunk < left ? d.chunk : left};
}

// Forward 1, item (b, q, g): for each head of group g, acs (the chunk's
// cumulative sums of dt A), the diagonal-block output y = (C B^T ∘
// exp(acs_t - acs_s), causal) · (dt x), and the chunk's own end state
// sum_s exp(acs_last - acs_s) dt_s x_s B_s^T into states.
template <class T, class Gemm>
EXMY_HD void ssd_fwd_chunk_group(const Gemm& gemm, T* y, T* acs, T* states, const T* x, int64_t ldx, const T* Bm,
                                 const T* Cm, int64_t ldbc, const T* dt, const T* A_log, const SsdDims& d, int64_t b,
                                 int64_t q, int64_t g, T* CB, T* M, T* XDT) {
  const int64_t S = d.seqlen, H = d.heads, P = d.head_dim, N = d.state, Q = d.chunks();
  const int64_t hpg = H / d.groups, ldy = H * P, PN = P * N;
  const SsdChunk c = ssd_chunk_of(d, b, q);
  const int64_t Lc = c.len, row0 = c.b * S + c.t0;
  const T* Cg = Cm + row0 * ldbc + g * N;
  const T* Bg = Bm + row0 * ldbc + g * N;
  gemm(CB, Lc, Cg, ldbc, sim::Op::N, Bg, ldbc, sim::Op::T, Lc, Lc, N, false);
  for (int64_t h = g * hpg; h < (g + 1) * hpg; ++h) {
    const T A = -sim::hd_exp(A_log[h]);
    T* ac = acs + (c.b * H + h) * S + c.t0;
    T run = 0;
    for (int64_t t = 0; t < Lc; ++t) {
      run += dt[(row0 + t) * H + h] * A;
      ac[t] = run;
    }
    const T* xh = x + row0 * ldx + h * P;
    for (int64_t t = 0; t < Lc; ++t) {
      const T dtt = dt[(row0 + t) * H + h];
      for (int64_t p = 0; p < P; ++p) XDT[t * P + p] = dtt * xh[t * ldx + p];
    }
    for (int64_t t = 0; t < Lc; ++t)
      for (int64_t s = 0; s < Lc; ++s) M[t * Lc + s] = s <= t ? CB[t * Lc + s] * sim::hd_exp(ac[t] - ac[s]) : T(0);
    gemm(y + row0 * ldy + h * P, ldy, M, Lc, sim::Op::N, XDT, P, sim::Op::N, Lc, P, Lc, false);
    for (int64_t s = 0; s < Lc; ++s) {
      const T w = sim::hd_exp(ac[Lc - 1] - ac[s]);
      for (int64_t p = 0; p < P; ++p) XDT[s * P + p] *= w;
    }
    T* st = states + ((c.b * Q + c.q) * H + h) * PN;
    gemm(st, N, XDT, P, sim::Op::T, Bg, ldbc, sim::Op::N, P, N, Lc, false);
  }
}

// The decay of chunk q of (b, h) over its whole length: exp(acs_last).
template <class T>
EXMY_HD T ssd_chunk_decay(const T* acs, const SsdDims& d, int64_t b, int64_t q, int64_t h) {
  const SsdChunk c = ssd_chunk_of(d, b, q);
  return sim::hd_exp(acs[(b * d.heads + h) * d.seqlen + c.t0 + c.len - 1]);
}

// Forward 2, item (b, h): passes the states along the chunks, sequentially;
// states[q] becomes the state entering chunk q (zero for the first).
template <class T>
EXMY_HD void ssd_fwd_pass_states(T* states, const T* acs, const SsdDims& d, int64_t b, int64_t h, T* cur) {
  const int64_t H = d.heads, PN = d.head_dim * d.state, Q = d.chunks();
  for (int64_t i = 0; i < PN; ++i) cur[i] = T(0);
  for (int64_t q = 0; q < Q; ++q) {
    const T decay = ssd_chunk_decay(acs, d, b, q, h);
    T* st = states + ((b * Q + q) * H + h) * PN;
    for (int64_t i = 0; i < PN; ++i) {
      const T own = st[i];
      st[i] = cur[i];
      cur[i] = decay * cur[i] + own;
    }
  }
}

// Forward 3, item (b, q, h): y += exp(acs_t) (C_t · state entering the
// chunk), then the D skip.
template <class T, class Gemm>
EXMY_HD void ssd_fwd_chunk_output(const Gemm& gemm, T* y, const T* x, int64_t ldx, const T* Cm, int64_t ldbc,
                                  const T* D, const T* acs, const T* states, const SsdDims& d, int64_t b, int64_t q,
                                  int64_t h, T* off) {
  const int64_t S = d.seqlen, H = d.heads, P = d.head_dim, N = d.state, Q = d.chunks();
  const int64_t ldy = H * P, PN = P * N, g = h / (H / d.groups);
  const SsdChunk c = ssd_chunk_of(d, b, q);
  const int64_t Lc = c.len, row0 = c.b * S + c.t0;
  const T* Cg = Cm + row0 * ldbc + g * N;
  const T* st = states + ((c.b * Q + c.q) * H + h) * PN;
  const T* ac = acs + (c.b * H + h) * S + c.t0;
  const T* xh = x + row0 * ldx + h * P;
  T* yh = y + row0 * ldy + h * P;
  gemm(off, P, Cg, ldbc, sim::Op::N, st, N, sim::Op::T, Lc, P, N, false);
  for (int64_t t = 0; t < Lc; ++t) {
    const T e = sim::hd_exp(ac[t]);
    for (int64_t p = 0; p < P; ++p) yh[t * ldy + p] = (yh[t * ldy + p] + e * off[t * P + p]) + D[h] * xh[t * ldx + p];
  }
}

// Backward 1, item (b, q, h): the gradient of the state entering chunk q
// from the chunk's outputs, sum_t exp(acs_t) dy_t C_t^T. dstates (B,Q,H,P,N).
template <class T, class Gemm>
EXMY_HD void ssd_bwd_dstates_from_outputs(const Gemm& gemm, T* dstates, const T* dy, const T* Cm, int64_t ldbc,
                                          const T* acs, const SsdDims& d, int64_t b, int64_t q, int64_t h, T* dye) {
  const int64_t S = d.seqlen, H = d.heads, P = d.head_dim, N = d.state, Q = d.chunks();
  const int64_t ldy = H * P, PN = P * N, g = h / (H / d.groups);
  const SsdChunk c = ssd_chunk_of(d, b, q);
  const int64_t Lc = c.len, row0 = c.b * S + c.t0;
  const T* ac = acs + (c.b * H + h) * S + c.t0;
  const T* dyh = dy + row0 * ldy + h * P;
  for (int64_t t = 0; t < Lc; ++t) {
    const T e = sim::hd_exp(ac[t]);
    for (int64_t p = 0; p < P; ++p) dye[t * P + p] = dyh[t * ldy + p] * e;
  }
  gemm(dstates + ((c.b * Q + c.q) * H + h) * PN, N, dye, P, sim::Op::T, Cm + row0 * ldbc + g * N, ldbc, sim::Op::N, P,
       N, Lc, false);
}

// Backward 2, item (b, h): back through the state passing, last chunk
// first. dstates[q] becomes the gradient of chunk q's own end-state
// contribution; dlast (B,H,Q) the gradient of the chunk's total decay
// exp(acs_last) through the passed state.
template <class T>
EXMY_HD void ssd_bwd_dstates_passing(T* dstates, T* dlast, const T* acs, const T* states, const SsdDims& d, int64_t b,
                                     int64_t h, T* next) {
  const int64_t H = d.heads, PN = d.head_dim * d.state, Q = d.chunks();
  for (int64_t i = 0; i < PN; ++i) next[i] = T(0);
  for (int64_t q = Q - 1; q >= 0; --q) {
    const T decay = ssd_chunk_decay(acs, d, b, q, h);
    T* ds = dstates + ((b * Q + q) * H + h) * PN;
    const T* hin = states + ((b * Q + q) * H + h) * PN;
    T dot = 0;
    for (int64_t i = 0; i < PN; ++i) dot += next[i] * hin[i];
    dlast[(b * H + h) * Q + q] = decay * dot;
    for (int64_t i = 0; i < PN; ++i) {
      const T own = ds[i];
      ds[i] = next[i];
      next[i] = own + decay * next[i];
    }
  }
}

// Backward 3's scratch for one (b, q, g) item of L = Lc tokens.
template <class T>
struct SsdGroupScratch {
  T *CB, *M, *Lm, *dM, *dCB;   // (L,L)
  T *XDT, *dXDT, *tmp, *dye;   // (L,P)
  T *dCg, *dBg;                // (L,N)
  T* dacs;                     // (L)
};

// Elements of one SsdGroupScratch for chunks of up to L tokens, and its
// arrays carved from p in the order of the struct, each padded by item_pad
// (models/item_gemm.hpp: 64-byte alignment, as the CPU's buffers).
EXMY_HD int64_t ssd_group_scratch_size(int64_t L, int64_t P, int64_t N) {
  return 5 * item_pad(L * L) + 4 * item_pad(L * P) + 2 * item_pad(L * N) + item_pad(L);
}
template <class T>
EXMY_HD SsdGroupScratch<T> ssd_group_scratch(T* p, int64_t L, int64_t P, int64_t N) {
  SsdGroupScratch<T> w;
  T** arrays[] = {&w.CB, &w.M, &w.Lm, &w.dM, &w.dCB, &w.XDT, &w.dXDT, &w.tmp, &w.dye, &w.dCg, &w.dBg, &w.dacs};
  const int64_t sizes[] = {L * L, L * L, L * L, L * L, L * L, L * P, L * P, L * P, L * P, L * N, L * N, L};
  for (int i = 0; i < 12; ++i) {
    *arrays[i] = p;
    p += item_pad(sizes[i]);
  }
  return w;
}

// Backward 3 for head h of chunk c: dx and ddt +=, w.dCg, w.dBg and w.dCB +=
// (the group's, summed over its heads in order), and the head's partial
// gradients of A_log (*pA) and D (*pD). w.CB holds C B^T of the group.
template <class T, class Gemm>
EXMY_HD void ssd_bwd_chunk_head(const Gemm& gemm, const SsdGroupScratch<T>& w, T* dx, T* ddt, T* pA, T* pD,
                                const T* dy, const T* x, int64_t ldx, const T* Bg, const T* Cg, int64_t ldbc,
                                const T* dt, const T* A_log, const T* D, const T* acs, const T* states,
                                const T* dstates, const T* dlast, const SsdChunk& c, int64_t h, const SsdDims& d) {
  const int64_t S = d.seqlen, H = d.heads, P = d.head_dim, N = d.state, Q = d.chunks();
  const int64_t ldy = H * P, PN = P * N, Lc = c.len, row0 = c.b * S + c.t0;
  T *CB = w.CB, *M = w.M, *Lm = w.Lm, *dM = w.dM, *dCB = w.dCB;
  T *XDT = w.XDT, *dXDT = w.dXDT, *tmp = w.tmp, *dye = w.dye, *dacs = w.dacs;
  const T A = -sim::hd_exp(A_log[h]);
  const T* ac = acs + (c.b * H + h) * S + c.t0;
  const T* xh = x + row0 * ldx + h * P;
  const T* dyh = dy + row0 * ldy + h * P;
  T* dxh = dx + row0 * ldx + h * P;
  const T* hin = states + ((c.b * Q + c.q) * H + h) * PN;
  const T* dS = dstates + ((c.b * Q + c.q) * H + h) * PN;
  for (int64_t t = 0; t < Lc; ++t) dacs[t] = T(0);
  for (int64_t i = 0; i < Lc * P; ++i) dXDT[i] = T(0);
  for (int64_t t = 0; t < Lc; ++t) {
    const T dtt = dt[(row0 + t) * H + h];
    for (int64_t p = 0; p < P; ++p) XDT[t * P + p] = dtt * xh[t * ldx + p];
  }

  // (a) D skip: y_t += D x_t.
  T dDh = 0;
  for (int64_t t = 0; t < Lc; ++t)
    for (int64_t p = 0; p < P; ++p) {
      dDh += dyh[t * ldy + p] * xh[t * ldx + p];
      dxh[t * ldx + p] += D[h] * dyh[t * ldy + p];
    }

  // (b) Incoming state: y_t += exp(acs_t) (hin C_t).
  gemm(tmp, P, Cg, ldbc, sim::Op::N, hin, N, sim::Op::T, Lc, P, N, false);
  for (int64_t t = 0; t < Lc; ++t) {
    const T e = sim::hd_exp(ac[t]);
    T s = 0;
    for (int64_t p = 0; p < P; ++p) {
      s += dyh[t * ldy + p] * tmp[t * P + p];
      dye[t * P + p] = dyh[t * ldy + p] * e;
    }
    dacs[t] += e * s;
  }
  gemm(w.dCg, N, dye, P, sim::Op::N, hin, N, sim::Op::N, Lc, N, P, true);

  // (c) Own end state: S = sum_s w_s xdt_s B_s^T, w_s = exp(acs_last - acs_s).
  gemm(tmp, P, Bg, ldbc, sim::Op::N, dS, N, sim::Op::T, Lc, P, N, false);  // (dS B_s)^T per row
  for (int64_t s = 0; s < Lc; ++s) {
    const T ws = sim::hd_exp(ac[Lc - 1] - ac[s]);
    T dw = 0;
    for (int64_t p = 0; p < P; ++p) {
      dw += XDT[s * P + p] * tmp[s * P + p];
      dXDT[s * P + p] += ws * tmp[s * P + p];
      dye[s * P + p] = ws * XDT[s * P + p];  // reuse dye as w_s xdt_s
    }
    dacs[Lc - 1] += dw * ws;
    dacs[s] -= dw * ws;
  }
  gemm(w.dBg, N, dye, P, sim::Op::N, dS, N, sim::Op::N, Lc, N, P, true);
  dacs[Lc - 1] += dlast[(c.b * H + h) * Q + c.q];

  // (d) Diagonal block: y = M · XDT, M = CB ∘ Lm, Lm[t,s] = exp(acs_t - acs_s) (s <= t).
  for (int64_t t = 0; t < Lc; ++t)
    for (int64_t s = 0; s < Lc; ++s) {
      const T l = s <= t ? sim::hd_exp(ac[t] - ac[s]) : T(0);
      Lm[t * Lc + s] = l;
      M[t * Lc + s] = CB[t * Lc + s] * l;
    }
  gemm(dM, Lc, dyh, ldy, sim::Op::N, XDT, P, sim::Op::T, Lc, Lc, P, false);
  gemm(dXDT, P, M, Lc, sim::Op::T, dyh, ldy, sim::Op::N, Lc, P, Lc, true);
  for (int64_t t = 0; t < Lc; ++t)
    for (int64_t s = 0; s <= t; ++s) {
      const T gm = dM[t * Lc + s];
      const T e = gm * M[t * Lc + s];
      dacs[t] += e;
      dacs[s] -= e;
      dCB[t * Lc + s] += gm * Lm[t * Lc + s];
    }

  // (e) XDT = dt x.
  for (int64_t t = 0; t < Lc; ++t) {
    const T dtt = dt[(row0 + t) * H + h];
    T s = 0;
    for (int64_t p = 0; p < P; ++p) {
      dxh[t * ldx + p] += dtt * dXDT[t * P + p];
      s += xh[t * ldx + p] * dXDT[t * P + p];
    }
    ddt[(row0 + t) * H + h] += s;
  }

  // (f) acs = cumsum(dt A): the gradient of each term is the reverse
  //     cumulative sum of dacs.
  T run = 0, dA = 0;
  for (int64_t s = Lc - 1; s >= 0; --s) {
    run += dacs[s];
    const T dtt = dt[(row0 + s) * H + h];
    ddt[(row0 + s) * H + h] += run * A;
    dA += run * dtt;
  }
  *pA = dA * A;  // dA/dA_log = A
  *pD = dDh;
}

// Backward 3, item (b, q, g): everything inside chunk q for the heads of
// group g, in head order; their B and C gradients are summed in that order
// and added to dB and dC; the per-head gradients of A_log and D go to the
// partials pA, pD (B,Q,H).
template <class T, class Gemm>
EXMY_HD void ssd_bwd_chunk_group(const Gemm& gemm, const SsdGroupScratch<T>& w, T* dx, T* dB, T* dC, T* ddt, T* pA,
                                 T* pD, const T* dy, const T* x, int64_t ldx, const T* Bm, const T* Cm, int64_t ldbc,
                                 const T* dt, const T* A_log, const T* D, const T* acs, const T* states,
                                 const T* dstates, const T* dlast, const SsdDims& d, int64_t b, int64_t q, int64_t g) {
  const int64_t S = d.seqlen, H = d.heads, N = d.state, Q = d.chunks(), hpg = H / d.groups;
  const SsdChunk c = ssd_chunk_of(d, b, q);
  const int64_t Lc = c.len, row0 = c.b * S + c.t0;
  const T* Cg = Cm + row0 * ldbc + g * N;
  const T* Bg = Bm + row0 * ldbc + g * N;
  for (int64_t i = 0; i < Lc * Lc; ++i) w.dCB[i] = T(0);
  for (int64_t i = 0; i < Lc * N; ++i) w.dCg[i] = w.dBg[i] = T(0);
  gemm(w.CB, Lc, Cg, ldbc, sim::Op::N, Bg, ldbc, sim::Op::T, Lc, Lc, N, false);
  for (int64_t h = g * hpg; h < (g + 1) * hpg; ++h) {
    const int64_t part = (c.b * Q + c.q) * H + h;
    ssd_bwd_chunk_head(gemm, w, dx, ddt, pA + part, pD + part, dy, x, ldx, Bg, Cg, ldbc, dt, A_log, D, acs, states,
                       dstates, dlast, c, h, d);
  }
  // C B^T is shared by the group's heads: one GEMM pair for all of them.
  gemm(w.dCg, N, w.dCB, Lc, sim::Op::N, Bg, ldbc, sim::Op::N, Lc, N, Lc, true);
  gemm(w.dBg, N, w.dCB, Lc, sim::Op::T, Cg, ldbc, sim::Op::N, Lc, N, Lc, true);
  for (int64_t t = 0; t < Lc; ++t)
    for (int64_t n = 0; n < N; ++n) {
      dC[(row0 + t) * ldbc + g * N + n] += w.dCg[t * N + n];
      dB[(row0 + t) * ldbc + g * N + n] += w.dBg[t * N + n];
    }
}

// Backward 4, item h: dA_log[h] and dD[h] += the partials of backward 3 in
// (b, q) order.
template <class T>
EXMY_HD void ssd_bwd_param_sums(T* dA_log, T* dD, const T* pA, const T* pD, const SsdDims& d, int64_t h) {
  const int64_t H = d.heads, BQ = d.batch * d.chunks();
  for (int64_t bq = 0; bq < BQ; ++bq) {
    dA_log[h] += pA[bq * H + h];
    dD[h] += pD[bq * H + h];
  }
}

}  // namespace exmy::models

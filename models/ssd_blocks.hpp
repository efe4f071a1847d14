// The block launches of the chunked SSD scan (models/ssd.hpp): the item
// kernels' algorithm (models/ssd_items.hpp) with each small product of every
// (chunk, group) or (chunk, head) item formed by one batched GEMM call over
// the items, and the element and row steps as launches, so that a CUDA
// device forms the products on cuBLASLt (strided batches) instead of a
// thread per output element summing alone (models/ssd_threads.hpp).
//
// Entries. The products read only arrays in chunk-major order, one entry
// per item, every entry item_pad-aligned: copies of C and B per (b, q, g)
// (chunk x state), of dy and of dt x per (b, q, h) (chunk x head_dim), the
// saved states and their gradients per (b, q, h) (head_dim x state, already
// in that order), and the products' own scratch. Flat indices eg = (b Q + q)
// G + g and eh = (b Q + q) H + h = eg hpg + r (h = g hpg + r, hpg heads per
// group), so one call covers a run of chunks for every group (or every
// head) at one stride, and a product of a group's array with a head's is
// one call per r < hpg (entries eg, heads eg hpg + r): calls for r in
// increasing order add a group's dB and dC parts in head order, as the
// item does. A run is a stretch of whole chunks: all of them when the
// chunk divides the sequence, otherwise each row's whole chunks and its
// short last chunk apart (entries of one call must share their shape).
// Arrays keep the chunk's full stride (chunk x chunk arrays rows `chunk`
// apart) for short chunks too.
//
// Operations and order: those of the item kernels (the products' shapes
// and operands, each element step's operations, every accumulation in the
// item's order: a group's dB and dC parts in head order, dacs as
// ssd_dacs_value adds it, dCB over the group's heads in order), so with
// LoopGemm<NaiveGemm> the launches give the item kernels' bits with
// NaiveGemm, and with LoopGemm<SerialGemm> the CPU's bits (Eigen's product
// does not depend on its operands' strides); tests/models/test_ssd_cuda.cpp
// checks both bit for bit, and a device (cuBLASLt's order inside each
// product) against the CPU's FP32 budget.
// Cost: at proxy-350m's Mamba shape (32 heads in 8 groups) 10 batched
// calls a layer forward and 29 backward, each over every chunk of the run.
//
// Forward  acs, W (ssd_thr_acs); copies Cc, Bc, XDT = dt x; CB = Cc Bc^T;
//          M = CB exp(acs_t - acs_s) (s <= t, else +0); Yd = M XDT;
//          XDT *= W; states = XDT^T Bc (per r); pass the states
//          (ssd_thr_pass_states); off = Cc states^T (per r);
//          y = (Yd + exp(acs_t) off) + D x.
// Backward E, W (ssd_thr_exp_acs); copies Cc, Bc, dyc, XDT, dye = dy E;
//          dstates = dye^T Cc (per r); pass them back, dlast; CB = Cc Bc^T;
//          tmp = Cc hin^T (per r), sB_t = dy_t . tmp_t; dCg += dye hin (per
//          r); tmp = Bc dS^T (per r), per row s: dw_s = XDT_s . tmp_s, dXDT
//          = +0 + W_s tmp_s, dye = W_s XDT_s; dBg += dye dS (per r);
//          M = CB Lm (Lm = exp(acs_t - acs_s), s <= t, else 0); dM = dyc
//          XDT^T; dXDT += M^T dyc; dCB over the heads (in place of CB);
//          dacs (ssd_dacs_value from sB); dx += D dy, += dt dXDT, ddt +=
//          x . dXDT; the reverse cumsum of dacs (ssd_thr_dacs_scan); dCg +=
//          dCB Bc, dBg += dCB^T Cc; dC += dCg, dB += dBg; dA_log, dD
//          (ssd_bwd_param_sums).
#pragma once

#include <cstdint>

#include "models/item_gemm.hpp"
#include "models/ssd_items.hpp"
#include "models/ssd_threads.hpp"
#include "sim/kernel_launch.hpp"

namespace exmy::models {

// The per-entry array sizes (item_pad'ded) and entry counts of the block
// launches' scratch.
struct SsdBlockSizes {
  int64_t LL, LP, LN, L1, EG, EH, acs, st, bqh;
  explicit SsdBlockSizes(const SsdDims& d)
      : LL(item_pad(d.chunk * d.chunk)),
        LP(item_pad(d.chunk * d.head_dim)),
        LN(item_pad(d.chunk * d.state)),
        L1(item_pad(d.chunk)),
        EG(d.batch * d.chunks() * d.groups),
        EH(d.batch * d.chunks() * d.heads),
        acs(item_pad(d.acs_size())),
        st(item_pad(d.states_size())),
        bqh(item_pad(d.batch * d.chunks() * d.heads)) {}
  // Forward: Cc, Bc (EG x LN), CB (EG x LL), M (EH x LL), XDT, Yd, off (EH x
  // LP), W (acs).
  int64_t forward() const { return EG * (2 * LN + LL) + EH * (LL + 3 * LP) + acs; }
  // Backward: dstates (st), dlast, pA, pD (bqh), E, W (acs), Cc, Bc, dCg,
  // dBg (EG x LN), CB (EG x LL), M (EH x LL), per head a region R of
  // tmp and dye (LP each) that dM (LL) takes over once they are dead, dyc,
  // XDT, dXDT (EH x LP), sB, dw, dacs (EH x L1).
  int64_t R() const { return LL > 2 * LP ? LL : 2 * LP; }
  int64_t backward() const { return st + 3 * bqh + 2 * acs + EG * (4 * LN + LL) + EH * (LL + R() + 3 * LP + 3 * L1); }
};
inline int64_t ssd_blocks_forward_scratch(const SsdDims& d) { return SsdBlockSizes(d).forward(); }
inline int64_t ssd_blocks_backward_scratch(const SsdDims& d) { return SsdBlockSizes(d).backward(); }

// Consecutive arrays carved from a scratch: take(n) is the next n elements.
template <class T>
struct ScratchCarver {
  T* p;
  T* operator()(int64_t n) {
    T* a = p;
    p += n;
    return a;
  }
};

// A run of chunks whose items share one shape: flat chunks [c0, c0 +
// count) (flat chunk b Q + q), each of len tokens.
struct SsdRun {
  int64_t c0, count, len;
};
template <class F>
void ssd_for_runs(const SsdDims& d, F f) {
  const int64_t Q = d.chunks(), last = d.seqlen - (Q - 1) * d.chunk;
  if (last == d.chunk) return f(SsdRun{0, d.batch * Q, d.chunk});
  for (int64_t b = 0; b < d.batch; ++b) {
    if (Q > 1) f(SsdRun{b * Q, Q - 1, d.chunk});
    f(SsdRun{b * Q + Q - 1, 1, last});
  }
}

// The chunk of flat entry e of an array with `per` entries per chunk.
EXMY_HD SsdChunk ssd_entry_chunk(const SsdDims& d, int64_t e, int64_t per) {
  const int64_t bq = e / per;
  return ssd_chunk_of(d, bq / d.chunks(), bq % d.chunks());
}

// Cc, Bc (EG x LN): row t of C and B of group g of each chunk, a thread per
// (eg, t, n).
template <class L, class T>
void ssd_copy_bc_launch(const L& launch, const char* name, T* Cc, T* Bc, const T* Bm, const T* Cm, int64_t ldbc,
                        const SsdDims& d, int64_t LN) {
  const int64_t Lm = d.chunk, N = d.state, G = d.groups;
  launch(name, d.batch * d.chunks() * G * Lm * N, [=] EXMY_HD_LAMBDA(int64_t u) {
    const int64_t e = u / (Lm * N), t = (u / N) % Lm, n = u % N;
    const SsdChunk c = ssd_entry_chunk(d, e, G);
    if (t >= c.len) return;
    const int64_t at = (c.b * d.seqlen + c.t0 + t) * ldbc + (e % G) * N + n;
    Cc[e * LN + t * N + n] = Cm[at];
    Bc[e * LN + t * N + n] = Bm[at];
  });
}

template <class L, class Gemm, class T>
void ssd_blocks_forward_launches(const L& launch, const Gemm& gemm, T* y, T* acs, T* states, const T* x, int64_t ldx,
                                 const T* Bm, const T* Cm, int64_t ldbc, const T* dt, const T* A_log, const T* D,
                                 const SsdDims& d, T* scratch) {
  const SsdBlockSizes z(d);
  const int64_t Lm = d.chunk, P = d.head_dim, N = d.state, H = d.heads, G = d.groups, Q = d.chunks();
  const int64_t S = d.seqlen, hpg = H / G, PN = P * N, ldy = H * P;
  const int64_t LL = z.LL, LP = z.LP, LN = z.LN;
  ScratchCarver<T> take{scratch};  // the order of SsdBlockSizes::forward
  T *Cc = take(z.EG * LN), *Bc = take(z.EG * LN), *CB = take(z.EG * LL), *M = take(z.EH * LL);
  T *XDT = take(z.EH * LP), *Yd = take(z.EH * LP), *off = take(z.EH * LP), *W = take(z.acs);
  launch("ssd_forward acs", d.batch * H * Q, [=] EXMY_HD_LAMBDA(int64_t u) {
    ssd_thr_acs(acs, W, dt, A_log, d, u / (H * Q), (u / Q) % H, u % Q);
  });
  ssd_copy_bc_launch(launch, "ssd_forward copy bc", Cc, Bc, Bm, Cm, ldbc, d, LN);
  launch("ssd_forward xdt", z.EH * Lm * P, [=] EXMY_HD_LAMBDA(int64_t u) {
    const int64_t e = u / (Lm * P), t = (u / P) % Lm, p = u % P, h = e % H;
    const SsdChunk c = ssd_entry_chunk(d, e, H);
    if (t >= c.len) return;
    const int64_t row = c.b * S + c.t0 + t;
    XDT[e * LP + t * P + p] = dt[row * H + h] * x[row * ldx + h * P + p];
  });
  ssd_for_runs(d, [&](const SsdRun& r) {
    gemm(r.count * G, CB + r.c0 * G * LL, Lm, LL, static_cast<const T*>(Cc + r.c0 * G * LN), N, LN, sim::Op::N,
         static_cast<const T*>(Bc + r.c0 * G * LN), N, LN, sim::Op::T, r.len, r.len, N, false);
  });
  launch("ssd_forward m", z.EH * Lm * Lm, [=] EXMY_HD_LAMBDA(int64_t u) {
    const int64_t e = u / (Lm * Lm), t = (u / Lm) % Lm, s = u % Lm, h = e % H;
    const SsdChunk c = ssd_entry_chunk(d, e, H);
    if (t >= c.len || s >= c.len) return;
    const T* ac = acs + (c.b * H + h) * S + c.t0;
    const T* cb = CB + ((c.b * Q + c.q) * G + h / hpg) * LL;
    M[e * LL + t * Lm + s] = s <= t ? cb[t * Lm + s] * sim::hd_exp(ac[t] - ac[s]) : T(0);
  });
  ssd_for_runs(d, [&](const SsdRun& r) {
    gemm(r.count * H, Yd + r.c0 * H * LP, P, LP, static_cast<const T*>(M + r.c0 * H * LL), Lm, LL, sim::Op::N,
         static_cast<const T*>(XDT + r.c0 * H * LP), P, LP, sim::Op::N, r.len, P, r.len, false);
  });
  launch("ssd_forward weigh", z.EH * Lm * P, [=] EXMY_HD_LAMBDA(int64_t u) {
    const int64_t e = u / (Lm * P), t = (u / P) % Lm, h = e % H;
    const SsdChunk c = ssd_entry_chunk(d, e, H);
    if (t >= c.len) return;
    XDT[e * LP + t * P + u % P] *= W[(c.b * H + h) * S + c.t0 + t];
  });
  ssd_for_runs(d, [&](const SsdRun& r) {
    for (int64_t k = 0; k < hpg; ++k) {
      const int64_t eh = r.c0 * H + k;
      gemm(r.count * G, states + eh * PN, N, hpg * PN, static_cast<const T*>(XDT + eh * LP), P, hpg * LP, sim::Op::T,
           static_cast<const T*>(Bc + r.c0 * G * LN), N, LN, sim::Op::N, P, N, r.len, false);
    }
  });
  launch("ssd_forward pass_states", d.batch * H * PN, [=] EXMY_HD_LAMBDA(int64_t u) {
    ssd_thr_pass_states(states, static_cast<const T*>(acs), d, u / (H * PN), (u / PN) % H, u % PN);
  });
  ssd_for_runs(d, [&](const SsdRun& r) {
    for (int64_t k = 0; k < hpg; ++k) {
      const int64_t eh = r.c0 * H + k;
      gemm(r.count * G, off + eh * LP, P, hpg * LP, static_cast<const T*>(Cc + r.c0 * G * LN), N, LN, sim::Op::N,
           static_cast<const T*>(states + eh * PN), N, hpg * PN, sim::Op::T, r.len, P, N, false);
    }
  });
  launch("ssd_forward output", z.EH * Lm * P, [=] EXMY_HD_LAMBDA(int64_t u) {
    const int64_t e = u / (Lm * P), t = (u / P) % Lm, p = u % P, h = e % H;
    const SsdChunk c = ssd_entry_chunk(d, e, H);
    if (t >= c.len) return;
    const int64_t row = c.b * S + c.t0 + t, i = e * LP + t * P + p;
    const T ex = sim::hd_exp(acs[(c.b * H + h) * S + c.t0 + t]);
    y[row * ldy + h * P + p] = (Yd[i] + ex * off[i]) + D[h] * x[row * ldx + h * P + p];
  });
}

template <class L, class Gemm, class T>
void ssd_blocks_backward_launches(const L& launch, const Gemm& gemm, T* dx, T* dB, T* dC, T* ddt, T* dA_log, T* dD,
                                  const T* dy, const T* x, int64_t ldx, const T* Bm, const T* Cm, int64_t ldbc,
                                  const T* dt, const T* A_log, const T* D, const T* acs, const T* states,
                                  const SsdDims& d, T* scratch) {
  const SsdBlockSizes z(d);
  const int64_t Lm = d.chunk, P = d.head_dim, N = d.state, H = d.heads, G = d.groups, Q = d.chunks();
  const int64_t S = d.seqlen, hpg = H / G, PN = P * N, ldy = H * P;
  const int64_t LL = z.LL, LP = z.LP, LN = z.LN, L1 = z.L1;
  ScratchCarver<T> take{scratch};  // the order of SsdBlockSizes::backward
  T *dstates = take(z.st), *dlast = take(z.bqh), *pA = take(z.bqh), *pD = take(z.bqh);
  T *E = take(z.acs), *W = take(z.acs);
  T *Cc = take(z.EG * LN), *Bc = take(z.EG * LN), *dCg = take(z.EG * LN), *dBg = take(z.EG * LN);
  T *CB = take(z.EG * LL), *M = take(z.EH * LL);  // CB, then dCB
  // Region R per head: tmp and dye through (b) and (c), then dM from (d) on.
  const int64_t RR = z.R();
  T* tmp = take(z.EH * RR);
  T *dye = tmp + LP, *dM = tmp;
  T *dyc = take(z.EH * LP), *XDT = take(z.EH * LP), *dXDT = take(z.EH * LP);
  T *sB = take(z.EH * L1), *dw = take(z.EH * L1), *dacs = take(z.EH * L1);
  // The products' operands, named once: a group's array of a run, a head's
  // of a run (entries r apart by hpg), each as `const`.
  const auto cg = [&](const T* a, const SsdRun& r, int64_t per) { return a + r.c0 * G * per; };
  const auto ch = [&](const T* a, const SsdRun& r, int64_t k, int64_t per) { return a + (r.c0 * H + k) * per; };

  launch("ssd_backward exp_acs", d.batch * H * S, [=] EXMY_HD_LAMBDA(int64_t u) {
    ssd_thr_exp_acs(E, W, acs, d, u / (H * S), (u / S) % H, u % S);
  });
  ssd_copy_bc_launch(launch, "ssd_backward copy bc", Cc, Bc, Bm, Cm, ldbc, d, LN);
  launch("ssd_backward copy rows", z.EH * Lm * P, [=] EXMY_HD_LAMBDA(int64_t u) {
    const int64_t e = u / (Lm * P), t = (u / P) % Lm, p = u % P, h = e % H;
    const SsdChunk c = ssd_entry_chunk(d, e, H);
    if (t >= c.len) return;
    const int64_t row = c.b * S + c.t0 + t, i = e * LP + t * P + p;
    const T g = dy[row * ldy + h * P + p];
    dyc[i] = g;
    XDT[i] = dt[row * H + h] * x[row * ldx + h * P + p];
    dye[e * RR + t * P + p] = g * E[(c.b * H + h) * S + c.t0 + t];
  });
  // The gradient of the state entering each chunk from its outputs.
  ssd_for_runs(d, [&](const SsdRun& r) {
    for (int64_t k = 0; k < hpg; ++k)
      gemm(r.count * G, dstates + (r.c0 * H + k) * PN, N, hpg * PN, ch(dye, r, k, RR), P, hpg * RR, sim::Op::T,
           cg(Cc, r, LN), N, LN, sim::Op::N, P, N, r.len, false);
  });
  launch("ssd_backward pass_dstates", d.batch * H * PN, [=] EXMY_HD_LAMBDA(int64_t u) {
    ssd_thr_pass_dstates(dstates, acs, d, u / (H * PN), (u / PN) % H, u % PN);
  });
  launch("ssd_backward dlast", d.batch * H * Q, [=] EXMY_HD_LAMBDA(int64_t u) {
    ssd_thr_dlast(dlast, static_cast<const T*>(dstates), acs, states, d, u / (H * Q), (u / Q) % H, u % Q);
  });
  ssd_for_runs(d, [&](const SsdRun& r) {
    gemm(r.count * G, CB + r.c0 * G * LL, Lm, LL, cg(Cc, r, LN), N, LN, sim::Op::N, cg(Bc, r, LN), N, LN, sim::Op::T,
         r.len, r.len, N, false);
  });
  launch("ssd_backward zero dbc", z.EG * LN, [=] EXMY_HD_LAMBDA(int64_t u) { dCg[u] = dBg[u] = T(0); });

  // (b) The incoming state: tmp = C hin^T; its dot with dy for dacs; dC's part.
  ssd_for_runs(d, [&](const SsdRun& r) {
    for (int64_t k = 0; k < hpg; ++k)
      gemm(r.count * G, tmp + (r.c0 * H + k) * RR, P, hpg * RR, cg(Cc, r, LN), N, LN, sim::Op::N, ch(states, r, k, PN),
           N, hpg * PN, sim::Op::T, r.len, P, N, false);
  });
  launch("ssd_backward state rows", z.EH * Lm, [=] EXMY_HD_LAMBDA(int64_t u) {
    const int64_t e = u / Lm, t = u % Lm;
    if (t >= ssd_entry_chunk(d, e, H).len) return;
    T s = 0;
    for (int64_t p = 0; p < P; ++p) s += dyc[e * LP + t * P + p] * tmp[e * RR + t * P + p];
    sB[e * L1 + t] = s;
  });
  ssd_for_runs(d, [&](const SsdRun& r) {
    for (int64_t k = 0; k < hpg; ++k)
      gemm(r.count * G, dCg + r.c0 * G * LN, N, LN, ch(dye, r, k, RR), P, hpg * RR, sim::Op::N, ch(states, r, k, PN),
           N, hpg * PN, sim::Op::N, r.len, N, P, true);
  });

  // (c) The own end state: tmp = B dS^T; per row the dw dot, dXDT's first
  //     part and dye = W XDT; dB's part.
  ssd_for_runs(d, [&](const SsdRun& r) {
    for (int64_t k = 0; k < hpg; ++k)
      gemm(r.count * G, tmp + (r.c0 * H + k) * RR, P, hpg * RR, cg(Bc, r, LN), N, LN, sim::Op::N,
           ch(dstates, r, k, PN), N, hpg * PN, sim::Op::T, r.len, P, N, false);
  });
  launch("ssd_backward own rows", z.EH * Lm, [=] EXMY_HD_LAMBDA(int64_t u) {
    const int64_t e = u / Lm, s = u % Lm, h = e % H;
    const SsdChunk c = ssd_entry_chunk(d, e, H);
    if (s >= c.len) return;
    const T ws = W[(c.b * H + h) * S + c.t0 + s];
    const int64_t i0 = e * LP + s * P, j0 = e * RR + s * P;
    T v = 0;
    for (int64_t p = 0; p < P; ++p) {
      v += XDT[i0 + p] * tmp[j0 + p];
      dXDT[i0 + p] = T(0) + ws * tmp[j0 + p];  // the item's dXDT starts at +0
      dye[j0 + p] = ws * XDT[i0 + p];
    }
    dw[e * L1 + s] = v;
  });
  ssd_for_runs(d, [&](const SsdRun& r) {
    for (int64_t k = 0; k < hpg; ++k)
      gemm(r.count * G, dBg + r.c0 * G * LN, N, LN, ch(dye, r, k, RR), P, hpg * RR, sim::Op::N,
           ch(dstates, r, k, PN), N, hpg * PN, sim::Op::N, r.len, N, P, true);
  });

  // (d) The diagonal block.
  launch("ssd_backward m", z.EH * Lm * Lm, [=] EXMY_HD_LAMBDA(int64_t u) {
    const int64_t e = u / (Lm * Lm), t = (u / Lm) % Lm, s = u % Lm, h = e % H;
    const SsdChunk c = ssd_entry_chunk(d, e, H);
    if (t >= c.len || s >= c.len) return;
    const T* ac = acs + (c.b * H + h) * S + c.t0;
    const T l = s <= t ? sim::hd_exp(ac[t] - ac[s]) : T(0);
    M[e * LL + t * Lm + s] = CB[((c.b * Q + c.q) * G + h / hpg) * LL + t * Lm + s] * l;
  });
  ssd_for_runs(d, [&](const SsdRun& r) {
    gemm(r.count * H, dM + r.c0 * H * RR, Lm, RR, ch(dyc, r, 0, LP), P, LP, sim::Op::N, ch(XDT, r, 0, LP), P, LP,
         sim::Op::T, r.len, r.len, P, false);
    gemm(r.count * H, dXDT + r.c0 * H * LP, P, LP, ch(M, r, 0, LL), Lm, LL, sim::Op::T, ch(dyc, r, 0, LP), P, LP,
         sim::Op::N, r.len, P, r.len, true);
  });
  launch("ssd_backward dcb", z.EG * Lm * Lm, [=] EXMY_HD_LAMBDA(int64_t u) {
    const int64_t e = u / (Lm * Lm), t = (u / Lm) % Lm, s = u % Lm;
    const SsdChunk c = ssd_entry_chunk(d, e, G);
    if (t >= c.len || s >= c.len) return;
    CB[e * LL + t * Lm + s] =
        s <= t ? ssd_dcb_value(static_cast<const T*>(dM + e * hpg * RR), RR, acs, d, c, e % G, t, s) : T(0);
  });
  launch("ssd_backward dacs", z.EH * Lm, [=] EXMY_HD_LAMBDA(int64_t u) {
    const int64_t e = u / Lm, t = u % Lm;
    const SsdChunk c = ssd_entry_chunk(d, e, H);
    if (t >= c.len) return;
    dacs[e * L1 + t] = ssd_dacs_value(sB[e * L1 + t], static_cast<const T*>(M + e * LL),
                                      static_cast<const T*>(dM + e * RR), static_cast<const T*>(dw + e * L1),
                                      static_cast<const T*>(E), static_cast<const T*>(W),
                                      static_cast<const T*>(dlast), d, c, e % H, t);
  });

  // (a), (e) dx += D dy, then += dt dXDT; ddt += x . dXDT.
  launch("ssd_backward dx rows", z.EH * Lm, [=] EXMY_HD_LAMBDA(int64_t u) {
    const int64_t e = u / Lm, t = u % Lm, h = e % H;
    const SsdChunk c = ssd_entry_chunk(d, e, H);
    if (t >= c.len) return;
    const int64_t row = c.b * S + c.t0 + t, i0 = e * LP + t * P;
    const T dtt = dt[row * H + h];
    T* dxt = dx + row * ldx + h * P;
    const T* xt = x + row * ldx + h * P;
    T s = 0;
    for (int64_t p = 0; p < P; ++p) {
      dxt[p] += D[h] * dyc[i0 + p];
      dxt[p] += dtt * dXDT[i0 + p];
      s += xt[p] * dXDT[i0 + p];
    }
    ddt[row * H + h] += s;
  });
  // (f) The reverse cumulative sum of dacs, and the head's partials.
  launch("ssd_backward dacs_scan", z.EH, [=] EXMY_HD_LAMBDA(int64_t e) {
    const SsdChunk c = ssd_entry_chunk(d, e, H);
    ssd_thr_dacs_scan(ddt, pA, pD, static_cast<const T*>(dacs + e * L1), dy, x, ldx, dt, A_log, d, c.b, c.q, e % H);
  });

  // The group's shared C B^T: dC and dB's last parts, then into dC and dB.
  ssd_for_runs(d, [&](const SsdRun& r) {
    gemm(r.count * G, dCg + r.c0 * G * LN, N, LN, cg(CB, r, LL), Lm, LL, sim::Op::N, cg(Bc, r, LN), N, LN, sim::Op::N,
         r.len, N, r.len, true);
    gemm(r.count * G, dBg + r.c0 * G * LN, N, LN, cg(CB, r, LL), Lm, LL, sim::Op::T, cg(Cc, r, LN), N, LN, sim::Op::N,
         r.len, N, r.len, true);
  });
  launch("ssd_backward dbc", z.EG * Lm * N, [=] EXMY_HD_LAMBDA(int64_t u) {
    const int64_t e = u / (Lm * N), t = (u / N) % Lm, n = u % N;
    const SsdChunk c = ssd_entry_chunk(d, e, G);
    if (t >= c.len) return;
    const int64_t at = (c.b * S + c.t0 + t) * ldbc + (e % G) * N + n;
    dC[at] += dCg[e * LN + t * N + n];
    dB[at] += dBg[e * LN + t * N + n];
  });
  launch("ssd_backward param_sums", H, [=] EXMY_HD_LAMBDA(int64_t h) {
    ssd_bwd_param_sums(dA_log, dD, static_cast<const T*>(pA), static_cast<const T*>(pD), d, h);
  });
}

}  // namespace exmy::models

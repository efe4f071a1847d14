#include "models/ssd.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "models/layers.hpp"
#include "sim/gemm.hpp"
#include "sim/parallel.hpp"
#include "sim/tensor.hpp"

namespace exmy::models {

using sim::Buf;
using sim::gemm_serial;
using sim::Op;

// ---------------------------------------------------------------------------
// dt
// ---------------------------------------------------------------------------

template <class T>
void mamba_dt_forward(T* dt, const T* dt_raw, int64_t ld, const T* dt_bias, int64_t N, int64_t H, double lo,
                      double hi) {
#pragma omp parallel for schedule(static) if (N * H >= sim::parallel_min_work())
  for (int64_t n = 0; n < N; ++n)
    for (int64_t h = 0; h < H; ++h) {
      const T sp = softplus(dt_raw[n * ld + h] + dt_bias[h]);
      dt[n * H + h] = std::clamp(sp, static_cast<T>(lo), static_cast<T>(hi));
    }
}

template <class T>
void mamba_dt_backward(T* ddt_raw, int64_t ld, T* ddt_bias, const T* ddt, const T* dt_raw, const T* dt_bias, int64_t N,
                       int64_t H, double lo, double hi) {
  sim::rows_with_column_sums(ddt_bias, N, H, [&](int64_t n, T* pb) {
    for (int64_t h = 0; h < H; ++h) {
      const T v = dt_raw[n * ld + h] + dt_bias[h];
      const T sp = softplus(v);
      if (sp < static_cast<T>(lo) || sp > static_cast<T>(hi)) continue;  // clamped: no gradient
      const T g = ddt[n * H + h] * (v > T(20) ? T(1) : sigmoid(v));
      ddt_raw[n * ld + h] += g;
      pb[h] += g;
    }
  });
}

// ---------------------------------------------------------------------------
// Chunked SSD
// ---------------------------------------------------------------------------

namespace {

// Index helpers for one (b, chunk q) of the layouts in ssd.hpp.
struct Chunk {
  int64_t b, q, t0, len;
};

inline Chunk chunk_of(const SsdDims& d, int64_t b, int64_t q) {
  const int64_t t0 = q * d.chunk;
  return {b, q, t0, std::min(d.chunk, d.seqlen - t0)};
}

}  // namespace

template <class T>
void ssd_chunk_scan_forward(T* y, T* acs, T* states, const T* x, int64_t ldx, const T* Bm, const T* Cm, int64_t ldbc,
                            const T* dt, const T* A_log, const T* D, const SsdDims& d) {
  const int64_t S = d.seqlen, H = d.heads, P = d.head_dim, G = d.groups, N = d.state, Q = d.chunks();
  const int64_t hpg = H / G, ldy = H * P, PN = P * N;
  // Multiply-adds of the scan, to decide whether threads pay off.
  const int64_t work = d.batch * S * H * (d.chunk + N) * P;

  // 1. Within each chunk: the diagonal-block output and the chunk's own
  //    contribution to the state at its end. One unit per (b, chunk, group),
  //    so C B^T is formed once for the heads that share it.
#pragma omp parallel for schedule(dynamic, 1) if (work >= sim::parallel_min_work())
  for (int64_t u = 0; u < d.batch * Q * G; ++u) {
    const int64_t g = u % G;
    const Chunk c = chunk_of(d, u / (Q * G), (u / G) % Q);
    const int64_t Lc = c.len, row0 = c.b * S + c.t0;
    const T* Cg = Cm + row0 * ldbc + g * N;
    const T* Bg = Bm + row0 * ldbc + g * N;
    Buf<T> CB(static_cast<size_t>(Lc * Lc)), M(static_cast<size_t>(Lc * Lc)), XDT(static_cast<size_t>(Lc * P));
    gemm_serial(CB.data(), Lc, Cg, ldbc, Op::N, Bg, ldbc, Op::T, Lc, Lc, N, false);
    for (int64_t h = g * hpg; h < (g + 1) * hpg; ++h) {
      const T A = -std::exp(A_log[h]);
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
      // M = (C B^T) ∘ exp(acs_t - acs_s), causal within the chunk.
      for (int64_t t = 0; t < Lc; ++t)
        for (int64_t s = 0; s < Lc; ++s) M[t * Lc + s] = s <= t ? CB[t * Lc + s] * std::exp(ac[t] - ac[s]) : T(0);
      gemm_serial(y + row0 * ldy + h * P, ldy, M.data(), Lc, Op::N, XDT.data(), P, Op::N, Lc, P, Lc, false);
      // Chunk state: sum_s exp(acs_last - acs_s) dt_s x_s B_s^T  (P x N).
      for (int64_t s = 0; s < Lc; ++s) {
        const T w = std::exp(ac[Lc - 1] - ac[s]);
        for (int64_t p = 0; p < P; ++p) XDT[s * P + p] *= w;
      }
      T* st = states + ((c.b * Q + c.q) * H + h) * PN;
      gemm_serial(st, N, XDT.data(), P, Op::T, Bg, ldbc, Op::N, P, N, Lc, false);
    }
  }

  // 2. Pass the states along the chunks: states[q] becomes the state
  //    entering chunk q (zero for the first).
#pragma omp parallel for schedule(static) if (work >= sim::parallel_min_work())
  for (int64_t u = 0; u < d.batch * H; ++u) {
    const int64_t b = u / H, h = u % H;
    std::vector<T> cur(static_cast<size_t>(PN), T(0));
    for (int64_t q = 0; q < Q; ++q) {
      const Chunk c = chunk_of(d, b, q);
      const T decay = std::exp(acs[(b * H + h) * S + c.t0 + c.len - 1]);
      T* st = states + ((b * Q + q) * H + h) * PN;
      for (int64_t i = 0; i < PN; ++i) {
        const T own = st[i];
        st[i] = cur[static_cast<size_t>(i)];
        cur[static_cast<size_t>(i)] = decay * cur[static_cast<size_t>(i)] + own;
      }
    }
  }

  // 3. Each chunk reads its incoming state, plus the D skip.
#pragma omp parallel for schedule(dynamic, 1) if (work >= sim::parallel_min_work())
  for (int64_t u = 0; u < d.batch * Q * H; ++u) {
    const int64_t h = u % H;
    const Chunk c = chunk_of(d, u / (Q * H), (u / H) % Q);
    const int64_t Lc = c.len, row0 = c.b * S + c.t0, g = h / hpg;
    const T* Cg = Cm + row0 * ldbc + g * N;
    const T* st = states + ((c.b * Q + c.q) * H + h) * PN;
    const T* ac = acs + (c.b * H + h) * S + c.t0;
    const T* xh = x + row0 * ldx + h * P;
    T* yh = y + row0 * ldy + h * P;
    Buf<T> off(static_cast<size_t>(Lc * P));
    gemm_serial(off.data(), P, Cg, ldbc, Op::N, st, N, Op::T, Lc, P, N, false);
    for (int64_t t = 0; t < Lc; ++t) {
      const T e = std::exp(ac[t]);
      for (int64_t p = 0; p < P; ++p) yh[t * ldy + p] = (yh[t * ldy + p] + e * off[t * P + p]) + D[h] * xh[t * ldx + p];
    }
  }
}

namespace {

// The backward's pass 1: the gradient of the incoming state of each chunk
// from that chunk's outputs, sum_t exp(acs_t) dy_t C_t^T. dstates (B,Q,H,P,N).
template <class T>
void ssd_dstates_from_outputs(T* dstates, const T* dy, const T* Cm, int64_t ldbc, const T* acs, const SsdDims& d) {
  const int64_t S = d.seqlen, H = d.heads, P = d.head_dim, G = d.groups, N = d.state, Q = d.chunks();
  const int64_t hpg = H / G, ldy = H * P, PN = P * N;
  const int64_t work = d.batch * S * H * (d.chunk + N) * P;
#pragma omp parallel for schedule(dynamic, 1) if (work >= sim::parallel_min_work())
  for (int64_t u = 0; u < d.batch * Q * H; ++u) {
    const int64_t h = u % H;
    const Chunk c = chunk_of(d, u / (Q * H), (u / H) % Q);
    const int64_t Lc = c.len, row0 = c.b * S + c.t0, g = h / hpg;
    const T* ac = acs + (c.b * H + h) * S + c.t0;
    const T* dyh = dy + row0 * ldy + h * P;
    Buf<T> dye(static_cast<size_t>(Lc * P));
    for (int64_t t = 0; t < Lc; ++t) {
      const T e = std::exp(ac[t]);
      for (int64_t p = 0; p < P; ++p) dye[t * P + p] = dyh[t * ldy + p] * e;
    }
    gemm_serial(dstates + ((c.b * Q + c.q) * H + h) * PN, N, dye.data(), P, Op::T, Cm + row0 * ldbc + g * N, ldbc,
                Op::N, P, N, Lc, false);
  }
}

// Pass 2: backward through the state passing, last chunk first. dstates[q]
// becomes the gradient of chunk q's own end-state contribution (the
// gradient of the state entering chunk q+1); dlast (B,H,Q) gets the
// gradient of the chunk's total decay exp(acs_last) through the passed state.
template <class T>
void ssd_dstates_through_passing(T* dstates, T* dlast, const T* acs, const T* states, const SsdDims& d) {
  const int64_t S = d.seqlen, H = d.heads, P = d.head_dim, N = d.state, Q = d.chunks(), PN = P * N;
  const int64_t work = d.batch * S * H * (d.chunk + N) * P;
#pragma omp parallel for schedule(static) if (work >= sim::parallel_min_work())
  for (int64_t u = 0; u < d.batch * H; ++u) {
    const int64_t b = u / H, h = u % H;
    std::vector<T> next(static_cast<size_t>(PN), T(0));
    for (int64_t q = Q - 1; q >= 0; --q) {
      const Chunk c = chunk_of(d, b, q);
      const T decay = std::exp(acs[(b * H + h) * S + c.t0 + c.len - 1]);
      T* ds = dstates + ((b * Q + q) * H + h) * PN;
      const T* hin = states + ((b * Q + q) * H + h) * PN;
      T dot = 0;
      for (int64_t i = 0; i < PN; ++i) dot += next[static_cast<size_t>(i)] * hin[i];
      dlast[(b * H + h) * Q + q] = decay * dot;
      for (int64_t i = 0; i < PN; ++i) {
        const T own = ds[i];
        ds[i] = next[static_cast<size_t>(i)];
        next[static_cast<size_t>(i)] = own + decay * next[static_cast<size_t>(i)];
      }
    }
  }
}

// Pass 3's buffers for one (b, chunk, group) of Lc tokens.
template <class T>
struct ChunkGroupBufs {
  Buf<T> CB, M, Lm, dM, dCB;   // (Lc,Lc)
  Buf<T> XDT, dXDT, tmp, dye;  // (Lc,P)
  Buf<T> dCg, dBg;             // (Lc,N)
  std::vector<T> dacs;         // (Lc)
  ChunkGroupBufs(int64_t Lc, int64_t P, int64_t N)
      : CB(static_cast<size_t>(Lc * Lc)), M(CB.size()), Lm(CB.size()), dM(CB.size()), dCB(CB.size(), T(0)),
        XDT(static_cast<size_t>(Lc * P)), dXDT(XDT.size()), tmp(XDT.size()), dye(XDT.size()),
        dCg(static_cast<size_t>(Lc * N), T(0)), dBg(dCg.size(), T(0)), dacs(static_cast<size_t>(Lc)) {}
};

// Pass 3 for head h of chunk c: dx and ddt +=, w.dCg, w.dBg and w.dCB +=
// (the group's, summed over its heads in order), and the head's partial
// gradients of A_log (*pA) and D (*pD). w.CB holds C B^T of the group.
template <class T>
void ssd_chunk_head_backward(ChunkGroupBufs<T>& w, T* dx, T* ddt, T* pA, T* pD, const T* dy, const T* x,
                             int64_t ldx, const T* Bg, const T* Cg, int64_t ldbc, const T* dt, const T* A_log,
                             const T* D, const T* acs, const T* states, const T* dstates, const T* dlast,
                             const Chunk& c, int64_t h, const SsdDims& d) {
  const int64_t S = d.seqlen, H = d.heads, P = d.head_dim, N = d.state, Q = d.chunks();
  const int64_t ldy = H * P, PN = P * N, Lc = c.len, row0 = c.b * S + c.t0;
  Buf<T>&CB = w.CB, &M = w.M, &Lm = w.Lm, &dM = w.dM, &dCB = w.dCB;
  Buf<T>&XDT = w.XDT, &dXDT = w.dXDT, &tmp = w.tmp, &dye = w.dye;
  std::vector<T>& dacs = w.dacs;
  const T A = -std::exp(A_log[h]);
  const T* ac = acs + (c.b * H + h) * S + c.t0;
  const T* xh = x + row0 * ldx + h * P;
  const T* dyh = dy + row0 * ldy + h * P;
  T* dxh = dx + row0 * ldx + h * P;
  const T* hin = states + ((c.b * Q + c.q) * H + h) * PN;
  const T* dS = dstates + ((c.b * Q + c.q) * H + h) * PN;
  std::fill(dacs.begin(), dacs.end(), T(0));
  std::fill(dXDT.begin(), dXDT.end(), T(0));
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
  gemm_serial(tmp.data(), P, Cg, ldbc, Op::N, hin, N, Op::T, Lc, P, N, false);
  for (int64_t t = 0; t < Lc; ++t) {
    const T e = std::exp(ac[t]);
    T s = 0;
    for (int64_t p = 0; p < P; ++p) {
      s += dyh[t * ldy + p] * tmp[t * P + p];
      dye[t * P + p] = dyh[t * ldy + p] * e;
    }
    dacs[t] += e * s;
  }
  gemm_serial(w.dCg.data(), N, dye.data(), P, Op::N, hin, N, Op::N, Lc, N, P, true);

  // (c) Own end state: S = sum_s w_s xdt_s B_s^T, w_s = exp(acs_last - acs_s).
  gemm_serial(tmp.data(), P, Bg, ldbc, Op::N, dS, N, Op::T, Lc, P, N, false);  // (dS B_s)^T per row
  for (int64_t s = 0; s < Lc; ++s) {
    const T ws = std::exp(ac[Lc - 1] - ac[s]);
    T dw = 0;
    for (int64_t p = 0; p < P; ++p) {
      dw += XDT[s * P + p] * tmp[s * P + p];
      dXDT[s * P + p] += ws * tmp[s * P + p];
      dye[s * P + p] = ws * XDT[s * P + p];  // reuse dye as w_s xdt_s
    }
    dacs[Lc - 1] += dw * ws;
    dacs[s] -= dw * ws;
  }
  gemm_serial(w.dBg.data(), N, dye.data(), P, Op::N, dS, N, Op::N, Lc, N, P, true);
  dacs[Lc - 1] += dlast[(c.b * H + h) * Q + c.q];

  // (d) Diagonal block: y = M · XDT, M = CB ∘ Lm, Lm[t,s] = exp(acs_t - acs_s) (s <= t).
  for (int64_t t = 0; t < Lc; ++t)
    for (int64_t s = 0; s < Lc; ++s) {
      const T l = s <= t ? std::exp(ac[t] - ac[s]) : T(0);
      Lm[t * Lc + s] = l;
      M[t * Lc + s] = CB[t * Lc + s] * l;
    }
  gemm_serial(dM.data(), Lc, dyh, ldy, Op::N, XDT.data(), P, Op::T, Lc, Lc, P, false);
  gemm_serial(dXDT.data(), P, M.data(), Lc, Op::T, dyh, ldy, Op::N, Lc, P, Lc, true);
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

}  // namespace

template <class T>
void ssd_chunk_scan_backward(T* dx, T* dB, T* dC, T* ddt, T* dA_log, T* dD, const T* dy, const T* x, int64_t ldx,
                             const T* Bm, const T* Cm, int64_t ldbc, const T* dt, const T* A_log, const T* D,
                             const T* acs, const T* states, const SsdDims& d) {
  const int64_t S = d.seqlen, H = d.heads, P = d.head_dim, G = d.groups, N = d.state, Q = d.chunks();
  const int64_t hpg = H / G;
  Buf<T> dstates(static_cast<size_t>(d.states_size()));
  Buf<T> dlast(static_cast<size_t>(d.batch * H * Q));
  const int64_t work = d.batch * S * H * (d.chunk + N) * P;

  // 1. and 2.: the gradient of every chunk's end state.
  ssd_dstates_from_outputs(dstates.data(), dy, Cm, ldbc, acs, d);
  ssd_dstates_through_passing(dstates.data(), dlast.data(), acs, states, d);

  // 3. Everything inside each chunk. One unit per (b, chunk, group): the
  //    heads of the group run in order and their B and C gradients are summed
  //    in that order. Per-head parameter gradients go to per-unit partials.
  Buf<T> pA(static_cast<size_t>(d.batch * Q * H)), pD(static_cast<size_t>(d.batch * Q * H));
#pragma omp parallel for schedule(dynamic, 1) if (work >= sim::parallel_min_work())
  for (int64_t u = 0; u < d.batch * Q * G; ++u) {
    const int64_t g = u % G;
    const Chunk c = chunk_of(d, u / (Q * G), (u / G) % Q);
    const int64_t Lc = c.len, row0 = c.b * S + c.t0;
    const T* Cg = Cm + row0 * ldbc + g * N;
    const T* Bg = Bm + row0 * ldbc + g * N;
    ChunkGroupBufs<T> w(Lc, P, N);
    gemm_serial(w.CB.data(), Lc, Cg, ldbc, Op::N, Bg, ldbc, Op::T, Lc, Lc, N, false);
    for (int64_t h = g * hpg; h < (g + 1) * hpg; ++h) {
      const size_t part = static_cast<size_t>((c.b * Q + c.q) * H + h);
      ssd_chunk_head_backward(w, dx, ddt, &pA[part], &pD[part], dy, x, ldx, Bg, Cg, ldbc, dt, A_log, D, acs, states,
                              dstates.data(), dlast.data(), c, h, d);
    }
    // C B^T is shared by the group's heads: one GEMM pair for all of them.
    gemm_serial(w.dCg.data(), N, w.dCB.data(), Lc, Op::N, Bg, ldbc, Op::N, Lc, N, Lc, true);
    gemm_serial(w.dBg.data(), N, w.dCB.data(), Lc, Op::T, Cg, ldbc, Op::N, Lc, N, Lc, true);
    for (int64_t t = 0; t < Lc; ++t)
      for (int64_t n = 0; n < N; ++n) {
        dC[(row0 + t) * ldbc + g * N + n] += w.dCg[static_cast<size_t>(t * N + n)];
        dB[(row0 + t) * ldbc + g * N + n] += w.dBg[static_cast<size_t>(t * N + n)];
      }
  }
  for (int64_t h = 0; h < H; ++h)
    for (int64_t bq = 0; bq < d.batch * Q; ++bq) {
      dA_log[h] += pA[static_cast<size_t>(bq * H + h)];
      dD[h] += pD[static_cast<size_t>(bq * H + h)];
    }
}

// ---------------------------------------------------------------------------
// Reference: the per-token recurrence
// ---------------------------------------------------------------------------

template <class T>
void ssd_scan_ref_forward(T* y, const T* x, int64_t ldx, const T* Bm, const T* Cm, int64_t ldbc, const T* dt,
                          const T* A_log, const T* D, const SsdDims& d) {
  const int64_t S = d.seqlen, H = d.heads, P = d.head_dim, N = d.state, hpg = H / d.groups;
  std::vector<T> st(static_cast<size_t>(P * N));
  for (int64_t b = 0; b < d.batch; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t g = h / hpg;
      const T A = -std::exp(A_log[h]);
      std::fill(st.begin(), st.end(), T(0));
      for (int64_t t = 0; t < S; ++t) {
        const int64_t r = b * S + t;
        const T dtt = dt[r * H + h];
        const T a = std::exp(dtt * A);
        const T* xt = x + r * ldx + h * P;
        const T* Bt = Bm + r * ldbc + g * N;
        const T* Ct = Cm + r * ldbc + g * N;
        for (int64_t p = 0; p < P; ++p) {
          T out = 0;
          for (int64_t n = 0; n < N; ++n) {
            T& s = st[static_cast<size_t>(p * N + n)];
            s = a * s + dtt * xt[p] * Bt[n];
            out += s * Ct[n];
          }
          y[r * H * P + h * P + p] = out + D[h] * xt[p];
        }
      }
    }
}

template <class T>
void ssd_scan_ref_backward(T* dx, T* dB, T* dC, T* ddt, T* dA_log, T* dD, const T* dy, const T* x, int64_t ldx,
                           const T* Bm, const T* Cm, int64_t ldbc, const T* dt, const T* A_log, const T* D,
                           const SsdDims& d) {
  const int64_t S = d.seqlen, H = d.heads, P = d.head_dim, N = d.state, hpg = H / d.groups;
  const size_t PN = static_cast<size_t>(P * N);
  std::vector<T> hist(static_cast<size_t>(S + 1) * PN), dst(PN);
  for (int64_t b = 0; b < d.batch; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t g = h / hpg;
      const T A = -std::exp(A_log[h]);
      // Replay the forward, keeping every state: hist[t+1] is the state after token t.
      std::fill(hist.begin(), hist.begin() + static_cast<std::ptrdiff_t>(PN), T(0));
      for (int64_t t = 0; t < S; ++t) {
        const int64_t r = b * S + t;
        const T dtt = dt[r * H + h], a = std::exp(dtt * A);
        const T* xt = x + r * ldx + h * P;
        const T* Bt = Bm + r * ldbc + g * N;
        for (int64_t p = 0; p < P; ++p)
          for (int64_t n = 0; n < N; ++n) {
            const size_t i = static_cast<size_t>(p * N + n);
            hist[static_cast<size_t>(t + 1) * PN + i] = a * hist[static_cast<size_t>(t) * PN + i] + dtt * xt[p] * Bt[n];
          }
      }
      std::fill(dst.begin(), dst.end(), T(0));
      T dA = 0;
      for (int64_t t = S - 1; t >= 0; --t) {
        const int64_t r = b * S + t;
        const T dtt = dt[r * H + h], a = std::exp(dtt * A);
        const T* xt = x + r * ldx + h * P;
        const T* Bt = Bm + r * ldbc + g * N;
        const T* Ct = Cm + r * ldbc + g * N;
        const T* dyt = dy + r * H * P + h * P;
        const T* cur = hist.data() + static_cast<size_t>(t + 1) * PN;
        const T* prev = hist.data() + static_cast<size_t>(t) * PN;
        // y_t = state_t C_t + D x_t
        for (int64_t p = 0; p < P; ++p) {
          dD[h] += dyt[p] * xt[p];
          dx[r * ldx + h * P + p] += D[h] * dyt[p];
          for (int64_t n = 0; n < N; ++n) {
            dst[static_cast<size_t>(p * N + n)] += dyt[p] * Ct[n];
            dC[r * ldbc + g * N + n] += cur[p * N + n] * dyt[p];
          }
        }
        // state_t = a state_{t-1} + dt x_t B_t^T
        T da = 0, ddtt = 0;
        for (int64_t p = 0; p < P; ++p)
          for (int64_t n = 0; n < N; ++n) {
            const T gs = dst[static_cast<size_t>(p * N + n)];
            dx[r * ldx + h * P + p] += dtt * gs * Bt[n];
            dB[r * ldbc + g * N + n] += dtt * gs * xt[p];
            ddtt += gs * xt[p] * Bt[n];
            da += gs * prev[p * N + n];
          }
        ddtt += da * a * A;  // a = exp(dt A)
        ddt[r * H + h] += ddtt;
        dA += da * a * dtt;
        for (auto& v : dst) v *= a;
      }
      dA_log[h] += dA * A;
    }
}

#define EXMY_INSTANTIATE(T)                                                                                          \
  template void mamba_dt_forward<T>(T*, const T*, int64_t, const T*, int64_t, int64_t, double, double);            \
  template void mamba_dt_backward<T>(T*, int64_t, T*, const T*, const T*, const T*, int64_t, int64_t, double,       \
                                     double);                                                                        \
  template void ssd_chunk_scan_forward<T>(T*, T*, T*, const T*, int64_t, const T*, const T*, int64_t, const T*,     \
                                          const T*, const T*, const SsdDims&);                                       \
  template void ssd_chunk_scan_backward<T>(T*, T*, T*, T*, T*, T*, const T*, const T*, int64_t, const T*, const T*, \
                                           int64_t, const T*, const T*, const T*, const T*, const T*,                \
                                           const SsdDims&);                                                          \
  template void ssd_scan_ref_forward<T>(T*, const T*, int64_t, const T*, const T*, int64_t, const T*, const T*,     \
                                        const T*, const SsdDims&);                                                   \
  template void ssd_scan_ref_backward<T>(T*, T*, T*, T*, T*, T*, const T*, const T*, int64_t, const T*, const T*,   \
                                         int64_t, const T*, const T*, const T*, const SsdDims&);

EXMY_INSTANTIATE(float)
EXMY_INSTANTIATE(double)

}  // namespace exmy::models

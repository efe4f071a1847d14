#include "models/ssd.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "models/layer_rows.hpp"
#include "models/ssd_items.hpp"
#include "sim/gemm.hpp"
#include "sim/parallel.hpp"
#include "sim/tensor.hpp"

namespace exmy::models {

using sim::Buf;

// ---------------------------------------------------------------------------
// dt
// ---------------------------------------------------------------------------

// The per-element arithmetic is models/layer_rows.hpp's, shared with the
// kernels (models/layer_launches.hpp).
template <class T>
void mamba_dt_forward(T* dt, const T* dt_raw, int64_t ld, const T* dt_bias, int64_t N, int64_t H, double lo,
                      double hi) {
#pragma omp parallel for schedule(static) if (N * H >= sim::parallel_min_work())
  for (int64_t n = 0; n < N; ++n)
    for (int64_t h = 0; h < H; ++h) dt[n * H + h] = mamba_dt(dt_raw[n * ld + h], dt_bias[h], lo, hi);
}

template <class T>
void mamba_dt_backward(T* ddt_raw, int64_t ld, T* ddt_bias, const T* ddt, const T* dt_raw, const T* dt_bias, int64_t N,
                       int64_t H, double lo, double hi) {
  sim::rows_with_column_sums(ddt_bias, N, H, [&](int64_t n, T* pb) {
    for (int64_t h = 0; h < H; ++h) {
      const MambaDtGrad<T> d = mamba_dt_grad(ddt[n * H + h], dt_raw[n * ld + h], dt_bias[h], lo, hi);
      if (!d.live) continue;  // clamped: no gradient
      ddt_raw[n * ld + h] += d.g;
      pb[h] += d.g;
    }
  });
}

// ---------------------------------------------------------------------------
// Chunked SSD
// ---------------------------------------------------------------------------

template <class T>
void ssd_chunk_scan_forward(T* y, T* acs, T* states, const T* x, int64_t ldx, const T* Bm, const T* Cm, int64_t ldbc,
                            const T* dt, const T* A_log, const T* D, const SsdDims& d) {
  const int64_t S = d.seqlen, H = d.heads, P = d.head_dim, G = d.groups, N = d.state, Q = d.chunks();
  const SerialGemm gemm;
  // Multiply-adds of the scan, to decide whether threads pay off.
  const int64_t work = d.batch * S * H * (d.chunk + N) * P;

  // 1. Within each chunk: the diagonal-block output and the chunk's own
  //    contribution to the state at its end. One unit per (b, chunk, group),
  //    so C B^T is formed once for the heads that share it.
#pragma omp parallel for schedule(dynamic, 1) if (work >= sim::parallel_min_work())
  for (int64_t u = 0; u < d.batch * Q * G; ++u) {
    const int64_t Lc = ssd_chunk_of(d, u / (Q * G), (u / G) % Q).len;
    Buf<T> CB(static_cast<size_t>(Lc * Lc)), M(static_cast<size_t>(Lc * Lc)), XDT(static_cast<size_t>(Lc * P));
    ssd_fwd_chunk_group(gemm, y, acs, states, x, ldx, Bm, Cm, ldbc, dt, A_log, d, u / (Q * G), (u / G) % Q, u % G,
                        CB.data(), M.data(), XDT.data());
  }

  // 2. Pass the states along the chunks: states[q] becomes the state
  //    entering chunk q (zero for the first).
#pragma omp parallel for schedule(static) if (work >= sim::parallel_min_work())
  for (int64_t u = 0; u < d.batch * H; ++u) {
    std::vector<T> cur(static_cast<size_t>(P * N));
    ssd_fwd_pass_states(states, acs, d, u / H, u % H, cur.data());
  }

  // 3. Each chunk reads its incoming state, plus the D skip.
#pragma omp parallel for schedule(dynamic, 1) if (work >= sim::parallel_min_work())
  for (int64_t u = 0; u < d.batch * Q * H; ++u) {
    const int64_t Lc = ssd_chunk_of(d, u / (Q * H), (u / H) % Q).len;
    Buf<T> off(static_cast<size_t>(Lc * P));
    ssd_fwd_chunk_output(gemm, y, x, ldx, Cm, ldbc, D, acs, states, d, u / (Q * H), (u / H) % Q, u % H, off.data());
  }
}

template <class T>
void ssd_chunk_scan_backward(T* dx, T* dB, T* dC, T* ddt, T* dA_log, T* dD, const T* dy, const T* x, int64_t ldx,
                             const T* Bm, const T* Cm, int64_t ldbc, const T* dt, const T* A_log, const T* D,
                             const T* acs, const T* states, const SsdDims& d) {
  const int64_t S = d.seqlen, H = d.heads, P = d.head_dim, G = d.groups, N = d.state, Q = d.chunks();
  const SerialGemm gemm;
  Buf<T> dstates(static_cast<size_t>(d.states_size()));
  Buf<T> dlast(static_cast<size_t>(d.batch * H * Q));
  const int64_t work = d.batch * S * H * (d.chunk + N) * P;

  // 1. The gradient of the state entering each chunk from its outputs.
#pragma omp parallel for schedule(dynamic, 1) if (work >= sim::parallel_min_work())
  for (int64_t u = 0; u < d.batch * Q * H; ++u) {
    const int64_t Lc = ssd_chunk_of(d, u / (Q * H), (u / H) % Q).len;
    Buf<T> dye(static_cast<size_t>(Lc * P));
    ssd_bwd_dstates_from_outputs(gemm, dstates.data(), dy, Cm, ldbc, acs, d, u / (Q * H), (u / H) % Q, u % H,
                                 dye.data());
  }
  // 2. Back through the state passing: the gradient of every chunk's end state.
#pragma omp parallel for schedule(static) if (work >= sim::parallel_min_work())
  for (int64_t u = 0; u < d.batch * H; ++u) {
    std::vector<T> next(static_cast<size_t>(P * N));
    ssd_bwd_dstates_passing(dstates.data(), dlast.data(), acs, states, d, u / H, u % H, next.data());
  }

  // 3. Everything inside each chunk. One unit per (b, chunk, group): the
  //    heads of the group run in order and their B and C gradients are summed
  //    in that order. Per-head parameter gradients go to per-unit partials.
  Buf<T> pA(static_cast<size_t>(d.batch * Q * H)), pD(static_cast<size_t>(d.batch * Q * H));
#pragma omp parallel for schedule(dynamic, 1) if (work >= sim::parallel_min_work())
  for (int64_t u = 0; u < d.batch * Q * G; ++u) {
    const int64_t Lc = ssd_chunk_of(d, u / (Q * G), (u / G) % Q).len;
    Buf<T> scratch(static_cast<size_t>(ssd_group_scratch_size(Lc, P, N)));
    ssd_bwd_chunk_group(gemm, ssd_group_scratch(scratch.data(), Lc, P, N), dx, dB, dC, ddt, pA.data(), pD.data(), dy,
                        x, ldx, Bm, Cm, ldbc, dt, A_log, D, acs, states, dstates.data(), dlast.data(), d, u / (Q * G),
                        (u / G) % Q, u % G);
  }
  // 4. The parameter gradients: each head's partials in (b, chunk) order.
  for (int64_t h = 0; h < H; ++h) ssd_bwd_param_sums(dA_log, dD, pA.data(), pD.data(), d, h);
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

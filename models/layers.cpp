#include "models/layers.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "models/layer_rows.hpp"
#include "sim/parallel.hpp"
#include "sim/tensor.hpp"

namespace exmy::models {
namespace {

// Channels per block when a kernel is parallel over channels (the weight
// gradient of a channel is then one thread's sum over tokens, in order).
constexpr int64_t kChanBlock = 64;

using sim::rows_with_column_sums;

}  // namespace

template <class T>
void embedding_forward(T* out, const int32_t* tokens, const T* wte, int64_t N, int64_t C) {
#pragma omp parallel for schedule(static) if (N * C >= sim::parallel_min_work())
  for (int64_t n = 0; n < N; ++n) std::copy_n(wte + static_cast<int64_t>(tokens[n]) * C, C, out + n * C);
}

template <class T>
void embedding_backward(T* dwte, const T* dout, const int32_t* tokens, int64_t N, int64_t C) {
  // Parallel over channel blocks; each block adds the tokens in order, so a
  // row that occurs twice is summed the same way for any thread count.
  const int64_t nb = (C + kChanBlock - 1) / kChanBlock;
#pragma omp parallel for schedule(static) if (N * C >= sim::parallel_min_work())
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t c0 = b * kChanBlock, c1 = std::min(C, c0 + kChanBlock);
    for (int64_t n = 0; n < N; ++n) {
      T* d = dwte + static_cast<int64_t>(tokens[n]) * C;
      const T* g = dout + n * C;
      for (int64_t c = c0; c < c1; ++c) d[c] += g[c];
    }
  }
}

template <class T>
void rmsnorm_forward(T* out, T* rstd, const T* x, const T* w, int64_t N, int64_t C, double eps) {
#pragma omp parallel for schedule(static) if (N * C >= sim::parallel_min_work())
  for (int64_t n = 0; n < N; ++n) {
    const T* xr = x + n * C;
    const T r = rmsnorm_rstd(xr, C, eps);
    rstd[n] = r;
    T* o = out + n * C;
    for (int64_t c = 0; c < C; ++c) o[c] = rmsnorm_out(w[c], xr[c], r);
  }
}

template <class T>
void rmsnorm_backward(T* dx, T* dw, const T* dout, const T* x, const T* w, const T* rstd, int64_t N, int64_t C) {
  // xhat = x r, out = w xhat:  dx = r (g - xhat mean(g xhat)) with g = dout w.
  rows_with_column_sums(dw, N, C, [&](int64_t n, T* pdw) {
    const T* xr = x + n * C;
    const T* go = dout + n * C;
    const T r = rstd[n];
    const T m = rmsnorm_grad_mean(go, w, xr, r, C);
    T* d = dx + n * C;
    for (int64_t c = 0; c < C; ++c) {
      d[c] += rmsnorm_dx(go[c], w[c], xr[c], r, m);
      pdw[c] += rmsnorm_dw(go[c], xr[c], r);
    }
  });
}

template <class T>
void gated_rmsnorm_forward(T* out, T* rstd, const T* y, int64_t ldy, const T* z, int64_t ldz, const T* w, int64_t N,
                           int64_t D, int64_t G, double eps) {
  const int64_t gs = D / G;
#pragma omp parallel for schedule(static) if (N * D >= sim::parallel_min_work())
  for (int64_t n = 0; n < N; ++n) {
    const T* yr = y + n * ldy;
    const T* zr = z + n * ldz;
    T* o = out + n * D;
    for (int64_t g = 0; g < G; ++g) {
      const T r = gated_rstd(o, yr, zr, g * gs, (g + 1) * gs, eps);
      rstd[n * G + g] = r;
      for (int64_t c = g * gs; c < (g + 1) * gs; ++c) o[c] = rmsnorm_out(w[c], o[c], r);
    }
  }
}

template <class T>
void gated_rmsnorm_backward(T* dy, int64_t lddy, T* dz, int64_t lddz, T* dw, const T* dout, const T* y, int64_t ldy,
                            const T* z, int64_t ldz, const T* w, const T* rstd, int64_t N, int64_t D, int64_t G) {
  const int64_t gs = D / G;
  rows_with_column_sums(dw, N, D, [&](int64_t n, T* pdw) {
    const T* yr = y + n * ldy;
    const T* zr = z + n * ldz;
    const T* go = dout + n * D;
    T* dyr = dy + n * lddy;
    T* dzr = dz + n * lddz;
    for (int64_t g = 0; g < G; ++g) {
      const T r = rstd[n * G + g];
      const T m = gated_grad_mean(go, w, yr, zr, r, g * gs, (g + 1) * gs);
      for (int64_t c = g * gs; c < (g + 1) * gs; ++c) {
        const GatedGrads<T> d = gated_grads(go[c], w[c], yr[c], zr[c], r, m);
        dyr[c] += d.dy;
        dzr[c] += d.dz;
        pdw[c] += d.dw;
      }
    }
  });
}

template <class T>
void conv1d_silu_forward(T* out, const T* x, int64_t ldx, const T* w, const T* bias, int64_t B, int64_t T_, int64_t Cc,
                         int64_t K) {
#pragma omp parallel for schedule(static) if (B * T_ * Cc * K >= sim::parallel_min_work())
  for (int64_t bt = 0; bt < B * T_; ++bt) {
    const int64_t t = bt % T_;
    T* o = out + bt * Cc;
    for (int64_t c = 0; c < Cc; ++c) o[c] = bias ? bias[c] : T(0);
    for (int64_t k = 0; k < K; ++k) {
      const int64_t ts = t + k - (K - 1);
      if (ts < 0) continue;
      const T* xr = x + (bt + k - (K - 1)) * ldx;
      for (int64_t c = 0; c < Cc; ++c) o[c] += w[c * K + k] * xr[c];
    }
    for (int64_t c = 0; c < Cc; ++c) o[c] = silu_hd(o[c]);
  }
}

template <class T>
void conv1d_silu_backward(T* dx, int64_t lddx, T* dw, T* dbias, const T* dout, const T* x, int64_t ldx, const T* w,
                          const T* bias, int64_t B, int64_t T_, int64_t Cc, int64_t K) {
  // Parallel over channel blocks: the weight and bias gradients of a channel
  // are sums over (b, t) that one thread takes in order.
  const int64_t nb = (Cc + kChanBlock - 1) / kChanBlock;
#pragma omp parallel for schedule(static) if (B * T_ * Cc * K >= sim::parallel_min_work())
  for (int64_t blk = 0; blk < nb; ++blk) {
    const int64_t c0 = blk * kChanBlock, c1 = std::min(Cc, c0 + kChanBlock), cw = c1 - c0;
    std::vector<T> dpre(static_cast<size_t>(T_ * cw));
    for (int64_t b = 0; b < B; ++b) {
      const T* xb = x + b * T_ * ldx;
      // Pre-activation (recomputed) and its gradient through SiLU.
      for (int64_t t = 0; t < T_; ++t) {
        T* dp = dpre.data() + t * cw;
        for (int64_t c = c0; c < c1; ++c) dp[c - c0] = bias ? bias[c] : T(0);
        for (int64_t k = 0; k < K; ++k) {
          const int64_t ts = t + k - (K - 1);
          if (ts < 0) continue;
          for (int64_t c = c0; c < c1; ++c) dp[c - c0] += w[c * K + k] * xb[ts * ldx + c];
        }
        const T* go = dout + (b * T_ + t) * Cc;
        for (int64_t c = c0; c < c1; ++c) dp[c - c0] = silu_grad(go[c], dp[c - c0]);
      }
      for (int64_t t = 0; t < T_; ++t) {
        const T* dp = dpre.data() + t * cw;
        if (dbias)
          for (int64_t c = c0; c < c1; ++c) dbias[c] += dp[c - c0];
        for (int64_t k = 0; k < K; ++k) {
          const int64_t ts = t + k - (K - 1);
          if (ts < 0) continue;
          T* dxr = dx + (b * T_ + ts) * lddx;
          const T* xr = xb + ts * ldx;
          for (int64_t c = c0; c < c1; ++c) {
            dxr[c] += w[c * K + k] * dp[c - c0];
            dw[c * K + k] += dp[c - c0] * xr[c];
          }
        }
      }
    }
  }
}

template <class T>
void relu2_forward(T* out, const T* in, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= sim::parallel_min_work())
  for (int64_t i = 0; i < n; ++i) out[i] = relu2(in[i]);
}

template <class T>
void relu2_backward(T* din, const T* dout, const T* in, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= sim::parallel_min_work())
  for (int64_t i = 0; i < n; ++i) din[i] += relu2_grad(dout[i], in[i]);
}

template <class T>
void add_forward(T* out, const T* a, const T* b, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= sim::parallel_min_work())
  for (int64_t i = 0; i < n; ++i) out[i] = residual_add(a[i], b[i]);
}

template <class T>
double cross_entropy_forward(double* losses, int64_t* counted, const T* logits, const int32_t* targets, int64_t N,
                             int64_t V) {
#pragma omp parallel for schedule(static) if (N * V >= sim::parallel_min_work())
  for (int64_t n = 0; n < N; ++n) ce_row_forward(losses, logits, targets, n, V);
  return ce_mean(losses, targets, N, counted);
}

template <class T>
void cross_entropy_backward(T* dlogits, const T* logits, const int32_t* targets, int64_t N, int64_t V, double scale) {
#pragma omp parallel for schedule(static) if (N * V >= sim::parallel_min_work())
  for (int64_t n = 0; n < N; ++n) {
    if (targets[n] < 0) continue;
    const T* l = logits + n * V;
    T* d = dlogits + n * V;
    const T mx = ce_row_max(l, V);
    const T inv = static_cast<T>(1.0 / ce_row_sumexp(l, V, mx));
    const T sc = static_cast<T>(scale);
    for (int64_t v = 0; v < V; ++v) d[v] += ce_grad(sc, l[v], mx, inv);
    d[targets[n]] -= sc;
  }
}

#define EXMY_INSTANTIATE(T)                                                                                        \
  template void embedding_forward<T>(T*, const int32_t*, const T*, int64_t, int64_t);                              \
  template void embedding_backward<T>(T*, const T*, const int32_t*, int64_t, int64_t);                             \
  template void rmsnorm_forward<T>(T*, T*, const T*, const T*, int64_t, int64_t, double);                          \
  template void rmsnorm_backward<T>(T*, T*, const T*, const T*, const T*, const T*, int64_t, int64_t);             \
  template void gated_rmsnorm_forward<T>(T*, T*, const T*, int64_t, const T*, int64_t, const T*, int64_t, int64_t, \
                                         int64_t, double);                                                         \
  template void gated_rmsnorm_backward<T>(T*, int64_t, T*, int64_t, T*, const T*, const T*, int64_t, const T*,     \
                                          int64_t, const T*, const T*, int64_t, int64_t, int64_t);                 \
  template void conv1d_silu_forward<T>(T*, const T*, int64_t, const T*, const T*, int64_t, int64_t, int64_t,       \
                                       int64_t);                                                                   \
  template void conv1d_silu_backward<T>(T*, int64_t, T*, T*, const T*, const T*, int64_t, const T*, const T*,      \
                                        int64_t, int64_t, int64_t, int64_t);                                       \
  template void relu2_forward<T>(T*, const T*, int64_t);                                                           \
  template void relu2_backward<T>(T*, const T*, const T*, int64_t);                                                \
  template void add_forward<T>(T*, const T*, const T*, int64_t);                                                   \
  template double cross_entropy_forward<T>(double*, int64_t*, const T*, const int32_t*, int64_t, int64_t);         \
  template void cross_entropy_backward<T>(T*, const T*, const int32_t*, int64_t, int64_t, double);

EXMY_INSTANTIATE(float)
EXMY_INSTANTIATE(double)

}  // namespace exmy::models

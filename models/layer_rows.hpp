// The per-row and per-element arithmetic of the layers in models/layers.cpp,
// as plain EXMY_HD (host + device) functions: the CPU layers call them from
// their OpenMP loops and the CUDA kernels (models/cuda/layers.cu) from their
// threads, so both backends compute each value with the same operations in
// the same order (docs/architecture.md, "CPU and GPU share code"). Sums keep
// the CPU's order (element after element), which is what makes the device's
// results equal the CPU's bit for bit; nothing here may be reordered without
// changing the CPU's bits.
#pragma once

#include <cstdint>

#include "formats/format.hpp"  // EXMY_HD
#include "sim/bf16.hpp"  // round_bf16_hd
#include "sim/hd_math.hpp"

namespace exmy::models {

using sim::hd_exp;
using sim::hd_log;
using sim::hd_log1p;
using sim::hd_sqrt;

// RMSNorm. rstd of a row xr (C): 1/sqrt(mean(x^2) + eps), the squares summed
// in column order.
template <class T>
EXMY_HD T rmsnorm_rstd(const T* xr, int64_t C, double eps) {
  T ss = 0;
  for (int64_t c = 0; c < C; ++c) ss += xr[c] * xr[c];
  return T(1) / hd_sqrt(ss / static_cast<T>(C) + static_cast<T>(eps));
}
// One output element: w * (x * rstd).
template <class T>
EXMY_HD T rmsnorm_out(T w, T x, T r) {
  return w * (x * r);
}
// Backward, per row: m = mean over c of dout * w * (x * rstd), in column order.
template <class T>
EXMY_HD T rmsnorm_grad_mean(const T* go, const T* w, const T* xr, T r, int64_t C) {
  T dot = 0;
  for (int64_t c = 0; c < C; ++c) dot += go[c] * w[c] * (xr[c] * r);
  return dot / static_cast<T>(C);
}
// Backward, per element: the dx term r (dout w - xhat m), xhat = x r.
template <class T>
EXMY_HD T rmsnorm_dx(T go, T w, T x, T r, T m) {
  const T xh = x * r;
  return r * (go * w - xh * m);
}
// Backward, per element: the dw term dout * xhat.
template <class T>
EXMY_HD T rmsnorm_dw(T go, T x, T r) {
  return go * (x * r);
}

// sigmoid and silu (as models/layers.hpp's, through hd_exp).
template <class T>
EXMY_HD T sigmoid_hd(T x) {
  return T(1) / (T(1) + hd_exp(-x));
}
template <class T>
EXMY_HD T silu_hd(T x) {
  return x * sigmoid_hd(x);
}

// dout * silu'(p) (the conv1d + SiLU backward through its activation).
template <class T>
EXMY_HD T silu_grad(T go, T p) {
  const T s = sigmoid_hd(p);
  return go * (s * (T(1) + p * (T(1) - s)));
}

// The causal depthwise conv1d's pre-activation at (bt, c), t = bt % T: the
// bias (or 0), then w[c, k] x[bt + k - (K-1), c] added for k = 0, 1, ...
// (taps before t = 0 skipped): the CPU's order, which loops k outside c.
template <class T>
EXMY_HD T conv1d_pre(const T* x, int64_t ldx, const T* w, const T* bias, int64_t bt, int64_t t, int64_t c,
                     int64_t K) {
  T o = bias ? bias[c] : T(0);
  for (int64_t k = 0; k < K; ++k) {
    if (t + k - (K - 1) < 0) continue;
    o += w[c * K + k] * x[(bt + k - (K - 1)) * ldx + c];
  }
  return o;
}

// Gated grouped RMSNorm (models/layers.hpp), one group [c0, c1) of a row:
// rstd over g = y * silu(z) (squares summed in column order), each g stored
// into v[c] on the way (the output is then rmsnorm_out(w, v, rstd)).
template <class T>
EXMY_HD T gated_rstd(T* v, const T* yr, const T* zr, int64_t c0, int64_t c1, double eps) {
  T ss = 0;
  for (int64_t c = c0; c < c1; ++c) {
    const T g = yr[c] * silu_hd(zr[c]);
    v[c] = g;
    ss += g * g;
  }
  return T(1) / hd_sqrt(ss / static_cast<T>(c1 - c0) + static_cast<T>(eps));
}
// Backward, per group: the mean over [c0, c1) of dout * w * (g * rstd).
template <class T>
EXMY_HD T gated_grad_mean(const T* go, const T* w, const T* yr, const T* zr, T r, int64_t c0, int64_t c1) {
  T dot = 0;
  for (int64_t c = c0; c < c1; ++c) dot += go[c] * w[c] * (yr[c] * silu_hd(zr[c]) * r);
  return dot / static_cast<T>(c1 - c0);
}
// Backward, per element: the terms added to dy, dz and dw.
template <class T>
struct GatedGrads {
  T dy, dz, dw;
};
template <class T>
EXMY_HD GatedGrads<T> gated_grads(T go, T w, T y, T z, T r, T m) {
  const T s = sigmoid_hd(z);
  const T sz = z * s;       // silu(z)
  const T gh = y * sz * r;  // normalised gated value
  const T dg = r * (go * w - gh * m);
  return {dg * sz, dg * y * (s * (T(1) + z * (T(1) - s))), go * gh};  // silu'(z) in dz
}

// Squared ReLU: relu(x)^2, and the gradient term dout * 2 relu(x).
template <class T>
EXMY_HD T relu2(T x) {
  const T r = x > T(0) ? x : T(0);
  return r * r;
}
template <class T>
EXMY_HD T relu2_grad(T dout, T x) {
  const T r = x > T(0) ? x : T(0);
  return dout * (T(2) * r);
}

// The residual add (models/layers.hpp's add_forward), one element.
template <class T>
EXMY_HD T residual_add(T a, T b) {
  return a + b;
}

// Mamba-2's time step (models/ssd.hpp's mamba_dt_forward and
// mamba_dt_backward), one element (n, h) with v = dt_raw + dt_bias.
// softplus as models/layers.hpp's (torch's, threshold 20), through hd_exp
// and hd_log1p.
template <class T>
EXMY_HD T softplus_hd(T x) {
  return x > T(20) ? x : hd_log1p(hd_exp(x));
}
// dt = clamp(softplus(v), lo, hi) as std::clamp makes it (libstdc++:
// min(max(sp, lo), hi)), so a NaN passes through.
template <class T>
EXMY_HD T mamba_dt(T raw, T bias, double lo, double hi) {
  const T sp = softplus_hd(raw + bias);
  const T l = static_cast<T>(lo), h = static_cast<T>(hi);
  const T m = sp < l ? l : sp;  // std::max(sp, lo)
  return h < m ? h : m;         // std::min(m, hi)
}
// Backward: live is false where softplus(v) lies outside [lo, hi] (the
// clamp's flat parts: no gradient, nothing is added anywhere); otherwise g
// = ddt * softplus'(v), softplus' = 1 above the threshold, sigmoid(v) below.
template <class T>
struct MambaDtGrad {
  T g;
  bool live;
};
template <class T>
EXMY_HD MambaDtGrad<T> mamba_dt_grad(T ddt, T raw, T bias, double lo, double hi) {
  const T v = raw + bias;
  const T sp = softplus_hd(v);
  if (sp < static_cast<T>(lo) || sp > static_cast<T>(hi)) return {T(0), false};
  return {ddt * (v > T(20) ? T(1) : sigmoid_hd(v)), true};
}

// Cross-entropy of one row l (V) of logits. The row runs in segments of
// kCeSegment columns: the max of each segment (element after element, as
// std::max orders them), the row's max over the segments' in segment order;
// the sum of exp(l - max) of each segment in double from 0, column after
// column, and the row's sum over the segments' in segment order. A device
// gives each (row, segment) a thread and each row one more for the
// combination; the CPU runs the same functions row by row, so both make
// the same bits (a row of at most kCeSegment columns sums in column order).
// Then the row's loss max + log(sum) - l[target] in double, and one
// element's gradient term scale * (exp(l - max) * inv), inv = 1 / sum
// rounded to T.
inline constexpr int64_t kCeSegment = 1024;
EXMY_HD int64_t ce_segments(int64_t V) { return (V + kCeSegment - 1) / kCeSegment; }
template <class T>
EXMY_HD T ce_max_of(T mx, T v) {
  return mx < v ? v : mx;
}
// The end of segment s of a row of V columns (it starts at s * kCeSegment).
EXMY_HD int64_t ce_segment_end(int64_t V, int64_t s) {
  return (s + 1) * kCeSegment < V ? (s + 1) * kCeSegment : V;
}
template <class T>
EXMY_HD T ce_segment_max(const T* l, int64_t V, int64_t s) {
  const int64_t v0 = s * kCeSegment, v1 = ce_segment_end(V, s);
  T mx = l[v0];
  for (int64_t v = v0 + 1; v < v1; ++v) mx = ce_max_of(mx, l[v]);
  return mx;
}
template <class T>
EXMY_HD double ce_segment_sumexp(const T* l, int64_t V, int64_t s, T mx) {
  const int64_t v0 = s * kCeSegment, v1 = ce_segment_end(V, s);
  double sum = 0;
  for (int64_t v = v0; v < v1; ++v) sum += static_cast<double>(hd_exp(l[v] - mx));
  return sum;
}
// The row's max from its segments' maxima (seg[0 .. S)), and its sum from
// its segments' sums.
template <class T>
EXMY_HD T ce_combine_max(const T* seg, int64_t S) {
  T mx = seg[0];
  for (int64_t s = 1; s < S; ++s) mx = ce_max_of(mx, seg[s]);
  return mx;
}
EXMY_HD double ce_combine_sums(const double* seg, int64_t S) {
  double sum = 0;
  for (int64_t s = 0; s < S; ++s) sum += seg[s];
  return sum;
}
// The same, a row at a time (the CPU's loops).
template <class T>
EXMY_HD T ce_row_max(const T* l, int64_t V) {
  T mx = ce_segment_max(l, V, 0);
  for (int64_t s = 1, S = ce_segments(V); s < S; ++s) mx = ce_max_of(mx, ce_segment_max(l, V, s));
  return mx;
}
template <class T>
EXMY_HD double ce_row_sumexp(const T* l, int64_t V, T mx) {
  double sum = 0;
  for (int64_t s = 0, S = ce_segments(V); s < S; ++s) sum += ce_segment_sumexp(l, V, s, mx);
  return sum;
}
template <class T>
EXMY_HD double ce_row_loss(T mx, double sumexp, T l_target) {
  return static_cast<double>(mx) + hd_log(sumexp) - static_cast<double>(l_target);
}
template <class T>
EXMY_HD T ce_grad(T sc, T lv, T mx, T inv) {
  return sc * (hd_exp(lv - mx) * inv);
}
// Row n of the forward: losses[n] (0 for an ignored row, target < 0).
template <class T>
EXMY_HD void ce_row_forward(double* losses, const T* logits, const int32_t* targets, int64_t n, int64_t V) {
  if (targets[n] < 0) {
    losses[n] = 0;
    return;
  }
  const T* l = logits + n * V;
  const T mx = ce_row_max(l, V);
  losses[n] = ce_row_loss(mx, ce_row_sumexp(l, V, mx), l[targets[n]]);
}
// The reported loss: the mean of the counted rows' losses, summed in double
// in row order; *counted gets their number.
EXMY_HD double ce_mean(const double* losses, const int32_t* targets, int64_t N, int64_t* counted) {
  double total = 0;
  int64_t cnt = 0;
  for (int64_t n = 0; n < N; ++n) {
    if (targets[n] < 0) continue;
    total += losses[n];
    ++cnt;
  }
  if (counted) *counted = cnt;
  return cnt ? total / static_cast<double>(cnt) : 0.0;
}

}  // namespace exmy::models

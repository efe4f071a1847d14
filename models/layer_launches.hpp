// The launch sequences of the layer kernels, written once over a launcher
// (sim/kernel_launch.hpp): models/cuda/layers.cu instantiates them with
// DeviceLaunch, models/layers_emulated.cpp with HostLaunch. Each thread body
// is a call of the per-row/per-element functions of models/layer_rows.hpp,
// which the CPU layers (models/layers.cpp) call too, in the same order, so
// the results equal the CPU's bit for bit. Float32 only (the training type).
#pragma once

#include <cstdint>
#include <string>

#include "models/layer_rows.hpp"
#include "sim/kernel_launch.hpp"

namespace exmy::models {

// Rows per partial column sum of the weight gradients: sim::kRowBlock of
// rows_with_column_sums, which fixes the CPU's order (checked in
// models/layers_emulated.cpp).
inline constexpr int64_t kGradRowBlock = 32;

// Scratch floats of rmsnorm_backward: the per-row means (N) and the partial
// column sums (ceil(N / kGradRowBlock) x C).
inline int64_t rmsnorm_backward_scratch(int64_t N, int64_t C) {
  return N + (N + kGradRowBlock - 1) / kGradRowBlock * C;
}

// acc (C) += the column sums over rows [0, N) of term(n, c), in the order of
// sim::rows_with_column_sums: a thread per (row block, column) makes the
// block's partial (rows in order, from +0) into part (ceil(N /
// kGradRowBlock) x C), then a thread per column adds the partials in block
// order.
template <class L, class Term>
void column_sums_launches(const L& launch, const char* name, float* acc, int64_t N, int64_t C, float* part,
                          Term term) {
  const int64_t nb = (N + kGradRowBlock - 1) / kGradRowBlock;
  launch(name, nb * C, [=] EXMY_HD_LAMBDA(int64_t j) {
    const int64_t b = j / C, c = j % C;
    const int64_t n1 = (b + 1) * kGradRowBlock < N ? (b + 1) * kGradRowBlock : N;
    float p = 0.0f;
    for (int64_t n = b * kGradRowBlock; n < n1; ++n) p += term(n, c);
    part[j] = p;
  });
  launch(name, C, [=] EXMY_HD_LAMBDA(int64_t c) {
    float a = acc[c];
    for (int64_t b = 0; b < nb; ++b) a += part[b * C + c];
    acc[c] = a;
  });
}

// rmsnorm_forward of models/layers.hpp: a thread per row for rstd (its sum
// in column order), then a thread per element.
template <class L>
void rmsnorm_forward_launches(const L& launch, float* out, float* rstd, const float* x, const float* w, int64_t N,
                              int64_t C, double eps) {
  launch("rmsnorm_forward rstd", N, [=] EXMY_HD_LAMBDA(int64_t n) { rstd[n] = rmsnorm_rstd(x + n * C, C, eps); });
  launch("rmsnorm_forward out", N * C,
         [=] EXMY_HD_LAMBDA(int64_t i) { out[i] = rmsnorm_out(w[i % C], x[i], rstd[i / C]); });
}

// rmsnorm_backward of models/layers.hpp (dx +=, dw +=): a thread per row for
// its mean, a thread per element for dx, then dw by column_sums_launches.
template <class L>
void rmsnorm_backward_launches(const L& launch, float* dx, float* dw, const float* dout, const float* x,
                               const float* w, const float* rstd, int64_t N, int64_t C, float* scratch) {
  float* mean = scratch;
  launch("rmsnorm_backward mean", N, [=] EXMY_HD_LAMBDA(int64_t n) {
    mean[n] = rmsnorm_grad_mean(dout + n * C, w, x + n * C, rstd[n], C);
  });
  launch("rmsnorm_backward dx", N * C, [=] EXMY_HD_LAMBDA(int64_t i) {
    const int64_t n = i / C;
    dx[i] += rmsnorm_dx(dout[i], w[i % C], x[i], rstd[n], mean[n]);
  });
  column_sums_launches(launch, "rmsnorm_backward dw", dw, N, C, scratch + N, [=] EXMY_HD_LAMBDA(int64_t n, int64_t c) {
    return rmsnorm_dw(dout[n * C + c], x[n * C + c], rstd[n]);
  });
}

// Scratch floats of gated_rmsnorm_backward: the per-(row, group) means (N x
// G) and the partial column sums of dw.
inline int64_t gated_rmsnorm_backward_scratch(int64_t N, int64_t D, int64_t G) {
  return N * G + (N + kGradRowBlock - 1) / kGradRowBlock * D;
}

// gated_rmsnorm_forward: a thread per (row, group) for its rstd (storing the
// gated values into out on the way, as the CPU does), then a thread per
// element scaling them.
template <class L>
void gated_rmsnorm_forward_launches(const L& launch, float* out, float* rstd, const float* y, int64_t ldy,
                                    const float* z, int64_t ldz, const float* w, int64_t N, int64_t D, int64_t G,
                                    double eps) {
  const int64_t gs = D / G;
  launch("gated_rmsnorm_forward rstd", N * G, [=] EXMY_HD_LAMBDA(int64_t j) {
    const int64_t n = j / G, g = j % G;
    rstd[j] = gated_rstd(out + n * D, y + n * ldy, z + n * ldz, g * gs, (g + 1) * gs, eps);
  });
  launch("gated_rmsnorm_forward out", N * D, [=] EXMY_HD_LAMBDA(int64_t i) {
    const int64_t n = i / D, c = i % D;
    out[i] = rmsnorm_out(w[c], out[i], rstd[n * G + c / gs]);
  });
}

// gated_rmsnorm_backward (dy +=, dz +=, dw +=): a thread per (row, group)
// for its mean, a thread per element for dy and dz, then dw by
// column_sums_launches.
template <class L>
void gated_rmsnorm_backward_launches(const L& launch, float* dy, int64_t lddy, float* dz, int64_t lddz, float* dw,
                                     const float* dout, const float* y, int64_t ldy, const float* z, int64_t ldz,
                                     const float* w, const float* rstd, int64_t N, int64_t D, int64_t G,
                                     float* scratch) {
  const int64_t gs = D / G;
  float* mean = scratch;
  launch("gated_rmsnorm_backward mean", N * G, [=] EXMY_HD_LAMBDA(int64_t j) {
    const int64_t n = j / G, g = j % G;
    mean[j] = gated_grad_mean(dout + n * D, w, y + n * ldy, z + n * ldz, rstd[j], g * gs, (g + 1) * gs);
  });
  launch("gated_rmsnorm_backward dy dz", N * D, [=] EXMY_HD_LAMBDA(int64_t i) {
    const int64_t n = i / D, c = i % D, j = n * G + c / gs;
    const GatedGrads<float> d = gated_grads(dout[i], w[c], y[n * ldy + c], z[n * ldz + c], rstd[j], mean[j]);
    dy[n * lddy + c] += d.dy;
    dz[n * lddz + c] += d.dz;
  });
  column_sums_launches(launch, "gated_rmsnorm_backward dw", dw, N, D, scratch + N * G,
                       [=] EXMY_HD_LAMBDA(int64_t n, int64_t c) {
                         const int64_t j = n * G + c / gs;
                         return gated_grads(dout[n * D + c], w[c], y[n * ldy + c], z[n * ldz + c], rstd[j], mean[j]).dw;
                       });
}

// conv1d_silu_forward: a thread per output element (its taps in the CPU's
// order, conv1d_pre, then silu).
template <class L>
void conv1d_silu_forward_launches(const L& launch, float* out, const float* x, int64_t ldx, const float* w,
                                  const float* bias, int64_t B, int64_t T, int64_t Cc, int64_t K) {
  launch("conv1d_silu_forward", B * T * Cc, [=] EXMY_HD_LAMBDA(int64_t i) {
    const int64_t bt = i / Cc, c = i % Cc;
    out[i] = silu_hd(conv1d_pre(x, ldx, w, bias, bt, bt % T, c, K));
  });
}

// Scratch floats of conv1d_silu_backward: the gradient at the
// pre-activation (B x T x Cc).
inline int64_t conv1d_silu_backward_scratch(int64_t B, int64_t T, int64_t Cc) { return B * T * Cc; }

// conv1d_silu_backward (dx +=, dw +=, dbias +=), in the CPU's orders: a
// thread per element for the gradient at the pre-activation (recomputed);
// a thread per element of dx adding its taps' terms by increasing t (the
// CPU's outer loop); a thread per (c, k) of dw and per c of dbias summing
// over b, then t.
template <class L>
void conv1d_silu_backward_launches(const L& launch, float* dx, int64_t lddx, float* dw, float* dbias,
                                   const float* dout, const float* x, int64_t ldx, const float* w, const float* bias,
                                   int64_t B, int64_t T, int64_t Cc, int64_t K, float* scratch) {
  float* dp = scratch;
  launch("conv1d_silu_backward dpre", B * T * Cc, [=] EXMY_HD_LAMBDA(int64_t i) {
    const int64_t bt = i / Cc, c = i % Cc;
    dp[i] = silu_grad(dout[i], conv1d_pre(x, ldx, w, bias, bt, bt % T, c, K));
  });
  launch("conv1d_silu_backward dx", B * T * Cc, [=] EXMY_HD_LAMBDA(int64_t i) {
    const int64_t bts = i / Cc, c = i % Cc, ts = bts % T, b0 = bts - ts;
    float* d = dx + bts * lddx + c;
    float acc = *d;
    for (int64_t t = ts; t < T && t <= ts + K - 1; ++t) acc += w[c * K + (ts - t + K - 1)] * dp[(b0 + t) * Cc + c];
    *d = acc;
  });
  launch("conv1d_silu_backward dw", Cc * K, [=] EXMY_HD_LAMBDA(int64_t j) {
    const int64_t c = j / K, k = j % K;
    float acc = dw[j];
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t) {
        const int64_t ts = t + k - (K - 1);
        if (ts < 0) continue;
        acc += dp[(b * T + t) * Cc + c] * x[(b * T + ts) * ldx + c];
      }
    dw[j] = acc;
  });
  if (dbias)
    launch("conv1d_silu_backward dbias", Cc, [=] EXMY_HD_LAMBDA(int64_t c) {
      float acc = dbias[c];
      for (int64_t bt = 0; bt < B * T; ++bt) acc += dp[bt * Cc + c];
      dbias[c] = acc;
    });
}

// relu2_forward / relu2_backward (din +=) of models/layers.hpp: a thread per element.
template <class L>
void relu2_forward_launches(const L& launch, float* out, const float* in, int64_t n) {
  launch("relu2_forward", n, [=] EXMY_HD_LAMBDA(int64_t i) { out[i] = relu2(in[i]); });
}
template <class L>
void relu2_backward_launches(const L& launch, float* din, const float* dout, const float* in, int64_t n) {
  launch("relu2_backward", n, [=] EXMY_HD_LAMBDA(int64_t i) { din[i] += relu2_grad(dout[i], in[i]); });
}

// add_forward of models/layers.hpp (the residual add): a thread per element.
template <class L>
void add_forward_launches(const L& launch, float* out, const float* a, const float* b, int64_t n) {
  launch("add_forward", n, [=] EXMY_HD_LAMBDA(int64_t i) { out[i] = residual_add(a[i], b[i]); });
}

// sim::round_bf16 (float; out may be in): a thread per element.
template <class L>
void round_bf16_launches(const L& launch, float* out, const float* in, int64_t n) {
  launch("round_bf16", n, [=] EXMY_HD_LAMBDA(int64_t i) { out[i] = sim::round_bf16_hd(in[i]); });
}

// mamba_dt_forward of models/ssd.hpp: a thread per element of dt (N x H),
// dt_raw's rows ld apart.
template <class L>
void mamba_dt_forward_launches(const L& launch, float* dt, const float* dt_raw, int64_t ld, const float* dt_bias,
                               int64_t N, int64_t H, double lo, double hi) {
  launch("mamba_dt_forward", N * H, [=] EXMY_HD_LAMBDA(int64_t i) {
    const int64_t n = i / H, h = i % H;
    dt[i] = mamba_dt(dt_raw[n * ld + h], dt_bias[h], lo, hi);
  });
}

// Scratch floats of mamba_dt_backward: the partial column sums of ddt_bias.
inline int64_t mamba_dt_backward_scratch(int64_t N, int64_t H) { return (N + kGradRowBlock - 1) / kGradRowBlock * H; }

// mamba_dt_backward of models/ssd.hpp (ddt_raw +=, ddt_bias +=; ddt_raw
// must not overlap ddt or dt_raw): a thread per element adding its gradient
// to ddt_raw where the clamp passes it, then ddt_bias by
// column_sums_launches over the same gradients (recomputed), 0 where
// clamped. The CPU skips those instead; adding +0 to a partial that starts
// at +0 is the same bits (such a partial is never -0, and x + +0 = x for
// every other x, NaN included), and ddt_raw, which may hold -0, is not
// touched there.
template <class L>
void mamba_dt_backward_launches(const L& launch, float* ddt_raw, int64_t ld, float* ddt_bias, const float* ddt,
                                const float* dt_raw, const float* dt_bias, int64_t N, int64_t H, double lo, double hi,
                                float* scratch) {
  launch("mamba_dt_backward draw", N * H, [=] EXMY_HD_LAMBDA(int64_t i) {
    const int64_t n = i / H, h = i % H;
    const MambaDtGrad<float> d = mamba_dt_grad(ddt[i], dt_raw[n * ld + h], dt_bias[h], lo, hi);
    if (d.live) ddt_raw[n * ld + h] += d.g;
  });
  column_sums_launches(launch, "mamba_dt_backward dbias", ddt_bias, N, H, scratch,
                       [=] EXMY_HD_LAMBDA(int64_t n, int64_t h) {
                         const MambaDtGrad<float> d = mamba_dt_grad(ddt[n * H + h], dt_raw[n * ld + h], dt_bias[h],
                                                                    lo, hi);
                         return d.live ? d.g : 0.0f;
                       });
}

// Scratch floats of cross_entropy_forward and _backward: per (row,
// segment) its double sum and its max, then per row its max and (backward)
// 1/sum. The doubles come first (the scratch is aligned for them).
inline int64_t cross_entropy_scratch(int64_t N, int64_t V) {
  const int64_t ns = N * ce_segments(V);
  return 2 * ns + ns + 2 * N;
}

// Each counted row's max and sum of exp(l - max) (layer_rows.hpp's
// segments): a thread per (row, segment) for the segment's max, a thread
// per row combining them, a thread per (row, segment) for the segment's
// sum; the caller combines each row's S segment sums (seg_sum + n * S).
// The launches are named after `kernel`.
struct CeRowSums {
  float* row_max;   // N
  double* seg_sum;  // N x S
  int64_t S;
};
template <class L>
CeRowSums cross_entropy_row_sums_launches(const L& launch, const std::string& kernel, const float* logits,
                                          const int32_t* targets, int64_t N, int64_t V, float* scratch) {
  const int64_t S = ce_segments(V);
  double* sums = reinterpret_cast<double*>(scratch);
  float* seg_max = scratch + 2 * N * S;
  float* rmax = seg_max + N * S;
  launch((kernel + " segment max").c_str(), N * S, [=] EXMY_HD_LAMBDA(int64_t i) {
    const int64_t n = i / S;
    if (targets[n] >= 0) seg_max[i] = ce_segment_max(logits + n * V, V, i % S);
  });
  launch((kernel + " row max").c_str(), N, [=] EXMY_HD_LAMBDA(int64_t n) {
    if (targets[n] >= 0) rmax[n] = ce_combine_max(seg_max + n * S, S);
  });
  launch((kernel + " segment sums").c_str(), N * S, [=] EXMY_HD_LAMBDA(int64_t i) {
    const int64_t n = i / S;
    if (targets[n] >= 0) sums[i] = ce_segment_sumexp(logits + n * V, V, i % S, rmax[n]);
  });
  return {rmax, sums, S};
}

// cross_entropy_forward of models/layers.hpp: the rows' maxima and segment
// sums (cross_entropy_row_sums_launches), a thread per row for its loss,
// then one thread for the mean in row order; the mean and the count land in
// device memory. scratch: cross_entropy_scratch(N, V) floats.
template <class L>
void cross_entropy_forward_launches(const L& launch, double* losses, double* mean, int64_t* counted,
                                    const float* logits, const int32_t* targets, int64_t N, int64_t V, float* scratch) {
  const CeRowSums r = cross_entropy_row_sums_launches(launch, "cross_entropy_forward", logits, targets, N, V, scratch);
  launch("cross_entropy_forward rows", N, [=] EXMY_HD_LAMBDA(int64_t n) {
    if (targets[n] < 0) {
      losses[n] = 0;
      return;
    }
    losses[n] = ce_row_loss(r.row_max[n], ce_combine_sums(r.seg_sum + n * r.S, r.S), logits[n * V + targets[n]]);
  });
  launch("cross_entropy_forward mean", 1,
         [=] EXMY_HD_LAMBDA(int64_t) { *mean = ce_mean(losses, targets, N, counted); });
}

// cross_entropy_backward (dlogits +=): the rows' maxima and segment sums as
// in the forward, a thread per row for 1/sum, a thread per element of the
// counted rows for its term, then a thread per counted row subtracting
// scale at its target, as the CPU does after the row's terms. scratch:
// cross_entropy_scratch(N, V) floats.
template <class L>
void cross_entropy_backward_launches(const L& launch, float* dlogits, const float* logits, const int32_t* targets,
                                     int64_t N, int64_t V, double scale, float* scratch) {
  const CeRowSums r = cross_entropy_row_sums_launches(launch, "cross_entropy_backward", logits, targets, N, V, scratch);
  float* row_inv = r.row_max + N;
  const float sc = static_cast<float>(scale);
  launch("cross_entropy_backward rows", N, [=] EXMY_HD_LAMBDA(int64_t n) {
    if (targets[n] >= 0) row_inv[n] = static_cast<float>(1.0 / ce_combine_sums(r.seg_sum + n * r.S, r.S));
  });
  launch("cross_entropy_backward terms", N * V, [=] EXMY_HD_LAMBDA(int64_t i) {
    const int64_t n = i / V;
    if (targets[n] < 0) return;
    dlogits[i] += ce_grad(sc, logits[i], r.row_max[n], row_inv[n]);
  });
  launch("cross_entropy_backward targets", N, [=] EXMY_HD_LAMBDA(int64_t n) {
    if (targets[n] >= 0) dlogits[n * V + targets[n]] -= sc;
  });
}

// embedding_forward: a thread per output element (a copy, no arithmetic).
template <class L>
void embedding_forward_launches(const L& launch, float* out, const int32_t* tokens, const float* wte, int64_t N,
                                int64_t C) {
  launch("embedding_forward", N * C, [=] EXMY_HD_LAMBDA(int64_t i) {
    const int64_t n = i / C;
    out[i] = wte[static_cast<int64_t>(tokens[n]) * C + i % C];
  });
}

// embedding_backward (dwte +=) without atomics: the positions grouped by
// token (TokenGroups, layers_cuda.hpp), a thread per (distinct token,
// column) adding that token's rows of dout in increasing position, which is
// the CPU's order for every element of dwte.
template <class L>
void embedding_backward_launches(const L& launch, float* dwte, const float* dout, const int32_t* rows,
                                 const int64_t* starts, const int64_t* positions, int64_t distinct, int64_t C) {
  launch("embedding_backward", distinct * C, [=] EXMY_HD_LAMBDA(int64_t i) {
    const int64_t k = i / C, c = i % C;
    float* d = dwte + static_cast<int64_t>(rows[k]) * C + c;
    float acc = *d;
    for (int64_t j = starts[k]; j < starts[k + 1]; ++j) acc += dout[positions[j] * C + c];
    *d = acc;
  });
}

}  // namespace exmy::models

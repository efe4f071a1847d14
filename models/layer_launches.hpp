// The launch sequences of the layer kernels, written once over a launcher
// (sim/kernel_launch.hpp): models/cuda/layers.cu instantiates them with
// DeviceLaunch, models/layers_emulated.cpp with HostLaunch. Each thread body
// is a call of the per-row/per-element functions of models/layer_rows.hpp,
// which the CPU layers (models/layers.cpp) call too, in the same order, so
// the results equal the CPU's bit for bit. Float32 only (the training type).
#pragma once

#include <cstdint>

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
// its mean, a thread per element for dx, a thread per (row block, column)
// for the block's partial of dw (rows in order, from +0), then a thread per
// column adding the partials in block order, as rows_with_column_sums does.
template <class L>
void rmsnorm_backward_launches(const L& launch, float* dx, float* dw, const float* dout, const float* x,
                               const float* w, const float* rstd, int64_t N, int64_t C, float* scratch) {
  float* mean = scratch;
  float* part = scratch + N;
  const int64_t nb = (N + kGradRowBlock - 1) / kGradRowBlock;
  launch("rmsnorm_backward mean", N, [=] EXMY_HD_LAMBDA(int64_t n) {
    mean[n] = rmsnorm_grad_mean(dout + n * C, w, x + n * C, rstd[n], C);
  });
  launch("rmsnorm_backward dx", N * C, [=] EXMY_HD_LAMBDA(int64_t i) {
    const int64_t n = i / C;
    dx[i] += rmsnorm_dx(dout[i], w[i % C], x[i], rstd[n], mean[n]);
  });
  launch("rmsnorm_backward dw partials", nb * C, [=] EXMY_HD_LAMBDA(int64_t j) {
    const int64_t b = j / C, c = j % C;
    const int64_t n1 = (b + 1) * kGradRowBlock < N ? (b + 1) * kGradRowBlock : N;
    float p = 0.0f;
    for (int64_t n = b * kGradRowBlock; n < n1; ++n) p += rmsnorm_dw(dout[n * C + c], x[n * C + c], rstd[n]);
    part[j] = p;
  });
  launch("rmsnorm_backward dw", C, [=] EXMY_HD_LAMBDA(int64_t c) {
    float acc = dw[c];
    for (int64_t b = 0; b < nb; ++b) acc += part[b * C + c];
    dw[c] = acc;
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

// cross_entropy_forward of models/layers.hpp: a thread per row (its max,
// its double sum in column order, its loss), then one thread for the mean
// in row order; the mean and the count land in device memory.
template <class L>
void cross_entropy_forward_launches(const L& launch, double* losses, double* mean, int64_t* counted,
                                    const float* logits, const int32_t* targets, int64_t N, int64_t V) {
  launch("cross_entropy_forward rows", N,
         [=] EXMY_HD_LAMBDA(int64_t n) { ce_row_forward(losses, logits, targets, n, V); });
  launch("cross_entropy_forward mean", 1,
         [=] EXMY_HD_LAMBDA(int64_t) { *mean = ce_mean(losses, targets, N, counted); });
}

// Scratch floats of cross_entropy_backward: each row's max and 1/sum.
inline int64_t cross_entropy_backward_scratch(int64_t N) { return 2 * N; }

// cross_entropy_backward (dlogits +=): a thread per row for its max and
// 1/sum, a thread per element of the counted rows for its term, then a
// thread per counted row subtracting scale at its target, as the CPU does
// after the row's terms.
template <class L>
void cross_entropy_backward_launches(const L& launch, float* dlogits, const float* logits, const int32_t* targets,
                                     int64_t N, int64_t V, double scale, float* scratch) {
  float* row_max = scratch;
  float* row_inv = scratch + N;
  const float sc = static_cast<float>(scale);
  launch("cross_entropy_backward rows", N, [=] EXMY_HD_LAMBDA(int64_t n) {
    if (targets[n] < 0) return;
    const float* l = logits + n * V;
    row_max[n] = ce_row_max(l, V);
    row_inv[n] = static_cast<float>(1.0 / ce_row_sumexp(l, V, row_max[n]));
  });
  launch("cross_entropy_backward terms", N * V, [=] EXMY_HD_LAMBDA(int64_t i) {
    const int64_t n = i / V;
    if (targets[n] < 0) return;
    dlogits[i] += ce_grad(sc, logits[i], row_max[n], row_inv[n]);
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

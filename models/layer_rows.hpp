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
#include "sim/hd_math.hpp"

namespace exmy::models {

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

}  // namespace exmy::models

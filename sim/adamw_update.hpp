// The per-element AdamW update of sim/optim.hpp as a plain EXMY_HD (host +
// device) function: AdamW::step calls it from its OpenMP loop and the CUDA
// kernel (sim/cuda/adamw.cu) from its threads, so both compute the same FP32
// operations in the same order (PyTorch's single-tensor order, see AdamW).
#pragma once

#include <cstdint>

#include "formats/format.hpp"  // EXMY_HD
#include "sim/hd_math.hpp"
#include "sim/kernel_launch.hpp"

namespace exmy::sim {

// One step's scalars, each formed in double and rounded to float once per
// step by AdamW::step.
struct AdamWScalars {
  float b1, b2, one_b1, one_b2;  // beta1, beta2, 1 - beta1, 1 - beta2
  float step_size;               // lr / bc1
  float bc2_sqrt;                // sqrt(bc2)
  float eps;
  float grad_scale;              // accumulation averaging and clipping, folded
  float decay;                   // 1 - lr * weight_decay (views that decay)
};

// p, m, v updated in place from the raw gradient g; dk is s.decay on views
// that decay, else 1.
EXMY_HD void adamw_update(float& p, float& m, float& v, float g, float dk, const AdamWScalars& s) {
  const float gi = g * s.grad_scale;
  p *= dk;
  m = s.b1 * m + s.one_b1 * gi;
  v = s.b2 * v + s.one_b2 * (gi * gi);
  const float denom = hd_sqrt(v) / s.bc2_sqrt + s.eps;
  p -= s.step_size * (m / denom);
}

// The update of one contiguous range of n elements (a view of the arena,
// one decay factor), a thread per element.
template <class L>
void adamw_range_launches(const L& launch, float* p, float* m, float* v, const float* g, int64_t n, float dk,
                          const AdamWScalars& s) {
  launch("adamw_update", n, [=] EXMY_HD_LAMBDA(int64_t i) { adamw_update(p[i], m[i], v[i], g[i], dk, s); });
}

// adamw_range_launches on the current CUDA device (device pointers, the
// default stream; only with EXMY_HAVE_CUDA), and with the threads run on the
// host (host pointers; tests/train/test_optim.cpp compares it with AdamW).
void adamw_update_emulated(float* p, float* m, float* v, const float* g, int64_t n, float dk, const AdamWScalars& s);
#if defined(EXMY_HAVE_CUDA)
void adamw_update_cuda(float* p, float* m, float* v, const float* g, int64_t n, float dk, const AdamWScalars& s);
#endif

}  // namespace exmy::sim

// The per-element AdamW update of sim/optim.hpp as a plain EXMY_HD (host +
// device) function: AdamW::step calls it from its OpenMP loop and the CUDA
// kernel (sim/cuda/adamw.cu) from its threads, so both compute the same FP32
// operations in the same order (PyTorch's single-tensor order, see AdamW).
#pragma once

#include <cstdint>

#include "formats/format.hpp"  // EXMY_HD
#include "sim/bf16.hpp"
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

// BF16 working weights (train.working_weights = bf16): the update is made
// on the FP32 master weight and the working weight the model reads is the
// master rounded to the nearest bfloat16, ties to even (sim/bf16.hpp).
EXMY_HD void adamw_update_bf16(float& working, float& master, float& m, float& v, float g, float dk,
                               const AdamWScalars& s) {
  adamw_update(master, m, v, g, dk, s);
  working = round_bf16_hd(master);
}

// The update of one contiguous range of n elements (a view of the arena,
// one decay factor), a thread per element.
template <class L>
void adamw_range_launches(const L& launch, float* p, float* m, float* v, const float* g, int64_t n, float dk,
                          const AdamWScalars& s) {
  launch("adamw_update", n, [=] EXMY_HD_LAMBDA(int64_t i) { adamw_update(p[i], m[i], v[i], g[i], dk, s); });
}

// ... with BF16 working weights: master updated, p its rounding.
template <class L>
void adamw_bf16_range_launches(const L& launch, float* p, float* master, float* m, float* v, const float* g,
                               int64_t n, float dk, const AdamWScalars& s) {
  launch("adamw_update_bf16", n,
         [=] EXMY_HD_LAMBDA(int64_t i) { adamw_update_bf16(p[i], master[i], m[i], v[i], g[i], dk, s); });
}

// The global gradient norm's blocks (sim::global_norm): block b is the
// double sum of g[i]^2 over its kNormBlock elements in index order, and the
// host adds the blocks' sums in block order (global_norm_of_partials), so
// the device's norm is the CPU's bit for bit.
inline constexpr int64_t kNormBlock = 4096;
inline int64_t norm_blocks(int64_t n) { return (n + kNormBlock - 1) / kNormBlock; }

EXMY_HD double norm_block_partial(const float* g, int64_t n, int64_t b) {
  double s = 0;
  const int64_t end = (b + 1) * kNormBlock < n ? (b + 1) * kNormBlock : n;
  for (int64_t i = b * kNormBlock; i < end; ++i) {
    const double x = g[i];
    s += x * x;
  }
  return s;
}

// A thread per block (each sums its block in order: correct, not fast).
template <class L>
void global_norm_launches(const L& launch, const float* g, int64_t n, double* part) {
  launch("global_norm_partials", norm_blocks(n), [=] EXMY_HD_LAMBDA(int64_t b) { part[b] = norm_block_partial(g, n, b); });
}

// adamw_range_launches on the current CUDA device (device pointers, the
// default stream; only with EXMY_HAVE_CUDA), and with the threads run on the
// host (host pointers; tests/train/test_optim.cpp compares it with AdamW).
void adamw_update_emulated(float* p, float* m, float* v, const float* g, int64_t n, float dk, const AdamWScalars& s);
// ... adamw_bf16_range_launches likewise.
void adamw_bf16_update_emulated(float* p, float* master, float* m, float* v, const float* g, int64_t n, float dk,
                                const AdamWScalars& s);
// ... and global_norm_launches likewise (part: norm_blocks(n) doubles).
void global_norm_partials_emulated(const float* g, int64_t n, double* part);
#if defined(EXMY_HAVE_CUDA)
void adamw_update_cuda(float* p, float* m, float* v, const float* g, int64_t n, float dk, const AdamWScalars& s);
void adamw_bf16_update_cuda(float* p, float* master, float* m, float* v, const float* g, int64_t n, float dk,
                            const AdamWScalars& s);
void global_norm_partials_cuda(const float* g, int64_t n, double* part);
#endif

}  // namespace exmy::sim

// The Mamba-2 state-space scan (SSD) with its D skip, forward and backward.
//
// For every batch row b and head h (group g = h / (heads/groups)):
//   state_t = exp(dt_t A) state_{t-1} + dt_t x_t B_t^T          (head_dim x state)
//   y_t     = state_t C_t + D x_t
// with A = -exp(A_log[h]) and dt the post-softplus time step.
//
// ssd_chunk_scan_* is the chunked algorithm of Mamba-2 (mamba_ssm's
// ssd_minimal / chunk scan): the sequence is cut into chunks of `chunk`
// tokens; inside a chunk the output is a masked (L x L) matrix product
// (C B^T ∘ decay) · (dt x), the state at each chunk boundary is one GEMM per
// chunk, the boundary states are passed along the chunks by a short
// recurrence, and each chunk reads its incoming state with one more GEMM. The
// last chunk may be shorter than `chunk` (no padding needed).
//
// ssd_scan_ref_* is the per-token recurrence above, serial and slow: the
// obviously-right version the chunked code is tested against.
//
// Layouts (row-major, N = batch x seqlen tokens):
//   x  (B,T,heads*head_dim) rows of stride ldx    (the x part of xBC)
//   Bm, Cm (B,T,groups*state) rows of stride ldbc (the B and C parts of xBC)
//   dt (B,T,heads) contiguous, post softplus
//   y  (B,T,heads*head_dim) contiguous
// Backward accumulates (+=) into dx, dB, dC, ddt, dA_log and dD.
#pragma once

#include <cstdint>

#include "formats/format.hpp"  // EXMY_HD

namespace exmy::models {

struct SsdDims {
  int64_t batch = 1, seqlen = 1, heads = 1, head_dim = 1, groups = 1, state = 1, chunk = 1;
  // x, B and C hold bfloat16 values (a `bf16` policy keeps xBC so): a hint
  // for kernels on the BF16 tensor cores (models/ssd_fused.hpp), which then
  // take them as one piece each; the CPU's scan does not read it.
  bool xbc_bf16 = false;
  EXMY_HD int64_t chunks() const { return (seqlen + chunk - 1) / chunk; }
  // Elements of the saved buffers of the chunked forward.
  EXMY_HD int64_t acs_size() const { return batch * heads * seqlen; }                          // (B,H,T)
  EXMY_HD int64_t states_size() const { return batch * chunks() * heads * head_dim * state; }  // (B,Q,H,P,N)
};

// dt (N,H) = clamp(softplus(dt_raw + dt_bias), lo, hi); dt_raw (N,H) rows of stride ld; dt_bias (H)
template <class T>
void mamba_dt_forward(T* dt, const T* dt_raw, int64_t ld, const T* dt_bias, int64_t N, int64_t H, double lo,
                      double hi);
// ddt_raw (N,H) rows of stride ld +=, ddt_bias (H) +=; ddt (N,H) contiguous.
// The gradient is zero where the clamp is active.
template <class T>
void mamba_dt_backward(T* ddt_raw, int64_t ld, T* ddt_bias, const T* ddt, const T* dt_raw, const T* dt_bias, int64_t N,
                       int64_t H, double lo, double hi);

// Chunked forward. Saves acs (B,H,T): the within-chunk cumulative sums of
// dt A, and states (B,Q,H,P,N): the state entering each chunk.
template <class T>
void ssd_chunk_scan_forward(T* y, T* acs, T* states, const T* x, int64_t ldx, const T* Bm, const T* Cm, int64_t ldbc,
                            const T* dt, const T* A_log, const T* D, const SsdDims& d);

// Chunked backward from the saved acs and states; dx rows of stride ldx, dB
// and dC rows of stride ldbc, ddt (B,T,H) contiguous.
template <class T>
void ssd_chunk_scan_backward(T* dx, T* dB, T* dC, T* ddt, T* dA_log, T* dD, const T* dy, const T* x, int64_t ldx,
                             const T* Bm, const T* Cm, int64_t ldbc, const T* dt, const T* A_log, const T* D,
                             const T* acs, const T* states, const SsdDims& d);

// Per-token recurrence (reference).
template <class T>
void ssd_scan_ref_forward(T* y, const T* x, int64_t ldx, const T* Bm, const T* Cm, int64_t ldbc, const T* dt,
                          const T* A_log, const T* D, const SsdDims& d);
template <class T>
void ssd_scan_ref_backward(T* dx, T* dB, T* dC, T* ddt, T* dA_log, T* dD, const T* dy, const T* x, int64_t ldx,
                           const T* Bm, const T* Cm, int64_t ldbc, const T* dt, const T* A_log, const T* D,
                           const SsdDims& d);

}  // namespace exmy::models

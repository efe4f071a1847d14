// The row launches of causal GQA attention, written once over a launcher
// (sim/kernel_launch.hpp): one thread per query row (forward, dQ, D) or key
// row (dK, dV) of models/attention_rows.hpp, the forward an online softmax;
// scratch linear in the sequence length. The CUDA backend runs these when
// the environment sets EXMY_CUDA_ATTENTION=rows (models/cuda/attention.cu,
// DeviceLaunch), its block launches (models/attention_blocks.hpp)
// otherwise; their sums are in another order than the CPU's, so they are
// held to the FP32 budget of tests/models/test_attention_cuda.cpp, which
// also runs them with HostLaunch in CI (models/attention_emulated.cpp). The
// kernels are float32 (the training type); tests also run them on an
// error-bound number type. The row threads use the FP32 CUDA cores alone:
// each multiply-add reads an element of k or v, so the load units bound
// them (docs/architecture.md, "Speed, not yet").
#pragma once

#include <cstdint>

#include <string>

#include "formats/error.hpp"
#include "models/attention_items.hpp"  // attn_scale
#include "models/attention_rows.hpp"
#include "sim/kernel_launch.hpp"

namespace exmy::models {

// Scratch elements of the row launches: none for the forward; for the
// backward D (B,Hq,S) and the per-head parts of dK and dV (B,S,Hq*Dh each),
// every array padded by item_pad.
inline int64_t attention_rows_backward_scratch(const AttnDims& d) {
  return item_pad(d.batch * d.q_heads * d.seqlen) + 2 * item_pad(d.batch * d.seqlen * d.q_heads * d.head_dim);
}

// A row thread holds its rows in arrays of kAttnRowMaxDim: wider heads are
// refused in one line.
inline void require_attention_row_head_dim(const AttnDims& d) {
  if (d.head_dim > kAttnRowMaxDim)
    throw Error("attention on a CUDA device supports head_dim up to " + std::to_string(kAttnRowMaxDim) + " (got " +
                std::to_string(d.head_dim) + ")");
}

// Threads are numbered (b, head, row) with the row fastest; the forward and
// dQ take their rows from the last down, so the longest rows start first.
template <class L, class T>
void attention_rows_forward_launches(const L& launch, T* out, T* lse, const T* q, const T* k, const T* v,
                                     const AttnDims& d) {
  require_attention_row_head_dim(d);
  const int64_t S = d.seqlen, Hq = d.q_heads;
  launch("attention_forward row", d.batch * Hq * S, [=] EXMY_HD_LAMBDA(int64_t u) {
    attn_fwd_row(out, lse, q, k, v, d, u / (Hq * S), (u / S) % Hq, S - 1 - u % S);
  });
}

// D first, then each query head's part of dK, dV by key row (scratch), the
// parts added to dk, dv by element, and dQ by query row: each launch writes
// only its own rows.
template <class L, class T>
void attention_rows_backward_launches(const L& launch, T* dq, T* dk, T* dv, const T* dout, const T* out, const T* lse,
                                      const T* q, const T* k, const T* v, const AttnDims& d, T* scratch) {
  require_attention_row_head_dim(d);
  const int64_t S = d.seqlen, Hq = d.q_heads, Hkv = d.kv_heads;
  const int64_t Dh = d.head_dim;
  T* D = scratch;
  T* dkp = D + item_pad(d.batch * Hq * S);
  T* dvp = dkp + item_pad(d.batch * S * Hq * Dh);
  launch("attention_backward rowsum", d.batch * Hq * S, [=] EXMY_HD_LAMBDA(int64_t u) {
    attn_bwd_rowsum(D, dout, out, d, u / (Hq * S), (u / S) % Hq, u % S);
  });
  launch("attention_backward kv row", d.batch * Hq * S, [=] EXMY_HD_LAMBDA(int64_t u) {
    attn_bwd_kv_row(dkp, dvp, dout, lse, static_cast<const T*>(D), q, k, v, d, u / (Hq * S), (u / S) % Hq, u % S);
  });
  launch("attention_backward kv add", d.batch * S * Hkv * Dh, [=] EXMY_HD_LAMBDA(int64_t u) {
    attn_bwd_kv_add(dk, dv, static_cast<const T*>(dkp), static_cast<const T*>(dvp), d, u / (S * Hkv * Dh),
                    (u / (Hkv * Dh)) % S, (u / Dh) % Hkv, u % Dh);
  });
  launch("attention_backward q row", d.batch * Hq * S, [=] EXMY_HD_LAMBDA(int64_t u) {
    attn_bwd_q_row(dq, dout, lse, static_cast<const T*>(D), q, k, v, d, u / (Hq * S), (u / S) % Hq, S - 1 - u % S);
  });
}

}  // namespace exmy::models

// The attention mixer (pattern letter *): q/k/v projections, causal
// grouped-query attention without positional encoding, o_proj; and its
// kernel. The kernel, per head, computes softmax(Q K^T / sqrt(head_dim)) V over the
// keys at or before each query, the softmax in the working precision (FP32
// for training). Query head h reads key/value head h / (Hq / Hkv).
//
// q (B,T,Hq*Dh), k and v (B,T,Hkv*Dh), out (B,T,Hq*Dh), lse (B,Hq,T): the
// log-sum-exp of each softmax row, saved so backward recomputes the
// probabilities instead of storing (T x T) per head.
// Backward accumulates (+=) into dq, dk, dv.
#pragma once

#include <cstdint>

#include "models/mixer.hpp"

namespace exmy::models {

struct AttnDims {
  int64_t batch = 1, seqlen = 1, q_heads = 1, kv_heads = 1, head_dim = 1;
  // q, k and v hold bfloat16 values (the `bf16` policy rounds them): the
  // device's products on bfloat16 pieces then take each as one piece
  // (models/split_gemm.hpp); the CPU's attention ignores it.
  bool qkv_bf16 = false;
};

template <class T>
void attention_forward(T* out, T* lse, const T* q, const T* k, const T* v, const AttnDims& d);

template <class T>
void attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* out, const T* lse, const T* q, const T* k,
                        const T* v, const AttnDims& d);

AttnDims attn_dims(const NemotronHConfig& cfg, int64_t batch, int64_t seqlen);

// The mixer's row functions (models/mixer.cpp's table).
const MixerOps& attention_mixer();

}  // namespace exmy::models

// The launch sequences of causal GQA attention, written once over a launcher
// (sim/kernel_launch.hpp) and a GEMM functor (models/item_gemm.hpp):
// models/cuda/attention.cu instantiates them with DeviceLaunch and
// NaiveGemm, models/attention_emulated.cpp with HostLaunch and SerialGemm.
// Each launch is one thread per work item of models/attention.cpp's loops,
// so the emulation equals the CPU bit for bit. The kernels are float32 (the
// training type); tests also run the launches on an error-bound number type.
//
// This first version runs a whole (b, head) or (b, kv head) item in one
// thread, its products summed element by element in k order: it is correct,
// not fast. A faster version would give a query block its own thread block
// and form the products as tensor-core tiles (flash attention's tiling, with
// the running max and sum of an online softmax): that reorders the sums, so
// it would stay inside the FP32 budget of
// tests/models/test_attention_cuda.cpp but not keep the CPU's bits, and the
// backward's dk, dv would still be summed per kv head in the CPU's order,
// not by atomics.
#pragma once

#include <cstdint>

#include "models/attention_items.hpp"
#include "sim/kernel_launch.hpp"

namespace exmy::models {

// Scratch elements of the forward: per (b, h) item one block's scores P; of
// the backward: per (b, kv head) item P and dP. Every array padded by
// item_pad, the scratch 64-byte aligned (as cudaMalloc's and sim::Buf's are).
inline int64_t attention_forward_scratch(const AttnDims& d) {
  return d.batch * d.q_heads * item_pad(attn_block_size(d));
}
inline int64_t attention_backward_scratch(const AttnDims& d) {
  return d.batch * d.kv_heads * 2 * item_pad(attn_block_size(d));
}

template <class L, class Gemm, class T>
void attention_forward_launches(const L& launch, const Gemm& gemm, T* out, T* lse, const T* q, const T* k, const T* v,
                                const AttnDims& d, T* scratch) {
  const int64_t Hq = d.q_heads, psz = item_pad(attn_block_size(d));
  launch("attention_forward head", d.batch * Hq, [=] EXMY_HD_LAMBDA(int64_t u) {
    attn_fwd_head(gemm, out, lse, q, k, v, d, u / Hq, u % Hq, scratch + u * psz);
  });
}

template <class L, class Gemm, class T>
void attention_backward_launches(const L& launch, const Gemm& gemm, T* dq, T* dk, T* dv, const T* dout, const T* out,
                                 const T* lse, const T* q, const T* k, const T* v, const AttnDims& d, T* scratch) {
  const int64_t Hkv = d.kv_heads, psz = item_pad(attn_block_size(d));
  launch("attention_backward kv_head", d.batch * Hkv, [=] EXMY_HD_LAMBDA(int64_t u) {
    T* w = scratch + 2 * u * psz;
    attn_bwd_kv_head(gemm, dq, dk, dv, dout, out, lse, q, k, v, d, u / Hkv, u % Hkv, w, w + psz);
  });
}

}  // namespace exmy::models

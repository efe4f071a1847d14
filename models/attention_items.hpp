// The work items of causal GQA attention (models/attention.hpp) as plain
// EXMY_HD (host + device) functions: the CPU's OpenMP loops in
// models/attention.cpp call them, one call per item, and so do the item
// launches of models/attention_launches.hpp (one thread per item) that the
// emulated device backend runs, so both run the same operations in the same
// order (docs/architecture.md, "CPU and GPU share code"). The CUDA backend
// runs the row kernels of models/attention_rows.hpp instead.
//
// The products QK^T, PV and the backward's go through a GEMM functor `gemm`
// (models/item_gemm.hpp): SerialGemm on the CPU and in the host emulation;
// the tests also pass an error-bound functor, whose bound is the CPU's
// budget (tests/models/test_attention_cuda.cpp).
//
// Items and scratch (every pointer is the item's own; S = seqlen):
//   forward   attn_fwd_head    (b, h):   out and lse of query head h, query
//                                        block by block; P (attn_block_size)
//   backward  attn_bwd_kv_head (b, kvh): dq of the query heads that read kv
//                                        head kvh, and its dk, dv +=, heads
//                                        in order, query blocks in order;
//                                        P, dP (attn_block_size each)
// A block's scores cover at most kQueryBlock x S, so scratch stays linear in
// the sequence length.
#pragma once

#include <cmath>
#include <cstdint>

#include "formats/format.hpp"  // EXMY_HD
#include "models/attention.hpp"
#include "models/item_gemm.hpp"
#include "sim/hd_math.hpp"

namespace exmy::models {

// Queries are processed in blocks of kQueryBlock rows. Block [i0, i1) needs
// only the keys [0, i1), so scores, probabilities and both products cover
// the causal triangle plus at most one block of masked entries per block
// row: about half of the full T x T work for long sequences.
inline constexpr int64_t kQueryBlock = 64;

// Elements of one block's scores: min(S, kQueryBlock) rows of S keys.
EXMY_HD int64_t attn_block_size(const AttnDims& d) {
  return (d.seqlen < kQueryBlock ? d.seqlen : kQueryBlock) * d.seqlen;
}

// The factor of the scores, 1 / sqrt(head_dim).
template <class T>
EXMY_HD T attn_scale(const AttnDims& d) {
  return T(1) / sim::hd_sqrt(static_cast<T>(d.head_dim));
}

// The end of the query block that starts at i0.
EXMY_HD int64_t attn_block_end(const AttnDims& d, int64_t i0) {
  return d.seqlen < i0 + kQueryBlock ? d.seqlen : i0 + kQueryBlock;
}

// The steps of a probability row, shared with the block launches
// (models/attention_blocks.hpp), which run the element steps a thread per
// element and the row steps a thread per row, so that both make the same
// values. Row r of a block holds query i's scores over `keys` keys; only
// j <= i take part, the rest are set to zero.
//
// The forward: the scores j in [j0, j1) scaled in place, and their max
// (from -inf). The row's max over j <= i is this over [0, i + 1), or the max
// of its parts over consecutive ranges: a max is exact, so any grouping
// gives the same value.
template <class T>
EXMY_HD T attn_row_scale_max(T* row, int64_t j0, int64_t j1, T scale) {
  T mx = -INFINITY;
  for (int64_t j = j0; j < j1; ++j) {
    row[j] *= scale;
    mx = sim::hd_max(mx, row[j]);
  }
  return mx;
}
// The forward: one element exp(s - max), or zero where masked (j > i).
template <class T>
EXMY_HD T attn_prob_unnormalized(T s, int64_t i, int64_t j, T mx) {
  return j <= i ? sim::hd_exp(s - mx) : T(0);
}
// The forward: the sum of a row's exp(s - max) over j in [j0, j1), in
// order from 0 (the CPU's: [0, i + 1)).
template <class T>
EXMY_HD T attn_row_sum(const T* row, int64_t j0, int64_t j1) {
  T sum = 0;
  for (int64_t j = j0; j < j1; ++j) sum += row[j];
  return sum;
}
// The backward: a probability recomputed from the saved log-sum-exp, or
// zero where masked.
template <class T>
EXMY_HD T attn_prob_saved(T s, int64_t i, int64_t j, T scale, T saved_i) {
  return j <= i ? sim::hd_exp(s * scale - saved_i) : T(0);
}
// The backward: D_i = sum_e dO_ie O_ie in e order, from 0.
template <class T>
EXMY_HD T attn_row_dot(const T* doi, const T* oi, int64_t Dh) {
  T di = 0;
  for (int64_t e = 0; e < Dh; ++e) di += doi[e] * oi[e];
  return di;
}
// The backward: a score's gradient dS = p (dP - D_i) scale, or zero where
// masked.
template <class T>
EXMY_HD T attn_dscore(T p, T dp, int64_t i, int64_t j, T di, T scale) {
  return j <= i ? p * (dp - di) * scale : T(0);
}

// The probabilities of query block [i0, i1) of one head into P (rows =
// i1 - i0, keys = i1): row r is the softmax of query i = i0 + r's scaled
// scores Q_i K_j^T over the keys j <= i, the masked keys zero. The forward
// (saved = nullptr) normalizes each row by its own sum and writes its
// log-sum-exp to lse[i]; the backward recomputes the row from the
// log-sum-exp it saved, saved[i]. qh and kh point at the head's first
// column, lse and saved at the head's S log-sum-exps.
template <class T, class Gemm>
EXMY_HD void attn_block_probs(const Gemm& gemm, T* P, T* lse, const T* saved, const T* qh, const T* kh,
                              const AttnDims& d, int64_t i0, int64_t i1) {
  const int64_t ldq = d.q_heads * d.head_dim, ldkv = d.kv_heads * d.head_dim, keys = i1;
  const T scale = attn_scale<T>(d);
  gemm(P, keys, qh + i0 * ldq, ldq, sim::Op::N, kh, ldkv, sim::Op::T, i1 - i0, keys, d.head_dim, false);
  for (int64_t i = i0; i < i1; ++i) {
    T* row = P + (i - i0) * keys;
    if (saved) {
      for (int64_t j = 0; j < keys; ++j) row[j] = attn_prob_saved(row[j], i, j, scale, saved[i]);
    } else {
      const T mx = attn_row_scale_max(row, 0, i + 1, scale);
      for (int64_t j = 0; j < keys; ++j) row[j] = attn_prob_unnormalized(row[j], i, j, mx);
      const T sum = attn_row_sum(row, 0, i + 1);
      const T inv = T(1) / sum;
      for (int64_t j = 0; j <= i; ++j) row[j] *= inv;
      lse[i] = mx + sim::hd_log(sum);
    }
  }
}

// Forward, item (b, h): for each query block, its probabilities (and the
// log-sum-exp of each row into lse (B,Hq,S)), then out = P V.
template <class T, class Gemm>
EXMY_HD void attn_fwd_head(const Gemm& gemm, T* out, T* lse, const T* q, const T* k, const T* v, const AttnDims& d,
                           int64_t b, int64_t h, T* P) {
  const int64_t S = d.seqlen, Dh = d.head_dim, Hq = d.q_heads, kvh = h / (Hq / d.kv_heads);
  const int64_t ldq = Hq * Dh, ldkv = d.kv_heads * Dh;
  const T* kh = k + b * S * ldkv + kvh * Dh;
  const T* vh = v + b * S * ldkv + kvh * Dh;
  for (int64_t i0 = 0; i0 < S; i0 += kQueryBlock) {
    const int64_t i1 = attn_block_end(d, i0);
    attn_block_probs(gemm, P, lse + (b * Hq + h) * S, static_cast<const T*>(nullptr), q + b * S * ldq + h * Dh, kh, d,
                     i0, i1);
    gemm(out + (b * S + i0) * ldq + h * Dh, ldq, P, i1, sim::Op::N, vh, ldkv, sim::Op::N, i1 - i0, Dh, i1, false);
  }
}

// Backward, item (b, kvh): for each query head h reading kv head kvh, in
// order, and each of its query blocks, in order: the probabilities again
// from the saved lse, then dV += P^T dO, dS = P ∘ (dO V^T - rowsum(dO ∘ O))
// times the scale, dQ += dS K and dK += dS^T Q. The item is the only writer
// of its heads' dq and of its dk, dv, so their sums keep this order.
template <class T, class Gemm>
EXMY_HD void attn_bwd_kv_head(const Gemm& gemm, T* dq, T* dk, T* dv, const T* dout, const T* out, const T* lse,
                              const T* q, const T* k, const T* v, const AttnDims& d, int64_t b, int64_t kvh, T* P,
                              T* dP) {
  const int64_t S = d.seqlen, Dh = d.head_dim, Hq = d.q_heads, rep = Hq / d.kv_heads;
  const int64_t ldq = Hq * Dh, ldkv = d.kv_heads * Dh;
  const T scale = attn_scale<T>(d);
  const T* kh = k + b * S * ldkv + kvh * Dh;
  const T* vh = v + b * S * ldkv + kvh * Dh;
  T* dkh = dk + b * S * ldkv + kvh * Dh;
  T* dvh = dv + b * S * ldkv + kvh * Dh;
  for (int64_t h = kvh * rep; h < (kvh + 1) * rep; ++h) {
    const T* qh = q + b * S * ldq + h * Dh;
    const T* oh = out + b * S * ldq + h * Dh;
    const T* doh = dout + b * S * ldq + h * Dh;
    T* dqh = dq + b * S * ldq + h * Dh;
    for (int64_t i0 = 0; i0 < S; i0 += kQueryBlock) {
      const int64_t i1 = attn_block_end(d, i0), rows = i1 - i0, keys = i1;
      attn_block_probs(gemm, P, static_cast<T*>(nullptr), lse + (b * Hq + h) * S, qh, kh, d, i0, i1);
      // dV[0:i1] += P^T dO[i0:i1];  dP = dO[i0:i1] V[0:i1]^T
      gemm(dvh, ldkv, P, keys, sim::Op::T, doh + i0 * ldq, ldq, sim::Op::N, keys, Dh, rows, true);
      gemm(dP, keys, doh + i0 * ldq, ldq, sim::Op::N, vh, ldkv, sim::Op::T, rows, keys, Dh, false);
      // Softmax backward: dS = P ∘ (dP - rowsum(dO ∘ O)), times the scale
      // that multiplied the scores.
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t i = i0 + r;
        const T di = attn_row_dot(doh + i * ldq, oh + i * ldq, Dh);
        T* row = dP + r * keys;
        const T* prow = P + r * keys;
        for (int64_t j = 0; j < keys; ++j) row[j] = attn_dscore(prow[j], row[j], i, j, di, scale);
      }
      // dQ[i0:i1] += dS K[0:i1];  dK[0:i1] += dS^T Q[i0:i1]
      gemm(dqh + i0 * ldq, ldq, dP, keys, sim::Op::N, kh, ldkv, sim::Op::N, rows, Dh, keys, true);
      gemm(dkh, ldkv, dP, keys, sim::Op::T, qh + i0 * ldq, ldq, sim::Op::N, keys, Dh, rows, true);
    }
  }
}

}  // namespace exmy::models

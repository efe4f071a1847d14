// The block launches of causal GQA attention (models/attention.hpp): the
// CPU's algorithm (models/attention_items.hpp: a query block's scores as one
// product, the softmax of each row after its max, the backward from the
// saved log-sum-exp) with its products as batched GEMMs and its row and
// element steps as launches, so that a CUDA device runs the products on
// cuBLASLt instead of a thread per row summing alone.
//
// Order: for each batch b and each r < rep (rep = Hq / Hkv query heads per
// kv head), for each query block [i0, i1) of `rows` rows, in order, one
// batched call per product covers the Hkv heads h = kvh * rep + r (entry
// kvh). So every kv head receives its dk, dv sums as the CPU's item does
// (its query heads in order, each head's blocks in order), and with
// rows = kQueryBlock and the CPU's GEMM (LoopGemm<SerialGemm>) the launches
// give the CPU's bits (tests/models/test_attention_cuda.cpp). On a device
// the products are cuBLASLt's (another order of each output's sums; with
// bf16_pieces, BF16 products of the operands' bfloat16 pieces,
// models/split_gemm.hpp, each product told which operands hold bfloat16
// values) and the blocking is attn_device_blocking(d): the results are
// then within the FP32 budget of that test. A row's max is exact in any
// grouping, so its parts change nothing; its sum in parts of `segment`
// keys (the device's) is another order than the CPU's whole-row sum
// (segment 0).
//
// Per block and entry (scratch P, and dP in the backward, `rows` x i1 each):
//   forward   P = Q_blk K^T; per row part (a thread per `segment` keys):
//             scale, the part's max; per row: the max into lse; per
//             element: exp(s - max); per row part: its sum; per row: the
//             sum of the parts in order, lse = max + log sum, 1/sum into R;
//             per element: P *= 1/sum; out_blk = P V
//   backward  per row (before the blocks): D_i = dO_i · O_i; per block:
//             P = Q_blk K^T, per element P = exp(s scale - lse_i);
//             dV += P^T dO_blk; dP = dO_blk V^T; per element
//             dS = P (dP - D_i) scale; dQ_blk += dS K; dK += dS^T Q_blk
// Scratch is linear in the sequence length: rows x S per kv head and array.
#pragma once

#include <cstdint>

#include "models/attention.hpp"
#include "models/attention_items.hpp"
#include "models/item_gemm.hpp"
#include "models/split_gemm.hpp"
#include "sim/kernel_launch.hpp"

namespace exmy::models {

// How the block launches cut the work: query rows per block, and keys per
// part of a row's max and sum (0: the whole row, the CPU's order); and
// whether their products run on bfloat16 pieces (models/split_gemm.hpp:
// the scratch then holds the pieces too, and the entry points of
// models/cuda/attention_cuda.hpp pass a SplitGemm).
struct AttnBlocking {
  int64_t rows = kQueryBlock, segment = 0;
  bool bf16_pieces = false;
};
// The keys per row part on a device: enough parts for a thread each to keep
// the row steps busy at long sequences, long enough for few partial sums.
inline constexpr int64_t kAttnDeviceSegment = 256;

// Rows per query block on a device: about a quarter of the sequence (so the
// products cover at most 1.25 times the causal triangle for long
// sequences, and the row steps have Hkv x rows threads), a multiple of
// kQueryBlock, at most the sequence, and small enough that one array of the
// scratch (Hkv x rows x S floats) stays within 128 MiB.
inline int64_t attn_device_block_rows(const AttnDims& d) {
  const int64_t S = d.seqlen;
  int64_t rows = ((S + 3) / 4 + kQueryBlock - 1) / kQueryBlock * kQueryBlock;
  const int64_t cap = (int64_t{1} << 25) / (d.kv_heads * S);  // floats: 128 MiB
  if (rows > cap) rows = cap / kQueryBlock * kQueryBlock;
  if (rows < kQueryBlock) rows = kQueryBlock;
  return rows < S ? rows : S;
}

// The CPU's blocking (the emulated backend's: the CPU's bits) and the
// device's (its products on BF16 tensor cores, unless bf16_pieces is
// cleared: EXMY_CUDA_ATTENTION=fp32).
inline AttnBlocking attn_cpu_blocking() { return {kQueryBlock, 0, false}; }
inline AttnBlocking attn_device_blocking(const AttnDims& d) {
  return {attn_device_block_rows(d), kAttnDeviceSegment, true};
}

// Parts of a row of `keys` keys.
EXMY_HD int64_t attn_row_parts(int64_t keys, int64_t segment) {
  return segment > 0 ? (keys + segment - 1) / segment : 1;
}

// The scratch layout of the block launches, in floats: P (and dP) per kv
// head, each item_pad(rows x S) apart (64-byte aligned, as the CPU's
// buffers); in the forward the rows' parts (max, then sum) and R the rows'
// 1/sum, in the backward D the rows' dO · O; with bf16_pieces, last, from a
// 256-byte boundary, the pieces of the largest product's operands
// (`pieces` uint16 elements: an A of at most rows x max(S, Dh) elements a
// kv head, P or dS, a B of at most S x Dh, K or V, three pieces each; or
// six copies of the operands of Q K^T or dO V^T).
struct AttnBlockScratch {
  int64_t rows = 0, segment = 0, per_head = 0, P = 0, dP = 0, parts = 0, R = 0, D = 0, total = 0;
  int64_t piece_at = 0, pieces = 0;
  AttnBlockScratch(const AttnDims& d, const AttnBlocking& k, bool backward) : rows(k.rows), segment(k.segment) {
    per_head = item_pad(rows * d.seqlen);
    const int64_t array = d.kv_heads * per_head;
    P = 0;
    if (backward) {
      dP = array;
      D = 2 * array;
      total = D + item_pad(d.kv_heads * d.seqlen);
    } else {
      parts = array;
      R = parts + item_pad(d.kv_heads * rows * attn_row_parts(d.seqlen, segment));
      total = R + item_pad(d.kv_heads * rows);
    }
    if (k.bf16_pieces) {
      const int64_t S = d.seqlen, Dh = d.head_dim;
      piece_at = (total + 63) / 64 * 64;
      // a pair a product for P, dS (the larger of the two ways), or the
      // pairs concatenated for the products Q K^T, dO V^T (SplitGemm)
      const int64_t by_pair = split_gemm_scratch(d.kv_heads, rows, S > Dh ? S : Dh, S, Dh);
      const int64_t concat = d.kv_heads * (split_concat_elems(rows, Dh, true, kMaxSplitPairs) +
                                           split_concat_elems(S, Dh, true, kMaxSplitPairs));
      pieces = by_pair > concat ? by_pair : concat;
      total = piece_at + (pieces + 1) / 2;
    }
  }
  uint16_t* piece_ptr(float* scratch) const { return reinterpret_cast<uint16_t*>(scratch + piece_at); }
};
// f(gemm) with the products the blocking asks for: `fp32` (a batched FP32
// functor), or with bf16_pieces a SplitGemm over `g16` (L launching its
// pieces) in the scratch's piece area. The entry points of
// models/cuda/attention_cuda.hpp call the launches through it.
template <class L, class Fp32, class G16, class F>
void with_block_gemm(const AttnDims& d, const AttnBlocking& k, bool backward, float* scratch, const Fp32& fp32,
                     const G16& g16, F&& f) {
  if (!k.bf16_pieces) return f(fp32);
  const AttnBlockScratch s(d, k, backward);
  f(SplitGemm<L, G16>{{}, g16, s.piece_ptr(scratch), s.pieces});
}
inline int64_t attention_blocks_forward_scratch(const AttnDims& d, const AttnBlocking& k) {
  return AttnBlockScratch(d, k, false).total;
}
inline int64_t attention_blocks_backward_scratch(const AttnDims& d, const AttnBlocking& k) {
  return AttnBlockScratch(d, k, true).total;
}

template <class L, class Gemm, class T>
void attention_blocks_forward_launches(const L& launch, const Gemm& gemm, T* out, T* lse, const T* q, const T* k,
                                       const T* v, const AttnDims& d, const AttnBlocking& blocking, T* scratch) {
  const AttnBlockScratch s(d, blocking, false);
  const int64_t S = d.seqlen, Dh = d.head_dim, Hq = d.q_heads, Hkv = d.kv_heads, rep = Hq / Hkv;
  const int64_t ldq = Hq * Dh, ldkv = Hkv * Dh, ph = s.per_head;
  const T scale = attn_scale<T>(d);
  const bool qkv = d.qkv_bf16;  // q, k, v hold bfloat16 values (a product's hint)
  T* const P = scratch + s.P;
  T* const R = scratch + s.R;
  T* const part = scratch + s.parts;
  for (int64_t b = 0; b < d.batch; ++b)
    for (int64_t r = 0; r < rep; ++r) {
      // entry kvh: query head h = kvh * rep + r, its lse row at (b Hq + h) S
      T* const lse_r = lse + (b * Hq + r) * S;
      const int64_t lse_step = rep * S;
      for (int64_t i0 = 0; i0 < S; i0 += s.rows) {
        const int64_t i1 = i0 + s.rows < S ? i0 + s.rows : S, n = i1 - i0, keys = i1;
        gemm_hinted(gemm, {qkv, qkv}, Hkv, P, keys, ph, q + (b * S + i0) * ldq + r * Dh, ldq, rep * Dh, sim::Op::N,
                    k + b * S * ldkv, ldkv, Dh, sim::Op::T, n, keys, Dh, false);
        const int64_t seg = s.segment > 0 ? s.segment : keys, parts = attn_row_parts(keys, s.segment);
        launch("attention_forward block scale max", Hkv * n * parts, [=] EXMY_HD_LAMBDA(int64_t u) {
          const int64_t h = u / (n * parts), row = (u / parts) % n, j0 = (u % parts) * seg, i = i0 + row;
          part[u] = attn_row_scale_max(P + h * ph + row * keys, j0, j0 + seg < i + 1 ? j0 + seg : i + 1, scale);
        });
        launch("attention_forward block max", Hkv * n, [=] EXMY_HD_LAMBDA(int64_t u) {
          T mx = part[u * parts];
          for (int64_t c = 1; c < parts; ++c) mx = sim::hd_max(mx, part[u * parts + c]);
          lse_r[(u / n) * lse_step + i0 + u % n] = mx;
        });
        launch("attention_forward block exp", Hkv * n * keys, [=] EXMY_HD_LAMBDA(int64_t u) {
          const int64_t h = u / (n * keys), row = (u / keys) % n, j = u % keys, i = i0 + row;
          T* e = P + h * ph + row * keys + j;
          *e = attn_prob_unnormalized(*e, i, j, lse_r[h * lse_step + i]);
        });
        launch("attention_forward block sum parts", Hkv * n * parts, [=] EXMY_HD_LAMBDA(int64_t u) {
          const int64_t h = u / (n * parts), row = (u / parts) % n, j0 = (u % parts) * seg, i = i0 + row;
          part[u] = attn_row_sum(P + h * ph + row * keys, j0, j0 + seg < i + 1 ? j0 + seg : i + 1);
        });
        launch("attention_forward block sum", Hkv * n, [=] EXMY_HD_LAMBDA(int64_t u) {
          T sum = part[u * parts];
          for (int64_t c = 1; c < parts; ++c) sum += part[u * parts + c];
          R[u] = T(1) / sum;
          T& l = lse_r[(u / n) * lse_step + i0 + u % n];
          l = l + sim::hd_log(sum);
        });
        launch("attention_forward block normalize", Hkv * n * keys, [=] EXMY_HD_LAMBDA(int64_t u) {
          const int64_t h = u / (n * keys), row = (u / keys) % n, j = u % keys;
          if (j <= i0 + row) P[h * ph + row * keys + j] *= R[h * n + row];
        });
        gemm_hinted(gemm, {false, qkv}, Hkv, out + (b * S + i0) * ldq + r * Dh, ldq, rep * Dh,
                    static_cast<const T*>(P), keys, ph, sim::Op::N, v + b * S * ldkv, ldkv, Dh, sim::Op::N, n, Dh, keys,
                    false);
      }
    }
}

template <class L, class Gemm, class T>
void attention_blocks_backward_launches(const L& launch, const Gemm& gemm, T* dq, T* dk, T* dv, const T* dout,
                                        const T* out, const T* lse, const T* q, const T* k, const T* v,
                                        const AttnDims& d, const AttnBlocking& blocking, T* scratch) {
  const AttnBlockScratch s(d, blocking, true);
  const int64_t S = d.seqlen, Dh = d.head_dim, Hq = d.q_heads, Hkv = d.kv_heads, rep = Hq / Hkv;
  const int64_t ldq = Hq * Dh, ldkv = Hkv * Dh, ph = s.per_head;
  const T scale = attn_scale<T>(d);
  const bool qkv = d.qkv_bf16;  // q, k, v hold bfloat16 values (a product's hint)
  T* const P = scratch + s.P;
  T* const dP = scratch + s.dP;
  T* const D = scratch + s.D;
  for (int64_t b = 0; b < d.batch; ++b)
    for (int64_t r = 0; r < rep; ++r) {
      const T* const lse_r = lse + (b * Hq + r) * S;
      const int64_t lse_step = rep * S;
      const int64_t head0 = b * S * ldq + r * Dh;  // entry kvh's head: + kvh * rep * Dh
      launch("attention_backward block rowsum", Hkv * S, [=] EXMY_HD_LAMBDA(int64_t u) {
        const int64_t h = u / S, i = u % S, at = head0 + h * rep * Dh + i * ldq;
        D[u] = attn_row_dot(dout + at, out + at, Dh);
      });
      for (int64_t i0 = 0; i0 < S; i0 += s.rows) {
        const int64_t i1 = i0 + s.rows < S ? i0 + s.rows : S, n = i1 - i0, keys = i1;
        const T* const q_blk = q + head0 + i0 * ldq;
        const T* const do_blk = dout + head0 + i0 * ldq;
        gemm_hinted(gemm, {qkv, qkv}, Hkv, P, keys, ph, q_blk, ldq, rep * Dh, sim::Op::N, k + b * S * ldkv, ldkv, Dh,
                    sim::Op::T, n, keys, Dh, false);
        launch("attention_backward block probs", Hkv * n * keys, [=] EXMY_HD_LAMBDA(int64_t u) {
          const int64_t h = u / (n * keys), row = (u / keys) % n, j = u % keys, i = i0 + row;
          T* e = P + h * ph + row * keys + j;
          *e = attn_prob_saved(*e, i, j, scale, lse_r[h * lse_step + i]);
        });
        // dV[0:i1] += P^T dO_blk;  dP = dO_blk V[0:i1]^T
        gemm_hinted(gemm, {false, false}, Hkv, dv + b * S * ldkv, ldkv, Dh, static_cast<const T*>(P), keys, ph,
                    sim::Op::T, do_blk, ldq, rep * Dh, sim::Op::N, keys, Dh, n, true);
        gemm_hinted(gemm, {false, qkv}, Hkv, dP, keys, ph, do_blk, ldq, rep * Dh, sim::Op::N, v + b * S * ldkv, ldkv,
                    Dh, sim::Op::T, n, keys, Dh, false);
        launch("attention_backward block dscores", Hkv * n * keys, [=] EXMY_HD_LAMBDA(int64_t u) {
          const int64_t h = u / (n * keys), row = (u / keys) % n, j = u % keys, i = i0 + row;
          const int64_t at = h * ph + row * keys + j;
          dP[at] = attn_dscore(P[at], dP[at], i, j, D[h * S + i], scale);
        });
        // dQ_blk += dS K[0:i1];  dK[0:i1] += dS^T Q_blk (dS again: its pieces kept)
        gemm_hinted(gemm, {false, qkv}, Hkv, dq + head0 + i0 * ldq, ldq, rep * Dh, static_cast<const T*>(dP), keys,
                    ph, sim::Op::N, k + b * S * ldkv, ldkv, Dh, sim::Op::N, n, Dh, keys, true);
        gemm_hinted(gemm, {false, qkv, true}, Hkv, dk + b * S * ldkv, ldkv, Dh, static_cast<const T*>(dP), keys,
                    ph, sim::Op::T, q_blk, ldq, rep * Dh, sim::Op::N, keys, Dh, n, true);
      }
    }
}

}  // namespace exmy::models

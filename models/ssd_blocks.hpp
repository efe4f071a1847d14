// The block launches of the chunked SSD scan (models/ssd.hpp): the item
// kernels' algorithm (models/ssd_items.hpp) with each small product of every
// (chunk, group) or (chunk, head) item formed by one batched GEMM call over
// the items, and the element and row steps as launches, so that a CUDA
// device forms the products on cuBLASLt (strided batches) instead of a
// thread per output element summing alone (models/ssd_threads.hpp).
//
// Entries. The products read only arrays in chunk-major order, one entry
// per item, every entry item_pad-aligned: copies of C and B per (b, q, g)
// (chunk x state), of dy and of dt x per (b, q, h) (chunk x head_dim), the
// saved states and their gradients per (b, q, h) (head_dim x state, already
// in that order), and the products' own scratch. Flat indices eg = (b Q + q)
// G + g and eh = (b Q + q) H + h = eg hpg + r (h = g hpg + r, hpg heads per
// group), so one call covers a run of chunks for every group (or every
// head) at one stride, and a product of a group's array with a head's is
// one call per r < hpg (entries eg, heads eg hpg + r): calls for r in
// increasing order add a group's dB and dC parts in head order, as the
// item does. A run is a stretch of whole chunks: all of them when the
// chunk divides the sequence, otherwise each row's whole chunks and its
// short last chunk apart (entries of one call must share their shape).
// Arrays keep the chunk's full stride (chunk x chunk arrays rows `chunk`
// apart) for short chunks too.
//
// Operations and order: those of the item kernels (the products' shapes
// and operands, each element step's operations, every accumulation in the
// item's order: a group's dB and dC parts in head order, dacs as
// ssd_dacs_value adds it, dCB over the group's heads in order), so with
// LoopGemm<NaiveGemm> the launches give the item kernels' bits with
// NaiveGemm, and with LoopGemm<SerialGemm> the CPU's bits (Eigen's product
// does not depend on its operands' strides); tests/models/test_ssd_cuda.cpp
// checks both bit for bit, and a device (cuBLASLt's order inside each
// product) against the CPU's FP32 budget.
// Cost: at proxy-350m's Mamba shape (32 heads in 8 groups) 10 batched
// calls a layer forward and 29 backward per slab, each over every chunk of
// the slab (at 1 x 4096 tokens: one slab forward, two of 16 chunks
// backward).
//
// Pieces. Each product's call says which operands hold bfloat16 values
// (Bf16Operands: C, B and their copies where SsdDims::xbc_bf16) and whether
// A is the previous call's unchanged A, which a plain functor ignores and a
// SplitGemm (models/split_gemm.hpp: the products on BF16 tensor cores as
// products of bfloat16 pieces) uses; given a SplitGemm, the launches carve
// its piece area at the front of the scratch, a share of each slab chunk
// (SsdBlockSizes::PF), and pass it a copy with that area.
//
// Fused diagonal blocks. Given a diagonal functor (the fused kernels of
// models/ssd_fused_bwd.hpp), the backward leaves section (d) to it: no CB,
// M or dM arrays nor their products; the functor adds into the slab's
// dXDT, dCg and dBg and writes dacs's diagonal sums (SsdDiagonalSlab), and
// one launch finishes dacs from them.
//
// Slabs. The per-item arrays (the chunk x chunk ones the largest) exist for
// a slab of chunks at a time (a stretch of a run, as many chunks as fit
// kSsdSlabFloats), so they do not grow with the sequence: what must span
// every chunk (the copies of C and B, the diagonal blocks' outputs, the
// state gradients, exp(acs)) is global, and the passes that need every
// chunk's result first (the state passing and its backward) split the
// slabs' work into a part before and a part after them.
//
// Forward  acs, W (ssd_thr_acs); copies Cc, Bc, XDT = dt x; CB = Cc Bc^T;
//          M = CB exp(acs_t - acs_s) (s <= t, else +0); Yd = M XDT;
//          XDT *= W; states = XDT^T Bc (per r); pass the states
//          (ssd_thr_pass_states); off = Cc states^T (per r);
//          y = (Yd + exp(acs_t) off) + D x.
// Backward E, W (ssd_thr_exp_acs); copies Cc, Bc, dyc, XDT, dye = dy E;
//          dstates = dye^T Cc (per r); pass them back, dlast; CB = Cc Bc^T;
//          tmp = Cc hin^T (per r), sB_t = dy_t . tmp_t; dCg += dye hin (per
//          r); tmp = Bc dS^T (per r), per row s: dw_s = XDT_s . tmp_s, dXDT
//          = +0 + W_s tmp_s, dye = W_s XDT_s; dBg += dye dS (per r);
//          M = CB Lm (Lm = exp(acs_t - acs_s), s <= t, else 0); dM = dyc
//          XDT^T; dXDT += M^T dyc; dCB over the heads (in place of CB);
//          dacs (ssd_dacs_value from sB); dx += D dy, += dt dXDT, ddt +=
//          x . dXDT; the reverse cumsum of dacs (ssd_thr_dacs_scan); dCg +=
//          dCB Bc, dBg += dCB^T Cc; dC += dCg, dB += dBg; dA_log, dD
//          (ssd_bwd_param_sums).
#pragma once

#include <cstdint>
#include <type_traits>

#include "models/item_gemm.hpp"
#include "models/split_gemm.hpp"
#include "models/ssd_items.hpp"
#include "models/ssd_threads.hpp"
#include "sim/kernel_launch.hpp"

namespace exmy::models {

// Floats of a slab's arrays at most (a slab has at least one chunk).
inline constexpr int64_t kSsdSlabFloats = int64_t{1} << 26;  // 256 MiB

// uint16 elements of one chunk's entries of the block launches' products
// on bfloat16 pieces (models/split_gemm.hpp), the largest product's: C and
// B in one piece where they hold bfloat16 values (SsdDims::xbc_bf16), every
// other operand in three; a product has an entry per group (G a chunk) or
// per head (H), and takes either of SplitGemm's ways.
inline int64_t ssd_piece_chunk_elems(const SsdDims& d) {
  const int64_t L = d.chunk, P = d.head_dim, N = d.state, G = d.groups, H = d.heads;
  const int x = d.xbc_bf16 ? 1 : kBf16Pieces, f = kBf16Pieces;
  struct Product {
    int64_t entries, ra, ca;
    int pa;
    int64_t rb, cb;
    int pb;
  };
  // the operands as stored: C, B (L x N), dt x, dy, dye (L x P), M, C B^T (L
  // x L), the states and their gradients (P x N)
  const Product products[] = {
      {G, L, N, x, L, N, x},  // C B^T
      {H, L, L, f, L, P, f},  // M (dt x), M^T dy
      {G, L, P, f, L, N, x},  // (dt x)^T B, dye^T C
      {G, L, N, x, P, N, f},  // C states^T, C hin^T, B dS^T
      {G, L, P, f, P, N, f},  // dye hin, dye dS
      {H, L, P, f, L, P, f},  // dy (dt x)^T
      {G, L, L, f, L, N, x},  // dCB B, dCB^T C
  };
  int64_t most = 0;
  for (const Product& p : products) {
    const int64_t n = p.entries * split_entry_elems(p.ra, p.ca, p.pa, p.rb, p.cb, p.pb);
    if (n > most) most = n;
  }
  return most;
}

// The per-entry array sizes (item_pad'ded), counts and slabs of the block
// launches' scratch; with `pieces` (the products through a SplitGemm) also
// each chunk's share of the piece area (PF floats, a multiple of 64: the
// area starts the scratch, and what follows keeps its 256-byte alignment).
struct SsdBlockSizes {
  int64_t LL, LP, LN, L1, G, H, BQ, acs, st, bqh, PF;
  explicit SsdBlockSizes(const SsdDims& d, bool pieces = false)
      : LL(item_pad(d.chunk * d.chunk)),
        LP(item_pad(d.chunk * d.head_dim)),
        LN(item_pad(d.chunk * d.state)),
        L1(item_pad(d.chunk)),
        G(d.groups),
        H(d.heads),
        BQ(d.batch * d.chunks()),
        acs(item_pad(d.acs_size())),
        st(item_pad(d.states_size())),
        bqh(item_pad(d.batch * d.chunks() * d.heads)),
        PF(pieces ? ((ssd_piece_chunk_elems(d) + 1) / 2 + 63) / 64 * 64 : 0) {}
  // Per head of the backward: a region R of tmp and dye (LP each) that dM
  // (LL) takes over once they are dead (with the diagonal blocks fused,
  // models/ssd_fused_bwd.hpp, there is no dM).
  int64_t R(bool fused = false) const { return fused || LL <= 2 * LP ? 2 * LP : LL; }
  // A slab's floats per chunk: forward CB (per group), M, XDT, off (per
  // head); backward CB, dCg, dBg (per group), M, R, dyc, XDT, dXDT, sB, dw,
  // dacs (per head); and the chunk's pieces.
  int64_t forward_chunk() const { return PF + G * LL + H * (LL + 2 * LP); }
  // With the chunks' outputs fused (models/ssd_fused.hpp): XDT alone.
  int64_t fused_forward_chunk() const { return PF + H * LP; }
  int64_t backward_chunk() const { return PF + G * (LL + 2 * LN) + H * (LL + R() + 3 * LP + 3 * L1); }
  // With the diagonal blocks fused: no CB, M or dM, and per head the
  // kernels' row and column sums.
  int64_t fused_backward_chunk() const { return PF + G * 2 * LN + H * (R(true) + 3 * LP + 5 * L1); }
  // Chunks a slab of `per_chunk` floats a chunk holds within `cap` floats.
  int64_t slab_chunks(int64_t per_chunk, int64_t cap) const {
    const int64_t n = cap / per_chunk;
    return n < 1 ? 1 : n < BQ ? n : BQ;
  }
  // Forward: the slab's pieces (per PF, with pieces), Cc, Bc (BQ G x LN),
  // Yd (BQ H x LP), W (acs), then the rest of the slab.
  int64_t forward(int64_t cap) const {
    return 2 * BQ * G * LN + BQ * H * LP + acs + slab_chunks(forward_chunk(), cap) * forward_chunk();
  }
  // With the chunks' outputs fused: (the pieces,) Bc, W, then the slab.
  int64_t fused_forward(int64_t cap) const {
    return BQ * G * LN + acs + slab_chunks(fused_forward_chunk(), cap) * fused_forward_chunk();
  }
  // Backward: the slab's pieces (with pieces), dstates (st), dlast, pA, pD
  // (bqh), E, W (acs), Cc, Bc (BQ G x LN), then the rest of the slab.
  int64_t backward(int64_t cap, bool fused = false) const {
    const int64_t chunk = fused ? fused_backward_chunk() : backward_chunk();
    return st + 3 * bqh + 2 * acs + 2 * BQ * G * LN + slab_chunks(chunk, cap) * chunk;
  }
};
// Floats of the block launches' scratch; `pieces`: with their products on
// bfloat16 pieces (a SplitGemm).
inline int64_t ssd_blocks_forward_scratch(const SsdDims& d, int64_t cap = kSsdSlabFloats, bool pieces = false) {
  return SsdBlockSizes(d, pieces).forward(cap);
}
inline int64_t ssd_fused_forward_scratch(const SsdDims& d, int64_t cap = kSsdSlabFloats) {
  return SsdBlockSizes(d).fused_forward(cap);
}
inline int64_t ssd_blocks_backward_scratch(const SsdDims& d, int64_t cap = kSsdSlabFloats, bool pieces = false) {
  return SsdBlockSizes(d, pieces).backward(cap);
}
// With the diagonal blocks fused (models/ssd_fused_bwd.hpp).
inline int64_t ssd_fused_backward_scratch(const SsdDims& d, int64_t cap = kSsdSlabFloats, bool pieces = false) {
  return SsdBlockSizes(d, pieces).backward(cap, true);
}

// Consecutive arrays carved from a scratch: take(n) is the next n elements.
template <class T>
struct ScratchCarver {
  T* p;
  T* operator()(int64_t n) {
    T* a = p;
    p += n;
    return a;
  }
};

// The GEMM functor the launches use: `gemm` itself, or where it is a
// SplitGemm a copy of it whose pieces take the scratch's first `per` x PF
// floats (taken here, before the launches' arrays).
template <class Gemm, class T>
auto ssd_gemm_in_scratch(const Gemm& gemm, ScratchCarver<T>& take, const SsdBlockSizes& z, int64_t per) {
  if constexpr (kSplitsIntoPieces<Gemm>) {
    static_assert(std::is_same_v<T, float>, "pieces are made from float32 operands");
    return with_pieces(gemm, reinterpret_cast<uint16_t*>(take(per * z.PF)), 2 * per * z.PF);
  } else {
    return gemm;
  }
}

// A stretch of chunks whose items share one shape: flat chunks [c0, c0 +
// count) (flat chunk b Q + q), each of len tokens.
struct SsdRun {
  int64_t c0, count, len;
};
// The runs (all chunks when the chunk divides the sequence, otherwise each
// row's whole chunks and its short last chunk apart), cut into as few slabs
// of at most `per` chunks as they need, of equal size but for the last, in
// flat chunk order.
template <class F>
void ssd_for_slabs(const SsdDims& d, int64_t per, F f) {
  const int64_t Q = d.chunks(), last = d.seqlen - (Q - 1) * d.chunk;
  const auto cut = [&](int64_t c0, int64_t count, int64_t len) {
    const int64_t slabs = (count + per - 1) / per, step = (count + slabs - 1) / slabs;
    for (int64_t i = 0; i < count; i += step) f(SsdRun{c0 + i, count - i < step ? count - i : step, len});
  };
  if (last == d.chunk) return cut(0, d.batch * Q, d.chunk);
  for (int64_t b = 0; b < d.batch; ++b) {
    if (Q > 1) cut(b * Q, Q - 1, d.chunk);
    cut(b * Q + Q - 1, 1, last);
  }
}

// The chunk of flat entry e of an array with `per` entries per chunk.
EXMY_HD SsdChunk ssd_entry_chunk(const SsdDims& d, int64_t e, int64_t per) {
  const int64_t bq = e / per;
  return ssd_chunk_of(d, bq / d.chunks(), bq % d.chunks());
}

// Cc, Bc (BQ G x LN): row t of C and B of group g of each chunk, a thread
// per (eg, t, n); Bc alone where Cc is null.
template <class L, class T>
void ssd_copy_bc_launch(const L& launch, const char* name, T* Cc, T* Bc, const T* Bm, const T* Cm, int64_t ldbc,
                        const SsdDims& d, int64_t LN) {
  const int64_t Lm = d.chunk, N = d.state, G = d.groups;
  launch(name, d.batch * d.chunks() * G * Lm * N, [=] EXMY_HD_LAMBDA(int64_t u) {
    const int64_t e = u / (Lm * N), t = (u / N) % Lm, n = u % N;
    const SsdChunk c = ssd_entry_chunk(d, e, G);
    if (t >= c.len) return;
    const int64_t at = (c.b * d.seqlen + c.t0 + t) * ldbc + (e % G) * N + n;
    if (Cc) Cc[e * LN + t * N + n] = Cm[at];
    Bc[e * LN + t * N + n] = Bm[at];
  });
}

// In the launches below a slab's arrays are indexed by the slab's own
// entries (el, from 0) and the global ones by the flat entry e = eh0 + el
// (eh0 = c0 H, or eg0 = c0 G for a group's).

// The forward's outputs as the block launches form them; or, with
// `output` another functor, by that one call after the state passing (the
// fused kernel of models/ssd_fused.hpp: output(y, acs, states, x, ldx, Bm,
// Cm, ldbc, dt, D, d)), the launches then forming only acs and the states
// (scratch ssd_fused_forward_scratch).
struct SsdBlocksOutput {};

template <class L, class Gemm, class T, class Out = SsdBlocksOutput>
void ssd_blocks_forward_launches(const L& launch, const Gemm& gemm_in, T* y, T* acs, T* states, const T* x,
                                 int64_t ldx, const T* Bm, const T* Cm, int64_t ldbc, const T* dt, const T* A_log,
                                 const T* D, const SsdDims& d, T* scratch, int64_t cap = kSsdSlabFloats,
                                 const Out& output = {}) {
  constexpr bool kFused = !std::is_same_v<Out, SsdBlocksOutput>;
  const SsdBlockSizes z(d, kSplitsIntoPieces<Gemm>);
  const int64_t Lm = d.chunk, P = d.head_dim, N = d.state, H = d.heads, G = d.groups, Q = d.chunks();
  const int64_t S = d.seqlen, hpg = H / G, PN = P * N, ldy = H * P;
  const int64_t LL = z.LL, LP = z.LP, LN = z.LN;
  const int64_t per = z.slab_chunks(kFused ? z.fused_forward_chunk() : z.forward_chunk(), cap);
  // the order of SsdBlockSizes::forward (fused_forward: Bc, W, XDT)
  ScratchCarver<T> take{scratch};
  const auto gemm = ssd_gemm_in_scratch(gemm_in, take, z, per);
  const bool bc16 = d.xbc_bf16;  // C and B (and their copies) hold bfloat16 values
  const auto take_unless_fused = [&](int64_t n) { return kFused ? nullptr : take(n); };
  T *Cc = take_unless_fused(z.BQ * G * LN), *Bc = take(z.BQ * G * LN), *Yd = take_unless_fused(z.BQ * H * LP);
  T *W = take(z.acs), *CB = take_unless_fused(per * G * LL), *M = take_unless_fused(per * H * LL);
  T *XDT = take(per * H * LP), *off = take_unless_fused(per * H * LP);
  launch("ssd_forward acs", d.batch * H * Q, [=] EXMY_HD_LAMBDA(int64_t u) {
    ssd_thr_acs(acs, W, dt, A_log, d, u / (H * Q), (u / Q) % H, u % Q);
  });
  ssd_copy_bc_launch(launch, "ssd_forward copy bc", Cc, Bc, Bm, Cm, ldbc, d, LN);
  // Before the state passing: the diagonal blocks and the chunks' own end states.
  ssd_for_slabs(d, per, [&](const SsdRun& r) {
    const int64_t eh0 = r.c0 * H, eg0 = r.c0 * G, nh = r.count * H, ng = r.count * G;
    launch("ssd_forward xdt", nh * Lm * P, [=] EXMY_HD_LAMBDA(int64_t u) {
      const int64_t el = u / (Lm * P), e = eh0 + el, t = (u / P) % Lm, p = u % P, h = e % H;
      const SsdChunk c = ssd_entry_chunk(d, e, H);
      if (t >= c.len) return;
      const int64_t row = c.b * S + c.t0 + t;
      T& xdt = XDT[el * LP + t * P + p];
      xdt = dt[row * H + h] * x[row * ldx + h * P + p];
      if (kFused) xdt *= W[(c.b * H + h) * S + c.t0 + t];  // weighed at once: no Yd reads it unweighed
    });
    if (!kFused) {  // the diagonal blocks (the fused kernel forms them), then XDT weighed
      gemm_hinted(gemm, {bc16, bc16}, ng, CB, Lm, LL, static_cast<const T*>(Cc + eg0 * LN), N, LN, sim::Op::N,
                  static_cast<const T*>(Bc + eg0 * LN), N, LN, sim::Op::T, r.len, r.len, N, false);
      launch("ssd_forward m", nh * Lm * Lm, [=] EXMY_HD_LAMBDA(int64_t u) {
        const int64_t el = u / (Lm * Lm), e = eh0 + el, t = (u / Lm) % Lm, s = u % Lm, h = e % H;
        const SsdChunk c = ssd_entry_chunk(d, e, H);
        if (t >= c.len || s >= c.len) return;
        const T* ac = acs + (c.b * H + h) * S + c.t0;
        const T* cb = CB + ((el / H) * G + h / hpg) * LL;
        M[el * LL + t * Lm + s] = s <= t ? cb[t * Lm + s] * sim::hd_exp(ac[t] - ac[s]) : T(0);
      });
      gemm_hinted(gemm, {}, nh, Yd + eh0 * LP, P, LP, static_cast<const T*>(M), Lm, LL, sim::Op::N,
                  static_cast<const T*>(XDT), P, LP, sim::Op::N, r.len, P, r.len, false);
      launch("ssd_forward weigh", nh * Lm * P, [=] EXMY_HD_LAMBDA(int64_t u) {
        const int64_t el = u / (Lm * P), e = eh0 + el, t = (u / P) % Lm, h = e % H;
        const SsdChunk c = ssd_entry_chunk(d, e, H);
        if (t >= c.len) return;
        XDT[el * LP + t * P + u % P] *= W[(c.b * H + h) * S + c.t0 + t];
      });
    }
    for (int64_t k = 0; k < hpg; ++k)
      gemm_hinted(gemm, {false, bc16}, ng, states + (eh0 + k) * PN, N, hpg * PN, static_cast<const T*>(XDT + k * LP),
                  P, hpg * LP, sim::Op::T, static_cast<const T*>(Bc + eg0 * LN), N, LN, sim::Op::N, P, N, r.len,
                  false);
  });
  launch("ssd_forward pass_states", d.batch * H * PN, [=] EXMY_HD_LAMBDA(int64_t u) {
    ssd_thr_pass_states(states, static_cast<const T*>(acs), d, u / (H * PN), (u / PN) % H, u % PN);
  });
  if constexpr (kFused) {
    output(y, static_cast<const T*>(acs), static_cast<const T*>(states), x, ldx, Bm, Cm, ldbc, dt, D, d);
    return;
  }
  // After it: each chunk's read of its incoming state, and the output.
  ssd_for_slabs(d, per, [&](const SsdRun& r) {
    const int64_t eh0 = r.c0 * H, eg0 = r.c0 * G, nh = r.count * H, ng = r.count * G;
    for (int64_t k = 0; k < hpg; ++k)
      gemm_hinted(gemm, {bc16, false, k > 0}, ng, off + k * LP, P, hpg * LP, static_cast<const T*>(Cc + eg0 * LN), N,
                  LN, sim::Op::N, static_cast<const T*>(states + (eh0 + k) * PN), N, hpg * PN, sim::Op::T, r.len, P,
                  N, false);
    launch("ssd_forward output", nh * Lm * P, [=] EXMY_HD_LAMBDA(int64_t u) {
      const int64_t el = u / (Lm * P), e = eh0 + el, t = (u / P) % Lm, p = u % P, h = e % H;
      const SsdChunk c = ssd_entry_chunk(d, e, H);
      if (t >= c.len) return;
      const int64_t row = c.b * S + c.t0 + t, i = t * P + p;
      const T ex = sim::hd_exp(acs[(c.b * H + h) * S + c.t0 + t]);
      y[row * ldy + h * P + p] = (Yd[e * LP + i] + ex * off[el * LP + i]) + D[h] * x[row * ldx + h * P + p];
    });
  });
}

// What a slab's diagonal blocks give the rest of the backward where
// another functor forms them (the fused kernels of models/ssd_fused_bwd.hpp,
// diag(SsdDiagonalSlab<T>)): per head dXDT += M^T dy (over the block's
// rows t >= s), per group dCg += dCB B and dBg += dCB^T C, and per head
// dacs's diagonal sums rows[t] = sum over s < t of dM[t, s] M[t, s] and
// cols[s] = sum over t > s of the same. The slab's arrays have entries
// from 0 (a head's cl H + h, a group's cl G + g for its chunk c0 + cl),
// entry strides LP, LN and L1; the rest are the scan's inputs.
template <class T>
struct SsdDiagonalSlab {
  T *dXDT, *dCg, *dBg, *rows, *cols;
  const T *acs, *x, *Bm, *Cm, *dt, *dy;
  int64_t ldx, ldbc;
  SsdDims d;
  int64_t c0, count, LP, LN, L1;
};
// The block launches' own diagonal blocks (products and element launches).
struct SsdBlocksDiagonal {};

template <class L, class Gemm, class T, class Diag = SsdBlocksDiagonal>
void ssd_blocks_backward_launches(const L& launch, const Gemm& gemm_in, T* dx, T* dB, T* dC, T* ddt, T* dA_log,
                                  T* dD, const T* dy, const T* x, int64_t ldx, const T* Bm, const T* Cm, int64_t ldbc,
                                  const T* dt, const T* A_log, const T* D, const T* acs, const T* states,
                                  const SsdDims& d, T* scratch, int64_t cap = kSsdSlabFloats, const Diag& diag = {}) {
  constexpr bool kFused = !std::is_same_v<Diag, SsdBlocksDiagonal>;
  const SsdBlockSizes z(d, kSplitsIntoPieces<Gemm>);
  const int64_t Lm = d.chunk, P = d.head_dim, N = d.state, H = d.heads, G = d.groups, Q = d.chunks();
  const int64_t S = d.seqlen, hpg = H / G, PN = P * N, ldy = H * P;
  const int64_t LL = z.LL, LP = z.LP, LN = z.LN, L1 = z.L1, RR = z.R(kFused);
  const int64_t per = z.slab_chunks(kFused ? z.fused_backward_chunk() : z.backward_chunk(), cap);
  ScratchCarver<T> take{scratch};  // the order of SsdBlockSizes::backward
  const auto gemm = ssd_gemm_in_scratch(gemm_in, take, z, per);
  const bool bc16 = d.xbc_bf16;  // C and B (and their copies) hold bfloat16 values
  const auto take_unless_fused = [&](int64_t n) { return kFused ? nullptr : take(n); };
  T *dstates = take(z.st), *dlast = take(z.bqh), *pA = take(z.bqh), *pD = take(z.bqh);
  T *E = take(z.acs), *W = take(z.acs), *Cc = take(z.BQ * G * LN), *Bc = take(z.BQ * G * LN);
  // The slab's: CB (then dCB), dCg, dBg per group; per head M, the region R
  // (tmp and dye through (b) and (c), then dM from (d) on), dyc, XDT, dXDT,
  // sB, dw, dacs; fused, no CB, M or dM, and the diagonal sums rows, cols.
  T *CB = take_unless_fused(per * G * LL), *dCg = take(per * G * LN), *dBg = take(per * G * LN);
  T *M = take_unless_fused(per * H * LL), *tmp = take(per * H * RR);
  T *dye = tmp + LP, *dM = tmp;
  T *dyc = take(per * H * LP), *XDT = take(per * H * LP), *dXDT = take(per * H * LP);
  T *sB = take(per * H * L1), *dw = take(per * H * L1), *dacs = take(per * H * L1);
  T *rows = kFused ? take(per * H * L1) : nullptr, *cols = kFused ? take(per * H * L1) : nullptr;

  launch("ssd_backward exp_acs", d.batch * H * S, [=] EXMY_HD_LAMBDA(int64_t u) {
    ssd_thr_exp_acs(E, W, acs, d, u / (H * S), (u / S) % H, u % S);
  });
  ssd_copy_bc_launch(launch, "ssd_backward copy bc", Cc, Bc, Bm, Cm, ldbc, d, LN);
  // Copies of a slab's dy and dt x and dye = dy exp(acs).
  const auto copy_rows = [&](const char* name, const SsdRun& r, bool all) {
    const int64_t eh0 = r.c0 * H;
    launch(name, r.count * H * Lm * P, [=] EXMY_HD_LAMBDA(int64_t u) {
      const int64_t el = u / (Lm * P), e = eh0 + el, t = (u / P) % Lm, p = u % P, h = e % H;
      const SsdChunk c = ssd_entry_chunk(d, e, H);
      if (t >= c.len) return;
      const int64_t row = c.b * S + c.t0 + t, i = el * LP + t * P + p;
      const T g = dy[row * ldy + h * P + p];
      dye[el * RR + t * P + p] = g * E[(c.b * H + h) * S + c.t0 + t];
      if (!all) return;
      dyc[i] = g;
      XDT[i] = dt[row * H + h] * x[row * ldx + h * P + p];
    });
  };
  // The gradient of the state entering each chunk from its outputs.
  ssd_for_slabs(d, per, [&](const SsdRun& r) {
    copy_rows("ssd_backward copy dye", r, false);
    for (int64_t k = 0; k < hpg; ++k)
      gemm_hinted(gemm, {false, bc16}, r.count * G, dstates + (r.c0 * H + k) * PN, N, hpg * PN,
                  static_cast<const T*>(dye + k * RR), P, hpg * RR, sim::Op::T,
                  static_cast<const T*>(Cc + r.c0 * G * LN), N, LN, sim::Op::N, P, N, r.len, false);
  });
  launch("ssd_backward pass_dstates", d.batch * H * PN, [=] EXMY_HD_LAMBDA(int64_t u) {
    ssd_thr_pass_dstates(dstates, acs, d, u / (H * PN), (u / PN) % H, u % PN);
  });
  launch("ssd_backward dlast", d.batch * H * Q, [=] EXMY_HD_LAMBDA(int64_t u) {
    ssd_thr_dlast(dlast, static_cast<const T*>(dstates), acs, states, d, u / (H * Q), (u / Q) % H, u % Q);
  });

  ssd_for_slabs(d, per, [&](const SsdRun& r) {
    const int64_t eh0 = r.c0 * H, eg0 = r.c0 * G, nh = r.count * H, ng = r.count * G;
    const T* cc = Cc + eg0 * LN;
    const T* bc = Bc + eg0 * LN;
    copy_rows("ssd_backward copy rows", r, true);
    if (!kFused)
      gemm_hinted(gemm, {bc16, bc16}, ng, CB, Lm, LL, cc, N, LN, sim::Op::N, bc, N, LN, sim::Op::T, r.len, r.len, N,
                  false);
    launch("ssd_backward zero dbc", ng * LN, [=] EXMY_HD_LAMBDA(int64_t u) { dCg[u] = dBg[u] = T(0); });

    // (b) The incoming state: tmp = C hin^T; its dot with dy for dacs; dC's part.
    for (int64_t k = 0; k < hpg; ++k)
      gemm_hinted(gemm, {bc16, false, k > 0}, ng, tmp + k * RR, P, hpg * RR, cc, N, LN, sim::Op::N,
                  states + (eh0 + k) * PN, N, hpg * PN, sim::Op::T, r.len, P, N, false);
    launch("ssd_backward state rows", nh * Lm, [=] EXMY_HD_LAMBDA(int64_t u) {
      const int64_t el = u / Lm, t = u % Lm;
      if (t >= ssd_entry_chunk(d, eh0 + el, H).len) return;
      T s = 0;
      for (int64_t p = 0; p < P; ++p) s += dyc[el * LP + t * P + p] * tmp[el * RR + t * P + p];
      sB[el * L1 + t] = s;
    });
    for (int64_t k = 0; k < hpg; ++k)
      gemm_hinted(gemm, {}, ng, dCg, N, LN, static_cast<const T*>(dye + k * RR), P, hpg * RR, sim::Op::N,
                  states + (eh0 + k) * PN, N, hpg * PN, sim::Op::N, r.len, N, P, true);

    // (c) The own end state: tmp = B dS^T; per row the dw dot, dXDT's first
    //     part and dye = W XDT; dB's part.
    for (int64_t k = 0; k < hpg; ++k)
      gemm_hinted(gemm, {bc16, false, k > 0}, ng, tmp + k * RR, P, hpg * RR, bc, N, LN, sim::Op::N,
                  static_cast<const T*>(dstates + (eh0 + k) * PN), N, hpg * PN, sim::Op::T, r.len, P, N, false);
    launch("ssd_backward own rows", nh * Lm, [=] EXMY_HD_LAMBDA(int64_t u) {
      const int64_t el = u / Lm, e = eh0 + el, s = u % Lm, h = e % H;
      const SsdChunk c = ssd_entry_chunk(d, e, H);
      if (s >= c.len) return;
      const T ws = W[(c.b * H + h) * S + c.t0 + s];
      const int64_t i0 = el * LP + s * P, j0 = el * RR + s * P;
      T v = 0;
      for (int64_t p = 0; p < P; ++p) {
        v += XDT[i0 + p] * tmp[j0 + p];
        dXDT[i0 + p] = T(0) + ws * tmp[j0 + p];  // the item's dXDT starts at +0
        dye[j0 + p] = ws * XDT[i0 + p];
      }
      dw[el * L1 + s] = v;
    });
    for (int64_t k = 0; k < hpg; ++k)
      gemm_hinted(gemm, {}, ng, dBg, N, LN, static_cast<const T*>(dye + k * RR), P, hpg * RR, sim::Op::N,
                  static_cast<const T*>(dstates + (eh0 + k) * PN), N, hpg * PN, sim::Op::N, r.len, N, P, true);

    // (d) The diagonal block: the fused kernels, then dacs from their sums;
    if constexpr (kFused) {
      diag(SsdDiagonalSlab<T>{dXDT, dCg, dBg, rows, cols, acs, x, Bm, Cm, dt, dy, ldx, ldbc, d, r.c0, r.count, LP, LN,
                              L1});
      launch("ssd_backward dacs", nh * Lm, [=] EXMY_HD_LAMBDA(int64_t u) {
        const int64_t el = u / Lm, e = eh0 + el, t = u % Lm;
        const SsdChunk c = ssd_entry_chunk(d, e, H);
        if (t >= c.len) return;
        const int64_t i = el * L1 + t;
        dacs[i] = (ssd_dacs_outer(sB[i], static_cast<const T*>(dw + el * L1), static_cast<const T*>(E),
                                  static_cast<const T*>(W), static_cast<const T*>(dlast), d, c, e % H, t) +
                   rows[i]) -
                  cols[i];
      });
    } else {  // or the products and element launches.
      launch("ssd_backward m", nh * Lm * Lm, [=] EXMY_HD_LAMBDA(int64_t u) {
        const int64_t el = u / (Lm * Lm), e = eh0 + el, t = (u / Lm) % Lm, s = u % Lm, h = e % H;
        const SsdChunk c = ssd_entry_chunk(d, e, H);
        if (t >= c.len || s >= c.len) return;
        const T* ac = acs + (c.b * H + h) * S + c.t0;
        const T l = s <= t ? sim::hd_exp(ac[t] - ac[s]) : T(0);
        M[el * LL + t * Lm + s] = CB[((el / H) * G + h / hpg) * LL + t * Lm + s] * l;
      });
      gemm_hinted(gemm, {}, nh, dM, Lm, RR, static_cast<const T*>(dyc), P, LP, sim::Op::N, static_cast<const T*>(XDT),
                  P, LP, sim::Op::T, r.len, r.len, P, false);
      gemm_hinted(gemm, {}, nh, dXDT, P, LP, static_cast<const T*>(M), Lm, LL, sim::Op::T, static_cast<const T*>(dyc),
                  P, LP, sim::Op::N, r.len, P, r.len, true);
      launch("ssd_backward dcb", ng * Lm * Lm, [=] EXMY_HD_LAMBDA(int64_t u) {
        const int64_t el = u / (Lm * Lm), e = eg0 + el, t = (u / Lm) % Lm, s = u % Lm;
        const SsdChunk c = ssd_entry_chunk(d, e, G);
        if (t >= c.len || s >= c.len) return;
        CB[el * LL + t * Lm + s] =
            s <= t ? ssd_dcb_value(static_cast<const T*>(dM + el * hpg * RR), RR, acs, d, c, e % G, t, s) : T(0);
      });
      launch("ssd_backward dacs", nh * Lm, [=] EXMY_HD_LAMBDA(int64_t u) {
        const int64_t el = u / Lm, e = eh0 + el, t = u % Lm;
        const SsdChunk c = ssd_entry_chunk(d, e, H);
        if (t >= c.len) return;
        dacs[el * L1 + t] = ssd_dacs_value(sB[el * L1 + t], static_cast<const T*>(M + el * LL),
                                           static_cast<const T*>(dM + el * RR), static_cast<const T*>(dw + el * L1),
                                           static_cast<const T*>(E), static_cast<const T*>(W),
                                           static_cast<const T*>(dlast), d, c, e % H, t);
      });
    }

    // (a), (e) dx += D dy, then += dt dXDT; ddt += x . dXDT.
    launch("ssd_backward dx rows", nh * Lm, [=] EXMY_HD_LAMBDA(int64_t u) {
      const int64_t el = u / Lm, e = eh0 + el, t = u % Lm, h = e % H;
      const SsdChunk c = ssd_entry_chunk(d, e, H);
      if (t >= c.len) return;
      const int64_t row = c.b * S + c.t0 + t, i0 = el * LP + t * P;
      const T dtt = dt[row * H + h];
      T* dxt = dx + row * ldx + h * P;
      const T* xt = x + row * ldx + h * P;
      T s = 0;
      for (int64_t p = 0; p < P; ++p) {
        dxt[p] += D[h] * dyc[i0 + p];
        dxt[p] += dtt * dXDT[i0 + p];
        s += xt[p] * dXDT[i0 + p];
      }
      ddt[row * H + h] += s;
    });
    // (f) The reverse cumulative sum of dacs, and the head's partials.
    launch("ssd_backward dacs_scan", nh, [=] EXMY_HD_LAMBDA(int64_t el) {
      const SsdChunk c = ssd_entry_chunk(d, eh0 + el, H);
      ssd_thr_dacs_scan(ddt, pA, pD, static_cast<const T*>(dacs + el * L1), dy, x, ldx, dt, A_log, d, c.b, c.q,
                        (eh0 + el) % H);
    });

    // The group's shared C B^T: dC and dB's last parts (the fused kernels
    // added them), then into dC and dB.
    if (!kFused) {
      gemm_hinted(gemm, {false, bc16}, ng, dCg, N, LN, static_cast<const T*>(CB), Lm, LL, sim::Op::N, bc, N, LN,
                  sim::Op::N, r.len, N, r.len, true);
      gemm_hinted(gemm, {false, bc16, true}, ng, dBg, N, LN, static_cast<const T*>(CB), Lm, LL, sim::Op::T, cc, N,
                  LN, sim::Op::N, r.len, N, r.len, true);
    }
    launch("ssd_backward dbc", ng * Lm * N, [=] EXMY_HD_LAMBDA(int64_t u) {
      const int64_t el = u / (Lm * N), e = eg0 + el, t = (u / N) % Lm, n = u % N;
      const SsdChunk c = ssd_entry_chunk(d, e, G);
      if (t >= c.len) return;
      const int64_t at = (c.b * S + c.t0 + t) * ldbc + (e % G) * N + n;
      dC[at] += dCg[el * LN + t * N + n];
      dB[at] += dBg[el * LN + t * N + n];
    });
  });
  launch("ssd_backward param_sums", H, [=] EXMY_HD_LAMBDA(int64_t h) {
    ssd_bwd_param_sums(dA_log, dD, static_cast<const T*>(pA), static_cast<const T*>(pD), d, h);
  });
}

}  // namespace exmy::models

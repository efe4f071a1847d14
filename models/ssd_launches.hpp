// The launch sequences of the chunked SSD scan, written once over a launcher
// (sim/kernel_launch.hpp) and a GEMM functor (models/ssd_items.hpp):
// models/cuda/ssd.cu instantiates them with DeviceLaunch and NaiveGemm,
// models/ssd_emulated.cpp with HostLaunch and SerialGemm. Each launch is one
// thread per work item of models/ssd.cpp's loops, in the same pass order, so
// the emulation equals the CPU bit for bit. The kernels are float32 (the
// training type); tests also run the launches on an error-bound number type.
//
// This first version runs a whole (b, chunk, group) or (b, chunk, head) item
// in one thread, its products summed element by element in k order: it is
// correct, not fast. A faster version would give an item a block, form the
// intra-chunk products (C B^T, M · dt x, the chunk states, C · state) as
// tensor-core tiles or cuBLASLt batched GEMMs with split-k, and scan the
// chunk states across blocks: every such change reorders the sums, so it
// would keep the device inside the FP32 budget of tests/models/test_ssd_cuda.cpp
// (which already allows any order of the products' sums) but not the CPU's
// bits.
#pragma once

#include <cstdint>

#include "models/ssd_items.hpp"
#include "sim/kernel_launch.hpp"

namespace exmy::models {

// Scratch elements of the forward: per (b, q, g) item CB, M (chunk^2) and
// XDT (chunk x P); per (b, h) the running state (P x N); per (b, q, h) off
// (chunk x P). Every array padded by item_pad, the scratch 64-byte aligned
// (as cudaMalloc's and sim::Buf's are).
inline int64_t ssd_forward_group_scratch(int64_t L, int64_t P) { return 2 * item_pad(L * L) + item_pad(L * P); }
inline int64_t ssd_forward_scratch(const SsdDims& d) {
  const int64_t L = d.chunk, P = d.head_dim, N = d.state, BQ = d.batch * d.chunks();
  return BQ * d.groups * ssd_forward_group_scratch(L, P) + d.batch * d.heads * item_pad(P * N) +
         BQ * d.heads * item_pad(L * P);
}

// Scratch elements of the backward: dstates (B,Q,H,P,N), dlast (B,H,Q), per
// (b, q, h) dye (chunk x P), per (b, h) the running gradient (P x N), per
// (b, q, g) an SsdGroupScratch, and the partials pA, pD (B,Q,H); padded and
// aligned as the forward's.
inline int64_t ssd_backward_scratch(const SsdDims& d) {
  const int64_t L = d.chunk, P = d.head_dim, N = d.state, BQ = d.batch * d.chunks(), H = d.heads;
  return item_pad(d.states_size()) + item_pad(BQ * H) + BQ * H * item_pad(L * P) + d.batch * H * item_pad(P * N) +
         BQ * d.groups * ssd_group_scratch_size(L, P, N) + 2 * item_pad(BQ * H);
}

template <class L, class Gemm, class T>
void ssd_chunk_scan_forward_launches(const L& launch, const Gemm& gemm, T* y, T* acs, T* states, const T* x,
                                     int64_t ldx, const T* Bm, const T* Cm, int64_t ldbc, const T* dt,
                                     const T* A_log, const T* D, const SsdDims& d, T* scratch) {
  const int64_t Lmax = d.chunk, P = d.head_dim, N = d.state, H = d.heads, G = d.groups, Q = d.chunks();
  const int64_t BQ = d.batch * Q;
  const int64_t gsz = ssd_forward_group_scratch(Lmax, P), csz = item_pad(P * N), osz = item_pad(Lmax * P);
  T* s_group = scratch;                 // BQ*G items: CB, M, XDT
  T* s_cur = s_group + BQ * G * gsz;    // B*H items: the running state
  T* s_off = s_cur + d.batch * H * csz;  // BQ*H items: off
  launch("ssd_forward chunk_group", BQ * G, [=] EXMY_HD_LAMBDA(int64_t u) {
    T* w = s_group + u * gsz;
    ssd_fwd_chunk_group(gemm, y, acs, states, x, ldx, Bm, Cm, ldbc, dt, A_log, d, u / (Q * G), (u / G) % Q, u % G, w,
                        w + item_pad(Lmax * Lmax), w + 2 * item_pad(Lmax * Lmax));
  });
  launch("ssd_forward pass_states", d.batch * H, [=] EXMY_HD_LAMBDA(int64_t u) {
    ssd_fwd_pass_states(states, acs, d, u / H, u % H, s_cur + u * csz);
  });
  launch("ssd_forward chunk_output", BQ * H, [=] EXMY_HD_LAMBDA(int64_t u) {
    ssd_fwd_chunk_output(gemm, y, x, ldx, Cm, ldbc, D, acs, states, d, u / (Q * H), (u / H) % Q, u % H,
                         s_off + u * osz);
  });
}

template <class L, class Gemm, class T>
void ssd_chunk_scan_backward_launches(const L& launch, const Gemm& gemm, T* dx, T* dB, T* dC, T* ddt, T* dA_log,
                                      T* dD, const T* dy, const T* x, int64_t ldx, const T* Bm, const T* Cm,
                                      int64_t ldbc, const T* dt, const T* A_log, const T* D, const T* acs,
                                      const T* states, const SsdDims& d, T* scratch) {
  const int64_t Lmax = d.chunk, P = d.head_dim, N = d.state, H = d.heads, G = d.groups, Q = d.chunks();
  const int64_t BQ = d.batch * Q, gsz = ssd_group_scratch_size(Lmax, P, N);
  const int64_t ysz = item_pad(Lmax * P), nsz = item_pad(P * N);
  T* dstates = scratch;
  T* dlast = dstates + item_pad(d.states_size());
  T* s_dye = dlast + item_pad(BQ * H);     // BQ*H items: dye
  T* s_next = s_dye + BQ * H * ysz;       // B*H items: the running gradient
  T* s_group = s_next + d.batch * H * nsz;  // BQ*G items: SsdGroupScratch
  T* pA = s_group + BQ * G * gsz;
  T* pD = pA + item_pad(BQ * H);
  launch("ssd_backward dstates_from_outputs", BQ * H, [=] EXMY_HD_LAMBDA(int64_t u) {
    ssd_bwd_dstates_from_outputs(gemm, dstates, dy, Cm, ldbc, acs, d, u / (Q * H), (u / H) % Q, u % H,
                                 s_dye + u * ysz);
  });
  launch("ssd_backward dstates_passing", d.batch * H, [=] EXMY_HD_LAMBDA(int64_t u) {
    ssd_bwd_dstates_passing(dstates, dlast, acs, states, d, u / H, u % H, s_next + u * nsz);
  });
  launch("ssd_backward chunk_group", BQ * G, [=] EXMY_HD_LAMBDA(int64_t u) {
    const int64_t b = u / (Q * G), q = (u / G) % Q;
    // The item's scratch laid out for its own length, as the CPU's.
    const SsdGroupScratch<T> w = ssd_group_scratch(s_group + u * gsz, ssd_chunk_of(d, b, q).len, P, N);
    ssd_bwd_chunk_group(gemm, w, dx, dB, dC, ddt, pA, pD, dy, x, ldx, Bm, Cm, ldbc, dt, A_log, D, acs, states,
                        dstates, dlast, d, b, q, u % G);
  });
  launch("ssd_backward param_sums", H,
         [=] EXMY_HD_LAMBDA(int64_t h) { ssd_bwd_param_sums(dA_log, dD, pA, pD, d, h); });
}

}  // namespace exmy::models

// The launch sequences of the chunked SSD scan, written once over a launcher
// (sim/kernel_launch.hpp), in two families:
//
// - The item launches (ssd_chunk_scan_*_launches): one thread per work item
//   of models/ssd.cpp's loops, in the same pass order, over a GEMM functor
//   (models/item_gemm.hpp). models/ssd_emulated.cpp runs them with HostLaunch
//   and SerialGemm, so they equal the CPU bit for bit: the EMULATED device
//   backend (cuda-emulated) runs these, because the whole-model emulation
//   tests hold it to the CPU's bits. A whole (b, chunk, group) item in one
//   thread is correct, not fast, so no device runs them.
// - The thread launches (ssd_parallel_*_launches): each item's loops split
//   into launches whose threads own one element or one row of the item's
//   small products and elementwise steps (models/ssd_threads.hpp), every sum
//   in NaiveGemm's order, the state passing a thread per (b, head, state
//   element) over the chunks in order. The CUDA backend runs these
//   (models/cuda/ssd.cu, DeviceLaunch). Their operations are those of the
//   item launches with NaiveGemm, so their bits are those kernels' (tested
//   on the host) and they are held to the FP32 budget of
//   tests/models/test_ssd_cuda.cpp, which also runs them with HostLaunch in
//   CI (models/ssd_emulated.cpp).
//
// The kernels are float32 (the training type); tests also run the item
// launches on an error-bound number type. The threads are FP32 CUDA cores,
// each summing its products alone: a tiled version with a thread block per
// item and tensor-core products (cuBLASLt batched GEMMs, or wgmma tiles)
// would be faster still, at the price of another summation order (inside
// the budget, which allows any) and of code a host launch cannot emulate
// thread by thread.
#pragma once

#include <cstdint>

#include "models/ssd_items.hpp"
#include "models/ssd_threads.hpp"
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

// Scratch elements of the thread launches (models/ssd_threads.hpp), every
// array padded by item_pad: the forward CB per (b, q, g) and M per (b, q, h)
// (chunk x chunk) and W (B,H,T); the backward dstates (B,Q,H,P,N), dlast
// (B,H,Q), E and W (B,H,T), CB (then dCB) per (b, q, g), M and dM per (b, q,
// h), dw and dacs (chunk) per (b, q, h) and the partials pA, pD (B,Q,H).
inline int64_t ssd_parallel_forward_scratch(const SsdDims& d) {
  const int64_t BQ = d.batch * d.chunks(), L2 = item_pad(d.chunk * d.chunk);
  return BQ * (d.groups + d.heads) * L2 + item_pad(d.acs_size());
}
inline int64_t ssd_parallel_backward_scratch(const SsdDims& d) {
  const int64_t BQ = d.batch * d.chunks(), H = d.heads, L2 = item_pad(d.chunk * d.chunk);
  return item_pad(d.states_size()) + item_pad(BQ * H) + 2 * item_pad(d.acs_size()) + BQ * d.groups * L2 +
         2 * BQ * H * L2 + 2 * BQ * H * item_pad(d.chunk) + 2 * item_pad(BQ * H);
}

// Threads are numbered with the last index fastest: the (t, s) of an item's
// chunk x chunk array (threads outside the chunk's length, or above the
// diagonal, return at once), the (p, n) of a state, the (t, p) of a row.
template <class L, class T>
void ssd_parallel_forward_launches(const L& launch, T* y, T* acs, T* states, const T* x, int64_t ldx, const T* Bm,
                                   const T* Cm, int64_t ldbc, const T* dt, const T* A_log, const T* D,
                                   const SsdDims& d, T* scratch) {
  const int64_t Lm = d.chunk, P = d.head_dim, N = d.state, H = d.heads, G = d.groups, Q = d.chunks();
  const int64_t BQ = d.batch * Q, L2 = item_pad(Lm * Lm), LL = Lm * Lm, PN = P * N;
  T* CB = scratch;          // BQ*G arrays
  T* M = CB + BQ * G * L2;  // BQ*H arrays
  T* W = M + BQ * H * L2;   // (B,H,T)
  launch("ssd_forward acs", d.batch * H * Q, [=] EXMY_HD_LAMBDA(int64_t u) {
    ssd_thr_acs(acs, W, dt, A_log, d, u / (H * Q), (u / Q) % H, u % Q);
  });
  launch("ssd_forward cb", BQ * G * LL, [=] EXMY_HD_LAMBDA(int64_t u) {
    const int64_t i = u / LL;
    ssd_thr_cb(CB + i * L2, Bm, Cm, ldbc, d, i / (Q * G), (i / G) % Q, i % G, (u / Lm) % Lm, u % Lm);
  });
  launch("ssd_forward m", BQ * H * LL, [=] EXMY_HD_LAMBDA(int64_t u) {
    const int64_t i = u / LL, b = i / (Q * H), q = (i / H) % Q, h = i % H;
    ssd_thr_m_dm(M + i * L2, static_cast<T*>(nullptr), CB + ((b * Q + q) * G + h / (H / G)) * L2,
                 static_cast<const T*>(nullptr), x, ldx, dt, static_cast<const T*>(acs), d, b, q, h, (u / Lm) % Lm,
                 u % Lm);
  });
  launch("ssd_forward own_state", BQ * H * PN, [=] EXMY_HD_LAMBDA(int64_t u) {
    const int64_t i = u / PN;
    ssd_thr_own_state(states, x, ldx, Bm, ldbc, dt, static_cast<const T*>(W), d, i / (Q * H), (i / H) % Q, i % H,
                      (u / N) % P, u % N);
  });
  launch("ssd_forward pass_states", d.batch * H * PN, [=] EXMY_HD_LAMBDA(int64_t u) {
    ssd_thr_pass_states(states, static_cast<const T*>(acs), d, u / (H * PN), (u / PN) % H, u % PN);
  });
  launch("ssd_forward output", BQ * H * Lm * P, [=] EXMY_HD_LAMBDA(int64_t u) {
    const int64_t i = u / (Lm * P);
    ssd_thr_output(y, static_cast<const T*>(M + i * L2), x, ldx, Cm, ldbc, dt, D, static_cast<const T*>(acs),
                   static_cast<const T*>(states), d, i / (Q * H), (i / H) % Q, i % H, (u / P) % Lm, u % P);
  });
}

template <class L, class T>
void ssd_parallel_backward_launches(const L& launch, T* dx, T* dB, T* dC, T* ddt, T* dA_log, T* dD, const T* dy,
                                    const T* x, int64_t ldx, const T* Bm, const T* Cm, int64_t ldbc, const T* dt,
                                    const T* A_log, const T* D, const T* acs, const T* states, const SsdDims& d,
                                    T* scratch) {
  const int64_t Lm = d.chunk, P = d.head_dim, N = d.state, H = d.heads, G = d.groups, Q = d.chunks();
  const int64_t BQ = d.batch * Q, L2 = item_pad(Lm * Lm), LL = Lm * Lm, PN = P * N, L1 = item_pad(Lm);
  const int64_t hpg = H / G, T_ = d.seqlen;
  T* dstates = scratch;
  T* dlast = dstates + item_pad(d.states_size());
  T* E = dlast + item_pad(BQ * H);
  T* W = E + item_pad(d.acs_size());
  T* CB = W + item_pad(d.acs_size());  // BQ*G arrays, then dCB
  T* M = CB + BQ * G * L2;              // BQ*H arrays
  T* dM = M + BQ * H * L2;              // BQ*H arrays
  T* dw = dM + BQ * H * L2;             // BQ*H arrays of chunk
  T* dacs = dw + BQ * H * L1;           // BQ*H arrays of chunk
  T* pA = dacs + BQ * H * L1;
  T* pD = pA + item_pad(BQ * H);
  launch("ssd_backward exp_acs", d.batch * H * T_, [=] EXMY_HD_LAMBDA(int64_t u) {
    ssd_thr_exp_acs(E, W, acs, d, u / (H * T_), (u / T_) % H, u % T_);
  });
  launch("ssd_backward dstates", BQ * H * PN, [=] EXMY_HD_LAMBDA(int64_t u) {
    const int64_t i = u / PN;
    ssd_thr_dstates(dstates, dy, Cm, ldbc, static_cast<const T*>(E), d, i / (Q * H), (i / H) % Q, i % H,
                    (u / N) % P, u % N);
  });
  launch("ssd_backward pass_dstates", d.batch * H * PN, [=] EXMY_HD_LAMBDA(int64_t u) {
    ssd_thr_pass_dstates(dstates, acs, d, u / (H * PN), (u / PN) % H, u % PN);
  });
  launch("ssd_backward dlast", d.batch * H * Q, [=] EXMY_HD_LAMBDA(int64_t u) {
    ssd_thr_dlast(dlast, static_cast<const T*>(dstates), acs, states, d, u / (H * Q), (u / Q) % H, u % Q);
  });
  launch("ssd_backward cb", BQ * G * LL, [=] EXMY_HD_LAMBDA(int64_t u) {
    const int64_t i = u / LL;
    ssd_thr_cb(CB + i * L2, Bm, Cm, ldbc, d, i / (Q * G), (i / G) % Q, i % G, (u / Lm) % Lm, u % Lm);
  });
  launch("ssd_backward m_dm", BQ * H * LL, [=] EXMY_HD_LAMBDA(int64_t u) {
    const int64_t i = u / LL, b = i / (Q * H), q = (i / H) % Q, h = i % H;
    ssd_thr_m_dm(M + i * L2, dM + i * L2, static_cast<const T*>(CB + ((b * Q + q) * G + h / hpg) * L2), dy, x, ldx,
                 dt, acs, d, b, q, h, (u / Lm) % Lm, u % Lm);
  });
  launch("ssd_backward dx_row", BQ * H * Lm, [=] EXMY_HD_LAMBDA(int64_t u) {
    const int64_t i = u / Lm;
    ssd_thr_dx_row(dx, ddt, dw + i * L1, static_cast<const T*>(M + i * L2), dy, x, ldx, Bm, ldbc, dt, D,
                   static_cast<const T*>(W), static_cast<const T*>(dstates), d, i / (Q * H), (i / H) % Q, i % H,
                   u % Lm);
  });
  launch("ssd_backward dacs", BQ * H * Lm, [=] EXMY_HD_LAMBDA(int64_t u) {
    const int64_t i = u / Lm;
    ssd_thr_dacs(dacs + i * L1, static_cast<const T*>(M + i * L2), static_cast<const T*>(dM + i * L2),
                 static_cast<const T*>(dw + i * L1), dy, Cm, ldbc, static_cast<const T*>(E), static_cast<const T*>(W),
                 states, static_cast<const T*>(dlast), d, i / (Q * H), (i / H) % Q, i % H, u % Lm);
  });
  launch("ssd_backward dacs_scan", BQ * H, [=] EXMY_HD_LAMBDA(int64_t i) {
    ssd_thr_dacs_scan(ddt, pA, pD, static_cast<const T*>(dacs + i * L1), dy, x, ldx, dt, A_log, d, i / (Q * H),
                      (i / H) % Q, i % H);
  });
  launch("ssd_backward dcb", BQ * G * LL, [=] EXMY_HD_LAMBDA(int64_t u) {
    const int64_t i = u / LL, b = i / (Q * G), q = (i / G) % Q, g = i % G;
    ssd_thr_dcb(CB + i * L2, static_cast<const T*>(dM + ((b * Q + q) * H + g * hpg) * L2), L2, acs, d, b, q, g,
                (u / Lm) % Lm, u % Lm);
  });
  launch("ssd_backward dc", BQ * G * Lm * N, [=] EXMY_HD_LAMBDA(int64_t u) {
    const int64_t i = u / (Lm * N);
    ssd_thr_dc(dC, static_cast<const T*>(CB + i * L2), dy, Bm, ldbc, static_cast<const T*>(E), states, d,
               i / (Q * G), (i / G) % Q, i % G, (u / N) % Lm, u % N);
  });
  launch("ssd_backward db", BQ * G * Lm * N, [=] EXMY_HD_LAMBDA(int64_t u) {
    const int64_t i = u / (Lm * N);
    ssd_thr_db(dB, static_cast<const T*>(CB + i * L2), x, ldx, Cm, ldbc, dt, static_cast<const T*>(W),
               static_cast<const T*>(dstates), d, i / (Q * G), (i / G) % Q, i % G, (u / N) % Lm, u % N);
  });
  launch("ssd_backward param_sums", H, [=] EXMY_HD_LAMBDA(int64_t h) {
    ssd_bwd_param_sums(dA_log, dD, static_cast<const T*>(pA), static_cast<const T*>(pD), d, h);
  });
}

}  // namespace exmy::models

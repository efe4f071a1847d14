// Causal GQA attention's kernels (models/cuda/attention_cuda.hpp) against
// the CPU attention (models/attention.hpp), forward and backward.
//
// Built twice, as test_ssd_cuda.cpp:
// - test_attention_cuda_emulated (label "unit"): the launches with their
//   threads run on the host; they must equal the CPU bit for bit (the same
//   item functions, the same Eigen products, the host's exp and log);
// - test_attention_cuda (label "gpu", only with CUDA): the real kernels;
//   every test reports SKIPPED without a CUDA device.
//
// The device's FP32 budget. On a device the products QK^T, PV, P^T dO, dO
// V^T, dS K and dS^T Q are summed in k order without fused multiply-adds
// (NaiveGemm), not in Eigen's blocked order; exp is CUDA's expf (within 2
// ulp) rather than glibc's (within 1), and log CUDA's logf rather than
// glibc's (each within 1 ulp); division and sqrt are correctly rounded on
// both sides. Where two scores of a row are within their rounding of each
// other the device may take the other one as the row's max: the softmax
// does not depend on that choice, only its roundings do. Each output element
// is bounded by running the same item functions on test::RunErr
// (tests/models/run_error.hpp): a first-order bound u E (u = 2^-24) on the
// error of an FP32 evaluation of the blocked attention in any summation
// order, exp and log included, with the scores' errors carried through exp
// (which multiplies them by the probability) and the max's error bounded by
// the largest of its row's. Through the softmax that bound ignores the
// cancellation of the max (it shifts every score of the row alike), so it
// is loose there, never short. The comparisons (tests/models/budget_test.hpp):
// the emulation bit for bit and the CPU within 2 u E of the exact value;
// the device within 4 u E + 2^-126 of the CPU.
#include "tests/models/budget_test.hpp"  // first: hd_exp(RunErr) before models/attention_items.hpp

#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "models/attention.hpp"
#include "models/cuda/attention_cuda.hpp"

namespace exmy::models {
namespace {

// Sequences shorter than a query block (64), one block exactly, and more
// blocks with a short last one; GQA with 1, 2 and 4 query heads per kv head;
// batch 1 and > 1; head_dim from 8 to 64.
const AttnDims kShapes[] = {
    {.batch = 2, .seqlen = 70, .q_heads = 4, .kv_heads = 2, .head_dim = 8},
    {.batch = 1, .seqlen = 64, .q_heads = 4, .kv_heads = 1, .head_dim = 16},
    {.batch = 3, .seqlen = 20, .q_heads = 3, .kv_heads = 3, .head_dim = 32},
    {.batch = 1, .seqlen = 130, .q_heads = 2, .kv_heads = 1, .head_dim = 64},
    {.batch = 2, .seqlen = 5, .q_heads = 8, .kv_heads = 2, .head_dim = 24},
};

std::string name_of(const AttnDims& d) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "B%lld S%lld Hq%lld Hkv%lld Dh%lld", static_cast<long long>(d.batch),
                static_cast<long long>(d.seqlen), static_cast<long long>(d.q_heads),
                static_cast<long long>(d.kv_heads), static_cast<long long>(d.head_dim));
  return buf;
}

// q (B,S,Hq*Dh), k and v (B,S,Hkv*Dh), and an output gradient like q.
struct Inputs {
  AttnDims d;
  AVec q, k, v, dout;
  Inputs(const AttnDims& dims, uint64_t seed) : d(dims) {
    const auto tokens = static_cast<size_t>(d.batch * d.seqlen);
    q = aligned(randn(tokens * static_cast<size_t>(d.q_heads * d.head_dim), seed, 1.5f));
    k = aligned(randn(tokens * static_cast<size_t>(d.kv_heads * d.head_dim), seed + 1));
    v = aligned(randn(k.size(), seed + 2));
    dout = aligned(randn(q.size(), seed + 3));
  }
  size_t lse_size() const { return static_cast<size_t>(d.batch * d.q_heads * d.seqlen); }
};

// The CPU's forward: the output and the saved log-sum-exp.
struct CpuForward {
  AVec out, lse;
};
CpuForward cpu_forward(const Inputs& in) {
  CpuForward f{AVec(in.q.size()), AVec(in.lse_size())};
  attention_forward(f.out.data(), f.lse.data(), in.q.data(), in.k.data(), in.v.data(), in.d);
  return f;
}

TEST(AttentionKernels, ForwardEqualsCpu) {
  EXMY_REQUIRE_CUDA();
  uint64_t seed = 40;
  for (const AttnDims& d : kShapes) {
    const Inputs in(d, seed += 10);
    const std::string what = "attention forward " + name_of(d);
    const CpuForward f = cpu_forward(in);

    Buffer kq(in.q), kk(in.k), kv(in.v), kout(Vec(f.out.size(), -1.0f)), klse(Vec(f.lse.size(), -1.0f)),
        scratch(Vec(static_cast<size_t>(attention_forward_scratch(d)), 0.0f));
    KERNEL(attention_forward)(kout.ptr(), klse.ptr(), kq.ptr(), kk.ptr(), kv.ptr(), d, scratch.ptr());

    const Bound rq = to<RunErr>(in.q), rk = to<RunErr>(in.k), rv = to<RunErr>(in.v);
    Bound rout(f.out.size()), rlse(f.lse.size()), rscratch(static_cast<size_t>(attention_forward_scratch(d)));
    attention_forward_launches(sim::HostLaunch{}, test::RunErrGemm{}, rout.data(), rlse.data(), rq.data(), rk.data(),
                               rv.data(), d, rscratch.data());
    compare(kout.get(), plain(f.out), rout, what + " out");
    compare(klse.get(), plain(f.lse), rlse, what + " lse");
  }
}

TEST(AttentionKernels, BackwardEqualsCpuAndAccumulates) {
  EXMY_REQUIRE_CUDA();
  uint64_t seed = 900;
  for (const AttnDims& d : kShapes) {
    const Inputs in(d, seed += 10);
    const std::string what = "attention backward " + name_of(d);
    const CpuForward f = cpu_forward(in);
    // The gradients accumulate (+=) into what is there.
    AVec dq = aligned(randn(in.q.size(), seed + 4, 0.1f)), dk = aligned(randn(in.k.size(), seed + 5, 0.1f)),
         dv = aligned(randn(in.v.size(), seed + 6, 0.1f));
    const AVec dq0 = dq, dk0 = dk, dv0 = dv;
    attention_backward(dq.data(), dk.data(), dv.data(), in.dout.data(), f.out.data(), f.lse.data(), in.q.data(),
                       in.k.data(), in.v.data(), d);

    // The kernel's backward from the CPU's saved output and log-sum-exp, so
    // that only the backward is compared.
    Buffer kq(in.q), kk(in.k), kv(in.v), kdout(in.dout), kout(f.out), klse(f.lse), kdq(dq0), kdk(dk0), kdv(dv0),
        scratch(Vec(static_cast<size_t>(attention_backward_scratch(d)), 0.0f));
    KERNEL(attention_backward)(kdq.ptr(), kdk.ptr(), kdv.ptr(), kdout.ptr(), kout.ptr(), klse.ptr(), kq.ptr(),
                               kk.ptr(), kv.ptr(), d, scratch.ptr());

    const Bound rq = to<RunErr>(in.q), rk = to<RunErr>(in.k), rv = to<RunErr>(in.v), rdout = to<RunErr>(in.dout),
                rout = to<RunErr>(f.out), rlse = to<RunErr>(f.lse);
    Bound rdq = to<RunErr>(dq0), rdk = to<RunErr>(dk0), rdv = to<RunErr>(dv0),
          rscratch(static_cast<size_t>(attention_backward_scratch(d)));
    attention_backward_launches(sim::HostLaunch{}, test::RunErrGemm{}, rdq.data(), rdk.data(), rdv.data(),
                                rdout.data(), rout.data(), rlse.data(), rq.data(), rk.data(), rv.data(), d,
                                rscratch.data());
    compare(kdq.get(), plain(dq), rdq, what + " dq");
    compare(kdk.get(), plain(dk), rdk, what + " dk");
    compare(kdv.get(), plain(dv), rdv, what + " dv");
  }
}

}  // namespace
}  // namespace exmy::models

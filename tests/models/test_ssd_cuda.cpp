// The chunked SSD scan's kernels (models/cuda/ssd_cuda.hpp) against the CPU
// scan (models/ssd.hpp), forward and backward.
//
// Built twice, as test_layers_cuda.cpp:
// - test_ssd_cuda_emulated (label "unit"): the launches with their threads
//   run on the host; they must equal the CPU bit for bit (the same item
//   functions, the same Eigen products, the host's exp);
// - test_ssd_cuda (label "gpu", only with CUDA): the real kernels; every
//   test reports SKIPPED without a CUDA device.
//
// The device's FP32 budget. On a device the products inside an item are
// summed in k order without fused multiply-adds (NaiveGemm), not in Eigen's
// blocked order, and exp is CUDA's expf (within 2 ulp) rather than glibc's
// (within 1), so the device does not reproduce the CPU's bits. Each output
// element is instead bounded by running the same item functions on
// test::RunErr (tests/models/run_error.hpp): a first-order bound u E (u =
// 2^-24) on the error of an FP32 evaluation of the chunked algorithm in any
// summation order, the exp errors included, with every exp-amplified error
// of its argument (acs = cumsum(dt A) feeds exp(acs_t - acs_s)) carried
// through. The CPU and the device are each within u E of the exact result,
// so |device - CPU| <= 2 u E; tested with 4 u E (twice, for the terms beyond
// first order and E's own double evaluation) plus 2^-126 absolute (the
// subnormal range). The emulated build checks the bound's premise on the
// CPU: |CPU - exact| <= 2 u E for every element, so a bound that fails to
// cover the CPU's own error fails in CI (the comparisons:
// tests/models/budget_test.hpp).
#include "tests/models/budget_test.hpp"  // first: hd_exp(RunErr) before models/ssd_items.hpp

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "models/cuda/ssd_cuda.hpp"
#include "models/ssd.hpp"
#include "sim/tensor.hpp"

namespace exmy::models {
namespace {

struct Shape {
  int64_t batch, seqlen, heads, head_dim, groups, state, chunk;
};
// Chunks that do and do not divide the sequence, one chunk longer than the
// sequence, chunk 1, one group for all heads, a group per head, batch 1 and > 1.
const Shape kShapes[] = {
    {2, 37, 4, 8, 2, 16, 8}, {1, 32, 2, 4, 1, 8, 16}, {3, 20, 6, 3, 3, 5, 64},
    {2, 13, 4, 5, 4, 3, 1},  {2, 50, 8, 16, 2, 32, 16},
};

std::string name_of(const Shape& s) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "B%lld T%lld H%lld P%lld G%lld N%lld L%lld", static_cast<long long>(s.batch),
                static_cast<long long>(s.seqlen), static_cast<long long>(s.heads), static_cast<long long>(s.head_dim),
                static_cast<long long>(s.groups), static_cast<long long>(s.state), static_cast<long long>(s.chunk));
  return buf;
}

Vec uniform(size_t n, uint64_t seed, float lo, float hi) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> ud(lo, hi);
  Vec v(n);
  for (auto& x : v) x = ud(rng);
  return v;
}

// The scan's inputs as the mixer passes them: x, B and C in the rows of one
// xBC buffer [x (H*P) | B (G*N) | C (G*N) | pad], dt post-softplus.
struct Inputs {
  SsdDims d;
  int64_t ld, xdim, gn;
  AVec xbc, dt, A_log, D, dy;
  explicit Inputs(const Shape& s, uint64_t seed) {
    d.batch = s.batch, d.seqlen = s.seqlen, d.heads = s.heads, d.head_dim = s.head_dim, d.groups = s.groups;
    d.state = s.state, d.chunk = s.chunk;
    xdim = s.heads * s.head_dim, gn = s.groups * s.state, ld = xdim + 2 * gn + 3;
    const auto rows = static_cast<size_t>(s.batch * s.seqlen);
    xbc = aligned(randn(rows * static_cast<size_t>(ld), seed));
    dt = aligned(uniform(rows * static_cast<size_t>(s.heads), seed + 1, 0.05f, 0.6f));
    A_log = aligned(uniform(static_cast<size_t>(s.heads), seed + 2, -1.0f, 1.0f));
    D = aligned(randn(static_cast<size_t>(s.heads), seed + 3));
    dy = aligned(randn(rows * static_cast<size_t>(xdim), seed + 4));
  }
  size_t ysize() const { return static_cast<size_t>(d.batch * d.seqlen * xdim); }
};

// The CPU's chunked forward and what it saves.
struct CpuForward {
  AVec y, acs, st;
};
CpuForward cpu_forward(const Inputs& in) {
  const SsdDims& d = in.d;
  const float *x = in.xbc.data(), *Bm = x + in.xdim, *Cm = Bm + in.gn;
  CpuForward f{AVec(in.ysize()), AVec(static_cast<size_t>(d.acs_size())), AVec(static_cast<size_t>(d.states_size()))};
  ssd_chunk_scan_forward(f.y.data(), f.acs.data(), f.st.data(), x, in.ld, Bm, Cm, in.ld, in.dt.data(), in.A_log.data(),
                         in.D.data(), d);
  return f;
}

TEST(SsdKernels, ForwardEqualsCpu) {
  EXMY_REQUIRE_CUDA();
  uint64_t seed = 10;
  for (const Shape& s : kShapes) {
    const Inputs in(s, seed += 10);
    const SsdDims& d = in.d;
    const std::string what = "ssd forward " + name_of(s);
    const CpuForward f = cpu_forward(in);
    const AVec &y = f.y, &acs = f.acs, &st = f.st;

    Buffer kxbc(in.xbc), kdt(in.dt), kA(in.A_log), kD(in.D), ky(Vec(y.size(), -1.0f)), kacs(Vec(acs.size(), -1.0f)),
        kst(Vec(st.size(), -1.0f)), scratch(Vec(static_cast<size_t>(ssd_forward_scratch(d)), 0.0f));
    float* kx = kxbc.ptr();
    KERNEL(ssd_chunk_scan_forward)(ky.ptr(), kacs.ptr(), kst.ptr(), kx, in.ld, kx + in.xdim, kx + in.xdim + in.gn,
                                   in.ld, kdt.ptr(), kA.ptr(), kD.ptr(), d, scratch.ptr());

    const Bound rxbc = to<RunErr>(in.xbc), rdt = to<RunErr>(in.dt), rA = to<RunErr>(in.A_log), rD = to<RunErr>(in.D);
    Bound ry(y.size()), racs(acs.size()), rst(st.size()), rscratch(static_cast<size_t>(ssd_forward_scratch(d)));
    const RunErr* rx = rxbc.data();
    ssd_chunk_scan_forward_launches(sim::HostLaunch{}, test::RunErrGemm{}, ry.data(), racs.data(), rst.data(), rx,
                                    in.ld, rx + in.xdim, rx + in.xdim + in.gn, in.ld, rdt.data(), rA.data(),
                                    rD.data(), d, rscratch.data());
    compare(ky.get(), plain(y), ry, what + " y");
    compare(kacs.get(), plain(acs), racs, what + " acs");
    compare(kst.get(), plain(st), rst, what + " states");
  }
}

TEST(SsdKernels, BackwardEqualsCpuAndAccumulates) {
  EXMY_REQUIRE_CUDA();
  uint64_t seed = 500;
  for (const Shape& s : kShapes) {
    const Inputs in(s, seed += 10);
    const SsdDims& d = in.d;
    const std::string what = "ssd backward " + name_of(s);
    const float *x = in.xbc.data(), *Bm = x + in.xdim, *Cm = Bm + in.gn;
    const CpuForward f = cpu_forward(in);
    const AVec &acs = f.acs, &st = f.st;
    // The gradients accumulate (+=) into what is there; the pad columns of
    // dxBC stay as they are.
    AVec dxbc = aligned(randn(in.xbc.size(), seed + 1, 0.1f)), ddt = aligned(randn(in.dt.size(), seed + 2, 0.1f)),
         dA = aligned(randn(in.A_log.size(), seed + 3, 0.1f)), dD = aligned(randn(in.D.size(), seed + 4, 0.1f));
    const AVec dxbc0 = dxbc, ddt0 = ddt, dA0 = dA, dD0 = dD;
    ssd_chunk_scan_backward(dxbc.data(), dxbc.data() + in.xdim, dxbc.data() + in.xdim + in.gn, ddt.data(), dA.data(),
                            dD.data(), in.dy.data(), x, in.ld, Bm, Cm, in.ld, in.dt.data(), in.A_log.data(),
                            in.D.data(), acs.data(), st.data(), d);

    // The kernel's backward from the CPU's saved acs and states, so that only
    // the backward is compared.
    Buffer kxbc(in.xbc), kdt(in.dt), kA(in.A_log), kD(in.D), kdy(in.dy), kacs(acs), kst(st), kdxbc(dxbc0),
        kddt(ddt0), kdA(dA0), kdD(dD0), scratch(Vec(static_cast<size_t>(ssd_backward_scratch(d)), 0.0f));
    float *kx = kxbc.ptr(), *kdx = kdxbc.ptr();
    KERNEL(ssd_chunk_scan_backward)(kdx, kdx + in.xdim, kdx + in.xdim + in.gn, kddt.ptr(), kdA.ptr(), kdD.ptr(),
                                    kdy.ptr(), kx, in.ld, kx + in.xdim, kx + in.xdim + in.gn, in.ld, kdt.ptr(),
                                    kA.ptr(), kD.ptr(), kacs.ptr(), kst.ptr(), d, scratch.ptr());

    const Bound rxbc = to<RunErr>(in.xbc), rdt = to<RunErr>(in.dt), rA = to<RunErr>(in.A_log), rD = to<RunErr>(in.D),
                rdy = to<RunErr>(in.dy), racs = to<RunErr>(acs), rst = to<RunErr>(st);
    Bound rdxbc = to<RunErr>(dxbc0), rddt = to<RunErr>(ddt0), rdA = to<RunErr>(dA0), rdD = to<RunErr>(dD0),
          rscratch(static_cast<size_t>(ssd_backward_scratch(d)));
    const RunErr* rx = rxbc.data();
    RunErr* rdx = rdxbc.data();
    ssd_chunk_scan_backward_launches(sim::HostLaunch{}, test::RunErrGemm{}, rdx, rdx + in.xdim, rdx + in.xdim + in.gn,
                                     rddt.data(), rdA.data(), rdD.data(), rdy.data(), rx, in.ld, rx + in.xdim,
                                     rx + in.xdim + in.gn, in.ld, rdt.data(), rA.data(), rD.data(), racs.data(),
                                     rst.data(), d, rscratch.data());
    compare(kdxbc.get(), plain(dxbc), rdxbc, what + " dxBC");
    compare(kddt.get(), plain(ddt), rddt, what + " ddt");
    compare(kdA.get(), plain(dA), rdA, what + " dA_log");
    compare(kdD.get(), plain(dD), rdD, what + " dD");
  }
}

}  // namespace
}  // namespace exmy::models

// The chunked SSD scan's kernels (models/cuda/ssd_cuda.hpp) against the CPU
// scan (models/ssd.hpp), forward and backward, in three families: the item
// kernels (models/ssd_launches.hpp), which the emulated device backend
// runs, and the block launches (models/ssd_blocks.hpp) and thread kernels
// (models/ssd_launches.hpp), which the CUDA backend runs (the block
// launches unless EXMY_CUDA_SSD=threads).
//
// Built twice, as test_layers_cuda.cpp:
// - test_ssd_cuda_emulated (label "unit"): the launches with their threads
//   run on the host. The item kernels must equal the CPU bit for bit (the
//   same item functions, the same Eigen products, the host's exp); the
//   thread kernels, and the block launches with LoopGemm<NaiveGemm>, must
//   equal the item kernels run with NaiveGemm bit for bit (the same
//   operations in the same order); the thread kernels lie within the
//   device's budget below of the CPU, and the block launches with the CPU's
//   products (LoopGemm<SerialGemm>) equal the CPU bit for bit;
// - test_ssd_cuda (label "gpu", only with CUDA): the thread kernels and the
//   block launches on the device, within the budget, the same bits when run
//   twice; every test reports SKIPPED without a CUDA device.
//
// The device's FP32 budget. On a device the products inside an item are
// summed in k order without fused multiply-adds (NaiveGemm's order, which
// the thread kernels keep), not in Eigen's blocked order, and exp is CUDA's
// expf (within 2 ulp) rather than glibc's (within 1), so the device does not
// reproduce the CPU's bits. Each output element is instead bounded by
// running the item functions on test::RunErr (tests/models/run_error.hpp):
// a first-order bound u E (u = 2^-24) on the error of an FP32 evaluation of
// the chunked algorithm in any summation order, the exp errors included,
// with every exp-amplified error of its argument (acs = cumsum(dt A) feeds
// exp(acs_t - acs_s)) carried through. The CPU and the device are each
// within u E of the exact result, so |device - CPU| <= 2 u E; tested with
// 4 u E (twice, for the terms beyond first order and E's own double
// evaluation) plus 2^-126 absolute (the subnormal range). The emulated
// build checks the bound's premise on the CPU: |CPU - exact| <= 2 u E for
// every element, so a bound that fails to cover the CPU's own error fails
// in CI (the comparisons: tests/models/budget_test.hpp).
#include "tests/models/budget_test.hpp"  // first: hd_exp(RunErr) before models/ssd_items.hpp

#include <gtest/gtest.h>

#include <algorithm>
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
// sequence, chunk 1, one group for all heads, a group per head, several
// groups of several heads, batch 1 and > 1.
const Shape kShapes[] = {
    {2, 37, 4, 8, 2, 16, 8}, {1, 32, 2, 4, 1, 8, 16},  {3, 20, 6, 3, 3, 5, 64},
    {2, 13, 4, 5, 4, 3, 1},  {2, 50, 8, 16, 2, 32, 16}, {3, 45, 6, 4, 2, 8, 16},
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

// One shape's inputs, the CPU's forward and backward, and the item
// kernels' error bounds (RunErr, test::RunErrGemm).
struct Case {
  Inputs in;
  CpuForward f;
  AVec dxbc0, ddt0, dA0, dD0;  // the gradients before the backward
  AVec dxbc, ddt, dA, dD;      // the CPU's, after
  Bound ry, racs, rst;         // the forward's bounds
  Bound rdxbc, rddt, rdA, rdD;  // the backward's
  std::string name;
};

Case make_case(const Shape& s, uint64_t seed) {
  Case c{Inputs(s, seed), {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, name_of(s)};
  const Inputs& in = c.in;
  const SsdDims& d = in.d;
  c.f = cpu_forward(in);
  const float *x = in.xbc.data(), *Bm = x + in.xdim, *Cm = Bm + in.gn;
  // The gradients accumulate (+=) into what is there; the pad columns of
  // dxBC stay as they are.
  c.dxbc0 = aligned(randn(in.xbc.size(), seed + 1, 0.1f)), c.ddt0 = aligned(randn(in.dt.size(), seed + 2, 0.1f));
  c.dA0 = aligned(randn(in.A_log.size(), seed + 3, 0.1f)), c.dD0 = aligned(randn(in.D.size(), seed + 4, 0.1f));
  c.dxbc = c.dxbc0, c.ddt = c.ddt0, c.dA = c.dA0, c.dD = c.dD0;
  ssd_chunk_scan_backward(c.dxbc.data(), c.dxbc.data() + in.xdim, c.dxbc.data() + in.xdim + in.gn, c.ddt.data(),
                          c.dA.data(), c.dD.data(), in.dy.data(), x, in.ld, Bm, Cm, in.ld, in.dt.data(),
                          in.A_log.data(), in.D.data(), c.f.acs.data(), c.f.st.data(), d);

  const Bound rxbc = to<RunErr>(in.xbc), rdt = to<RunErr>(in.dt), rA = to<RunErr>(in.A_log), rD = to<RunErr>(in.D);
  const RunErr* rx = rxbc.data();
  c.ry.resize(c.f.y.size()), c.racs.resize(c.f.acs.size()), c.rst.resize(c.f.st.size());
  Bound rscratch(static_cast<size_t>(ssd_forward_scratch(d)));
  ssd_chunk_scan_forward_launches(sim::HostLaunch{}, test::RunErrGemm{}, c.ry.data(), c.racs.data(), c.rst.data(), rx,
                                  in.ld, rx + in.xdim, rx + in.xdim + in.gn, in.ld, rdt.data(), rA.data(), rD.data(),
                                  d, rscratch.data());
  // The backward's bound from the CPU's saved acs and states, as the kernels
  // run from them.
  const Bound rdy = to<RunErr>(in.dy), racs = to<RunErr>(c.f.acs), rst = to<RunErr>(c.f.st);
  c.rdxbc = to<RunErr>(c.dxbc0), c.rddt = to<RunErr>(c.ddt0), c.rdA = to<RunErr>(c.dA0), c.rdD = to<RunErr>(c.dD0);
  Bound rbscratch(static_cast<size_t>(ssd_backward_scratch(d)));
  RunErr* rdx = c.rdxbc.data();
  ssd_chunk_scan_backward_launches(sim::HostLaunch{}, test::RunErrGemm{}, rdx, rdx + in.xdim, rdx + in.xdim + in.gn,
                                   c.rddt.data(), c.rdA.data(), c.rdD.data(), rdy.data(), rx, in.ld, rx + in.xdim,
                                   rx + in.xdim + in.gn, in.ld, rdt.data(), rA.data(), rD.data(), racs.data(),
                                   rst.data(), d, rbscratch.data());
  return c;
}

const std::vector<Case>& cases() {
  static const std::vector<Case> all = [] {
    std::vector<Case> v;
    uint64_t seed = 10;
    for (const Shape& s : kShapes) v.push_back(make_case(s, seed += 10));
    return v;
  }();
  return all;
}

// What a forward or backward kernel wrote.
struct Forward {
  Vec y, acs, st;
};
struct Backward {
  Vec dxbc, ddt, dA, dD;
};

// A forward run of fwd(y, acs, states, x, ldx, Bm, Cm, ldbc, dt, A_log, D,
// d, scratch) on buffers: outputs poisoned with -1, the scratch with NaN (a
// read of an unwritten element shows).
template <class F>
Forward run_forward(F fwd, const Case& c, int64_t scratch_size) {
  const Inputs& in = c.in;
  Buffer kxbc(in.xbc), kdt(in.dt), kA(in.A_log), kD(in.D), ky(Vec(c.f.y.size(), -1.0f)),
      kacs(Vec(c.f.acs.size(), -1.0f)), kst(Vec(c.f.st.size(), -1.0f)),
      scratch(Vec(static_cast<size_t>(scratch_size), std::nanf("")));
  float* kx = kxbc.ptr();
  fwd(ky.ptr(), kacs.ptr(), kst.ptr(), kx, in.ld, kx + in.xdim, kx + in.xdim + in.gn, in.ld, kdt.ptr(), kA.ptr(),
      kD.ptr(), in.d, scratch.ptr());
  return {ky.get(), kacs.get(), kst.get()};
}

// A backward run from the CPU's saved acs and states (so that only the
// backward is compared), onto the gradients before the CPU's backward.
template <class F>
Backward run_backward(F bwd, const Case& c, int64_t scratch_size) {
  const Inputs& in = c.in;
  Buffer kxbc(in.xbc), kdt(in.dt), kA(in.A_log), kD(in.D), kdy(in.dy), kacs(c.f.acs), kst(c.f.st), kdxbc(c.dxbc0),
      kddt(c.ddt0), kdA(c.dA0), kdD(c.dD0), scratch(Vec(static_cast<size_t>(scratch_size), std::nanf("")));
  float *kx = kxbc.ptr(), *kdx = kdxbc.ptr();
  bwd(kdx, kdx + in.xdim, kdx + in.xdim + in.gn, kddt.ptr(), kdA.ptr(), kdD.ptr(), kdy.ptr(), kx, in.ld,
      kx + in.xdim, kx + in.xdim + in.gn, in.ld, kdt.ptr(), kA.ptr(), kD.ptr(), kacs.ptr(), kst.ptr(), in.d,
      scratch.ptr());
  return {kdxbc.get(), kddt.get(), kdA.get(), kdD.get()};
}

void expect_same(const Forward& a, const Forward& b, const std::string& what) {
  expect_bits(a.y, b.y, what + " y");
  expect_bits(a.acs, b.acs, what + " acs");
  expect_bits(a.st, b.st, what + " states");
}
void expect_same(const Backward& a, const Backward& b, const std::string& what) {
  expect_bits(a.dxbc, b.dxbc, what + " dxBC");
  expect_bits(a.ddt, b.ddt, what + " ddt");
  expect_bits(a.dA, b.dA, what + " dA_log");
  expect_bits(a.dD, b.dD, what + " dD");
}

#if defined(EXMY_TEST_EMULATED)
// The item kernels (the emulated backend's) equal the CPU bit for bit; the
// CPU is within its bound of the exact value.
TEST(SsdItemKernels, ForwardEqualsCpu) {
  for (const Case& c : cases()) {
    const Forward k = run_forward(ssd_chunk_scan_forward_emulated, c, ssd_forward_scratch(c.in.d));
    const std::string what = "ssd forward items " + c.name;
    compare(k.y, plain(c.f.y), c.ry, what + " y");
    compare(k.acs, plain(c.f.acs), c.racs, what + " acs");
    compare(k.st, plain(c.f.st), c.rst, what + " states");
  }
}

TEST(SsdItemKernels, BackwardEqualsCpuAndAccumulates) {
  for (const Case& c : cases()) {
    const Backward k = run_backward(ssd_chunk_scan_backward_emulated, c, ssd_backward_scratch(c.in.d));
    const std::string what = "ssd backward items " + c.name;
    compare(k.dxbc, plain(c.dxbc), c.rdxbc, what + " dxBC");
    compare(k.ddt, plain(c.ddt), c.rddt, what + " ddt");
    compare(k.dA, plain(c.dA), c.rdA, what + " dA_log");
    compare(k.dD, plain(c.dD), c.rdD, what + " dD");
  }
}

// The thread kernels do the item kernels' operations with NaiveGemm (the
// one-thread-per-item device kernels of before) in the same order: the
// same bits, so the budget that held those on a device holds these.
TEST(SsdThreadKernels, EqualTheItemKernelsWithNaiveGemm) {
  const auto naive_fwd = [](auto... a) { ssd_chunk_scan_forward_launches(sim::HostLaunch{}, NaiveGemm{}, a...); };
  const auto naive_bwd = [](auto... a) { ssd_chunk_scan_backward_launches(sim::HostLaunch{}, NaiveGemm{}, a...); };
  for (const Case& c : cases()) {
    const SsdDims& d = c.in.d;
    expect_same(run_forward(ssd_parallel_forward_emulated, c, ssd_parallel_forward_scratch(d)),
                run_forward(naive_fwd, c, ssd_forward_scratch(d)), "ssd forward threads " + c.name);
    expect_same(run_backward(ssd_parallel_backward_emulated, c, ssd_parallel_backward_scratch(d)),
                run_backward(naive_bwd, c, ssd_backward_scratch(d)), "ssd backward threads " + c.name);
  }
}

// The block launches do the item kernels' operations, their products
// entry by entry through the GEMM functor: with LoopGemm<NaiveGemm> the
// item kernels' bits with NaiveGemm, so every element step, operand, shape
// and accumulation order is the item's (what is left to a device is the
// order inside each product, which the budget allows).
// Slabs of one chunk, of two or three, and of every chunk (the default
// cap at these shapes) give those bits too.
TEST(SsdBlockKernels, EqualTheItemKernelsWithNaiveGemm) {
  const auto naive_fwd = [](auto... a) { ssd_chunk_scan_forward_launches(sim::HostLaunch{}, NaiveGemm{}, a...); };
  const auto naive_bwd = [](auto... a) { ssd_chunk_scan_backward_launches(sim::HostLaunch{}, NaiveGemm{}, a...); };
  for (const Case& c : cases()) {
    const SsdDims& d = c.in.d;
    const SsdBlockSizes z(d);
    const Forward fn = run_forward(naive_fwd, c, ssd_forward_scratch(d));
    const Backward bn = run_backward(naive_bwd, c, ssd_backward_scratch(d));
    for (const int64_t chunks : {int64_t{1}, int64_t{2}, int64_t{3}, int64_t{0}}) {
      const int64_t fcap = chunks ? chunks * z.forward_chunk() : kSsdSlabFloats;
      const int64_t bcap = chunks ? chunks * z.backward_chunk() : kSsdSlabFloats;
      const auto blocks_fwd = [fcap](auto... a) {
        ssd_blocks_forward_launches(sim::HostLaunch{}, LoopGemm<NaiveGemm>{}, a..., fcap);
      };
      const auto blocks_bwd = [bcap](auto... a) {
        ssd_blocks_backward_launches(sim::HostLaunch{}, LoopGemm<NaiveGemm>{}, a..., bcap);
      };
      const std::string slab = chunks ? ", slabs of " + std::to_string(chunks) + " chunks" : "";
      expect_same(run_forward(blocks_fwd, c, ssd_blocks_forward_scratch(d, fcap)), fn,
                  "ssd forward blocks " + c.name + slab);
      expect_same(run_backward(blocks_bwd, c, ssd_blocks_backward_scratch(d, bcap)), bn,
                  "ssd backward blocks " + c.name + slab);
    }
  }
}
#endif

// A family's forward against the CPU with `cmp` (compare: the emulation
// bit for bit; compare_within_budget: the budget in both builds); on a
// device a second run gives the same bits (no atomics, fixed orders).
using Cmp = void (*)(const Vec&, const Vec&, const Bound&, const std::string&);
template <class F>
void check_forward(F fwd, int64_t scratch(const SsdDims&), Cmp cmp, const std::string& family) {
  for (const Case& c : cases()) {
    const int64_t n = scratch(c.in.d);
    const Forward k = run_forward(fwd, c, n);
    const std::string what = "ssd forward " + family + " " + c.name;
    cmp(k.y, plain(c.f.y), c.ry, what + " y");
    cmp(k.acs, plain(c.f.acs), c.racs, what + " acs");
    cmp(k.st, plain(c.f.st), c.rst, what + " states");
    if (kOnDevice) expect_same(run_forward(fwd, c, n), k, what + ", run twice");
  }
}
// The same for a family's backward, which accumulates onto the gradients.
template <class F>
void check_backward(F bwd, int64_t scratch(const SsdDims&), Cmp cmp, const std::string& family) {
  for (const Case& c : cases()) {
    const int64_t n = scratch(c.in.d);
    const Backward k = run_backward(bwd, c, n);
    const std::string what = "ssd backward " + family + " " + c.name;
    cmp(k.dxbc, plain(c.dxbc), c.rdxbc, what + " dxBC");
    cmp(k.ddt, plain(c.ddt), c.rddt, what + " ddt");
    cmp(k.dA, plain(c.dA), c.rdA, what + " dA_log");
    cmp(k.dD, plain(c.dD), c.rdD, what + " dD");
    if (kOnDevice) expect_same(run_backward(bwd, c, n), k, what + ", run twice");
  }
}

// The block launches (the CUDA backend's default): on the host, with the
// CPU's products entry by entry (LoopGemm<SerialGemm>), the CPU bit for bit
// (each product has the item's shape and operands, and Eigen's result does
// not depend on their strides); on a device, with cuBLASLt's, within the
// budget.
TEST(SsdBlockKernels, ForwardWithinBudget) {
  EXMY_REQUIRE_CUDA();
  check_forward(
      KERNEL(ssd_blocks_forward), [](const SsdDims& d) { return ssd_blocks_forward_scratch(d); }, compare, "blocks");
}

TEST(SsdBlockKernels, BackwardWithinBudgetAndAccumulates) {
  EXMY_REQUIRE_CUDA();
  check_backward(
      KERNEL(ssd_blocks_backward), [](const SsdDims& d) { return ssd_blocks_backward_scratch(d); }, compare, "blocks");
}

// The thread kernels (EXMY_CUDA_SSD=threads) within the device budget of
// the CPU in both builds (their sums are NaiveGemm's, not Eigen's).
TEST(SsdThreadKernels, ForwardWithinBudget) {
  EXMY_REQUIRE_CUDA();
  check_forward(KERNEL(ssd_parallel_forward), ssd_parallel_forward_scratch, compare_within_budget, "threads");
}

TEST(SsdThreadKernels, BackwardWithinBudgetAndAccumulates) {
  EXMY_REQUIRE_CUDA();
  check_backward(KERNEL(ssd_parallel_backward), ssd_parallel_backward_scratch, compare_within_budget, "threads");
}

// The thread kernels' and the block launches' scratch is no more than the
// item kernels' at the GPU proxies' Mamba shape (the CUDA backend's buffer
// grows to the larger of the forward's and the backward's).
TEST(SsdThreadKernels, ScratchIsNoMoreThanTheItemKernels) {
  const SsdDims d{.batch = 2, .seqlen = 4096, .heads = 32, .head_dim = 64, .groups = 8, .state = 128, .chunk = 128};
  const int64_t items = std::max(ssd_forward_scratch(d), ssd_backward_scratch(d));
  const int64_t threads = std::max(ssd_parallel_forward_scratch(d), ssd_parallel_backward_scratch(d));
  const int64_t blocks = std::max(ssd_blocks_forward_scratch(d), ssd_blocks_backward_scratch(d));
  std::printf("ssd scratch at proxy-350m's Mamba shape, batch 2 x 4096: items %.1f MiB, threads %.1f MiB, "
              "blocks %.1f MiB\n",
              static_cast<double>(items) * 4 / 1048576.0, static_cast<double>(threads) * 4 / 1048576.0,
              static_cast<double>(blocks) * 4 / 1048576.0);
  EXPECT_LE(threads, items);
  EXPECT_LE(blocks, items);  // a slab of 256 MiB beside the chunks' copies
  EXPECT_EQ(ssd_device_scratch(d), blocks);  // the CUDA backend's default family
}

#if !defined(EXMY_TEST_EMULATED)
// A family's time at proxy-350m's Mamba shape (models/config.cpp: 32 heads
// of 64, 8 groups, state 128, chunk 128), batch 1, sequence 4096 (printed
// for the device report; checked only for finite results).
template <class Fwd, class Bwd>
void time_sequence_4096(const char* family, Fwd fwd, Bwd bwd, int64_t scratch_floats(const SsdDims&),
                        int64_t scratch_back(const SsdDims&)) {
  const Shape s{1, 4096, 32, 64, 8, 128, 128};
  const Inputs in(s, 7);
  const SsdDims& d = in.d;
  Buffer kxbc(in.xbc), kdt(in.dt), kA(in.A_log), kD(in.D), kdy(in.dy), ky(Vec(in.ysize(), std::nanf(""))),
      kacs(Vec(static_cast<size_t>(d.acs_size()), std::nanf(""))),
      kst(Vec(static_cast<size_t>(d.states_size()), std::nanf(""))), kdxbc(Vec(in.xbc.size(), 0.0f)),
      kddt(Vec(in.dt.size(), 0.0f)), kdA(Vec(in.A_log.size(), 0.0f)), kdD(Vec(in.D.size(), 0.0f)),
      scratch(Vec(static_cast<size_t>(std::max(scratch_floats(d), scratch_back(d))), 0.0f));
  float *kx = kxbc.ptr(), *kdx = kdxbc.ptr();
  const FwdBwdMs ms = time_forward_backward(
      [&] {
        fwd(ky.ptr(), kacs.ptr(), kst.ptr(), kx, in.ld, kx + in.xdim, kx + in.xdim + in.gn, in.ld, kdt.ptr(),
            kA.ptr(), kD.ptr(), d, scratch.ptr());
      },
      [&] {
        bwd(kdx, kdx + in.xdim, kdx + in.xdim + in.gn, kddt.ptr(), kdA.ptr(), kdD.ptr(), kdy.ptr(), kx, in.ld,
            kx + in.xdim, kx + in.xdim + in.gn, in.ld, kdt.ptr(), kA.ptr(), kD.ptr(), kacs.ptr(), kst.ptr(), d,
            scratch.ptr());
      });
  // The model's FLOPs of the chunked SSD (models/mamba2.cpp's count): per
  // token and head 2 L N / (heads per group) + 2 L P + 4 P N forward,
  // twice that back.
  const double L = static_cast<double>(d.chunk), P = static_cast<double>(d.head_dim),
               N = static_cast<double>(d.state), hpg = static_cast<double>(d.heads / d.groups);
  const double fwd_flops =
      static_cast<double>(d.batch * d.seqlen * d.heads) * (2 * L * N / hpg + 2 * L * P + 4 * P * N);
  std::printf("[ssd %s] proxy-350m Mamba shape B1 S4096 H32 P64 G8 N128 L128: forward %.2f ms (%.1f TFLOP/s), "
              "backward %.2f ms (%.1f TFLOP/s), median of 3\n",
              family, ms.fwd, fwd_flops / ms.fwd * 1e-9, ms.bwd, 2 * fwd_flops / ms.bwd * 1e-9);
  for (const Vec& r : {ky.get(), kdxbc.get(), kddt.get()}) {
    bool finite = true, nonzero = false;
    for (float x : r) finite = finite && std::isfinite(x), nonzero = nonzero || x != 0;
    EXPECT_TRUE(finite && nonzero);
  }
}

TEST(SsdThreadKernels, TimesSequence4096) {
  EXMY_REQUIRE_CUDA();
  time_sequence_4096("threads", ssd_parallel_forward_cuda, ssd_parallel_backward_cuda, ssd_parallel_forward_scratch,
                     ssd_parallel_backward_scratch);
}

TEST(SsdBlockKernels, TimesSequence4096) {
  EXMY_REQUIRE_CUDA();
  time_sequence_4096(
      "blocks", ssd_blocks_forward_cuda, ssd_blocks_backward_cuda,
      [](const SsdDims& d) { return ssd_blocks_forward_scratch(d); },
      [](const SsdDims& d) { return ssd_blocks_backward_scratch(d); });
}
#endif

}  // namespace
}  // namespace exmy::models

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
#include "models/ssd_fused.hpp"
#include "models/ssd_fused_bwd.hpp"
#include "sim/bf16.hpp"
#include "sim/tensor.hpp"

namespace exmy::models {
namespace {

struct Shape {
  int64_t batch, seqlen, heads, head_dim, groups, state, chunk;
  bool bf16 = false;  // x, B and C rounded to bfloat16, SsdDims::xbc_bf16 set (a `bf16` policy's)
};
// Chunks that do and do not divide the sequence, one chunk longer than the
// sequence, chunk 1, one group for all heads, a group per head, several
// groups of several heads, batch 1 and > 1; for the fused kernel also
// chunks of more than its 64 rows (two row tiles, the second short) with
// a short last chunk, head and state widths that pad to its 64 and 128,
// and bfloat16 x, B, C (one piece each).
const Shape kShapes[] = {
    {2, 37, 4, 8, 2, 16, 8},          {1, 32, 2, 4, 1, 8, 16},  {3, 20, 6, 3, 3, 5, 64},
    {2, 13, 4, 5, 4, 3, 1},           {2, 50, 8, 16, 2, 32, 16}, {3, 45, 6, 4, 2, 8, 16},
    {2, 37, 4, 8, 2, 16, 8, true},    {1, 150, 4, 40, 2, 48, 96}, {1, 140, 2, 64, 1, 128, 128, true},
};

std::string name_of(const Shape& s) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "B%lld T%lld H%lld P%lld G%lld N%lld L%lld%s", static_cast<long long>(s.batch),
                static_cast<long long>(s.seqlen), static_cast<long long>(s.heads), static_cast<long long>(s.head_dim),
                static_cast<long long>(s.groups), static_cast<long long>(s.state), static_cast<long long>(s.chunk),
                s.bf16 ? " bf16 xBC" : "");
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
    d.state = s.state, d.chunk = s.chunk, d.xbc_bf16 = s.bf16;
    xdim = s.heads * s.head_dim, gn = s.groups * s.state, ld = xdim + 2 * gn + 3;
    const auto rows = static_cast<size_t>(s.batch * s.seqlen);
    Vec v = randn(rows * static_cast<size_t>(ld), seed);
    if (s.bf16)
      for (float& e : v) e = sim::bf16_value(sim::bf16_bits(e));
    xbc = aligned(v);
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

// The block launches with their products on bfloat16 pieces
// (EXMY_CUDA_SSD=pieces, models/split_gemm.hpp): their own bound is the
// same launches run on RunErr with test::RunErrSplitGemm (the pieces each
// product keeps, as the launches' hints say: C and B one piece where they
// hold bfloat16 values, three otherwise; a hint that called an operand
// bfloat16 where it is not would drop bits this bound does not count), the
// forward from the inputs, the backward from the CPU's saved acs and states.
struct PieceBounds {
  Bound y, acs, st;
  Bound dxbc, ddt, dA, dD;
};
PieceBounds piece_bounds(const Case& c) {
  const Inputs& in = c.in;
  const SsdDims& d = in.d;
  PieceBounds b{Bound(c.f.y.size()), Bound(c.f.acs.size()), Bound(c.f.st.size()), to<RunErr>(c.dxbc0),
                to<RunErr>(c.ddt0), to<RunErr>(c.dA0), to<RunErr>(c.dD0)};
  const Bound rxbc = to<RunErr>(in.xbc), rdt = to<RunErr>(in.dt), rA = to<RunErr>(in.A_log), rD = to<RunErr>(in.D);
  const RunErr* rx = rxbc.data();
  const test::RunErrSplitGemm gemm{kOnDevice};
  Bound fscratch(static_cast<size_t>(ssd_blocks_forward_scratch(d)));
  ssd_blocks_forward_launches(sim::HostLaunch{}, gemm, b.y.data(), b.acs.data(), b.st.data(), rx, in.ld, rx + in.xdim,
                              rx + in.xdim + in.gn, in.ld, rdt.data(), rA.data(), rD.data(), d, fscratch.data());
  const Bound rdy = to<RunErr>(in.dy), racs = to<RunErr>(c.f.acs), rst = to<RunErr>(c.f.st);
  Bound bscratch(static_cast<size_t>(ssd_blocks_backward_scratch(d)));
  RunErr* rdx = b.dxbc.data();
  ssd_blocks_backward_launches(sim::HostLaunch{}, gemm, rdx, rdx + in.xdim, rdx + in.xdim + in.gn, b.ddt.data(),
                               b.dA.data(), b.dD.data(), rdy.data(), rx, in.ld, rx + in.xdim, rx + in.xdim + in.gn,
                               in.ld, rdt.data(), rA.data(), rD.data(), racs.data(), rst.data(), d, bscratch.data());
  return b;
}
const std::vector<PieceBounds>& piece_bounds() {
  static const std::vector<PieceBounds> all = [] {
    std::vector<PieceBounds> v;
    for (const Case& c : cases()) v.push_back(piece_bounds(c));
    return v;
  }();
  return all;
}
int64_t pieces_forward_scratch(const SsdDims& d) { return ssd_blocks_forward_scratch(d, kSsdSlabFloats, true); }
int64_t pieces_backward_scratch(const SsdDims& d) { return ssd_blocks_backward_scratch(d, kSsdSlabFloats, true); }

// Every shape, against the CPU within the budget of two algorithms (the
// pieces' bound and the CPU's); acs is made without a product (the CPU's
// bits in the emulation). In the emulation each output is also within its
// own bound of the exact value; on a device a second run gives the same
// bits.
TEST(SsdPieceKernels, ForwardWithinBudget) {
  EXMY_REQUIRE_CUDA();
  for (size_t i = 0; i < cases().size(); ++i) {
    const Case& c = cases()[i];
    const PieceBounds& b = piece_bounds()[i];
    const int64_t n = pieces_forward_scratch(c.in.d);
    const Forward k = run_forward(KERNEL(ssd_pieces_forward), c, n);
    const std::string what = "ssd forward pieces " + c.name;
    compare(k.acs, plain(c.f.acs), c.racs, what + " acs");
    compare_reordered(k.st, plain(c.f.st), b.st, c.rst, what + " states");
    compare_reordered(k.y, plain(c.f.y), b.y, c.ry, what + " y");
    if (kOnDevice) expect_same(run_forward(KERNEL(ssd_pieces_forward), c, n), k, what + ", run twice");
  }
}

TEST(SsdPieceKernels, BackwardWithinBudgetAndAccumulates) {
  EXMY_REQUIRE_CUDA();
  for (size_t i = 0; i < cases().size(); ++i) {
    const Case& c = cases()[i];
    const PieceBounds& b = piece_bounds()[i];
    const int64_t n = pieces_backward_scratch(c.in.d);
    const Backward k = run_backward(KERNEL(ssd_pieces_backward), c, n);
    const std::string what = "ssd backward pieces " + c.name;
    compare_reordered(k.dxbc, plain(c.dxbc), b.dxbc, c.rdxbc, what + " dxBC");
    compare_reordered(k.ddt, plain(c.ddt), b.ddt, c.rddt, what + " ddt");
    compare_reordered(k.dA, plain(c.dA), b.dA, c.rdA, what + " dA_log");
    compare_reordered(k.dD, plain(c.dD), b.dD, c.rdD, what + " dD");
    if (kOnDevice) expect_same(run_backward(KERNEL(ssd_pieces_backward), c, n), k, what + ", run twice");
  }
}

// EXMY_CUDA_SSD's list: whole entries between commas.
TEST(SsdPieceKernels, ChoicesAreWholeEntriesOfTheList) {
  EXPECT_TRUE(ssd_list_has("pieces", "pieces"));
  EXPECT_TRUE(ssd_list_has("fused,pieces", "pieces"));
  EXPECT_TRUE(ssd_list_has("fused,pieces", "fused"));
  EXPECT_TRUE(ssd_list_has("pieces,,fused", "fused"));
  EXPECT_FALSE(ssd_list_has("", "pieces"));
  EXPECT_FALSE(ssd_list_has("piece", "pieces"));
  EXPECT_FALSE(ssd_list_has("fused pieces", "pieces"));
  EXPECT_FALSE(ssd_list_has("fusedpieces,x", "pieces"));
  EXPECT_FALSE(ssd_list_has("fused,", "pieces"));
}

#if defined(EXMY_TEST_EMULATED)
// Slabs of one chunk (the piece area then as small as it gets: one chunk's
// entries of the largest product, ssd_piece_chunk_elems; SplitGemm throws
// where a product's pieces would not fit) and of two give the default's
// bits: a slab's pieces are made before they are read, and no product's
// pieces overlap the slab's arrays (the scratch starts as NaN).
TEST(SsdPieceKernels, SlabsGiveTheSameBits) {
  using Split = SplitGemm<sim::HostLaunch, HostBf16Gemm>;
  for (const Case& c : cases()) {
    const SsdDims& d = c.in.d;
    const SsdBlockSizes z(d, true);
    const Forward f0 = run_forward(ssd_pieces_forward_emulated, c, pieces_forward_scratch(d));
    const Backward b0 = run_backward(ssd_pieces_backward_emulated, c, pieces_backward_scratch(d));
    for (const int64_t chunks : {int64_t{1}, int64_t{2}}) {
      const int64_t fcap = chunks * z.forward_chunk(), bcap = chunks * z.backward_chunk();
      const auto fwd = [fcap](auto... a) { ssd_blocks_forward_launches(sim::HostLaunch{}, Split{}, a..., fcap); };
      const auto bwd = [bcap](auto... a) { ssd_blocks_backward_launches(sim::HostLaunch{}, Split{}, a..., bcap); };
      const std::string slab = ", slabs of " + std::to_string(chunks) + " chunks";
      expect_same(run_forward(fwd, c, ssd_blocks_forward_scratch(d, fcap, true)), f0,
                  "ssd forward pieces " + c.name + slab);
      expect_same(run_backward(bwd, c, ssd_blocks_backward_scratch(d, bcap, true)), b0,
                  "ssd backward pieces " + c.name + slab);
    }
  }
}
#endif

// The RunErr evaluation of the fused output kernel (models/ssd_fused.hpp),
// output by output in its steps and orders, from the CPU's bounds of acs
// and the states entering each chunk (which the kernel reads as the block
// launches formed them): off = C_t . state_p, a product on pieces (C in
// ssd_fused_pieces, the state in three) over the padded state (K = kN);
// per key tile up to the diagonal, each m_s = (C_t . B_s on pieces, K = kN)
// exp(acs_t - acs_s) dt_s for s <= t, and Yd += m . x_p over the tile (m in
// three pieces, x in ssd_fused_pieces; chained from Yd); y = (Yd +
// exp(acs_t) off) + D x. Sums as the emulation forms them
// (SplitSum::mma_chain) or as a device's tensor cores may (SplitSum::device).
Bound fused_bound(const Case& c) {
  const Inputs& in = c.in;
  const SsdDims& d = in.d;
  const int64_t S = d.seqlen, H = d.heads, P = d.head_dim, N = d.state, hpg = H / d.groups, ldy = H * P;
  const int64_t kN = ssd_fused_state(N), tile = fused::kKeys;
  const int pc = ssd_fused_pieces(d), p3 = fused::kPPieces;
  const test::SplitSum how = kOnDevice ? test::SplitSum::device : test::SplitSum::mma_chain;
  const Bound rxbc = to<RunErr>(in.xbc), rdt = to<RunErr>(in.dt), rD = to<RunErr>(in.D);
  Bound y(c.f.y.size());
  for (int64_t b = 0; b < d.batch; ++b)
    for (int64_t q = 0; q < d.chunks(); ++q) {
      const SsdChunk ch = ssd_chunk_of(d, b, q);
      for (int64_t h = 0; h < H; ++h) {
        const int64_t g = h / hpg;
        const RunErr* const st = c.rst.data() + ((b * d.chunks() + q) * H + h) * P * N;
        const RunErr* const ac = c.racs.data() + (b * H + h) * S + ch.t0;
        const auto row = [&](int64_t t) { return rxbc.data() + (b * S + ch.t0 + t) * in.ld; };
        Bound m(static_cast<size_t>(ch.len));
        for (int64_t t = 0; t < ch.len; ++t) {
          const RunErr* const Ct = row(t) + in.xdim + in.gn + g * N;
          for (int64_t s = 0; s <= t; ++s) {
            const test::RunErrDot dd =
                test::run_err_dot({}, Ct, 0, sim::Op::N, row(s) + in.xdim + g * N, 0, sim::Op::T, 0, 0, N);
            m[s] = test::run_err_split(dd, RunErr(0), false, pc, pc, kN, how) * sim::hd_exp(ac[t] - ac[s]) *
                   rdt[(b * S + ch.t0 + s) * H + h];
          }
          const int64_t r0 = t / fused::kRows * fused::kRows;
          for (int64_t p = 0; p < P; ++p) {
            const test::RunErrDot od = test::run_err_dot({}, Ct, 0, sim::Op::N, st + p * N, 0, sim::Op::T, 0, 0, N);
            const RunErr off = test::run_err_split(od, RunErr(0), false, pc, p3, kN, how);
            RunErr yd(0);
            for (int64_t s0 = 0; s0 <= r0; s0 += tile) {
              const int64_t n = std::min(tile, t + 1 - s0);  // m_s = 0 past t
              const test::RunErrDot dd = test::run_err_dot({yd.v, yd.e}, m.data() + s0, 0, sim::Op::N,
                                                           row(s0) + h * P + p, in.ld, sim::Op::N, 0, 0, n);
              yd = test::run_err_split(dd, yd, true, p3, pc, tile, how);
            }
            const RunErr xv = row(t)[h * P + p];
            y[(b * S + ch.t0 + t) * ldy + h * P + p] = (yd + sim::hd_exp(ac[t]) * off) + rD[h] * xv;
          }
        }
      }
    }
  return y;
}

// The forward with the fused output kernel (EXMY_CUDA_SSD=fused) over every
// shape: acs and the states are the block launches' (the CPU's bits in the
// emulation, the budget on a device), y within the budget of two
// algorithms (its RunErr bound and the CPU's); in the emulation also each
// output within its own bound of the exact value. On a device a second run
// gives the same bits.
TEST(SsdFusedKernel, ForwardWithinBudget) {
  EXMY_REQUIRE_CUDA();
  for (const Case& c : cases()) {
    const SsdDims& d = c.in.d;
    ASSERT_TRUE(ssd_fused_applies(d)) << c.name;
    const int64_t n = ssd_fused_forward_scratch(d);
    const Forward k = run_forward(KERNEL(ssd_fused_forward), c, n);
    const std::string what = "ssd forward fused " + c.name;
    compare(k.acs, plain(c.f.acs), c.racs, what + " acs");
    compare(k.st, plain(c.f.st), c.rst, what + " states");
    compare_reordered(k.y, plain(c.f.y), fused_bound(c), c.ry, what + " y");
    if (kOnDevice) expect_same(run_forward(KERNEL(ssd_fused_forward), c, n), k, what + ", run twice");
  }
}

// A head wider than 64 or a state wider than 128 is refused before any
// launch, in one line; the CUDA backend then keeps the block launches.
TEST(SsdFusedKernel, RefusesWhatItDoesNotTake) {
  EXMY_REQUIRE_CUDA();
  for (const SsdDims d : {SsdDims{.heads = 2, .head_dim = 72, .groups = 1, .state = 16, .chunk = 8},
                          SsdDims{.heads = 2, .head_dim = 16, .groups = 1, .state = 136, .chunk = 8}}) {
    EXPECT_FALSE(ssd_fused_applies(d));
    EXPECT_FALSE(ssd_fused_chosen(d));
    try {
      KERNEL(ssd_fused_forward)(nullptr, nullptr, nullptr, nullptr, 0, nullptr, nullptr, 0, nullptr, nullptr, nullptr,
                                d, nullptr);
      ADD_FAILURE() << "head_dim " << d.head_dim << ", state " << d.state << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("ssd_fused_forward: head_dim " + std::to_string(d.head_dim) + " and state " +
                                           std::to_string(d.state) + " exceed the fused kernel's 64 and 128"),
                std::string::npos)
          << e.what();
    }
  }
}

// The RunErr evaluation of the fused diagonal kernels
// (models/ssd_fused_bwd.hpp) on a slab, in their steps and orders: S = C_t
// . B_s (C and B in ssd_fused_pieces, K = kN) and dM = dy_t . (dt_s x_s)
// (both in three, K = 64) as products on pieces; for s <= t, l =
// exp(acs_t - acs_s), m = S l, dS = dM l; per (t, group) the sum dS B
// chained over the heads in order and each one's key tiles (dS in three, B
// in ssd_fused_pieces, K = 64 a tile), added into dCg; per (s, head) m^T dy
// chained over the tiles of t (both in three), added into dXDT; per (s,
// group) dS^T C chained over the heads and tiles, added into dBg; the row
// sums (s < t) and column sums (t > s) of dM m in any order: n terms within
// (n + 1) u sum |term| of their sum.
struct FusedDiagonalBound {
  test::SplitSum how;
  static RunErr any_order_sum(const std::vector<RunErr>& terms) {
    double v = 0, e = 0, mag = 0;
    for (const RunErr& t : terms) v += t.v, e += t.e, mag += std::fabs(t.v);
    return {v, e + static_cast<double>(terms.size() + 1) * mag};
  }
  void operator()(const SsdDiagonalSlab<RunErr>& a) const {
    const SsdDims& d = a.d;
    const int64_t S = d.seqlen, H = d.heads, G = d.groups, hpg = H / G, P = d.head_dim, N = d.state;
    const int64_t Q = d.chunks(), kN = ssd_fused_state(N), tile = fused::kKeys, ldy = H * P;
    const int pc = ssd_fused_pieces(d), p3 = fused::kPPieces;
    for (int64_t cl = 0; cl < a.count; ++cl) {
      const SsdChunk ch = ssd_chunk_of(d, (a.c0 + cl) / Q, (a.c0 + cl) % Q);
      const int64_t L = ch.len, row0 = ch.b * S + ch.t0;
      for (int64_t g = 0; g < G; ++g) {
        const RunErr* const Bg = a.Bm + row0 * a.ldbc + g * N;  // row t at + t ldbc
        const RunErr* const Cg = a.Cm + row0 * a.ldbc + g * N;
        // (m and dS stay +0 above the diagonal)
        Bound Sm(static_cast<size_t>(L * L)), m(Sm.size()), ds(Sm.size()), xdt(static_cast<size_t>(L * P));
        Bound accC(static_cast<size_t>(L * N)), accB(accC.size());
        for (int64_t t = 0; t < L; ++t)
          for (int64_t s = 0; s <= t; ++s)
            Sm[t * L + s] = test::run_err_split(test::run_err_dot({}, Cg + t * a.ldbc, 0, sim::Op::N, Bg + s * a.ldbc,
                                                                  0, sim::Op::T, 0, 0, N),
                                                RunErr(0), false, pc, pc, kN, how);
        for (int64_t h = g * hpg; h < (g + 1) * hpg; ++h) {
          const RunErr* const ac = a.acs + (ch.b * H + h) * S + ch.t0;
          const RunErr* const dyh = a.dy + row0 * ldy + h * P;  // row t at + t ldy
          for (int64_t t = 0; t < L; ++t)
            for (int64_t p = 0; p < P; ++p)
              xdt[t * P + p] = a.dt[(row0 + t) * H + h] * a.x[(row0 + t) * a.ldx + h * P + p];
          std::vector<std::vector<RunErr>> row_terms(L), col_terms(L);
          for (int64_t t = 0; t < L; ++t)
            for (int64_t s = 0; s <= t; ++s) {
              const RunErr dm = test::run_err_split(
                  test::run_err_dot({}, dyh + t * ldy, 0, sim::Op::N, xdt.data() + s * P, 0, sim::Op::T, 0, 0, P),
                  RunErr(0), false, p3, p3, kSsdFusedHead, how);
              const RunErr l = sim::hd_exp(ac[t] - ac[s]);
              m[t * L + s] = Sm[t * L + s] * l;
              ds[t * L + s] = dm * l;
              if (s < t) {
                const RunErr term = dm * m[t * L + s];
                row_terms[t].push_back(term), col_terms[s].push_back(term);
              }
            }
          const int64_t el = cl * H + h;
          for (int64_t t = 0; t < L; ++t) {
            a.rows[el * a.L1 + t] = any_order_sum(row_terms[t]);
            a.cols[el * a.L1 + t] = any_order_sum(col_terms[t]);
          }
          // The rows kernel: dCg's sums over this head's key tiles up to t's.
          for (int64_t t = 0; t < L; ++t)
            for (int64_t n = 0; n < N; ++n) {
              RunErr& acc = accC[t * N + n];
              for (int64_t s0 = 0; s0 <= t / tile * tile; s0 += tile) {
                const int64_t k = std::min(tile, t + 1 - s0);  // dS = 0 past t
                const test::RunErrDot dd = test::run_err_dot({acc.v, acc.e}, ds.data() + t * L + s0, 0, sim::Op::N,
                                                             Bg + s0 * a.ldbc + n, a.ldbc, sim::Op::N, 0, 0, k);
                acc = test::run_err_split(dd, acc, true, p3, pc, tile, how);
              }
            }
          // The cols kernel: dXDT's sums over the tiles of t from s's, dBg's.
          for (int64_t s = 0; s < L; ++s) {
            for (int64_t p = 0; p < P; ++p) {
              RunErr accx(0);
              for (int64_t t0 = s / tile * tile; t0 < L; t0 += tile) {
                const int64_t k = std::min(tile, L - t0);  // m = 0 for t < s
                const test::RunErrDot dd = test::run_err_dot({accx.v, accx.e}, m.data() + t0 * L, L, sim::Op::T,
                                                             dyh + t0 * ldy + p, ldy, sim::Op::N, s, 0, k);
                accx = test::run_err_split(dd, accx, true, p3, p3, tile, how);
              }
              RunErr& out = a.dXDT[el * a.LP + s * P + p];
              out = out + accx;
            }
            for (int64_t n = 0; n < N; ++n) {
              RunErr& acc = accB[s * N + n];
              for (int64_t t0 = s / tile * tile; t0 < L; t0 += tile) {
                const int64_t k = std::min(tile, L - t0);
                const test::RunErrDot dd = test::run_err_dot({acc.v, acc.e}, ds.data() + t0 * L, L, sim::Op::T,
                                                             Cg + t0 * a.ldbc + n, a.ldbc, sim::Op::N, s, 0, k);
                acc = test::run_err_split(dd, acc, true, p3, pc, tile, how);
              }
            }
          }
        }
        const int64_t eg = cl * G + g;
        for (int64_t t = 0; t < L; ++t)
          for (int64_t n = 0; n < N; ++n) {
            a.dCg[eg * a.LN + t * N + n] = a.dCg[eg * a.LN + t * N + n] + accC[t * N + n];
            a.dBg[eg * a.LN + t * N + n] = a.dBg[eg * a.LN + t * N + n] + accB[t * N + n];
          }
      }
    }
  }
};

// The fused backward's bound: the block launches on RunErr with `gemm`
// (LoopGemm<test::RunErrGemm> for their FP32 products, RunErrSplitGemm for
// those on pieces) and the diagonal kernels' evaluation above, from the
// CPU's saved acs and states.
struct BackwardBound {
  Bound dxbc, ddt, dA, dD;
};
template <class Gemm>
BackwardBound fused_backward_bound(const Case& c, const Gemm& gemm) {
  const Inputs& in = c.in;
  const SsdDims& d = in.d;
  BackwardBound b{to<RunErr>(c.dxbc0), to<RunErr>(c.ddt0), to<RunErr>(c.dA0), to<RunErr>(c.dD0)};
  const Bound rxbc = to<RunErr>(in.xbc), rdt = to<RunErr>(in.dt), rA = to<RunErr>(in.A_log), rD = to<RunErr>(in.D);
  const Bound rdy = to<RunErr>(in.dy), racs = to<RunErr>(c.f.acs), rst = to<RunErr>(c.f.st);
  const RunErr* rx = rxbc.data();
  RunErr* rdx = b.dxbc.data();
  Bound scratch(static_cast<size_t>(ssd_fused_backward_scratch(d)));
  const FusedDiagonalBound diag{kOnDevice ? test::SplitSum::device : test::SplitSum::mma_chain};
  ssd_blocks_backward_launches(sim::HostLaunch{}, gemm, rdx, rdx + in.xdim, rdx + in.xdim + in.gn, b.ddt.data(),
                               b.dA.data(), b.dD.data(), rdy.data(), rx, in.ld, rx + in.xdim, rx + in.xdim + in.gn,
                               in.ld, rdt.data(), rA.data(), rD.data(), racs.data(), rst.data(), d, scratch.data(),
                               kSsdSlabFloats, diag);
  return b;
}

// The backward with the fused diagonal kernels (EXMY_CUDA_SSD=fused), the
// block launches' other products in FP32 and on pieces (fused,pieces),
// over every shape: within the budget of two algorithms (its RunErr bound
// and the CPU's); in the emulation also each output within its own bound of
// the exact value; on a device a second run gives the same bits.
TEST(SsdFusedKernel, BackwardWithinBudgetAndAccumulates) {
  EXMY_REQUIRE_CUDA();
  for (const Case& c : cases()) {
    const SsdDims& d = c.in.d;
    ASSERT_TRUE(ssd_fused_applies(d)) << c.name;
    for (const bool pieces : {false, true}) {
      const BackwardBound b = pieces ? fused_backward_bound(c, test::RunErrSplitGemm{kOnDevice})
                                     : fused_backward_bound(c, LoopGemm<test::RunErrGemm>{});
      const auto bwd = pieces ? KERNEL(ssd_fused_pieces_backward) : KERNEL(ssd_fused_backward);
      const int64_t n = ssd_fused_backward_scratch(d, kSsdSlabFloats, pieces);
      const Backward k = run_backward(bwd, c, n);
      const std::string what = std::string("ssd backward fused") + (pieces ? ",pieces " : " ") + c.name;
      compare_reordered(k.dxbc, plain(c.dxbc), b.dxbc, c.rdxbc, what + " dxBC");
      compare_reordered(k.ddt, plain(c.ddt), b.ddt, c.rddt, what + " ddt");
      compare_reordered(k.dA, plain(c.dA), b.dA, c.rdA, what + " dA_log");
      compare_reordered(k.dD, plain(c.dD), b.dD, c.rdD, what + " dD");
      if (kOnDevice) expect_same(run_backward(bwd, c, n), k, what + ", run twice");
    }
  }
}

#if defined(EXMY_TEST_EMULATED)
// The fused kernel's staging, on the host, where the bound of its results is
// too loose to see a piece: C's rows, the state entering the chunk, B's and
// x's rows of a key tile as pieces that sum to the floats exactly (three,
// or one for bfloat16 xBC), where the fragments read them (row stride and
// piece stride of SsdFusedSmem), zeros past the chunk, the state and the
// head; the rows' and keys' acs and the keys' dt, zeros past the chunk.
double piece_sum(const uint16_t* p, int pieces, int64_t stride) {
  double x = 0;
  for (int i = 0; i < pieces; ++i) x += static_cast<double>(sim::bf16_value(p[i * stride]));
  return x;
}
template <int kN, int kP>
void check_staging(const Case& c) {
  using Lay = SsdFusedSmem<kN, kP>;
  const Inputs& in = c.in;
  const SsdDims& d = in.d;
  ASSERT_EQ(ssd_fused_state(d.state), kN);
  ASSERT_EQ(ssd_fused_pieces(d), kP);
  const float* x = in.xbc.data();
  const SsdFusedArgs a{nullptr, c.f.acs.data(), c.f.st.data(), x, in.ld, x + in.xdim, x + in.xdim + in.gn,
                       in.ld, in.dt.data(), in.D.data(), d};
  const int64_t S = d.seqlen, H = d.heads, P = d.head_dim, N = d.state;
  // the first chunk of the last batch row, its last row tile with rows, the last head
  const int64_t bq = (d.batch - 1) * d.chunks(), h = H - 1;
  const SsdFusedCta cta = ssd_fused_cta(d, (ssd_chunk_of(d, d.batch - 1, 0).len - 1) / fused::kRows, h, bq);
  ASSERT_LT(cta.r0, cta.len) << c.name;
  std::vector<uint16_t> sm(Lay::elems, 0xffff);
  std::vector<float> f(Lay::floats, std::nanf(""));
  const auto at = [&](int64_t t) { return (cta.b * S + cta.t0 + t) * in.ld; };  // row t of the chunk
  for (int tid = 0; tid < fused::kThreads; ++tid) ssd_fused_stage_rows<kN, kP>(tid, a, cta, sm.data(), f.data());
  for (int r = 0; r < fused::kRows; ++r) {
    const bool row_in = cta.r0 + r < cta.len;
    ASSERT_EQ(f[Lay::acs_rows + r], row_in ? c.f.acs[(cta.b * H + h) * S + cta.t0 + cta.r0 + r] : 0.0f) << r;
    for (int n = 0; n < kN; ++n) {
      const double cv = row_in && n < N ? x[at(cta.r0 + r) + in.xdim + in.gn + cta.g * N + n] : 0.0;
      const double sv = r < P && n < N ? c.f.st[cta.e * P * N + r * N + n] : 0.0;
      ASSERT_EQ(piece_sum(sm.data() + Lay::c_at + r * Lay::ld + n, kP, Lay::rows), cv) << c.name << " C " << r << " " << n;
      ASSERT_EQ(piece_sum(sm.data() + Lay::u_at + r * Lay::ld + n, fused::kPPieces, Lay::rows), sv)
          << c.name << " state " << r << " " << n;
    }
  }
  const int64_t s0 = cta.r0;  // the diagonal tile: rows past the chunk
  for (int tid = 0; tid < fused::kThreads; ++tid) ssd_fused_stage_keys<kN, kP>(tid, a, cta, s0, sm.data(), f.data());
  for (int r = 0; r < fused::kKeys; ++r) {
    const bool in_chunk = s0 + r < cta.len;
    ASSERT_EQ(f[Lay::acs_keys + r], in_chunk ? c.f.acs[(cta.b * H + h) * S + cta.t0 + s0 + r] : 0.0f) << r;
    ASSERT_EQ(f[Lay::dt_keys + r], in_chunk ? in.dt[(cta.b * S + cta.t0 + s0 + r) * H + h] : 0.0f) << r;
    for (int n = 0; n < kN; ++n) {
      const double bv = in_chunk && n < N ? x[at(s0 + r) + in.xdim + cta.g * N + n] : 0.0;
      ASSERT_EQ(piece_sum(sm.data() + Lay::u_at + r * Lay::ld + n, kP, Lay::rows), bv) << c.name << " B " << r << " " << n;
    }
    for (int p = 0; p < kSsdFusedHead; ++p) {
      const double xv = in_chunk && p < P ? x[at(s0 + r) + h * P + p] : 0.0;
      ASSERT_EQ(piece_sum(sm.data() + Lay::x_at + r * Lay::ldx + p, kP, Lay::x_rows), xv) << c.name << " x " << r << " " << p;
    }
  }
}
// Slabs of one chunk and of two give the default's bits with the fused
// diagonal kernels (a slab's entries and its chunks c0 + cl line up), with
// FP32 products (and slabs of two on pieces); no kernel reads an unwritten
// scratch element (the scratch starts as NaN).
TEST(SsdFusedKernel, BackwardSlabsGiveTheSameBits) {
  using Split = SplitGemm<sim::HostLaunch, HostBf16Gemm>;
  for (const Case& c : cases()) {
    const SsdDims& d = c.in.d;
    for (const bool pieces : {false, true}) {
      const SsdBlockSizes z(d, pieces);
      const Backward b0 = run_backward(pieces ? ssd_fused_pieces_backward_emulated : ssd_fused_backward_emulated, c,
                                       ssd_fused_backward_scratch(d, kSsdSlabFloats, pieces));
      // (the diagonal kernels are the same with pieces: slabs of two chunks there)
      for (const int64_t chunks : pieces ? std::vector<int64_t>{2} : std::vector<int64_t>{1, 2}) {
        const int64_t cap = chunks * z.fused_backward_chunk();
        const auto bwd = [cap, pieces](auto... a) {
          if (pieces)
            ssd_blocks_backward_launches(sim::HostLaunch{}, Split{}, a..., cap, SsdFusedDiagonal<SsdFusedDiagonalHost>{});
          else
            ssd_blocks_backward_launches(sim::HostLaunch{}, LoopGemm<SerialGemm>{}, a..., cap,
                                         SsdFusedDiagonal<SsdFusedDiagonalHost>{});
        };
        expect_same(run_backward(bwd, c, ssd_fused_backward_scratch(d, cap, pieces)), b0,
                    std::string("ssd backward fused") + (pieces ? ",pieces " : " ") + c.name + ", slabs of " +
                        std::to_string(chunks) + " chunks");
      }
    }
  }
}

// The diagonal kernels' staging, on the host: C's or B's rows of the CTA's
// group, dy's and dt x's (each element dt_t x_t, the block launches' XDT)
// rows of a head as pieces that sum to the floats exactly, where the
// fragments read them (row and piece strides of SsdDiagSmem), zeros past
// the chunk, the state and the head; acs of the head's rows, zeros past
// the chunk.
template <int kN, int kP>
void check_diag_staging(const Case& c) {
  using Lay = SsdDiagSmem<kN, kP>;
  const Inputs& in = c.in;
  const SsdDims& d = in.d;
  const int64_t S = d.seqlen, H = d.heads, P = d.head_dim, N = d.state, G = d.groups;
  const float* x = in.xbc.data();
  const SsdDiagonalSlab<float> a{nullptr, nullptr, nullptr, nullptr, nullptr, c.f.acs.data(), x, x + in.xdim,
                                 x + in.xdim + in.gn, in.dt.data(), in.dy.data(), in.ld, in.ld, d,
                                 (d.batch - 1) * d.chunks(), 1, 0, 0, 0};
  // the slab's one chunk (the last batch row's first), its last row tile with rows, the last group and head
  const SsdDiagCta cta = ssd_diag_cta(a, (ssd_chunk_of(d, d.batch - 1, 0).len - 1) / fused::kRows, G - 1, 0);
  ASSERT_LT(cta.r0, cta.len) << c.name;
  const int64_t h = H - 1, r0 = cta.r0;
  std::vector<uint16_t> sm(Lay::elems, 0xffff);
  std::vector<float> f(Lay::floats, std::nanf(""));
  for (int tid = 0; tid < fused::kKvThreads; ++tid) {
    ssd_diag_stage_bc<kN, kP, fused::kKvThreads>(tid, a, cta, a.Cm, r0, sm.data() + Lay::own_at);
    ssd_diag_stage_bc<kN, kP, fused::kKvThreads>(tid, a, cta, a.Bm, r0, sm.data() + Lay::other_at);
    ssd_diag_stage_dy<kN, kP, fused::kKvThreads>(tid, a, cta, h, r0, sm.data() + Lay::own_h_at);
    ssd_diag_stage_xdt<kN, kP, fused::kKvThreads>(tid, a, cta, h, r0, sm.data() + Lay::other_h_at);
    ssd_diag_stage_acs<fused::kKvThreads>(tid, a, cta, h, r0, f.data() + Lay::acs_own);
  }
  for (int r = 0; r < fused::kRows; ++r) {
    const bool in_chunk = r0 + r < cta.len;
    const int64_t row = cta.b * S + cta.t0 + r0 + r;
    ASSERT_EQ(f[Lay::acs_own + r], in_chunk ? c.f.acs[(cta.b * H + h) * S + cta.t0 + r0 + r] : 0.0f) << r;
    for (int n = 0; n < kN; ++n) {
      const bool here = in_chunk && n < N;
      const double cv = here ? x[row * in.ld + in.xdim + in.gn + cta.g * N + n] : 0.0;
      const double bv = here ? x[row * in.ld + in.xdim + cta.g * N + n] : 0.0;
      ASSERT_EQ(piece_sum(sm.data() + Lay::own_at + r * Lay::ld + n, kP, Lay::rows), cv) << c.name << " C " << r << " " << n;
      ASSERT_EQ(piece_sum(sm.data() + Lay::other_at + r * Lay::ld + n, kP, Lay::rows), bv) << c.name << " B " << r << " " << n;
    }
    for (int p = 0; p < kSsdFusedHead; ++p) {
      const bool here = in_chunk && p < P;
      const double dyv = here ? in.dy[row * H * P + h * P + p] : 0.0;
      const double xdtv = here ? static_cast<double>(in.dt[row * H + h] * x[row * in.ld + h * P + p]) : 0.0;
      ASSERT_EQ(piece_sum(sm.data() + Lay::own_h_at + r * Lay::ldh + p, fused::kPPieces, Lay::hrows), dyv)
          << c.name << " dy " << r << " " << p;
      ASSERT_EQ(piece_sum(sm.data() + Lay::other_h_at + r * Lay::ldh + p, fused::kPPieces, Lay::hrows), xdtv)
          << c.name << " dt x " << r << " " << p;
    }
  }
}
TEST(SsdFusedKernel, DiagonalStagesPiecesWhereTheFragmentsReadThem) {
  int checked = 0;
  for (const Case& c : cases())
    ssd_fused_dispatch(c.in.d, [&]<int kN, int kP>() {
      check_diag_staging<kN, kP>(c);
      ++checked;
    });
  EXPECT_EQ(checked, static_cast<int>(std::size(kShapes)));
}

TEST(SsdFusedKernel, StagesPiecesWhereTheFragmentsReadThem) {
  int checked = 0;
  for (const Case& c : cases())
    ssd_fused_dispatch(c.in.d, [&]<int kN, int kP>() {
      check_staging<kN, kP>(c);
      ++checked;
    });
  EXPECT_EQ(checked, static_cast<int>(std::size(kShapes)));
}
#endif

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

// The thread kernels' and the block launches' scratch (FP32 or on pieces)
// is no more than the item kernels' at the GPU proxies' Mamba shape (the
// CUDA backend's buffer grows to the larger of the forward's and the
// backward's).
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
  // On pieces a slab holds its pieces too, within the same 256 MiB (fewer chunks a slab).
  const int64_t pieces = std::max(pieces_forward_scratch(d), pieces_backward_scratch(d));
  std::printf("  blocks on bfloat16 pieces %.1f MiB\n", static_cast<double>(pieces) * 4 / 1048576.0);
  EXPECT_LE(pieces, items);
}

#if !defined(EXMY_TEST_EMULATED)
// A family's time at proxy-350m's Mamba shape (models/config.cpp: 32 heads
// of 64, 8 groups, state 128, chunk 128), batch 1, sequence 4096 (printed
// for the device report; checked only for finite results).
template <class Fwd, class Bwd>
void time_sequence_4096(const char* family, Fwd fwd, Bwd bwd, int64_t scratch_floats(const SsdDims&),
                        int64_t scratch_back(const SsdDims&), bool bf16 = false) {
  const Shape s{1, 4096, 32, 64, 8, 128, 128, bf16};
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

// The block launches on bfloat16 pieces, fp32 and bfloat16 x, B, C (C and
// B one piece).
TEST(SsdPieceKernels, TimesSequence4096) {
  EXMY_REQUIRE_CUDA();
  for (const bool bf16 : {false, true})
    time_sequence_4096(bf16 ? "pieces, bf16 xBC" : "pieces", ssd_pieces_forward_cuda, ssd_pieces_backward_cuda,
                       pieces_forward_scratch, pieces_backward_scratch, bf16);
}

// The fused kernels (the forward's output, the backward's diagonal blocks),
// fp32 and bfloat16 x, B, C; and with the backward's other products on
// pieces (fused,pieces).
TEST(SsdFusedKernel, TimesSequence4096) {
  EXMY_REQUIRE_CUDA();
  for (const bool bf16 : {false, true}) {
    time_sequence_4096(
        bf16 ? "fused, bf16 xBC" : "fused", ssd_fused_forward_cuda, ssd_fused_backward_cuda,
        [](const SsdDims& d) { return ssd_fused_forward_scratch(d); },
        [](const SsdDims& d) { return ssd_fused_backward_scratch(d); }, bf16);
    time_sequence_4096(
        bf16 ? "fused,pieces, bf16 xBC" : "fused,pieces", ssd_fused_forward_cuda, ssd_fused_pieces_backward_cuda,
        [](const SsdDims& d) { return ssd_fused_forward_scratch(d); },
        [](const SsdDims& d) { return ssd_fused_backward_scratch(d, kSsdSlabFloats, true); }, bf16);
  }
}
#endif

}  // namespace
}  // namespace exmy::models

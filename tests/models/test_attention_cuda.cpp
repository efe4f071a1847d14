// Causal GQA attention's kernels (models/cuda/attention_cuda.hpp) against
// the CPU attention (models/attention.hpp), forward and backward, in two
// families:
// - the block kernels (models/attention_blocks.hpp), which both device
//   backends run: at the CPU's blocking (kQueryBlock rows) their host
//   emulation must equal the CPU bit for bit (the item functions' steps, the
//   same Eigen products in the same order); on a device (cuBLASLt's
//   products) and at other blockings, within the FP32 budget below.
// - the row kernels (one thread per query or key row, the forward an
//   online softmax), the CUDA backend's other family: within the budget,
//   in the emulation (HostLaunch) and on a device.
//
// Built twice, as test_ssd_cuda.cpp: test_attention_cuda_emulated (label
// "unit") and test_attention_cuda (label "gpu", only with CUDA; every test
// reports SKIPPED without a CUDA device).
//
// The FP32 budget. The CPU and the row kernels are two
// algorithms: the CPU forms a block of scores with one Eigen product, takes
// each row's max, and normalizes by the row's sum; a row thread sums each
// score over e in order, keeps a running max m and sum l over tiles of 16
// keys, multiplies l and its output sum by exp(m - m') whenever the max
// grows to m', and divides at the end; the backward recomputes the
// probabilities from the saved lse and sums dV, dK over the query rows from
// the last down and dQ over the keys from the first up. Neither is a
// reordering of the other's operations (the rescaling by exp(m - m') has
// no counterpart on the CPU), so one bound over "any order" of one
// algorithm's sums does not cover both. Instead each is bounded on its own
// by running its own functions on test::RunErr (tests/models/run_error.hpp:
// a first-order bound u E, u = 2^-24, on the error of an FP32 evaluation;
// its products bound any order of their sums, its exp allows 2 ulp and log
// 1 ulp, which covers the device's expf and logf as well as glibc's; the
// scores' errors go through exp multiplied by the probability, a max
// carries the largest error of its operands): E_cpu for the CPU's
// algorithm (the block launches at kQueryBlock rows, whose steps are the
// item functions of attention_items.hpp), E_rows for the row functions
// (attention_rows.hpp), E_B for the block launches at B rows (the same
// steps; the backward's sums over query rows grouped by B rows a product),
// each run as the device runs it (no fused multiply-adds,
// exmy_cuda_library's --fmad=false). Each result is within 2 u E of the
// exact value (twice for the terms beyond first order and E's own double
// evaluation), so the row kernels are within 2 u (E_rows + E_cpu) + 2^-126
// of the CPU and the blocks at B rows within 2 u (E_B + E_cpu) + 2^-126
// (tests/models/budget_test.hpp, compare_reordered); the CPU's blocking on
// a device, which reorders only the products' sums, within 4 u E_cpu
// (compare). The emulated build checks the premises against the double
// evaluation as well. Where two scores of a row are within their
// rounding of each other the sides may take different maxima: the softmax
// does not depend on that choice, only its roundings do, which the max's
// carried error covers. The bound ignores that a max's error shifts every
// score of its row alike (it cancels in the softmax), so it is loose there,
// never short.
#include "tests/models/budget_test.hpp"  // first: hd_exp(RunErr) before models/attention_items.hpp

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "formats/error.hpp"
#include "models/attention.hpp"
#include "models/attention_fused.hpp"
#include "models/cuda/attention_cuda.hpp"
#include "sim/bf16.hpp"

namespace exmy::models {
namespace {

// Sequences shorter than a query block (64) and than a row tile (16), one
// block exactly, and more blocks with a short last one (odd lengths: the
// row tiles' last steps are partial); GQA with 1, 2, 3 and 4 query heads
// per kv head; batch 1 and > 1; head_dim from 8 to 128 (the GPU proxies'
// and the 8B's). Two with q, k and v of bfloat16 values (the `bf16`
// policy's, qkv_bf16: the products on pieces take them as one piece).
const AttnDims kShapes[] = {
    {.batch = 2, .seqlen = 70, .q_heads = 4, .kv_heads = 2, .head_dim = 8},
    {.batch = 1, .seqlen = 64, .q_heads = 4, .kv_heads = 1, .head_dim = 16},
    {.batch = 3, .seqlen = 20, .q_heads = 3, .kv_heads = 3, .head_dim = 32, .qkv_bf16 = true},
    {.batch = 1, .seqlen = 130, .q_heads = 2, .kv_heads = 1, .head_dim = 64},
    {.batch = 2, .seqlen = 5, .q_heads = 8, .kv_heads = 2, .head_dim = 24},
    {.batch = 2, .seqlen = 37, .q_heads = 6, .kv_heads = 2, .head_dim = 40},
    {.batch = 1, .seqlen = 97, .q_heads = 4, .kv_heads = 2, .head_dim = 128, .qkv_bf16 = true},
};

std::string name_of(const AttnDims& d) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "B%lld S%lld Hq%lld Hkv%lld Dh%lld%s", static_cast<long long>(d.batch),
                static_cast<long long>(d.seqlen), static_cast<long long>(d.q_heads),
                static_cast<long long>(d.kv_heads), static_cast<long long>(d.head_dim), d.qkv_bf16 ? " bf16 qkv" : "");
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
    if (d.qkv_bf16)
      for (AVec* x : {&q, &k, &v})
        for (float& e : *x) e = sim::round_bf16_hd(e);
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

// The CPU's backward from its forward, accumulating (+=) into random
// gradients (g0, which the kernels start from too).
struct CpuBackward {
  AVec dq0, dk0, dv0, dq, dk, dv;
};
CpuBackward cpu_backward(const Inputs& in, const CpuForward& f, uint64_t seed) {
  CpuBackward g{aligned(randn(in.q.size(), seed + 4, 0.1f)), aligned(randn(in.k.size(), seed + 5, 0.1f)),
                aligned(randn(in.v.size(), seed + 6, 0.1f)), {}, {}, {}};
  g.dq = g.dq0, g.dk = g.dk0, g.dv = g.dv0;
  attention_backward(g.dq.data(), g.dk.data(), g.dv.data(), in.dout.data(), f.out.data(), f.lse.data(), in.q.data(),
                     in.k.data(), in.v.data(), in.d);
  return g;
}

// The RunErr evaluations of the forward (out, lse) and of the backward (dq,
// dk, dv) of one family: blocks (the CPU's algorithm with the CPU's
// blocking by default: the item functions' steps, the products bounded in
// any order) or rows.
enum class Family { blocks, rows };
struct ForwardBound {
  Bound out, lse;
};
ForwardBound forward_bound(Family fam, const Inputs& in, const AttnBlocking& block = attn_cpu_blocking()) {
  const AttnDims& d = in.d;
  const Bound rq = to<RunErr>(in.q), rk = to<RunErr>(in.k), rv = to<RunErr>(in.v);
  ForwardBound r{Bound(in.q.size()), Bound(in.lse_size())};
  if (fam == Family::blocks) {
    Bound rscratch(static_cast<size_t>(attention_blocks_forward_scratch(d, block)));
    if (block.bf16_pieces)
      attention_blocks_forward_launches(sim::HostLaunch{}, test::RunErrSplitGemm{kOnDevice}, r.out.data(),
                                        r.lse.data(), rq.data(), rk.data(), rv.data(), d, block, rscratch.data());
    else
      attention_blocks_forward_launches(sim::HostLaunch{}, LoopGemm<test::RunErrGemm>{}, r.out.data(), r.lse.data(),
                                        rq.data(), rk.data(), rv.data(), d, block, rscratch.data());
  } else {
    attention_rows_forward_launches(sim::HostLaunch{}, r.out.data(), r.lse.data(), rq.data(), rk.data(), rv.data(),
                                    d);
  }
  return r;
}
struct BackwardBound {
  Bound dq, dk, dv;
};
BackwardBound backward_bound(Family fam, const Inputs& in, const CpuForward& f, const CpuBackward& g,
                             const AttnBlocking& block = attn_cpu_blocking()) {
  const AttnDims& d = in.d;
  const Bound rq = to<RunErr>(in.q), rk = to<RunErr>(in.k), rv = to<RunErr>(in.v), rdout = to<RunErr>(in.dout),
              rout = to<RunErr>(f.out), rlse = to<RunErr>(f.lse);
  BackwardBound r{to<RunErr>(g.dq0), to<RunErr>(g.dk0), to<RunErr>(g.dv0)};
  if (fam == Family::blocks) {
    Bound rscratch(static_cast<size_t>(attention_blocks_backward_scratch(d, block)));
    if (block.bf16_pieces)
      attention_blocks_backward_launches(sim::HostLaunch{}, test::RunErrSplitGemm{kOnDevice}, r.dq.data(),
                                         r.dk.data(), r.dv.data(), rdout.data(), rout.data(), rlse.data(), rq.data(),
                                         rk.data(), rv.data(), d, block, rscratch.data());
    else
      attention_blocks_backward_launches(sim::HostLaunch{}, LoopGemm<test::RunErrGemm>{}, r.dq.data(), r.dk.data(),
                                         r.dv.data(), rdout.data(), rout.data(), rlse.data(), rq.data(), rk.data(),
                                         rv.data(), d, block, rscratch.data());
  } else {
    Bound rscratch(static_cast<size_t>(attention_rows_backward_scratch(d)));
    attention_rows_backward_launches(sim::HostLaunch{}, r.dq.data(), r.dk.data(), r.dv.data(), rdout.data(),
                                     rout.data(), rlse.data(), rq.data(), rk.data(), rv.data(), d, rscratch.data());
  }
  return r;
}

// Every shape with fresh inputs (seeds from seed on), the CPU's forward of
// them, and a name for the messages.
struct Case {
  Inputs in;
  CpuForward f;
  std::string what;
  uint64_t seed;
};
std::vector<Case> cases(uint64_t seed, const std::string& what) {
  std::vector<Case> all;
  for (const AttnDims& d : kShapes) {
    Inputs in(d, seed += 10);
    CpuForward f = cpu_forward(in);
    all.push_back({std::move(in), std::move(f), what + " " + name_of(d), seed});
  }
  return all;
}

// The block kernels (the emulated backend's with the CPU's blocking, the
// CUDA backend's with attn_device_blocking): with the CPU's blocking in the
// emulation (LoopGemm<SerialGemm>) they equal the CPU bit for bit, on a
// device (the products cuBLASLt's) they are within 4 u E of it, E the CPU
// algorithm's bound; with other blockings (another grouping of the
// backward's sums over query rows, one product per block; the forward's
// row sums in parts) within the budget of two algorithms, each bounded by
// its own RunErr run. With products on bfloat16 pieces
// (models/split_gemm.hpp) the own bound is RunErrSplitGemm's: in the
// emulation (double sums of the pieces' products) tight enough that a
// piece or pair left out shows (2^-16 of a term against a few u), on a
// device the tensor cores' truncating accumulation. The scratch is poisoned (NaN), so a
// read of an element no launch wrote shows; a second run on a device gives
// the same bits (fixed cuBLASLt algorithms, no atomics).
std::vector<AttnBlocking> blockings(const AttnDims& d) {
  AttnBlocking device_fp32 = attn_device_blocking(d);
  device_fp32.bf16_pieces = false;
  return {attn_cpu_blocking(),    {32, 0},         {7, 0}, {d.seqlen, 0},          {kQueryBlock, 16}, {32, 5},
          {kQueryBlock, 0, true}, {7, 5, true},    device_fp32, attn_device_blocking(d)};
}
std::string name_of(const AttnBlocking& k) {
  return "blocks of " + std::to_string(k.rows) + " rows, parts of " + std::to_string(k.segment) + " keys" +
         (k.bf16_pieces ? ", products on bf16 pieces" : "");
}
bool is_cpu_blocking(const AttnBlocking& k) {
  const AttnBlocking c = attn_cpu_blocking();
  return k.rows == c.rows && k.segment == c.segment && k.bf16_pieces == c.bf16_pieces;
}
// One result of the block kernels against the CPU's: compare() at the CPU's
// blocking (own null), else the budget of two algorithms, own the
// blocking's RunErr bound.
void compare_blocks(const Vec& got, const Vec& cpu, const Bound& cpu_bound, const Bound* own, const std::string& what) {
  if (own) compare_reordered(got, cpu, *own, cpu_bound, what);
  else compare(got, cpu, cpu_bound, what);
}

TEST(AttentionBlockKernels, Forward) {
  EXMY_REQUIRE_CUDA();
  for (const Case& c : cases(40, "attention forward blocks")) {
    const auto& [in, f, what0, seed] = c;
    const AttnDims& d = in.d;
    const ForwardBound cpu = forward_bound(Family::blocks, in);
    for (const AttnBlocking& block : blockings(d)) {
      const std::string what = what0 + " " + name_of(block);
      const Vec nan(static_cast<size_t>(attention_blocks_forward_scratch(d, block)), std::nanf(""));
      Buffer kq(in.q), kk(in.k), kv(in.v), kout(Vec(f.out.size(), -1.0f)), klse(Vec(f.lse.size(), -1.0f)),
          scratch(nan);
      KERNEL(attention_blocks_forward)(kout.ptr(), klse.ptr(), kq.ptr(), kk.ptr(), kv.ptr(), d, block, scratch.ptr());
      const Vec out = kout.get(), lse = klse.get();
      const std::optional<ForwardBound> own =
          is_cpu_blocking(block) ? std::nullopt : std::optional(forward_bound(Family::blocks, in, block));
      compare_blocks(out, plain(f.out), cpu.out, own ? &own->out : nullptr, what + " out");
      compare_blocks(lse, plain(f.lse), cpu.lse, own ? &own->lse : nullptr, what + " lse");
      if (kOnDevice) {
        Buffer scratch2(nan);
        KERNEL(attention_blocks_forward)(kout.ptr(), klse.ptr(), kq.ptr(), kk.ptr(), kv.ptr(), d, block,
                                         scratch2.ptr());
        expect_bits(kout.get(), out, what + " out, run twice");
        expect_bits(klse.get(), lse, what + " lse, run twice");
      }
    }
  }
}

TEST(AttentionBlockKernels, BackwardAccumulates) {
  EXMY_REQUIRE_CUDA();
  for (const Case& c : cases(900, "attention backward blocks")) {
    const auto& [in, f, what0, seed] = c;
    const AttnDims& d = in.d;
    const CpuBackward g = cpu_backward(in, f, seed);
    const BackwardBound cpu = backward_bound(Family::blocks, in, f, g);
    for (const AttnBlocking& block : blockings(d)) {
      const std::string what = what0 + " " + name_of(block);
      // From the CPU's saved output and log-sum-exp, so that only the
      // backward is compared.
      const Vec nan(static_cast<size_t>(attention_blocks_backward_scratch(d, block)), std::nanf(""));
      Buffer kq(in.q), kk(in.k), kv(in.v), kdout(in.dout), kout(f.out), klse(f.lse), kdq(g.dq0), kdk(g.dk0),
          kdv(g.dv0), scratch(nan);
      KERNEL(attention_blocks_backward)(kdq.ptr(), kdk.ptr(), kdv.ptr(), kdout.ptr(), kout.ptr(), klse.ptr(),
                                        kq.ptr(), kk.ptr(), kv.ptr(), d, block, scratch.ptr());
      const Vec dq = kdq.get(), dk = kdk.get(), dv = kdv.get();
      const std::optional<BackwardBound> own =
          is_cpu_blocking(block) ? std::nullopt : std::optional(backward_bound(Family::blocks, in, f, g, block));
      compare_blocks(dq, plain(g.dq), cpu.dq, own ? &own->dq : nullptr, what + " dq");
      compare_blocks(dk, plain(g.dk), cpu.dk, own ? &own->dk : nullptr, what + " dk");
      compare_blocks(dv, plain(g.dv), cpu.dv, own ? &own->dv : nullptr, what + " dv");
      if (kOnDevice) {
        Buffer kdq2(g.dq0), kdk2(g.dk0), kdv2(g.dv0), scratch2(nan);
        KERNEL(attention_blocks_backward)(kdq2.ptr(), kdk2.ptr(), kdv2.ptr(), kdout.ptr(), kout.ptr(), klse.ptr(),
                                          kq.ptr(), kk.ptr(), kv.ptr(), d, block, scratch2.ptr());
        expect_bits(kdq2.get(), dq, what + " dq, run twice");
        expect_bits(kdk2.get(), dk, what + " dk, run twice");
        expect_bits(kdv2.get(), dv, what + " dv, run twice");
      }
    }
  }
}

// The device's block size: about a quarter of the sequence in multiples of
// kQueryBlock, the whole of a short one, one scratch array within 128 MiB.
TEST(AttentionBlockKernels, DeviceBlockRows) {
  const auto rows = [](int64_t S, int64_t Hkv) {
    return attn_device_block_rows({.batch = 1, .seqlen = S, .q_heads = 4 * Hkv, .kv_heads = Hkv, .head_dim = 128});
  };
  EXPECT_EQ(rows(4096, 2), 1024);
  EXPECT_EQ(rows(4096, 8), 1024);   // 8 x 1024 x 4096 floats: 128 MiB
  EXPECT_EQ(rows(8192, 8), 512);    // a quarter would be 256 MiB
  EXPECT_EQ(rows(100, 2), 64);
  EXPECT_EQ(rows(40, 2), 40);
  EXPECT_EQ(rows(1 << 20, 8), 64);  // never below kQueryBlock
}

// The row kernels (the CUDA backend's) within the budget of the CPU; on a
// device, a second run gives the same bits (no atomics, fixed orders).
TEST(AttentionRowKernels, ForwardWithinBudget) {
  EXMY_REQUIRE_CUDA();
  for (const Case& c : cases(40, "attention forward rows")) {
    const auto& [in, f, what, seed] = c;
    const AttnDims& d = in.d;
    Buffer kq(in.q), kk(in.k), kv(in.v), kout(Vec(f.out.size(), -1.0f)), klse(Vec(f.lse.size(), -1.0f));
    KERNEL(attention_rows_forward)(kout.ptr(), klse.ptr(), kq.ptr(), kk.ptr(), kv.ptr(), d);
    const Vec out = kout.get(), lse = klse.get();
    const ForwardBound rows = forward_bound(Family::rows, in), items = forward_bound(Family::blocks, in);
    compare_reordered(out, plain(f.out), rows.out, items.out, what + " out");
    compare_reordered(lse, plain(f.lse), rows.lse, items.lse, what + " lse");
    if (kOnDevice) {
      KERNEL(attention_rows_forward)(kout.ptr(), klse.ptr(), kq.ptr(), kk.ptr(), kv.ptr(), d);
      expect_bits(kout.get(), out, what + " out, run twice");
      expect_bits(klse.get(), lse, what + " lse, run twice");
    }
  }
}

TEST(AttentionRowKernels, BackwardWithinBudgetAndAccumulates) {
  EXMY_REQUIRE_CUDA();
  for (const Case& c : cases(900, "attention backward rows")) {
    const auto& [in, f, what, seed] = c;
    const AttnDims& d = in.d;
    const CpuBackward g = cpu_backward(in, f, seed);
    // From the CPU's saved output and log-sum-exp, so that only the backward
    // is compared; the scratch (D, the parts of dK and dV) poisoned, so a
    // read of an unwritten element shows.
    const Vec nan(static_cast<size_t>(attention_rows_backward_scratch(d)), std::nanf(""));
    Buffer kq(in.q), kk(in.k), kv(in.v), kdout(in.dout), kout(f.out), klse(f.lse), kdq(g.dq0), kdk(g.dk0),
        kdv(g.dv0), scratch(nan);
    KERNEL(attention_rows_backward)(kdq.ptr(), kdk.ptr(), kdv.ptr(), kdout.ptr(), kout.ptr(), klse.ptr(), kq.ptr(),
                                    kk.ptr(), kv.ptr(), d, scratch.ptr());
    const Vec dq = kdq.get(), dk = kdk.get(), dv = kdv.get();
    const BackwardBound rows = backward_bound(Family::rows, in, f, g), items = backward_bound(Family::blocks, in, f, g);
    compare_reordered(dq, plain(g.dq), rows.dq, items.dq, what + " dq");
    compare_reordered(dk, plain(g.dk), rows.dk, items.dk, what + " dk");
    compare_reordered(dv, plain(g.dv), rows.dv, items.dv, what + " dv");
    if (kOnDevice) {
      Buffer kdq2(g.dq0), kdk2(g.dk0), kdv2(g.dv0), scratch2(nan);
      KERNEL(attention_rows_backward)(kdq2.ptr(), kdk2.ptr(), kdv2.ptr(), kdout.ptr(), kout.ptr(), klse.ptr(),
                                      kq.ptr(), kk.ptr(), kv.ptr(), d, scratch2.ptr());
      expect_bits(kdq2.get(), dq, what + " dq, run twice");
      expect_bits(kdk2.get(), dk, what + " dk, run twice");
      expect_bits(kdv2.get(), dv, what + " dv, run twice");
    }
  }
}

// A head wider than a row thread's arrays is refused before any launch.
TEST(AttentionRowKernels, RefusesHeadsWiderThanTheRowArrays) {
  EXMY_REQUIRE_CUDA();
  const AttnDims d{.batch = 1, .seqlen = 4, .q_heads = 2, .kv_heads = 1, .head_dim = kAttnRowMaxDim + 8};
  try {
    KERNEL(attention_rows_forward)(nullptr, nullptr, nullptr, nullptr, nullptr, d);
    FAIL() << "head_dim " << d.head_dim << " was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("head_dim up to 128 (got 136)"), std::string::npos) << e.what();
  }
}

// The RunErr evaluation of the fused forward (models/attention_fused.hpp),
// row by row in the kernel's steps and orders: per key tile of 64 each
// score a product on pieces (q, k in fused_pieces each; run_err_split over
// the padded head, K = fused_head_dim) times the scale; the tile's max; the
// running max and the rescaling of l's four parts (the quad's lanes: lane
// t holds keys 8 nt + 2 t (+1)) and of o; each part's probabilities added
// in key order; o += P V (P in three pieces, V in fused_pieces; chained
// from the rescaled o). At the end l = (l0 + l1) + (l2 + l3), out = o
// times 1/l, lse = m + log l. Sums as the emulation forms them
// (SplitSum::mma_chain) or as a device's tensor cores may (SplitSum::device).
ForwardBound fused_bound(const Inputs& in) {
  const AttnDims& d = in.d;
  const int64_t S = d.seqlen, Dh = d.head_dim, Hq = d.q_heads, rep = Hq / d.kv_heads, ldq = Hq * Dh;
  const int64_t ldkv = d.kv_heads * Dh, width = fused_head_dim(Dh), keys = fused::kKeys;
  const int P = fused_pieces(d);
  const test::SplitSum how = kOnDevice ? test::SplitSum::device : test::SplitSum::mma_chain;
  const Bound rq = to<RunErr>(in.q), rk = to<RunErr>(in.k), rv = to<RunErr>(in.v);
  const RunErr scale = attn_scale<RunErr>(d);
  ForwardBound r{Bound(in.q.size()), Bound(in.lse_size())};
  for (int64_t b = 0; b < d.batch; ++b)
    for (int64_t h = 0; h < Hq; ++h)
      for (int64_t i = 0; i < S; ++i) {
        const int64_t kvh = h / rep, i0 = i / fused::kRows * fused::kRows;
        const int64_t kend = std::min(i0 + fused::kRows, S);
        const RunErr* const qi = rq.data() + (b * S + i) * ldq + h * Dh;
        RunErr m, l[4];
        Bound o(static_cast<size_t>(Dh)), p(static_cast<size_t>(keys));
        for (int64_t j0 = 0; j0 < kend; j0 += keys) {
          const int64_t n = std::min(keys, S - j0);
          RunErr mt(-INFINITY);
          for (int64_t jj = 0; jj < keys; ++jj) {
            const int64_t j = j0 + jj;
            p[jj] = RunErr(0);
            if (j > i || j >= S) continue;
            const test::RunErrDot dd =
                test::run_err_dot({}, qi, 0, sim::Op::N, rk.data() + (b * S + j) * ldkv + kvh * Dh, 0, sim::Op::T, 0,
                                  0, Dh);
            p[jj] = test::run_err_split(dd, RunErr(0), false, P, P, width, how) * scale;
            mt = sim::hd_max(mt, p[jj]);
          }
          if (j0 == 0) {
            m = mt;
          } else {
            const RunErr m1 = sim::hd_max(m, mt), alpha = sim::hd_exp(m - m1);
            for (RunErr& x : l) x *= alpha;
            for (RunErr& x : o) x *= alpha;
            m = m1;
          }
          for (int64_t jj = 0; jj < keys; ++jj)
            if (j0 + jj <= i && j0 + jj < S) p[jj] = sim::hd_exp(p[jj] - m);
          for (int t = 0; t < 4; ++t)
            for (int nt = 0; nt < fused::kNt; ++nt)
              for (int e = 0; e < 2; ++e) l[t] += p[nt * 8 + 2 * t + e];
          for (int64_t c = 0; c < Dh; ++c) {
            const test::RunErrDot dd = test::run_err_dot({o[c].v, o[c].e}, p.data(), 0, sim::Op::N,
                                                         rv.data() + (b * S + j0) * ldkv + kvh * Dh + c, ldkv,
                                                         sim::Op::N, 0, 0, n);
            o[c] = test::run_err_split(dd, o[c], true, fused::kPPieces, P, keys, how);
          }
        }
        const RunErr lsum = (l[0] + l[1]) + (l[2] + l[3]), inv = RunErr(1) / lsum;
        for (int64_t c = 0; c < Dh; ++c) r.out[(b * S + i) * ldq + h * Dh + c] = o[c] * inv;
        r.lse[(b * Hq + h) * S + i] = m + sim::hd_log(lsum);
      }
  return r;
}

// The fused forward within the budget of two algorithms (its RunErr bound
// and the CPU's) over every shape: head widths 8 to 128 (padded to 32, 64,
// 128), q, k, v in three pieces and in one, sequences shorter than a tile,
// one tile, several with a short last one, GQA; in the emulation also each
// output within its own bound of the exact value. On a device a second run
// gives the same bits.
TEST(AttentionFusedKernel, ForwardWithinBudget) {
  EXMY_REQUIRE_CUDA();
  for (const Case& c : cases(40, "attention forward fused")) {
    const auto& [in, f, what, seed] = c;
    const AttnDims& d = in.d;
    Buffer kq(in.q), kk(in.k), kv(in.v), kout(Vec(f.out.size(), -1.0f)), klse(Vec(f.lse.size(), -1.0f));
    KERNEL(attention_fused_forward)(kout.ptr(), klse.ptr(), kq.ptr(), kk.ptr(), kv.ptr(), d);
    const Vec out = kout.get(), lse = klse.get();
    const ForwardBound own = fused_bound(in), cpu = forward_bound(Family::blocks, in);
    compare_reordered(out, plain(f.out), own.out, cpu.out, what + " out");
    compare_reordered(lse, plain(f.lse), own.lse, cpu.lse, what + " lse");
    if (kOnDevice) {
      KERNEL(attention_fused_forward)(kout.ptr(), klse.ptr(), kq.ptr(), kk.ptr(), kv.ptr(), d);
      expect_bits(kout.get(), out, what + " out, run twice");
      expect_bits(klse.get(), lse, what + " lse, run twice");
    }
  }
}

// The RunErr evaluation of the fused backward, per output in its kernels'
// order: D_i as the CPU's; each (i, j)'s p and dS from the score and dP as
// products on pieces (q, k in fused_pieces; dO in three, v in
// fused_pieces) over the padded head; dQ's sum over the key tiles, dV's
// and dK's over the kv head's query heads in order and each one's query
// tiles from the diagonal on, a tile's product (P or dS in three pieces,
// dO in three, K and Q in fused_pieces) chained from the sum so far; at the
// end one addition into the gradient.
BackwardBound fused_backward_bound(const Inputs& in, const CpuForward& f, const CpuBackward& g) {
  const AttnDims& d = in.d;
  const int64_t S = d.seqlen, Dh = d.head_dim, Hq = d.q_heads, rep = Hq / d.kv_heads, ldq = Hq * Dh;
  const int64_t ldkv = d.kv_heads * Dh, width = fused_head_dim(Dh), tile = fused::kKeys;
  const int P = fused_pieces(d), P3 = fused::kPPieces;
  const test::SplitSum how = kOnDevice ? test::SplitSum::device : test::SplitSum::mma_chain;
  const Bound rq = to<RunErr>(in.q), rk = to<RunErr>(in.k), rv = to<RunErr>(in.v), rdo = to<RunErr>(in.dout),
              rout = to<RunErr>(f.out), rlse = to<RunErr>(f.lse);
  const RunErr scale = attn_scale<RunErr>(d);
  BackwardBound r{to<RunErr>(g.dq0), to<RunErr>(g.dk0), to<RunErr>(g.dv0)};
  Bound D(in.lse_size());
  for (int64_t b = 0; b < d.batch; ++b)
    for (int64_t h = 0; h < Hq; ++h)
      for (int64_t i = 0; i < S; ++i) {
        const int64_t at = (b * S + i) * ldq + h * Dh;
        D[(b * Hq + h) * S + i] = attn_row_dot(rdo.data() + at, rout.data() + at, Dh);
      }
  // p and dS of query i (head h) and key j, zeros where masked
  const auto p_ds = [&](int64_t b, int64_t h, int64_t i, int64_t j, RunErr& p, RunErr& ds) {
    p = ds = RunErr(0);
    if (i >= S || j > i) return;
    const int64_t qa = (b * S + i) * ldq + h * Dh, ka = (b * S + j) * ldkv + (h / rep) * Dh, row = (b * Hq + h) * S;
    const auto dot = [&](const Bound& x, const Bound& y, int px, int py) {
      const test::RunErrDot dd =
          test::run_err_dot({}, x.data() + qa, 0, sim::Op::N, y.data() + ka, 0, sim::Op::T, 0, 0, Dh);
      return test::run_err_split(dd, RunErr(0), false, px, py, width, how);
    };
    p = attn_prob_saved(dot(rq, rk, P, P), i, j, scale, rlse[row + i]);
    ds = attn_dscore(p, dot(rdo, rv, P3, P), i, j, D[row + i], scale);
  };
  // acc[c] (c < Dh) chained with a tile's product: x (tile values) times the
  // rows of y from `at` (row stride ld), n of them
  const auto chain = [&](Bound& acc, const Bound& x, const Bound& y, int64_t at, int64_t ld, int64_t n, int py) {
    for (int64_t c = 0; c < Dh; ++c) {
      const test::RunErrDot dd =
          test::run_err_dot({acc[c].v, acc[c].e}, x.data(), 0, sim::Op::N, y.data() + at + c, ld, sim::Op::N, 0, 0, n);
      acc[c] = test::run_err_split(dd, acc[c], true, P3, py, tile, how);
    }
  };
  Bound p(static_cast<size_t>(tile)), ds(p.size()), acc(static_cast<size_t>(Dh)), acc2(acc.size());
  for (int64_t b = 0; b < d.batch; ++b)
    for (int64_t h = 0; h < Hq; ++h)
      for (int64_t i = 0; i < S; ++i) {
        std::fill(acc.begin(), acc.end(), RunErr(0));
        const int64_t kend = std::min(i / fused::kRows * fused::kRows + fused::kRows, S);
        for (int64_t j0 = 0; j0 < kend; j0 += tile) {
          for (int64_t jj = 0; jj < tile; ++jj) p_ds(b, h, i, j0 + jj, p[jj], ds[jj]);
          chain(acc, ds, rk, (b * S + j0) * ldkv + (h / rep) * Dh, ldkv, std::min(tile, S - j0), P);
        }
        for (int64_t c = 0; c < Dh; ++c) r.dq[(b * S + i) * ldq + h * Dh + c] += acc[c];
      }
  for (int64_t b = 0; b < d.batch; ++b)
    for (int64_t kvh = 0; kvh < d.kv_heads; ++kvh)
      for (int64_t j = 0; j < S; ++j) {
        std::fill(acc.begin(), acc.end(), RunErr(0));
        std::fill(acc2.begin(), acc2.end(), RunErr(0));
        for (int64_t h = kvh * rep; h < (kvh + 1) * rep; ++h)
          for (int64_t i0 = j / tile * tile; i0 < S; i0 += fused::kRows) {
            for (int64_t ii = 0; ii < fused::kRows; ++ii) p_ds(b, h, i0 + ii, j, p[ii], ds[ii]);
            const int64_t at = (b * S + i0) * ldq + h * Dh, n = std::min<int64_t>(fused::kRows, S - i0);
            chain(acc, p, rdo, at, ldq, n, P3);
            chain(acc2, ds, rq, at, ldq, n, P);
          }
        for (int64_t c = 0; c < Dh; ++c) {
          r.dv[(b * S + j) * ldkv + kvh * Dh + c] += acc[c];
          r.dk[(b * S + j) * ldkv + kvh * Dh + c] += acc2[c];
        }
      }
  return r;
}

// The fused backward (from the CPU's out and lse), accumulating into random
// gradients, within the budget of two algorithms over every shape; its
// scratch (D) poisoned; on a device a second run gives the same bits.
TEST(AttentionFusedKernel, BackwardWithinBudgetAndAccumulates) {
  EXMY_REQUIRE_CUDA();
  for (const Case& c : cases(900, "attention backward fused")) {
    const auto& [in, f, what, seed] = c;
    const AttnDims& d = in.d;
    const CpuBackward g = cpu_backward(in, f, seed);
    const Vec nan(static_cast<size_t>(attention_fused_backward_scratch(d)), std::nanf(""));
    Buffer kq(in.q), kk(in.k), kv(in.v), kdout(in.dout), kout(f.out), klse(f.lse), kdq(g.dq0), kdk(g.dk0),
        kdv(g.dv0), scratch(nan);
    KERNEL(attention_fused_backward)(kdq.ptr(), kdk.ptr(), kdv.ptr(), kdout.ptr(), kout.ptr(), klse.ptr(), kq.ptr(),
                                     kk.ptr(), kv.ptr(), d, scratch.ptr());
    const Vec dq = kdq.get(), dk = kdk.get(), dv = kdv.get();
    const BackwardBound own = fused_backward_bound(in, f, g), cpu = backward_bound(Family::blocks, in, f, g);
    compare_reordered(dq, plain(g.dq), own.dq, cpu.dq, what + " dq");
    compare_reordered(dk, plain(g.dk), own.dk, cpu.dk, what + " dk");
    compare_reordered(dv, plain(g.dv), own.dv, cpu.dv, what + " dv");
    if (kOnDevice) {
      Buffer kdq2(g.dq0), kdk2(g.dk0), kdv2(g.dv0), scratch2(nan);
      KERNEL(attention_fused_backward)(kdq2.ptr(), kdk2.ptr(), kdv2.ptr(), kdout.ptr(), kout.ptr(), klse.ptr(),
                                       kq.ptr(), kk.ptr(), kv.ptr(), d, scratch2.ptr());
      expect_bits(kdq2.get(), dq, what + " dq, run twice");
      expect_bits(kdk2.get(), dk, what + " dk, run twice");
      expect_bits(kdv2.get(), dv, what + " dv, run twice");
    }
  }
}

// A head wider than the kernel takes is refused before any launch.
TEST(AttentionFusedKernel, RefusesHeadsWiderThan128) {
  EXMY_REQUIRE_CUDA();
  const AttnDims d{.batch = 1, .seqlen = 4, .q_heads = 2, .kv_heads = 1, .head_dim = 136};
  EXPECT_FALSE(attention_fused_applies(d));
  try {
    KERNEL(attention_fused_forward)(nullptr, nullptr, nullptr, nullptr, nullptr, d);
    FAIL() << "head_dim " << d.head_dim << " was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("head_dim 136 is wider than 128"), std::string::npos) << e.what();
  }
}

#if defined(EXMY_TEST_EMULATED)
// SplitGemm (models/split_gemm.hpp) on its own, on the host.

// The fused kernels' pieces, on the host (models/attention_fused.hpp),
// where the bound of their results is too loose to see a piece: staging puts
// Q's, K's, V's and dO's pieces where the fragments read them,
// summing to the floats exactly, zeros past the sequence and the head; the
// probabilities' A fragments hold the pieces of the right scores (by the
// PTX ISA's A layout, sim::mma_a_coord, against the C layout the scores
// are in); the pairs of pieces are split_pairs'.
double piece_sum(const uint16_t* p, int pieces, int64_t stride) {
  double x = 0;
  for (int i = 0; i < pieces; ++i) x += static_cast<double>(sim::bf16_value(p[i * stride]));
  return x;
}
TEST(AttentionFusedKernel, StagesPiecesWhereTheFragmentsReadThem) {
  constexpr int kDh = 64, kP = 3;
  using L = FusedBwdSmem<kDh, kP>;  // the forward's layout (Q, K, V), then dO
  const AttnDims d{.batch = 2, .seqlen = 100, .q_heads = 4, .kv_heads = 2, .head_dim = 40};
  const Inputs in(d, 3);
  FusedBwdArgs a;
  a.dout = in.dout.data(), a.q = in.q.data(), a.k = in.k.data(), a.v = in.v.data(), a.d = d;
  const int64_t b = 1, h = 3, kvh = 1, i0 = 64, j0 = 64;  // the last tile: rows 64..99 exist
  std::vector<uint16_t> sm(L::elems, 0xffff);
  for (int tid = 0; tid < fused::kThreads; ++tid) {
    fused_bwd_stage_q<kDh, kP, fused::kThreads>(tid, a, b, h, i0, sm.data());
    fused_stage_kv<kDh, kP, L>(tid, a, b, kvh, j0, sm.data());
  }
  const int64_t ldq = d.q_heads * d.head_dim, ldkv = d.kv_heads * d.head_dim;
  for (int r = 0; r < fused::kRows; ++r)
    for (int c = 0; c < kDh; ++c) {
      const bool in_q = i0 + r < d.seqlen && c < d.head_dim, in_kv = j0 + r < d.seqlen && c < d.head_dim;
      const int64_t qa = (b * d.seqlen + i0 + r) * ldq + h * d.head_dim + c;
      const int64_t ka = (b * d.seqlen + j0 + r) * ldkv + kvh * d.head_dim + c;
      const double q = in_q ? in.q[qa] : 0.0, dout = in_q ? in.dout[qa] : 0.0;
      const double k = in_kv ? in.k[ka] : 0.0, v = in_kv ? in.v[ka] : 0.0;
      ASSERT_EQ(piece_sum(sm.data() + L::q_at + r * L::ld + c, kP, L::rows), q) << r << " " << c;
      ASSERT_EQ(piece_sum(sm.data() + L::k_at + r * L::ld + c, kP, L::rows), k) << r << " " << c;
      ASSERT_EQ(piece_sum(sm.data() + L::v_at + r * L::ld + c, kP, L::rows), v) << r << " " << c;
      ASSERT_EQ(piece_sum(sm.data() + L::do_at + r * L::ld + c, fused::kPPieces, L::rows), dout) << r << " " << c;
    }
}
TEST(AttentionFusedKernel, ProbabilityFragmentsHoldTheScoresPieces) {
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> u01(0.0f, 1.0f);
  for (int lane = 0; lane < 32; ++lane) {
    FusedRegs<32> R;
    for (auto& row : R.s)
      for (float& x : row) x = u01(rng);
    for (int kk = 0; kk < fused::kKeys / 16; ++kk) {
      uint32_t pf[fused::kPPieces][4];
      fused_p_frags(R.s, kk, pf);
      for (int i = 0; i < 8; ++i) {
        int row, col;
        sim::mma_a_coord(lane, i, row, col);
        // the C fragment's element holding (row, key 16 kk + col)
        const int nt = 2 * kk + col / 8, e = (row >= 8 ? 2 : 0) + (col % 2);
        ASSERT_EQ(row % 8, lane / 4);
        ASSERT_EQ(col % 8 / 2, lane % 4);
        double x = 0;
        for (int p = 0; p < fused::kPPieces; ++p) {
          const uint32_t reg = pf[p][i / 2];
          x += static_cast<double>(sim::bf16_value(static_cast<uint16_t>(i % 2 ? reg >> 16 : reg & 0xffffu)));
        }
        ASSERT_EQ(x, static_cast<double>(R.s[nt][e])) << "lane " << lane << " kk " << kk << " element " << i;
      }
    }
  }
}
TEST(AttentionFusedKernel, PairsAreSplitPairs) {
  const auto pairs = []<int kPa, int kPb>() {
    std::vector<std::pair<int, int>> v;
    fused_for_pairs<kPa, kPb>([&](int i, int j) { v.emplace_back(i, j); });
    return v;
  };
  const auto expected = [](int pa, int pb) {
    const SplitPairs p = split_pairs(pa, pb);
    std::vector<std::pair<int, int>> v;
    for (int i = 0; i < p.n; ++i) v.emplace_back(p.a[i], p.b[i]);
    return v;
  };
  EXPECT_EQ((pairs.operator()<1, 1>()), expected(1, 1));
  EXPECT_EQ((pairs.operator()<3, 1>()), expected(3, 1));
  EXPECT_EQ((pairs.operator()<3, 3>()), expected(3, 3));
}

// The three pieces add up to the float exactly down to 2^-110 (and lose at
// most 2^-134 below), up to FLT_MAX, with the magnitudes the bound assumes;
// a bfloat16 value is its one piece.
TEST(SplitGemm, PiecesSumToTheFloat) {
  std::mt19937 rng(5);
  std::uniform_int_distribution<uint32_t> bits(0, 0xff7fffffu);  // every finite positive float and more
  const uint32_t edges[] = {0, 1, 0x7fff, 0x8000, 0x007fffff, 0x00800000, 0x09000000, 0x08ffffff, 0x3f800000,
                            0x3f808080, 0x7f7f7fff, 0x7f7f8000, 0x7f7fffff};
  for (int i = 0; i < 200000 + 26; ++i) {
    const uint32_t u = i < 26 ? edges[i / 2] : bits(rng);
    const float x = float_of(u) * (i % 2 ? -1.0f : 1.0f);
    if (!std::isfinite(x)) continue;
    uint16_t p[3];
    bf16_pieces(x, 3, p, 1);
    const double v[3] = {sim::bf16_value(p[0]), sim::bf16_value(p[1]), sim::bf16_value(p[2])};
    const double ax = std::fabs(static_cast<double>(x)), err = std::fabs(v[0] + v[1] + v[2] - x);
    if (ax >= 0x1p-110) ASSERT_EQ(err, 0.0) << x;
    else ASSERT_LE(err, 0x1p-134) << x;
    if (ax < 0x1.ffp127) {  // (nearer FLT_MAX the first piece is x truncated, not rounded up to Inf)
      ASSERT_LE(std::fabs(v[1]), 0x1p-8 * (1 + 0x1p-8) * ax) << x;
      ASSERT_LE(std::fabs(v[2]), 0x1p-16 * ax + 0x1p-134) << x;
    }
    uint16_t one;
    const float b = sim::round_bf16_hd(x);
    bf16_pieces(b, 1, &one, 1);
    if (std::isfinite(b)) {
      ASSERT_EQ(sim::bf16_value(one), b);
    }
  }
}

// Inf and NaN: the first piece, the others +0 (Inf - Inf would make them
// NaN, and a product with an infinite operand NaN instead of Inf).
TEST(SplitGemm, InfAndNaNAreTheirFirstPiece) {
  for (const float x : {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity()}) {
    uint16_t p[3];
    bf16_pieces(x, 3, p, 1);
    EXPECT_EQ(sim::bf16_value(p[0]), x);
    EXPECT_EQ(p[1], 0);
    EXPECT_EQ(p[2], 0);
  }
  uint16_t p[3];
  bf16_pieces(std::nanf(""), 3, p, 1);
  EXPECT_TRUE(std::isnan(sim::bf16_value(p[0])));
  EXPECT_EQ(p[1], 0);
  EXPECT_EQ(p[2], 0);
}

TEST(SplitGemm, KeepsThePairsOfPiecesUpToTwo) {
  const SplitPairs p = split_pairs(3, 3);
  ASSERT_EQ(p.n, 6);
  for (int i = 0; i < p.n; ++i) EXPECT_LE(p.a[i] + p.b[i], 2);
  EXPECT_EQ(p.a[0] + p.b[0], 2);                    // smallest first
  EXPECT_EQ(p.a[5] + p.b[5], 0);                    // (0, 0) last
  EXPECT_EQ(split_pairs(1, 3).n, 3);
  EXPECT_EQ(split_pairs(3, 1).n, 3);
  EXPECT_EQ(split_pairs(1, 1).n, 1);
}

// A launcher and a BF16 product that log what runs, for which way a
// product took.
struct LoggedLaunch {
  std::vector<std::string>* log;
  template <class F>
  void operator()(const char* name, int64_t n, F&& f) const {
    log->push_back(name);
    sim::HostLaunch{}(name, n, f);
  }
};
struct LoggedBf16Gemm {
  std::vector<std::string>* log;
  template <class... Args>
  void operator()(int64_t count, float* C, int64_t ldc, int64_t sc, const uint16_t* A, int64_t lda, int64_t sa,
                  sim::Op opA, const uint16_t* B, int64_t ldb, int64_t sb, sim::Op opB, int64_t M, int64_t N, int64_t K,
                  bool accumulate) const {
    log->push_back("bf16 K " + std::to_string(K));
    HostBf16Gemm{}(count, C, ldc, sc, A, lda, sa, opA, B, ldb, sb, opB, M, N, K, accumulate);
  }
};

// Both ways within the emulation's bound of the exact product, for every
// op and hint; the concatenated way for a large C over a short K, a pair a
// product for a long K; a_again keeps A's pieces only for the same matrix.
TEST(SplitGemm, BothWaysWithinTheBoundAndReuseOnlyTheSameA) {
  std::vector<std::string> log;
  std::vector<uint16_t> scratch(1 << 20);
  const SplitGemm<LoggedLaunch, LoggedBf16Gemm> g{{&log}, {&log}, scratch.data(), static_cast<int64_t>(scratch.size())};
  const int64_t count = 2;
  for (const auto& [M, N, K] : {std::tuple<int64_t, int64_t, int64_t>{37, 45, 7}, {6, 5, 300}})
    for (sim::Op opA : {sim::Op::N, sim::Op::T})
      for (sim::Op opB : {sim::Op::N, sim::Op::T})
        for (const Bf16Operands h : {Bf16Operands{}, Bf16Operands{true, false}, Bf16Operands{false, true}})
          for (bool acc : {false, true}) {
            const std::string what = "M" + std::to_string(M) + " N" + std::to_string(N) + " K" + std::to_string(K) +
                                     (opA == sim::Op::T ? " A^T" : "") + (opB == sim::Op::T ? " B^T" : "") +
                                     (h.a ? " A bf16" : "") + (h.b ? " B bf16" : "") + (acc ? " +=" : "");
            const int64_t lda = (opA == sim::Op::N ? K : M) + 3, ldb = (opB == sim::Op::N ? N : K) + 1, ldc = N + 2;
            const int64_t sa = (opA == sim::Op::N ? M : K) * lda + 5, sb = (opB == sim::Op::N ? K : N) * ldb + 7,
                          sc = M * ldc + 1;
            Vec A = randn(static_cast<size_t>(count * sa), M * 7 + K), B = randn(static_cast<size_t>(count * sb), N),
                C = randn(static_cast<size_t>(count * sc), 3);
            for (float& x : A) x = h.a ? sim::round_bf16_hd(x) : x * 1e-3f;  // various binades
            if (h.b)
              for (float& x : B) x = sim::round_bf16_hd(x);
            const Bound rA = to<RunErr>(A), rB = to<RunErr>(B);
            Bound rC = to<RunErr>(C);
            test::RunErrSplitGemm{false}.hinted(h, count, rC.data(), ldc, sc, rA.data(), lda, sa, opA, rB.data(), ldb,
                                                sb, opB, M, N, K, acc);
            log.clear();
            g.hinted(h, count, C.data(), ldc, sc, A.data(), lda, sa, opA, B.data(), ldb, sb, opB, M, N, K, acc);
            const bool concat = std::count(log.begin(), log.end(), "bf16 K " + std::to_string(K)) == 0;
            EXPECT_EQ(concat, K == 7 && !(h.a && h.b)) << what;  // (a short K and a large C: one product)
            for (int64_t t = 0; t < count; ++t)
              for (int64_t i = 0; i < M; ++i)
                for (int64_t j = 0; j < N; ++j) {
                  const size_t at = static_cast<size_t>(t * sc + i * ldc + j);
                  ASSERT_LE(std::fabs(static_cast<double>(C[at]) - rC[at].v), 2 * kU * rC[at].e + kTiny)
                      << what << " (" << t << ", " << i << ", " << j << ")";
                }
          }
  // a_again: A's pieces kept for the same matrix (no "pieces A" launch),
  // made again for another
  const int64_t M = 6, N = 5, K = 300;
  Vec A = randn(static_cast<size_t>(M * K), 1), A2 = randn(static_cast<size_t>(M * K), 2),
      B = randn(static_cast<size_t>(K * N), 3), C(static_cast<size_t>(M * N)), C2(C.size());
  const auto pieces_a = [&] { return std::count(log.begin(), log.end(), std::string("split_gemm pieces A")); };
  g.hinted({}, 1, C.data(), N, 0, A.data(), K, 0, sim::Op::N, B.data(), N, 0, sim::Op::N, M, N, K, false);
  log.clear();
  g.hinted({false, false, true}, 1, C2.data(), N, 0, A.data(), K, 0, sim::Op::N, B.data(), N, 0, sim::Op::N, M, N, K,
           false);
  EXPECT_EQ(pieces_a(), 0);
  expect_bits(C2, C, "the same product with A's pieces kept");
  log.clear();
  g.hinted({false, false, true}, 1, C2.data(), N, 0, A2.data(), K, 0, sim::Op::N, B.data(), N, 0, sim::Op::N, M, N, K,
           false);
  EXPECT_EQ(pieces_a(), 1);
  g.hinted({}, 1, C.data(), N, 0, A2.data(), K, 0, sim::Op::N, B.data(), N, 0, sim::Op::N, M, N, K, false);
  expect_bits(C2, C, "another A, split again");
}
#endif

#if !defined(EXMY_TEST_EMULATED)
// A timed run's results: every array finite and not all zeros.
void expect_finite_nonzero(const std::vector<Vec>& results) {
  for (const Vec& r : results) {
    bool finite = true, nonzero = false;
    for (float x : r) finite = finite && std::isfinite(x), nonzero = nonzero || x != 0;
    EXPECT_TRUE(finite && nonzero);
  }
}

// The row kernels' time at the GPU proxies' and the 8B's head shape: batch 1,
// 16 query heads on 4 kv heads, sequence 4096, head_dim 128 (printed for
// the device report; checked only for finite, written results).
TEST(AttentionRowKernels, TimesSequence4096) {
  EXMY_REQUIRE_CUDA();
  const AttnDims d{.batch = 1, .seqlen = 4096, .q_heads = 16, .kv_heads = 4, .head_dim = 128};
  const Inputs in(d, 7);
  Buffer kq(in.q), kk(in.k), kv(in.v), kdout(in.dout), kout(Vec(in.q.size(), std::nanf(""))),
      klse(Vec(in.lse_size(), std::nanf(""))), kdq(Vec(in.q.size(), 0.0f)), kdk(Vec(in.k.size(), 0.0f)),
      kdv(Vec(in.v.size(), 0.0f)), scratch(Vec(static_cast<size_t>(attention_rows_backward_scratch(d)), 0.0f));
  const FwdBwdMs ms = time_forward_backward(
      [&] { attention_rows_forward_cuda(kout.ptr(), klse.ptr(), kq.ptr(), kk.ptr(), kv.ptr(), d); },
      [&] {
        attention_rows_backward_cuda(kdq.ptr(), kdk.ptr(), kdv.ptr(), kdout.ptr(), kout.ptr(), klse.ptr(), kq.ptr(),
                                     kk.ptr(), kv.ptr(), d, scratch.ptr());
      });
  // The model's FLOPs of causal attention (models/attention.cpp's count):
  // 4 Dh per (query, key <= query) pair and head forward, twice that back.
  const double pairs = static_cast<double>(d.seqlen) * static_cast<double>(d.seqlen + 1) / 2;
  const double fwd_flops = 4.0 * static_cast<double>(d.head_dim * d.q_heads * d.batch) * pairs;
  std::printf("[attention rows] B1 S4096 Hq16 Hkv4 Dh128: forward %.2f ms (%.1f TFLOP/s), backward %.2f ms "
              "(%.1f TFLOP/s), median of 3\n",
              ms.fwd, fwd_flops / ms.fwd * 1e-9, ms.bwd, 2 * fwd_flops / ms.bwd * 1e-9);
  expect_finite_nonzero({kout.get(), klse.get(), kdq.get(), kdk.get(), kdv.get()});
}

// The block kernels' time at the same shape and the device's block size
// (printed beside the row kernels' for the device report): the products in
// FP32 (EXMY_CUDA_ATTENTION=fp32), and on bfloat16 pieces (the default)
// with q, k, v of FP32 values (three pieces each) and of bfloat16 values
// (the `bf16` policy's: one piece).
TEST(AttentionBlockKernels, TimesSequence4096) {
  EXMY_REQUIRE_CUDA();
  for (const auto& [pieces, bf16_qkv] : {std::pair{false, false}, std::pair{true, false}, std::pair{true, true}}) {
    const AttnDims d{.batch = 1, .seqlen = 4096, .q_heads = 16, .kv_heads = 4, .head_dim = 128, .qkv_bf16 = bf16_qkv};
    AttnBlocking rows = attn_device_blocking(d);
    rows.bf16_pieces = pieces;
    const Inputs in(d, 7);
    Buffer kq(in.q), kk(in.k), kv(in.v), kdout(in.dout), kout(Vec(in.q.size(), std::nanf(""))),
        klse(Vec(in.lse_size(), std::nanf(""))), kdq(Vec(in.q.size(), 0.0f)), kdk(Vec(in.k.size(), 0.0f)),
        kdv(Vec(in.v.size(), 0.0f)),
        scratch(Vec(static_cast<size_t>(attention_blocks_backward_scratch(d, rows)), 0.0f));
    const FwdBwdMs ms = time_forward_backward(
        [&] {
          attention_blocks_forward_cuda(kout.ptr(), klse.ptr(), kq.ptr(), kk.ptr(), kv.ptr(), d, rows, scratch.ptr());
        },
        [&] {
          attention_blocks_backward_cuda(kdq.ptr(), kdk.ptr(), kdv.ptr(), kdout.ptr(), kout.ptr(), klse.ptr(),
                                         kq.ptr(), kk.ptr(), kv.ptr(), d, rows, scratch.ptr());
        });
    const double pairs = static_cast<double>(d.seqlen) * static_cast<double>(d.seqlen + 1) / 2;
    const double fwd_flops = 4.0 * static_cast<double>(d.head_dim * d.q_heads * d.batch) * pairs;
    std::printf("[attention blocks] B1 S4096 Hq16 Hkv4 Dh128, %lld rows a block, products %s: forward %.2f ms "
                "(%.1f TFLOP/s), backward %.2f ms (%.1f TFLOP/s), median of 3\n",
                static_cast<long long>(rows.rows),
                !pieces ? "fp32" : bf16_qkv ? "on bf16 pieces, q k v bf16" : "on bf16 pieces, q k v fp32", ms.fwd,
                fwd_flops / ms.fwd * 1e-9, ms.bwd, 2 * fwd_flops / ms.bwd * 1e-9);
    expect_finite_nonzero({kout.get(), klse.get(), kdq.get(), kdk.get(), kdv.get()});
  }
}

// The fused kernels' time at the same shape, beside the block launches' on
// bfloat16 pieces in the same sitting, q, k, v of FP32 and of bfloat16
// values; the CUDA backend runs them with EXMY_CUDA_ATTENTION=fused.
TEST(AttentionFusedKernel, TimesSequence4096) {
  EXMY_REQUIRE_CUDA();
  for (const bool bf16_qkv : {false, true}) {
    const AttnDims d{.batch = 1, .seqlen = 4096, .q_heads = 16, .kv_heads = 4, .head_dim = 128, .qkv_bf16 = bf16_qkv};
    const AttnBlocking rows = attn_device_blocking(d);
    const Inputs in(d, 7);
    const size_t nscratch = static_cast<size_t>(
        std::max(attention_blocks_backward_scratch(d, rows), attention_fused_backward_scratch(d)));
    Buffer kq(in.q), kk(in.k), kv(in.v), kdout(in.dout), kout(Vec(in.q.size(), std::nanf(""))),
        klse(Vec(in.lse_size(), std::nanf(""))), kdq(Vec(in.q.size(), 0.0f)), kdk(Vec(in.k.size(), 0.0f)),
        kdv(Vec(in.v.size(), 0.0f)), scratch(Vec(nscratch, 0.0f));
    const FwdBwdMs blocks = time_forward_backward(
        [&] {
          attention_blocks_forward_cuda(kout.ptr(), klse.ptr(), kq.ptr(), kk.ptr(), kv.ptr(), d, rows, scratch.ptr());
        },
        [&] {
          attention_blocks_backward_cuda(kdq.ptr(), kdk.ptr(), kdv.ptr(), kdout.ptr(), kout.ptr(), klse.ptr(),
                                         kq.ptr(), kk.ptr(), kv.ptr(), d, rows, scratch.ptr());
        });
    const FwdBwdMs fused = time_forward_backward(
        [&] { attention_fused_forward_cuda(kout.ptr(), klse.ptr(), kq.ptr(), kk.ptr(), kv.ptr(), d); },
        [&] {
          attention_fused_backward_cuda(kdq.ptr(), kdk.ptr(), kdv.ptr(), kdout.ptr(), kout.ptr(), klse.ptr(), kq.ptr(),
                                        kk.ptr(), kv.ptr(), d, scratch.ptr());
        });
    const double pairs = static_cast<double>(d.seqlen) * static_cast<double>(d.seqlen + 1) / 2;
    const double fwd_flops = 4.0 * static_cast<double>(d.head_dim * d.q_heads * d.batch) * pairs;
    std::printf("[attention fused] B1 S4096 Hq16 Hkv4 Dh128, q k v %s: fused forward %.2f ms (%.1f TFLOP/s), "
                "backward %.2f ms (%.1f TFLOP/s); block launches on pieces forward %.2f ms, backward %.2f ms; "
                "%.2fx forward, %.2fx backward; median of 3\n",
                bf16_qkv ? "bf16" : "fp32", fused.fwd, fwd_flops / fused.fwd * 1e-9, fused.bwd,
                2 * fwd_flops / fused.bwd * 1e-9, blocks.fwd, blocks.bwd, blocks.fwd / fused.fwd,
                blocks.bwd / fused.bwd);
    expect_finite_nonzero({kout.get(), klse.get(), kdq.get(), kdk.get(), kdv.get()});
  }
}
#endif

}  // namespace
}  // namespace exmy::models

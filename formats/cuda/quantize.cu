// The CUDA path of block-scaled quantization (see quantize_cuda.hpp).
//
// Launch shape. Without a block scale, one thread per element (grid-stride).
// With a block scale, each scale block is owned by a group of G lanes of one
// warp (group_size: 1, 4 or 32 by block size, 1 for column blocks): the
// group reduces the block amax over the integer bits of |x| with shuffles,
// every lane of the group then computes the same block_scale() (the core is
// deterministic, so no broadcast is needed), and the lanes encode the
// block's elements. Calls the CPU's threshold loops would take, in R x 16,
// R x 32 (R a power of two up to 32) and R x 1 blocks, take the threshold
// path instead (a lane per block row, or per column block; a few compares
// per element; see threshold_row_part), and in the same shapes and
// formats up, down and the stochastic modes take it as the FP4 step path
// (the CPU's FP4 loops' arithmetic per element). The launch shape never
// changes a result: every decision is made by the shared core (or from
// thresholds the core found) from (plan, element value, flat index), and
// the random bits of an element come from its flat index (docs/numerics.md
// §4); the device tests run every shape against the CPU.
//
// Integer statistics are per-thread counters, reduced per warp and added
// with 64-bit atomics (integer addition is associative, so the totals are
// exact). The double sums (docs/numerics.md §5): one thread per segment
// makes the segment's partial with the shared segment_partial (its terms one
// after another in column order), and the host combines the copied-back
// partials with the fixed tree, as quantize() does.
//
// With spec.rht the random Hadamard transform runs first, on a device copy
// of x (the caller's tensor is left as it was): one thread per segment
// (apply_rht_launches with DeviceLaunch), each running rht_segment of
// formats/hadamard_segment.hpp, the CPU's own per-segment function; the
// rotated copy is then quantized, as quantize() quantizes its rotated copy.
//
// The tensor-level plan (the reference amax and t, docs/numerics.md §3 step
// 1) is made on the device by a one-thread kernel from the amax kernel's
// result, and the quantize kernels read it from device memory: no host round
// trip between the passes. quantize_cuda copies host tensors through a
// CudaQuantizer; the host emulation runs the same per-block functions.
//
// Row outer scales (docs/numerics.md §3, "Row outer scales"): a warp per row
// measures the row's max |x| (always: QuantInfo reports it), a thread per
// row makes the row's plan (the call's plan with set_tensor_amax applied to
// the row's reference: its max |x|, its given value copied from
// spec.row_amax, or none), and the element and block kernels read the plan
// of their row instead of the call's. Blocks lie along rows (1xB, which
// QuantSpec::validate requires), so a block has one row. The threshold path
// is not taken: its tables are made for one t.
#include "formats/cuda/quantize_cuda.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cmath>
#include <limits>
#include <mutex>
#include <sstream>
#include <type_traits>
#include <utility>
#include <vector>

#include "formats/conventions.hpp"
#include "formats/cuda/abs_max.cuh"
#include "formats/cuda/cuda_check.hpp"
#include "formats/error.hpp"
#include "formats/fast/loops.hpp"
#include "formats/fp4_step.hpp"
#include "formats/hadamard_segment.hpp"
#include "formats/kernel_launch.hpp"
#include "formats/philox.hpp"
#include "formats/quant_core.hpp"
#include "formats/quant_sums.hpp"
#include "formats/spec.hpp"
#include "formats/thresholds.hpp"
#include "formats/tree_launches.hpp"

namespace exmy {
namespace {

// ---------------------------------------------------------------------------
// Host helpers
// ---------------------------------------------------------------------------

// Memory freed on scope exit that reserve() grows (never shrinks; the old
// contents are not kept), from allocator A: device memory (DeviceBuffer)
// or page-locked host memory (PinnedBuffer: the results a call brings back
// are copied into it asynchronously, where a copy into pageable memory
// would wait for the device once per copy, and the call waits once).
template <class T, class A>
struct GrowingBuffer {
  T* ptr = nullptr;
  size_t size = 0;
  GrowingBuffer() = default;
  explicit GrowingBuffer(size_t count) { reserve(count); }
  void reserve(size_t count) {
    if (count <= size) return;
    if (ptr) A::free(ptr);
    ptr = nullptr;
    size = 0;
    cuda_check(A::alloc(reinterpret_cast<void**>(&ptr), count * sizeof(T)), A::name);
    size = count;
  }
  ~GrowingBuffer() {
    if (ptr) A::free(ptr);
  }
  GrowingBuffer(const GrowingBuffer&) = delete;
  GrowingBuffer& operator=(const GrowingBuffer&) = delete;
};

struct DeviceAlloc {
  static cudaError_t alloc(void** p, size_t bytes) { return cudaMalloc(p, bytes); }
  static void free(void* p) { cudaFree(p); }
  static constexpr const char* name = "cudaMalloc";
};
struct PinnedAlloc {
  static cudaError_t alloc(void** p, size_t bytes) { return cudaMallocHost(p, bytes); }
  static void free(void* p) { cudaFreeHost(p); }
  static constexpr const char* name = "cudaMallocHost";
};
template <class T>
using DeviceBuffer = GrowingBuffer<T, DeviceAlloc>;
template <class T>
using PinnedBuffer = GrowingBuffer<T, PinnedAlloc>;

// ---------------------------------------------------------------------------
// Per-element and per-block work (host and device)
// ---------------------------------------------------------------------------
//
// The kernels below are thin launch-shape wrappers around these functions;
// quantize_cuda_emulated runs the same functions on the host, lane after
// lane, so the kernels' logic is tested even where no device is present.

constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kThreads = 256;
constexpr int kMaxGrid = 1 << 16;  // grid-stride loops cover the rest

// Indices of the integer statistics in the counter array.
enum Counter : int {
  kNonzero,
  kUnderflow,
  kSaturatedCount,
  kSubnormal,
  kScaleUnderflow,
  kScaleSubnormal,
  kScaleSaturated,
  kScaleFour,
  kCounters
};

// A thread's counts, in 32 bits (fewer registers in the kernels' loops:
// ptxas's spill stores of the fast paths' statistics instances, sm_90, went
// from 292-388 bytes a thread to 116-284 for row blocks, and from 132 / 60
// to 68 / 100 for the column blocks' threshold / step kernels; the
// general kernel's from 820-878 to 732-762). A thread's share of a
// tensor stays far below 2^32 elements: the kernels run at least a
// multiprocessor's worth of threads, so that would take a tensor of more
// than 2^40 elements. Warps add them up in 64 bits (flush_counts), the
// host emulation block by block (add_to_totals).
struct Counts {
  uint32_t c[kCounters];
};

// Code i of an array of `bytes`-wide little-endian codes. The device
// buffers are aligned (cudaMalloc); the host emulation writes into the
// caller's buffer byte by byte.
EXMY_HD void store_code(void* base, int bytes, int64_t i, uint32_t code) {
  if (!base) return;
#if defined(__CUDA_ARCH__)
  switch (bytes) {
    case 1: static_cast<uint8_t*>(base)[i] = static_cast<uint8_t>(code); break;
    case 2: static_cast<uint16_t*>(base)[i] = static_cast<uint16_t>(code); break;
    default: static_cast<uint32_t*>(base)[i] = code; break;
  }
#else
  auto* q = static_cast<uint8_t*>(base) + i * bytes;
  for (int k = 0; k < bytes; ++k) q[k] = static_cast<uint8_t>(code >> (8 * k));
#endif
}

EXMY_HD uint32_t max_u32(uint32_t a, uint32_t b) { return a > b ? a : b; }

// The index of the lowest set bit of m (m != 0).
EXMY_HD int count_trailing_zeros(uint32_t m) {
#if defined(__CUDA_ARCH__)
  return __ffs(static_cast<int>(m)) - 1;
#else
  return __builtin_ctz(m);
#endif
}

// Records element i as unrepresentable; the lowest index wins.
EXMY_HD void note_error(unsigned long long* first_error, int64_t i) {
#if defined(__CUDA_ARCH__)
  atomicMin(first_error, static_cast<unsigned long long>(i));
#else
  if (static_cast<unsigned long long>(i) < *first_error) *first_error = static_cast<unsigned long long>(i);
#endif
}

EXMY_HD bool nan_representable(const QuantPlan& p) { return p.fe.has_nan || (p.has_scale && p.fs.has_nan); }

// The plan that quantizes row r: the call's, or with row outer scales
// (row_plans not null) the row's own.
EXMY_HD const QuantPlan& plan_of_row(const QuantPlan& p, const QuantPlan* row_plans, int64_t r) {
  return row_plans ? row_plans[r] : p;
}

// A lane's stochastic-rounding bits: random_bits(seed, stream, i, n) of
// the elements it quantizes, with the Philox block of the last word kept,
// so that a lane walking a block's elements in increasing flat order runs
// Philox once per four words (16 elements of 8 bits or fewer) instead of
// once per element. RandomBits (formats/philox.hpp) caches the same way
// for the CPU's loops, but indexes its block's words at run time, which
// the device would keep in local memory: here they are four values.
struct LaneRandom {
  uint64_t seed, stream;
  int n;
  uint64_t cached = ~uint64_t{0};  // no Philox block (j >> 2 < 2^62)
  uint32_t w0 = 0, w1 = 0, w2 = 0, w3 = 0;
  EXMY_HD LaneRandom(const QuantPlan& p) : seed(p.seed), stream(p.stream), n(p.sr_bits) {}
  EXMY_HD uint32_t operator()(uint64_t i) {
    const uint64_t j = random_word_index(i, n);
    if ((j >> 2) != cached) {
      cached = j >> 2;
      const PhiloxBlock b = philox_block(seed, stream, cached);
      w0 = b.w[0], w1 = b.w[1], w2 = b.w[2], w3 = b.w[3];
    }
    const uint32_t w = (j & 2) ? ((j & 1) ? w3 : w2) : ((j & 1) ? w1 : w0);
    return random_bits_from_word(w, i, n);
  }
};

// An element's stochastic-rounding bits from its own Philox run, holding
// nothing between elements: for the threshold path's fallback, whose modes
// are deterministic (with a LaneRandom there, or a copy of the plan's seed
// and stream, ptxas put the threshold kernels' 16 loaded words back in
// local memory, although the fallback is out of line), and for the kernel
// without block scales, whose threads' elements are a grid apart.
struct PointRandom {
  const QuantPlan& p;
  EXMY_HD explicit PointRandom(const QuantPlan& plan) : p(plan) {}
  EXMY_HD uint32_t operator()(uint64_t i) const { return random_bits(p.seed, p.stream, i, p.sr_bits); }
};

// One element that is not in a NaN block or a zero-scale block: docs/numerics.md
// §3 steps 4-5 through the shared core (the element lambda of quantize_ref).
// rnd: the lane's random bits (read only for stochastic modes).
template <class Random>
EXMY_HD void quantize_element(const QuantPlan& p, const BlockConsts& c, const float* x, int64_t i, void* codes,
                              float* values, Counts& cnt, unsigned long long* first_error, Random& rnd) {
  const float xi = x[i];
  uint32_t code;
  float xh;
  if (is_nan(xi)) {
    if (!nan_representable(p)) note_error(first_error, i);
    code = p.fe.has_nan ? p.fe.nan_code : zero_code(p.fe, xi);
    xh = float_of(0x7fc00000u);
  } else {
    const uint32_t r = is_stochastic(p.round) ? rnd(static_cast<uint64_t>(i)) : 0u;
    const ElemOut e = encode_element(p, c, xi, r);
    if (e.flags & kUnrepresentable) note_error(first_error, i);
    cnt.c[kSaturatedCount] += (e.flags & kSaturated) ? 1 : 0;
    code = e.code;
    xh = e.xhat;
  }
  cnt.c[kNonzero] += xi != 0.0f;
  cnt.c[kUnderflow] += (xi != 0.0f && xh == 0.0f);
  cnt.c[kSubnormal] += p.fe.classify(code) == CodeClass::subnormal;
  store_code(codes, p.fe.code_bytes(), i, code);
  if (values) values[i] = xh;
}

// Lane l's walk over elements k = l, l + group, ... of block b, each at
// b.flat(k), with four divisions per walk where flat takes two 64-bit
// divisions per element. (A block of no columns, a row of an empty tensor,
// has no elements to walk.)
struct BlockWalk {
  int64_t row = 0, col = 0, drow = 0, dcol = 0;  // element k at (b.r0 + row, b.c0 + col); a step's change
  EXMY_HD BlockWalk(const BlockGeom& b, int l, int group) {
    if (b.width <= 0) return;
    row = l / b.width, col = l % b.width, drow = group / b.width, dcol = group % b.width;
  }
  EXMY_HD int64_t flat(const BlockGeom& b) const { return (b.r0 + row) * b.cols + b.c0 + col; }
  EXMY_HD void next(const BlockGeom& b) {
    row += drow;
    col += dcol;
    if (col >= b.width) col -= b.width, ++row;
  }
};

// Lane l of a group of `group` lanes: max of the bits of |x| over elements
// l, l + group, ... of the block (as unsigned integers, which orders non-NaN
// magnitudes like floats and puts every NaN above +Inf).
EXMY_HD uint32_t block_amax_part(const float* x, const BlockGeom& b, int l, int group) {
  uint32_t m = 0;
  BlockWalk w(b, l, group);
  for (int64_t k = l; k < b.count; k += group, w.next(b)) {
    const uint32_t a = bits_of(x[w.flat(b)]) & 0x7fffffffu;
    m = a > m ? a : m;
  }
  return m;
}

// Lane l of the group owning block `blk`, given the block's amax bits m (the
// group's reduction of block_amax_part): the scale (lane 0 stores it and
// counts the block statistics) and elements l, l + group, ... of the block.
template <class Random = LaneRandom>
EXMY_HD void quantize_block_part(const QuantPlan& p, const float* x, int64_t blk, const BlockGeom& b, uint32_t m, int l,
                                 int group, void* codes, void* scale_codes, float* values, Counts& cnt,
                                 unsigned long long* first_error) {
  const int sb = p.fs.code_bytes(), cb = p.fe.code_bytes();
  if (m > 0x7f800000u) {
    // A NaN makes the whole block NaN.
    const bool nan_ok = nan_representable(p);
    if (l == 0) store_code(scale_codes, sb, blk, p.fs.has_nan ? p.fs.nan_code : 0u);
    BlockWalk w(b, l, group);
    for (int64_t k = l; k < b.count; k += group, w.next(b)) {
      const int64_t i = w.flat(b);
      const float xi = x[i];
      if (!nan_ok && is_nan(xi)) note_error(first_error, i);
      const uint32_t code = p.fe.has_nan ? p.fe.nan_code : zero_code(p.fe, xi);
      cnt.c[kNonzero] += xi != 0.0f;
      cnt.c[kSubnormal] += p.fe.classify(code) == CodeClass::subnormal;
      store_code(codes, cb, i, code);
      if (values) values[i] = float_of(0x7fc00000u);
    }
    return;
  }
  // Every lane computes the same scale from the same b (no broadcast needed),
  // and with four over six the same choice from the whole block.
  bool four = false;
  const BlockScale bs =
      four_over_six(p, x, b, float_of(m), block_scale(p, float_of(m), false, scale_random_bits(p, blk, b.cols)), four);
  if (l == 0) {
    cnt.c[kScaleFour] += four;
    cnt.c[kScaleSaturated] += bs.saturated;
    cnt.c[kScaleUnderflow] += bs.underflow;
    cnt.c[kScaleSubnormal] += p.fs.classify(bs.code) == CodeClass::subnormal;
    store_code(scale_codes, sb, blk, bs.code);
  }
  const BlockConsts c = block_consts(p, bs.s);
  Random rnd(p);
  BlockWalk w(b, l, group);
  for (int64_t k = l; k < b.count; k += group, w.next(b)) {
    const int64_t i = w.flat(b);
    if (bs.zero) {
      // Scale 0: every element encodes to zero, keeping the sign of -0.
      const float xi = x[i];
      const uint32_t code = zero_code(p.fe, xi);
      cnt.c[kNonzero] += xi != 0.0f;
      cnt.c[kUnderflow] += xi != 0.0f;
      store_code(codes, cb, i, code);
      if (values) values[i] = (code & p.fe.sign_bit) ? -0.0f : 0.0f;
    } else {
      quantize_element(p, c, x, i, codes, values, cnt, first_error, rnd);
    }
  }
}

// ---------------------------------------------------------------------------
// The threshold path: a lane per row of an R x B block (B = 16 or 32, R a
// power of two up to 32; the block's R lanes reduce its amax), or a thread
// per R x 1 column block, for the plans the CPU's threshold loops take
// (FP4-class signed payloads, one-byte scale codes, the deterministic modes
// that treat x and -x alike; see formats/fast/loops.hpp, ThrBlock). A
// block's magnitude codes are the counts of its scale code's thresholds |x|
// exceeds, which formats/thresholds.hpp finds with the scalar core, so the
// decisions are the core's; per element a few compares replace the core's
// arithmetic. The thresholds and x-hat tables of every scale code are made
// on the device (code_table_entry, one thread per code and threshold) once
// the tensor scale is known there, and so are the call's scale-code
// thresholds (detail::ScaleThr, scale_thr_kernel): a block whose amax they
// cover gets its scale code from a few integer compares, as the CPU's
// block_scale_codes does, instead of block_scale's double arithmetic.
// Blocks the tables do not cover (NaN or Inf amax, zero scale, partial
// blocks at the ends of the rows or of the tensor) take quantize_block_part.
//
// The FP4 step path runs the same kernel for the modes thresholds cannot
// serve (up, down and the stochastic modes: a stochastic decision depends
// on the element's random bits, not only on |x|): per element the CPU's FP4
// loops' arithmetic (detail::fp4_step, formats/fp4_step.hpp) with the
// block's multiplier and x-hat table from the same per-code tables, a
// 16-element row's random bits from one Philox block (two above 8 bits;
// segment_random), and the elements the step is unsure of (exact
// arithmetic only) through the scalar core.
// ---------------------------------------------------------------------------

// A scale code's tables: the thresholds and x-hat table the CPU's
// threshold loops hold (detail::ThrBlock), and for the FP4 step path the
// block's multiplier (detail::fp4_step's mul: m_b in fp32 arithmetic,
// fl(t / s) in exact arithmetic; a code whose fl(t / s) lies outside
// [2^-126, 2^126] is not used, and its blocks take the scalar core).
struct CodeTable : detail::ThrBlock {
  float mul = 0.0f;
};
constexpr int kMaxScaleCodes = 256;  // one-byte scale codes

// The two fast paths of block-scaled calls, and the kernel that serves
// the rest (quantize_blocks_kernel).
enum class FastPath : uint8_t {
  none,        // the general kernel
  thresholds,  // magnitude codes as counts of thresholds (quantize_thr_kernel)
  fp4_step,    // the same kernel with detail::fp4_step per element
};

// The path a call takes. Both fast paths serve the block shapes the kernel
// is instantiated for: R x 16 and R x 32 with R a power of two up to 32
// (rows whose blocks start 16-byte aligned), R x 1; one tensor scale (the
// tables are made for one t: row outer scales take the general kernel);
// one-byte codes, a signed element format and the plans the CPU's FP4
// loops take (formats/fast/loops.hpp: no four over six or dithered
// scales). The threshold path takes the modes the CPU's 16-lane threshold
// loops declare (the deterministic modes that treat x and -x alike); the
// FP4 step path the others (up, down and the stochastic modes), which the
// CPU's FP4 loops serve with the same arithmetic.
FastPath fast_path(const QuantSpec& spec, const QuantPlan& p, int64_t cols) {
  if (spec.outer != OuterScale::tensor) return FastPath::none;
  const bool group_rows = p.br >= 1 && p.br <= 32 && (p.br & (p.br - 1)) == 0;  // a power of two: a lane group
  const bool rows = (p.bc == 16 || p.bc == 32) && group_rows && cols % 4 == 0;
  if (!rows && p.bc != 1) return FastPath::none;
  const auto claims = [&](detail::Loop l, detail::Simd w) {
    return detail::loop_claims(detail::loop_decl(l), p, detail::kThresholdMinElements, w);
  };
  if (claims(rows ? detail::Loop::threshold_x16 : detail::Loop::threshold_lanes_x16, detail::Simd::avx512))
    return FastPath::thresholds;
  if (detail::threshold_handles(p) && claims(detail::Loop::fp4x8, detail::Simd::avx2)) return FastPath::fp4_step;
  return FastPath::none;
}

// The profile's names of the quantize launches: the general kernel's,
// that without block scales, and a fast path's.
constexpr const char* kGeneralKernelName = "quantize blocks (general kernel)";
constexpr const char* kNoScaleName = "quantize without block scales";
const char* fast_path_name(FastPath path, bool columns) {
  if (path == FastPath::fp4_step)
    return columns ? "quantize FP4 step path, column blocks" : "quantize FP4 step path";
  return columns ? "quantize threshold path, column blocks" : "quantize threshold path";
}

// Entry k (0..7) of scale code `code`'s table: x-hat of magnitude code k,
// and for the threshold path threshold k+1 (k < 7) or the saturation
// threshold (k = 7), for the FP4 step path (k = 0) the multiplier; use[code]
// is 0 for codes the tables cannot serve (a scale that decodes to 0, or in
// exact arithmetic a multiplier fl(t / s) outside [2^-126, 2^126], as the
// CPU's fp4_blocks decides: its uncertainty rule assumes a normal
// multiplier; with amax and MX scale rules only blocks of elements far
// below the element grid meet such a scale, a subnormal t with s = 1).
EXMY_HD void code_table_entry(const QuantPlan& p, uint32_t code, int k, bool step, CodeTable* tab, uint8_t* use) {
  const double s = p.fs.decode(code);
  const BlockConsts c = block_consts(p, s);
  CodeTable& e = tab[code];
  if (k == 0) {
    bool ok = s != 0.0;
    if (ok && step) {
      if (p.arith == Arith::fp32) {
        e.mul = c.mb;
      } else {
        const double r = static_cast<double>(p.t) / s;
        e.mul = static_cast<float>(r);
        ok = r >= 0x1p-126 && r <= 0x1p126;
      }
    }
    use[code] = ok;
  }
  if (s == 0.0) return;
  e.table[k] = static_cast<uint32_t>(k) <= p.fe.max_mag ? dequant(p, c, static_cast<uint32_t>(k)) : 0.0f;
  if (step) return;
  if (k < 7) e.t[k] = detail::element_threshold(p, c, static_cast<uint32_t>(k) + 1);
  else e.sat = detail::saturation_threshold(p, c);
}

// The blocks the threshold path leaves to quantize_block_part, out of line
// so that its registers stay the hot loop's; it returns its counts, which
// the caller adds (a caller's counts passed by reference to an out-of-line
// function would live in local memory, every element's counting with them).
// m: the block's amax bits, or kAmaxUnknown for a partial block, whose
// amax it takes itself (so that the hot loop holds no second amax loop).
constexpr uint32_t kAmaxUnknown = 0xffffffffu;  // (a NaN's bits with the sign: no |x| has them)
__host__ __device__ __noinline__ Counts threshold_block_left(const QuantPlan& p, const float* x, int64_t blk,
                                                           const BlockGeom& b, uint32_t m, void* codes,
                                                           void* scale_codes, float* values,
                                                           unsigned long long* first_error) {
  Counts cnt = {};
  if (m == kAmaxUnknown) m = block_amax_part(x, b, 0, 1);
  quantize_block_part<PointRandom>(p, x, blk, b, m, 0, 1, codes, scale_codes, values, cnt, first_error);
  return cnt;
}
EXMY_HD void add_counts(Counts& to, const Counts& from) {
  for (int k = 0; k < kCounters; ++k) to.c[k] += from.c[k];
}

// block_scale's arithmetic for the threshold path, out of line: inlined,
// its double arithmetic's registers pushed the hot loop's loaded elements
// out to local memory (ptxas: 144 bytes of spills in
// quantize_thr_kernel<16, false>, the 16 loaded words stored and reloaded
// per block; 28 bytes, none of them those, out of line).
struct ScaleLeft {
  uint32_t code;
  bool zero, saturated, underflow;
};
__host__ __device__ __noinline__ ScaleLeft threshold_scale_left(const QuantPlan& p, uint32_t m) {
  const BlockScale bs = block_scale(p, float_of(m));
  return ScaleLeft{bs.code, bs.zero, bs.saturated, bs.underflow};
}

// The threshold path's scale code of a block with amax bits m: by the
// call's scale-code thresholds where they cover m (a normal, unsaturated
// code: nothing to count), else block_scale's (threshold_scale_left), whose
// statistics the lane that owns the block's scale (`counts`) adds. False:
// the block is left to quantize_block_part (NaN or Inf amax, a zero scale,
// a code the tables do not serve).
EXMY_HD bool threshold_scale_code(const QuantPlan& p, const detail::ScaleThr& st, const uint8_t* use, uint32_t m,
                                  bool counts, Counts& cnt, uint32_t& code) {
  if (m >= 0x7f800000u) return false;
  if (detail::scale_code_by_thresholds(st, m, code)) return use[code] != 0;
  const ScaleLeft bs = threshold_scale_left(p, m);
  if (bs.zero || !use[bs.code]) return false;
  if (counts) {
    cnt.c[kScaleSaturated] += bs.saturated;
    cnt.c[kScaleUnderflow] += bs.underflow;
    cnt.c[kScaleSubnormal] += p.fs.classify(bs.code) == CodeClass::subnormal;
  }
  code = bs.code;
  return true;
}

// The BC elements at flat index i0 (16-byte aligned on the device) as bits,
// and their max |x| bits.
template <int BC>
EXMY_HD uint32_t load_segment(const float* x, int64_t i0, uint32_t* xb) {
#if defined(__CUDA_ARCH__)
  for (int j = 0; j < BC; j += 4) {
    const uint4 q = *reinterpret_cast<const uint4*>(x + i0 + j);
    xb[j] = q.x, xb[j + 1] = q.y, xb[j + 2] = q.z, xb[j + 3] = q.w;
  }
#else
  for (int j = 0; j < BC; ++j) xb[j] = bits_of(x[i0 + j]);
#endif
  uint32_t m = 0;
  for (int j = 0; j < BC; ++j) m = max_u32(m, xb[j] & 0x7fffffffu);
  return m;
}

// The element statistics of a lane's part of a block, in 32 bits (a
// block's elements fit them), added to the thread's 64-bit Counts once per
// block rather than each element adding to them (two instructions an
// addition).
struct ThrCounts {
  uint32_t nonzero = 0, underflow = 0, subnormal = 0, saturated = 0;
  EXMY_HD void add_to(Counts& cnt) const {
    cnt.c[kNonzero] += nonzero;
    cnt.c[kUnderflow] += underflow;
    cnt.c[kSubnormal] += subnormal;
    cnt.c[kSaturatedCount] += saturated;
  }
};

// One element's magnitude code (the count of the thresholds |x| exceeds),
// x-hat and statistics under scale code table e.
struct ThrElement {
  uint32_t code, value;
};
EXMY_HD ThrElement threshold_element(const QuantPlan& p, const CodeTable& e, const int32_t (&t)[7], uint32_t xb,
                                     ThrCounts& cnt) {
  const int32_t a = static_cast<int32_t>(xb & 0x7fffffffu);
  const uint32_t q = detail::thresholds_exceeded(t, a);
  const float mag = e.table[q];
  cnt.nonzero += a != 0;
  cnt.underflow += a != 0 && mag == 0.0f;
  cnt.subnormal += q >= 1 && q < (1u << p.fe.M);
  cnt.saturated += a > e.sat;
  return ThrElement{q | ((xb >> 31) ? p.fe.sign_bit : 0u), bits_of(mag) | (xb & 0x80000000u)};
}

// Codes and x-hat bits of BC elements at flat index i0, written (each
// output where it is not null).
template <int BC>
EXMY_HD void store_segment(const uint32_t* q8, const uint32_t* vh, int64_t i0, void* codes, float* values) {
#if defined(__CUDA_ARCH__)
  for (int j = 0; j < BC; j += 4) {
    if (values) *reinterpret_cast<uint4*>(values + i0 + j) = make_uint4(vh[j], vh[j + 1], vh[j + 2], vh[j + 3]);
    if (codes)
      *reinterpret_cast<uint32_t*>(static_cast<uint8_t*>(codes) + i0 + j) =
          q8[j] | (q8[j + 1] << 8) | (q8[j + 2] << 16) | (q8[j + 3] << 24);
  }
#else
  for (int j = 0; j < BC; ++j) {
    if (values) values[i0 + j] = float_of(vh[j]);
    store_code(codes, 1, i0 + j, q8[j]);
  }
#endif
}

// The BC elements xb at flat index i0 under scale code table e: codes,
// x-hat and counts.
template <int BC>
EXMY_HD void threshold_segment(const QuantPlan& p, const uint32_t* xb, int64_t i0, const CodeTable& e,
                               void* codes, float* values, Counts& cnt) {
  int32_t t[7];
  for (int k = 0; k < 7; ++k) t[k] = e.t[k];
  uint32_t q8[BC], vh[BC];
  ThrCounts tc;
  for (int j = 0; j < BC; ++j) {
    const ThrElement r = threshold_element(p, e, t, xb[j], tc);
    q8[j] = r.code;
    vh[j] = r.value;
  }
  tc.add_to(cnt);
  store_segment<BC>(q8, vh, i0, codes, values);
}

// f(std::integral_constant<Round, MODE>, std::integral_constant<Arith,
// ARITH>) for the plan's mode and arithmetic, among the FP4 step path's
// modes (fast_path takes no other).
template <class F>
EXMY_HD void with_step_mode(const QuantPlan& p, F&& f) {
  const auto arith = [&](auto mode) {
    if (p.arith == Arith::exact) f(mode, std::integral_constant<Arith, Arith::exact>{});
    else f(mode, std::integral_constant<Arith, Arith::fp32>{});
  };
  switch (p.round) {
    case Round::up: arith(std::integral_constant<Round, Round::up>{}); break;
    case Round::down: arith(std::integral_constant<Round, Round::down>{}); break;
    case Round::stochastic: arith(std::integral_constant<Round, Round::stochastic>{}); break;
    case Round::stochastic_fast: arith(std::integral_constant<Round, Round::stochastic_fast>{}); break;
    default: arith(std::integral_constant<Round, Round::stochastic_fastest>{}); break;
  }
}

// One element of the FP4 step path (its random bits r): code and x-hat bits
// into q, v, its statistics into tc. False: the step is unsure of it, and
// the caller hands it to fp4_step_left.
template <Round MODE, Arith ARITH>
EXMY_HD bool fp4_step_element(const QuantPlan& p, const detail::Fp4StepConsts& k, const CodeTable& e, uint32_t xb,
                              uint32_t r, uint32_t& q, uint32_t& v, ThrCounts& tc) {
  detail::Fp4StepOut o;
  if (!detail::fp4_step<MODE, ARITH>(k, e.mul, e.table, xb, r, o)) return false;
  q = o.code;
  v = o.value;
  const uint32_t a = xb & 0x7fffffffu, mag = o.code & ~k.sign_bit;
  tc.nonzero += a != 0;
  tc.underflow += a != 0 && (o.value & 0x7fffffffu) == 0;
  tc.subnormal += mag >= 1 && mag < (1u << k.M);
  tc.saturated += o.saturated;
  return true;
}

// An element the step is unsure of, through the scalar core (its random
// bits from its own Philox run), out of line so that the hot loop's
// registers stay its own; returns its counts.
__host__ __device__ __noinline__ Counts fp4_step_left(const QuantPlan& p, const float* x, int64_t i,
                                                    uint32_t scale_code, void* codes, float* values,
                                                    unsigned long long* first_error) {
  Counts cnt = {};
  const BlockConsts c = block_consts(p, p.fs.decode(scale_code));
  PointRandom rnd(p);
  quantize_element(p, c, x, i, codes, values, cnt, first_error, rnd);
  return cnt;
}

// The random bits of BC elements from flat index i0 (random_bits of each),
// in a form whose array stays in registers: the segment's Philox blocks
// with their words taken at indices known at compile time, for a segment
// that starts a block's elements (kPer elements a word: 4 for n <= 8, 2
// for n <= 16), which rows of a multiple of 16 columns always do.
template <int BC, int kPer>
EXMY_HD void segment_random_aligned(const QuantPlan& p, uint64_t i0, uint32_t (&r)[BC]) {
  constexpr int kPerBlock = 4 * kPer;  // elements a Philox block serves
#pragma unroll
  for (int b = 0; b < (BC + kPerBlock - 1) / kPerBlock; ++b) {
    const PhiloxBlock pb = philox_block(p.seed, p.stream, i0 / kPerBlock + b);
#pragma unroll
    for (int e = 0; e < kPerBlock && b * kPerBlock + e < BC; ++e)
      r[b * kPerBlock + e] = random_bits_from_word(pb.w[e / kPer], static_cast<uint64_t>(e), p.sr_bits);
  }
}

// ... and for any segment, out of line (a lane's LaneRandom walk).
template <int BC>
struct SegmentRandom {
  uint32_t r[BC];
};
template <int BC>
__host__ __device__ __noinline__ SegmentRandom<BC> segment_random_left(const QuantPlan& p, uint64_t i0) {
  SegmentRandom<BC> out;
  LaneRandom rnd(p);
  for (int j = 0; j < BC; ++j) out.r[j] = rnd(i0 + static_cast<uint64_t>(j));
  return out;
}

template <int BC>
EXMY_HD void segment_random(const QuantPlan& p, uint64_t i0, uint32_t (&r)[BC]) {
  if (p.sr_bits <= 8 && i0 % 16 == 0) return segment_random_aligned<BC, 4>(p, i0, r);
  if (p.sr_bits > 8 && p.sr_bits <= 16 && i0 % 8 == 0) return segment_random_aligned<BC, 2>(p, i0, r);
  const SegmentRandom<BC> left = segment_random_left<BC>(p, i0);
#pragma unroll
  for (int j = 0; j < BC; ++j) r[j] = left.r[j];
}

// The BC elements xb at flat index i0 under table e on the FP4 step path,
// in mode MODE and arithmetic ARITH: codes and x-hat bits into q8 and vh,
// statistics into tc; returns the mask of the elements the step is unsure
// of (their q8 and vh 0).
template <int BC, Round MODE, Arith ARITH>
EXMY_HD uint32_t fp4_step_elements(const QuantPlan& p, const uint32_t* xb, int64_t i0, const CodeTable& e,
                                   uint32_t* q8, uint32_t* vh, ThrCounts& tc) {
  constexpr bool kStochastic = is_stochastic(MODE);
  uint32_t r[BC];
  if constexpr (kStochastic) {
    segment_random<BC>(p, static_cast<uint64_t>(i0), r);
  } else {
#pragma unroll
    for (int j = 0; j < BC; ++j) r[j] = 0;
  }
  const detail::Fp4StepConsts k = detail::fp4_step_consts(p);
  uint32_t unsure = 0;
#pragma unroll
  for (int j = 0; j < BC; ++j) {
    if (!fp4_step_element<MODE, ARITH>(p, k, e, xb[j], r[j], q8[j], vh[j], tc)) {
      q8[j] = vh[j] = 0;
      unsure |= 1u << j;
    }
  }
  return unsure;
}

// The BC elements xb at flat index i0 of a block with scale code `code`
// (table e) on the FP4 step path: codes, x-hat and counts, 16 elements at
// a time (a 32-wide row's outputs and random bits held at once made ptxas
// spill some 800 bytes); the unsure elements after the others are stored.
template <int BC>
EXMY_HD void fp4_step_segment(const QuantPlan& p, const float* x, const uint32_t* xb, int64_t i0, uint32_t code,
                              const CodeTable& e, void* codes, float* values, Counts& cnt,
                              unsigned long long* first_error) {
  static_assert(BC % 16 == 0 && BC <= 32, "16 elements a step; the unsure elements are a 32-bit mask");
  uint32_t unsure = 0;
  ThrCounts tc;
  with_step_mode(p, [&](auto mode, auto arith) {
#pragma unroll
    for (int h = 0; h < BC; h += 16) {
      uint32_t q8[16], vh[16];
      unsure |= fp4_step_elements<16, decltype(mode)::value, decltype(arith)::value>(p, xb + h, i0 + h, e, q8, vh, tc)
                << h;
      store_segment<16>(q8, vh, i0 + h, codes, values);
    }
  });
  tc.add_to(cnt);
  for (; unsure != 0; unsure &= unsure - 1)
    add_counts(cnt, fp4_step_left(p, x, i0 + count_trailing_zeros(unsure), code, codes, values, first_error));
}

// Row blocks (R x BC, BC = 16 or 32, R a power of two up to 32) on the
// threshold path: a group of R lanes per block, lane l the block's row l.
// Each lane loads its row's segment and its max (threshold_row_load); the
// group reduces the maxima (shuffles on the device, a loop in the
// emulation); then each lane finishes its row (threshold_row_part): lane 0
// stores the scale code and counts the block's scale, or alone hands a
// block the tables do not serve, or a partial one, to quantize_block_part.
// b: block_geom of block blk, made once for both.
//
// full_row_start(b, l) is b.flat(l * BC) for a full block (b.width == BC)
// without flat's two 64-bit divisions by the run-time width.
EXMY_HD int64_t full_row_start(const BlockGeom& b, int l) { return (b.r0 + l) * b.cols + b.c0; }

template <int BC>
EXMY_HD uint32_t threshold_row_load(const QuantPlan& p, const float* x, const BlockGeom& b, int l, uint32_t* xb) {
  if (b.count != static_cast<int64_t>(p.br) * BC) return 0u;
  return load_segment<BC>(x, full_row_start(b, l), xb);
}

template <int BC, bool kStep>
EXMY_HD void threshold_row_part(const QuantPlan& p, const float* x, const BlockGeom& b, int64_t blk, int l,
                                uint32_t m, const uint32_t* xb, const detail::ScaleThr& st, const CodeTable* tab,
                                const uint8_t* use, void* codes, void* scale_codes, float* values, Counts& cnt,
                                unsigned long long* first_error) {
  if (b.count != static_cast<int64_t>(p.br) * BC) {  // a partial block (the last of a row, or of the rows)
    if (l == 0)
      add_counts(cnt, threshold_block_left(p, x, blk, b, kAmaxUnknown, codes, scale_codes, values, first_error));
    return;
  }
  uint32_t code;
  if (!threshold_scale_code(p, st, use, m, l == 0, cnt, code)) {
    if (l == 0) add_counts(cnt, threshold_block_left(p, x, blk, b, m, codes, scale_codes, values, first_error));
    return;
  }
  if (l == 0) store_code(scale_codes, 1, blk, code);
  if constexpr (kStep)
    fp4_step_segment<BC>(p, x, xb, full_row_start(b, l), code, tab[code], codes, values, cnt, first_error);
  else
    threshold_segment<BC>(p, xb, full_row_start(b, l), tab[code], codes, values, cnt);
}

// Column blocks (R x 1) on the threshold path (kStep: the FP4 step path):
// one thread per block, the lanes of a warp on adjacent columns (coalesced
// rows).
template <bool kStep>
EXMY_HD void threshold_column_part(const QuantPlan& p, const float* x, int64_t rows, int64_t cols, int64_t blk,
                                   const detail::ScaleThr& st, const CodeTable* tab, const uint8_t* use, void* codes,
                                   void* scale_codes, float* values, Counts& cnt, unsigned long long* first_error) {
  const BlockGeom b = block_geom(p, rows, cols, blk);
  if (b.count != p.br) {  // a partial block (the last rows)
    add_counts(cnt, threshold_block_left(p, x, blk, b, kAmaxUnknown, codes, scale_codes, values, first_error));
    return;
  }
  // A full block's element k is at (r0 + k) cols + c0: BlockGeom::flat's
  // two 64-bit divisions by the width (1) per element left out.
  const float* xc = x + b.r0 * cols + b.c0;
  uint32_t m = 0;
  for (int64_t k = 0; k < b.count; ++k) m = max_u32(m, bits_of(xc[k * cols]) & 0x7fffffffu);
  uint32_t code;
  if (!threshold_scale_code(p, st, use, m, true, cnt, code)) {
    add_counts(cnt, threshold_block_left(p, x, blk, b, m, codes, scale_codes, values, first_error));
    return;
  }
  store_code(scale_codes, 1, blk, code);
  const CodeTable& e = tab[code];
  ThrCounts tc;
  if constexpr (kStep) {
    with_step_mode(p, [&](auto mode, auto arith) {
      constexpr Round kMode = decltype(mode)::value;
      const detail::Fp4StepConsts k = detail::fp4_step_consts(p);
      LaneRandom rnd(p);
      for (int64_t j = 0; j < b.count; ++j) {
        const int64_t i = (b.r0 + j) * cols + b.c0;
        const uint32_t r = is_stochastic(kMode) ? rnd(static_cast<uint64_t>(i)) : 0u;
        uint32_t q, v;
        if (fp4_step_element<kMode, decltype(arith)::value>(p, k, e, bits_of(x[i]), r, q, v, tc)) {
          if (values) values[i] = float_of(v);
          store_code(codes, 1, i, q);
        } else {
          add_counts(cnt, fp4_step_left(p, x, i, code, codes, values, first_error));
        }
      }
    });
  } else {
    int32_t t[7];
    for (int k = 0; k < 7; ++k) t[k] = e.t[k];
    for (int64_t k = 0; k < b.count; ++k) {
      const int64_t i = (b.r0 + k) * cols + b.c0;
      const ThrElement r = threshold_element(p, e, t, bits_of(x[i]), tc);
      if (values) values[i] = float_of(r.value);
      store_code(codes, 1, i, r.code);
    }
  }
  tc.add_to(cnt);
}

// Lanes per scale block: one for column blocks (R x 1), so that the 32
// lanes of a warp own 32 adjacent columns and read each row of them as one
// coalesced 128-byte line, and for blocks of at most 16 elements; four for
// blocks of 17 to 256, 32 above. On an H200 (docs/benchmarks.md) these beat
// a group as wide as the block (up to 32): every lane of a group computes
// the block scale, so fewer lanes per block compute it fewer times, and each
// lane has more elements to keep in flight.
int group_size(const QuantPlan& p) {
  const int64_t block_size = static_cast<int64_t>(p.br) * p.bc;
  if (p.bc == 1 || block_size <= 16) return 1;
  return block_size <= 256 ? 4 : 32;
}

// ---------------------------------------------------------------------------
// Kernels
// ---------------------------------------------------------------------------

// Sum of the counters over the warp, added to the totals by lane 0. Every lane
// of the warp must call it.
__device__ void flush_counts(const Counts& local, unsigned long long* totals) {
  for (int k = 0; k < kCounters; ++k) {
    unsigned long long v = local.c[k];
    for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(kFullMask, v, off);
    if ((threadIdx.x & 31) == 0 && v != 0) atomicAdd(totals + k, v);
  }
}

// The plan the tensor_plan_kernel wrote, copied into the block's shared
// memory (read by every element: a broadcast from shared memory rather than
// a global load each time). Every thread of the block must call it.
static_assert(sizeof(QuantPlan) % 4 == 0 && std::is_trivially_copyable_v<QuantPlan>);
__device__ const QuantPlan& block_plan(const QuantPlan* pp, uint32_t* smem) {
  const auto* src = reinterpret_cast<const uint32_t*>(pp);
  for (unsigned i = threadIdx.x; i < sizeof(QuantPlan) / 4; i += blockDim.x) smem[i] = src[i];
  __syncthreads();
  return *reinterpret_cast<const QuantPlan*>(smem);
}

// The reference amax A of docs/numerics.md §3 step 1: the given value, the
// tensor's max |x| from its bits (NaN when any element is NaN), or none (NaN).
EXMY_HD double reference_amax_of(AmaxKind kind, double given, uint32_t max_abs_bits) {
  const double nan = double_of(0x7ff8000000000000ull);
  if (kind == AmaxKind::given) return given;
  if (kind == AmaxKind::current)
    return max_abs_bits > 0x7f800000u ? nan : static_cast<double>(float_of(max_abs_bits));
  return nan;
}

// The tensor-level decisions on the device (one thread), so that no host
// round trip separates the amax pass from the quantization: the plan the
// quantize kernels read.
__global__ void tensor_plan_kernel(QuantPlan p, AmaxKind kind, double given, const unsigned int* max_abs_bits,
                                   QuantPlan* out) {
  set_tensor_amax(p, reference_amax_of(kind, given, kind == AmaxKind::current ? *max_abs_bits : 0u));
  *out = p;
}

// A call that does not wait (CudaQuantizer::run with wait = false): the
// value of its lowest unrepresentable element, read while x still holds it,
// for the message the next check gives.
__global__ void error_value_kernel(const float* x, const unsigned long long* first_error, float* value) {
  const unsigned long long i = *first_error;
  *value = i == ~0ull ? 0.0f : x[i];
}

// Row outer scales: what a call reports of row r (QuantInfo's row_amax,
// row_abs_max and row_t).
struct RowScale {
  double amax;     // the reference A_r (NaN: none)
  double abs_max;  // max |x| of the row (NaN if it holds a NaN)
  float t;         // the encode scale t_r
};

// Row r's block of the tensor: all its columns (for block_amax_part).
EXMY_HD BlockGeom row_geom(int64_t r, int64_t cols) { return BlockGeom{r, 0, cols, cols, cols}; }

// Row r's plan from its max |x| bits: the call's plan with the tensor-level
// fields set from the row's reference (its max |x|, given[r], or none), as
// the CPU paths set them row by row; and what the call reports of the row.
EXMY_HD void make_row_plan(const QuantPlan& p, AmaxKind kind, const double* given, const unsigned int* row_bits,
                           int64_t r, QuantPlan* row_plans, RowScale* row_scales) {
  QuantPlan q = p;
  set_tensor_amax(q, reference_amax_of(kind, kind == AmaxKind::given ? given[r] : 0.0, row_bits[r]));
  row_plans[r] = q;
  row_scales[r] = RowScale{q.amax, reference_amax_of(AmaxKind::current, 0.0, row_bits[r]), q.t};
}

// Row outer scales: the max |x| bits of every row, a warp per row (the
// lanes' block_amax_part over the whole row, reduced with shuffles).
__global__ void row_amax_kernel(const float* x, int64_t rows, int64_t cols, unsigned int* row_bits) {
  const int lane = threadIdx.x & 31;
  const int64_t nwarps = (static_cast<int64_t>(gridDim.x) * blockDim.x) >> 5;
  // The loop condition depends only on the warp: every lane takes part in every shuffle.
  for (int64_t r = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5; r < rows; r += nwarps) {
    unsigned int m = block_amax_part(x, row_geom(r, cols), lane, 32);
    for (int off = 16; off > 0; off >>= 1) m = max(m, __shfl_xor_sync(kFullMask, m, off));
    if (lane == 0) row_bits[r] = m;
  }
}

// Row outer scales: every row's plan, a thread per row.
__global__ void row_plans_kernel(QuantPlan p, AmaxKind kind, const double* given, const unsigned int* row_bits,
                                 int64_t rows, QuantPlan* row_plans, RowScale* row_scales) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; r < rows; r += stride)
    make_row_plan(p, kind, given, row_bits, r, row_plans, row_scales);
}

// Without a block scale: one thread per element (of `cols` a row). With
// row outer scales (kRows) each element takes its row's plan in row_plans;
// the instance without them is the tensor-scale kernel alone.
template <bool kRows, bool kCount>
__global__ void quantize_noscale_kernel(const QuantPlan* pp, const QuantPlan* row_plans, const float* x, int64_t n,
                                        int64_t cols, void* codes, float* values, unsigned long long* totals,
                                        unsigned long long* first_error) {
  __shared__ alignas(QuantPlan) uint32_t plan_words[sizeof(QuantPlan) / 4];
  const QuantPlan& p = block_plan(pp, plan_words);
  Counts cnt = {};
  const BlockConsts c{1.0, 0.0f};
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const QuantPlan& pi = plan_of_row(p, kRows ? row_plans : nullptr, kRows ? i / cols : 0);
    PointRandom rnd(pi);
    quantize_element(pi, c, x, i, codes, values, cnt, first_error, rnd);
  }
  if constexpr (kCount) flush_counts(cnt, totals);
}

// With a block scale: a group of `group` lanes (a power of two <= 32) per
// scale block, 32 / group blocks per warp. Registers are capped for four
// thread blocks per multiprocessor (the core spills a little): on an H200
// that ran 1.2-2x faster than one block of 152 registers.
// With row outer scales (kRows) a block takes its row's plan in row_plans.
// Without kCount (no statistics wanted) the counts are never added up, so
// the compiler drops their arithmetic (as in the other kernels).
template <bool kRows, bool kCount>
__global__ void __launch_bounds__(kThreads, 4)
    quantize_blocks_kernel(const QuantPlan* pp, const QuantPlan* row_plans, const float* x, int64_t rows,
                           int64_t cols, int group, void* codes, void* scale_codes, float* values,
                           unsigned long long* totals, unsigned long long* first_error) {
  __shared__ alignas(QuantPlan) uint32_t plan_words[sizeof(QuantPlan) / 4];
  const QuantPlan& p = block_plan(pp, plan_words);
  Counts cnt = {};
  const int lane = threadIdx.x & 31;
  const int per_warp = 32 / group;
  const int g = lane / group, l = lane % group;
  const int64_t nblocks = ((rows + p.br - 1) / p.br) * ((cols + p.bc - 1) / p.bc);
  const int64_t nwarps = (static_cast<int64_t>(gridDim.x) * blockDim.x) >> 5;
  // The loop condition depends only on the warp, so every lane of a warp runs
  // the same iterations and takes part in every shuffle.
  for (int64_t w = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5; w * per_warp < nblocks;
       w += nwarps) {
    const int64_t blk = w * per_warp + g;
    const bool valid = blk < nblocks;
    const BlockGeom b = block_geom(p, rows, cols, valid ? blk : 0);
    unsigned int m = valid ? block_amax_part(x, b, l, group) : 0u;
    for (int off = group >> 1; off > 0; off >>= 1) m = max(m, __shfl_xor_sync(kFullMask, m, off, group));
    if (valid)
      quantize_block_part(plan_of_row(p, kRows ? row_plans : nullptr, b.r0), x, blk, b, m, l, group, codes,
                          scale_codes, values, cnt, first_error);
  }
  if constexpr (kCount) flush_counts(cnt, totals);
}

// The fast paths' tables: one thread per scale code and entry (step: the
// FP4 step path's).
__global__ void code_tables_kernel(const QuantPlan* pp, int ncodes, bool step, CodeTable* tab, uint8_t* use) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < ncodes * 8) code_table_entry(*pp, static_cast<uint32_t>(i / 8), i % 8, step, tab, use);
}

// The call's scale-code thresholds (detail::ScaleThr) once its tensor scale
// is known, on one warp: lane 0 finds the first threshold, lanes 0 .. P the
// other searches side by side, lane 0 checks them (scale_code_thresholds'
// steps, so the CPU's result).
__global__ void scale_thr_kernel(const QuantPlan* pp, detail::ScaleThr* out) {
  __shared__ detail::ScaleThrStart start;
  __shared__ uint32_t least[9];
  const QuantPlan& p = *pp;
  const uint32_t lane = threadIdx.x;
  if (lane == 0) start = detail::scale_thr_start(p);
  __syncthreads();
  if (start.ok && lane <= (1u << p.fs.M))  // (ok: M <= 3, so at most 9 lanes)
    least[lane] = detail::scale_code_least(p, detail::scale_thr_code(p, start, lane + 1));
  __syncthreads();
  if (lane == 0) *out = detail::scale_thr_finish(p, start, least);
}

// The threshold path, the tables and the scale-code thresholds in shared
// memory, registers capped for two thread blocks per multiprocessor (on an
// H200 1.1-1.3x faster than one, for 1 x BC blocks). BC = 16 or 32: row
// blocks, a group of p.br lanes each, p.br / 32 blocks per warp
// (threshold_row_load, the group's max, threshold_row_part); BC = 1: column
// blocks, a thread each (threshold_column_part). kStep: the FP4 step path.
template <int BC, bool kCount, bool kStep>
__global__ void __launch_bounds__(kThreads, 2)
    quantize_thr_kernel(const QuantPlan* pp, const float* x, int64_t rows, int64_t cols, const detail::ScaleThr* sthr,
                        const CodeTable* tab, const uint8_t* use, int ncodes, void* codes, void* scale_codes,
                        float* values, unsigned long long* totals, unsigned long long* first_error) {
  __shared__ alignas(QuantPlan) uint32_t plan_words[sizeof(QuantPlan) / 4];
  __shared__ CodeTable stab[kMaxScaleCodes];
  __shared__ uint8_t suse[kMaxScaleCodes];
  __shared__ detail::ScaleThr sst;
  for (int i = static_cast<int>(threadIdx.x); i < ncodes; i += static_cast<int>(blockDim.x)) {
    stab[i] = tab[i];
    suse[i] = use[i];
  }
  if (threadIdx.x == 0) sst = *sthr;
  const QuantPlan& p = block_plan(pp, plan_words);  // (its barrier covers the tables too)
  Counts cnt = {};
  const int64_t nblocks = ((rows + p.br - 1) / p.br) * ((cols + BC - 1) / BC);
  const int64_t thread = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if constexpr (BC == 1) {
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t blk = thread; blk < nblocks; blk += stride)
      threshold_column_part<kStep>(p, x, rows, cols, blk, sst, stab, suse, codes, scale_codes, values, cnt,
                                   first_error);
  } else {
    const int group = p.br, per_warp = 32 / group, lane = threadIdx.x & 31, g = lane / group, l = lane % group;
    const int64_t nwarps = (static_cast<int64_t>(gridDim.x) * blockDim.x) >> 5;
    // The loop condition depends only on the warp: every lane takes part in every shuffle.
    for (int64_t w = thread >> 5; w * per_warp < nblocks; w += nwarps) {
      const int64_t blk = w * per_warp + g;
      const bool valid = blk < nblocks;
      uint32_t xb[BC];
      const BlockGeom b = valid ? block_geom(p, rows, cols, blk) : BlockGeom{};
      uint32_t m = valid ? threshold_row_load<BC>(p, x, b, l, xb) : 0u;
      for (int off = group >> 1; off > 0; off >>= 1) m = max(m, __shfl_xor_sync(kFullMask, m, off, group));
      if (valid)
        threshold_row_part<BC, kStep>(p, x, b, blk, l, m, xb, sst, stab, suse, codes, scale_codes, values, cnt,
                                      first_error);
    }
  }
  if constexpr (kCount) flush_counts(cnt, totals);
}

// The partial of every segment of the double sums, one thread per segment.
__global__ void segment_sums_kernel(const float* x, const float* values, int64_t rows, int64_t cols,
                                    SumPartial* out) {
  const int64_t n = sum_segments(rows, cols), stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = tensor_segment_partial(x, values, cols, i);
}

int grid_for(int64_t threads_needed) {
  const int64_t g = (threads_needed + kThreads - 1) / kThreads;
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(g, kMaxGrid)));
}

// The grid of a grid-stride kernel that stages tables in shared memory
// before its loop (the threshold path: 64 bytes per scale code, 16 KiB for
// one-byte codes): no more thread blocks than the device holds at once (the
// occupancy API's count per multiprocessor, times the multiprocessors), so
// that each stages the tables once and then runs through many scale
// blocks. With a thread block per 256 scale blocks instead (grid_for), a
// 16384 x 4096 tensor in 1 x 16 blocks took 16384 thread blocks, each
// copying 16 KiB of tables for 16 KiB of elements. The result does not
// depend on the grid (each scale block is one thread's or one lane group's,
// and the counts are integer sums). Per device and kernel, once.
template <class Kernel>
int resident_grid(Kernel kernel, int64_t threads_needed) {
  static std::mutex mu;
  static std::vector<std::pair<std::pair<int, const void*>, int>> known;  // (device, kernel), thread blocks
  int dev = 0;
  cuda_check(cudaGetDevice(&dev), "cudaGetDevice");
  const auto key = std::make_pair(dev, reinterpret_cast<const void*>(kernel));
  int resident = 0;
  {
    const std::lock_guard<std::mutex> lock(mu);
    for (const auto& [k, v] : known)
      if (k == key) resident = v;
  }
  if (resident == 0) {
    int sms = 0, per_sm = 0;
    cuda_check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), "cudaDeviceGetAttribute");
    cuda_check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, 0),
               "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
    resident = std::max(1, sms) * std::max(1, per_sm);
    const std::lock_guard<std::mutex> lock(mu);
    known.emplace_back(key, resident);
  }
  return std::min(grid_for(threads_needed), resident);
}

// ---------------------------------------------------------------------------
// Backends: the device, and the host emulation of the same kernels
// ---------------------------------------------------------------------------
//
// Each backend fills values, codes and scale codes (each when non-null; the
// values also, into its own scratch, when the statistics' sums need them)
// and the counters (totals[kCounters] is the lowest unrepresentable flat
// index, or all ones); tensor_info turns the counters into the result.

struct Totals {
  unsigned long long c[kCounters + 1];
};

// The emulation's counts of one block (or element), added to the totals.
void add_to_totals(Totals& t, const Counts& cnt) {
  for (int k = 0; k < kCounters; ++k) t.c[k] += cnt.c[k];
}

constexpr unsigned long long kNoError = std::numeric_limits<unsigned long long>::max();

// A call's statistics from its counters and the tree of its sum partials,
// with its plan's reference and tensor scale (tensor_info's, and
// QuantRecord's where the kernels ran).
EXMY_HD void record_of(const unsigned long long* c, const SumPartial& sums, const QuantPlan& p, int64_t elements,
                       int64_t nblocks, QuantRecord* r) {
  QuantStats st;
  st.elements = static_cast<uint64_t>(elements);
  st.blocks = static_cast<uint64_t>(nblocks);
  st.nonzero = c[kNonzero];
  st.underflow = c[kUnderflow];
  st.saturated = c[kSaturatedCount];
  st.subnormal = c[kSubnormal];
  st.scale_underflow = c[kScaleUnderflow];
  st.scale_subnormal = c[kScaleSubnormal];
  st.scale_saturated = c[kScaleSaturated];
  st.scale_four = c[kScaleFour];
  const SumPartial s = final_sums(sums);
  st.sum_sq = s.sq;
  st.sum_sq_err = s.sq_err;
  st.sum_err = s.err;
  st.sum_abs = s.abs;
  r->stats = st;
  r->amax = p.amax;
  r->t = p.t;
}

// The launches that leave a call's record (QuantRecord) in its memory: the
// segment partials (a thread per segment), the tree's levels and one
// thread for the rest. a holds sum_segments(rows, cols) partials, b
// tree_scratch_items of them; totals and plan are the call's.
template <class L>
void record_launches(const L& launch, const float* x, const float* values, int64_t rows, int64_t cols,
                     int64_t nblocks, SumPartial* a, SumPartial* b, TreeTail<SumPartial>* tail,
                     const unsigned long long* totals, const QuantPlan* plan, QuantRecord* record) {
  int64_t n = sum_segments(rows, cols);
  launch("quantize statistics sums", n,
         [=] EXMY_HD_LAMBDA(int64_t i) { a[i] = tensor_segment_partial(x, values, cols, i); });
  const SumPartial* last = tree_levels(launch, a, b, n, tail);
  const int64_t m = n, elements = rows * cols;
  launch("quantize statistics record", 1, [=] EXMY_HD_LAMBDA(int64_t) {
    record_of(totals, tree_final(last, m, *tail), *plan, elements, nblocks, record);
  });
}

// Row outer scales: what the rows reported, into an info that
// detail::start_rows sized.
void take_rows(const std::vector<RowScale>& rs, QuantInfo& info) {
  for (size_t r = 0; r < rs.size(); ++r) {
    info.row_amax[r] = rs[r].amax;
    info.row_abs_max[r] = rs[r].abs_max;
    info.row_t[r] = rs[r].t;
  }
}

// The plan the error for element i is worded with: the call's, or with row
// outer scales the row's own (as the CPU paths word it).
QuantPlan error_plan(QuantPlan p, bool by_row, const QuantInfo& info, int64_t i, int64_t cols) {
  if (by_row) set_tensor_amax(p, info.row_amax[static_cast<size_t>(i / cols)]);
  return p;
}

// The result of a run from its plan, counters and sum partials; with row
// outer scales (`by_row`) `info` holds the rows' reports (take_rows) and
// the call's summary is made from them as the CPU paths make it.
QuantInfo tensor_info(const QuantPlan& p, bool by_row, QuantInfo info, const Totals& totals, int64_t rows,
                      int64_t cols, int64_t nblocks, const std::vector<SumPartial>& partials, QuantStats* stats) {
  info.amax = p.amax;
  info.t = p.t;
  if (by_row) detail::finish_rows(info);
  if (p.has_scale) {
    info.block_grid_rows = (rows + p.br - 1) / p.br;
    info.block_grid_cols = (cols + p.bc - 1) / p.bc;
  }
  if (stats) {
    QuantRecord r;
    record_of(totals.c, tree_sum(partials.data(), static_cast<int64_t>(partials.size())), p, rows * cols, nblocks,
              &r);
    *stats = r.stats;
  }
  return info;
}

// The input the emulated kernels see: x, or its random Hadamard transform by
// the device's launches run on the host (apply_rht_emulated, on a copy in
// `buffer`).
const float* transformed_input_emulated(const QuantSpec& spec, const float* x, int64_t rows, int64_t cols,
                                        std::vector<float>& buffer) {
  if (!spec.rht) return x;
  buffer.assign(x, x + rows * cols);
  apply_rht_emulated(spec, buffer.data(), rows, cols);
  return buffer.data();
}

}  // namespace

// The device backend on device pointers, with its scratch kept between calls.
struct CudaQuantizer::Impl {
  DeviceBuffer<unsigned long long> totals{kCounters + 1};
  DeviceBuffer<unsigned int> amax{1};
  DeviceBuffer<QuantPlan> plan{1};
  DeviceBuffer<float> values;  // when the caller asks for none but for statistics
  DeviceBuffer<SumPartial> partials;
  DeviceBuffer<SumPartial> tree_b{1};  // the tree's second buffer (a record's)
  DeviceBuffer<TreeTail<SumPartial>> tree_tail{1};
  DeviceBuffer<CodeTable> tables{kMaxScaleCodes};  // the threshold path's
  DeviceBuffer<uint8_t> table_use{kMaxScaleCodes};
  DeviceBuffer<detail::ScaleThr> scale_thr{1};  // the threshold path's scale-code thresholds
  DeviceBuffer<float> rotated;  // the random Hadamard transform of x (spec.rht)
  // Row outer scales: each row's max |x| bits, given reference, plan and report.
  DeviceBuffer<unsigned int> row_bits;
  DeviceBuffer<double> row_given;
  DeviceBuffer<QuantPlan> row_plans;
  DeviceBuffer<RowScale> row_scales;
  // The calls that did not wait, whose unrepresentable elements check()
  // reports: each one's plan and row length, and its lowest unrepresentable
  // index and that element's value on the device (kMaxPending slots,
  // allocated once: a check empties them).
  struct Pending {
    QuantPlan p;
    int64_t cols;
  };
  static constexpr size_t kMaxPending = 4096;
  std::vector<Pending> pending;
  DeviceBuffer<unsigned long long> err_index;
  DeviceBuffer<float> err_value;
  PinnedBuffer<unsigned long long> host_err_index;
  PinnedBuffer<float> host_err_value;
  // What comes back to the host, in page-locked memory.
  PinnedBuffer<Totals> host_totals;
  PinnedBuffer<QuantPlan> host_plan;
  PinnedBuffer<RowScale> host_row_scales;
  PinnedBuffer<SumPartial> host_partials;

  // x and the tensors of out are on the device, out.stats on the host; the
  // spec's conventions are the caller's business. With spec.rht the rest
  // reads the transform of x, made in `rotated`.
  // Reports the first unrepresentable element of the calls that did not
  // wait, in call order, with quantize's message; waits for the device.
  void check() {
    if (pending.empty()) return;
    const size_t n = pending.size();
    host_err_index.reserve(kMaxPending);
    host_err_value.reserve(kMaxPending);
    cuda_check(cudaMemcpyAsync(host_err_index.ptr, err_index.ptr, sizeof(unsigned long long) * n,
                               cudaMemcpyDeviceToHost),
               "cudaMemcpy (deferred errors)");
    cuda_check(cudaMemcpyAsync(host_err_value.ptr, err_value.ptr, sizeof(float) * n, cudaMemcpyDeviceToHost),
               "cudaMemcpy (deferred errors)");
    cuda_check(cudaStreamSynchronize(0), "quantize kernels");
    const std::vector<Pending> calls = std::move(pending);
    pending.clear();
    for (size_t k = 0; k < n; ++k)
      if (host_err_index.ptr[k] != kNoError)
        detail::throw_element_error(calls[k].p, host_err_value.ptr[k], static_cast<int64_t>(host_err_index.ptr[k]),
                                    calls[k].cols);
  }

  QuantInfo run(const QuantSpec& spec, const float* x, int64_t rows, int64_t cols, const QuantOutput& out,
                bool wait = true, bool need_info = true, float* t_out = nullptr, QuantRecord* record = nullptr) {
    QuantPlan p = spec.plan();  // validates; throws exmy::Error
    const bool by_row = spec.outer == OuterScale::row;
    // Without statistics or row scales, and with a tensor amax the host
    // knows (given or none) or a caller that reads none of the info, the
    // call need not wait: the host makes the plan the tensor plan kernel
    // makes (the same EXMY_HD code on the same inputs), and an
    // unrepresentable element waits for check().
    const bool lazy = !wait && !out.stats && !by_row && (spec.amax_kind != AmaxKind::current || !need_info);
    if (!lazy) check();  // (earlier calls' errors first)
    QuantInfo info;
    if (by_row) detail::start_rows(spec, 0, rows, info);  // (a reference per row: checked before any launch)
    const int64_t n = rows * cols;
    if (spec.rht) {
      const RhtParams rp = rht_params(spec, rows, cols);  // apply_rht's shape check
      if (n > 0) {
        rotated.reserve(static_cast<size_t>(n));
        cuda_check(cudaMemcpyAsync(rotated.ptr, x, sizeof(float) * n, cudaMemcpyDeviceToDevice), "cudaMemcpy (rht)");
        apply_rht_launches(DeviceLaunch{}, rotated.ptr, rows, cols, rp);
        x = rotated.ptr;
      }
    }
    const int64_t nblocks = block_count(spec, rows, cols);
    float* vals = out.values;  // none written when the caller asks for none and no statistics
    if (!vals && (out.stats || record) && n > 0) {
      values.reserve(static_cast<size_t>(n));
      vals = values.ptr;
    }
    // The counters start at 0, the lowest unrepresentable index at kNoError
    // (all ones): the call's, or a pending slot of a call that does not wait.
    if (lazy && pending.size() == kMaxPending) check();
    if (lazy && pending.empty()) {
      err_index.reserve(kMaxPending);
      err_value.reserve(kMaxPending);
    }
    unsigned long long* first_error = lazy ? err_index.ptr + pending.size() : totals.ptr + kCounters;
    cuda_check(cudaMemsetAsync(totals.ptr, 0, sizeof(unsigned long long) * kCounters), "cudaMemset (counters)");
    cuda_check(cudaMemsetAsync(first_error, 0xff, sizeof(unsigned long long)), "cudaMemset (counters)");
    // (With row outer scales the call's plan has no tensor scale; each row's has its own.)
    const AmaxKind kind = by_row ? AmaxKind::none : spec.amax_kind;
    if (kind == AmaxKind::current) {
      cuda_check(cudaMemsetAsync(amax.ptr, 0, sizeof(unsigned int)), "cudaMemset");
      DeviceProfileScope timed("quantize tensor amax");
      if (n > 0) abs_bits_max_kernel<<<abs_max_grid(n, kThreads), kThreads>>>(x, n, amax.ptr);
      cuda_check(cudaGetLastError(), "tensor amax kernel launch");
    }
    {
      DeviceProfileScope timed("quantize tensor plan");
      tensor_plan_kernel<<<1, 1>>>(p, kind, spec.amax_value, amax.ptr, plan.ptr);
    }
    cuda_check(cudaGetLastError(), "tensor plan kernel launch");
    if (t_out)
      cuda_check(cudaMemcpyAsync(t_out, reinterpret_cast<const char*>(plan.ptr) + offsetof(QuantPlan, t), sizeof(float),
                                 cudaMemcpyDeviceToDevice),
                 "cudaMemcpy (tensor scale)");
    const QuantPlan* rp = nullptr;  // the rows' plans (row outer scales)
    std::vector<RowScale> host_rows(static_cast<size_t>(by_row ? rows : 0));
    if (!host_rows.empty()) {
      row_bits.reserve(host_rows.size());
      row_plans.reserve(host_rows.size());
      row_scales.reserve(host_rows.size());
      if (spec.amax_kind == AmaxKind::given) {
        row_given.reserve(host_rows.size());
        cuda_check(cudaMemcpyAsync(row_given.ptr, spec.row_amax.data(), sizeof(double) * host_rows.size(),
                                   cudaMemcpyHostToDevice),
                   "cudaMemcpy (row references)");
      }
      DeviceProfileScope timed("quantize row plans");
      row_amax_kernel<<<grid_for(rows * 32), kThreads>>>(x, rows, cols, row_bits.ptr);
      cuda_check(cudaGetLastError(), "row amax kernel launch");
      row_plans_kernel<<<grid_for(rows), kThreads>>>(p, spec.amax_kind, row_given.ptr, row_bits.ptr, rows,
                                                     row_plans.ptr, row_scales.ptr);
      cuda_check(cudaGetLastError(), "row plans kernel launch");
      rp = row_plans.ptr;
    }
    if (n > 0) {
      const bool count = out.stats || record;  // the counts feed only the statistics
      const auto aligned = [](const void* ptr, uintptr_t to) { return reinterpret_cast<uintptr_t>(ptr) % to == 0; };
      const FastPath path = fast_path(spec, p, cols);
      if (path != FastPath::none && aligned(x, 16) && aligned(vals, 16) && aligned(out.codes, 4)) {
        const int ncodes = 1 << p.fs.bits;
        const bool step = path == FastPath::fp4_step;
        DeviceProfileScope timed(fast_path_name(path, p.bc == 1));
        code_tables_kernel<<<(ncodes * 8 + kThreads - 1) / kThreads, kThreads>>>(plan.ptr, ncodes, step, tables.ptr,
                                                                               table_use.ptr);
        cuda_check(cudaGetLastError(), "threshold tables kernel launch");
        scale_thr_kernel<<<1, 32>>>(plan.ptr, scale_thr.ptr);
        cuda_check(cudaGetLastError(), "scale-code thresholds kernel launch");
        const auto pick = [&](auto step_c) {
          constexpr bool kStep = decltype(step_c)::value;
          return count ? (p.bc == 1    ? quantize_thr_kernel<1, true, kStep>
                          : p.bc == 16 ? quantize_thr_kernel<16, true, kStep>
                                       : quantize_thr_kernel<32, true, kStep>)
                       : (p.bc == 1    ? quantize_thr_kernel<1, false, kStep>
                          : p.bc == 16 ? quantize_thr_kernel<16, false, kStep>
                                       : quantize_thr_kernel<32, false, kStep>);
        };
        auto kernel = step ? pick(std::true_type{}) : pick(std::false_type{});
        // a thread per column block; a group of p.br lanes per row block
        const int64_t threads = p.bc == 1 ? nblocks : (nblocks + 32 / p.br - 1) / (32 / p.br) * 32;
        kernel<<<resident_grid(kernel, threads), kThreads>>>(plan.ptr, x, rows, cols, scale_thr.ptr, tables.ptr,
                                                             table_use.ptr, ncodes, out.codes, out.scale_codes, vals,
                                                             totals.ptr, first_error);
      } else if (!p.has_scale) {
        auto kernel = count ? (rp ? quantize_noscale_kernel<true, true> : quantize_noscale_kernel<false, true>)
                            : (rp ? quantize_noscale_kernel<true, false> : quantize_noscale_kernel<false, false>);
        DeviceProfileScope timed(kNoScaleName);
        kernel<<<grid_for(n), kThreads>>>(plan.ptr, rp, x, n, cols, out.codes, vals, totals.ptr, first_error);
      } else {
        const int group = group_size(p);
        const int64_t warps = (nblocks + (32 / group) - 1) / (32 / group);
        auto kernel = count ? (rp ? quantize_blocks_kernel<true, true> : quantize_blocks_kernel<false, true>)
                            : (rp ? quantize_blocks_kernel<true, false> : quantize_blocks_kernel<false, false>);
        DeviceProfileScope timed(kGeneralKernelName);
        kernel<<<grid_for(warps * 32), kThreads>>>(plan.ptr, rp, x, rows, cols, group, out.codes, out.scale_codes, vals,
                                                   totals.ptr, first_error);
      }
      cuda_check(cudaGetLastError(), "quantize kernel launch");
    }
    if (record) {
      const int64_t nparts = sum_segments(rows, cols);
      partials.reserve(static_cast<size_t>(std::max<int64_t>(1, nparts)));
      tree_b.reserve(static_cast<size_t>(tree_scratch_items(nparts)));
      DeviceProfileScope timed("quantize statistics record");
      record_launches(DeviceLaunch{}, x, vals, rows, cols, nblocks, partials.ptr, tree_b.ptr, tree_tail.ptr,
                      totals.ptr, plan.ptr, record);
    }
    if (lazy) {
      const size_t k = pending.size();
      if (n > 0) {
        error_value_kernel<<<1, 1>>>(x, first_error, err_value.ptr + k);
        cuda_check(cudaGetLastError(), "error value kernel launch");
      } else {
        cuda_check(cudaMemsetAsync(err_value.ptr + k, 0, sizeof(float)), "cudaMemset");
      }
      // The info the host knows: the given (or no) reference's plan, or
      // with a current one that nobody reads, NaN amax and scale.
      QuantPlan hp = p;
      set_tensor_amax(hp, reference_amax_of(kind, spec.amax_value, 0u));
      pending.push_back(Pending{hp, cols});
      QuantInfo li = tensor_info(hp, false, std::move(info), Totals{}, rows, cols, nblocks, {}, nullptr);
      if (kind == AmaxKind::current) {
        li.amax = double_of(0x7ff8000000000000ull);
        li.t = float_of(0x7fc00000u);
      }
      return li;
    }
    const size_t nparts = static_cast<size_t>(out.stats ? sum_segments(rows, cols) : 0);
    if (nparts > 0) {
      partials.reserve(nparts);
      host_partials.reserve(nparts);
      DeviceProfileScope timed("quantize statistics sums");
      segment_sums_kernel<<<grid_for(static_cast<int64_t>(nparts)), kThreads>>>(x, vals, rows, cols, partials.ptr);
      cuda_check(cudaGetLastError(), "segment sums kernel launch");
      cuda_check(cudaMemcpyAsync(host_partials.ptr, partials.ptr, sizeof(SumPartial) * nparts, cudaMemcpyDeviceToHost),
                 "cudaMemcpy (sum partials)");
    }
    // Every result into page-locked memory, then one wait for all of them.
    DeviceProfileScope timed_copy("quantize results to the host (waits)");
    host_totals.reserve(1);
    host_plan.reserve(1);
    cuda_check(cudaMemcpyAsync(host_totals.ptr, totals.ptr, sizeof(Totals), cudaMemcpyDeviceToHost),
               "cudaMemcpy (counters)");
    cuda_check(cudaMemcpyAsync(host_plan.ptr, plan.ptr, sizeof p, cudaMemcpyDeviceToHost), "cudaMemcpy (plan)");
    if (!host_rows.empty()) {
      host_row_scales.reserve(host_rows.size());
      cuda_check(cudaMemcpyAsync(host_row_scales.ptr, row_scales.ptr, sizeof(RowScale) * host_rows.size(),
                                 cudaMemcpyDeviceToHost),
                 "cudaMemcpy (row scales)");
    }
    cuda_check(cudaStreamSynchronize(0), "quantize kernels");
    const Totals t = *host_totals.ptr;
    p = *host_plan.ptr;
    std::copy(host_row_scales.ptr, host_row_scales.ptr + host_rows.size(), host_rows.begin());
    const std::vector<SumPartial> host_sums(host_partials.ptr, host_partials.ptr + nparts);
    take_rows(host_rows, info);
    if (t.c[kCounters] != kNoError) {
      const int64_t i = static_cast<int64_t>(t.c[kCounters]);
      float xi = 0.0f;
      cuda_check(cudaMemcpy(&xi, x + i, sizeof xi, cudaMemcpyDeviceToHost), "cudaMemcpy (element)");
      detail::throw_element_error(error_plan(p, by_row, info, i, cols), xi, i, cols);
    }
    return tensor_info(p, by_row, std::move(info), t, rows, cols, nblocks, host_sums, out.stats);
  }
};

namespace {

// quantize_cuda without the conventions: host tensors through device copies
// (the transform, with spec.rht, on the device as for a CudaQuantizer).
QuantInfo quantize_host_via_device(const QuantSpec& spec, const float* x_in, int64_t rows, int64_t cols,
                                   const QuantOutput& out) {
  spec.validate();
  if (!cuda_available()) throw Error("quantize_cuda: " + cuda_device_description());
  const int64_t n = rows * cols;
  const size_t cb = static_cast<size_t>(spec.elem.code_bytes());
  const size_t scale_bytes =
      static_cast<size_t>(block_count(spec, rows, cols)) * (spec.scale ? spec.scale->code_bytes() : 1);
  DeviceBuffer<float> dx(static_cast<size_t>(n)), dv(out.values ? static_cast<size_t>(n) : 0);
  DeviceBuffer<uint8_t> dc(out.codes ? static_cast<size_t>(n) * cb : 0);
  DeviceBuffer<uint8_t> ds(out.scale_codes ? scale_bytes : 0);
  if (n > 0) cuda_check(cudaMemcpy(dx.ptr, x_in, sizeof(float) * n, cudaMemcpyHostToDevice), "cudaMemcpy (input)");
  CudaQuantizer::Impl impl;
  const QuantInfo info = impl.run(spec, dx.ptr, rows, cols, QuantOutput{dv.ptr, dc.ptr, ds.ptr, out.stats});
  if (out.values && n > 0)
    cuda_check(cudaMemcpy(out.values, dv.ptr, sizeof(float) * n, cudaMemcpyDeviceToHost), "cudaMemcpy (values)");
  if (out.codes && n > 0)
    cuda_check(cudaMemcpy(out.codes, dc.ptr, static_cast<size_t>(n) * cb, cudaMemcpyDeviceToHost), "cudaMemcpy (codes)");
  if (out.scale_codes && scale_bytes > 0)
    cuda_check(cudaMemcpy(out.scale_codes, ds.ptr, scale_bytes, cudaMemcpyDeviceToHost), "cudaMemcpy (scale codes)");
  return info;
}

// The threshold path's row blocks on the host: each block's lanes load
// their rows, the group's max is taken, then each lane finishes its row.
template <int BC, bool kStep>
void threshold_rows_emulated(const QuantPlan& p, const float* x, int64_t rows, int64_t cols, int64_t nblocks,
                             const detail::ScaleThr& st, const CodeTable* tab, const uint8_t* use, void* codes,
                             void* scale_codes, float* values, Totals& t) {
  std::vector<uint32_t> xb(static_cast<size_t>(p.br) * BC);  // lane l's row at xb[l * BC]
  for (int64_t blk = 0; blk < nblocks; ++blk) {
    const BlockGeom b = block_geom(p, rows, cols, blk);
    uint32_t m = 0;
    for (int l = 0; l < p.br; ++l) m = std::max(m, threshold_row_load<BC>(p, x, b, l, &xb[l * BC]));
    Counts cnt = {};
    for (int l = 0; l < p.br; ++l)
      threshold_row_part<BC, kStep>(p, x, b, blk, l, m, &xb[l * BC], st, tab, use, codes, scale_codes, values, cnt,
                                    &t.c[kCounters]);
    add_to_totals(t, cnt);
  }
}

// The kernels' per-block code run on the host: the transform's launches
// with HostLaunch, blocks in order, the lanes of a block's group one after
// another, the group's amax reduced as the shuffles would, the segment
// kernel's threads one after another.
QuantInfo quantize_emulated(const QuantSpec& spec, const float* x_in, int64_t rows, int64_t cols,
                            const QuantOutput& out, QuantRecord* record) {
  QuantPlan p = spec.plan();  // validates; throws exmy::Error
  const bool by_row = spec.outer == OuterScale::row;
  QuantInfo info;
  if (by_row) detail::start_rows(spec, 0, rows, info);
  const int64_t n = rows * cols;
  const int64_t nblocks = block_count(spec, rows, cols);
  std::vector<float> transformed;
  const float* x = transformed_input_emulated(spec, x_in, rows, cols, transformed);
  std::vector<float> own_values;  // (the statistics' sums read the values)
  float* values = out.values;
  if (!values && (out.stats || record)) {
    own_values.resize(static_cast<size_t>(n));
    values = own_values.data();
  }
  const AmaxKind kind = by_row ? AmaxKind::none : spec.amax_kind;
  uint32_t max_abs_bits = 0;
  if (kind == AmaxKind::current)
    for (int64_t i = 0; i < n; ++i) max_abs_bits = std::max(max_abs_bits, bits_of(x[i]) & 0x7fffffffu);
  set_tensor_amax(p, reference_amax_of(kind, spec.amax_value, max_abs_bits));
  // Row outer scales: the row amax kernel's warps (their lanes one after
  // another) and the row plans kernel's threads.
  std::vector<QuantPlan> row_plans(static_cast<size_t>(by_row ? rows : 0));
  std::vector<RowScale> row_scales(row_plans.size());
  std::vector<unsigned int> row_bits(row_plans.size(), 0u);
  for (int64_t r = 0; r < static_cast<int64_t>(row_plans.size()); ++r) {
    unsigned int& m = row_bits[static_cast<size_t>(r)];
    for (int l = 0; l < 32; ++l) m = std::max(m, block_amax_part(x, row_geom(r, cols), l, 32));
    make_row_plan(p, spec.amax_kind, spec.row_amax.data(), row_bits.data(), r, row_plans.data(), row_scales.data());
  }
  take_rows(row_scales, info);
  const QuantPlan* rp = row_plans.empty() ? nullptr : row_plans.data();

  Totals t = {};
  t.c[kCounters] = kNoError;
  if (!p.has_scale) {
    const BlockConsts c{1.0, 0.0f};
    for (int64_t i = 0; i < n; ++i) {
      const QuantPlan& pi = plan_of_row(p, rp, rp ? i / cols : 0);
      PointRandom rnd(pi);
      Counts cnt = {};
      quantize_element(pi, c, x, i, out.codes, values, cnt, &t.c[kCounters], rnd);
      add_to_totals(t, cnt);
    }
  } else if (const FastPath path = n > 0 ? fast_path(spec, p, cols) : FastPath::none; path != FastPath::none) {
    const bool step = path == FastPath::fp4_step;
    std::vector<CodeTable> tab(kMaxScaleCodes);
    std::vector<uint8_t> use(kMaxScaleCodes);
    const int ncodes = 1 << p.fs.bits;
    for (int i = 0; i < ncodes * 8; ++i)
      code_table_entry(p, static_cast<uint32_t>(i / 8), i % 8, step, tab.data(), use.data());
    const detail::ScaleThr st = detail::scale_code_thresholds(p);  // scale_thr_kernel's steps in order
    if (p.bc == 1) {
      auto column = step ? threshold_column_part<true> : threshold_column_part<false>;
      for (int64_t blk = 0; blk < nblocks; ++blk) {
        Counts cnt = {};
        column(p, x, rows, cols, blk, st, tab.data(), use.data(), out.codes, out.scale_codes, values, cnt,
               &t.c[kCounters]);
        add_to_totals(t, cnt);
      }
    } else {
      auto rows_of = p.bc == 16 ? (step ? threshold_rows_emulated<16, true> : threshold_rows_emulated<16, false>)
                                : (step ? threshold_rows_emulated<32, true> : threshold_rows_emulated<32, false>);
      rows_of(p, x, rows, cols, nblocks, st, tab.data(), use.data(), out.codes, out.scale_codes, values, t);
    }
  } else if (n > 0) {
    const int group = group_size(p);
    for (int64_t blk = 0; blk < nblocks; ++blk) {
      const BlockGeom b = block_geom(p, rows, cols, blk);
      uint32_t m = 0;
      for (int l = 0; l < group; ++l) m = std::max(m, block_amax_part(x, b, l, group));
      Counts cnt = {};
      for (int l = 0; l < group; ++l)
        quantize_block_part(plan_of_row(p, rp, b.r0), x, blk, b, m, l, group, out.codes, out.scale_codes, values, cnt,
                            &t.c[kCounters]);
      add_to_totals(t, cnt);
    }
  }
  std::vector<SumPartial> partials(static_cast<size_t>(out.stats ? sum_segments(rows, cols) : 0));
  for (size_t i = 0; i < partials.size(); ++i)
    partials[i] = tensor_segment_partial(x, values, cols, static_cast<int64_t>(i));
  if (record) {  // the device's launches, their threads one after another
    const int64_t nparts = sum_segments(rows, cols);
    std::vector<SumPartial> a(static_cast<size_t>(std::max<int64_t>(1, nparts)));
    std::vector<SumPartial> b(static_cast<size_t>(tree_scratch_items(nparts)));
    TreeTail<SumPartial> tail;
    record_launches(HostLaunch{}, x, values, rows, cols, nblocks, a.data(), b.data(), &tail, t.c, &p, record);
  }
  if (t.c[kCounters] != kNoError) {
    const int64_t i = static_cast<int64_t>(t.c[kCounters]);
    detail::throw_element_error(error_plan(p, by_row, info, i, cols), x, i, cols);
  }
  return tensor_info(p, by_row, std::move(info), t, rows, cols, nblocks, partials, out.stats);
}

}  // namespace

// ---------------------------------------------------------------------------
// Entry points
// ---------------------------------------------------------------------------

int cuda_device_count(std::string* error) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    if (error) *error = cudaGetErrorString(e);
    return 0;
  }
  return n;
}

bool cuda_available() { return cuda_device_count(nullptr) > 0; }

std::string cuda_device_description() {
  std::string error;
  const int n = cuda_device_count(&error);
  if (!error.empty()) return "no CUDA device (" + error + ")";
  if (n == 0) return "no CUDA device";
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) return "CUDA device 0 (properties unavailable)";
  return std::string(prop.name) + " (sm_" + std::to_string(prop.major) + std::to_string(prop.minor) + ")";
}

void cuda_select_device(int index) { cuda_check(cudaSetDevice(index), "cudaSetDevice"); }

CudaQuantizer::CudaQuantizer() : impl_(std::make_unique<Impl>()) {}
CudaQuantizer::~CudaQuantizer() = default;

QuantInfo CudaQuantizer::run(const QuantSpec& spec, const float* x, int64_t rows, int64_t cols,
                             const QuantOutput& out, bool wait, bool need_info, float* t_out, QuantRecord* record) {
  if (conventions_apply(spec))
    throw Error("CudaQuantizer: the code and dequantization conventions of other implementations are not "
                "implemented on device tensors yet (quantize_cuda applies them on the host)");
  return impl_->run(spec, x, rows, cols, out, wait, need_info, t_out, record);
}

void CudaQuantizer::check() { impl_->check(); }

QuantInfo quantize_cuda(const QuantSpec& spec, const float* x, int64_t rows, int64_t cols, const QuantOutput& out) {
  return with_conventions(spec, x, rows, cols, out,
                          [&](const QuantOutput& o) { return quantize_host_via_device(spec, x, rows, cols, o); });
}

const char* detail::quantize_path_cuda(const QuantSpec& spec, int64_t rows, int64_t cols) {
  const QuantPlan p = spec.plan();
  if (!p.has_scale) return kNoScaleName;
  const FastPath path = rows * cols > 0 ? fast_path(spec, p, cols) : FastPath::none;
  return path == FastPath::none ? kGeneralKernelName : fast_path_name(path, p.bc == 1);
}

detail::ScaleThr detail::scale_code_thresholds_cuda(const QuantPlan& p) {
  if (!cuda_available()) throw Error("scale_code_thresholds_cuda: " + cuda_device_description());
  DeviceBuffer<QuantPlan> dp(1);
  DeviceBuffer<detail::ScaleThr> dt(1);
  cuda_check(cudaMemcpy(dp.ptr, &p, sizeof p, cudaMemcpyHostToDevice), "cudaMemcpy (plan)");
  scale_thr_kernel<<<1, 32>>>(dp.ptr, dt.ptr);
  cuda_check(cudaGetLastError(), "scale-code thresholds kernel launch");
  detail::ScaleThr out;
  cuda_check(cudaMemcpy(&out, dt.ptr, sizeof out, cudaMemcpyDeviceToHost), "cudaMemcpy (scale-code thresholds)");
  return out;
}

QuantInfo quantize_cuda_emulated(const QuantSpec& spec, const float* x, int64_t rows, int64_t cols,
                                 const QuantOutput& out, QuantRecord* record) {
  return with_conventions(spec, x, rows, cols, out,
                          [&](const QuantOutput& o) { return quantize_emulated(spec, x, rows, cols, o, record); });
}

void apply_rht_cuda(const QuantSpec& spec, float* x_device, int64_t rows, int64_t cols) {
  apply_rht_launches(DeviceLaunch{}, x_device, rows, cols, rht_params(spec, rows, cols));
}

}  // namespace exmy

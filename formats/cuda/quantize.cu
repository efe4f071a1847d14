// The CUDA path of block-scaled quantization (see quantize_cuda.hpp).
//
// Launch shape. Without a block scale, one thread per element (grid-stride).
// With a block scale, each scale block is owned by a group of G lanes of one
// warp, G = min(32, next power of two >= block size): the group reduces the
// block amax over the integer bits of |x| with shuffles, every lane of the
// group then computes the same block_scale() (the core is deterministic, so
// no broadcast is needed), and the lanes encode the block's elements. The
// launch shape never changes a result: every decision is made by the shared
// core from (plan, element value, flat index), and the random bits of an
// element come from its flat index (docs/numerics.md §4).
//
// Integer statistics are per-thread counters, reduced per warp and added
// with 64-bit atomics (integer addition is associative, so the totals are
// exact). The double sums (docs/numerics.md §5): one thread per segment
// makes the segment's partial with the shared segment_partial (its terms one
// after another in column order), and the host combines the copied-back
// partials with the fixed tree, as quantize() does.
#include "formats/cuda/quantize_cuda.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>
#include <vector>

#include "formats/conventions.hpp"
#include "formats/error.hpp"
#include "formats/philox.hpp"
#include "formats/quant_core.hpp"
#include "formats/quant_sums.hpp"
#include "formats/spec.hpp"

namespace exmy {
namespace {

// ---------------------------------------------------------------------------
// Host helpers
// ---------------------------------------------------------------------------

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(std::string("CUDA error in ") + what + ": " + cudaGetErrorString(e));
}

// A device allocation freed on scope exit.
template <class T>
struct DeviceBuffer {
  T* ptr = nullptr;
  explicit DeviceBuffer(size_t count) {
    if (count > 0) check(cudaMalloc(reinterpret_cast<void**>(&ptr), count * sizeof(T)), "cudaMalloc");
  }
  ~DeviceBuffer() {
    if (ptr) cudaFree(ptr);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

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

struct Counts {
  unsigned long long c[kCounters];
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

// Records element i as unrepresentable; the lowest index wins.
EXMY_HD void note_error(unsigned long long* first_error, int64_t i) {
#if defined(__CUDA_ARCH__)
  atomicMin(first_error, static_cast<unsigned long long>(i));
#else
  if (static_cast<unsigned long long>(i) < *first_error) *first_error = static_cast<unsigned long long>(i);
#endif
}

EXMY_HD bool nan_representable(const QuantPlan& p) { return p.fe.has_nan || (p.has_scale && p.fs.has_nan); }

// One element that is not in a NaN block or a zero-scale block: docs/numerics.md
// §3 steps 4-5 through the shared core (the element lambda of quantize_ref).
EXMY_HD void quantize_element(const QuantPlan& p, const BlockConsts& c, const float* x, int64_t i, void* codes,
                              float* values, Counts& cnt, unsigned long long* first_error) {
  const float xi = x[i];
  uint32_t code;
  float xh;
  if (is_nan(xi)) {
    if (!nan_representable(p)) note_error(first_error, i);
    code = p.fe.has_nan ? p.fe.nan_code : zero_code(p.fe, xi);
    xh = float_of(0x7fc00000u);
  } else {
    const uint32_t r = is_stochastic(p.round) ? random_bits(p.seed, p.stream, static_cast<uint64_t>(i), p.sr_bits) : 0u;
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
  values[i] = xh;
}

// Lane l of a group of `group` lanes: max of the bits of |x| over elements
// l, l + group, ... of the block (as unsigned integers, which orders non-NaN
// magnitudes like floats and puts every NaN above +Inf).
EXMY_HD uint32_t block_amax_part(const float* x, const BlockGeom& b, int l, int group) {
  uint32_t m = 0;
  for (int64_t k = l; k < b.count; k += group) {
    const uint32_t a = bits_of(x[b.flat(k)]) & 0x7fffffffu;
    m = a > m ? a : m;
  }
  return m;
}

// Lane l of the group owning block `blk`, given the block's amax bits m (the
// group's reduction of block_amax_part): the scale (lane 0 stores it and
// counts the block statistics) and elements l, l + group, ... of the block.
EXMY_HD void quantize_block_part(const QuantPlan& p, const float* x, int64_t blk, const BlockGeom& b, uint32_t m, int l,
                                 int group, void* codes, void* scale_codes, float* values, Counts& cnt,
                                 unsigned long long* first_error) {
  const int sb = p.fs.code_bytes(), cb = p.fe.code_bytes();
  if (m > 0x7f800000u) {
    // A NaN makes the whole block NaN.
    const bool nan_ok = nan_representable(p);
    if (l == 0) store_code(scale_codes, sb, blk, p.fs.has_nan ? p.fs.nan_code : 0u);
    for (int64_t k = l; k < b.count; k += group) {
      const int64_t i = b.flat(k);
      const float xi = x[i];
      if (!nan_ok && is_nan(xi)) note_error(first_error, i);
      const uint32_t code = p.fe.has_nan ? p.fe.nan_code : zero_code(p.fe, xi);
      cnt.c[kNonzero] += xi != 0.0f;
      cnt.c[kSubnormal] += p.fe.classify(code) == CodeClass::subnormal;
      store_code(codes, cb, i, code);
      values[i] = float_of(0x7fc00000u);
    }
    return;
  }
  // Every lane computes the same scale from the same b (no broadcast needed),
  // and with four over six the same choice from the whole block.
  bool four = false;
  const BlockScale bs = four_over_six(p, x, b, float_of(m), block_scale(p, float_of(m)), four);
  if (l == 0) {
    cnt.c[kScaleFour] += four;
    cnt.c[kScaleSaturated] += bs.saturated;
    cnt.c[kScaleUnderflow] += bs.underflow;
    cnt.c[kScaleSubnormal] += p.fs.classify(bs.code) == CodeClass::subnormal;
    store_code(scale_codes, sb, blk, bs.code);
  }
  const BlockConsts c = block_consts(p, bs.s);
  for (int64_t k = l; k < b.count; k += group) {
    const int64_t i = b.flat(k);
    if (bs.zero) {
      // Scale 0: every element encodes to zero, keeping the sign of -0.
      const float xi = x[i];
      const uint32_t code = zero_code(p.fe, xi);
      cnt.c[kNonzero] += xi != 0.0f;
      cnt.c[kUnderflow] += xi != 0.0f;
      store_code(codes, cb, i, code);
      values[i] = (code & p.fe.sign_bit) ? -0.0f : 0.0f;
    } else {
      quantize_element(p, c, x, i, codes, values, cnt, first_error);
    }
  }
}

// Lanes per scale block: min(32, next power of two >= block size).
int group_size(const QuantPlan& p) {
  const int64_t block_size = static_cast<int64_t>(p.br) * p.bc;
  int group = 1;
  while (group < 32 && group < block_size) group <<= 1;
  return group;
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

// Tensor amax as the max over the bits of |x| (NaN above every magnitude).
__global__ void abs_bits_max_kernel(const float* x, int64_t n, unsigned int* result) {
  unsigned int m = 0;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    m = max(m, bits_of(x[i]) & 0x7fffffffu);
  for (int off = 16; off > 0; off >>= 1) m = max(m, __shfl_down_sync(kFullMask, m, off));
  if ((threadIdx.x & 31) == 0) atomicMax(result, m);
}

// Without a block scale: one thread per element.
__global__ void quantize_noscale_kernel(QuantPlan p, const float* x, int64_t n, void* codes, float* values,
                                        unsigned long long* totals, unsigned long long* first_error) {
  Counts cnt = {};
  const BlockConsts c{1.0, 0.0f};
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    quantize_element(p, c, x, i, codes, values, cnt, first_error);
  flush_counts(cnt, totals);
}

// With a block scale: a group of `group` lanes (a power of two <= 32) per
// scale block, 32 / group blocks per warp.
__global__ void quantize_blocks_kernel(QuantPlan p, const float* x, int64_t rows, int64_t cols, int group,
                                       void* codes, void* scale_codes, float* values, unsigned long long* totals,
                                       unsigned long long* first_error) {
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
    if (valid) quantize_block_part(p, x, blk, b, m, l, group, codes, scale_codes, values, cnt, first_error);
  }
  flush_counts(cnt, totals);
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

// ---------------------------------------------------------------------------
// Backends: the device, and the host emulation of the same kernels
// ---------------------------------------------------------------------------
//
// Each backend gives the bits of the tensor amax (max over bits of |x|) and
// then runs the quantization, filling values (always), codes and scale
// codes (when non-null) on the host, and the counters (totals[kCounters]
// is the lowest unrepresentable flat index, or all ones).

struct Totals {
  unsigned long long c[kCounters + 1];
};

class DeviceBackend {
 public:
  DeviceBackend(const QuantPlan& p, const float* x, int64_t n, int64_t nblocks)
      : n_(n), nblocks_(nblocks), cb_(p.fe.code_bytes()), sb_(p.has_scale ? p.fs.code_bytes() : 1),
        x_(static_cast<size_t>(n)), values_(static_cast<size_t>(n)), codes_(static_cast<size_t>(n) * cb_),
        scales_(static_cast<size_t>(nblocks) * sb_), totals_(kCounters + 1), amax_(1) {
    if (n > 0) check(cudaMemcpy(x_.ptr, x, sizeof(float) * n, cudaMemcpyHostToDevice), "cudaMemcpy (input)");
  }

  uint32_t amax_bits() {
    unsigned int bits = 0;
    if (n_ == 0) return bits;
    check(cudaMemset(amax_.ptr, 0, sizeof(unsigned int)), "cudaMemset");
    abs_bits_max_kernel<<<grid_for(n_), kThreads>>>(x_.ptr, n_, amax_.ptr);
    check(cudaGetLastError(), "tensor amax kernel launch");
    check(cudaMemcpy(&bits, amax_.ptr, sizeof bits, cudaMemcpyDeviceToHost), "tensor amax kernel");
    return bits;
  }

  Totals run(const QuantPlan& p, int64_t rows, int64_t cols, float* values, void* codes, void* scales) {
    Totals t = {};
    t.c[kCounters] = std::numeric_limits<unsigned long long>::max();
    check(cudaMemcpy(totals_.ptr, t.c, sizeof t.c, cudaMemcpyHostToDevice), "cudaMemcpy (counters)");
    if (n_ > 0) {
      if (!p.has_scale) {
        quantize_noscale_kernel<<<grid_for(n_), kThreads>>>(p, x_.ptr, n_, codes_.ptr, values_.ptr, totals_.ptr,
                                                            totals_.ptr + kCounters);
      } else {
        const int group = group_size(p);
        const int64_t warps = (nblocks_ + (32 / group) - 1) / (32 / group);
        quantize_blocks_kernel<<<grid_for(warps * 32), kThreads>>>(p, x_.ptr, rows, cols, group, codes_.ptr,
                                                                   scales_.ptr, values_.ptr, totals_.ptr,
                                                                   totals_.ptr + kCounters);
      }
      check(cudaGetLastError(), "quantize kernel launch");
      check(cudaDeviceSynchronize(), "quantize kernel");
    }
    check(cudaMemcpy(t.c, totals_.ptr, sizeof t.c, cudaMemcpyDeviceToHost), "cudaMemcpy (counters)");
    if (n_ > 0)
      check(cudaMemcpy(values, values_.ptr, sizeof(float) * n_, cudaMemcpyDeviceToHost), "cudaMemcpy (values)");
    if (codes && n_ > 0)
      check(cudaMemcpy(codes, codes_.ptr, static_cast<size_t>(n_) * cb_, cudaMemcpyDeviceToHost), "cudaMemcpy (codes)");
    if (scales && nblocks_ > 0)
      check(cudaMemcpy(scales, scales_.ptr, static_cast<size_t>(nblocks_) * sb_, cudaMemcpyDeviceToHost),
            "cudaMemcpy (scale codes)");
    return t;
  }

  // After run: the segment partials of the double sums, into out[0..segments).
  void partials(int64_t rows, int64_t cols, SumPartial* out) {
    const int64_t segs = sum_segments(rows, cols);
    if (segs == 0) return;
    DeviceBuffer<SumPartial> part(static_cast<size_t>(segs));
    segment_sums_kernel<<<grid_for(segs), kThreads>>>(x_.ptr, values_.ptr, rows, cols, part.ptr);
    check(cudaGetLastError(), "segment sums kernel launch");
    check(cudaMemcpy(out, part.ptr, sizeof(SumPartial) * static_cast<size_t>(segs), cudaMemcpyDeviceToHost),
          "segment sums kernel");
  }

 private:
  int64_t n_, nblocks_;
  int cb_, sb_;
  DeviceBuffer<float> x_, values_;
  DeviceBuffer<uint8_t> codes_, scales_;
  DeviceBuffer<unsigned long long> totals_;
  DeviceBuffer<unsigned int> amax_;
};

// The kernels' per-block code run on the host: blocks in order, the lanes of
// a block's group one after another, the group's amax reduced as the
// shuffles would.
class EmulatedBackend {
 public:
  EmulatedBackend(const float* x, int64_t n) : x_(x), n_(n) {}

  uint32_t amax_bits() const {
    uint32_t m = 0;
    for (int64_t i = 0; i < n_; ++i) m = std::max(m, bits_of(x_[i]) & 0x7fffffffu);
    return m;
  }

  Totals run(const QuantPlan& p, int64_t rows, int64_t cols, float* values, void* codes, void* scales) const {
    Totals t = {};
    t.c[kCounters] = std::numeric_limits<unsigned long long>::max();
    Counts cnt = {};
    if (!p.has_scale) {
      const BlockConsts c{1.0, 0.0f};
      for (int64_t i = 0; i < n_; ++i) quantize_element(p, c, x_, i, codes, values, cnt, &t.c[kCounters]);
    } else if (n_ > 0) {
      const int group = group_size(p);
      const int64_t nblocks = ((rows + p.br - 1) / p.br) * ((cols + p.bc - 1) / p.bc);
      for (int64_t blk = 0; blk < nblocks; ++blk) {
        const BlockGeom b = block_geom(p, rows, cols, blk);
        uint32_t m = 0;
        for (int l = 0; l < group; ++l) m = std::max(m, block_amax_part(x_, b, l, group));
        for (int l = 0; l < group; ++l)
          quantize_block_part(p, x_, blk, b, m, l, group, codes, scales, values, cnt, &t.c[kCounters]);
      }
    }
    for (int k = 0; k < kCounters; ++k) t.c[k] = cnt.c[k];
    return t;
  }

  // The segment kernel's threads one after another, on the values run wrote.
  void partials(int64_t rows, int64_t cols, const float* values, SumPartial* out) const {
    for (int64_t i = 0; i < sum_segments(rows, cols); ++i) out[i] = tensor_segment_partial(x_, values, cols, i);
  }

 private:
  const float* x_;
  int64_t n_;
};

// quantize_cuda with either backend.
QuantInfo quantize_with(const QuantSpec& spec, const float* x_in, int64_t rows, int64_t cols, const QuantOutput& out,
                        bool emulate) {
  QuantPlan p = spec.plan();  // validates; throws exmy::Error
  if (!emulate && !cuda_available()) throw Error("quantize_cuda: " + cuda_device_description());
  const int64_t n = rows * cols;
  const int64_t nblocks = block_count(spec, rows, cols);

  // RHT on the host (exmy::hadamard16 gives the same bits as hadamard16_ref).
  std::vector<float> transformed;
  const float* x = x_in;
  if (spec.rht) {
    transformed.assign(x_in, x_in + n);
    hadamard16(transformed.data(), rows, cols, spec.block_rows == 1 ? 1 : 0, spec.rht_signs);
    x = transformed.data();
  }

  std::vector<float> own_values;
  float* values = out.values;
  if (!values) {
    own_values.resize(static_cast<size_t>(n));
    values = own_values.data();
  }

  auto quantize_on = [&](auto& backend) {
    // docs/numerics.md §3 step 1: the reference amax, then t.
    double A = std::numeric_limits<double>::quiet_NaN();
    if (spec.amax_kind == AmaxKind::given) {
      A = spec.amax_value;
    } else if (spec.amax_kind == AmaxKind::current) {
      const uint32_t bits = backend.amax_bits();
      A = bits > 0x7f800000u ? std::numeric_limits<double>::quiet_NaN() : static_cast<double>(float_of(bits));
    }
    set_tensor_amax(p, A);
    return backend.run(p, rows, cols, values, out.codes, out.scale_codes);
  };
  Totals totals;
  std::vector<SumPartial> partials(static_cast<size_t>(out.stats ? sum_segments(rows, cols) : 0));
  if (emulate) {
    EmulatedBackend backend(x, n);
    totals = quantize_on(backend);
    if (out.stats) backend.partials(rows, cols, values, partials.data());
  } else {
    DeviceBackend backend(p, x, n, nblocks);
    totals = quantize_on(backend);
    if (out.stats) backend.partials(rows, cols, partials.data());
  }
  if (totals.c[kCounters] != std::numeric_limits<unsigned long long>::max())
    detail::throw_element_error(p, x, static_cast<int64_t>(totals.c[kCounters]), cols);

  QuantInfo info;
  info.amax = p.amax;
  info.t = p.t;
  if (p.has_scale) {
    info.block_grid_rows = (rows + p.br - 1) / p.br;
    info.block_grid_cols = (cols + p.bc - 1) / p.bc;
  }
  if (out.stats) {
    QuantStats st;
    st.elements = static_cast<uint64_t>(n);
    st.blocks = static_cast<uint64_t>(nblocks);
    st.nonzero = totals.c[kNonzero];
    st.underflow = totals.c[kUnderflow];
    st.saturated = totals.c[kSaturatedCount];
    st.subnormal = totals.c[kSubnormal];
    st.scale_underflow = totals.c[kScaleUnderflow];
    st.scale_subnormal = totals.c[kScaleSubnormal];
    st.scale_saturated = totals.c[kScaleSaturated];
    st.scale_four = totals.c[kScaleFour];
    detail::store_sums(tree_sum(partials.data(), static_cast<int64_t>(partials.size())), st);
    *out.stats = st;
  }
  return info;
}

}  // namespace

// ---------------------------------------------------------------------------
// Entry points
// ---------------------------------------------------------------------------

bool cuda_available() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();  // clear the error state of the failed query
    return false;
  }
  return n > 0;
}

std::string cuda_device_description() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return std::string("no CUDA device (") + cudaGetErrorString(e) + ")";
  }
  if (n == 0) return "no CUDA device";
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) return "CUDA device 0 (properties unavailable)";
  return std::string(prop.name) + " (sm_" + std::to_string(prop.major) + std::to_string(prop.minor) + ")";
}

QuantInfo quantize_cuda(const QuantSpec& spec, const float* x, int64_t rows, int64_t cols, const QuantOutput& out) {
  return with_conventions(spec, x, rows, cols, out,
                          [&](const QuantOutput& o) { return quantize_with(spec, x, rows, cols, o, false); });
}

QuantInfo quantize_cuda_emulated(const QuantSpec& spec, const float* x, int64_t rows, int64_t cols,
                                 const QuantOutput& out) {
  return with_conventions(spec, x, rows, cols, out,
                          [&](const QuantOutput& o) { return quantize_with(spec, x, rows, cols, o, true); });
}

}  // namespace exmy

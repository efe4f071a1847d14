// The small kernels a quantized linear needs on a device, over a launcher
// (sim/kernel_launch.hpp): data movement and elementwise arithmetic whose
// bits equal the CPU's (the transpose moves floats; the BF16 rounding is
// sim/bf16.hpp's function; the add is one float addition per element), and
// the statistics' integer reductions and row gathers (sim/quant/device_stats.hpp
// runs them; their per-item decisions are sim/quant/stats_items.hpp's).
// Instantiated with HostLaunch (quant_launches_emulated.cpp) and DeviceLaunch
// (sim/quant/cuda/quant_ops.cu).
#pragma once

#include <algorithm>
#include <cstdint>

#include "formats/format.hpp"
#include "formats/quantize.hpp"
#include "formats/tree_launches.hpp"
#include "sim/bf16.hpp"
#include "sim/kernel_launch.hpp"
#include "sim/quant/stats_items.hpp"

namespace exmy::sim::quant {

template <class L>
void transpose_launches(const L& launch, float* dst, const float* src, int64_t rows, int64_t cols) {
  launch("transpose", rows * cols, [=] EXMY_HD_LAMBDA(int64_t i) {
    const int64_t c = i / rows, r = i % rows;  // consecutive threads write consecutive dst
    dst[i] = src[r * cols + c];
  });
}

template <class L>
void round_bf16_launches(const L& launch, float* dst, const float* src, int64_t n) {
  launch("round_bf16", n, [=] EXMY_HD_LAMBDA(int64_t i) { dst[i] = round_bf16_hd(src[i]); });
}

template <class L>
void add_launches(const L& launch, float* dst, const float* src, int64_t n) {
  launch("add", n, [=] EXMY_HD_LAMBDA(int64_t i) { dst[i] += src[i]; });
}

// Code i of an unpacked code array (little-endian, `bytes` each), as
// formats/pack.hpp's load_code reads it.
EXMY_HD uint32_t code_at(const uint8_t* p, int bytes, int64_t i) {
  if (bytes == 1) return p[i];
  if (bytes == 2) return static_cast<uint32_t>(p[2 * i]) | (static_cast<uint32_t>(p[2 * i + 1]) << 8);
  uint32_t v = 0;
  for (int k = 0; k < 4; ++k) v |= static_cast<uint32_t>(p[4 * i + k]) << (8 * k);
  return v;
}

// What encode_launches needs of a QuantSpec (formats, block shape).
struct EncodePlan {
  Format elem, scale;
  bool scaled = false;
  int64_t block_rows = 1, block_cols = 1;
};

inline EncodePlan encode_plan(const QuantSpec& q) {
  EncodePlan p;
  p.elem = q.elem;
  p.scaled = q.scale.has_value();
  if (p.scaled) p.scale = *q.scale, p.block_rows = q.block_rows, p.block_cols = q.block_cols;
  return p;
}

// Element i's encoded value q·s (the element's decoded value times its
// block's decoded scale, in double: both exact, as the CPU's value tables
// hold them) of an operand (rows, cols) from its codes and scale codes.
struct EncodedValues {
  const uint8_t *codes, *scale_codes;
  int cb, sb;
  int64_t cols, br, bc, gc;
  Format fe, fs;
  bool scaled;
  EncodedValues(const EncodePlan& p, const void* c, const void* sc, int64_t cols_)
      : codes(static_cast<const uint8_t*>(c)), scale_codes(static_cast<const uint8_t*>(sc)),
        cb(p.elem.code_bytes()), sb(p.scaled ? p.scale.code_bytes() : 1), cols(cols_),
        br(p.scaled ? p.block_rows : 1), bc(p.scaled ? p.block_cols : cols_), gc((cols_ + bc - 1) / bc),
        fe(p.elem), fs(p.scale), scaled(p.scaled) {}
  EXMY_HD double operator()(int64_t i) const {
    const int64_t r = i / cols, c = i % cols;
    const double s = scaled ? fs.decode(code_at(scale_codes, sb, (r / br) * gc + c / bc)) : 1.0;
    return fe.decode(code_at(codes, cb, i)) * s;
  }
};

// encode_operand of sim/quant/grouped_gemm.hpp, one thread per element.
template <class L>
void encode_launches(const L& launch, double* v, const EncodePlan& p, const void* codes, const void* scale_codes,
                     int64_t rows, int64_t cols) {
  const EncodedValues e(p, codes, scale_codes, cols);
  launch("encode", rows * cols, [=] EXMY_HD_LAMBDA(int64_t i) { v[i] = e(i); });
}

// The same encoded values as bfloat16 bits, for the `fp32` model's BF16
// GEMM (QuantizedLinear, RuntimeOptions::fp32_gemm): only for formats whose
// every q·s bfloat16 holds (bf16_holds_encoded in sim/quant/quant_ops.hpp),
// so the conversion through float is exact.
template <class L>
void encode_bf16_launches(const L& launch, uint16_t* v, const EncodePlan& p, const void* codes,
                          const void* scale_codes, int64_t rows, int64_t cols) {
  const EncodedValues e(p, codes, scale_codes, cols);
  launch("encode_bf16", rows * cols,
         [=] EXMY_HD_LAMBDA(int64_t i) { v[i] = bf16_bits(static_cast<float>(e(i))); });
}

// alpha[0] = fl(fl(1/t_a[0]) · fl(1/t_b[0])): tensor_decode_alpha of
// sim/quant/grouped_gemm.hpp where the tensor scales are (the BF16 GEMM's
// epilogue scale on a device, without the host reading the scales).
template <class L>
void decode_alpha_launches(const L& launch, float* alpha, const float* t_a, const float* t_b) {
  launch("decode_alpha", 1, [=] EXMY_HD_LAMBDA(int64_t) {
    alpha[0] = fp32_rne_div(1.0, t_a[0]) * fp32_rne_div(1.0, t_b[0]);
  });
}

// --- statistics (docs/recipes.md, "Statistics") ------------------------------
//
// The reductions run in two launches without atomics: `parts` threads each
// reduce the items i = t, t + parts, t + 2·parts, ... (adjacent threads
// read adjacent items) into their own partial, then a thread per result
// combines the partials. Every reduction is an integer max or an integer
// count, so neither the split nor the order changes a value: the results
// equal the CPU's functions' (sim/quant/stats.cpp) bit for bit.

// How many partials a reduction over `items` into `bins` results takes: at
// least 256 items a thread, at most 2^16 threads and 2^20 partial entries.
inline int64_t stats_parts(int64_t items, int64_t bins) {
  int64_t parts = (items + 255) / 256;
  const int64_t most = std::max<int64_t>(1, std::min<int64_t>(int64_t{1} << 16, (int64_t{1} << 20) / bins));
  return std::max<int64_t>(1, std::min(parts, most));
}

// part[t] = the max over i ≡ t (mod parts), i < n, of bits[i] & 0x7fffffff:
// |x|'s bits of floats (abs_bits), or a first pass's partials again.
template <class L>
void max_abs_bits_launches(const L& launch, uint32_t* part, const uint32_t* bits, int64_t n, int64_t parts) {
  launch("max_abs_bits", parts, [=] EXMY_HD_LAMBDA(int64_t t) {
    uint32_t m = 0;
    for (int64_t i = t; i < n; i += parts) {
      const uint32_t a = bits[i] & 0x7fffffffu;
      m = a > m ? a : m;
    }
    part[t] = m;
  });
}

// part[t · bins + c] = how many of the codes i ≡ t (mod parts), i < blocks,
// are c (code_bytes 1 or 2: bins = 256 or 65536).
template <class L>
void count_codes_launches(const L& launch, uint32_t* part, const uint8_t* codes, int code_bytes, int64_t blocks,
                          int64_t parts) {
  const int64_t bins = int64_t{1} << (8 * code_bytes);
  launch("count_codes", parts, [=] EXMY_HD_LAMBDA(int64_t t) {
    uint32_t* h = part + t * bins;
    for (int64_t c = 0; c < bins; ++c) h[c] = 0;
    for (int64_t i = t; i < blocks; i += parts) ++h[code_at(codes, code_bytes, i)];
  });
}

// An operand's block statistics in one pass (DeviceStats::operand_later):
// partial t's bins = kRangeHistBins + code_bins + 1 entries are, over the
// blocks b ≡ t (mod parts) of x (rows, cols; br x bc blocks in row-major
// block order, edge blocks partial: add_block_ranges's blocks), the range
// bins (range_bin_of), the counts of those blocks' scale codes (codes[b],
// code_bins = 2^(8·code_bytes); none when codes is null) and the max of
// |x|'s bits over their elements (the tensor's amax: every element lies in
// one block).
inline int64_t block_stats_bins(const uint8_t* codes, int code_bytes) {
  return kRangeHistBins + (codes ? int64_t{1} << (8 * code_bytes) : 0) + 1;
}

template <class L>
void count_blocks_launches(const L& launch, uint32_t* part, const float* x, int64_t rows, int64_t cols, int64_t br,
                           int64_t bc, const uint8_t* codes, int code_bytes, int64_t parts) {
  const int64_t grid_c = (cols + bc - 1) / bc, blocks = (rows + br - 1) / br * grid_c;
  const int64_t bins = block_stats_bins(codes, code_bytes);
  launch("count_blocks", parts, [=] EXMY_HD_LAMBDA(int64_t t) {
    uint32_t* h = part + t * bins;
    for (int64_t k = 0; k < bins; ++k) h[k] = 0;
    uint32_t m = 0;
    for (int64_t b = t; b < blocks; b += parts) {
      const int64_t r0 = b / grid_c * br, c0 = b % grid_c * bc;
      const int64_t r1 = r0 + br < rows ? r0 + br : rows, c1 = c0 + bc < cols ? c0 + bc : cols;
      BlockRange s;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c) s.add(x[r * cols + c]);
      const int k = range_bin_of(s.hi, s.lo);
      if (k >= 0) ++h[k];
      if (codes) ++h[kRangeHistBins + code_at(codes, code_bytes, b)];
      m = s.hi > m ? s.hi : m;
    }
    h[bins - 1] = m;
  });
}

// counts[c] = the sum over t < parts of part[t · bins + c] for c < bins - 1,
// and counts[bins - 1] their max (count_blocks_launches' partials).
template <class L>
void finish_blocks_launches(const L& launch, uint64_t* counts, const uint32_t* part, int64_t parts, int64_t bins) {
  launch("finish_blocks", bins, [=] EXMY_HD_LAMBDA(int64_t c) {
    uint64_t n = 0;
    for (int64_t t = 0; t < parts; ++t) {
      const uint64_t v = part[t * bins + c];
      n = c == bins - 1 ? (v > n ? v : n) : n + v;
    }
    counts[c] = n;
  });
}

// counts[c] = the sum over t < parts of part[t · bins + c] (c < bins).
template <class L>
void sum_parts_launches(const L& launch, uint64_t* counts, const uint32_t* part, int64_t parts, int64_t bins) {
  launch("sum_parts", bins, [=] EXMY_HD_LAMBDA(int64_t c) {
    uint64_t n = 0;
    for (int64_t t = 0; t < parts; ++t) n += part[t * bins + c];
    counts[c] = n;
  });
}

// The GEMM statistics' operands: dst (R, ld) = the rows sampled_row(i, M, R)
// of src (M, ld) ...
template <class L>
void gather_rows_launches(const L& launch, float* dst, const float* src, int64_t ld, int64_t M, int64_t R) {
  launch("gather_rows", R * ld, [=] EXMY_HD_LAMBDA(int64_t j) {
    const int64_t i = j / ld, c = j % ld;
    dst[j] = src[sampled_row(i, M, R) * ld + c];
  });
}

// ... and dst (R, rows) = the columns sampled_row(i, cols, R) of src
// (rows, cols), i.e. rows of src^T.
template <class L>
void gather_columns_launches(const L& launch, float* dst, const float* src, int64_t rows, int64_t cols, int64_t R) {
  launch("gather_columns", R * rows, [=] EXMY_HD_LAMBDA(int64_t j) {
    const int64_t i = j / rows, t = j % rows;
    dst[j] = src[t * cols + sampled_row(i, cols, R)];
  });
}

// The GEMM statistics' sums of the compared rows got and ref (R, N) into
// *out, in sim/quant/stats_items.hpp's order: a thread per segment's
// partial (into a), the tree's levels (through b and *tail;
// formats/tree_launches.hpp) and one thread for the last group.
template <class L>
void gemm_sums_launches(const L& launch, GemmPartial* out, const float* got, const float* ref, int64_t R, int64_t N,
                        GemmPartial* a, GemmPartial* b, TreeTail<GemmPartial>* tail) {
  int64_t n = N > 0 ? R * gemm_segments_per_row(N) : 0;
  const GemmRows rows{got, ref, nullptr, N};
  launch("gemm statistics sums", n, [=] EXMY_HD_LAMBDA(int64_t k) { a[k] = gemm_segment_partial(rows, N, k); });
  const GemmPartial* last = tree_levels(launch, a, b, n, tail);
  const int64_t m = n;
  launch("gemm statistics record", 1, [=] EXMY_HD_LAMBDA(int64_t) { *out = tree_final(last, m, *tail); });
}

// One launcher's statistics kernels (the *_emulated or *_cuda entry points
// below), for sim/quant/device_stats.hpp, which runs them on a device's
// memory and brings the small results to the host.
struct StatsKernels {
  void (*max_abs_bits)(uint32_t* part, const uint32_t* bits, int64_t n, int64_t parts);
  void (*count_codes)(uint32_t* part, const uint8_t* codes, int code_bytes, int64_t blocks, int64_t parts);
  void (*sum_parts)(uint64_t* counts, const uint32_t* part, int64_t parts, int64_t bins);
  void (*gather_rows)(float* dst, const float* src, int64_t ld, int64_t M, int64_t R);
  void (*gather_columns)(float* dst, const float* src, int64_t rows, int64_t cols, int64_t R);
  void (*gemm_sums)(GemmPartial* out, const float* got, const float* ref, int64_t R, int64_t N, GemmPartial* a,
                    GemmPartial* b, TreeTail<GemmPartial>* tail);
  void (*count_blocks)(uint32_t* part, const float* x, int64_t rows, int64_t cols, int64_t br, int64_t bc,
                       const uint8_t* codes, int code_bytes, int64_t parts);
  void (*finish_blocks)(uint64_t* counts, const uint32_t* part, int64_t parts, int64_t bins);
};

#define EXMY_QUANT_KERNELS(suffix)                                                          \
  void transpose_##suffix(float* dst, const float* src, int64_t rows, int64_t cols);        \
  void round_bf16_##suffix(float* dst, const float* src, int64_t n);                        \
  void add_##suffix(float* dst, const float* src, int64_t n);                               \
  void encode_##suffix(double* v, const EncodePlan& p, const void* codes, const void* scale_codes, int64_t rows, \
                       int64_t cols);                                                                   \
  void encode_bf16_##suffix(uint16_t* v, const EncodePlan& p, const void* codes, const void* scale_codes,      \
                            int64_t rows, int64_t cols);                                                      \
  void decode_alpha_##suffix(float* alpha, const float* t_a, const float* t_b);                               \
  void max_abs_bits_##suffix(uint32_t* part, const uint32_t* bits, int64_t n, int64_t parts);                 \
  void count_codes_##suffix(uint32_t* part, const uint8_t* codes, int code_bytes, int64_t blocks, int64_t parts); \
  void sum_parts_##suffix(uint64_t* counts, const uint32_t* part, int64_t parts, int64_t bins);               \
  void gather_rows_##suffix(float* dst, const float* src, int64_t ld, int64_t M, int64_t R);                  \
  void gather_columns_##suffix(float* dst, const float* src, int64_t rows, int64_t cols, int64_t R);          \
  void gemm_sums_##suffix(GemmPartial* out, const float* got, const float* ref, int64_t R, int64_t N,          \
                          GemmPartial* a, GemmPartial* b, TreeTail<GemmPartial>* tail);                        \
  void count_blocks_##suffix(uint32_t* part, const float* x, int64_t rows, int64_t cols, int64_t br, int64_t bc, \
                             const uint8_t* codes, int code_bytes, int64_t parts);                              \
  void finish_blocks_##suffix(uint64_t* counts, const uint32_t* part, int64_t parts, int64_t bins);           \
  StatsKernels stats_kernels_##suffix();

EXMY_QUANT_KERNELS(emulated)
#if defined(EXMY_HAVE_CUDA)
EXMY_QUANT_KERNELS(cuda)
#endif
#undef EXMY_QUANT_KERNELS

}  // namespace exmy::sim::quant

// The small kernels a quantized linear needs on a device, over a launcher
// (sim/kernel_launch.hpp): data movement and elementwise arithmetic whose
// bits equal the CPU's (the transpose moves floats; the BF16 rounding is
// sim/bf16.hpp's function; the add is one float addition per element).
// Instantiated with HostLaunch (quant_launches_emulated.cpp) and DeviceLaunch
// (sim/quant/cuda/quant_ops.cu).
#pragma once

#include <cstdint>

#include "formats/format.hpp"
#include "sim/bf16.hpp"
#include "sim/kernel_launch.hpp"

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

// encode_operand of sim/quant/grouped_gemm.hpp, one thread per element: the
// element's decoded value times its block's decoded scale, in double (both
// exact, as the CPU's value tables hold them).
template <class L>
void encode_launches(const L& launch, double* v, const EncodePlan& p, const void* codes, const void* scale_codes,
                     int64_t rows, int64_t cols) {
  const auto* pc = static_cast<const uint8_t*>(codes);
  const auto* ps = static_cast<const uint8_t*>(scale_codes);
  const int cb = p.elem.code_bytes(), sb = p.scaled ? p.scale.code_bytes() : 1;
  const int64_t br = p.scaled ? p.block_rows : 1, bc = p.scaled ? p.block_cols : cols;
  const int64_t gc = (cols + bc - 1) / bc;
  const Format fe = p.elem, fs = p.scale;
  const bool scaled = p.scaled;
  launch("encode", rows * cols, [=] EXMY_HD_LAMBDA(int64_t i) {
    const int64_t r = i / cols, c = i % cols;
    const double s = scaled ? fs.decode(code_at(ps, sb, (r / br) * gc + c / bc)) : 1.0;
    v[i] = fe.decode(code_at(pc, cb, i)) * s;
  });
}

#define EXMY_QUANT_KERNELS(suffix)                                                          \
  void transpose_##suffix(float* dst, const float* src, int64_t rows, int64_t cols);        \
  void round_bf16_##suffix(float* dst, const float* src, int64_t n);                        \
  void add_##suffix(float* dst, const float* src, int64_t n);                               \
  void encode_##suffix(double* v, const EncodePlan& p, const void* codes, const void* scale_codes, int64_t rows, \
                       int64_t cols);

EXMY_QUANT_KERNELS(emulated)
#if defined(EXMY_HAVE_CUDA)
EXMY_QUANT_KERNELS(cuda)
#endif
#undef EXMY_QUANT_KERNELS

}  // namespace exmy::sim::quant

// BF16 tensor-core MMAs (mma.sync m16n8k16, BF16 in, FP32 accumulate) for
// kernels whose per-thread work is EXMY_HD code with a host emulation: the
// fragments a lane loads from shared memory (the PTX ISA's layouts, section
// "Matrix Fragments for mma.m16n8k16 with floating point type"), the
// instruction itself on a device, and one warp's instruction on the host.
// Used by the grouped GEMM model's kernel (sim/quant/grouped_mma.hpp) and
// fused attention (models/attention_fused.hpp).
#pragma once

#include <cstdint>
#include <cstring>

#include "formats/format.hpp"  // EXMY_HD, float_of

// A loop the device compiler unrolls (fixed trip counts over a thread's
// register arrays, which must not be indexed at run time); nothing on the
// host.
#if defined(__CUDA_ARCH__)
#define EXMY_MMA_UNROLL _Pragma("unroll")
#define EXMY_MMA_NOINLINE __noinline__
#else
#define EXMY_MMA_UNROLL
#define EXMY_MMA_NOINLINE
#endif

namespace exmy::sim {

// Sixteen bytes (eight BF16), the unit a thread stages. load_as and
// store_as read and write a T (the unit, or a register's two BF16) at BF16
// storage: memcpy on the host, where the arrays are uint16_t (no aliasing
// through another type); one wide access on a device.
struct alignas(16) Bf16x8 {
  uint32_t w[4];
};
template <class T>
EXMY_HD T load_as(const uint16_t* p) {
#if defined(__CUDA_ARCH__)
  return *reinterpret_cast<const T*>(p);
#else
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
#endif
}
template <class T>
EXMY_HD void store_as(uint16_t* p, const T& v) {
#if defined(__CUDA_ARCH__)
  *reinterpret_cast<T*>(p) = v;
#else
  std::memcpy(p, &v, sizeof v);
#endif
}

// Two BF16 of a shared row (stride ld) as one register, the lower column in
// the low half.
EXMY_HD uint32_t mma_pair(const uint16_t* s, int ld, int row, int col) {
  return load_as<uint32_t>(s + row * ld + col);
}
// Two BF16 bit patterns as one register (lo in the low half).
EXMY_HD uint32_t mma_pack(uint16_t lo, uint16_t hi) {
  return static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
}
// The A fragment of m16n8k16 (row-major 16 x 16 at rows r0.., columns k0..
// of a shared array of row stride ld): lane = 4·groupID + threadID_in_group
// holds rows groupID and groupID + 8, columns 2·threadID_in_group (+1) and
// +8.
EXMY_HD void mma_frag_a(const uint16_t* s, int ld, int r0, int k0, int lane, uint32_t a[4]) {
  const int g = lane >> 2, t = lane & 3;
  a[0] = mma_pair(s, ld, r0 + g, k0 + 2 * t);
  a[1] = mma_pair(s, ld, r0 + g + 8, k0 + 2 * t);
  a[2] = mma_pair(s, ld, r0 + g, k0 + 2 * t + 8);
  a[3] = mma_pair(s, ld, r0 + g + 8, k0 + 2 * t + 8);
}
// The B fragment (16 x 8, "col": B's columns are the shared array's rows
// n0.., its K the columns k0..): rows k = 2·threadID_in_group (+1) and +8 of
// column n = groupID.
EXMY_HD void mma_frag_b(const uint16_t* s, int ld, int n0, int k0, int lane, uint32_t b[2]) {
  const int g = lane >> 2, t = lane & 3;
  b[0] = mma_pair(s, ld, n0 + g, k0 + 2 * t);
  b[1] = mma_pair(s, ld, n0 + g, k0 + 2 * t + 8);
}

// The B fragment from a shared array that holds B as [k][n] (row stride
// ld: rows k0.. are K, columns n0.. are N): the same elements as
// mma_frag_b's, two 16-bit loads a register.
EXMY_HD void mma_frag_b_kn(const uint16_t* s, int ld, int n0, int k0, int lane, uint32_t b[2]) {
  const int g = lane >> 2, t = lane & 3;
  const uint16_t* const c = s + n0 + g;
  b[0] = mma_pack(c[(k0 + 2 * t) * ld], c[(k0 + 2 * t + 1) * ld]);
  b[1] = mma_pack(c[(k0 + 2 * t + 8) * ld], c[(k0 + 2 * t + 9) * ld]);
}

#if defined(__CUDACC__)
// d += A·B for one warp's m16n8k16 fragments (BF16 in, FP32 out).
__device__ __forceinline__ void mma_bf16_16816(float* d, const uint32_t* a, const uint32_t* b) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
#endif

// The coordinates of fragment element i of a lane (element i is half i % 2
// of register i / 2); C's element i is the accumulator's i-th float.
inline void mma_a_coord(int lane, int i, int& row, int& col) {
  const int g = lane >> 2, t = lane & 3;
  row = (i < 2 || (i >= 4 && i < 6)) ? g : g + 8;
  col = t * 2 + (i & 1) + (i >= 4 ? 8 : 0);
}
inline void mma_b_coord(int lane, int i, int& row, int& col) {
  const int g = lane >> 2, t = lane & 3;
  row = t * 2 + (i & 1) + (i >= 2 ? 8 : 0);
  col = g;
}
inline void mma_c_coord(int lane, int i, int& row, int& col) {
  const int g = lane >> 2, t = lane & 3;
  row = i < 2 ? g : g + 8;
  col = t * 2 + (i & 1);
}

// One warp's mma.m16n8k16.row.col.f32.bf16.bf16.f32 on the host: d (32
// lanes x 4) += A (from a: 32 lanes x 4 registers) times B (b: 32 x 2), k
// in order. With float d, in float32 (for kernels that use only outputs
// every order gives exactly); with double d, in double (the products of
// BF16 values are exact), for an emulation that sums a chain of MMAs in
// double and rounds it once where its kernel reads the accumulators, so
// that a bound can hold it to about one rounding of the chain.
// (Each output's sum runs over k in order; the loops over an output row's
// eight columns inside k let the compiler use vectors, one column a lane.)
template <class T>
inline void mma_m16n8k16_host(const uint32_t (*a)[4], const uint32_t (*b)[2], T (*d)[4]) {
  T A[16][16], B[16][8], D[16][8];
  const auto half = [](uint32_t reg, int h) { return float_of((h ? reg >> 16 : reg & 0xffffu) << 16); };
  for (int lane = 0; lane < 32; ++lane) {
    for (int i = 0; i < 8; ++i) {
      int r, c;
      mma_a_coord(lane, i, r, c);
      A[r][c] = static_cast<T>(half(a[lane][i / 2], i % 2));
    }
    for (int i = 0; i < 4; ++i) {
      int r, c;
      mma_b_coord(lane, i, r, c);
      B[r][c] = static_cast<T>(half(b[lane][i / 2], i % 2));
      mma_c_coord(lane, i, r, c);
      D[r][c] = d[lane][i];
    }
  }
  for (int r = 0; r < 16; ++r)
    for (int k = 0; k < 16; ++k)
      for (int c = 0; c < 8; ++c) D[r][c] += A[r][k] * B[k][c];
  for (int lane = 0; lane < 32; ++lane)
    for (int i = 0; i < 4; ++i) {
      int r, c;
      mma_c_coord(lane, i, r, c);
      d[lane][i] = D[r][c];
    }
}

}  // namespace exmy::sim

// The per-segment work of the n-point Hadamard transforms of
// docs/numerics.md §3 (n = 16, 32, 64, 128), plain EXMY_HD code: the CPU's
// OpenMP loops (formats/hadamard.cpp: hadamard, apply_rht) call
// rht_segment, and so does apply_rht_launches below, which
// formats/cuda/quantize.cu runs with DeviceLaunch and hadamard.cpp's
// apply_rht_emulated with HostLaunch. One function makes every bit, so the
// device's transform equals the CPU's:
//   x'_j = 1/sqrt(n) * sum_i s_i x_i H_ij,  H_ij = (-1)^popcount(i & j),
// the exact sum rounded once to bf16 (rne) for n = 16 and 64, where 1/sqrt(n)
// is a power of two, as Transformer Engine does before quantizing the wgrad
// operands; for n = 32 and 128 the exact sum in round-to-odd double form is
// first multiplied (double, rne) by the double nearest 1/sqrt(2).
//
// Exactness: a segment whose n inputs span at most 52 - log2(n) binades (from
// the lowest set bit of the smallest to the top of the largest) sums exactly
// in double, so the fast Walsh-Hadamard butterflies are exact there. Other
// segments take a 320-bit fixed-point accumulator. Either way the exact sum
// reaches the rounding core in round-to-odd form. Every operation is an IEEE
// +, - or * of doubles whose result is exact, or one conversion, and none
// can be contracted into an fma with a different result (host:
// -ffp-contract=off; device: --fmad=false), so the bits do not depend on the
// compiler either.
#pragma once

#include <cstdint>

#include "formats/format.hpp"
#include "formats/kernel_launch.hpp"

namespace exmy {

// The largest transform (points).
constexpr int kMaxRht = 128;

// A transform made ready for the segments (rht_params, formats/quantize.hpp,
// validates it against a tensor's shape): its points, its axis and its
// sign vector as bits.
struct RhtParams {
  int size = 16;         // n: 16, 32, 64 or 128
  int axis = 1;          // 1: runs of n consecutive elements of a row; 0: of a column
  uint32_t neg[4] = {};  // bit i % 32 of word i / 32 set where s_i = -1
  EXMY_HD bool negated(int i) const { return ((neg[i >> 5] >> (i & 31)) & 1u) != 0; }
};

namespace rht_detail {

EXMY_HD int popcount32(uint32_t v) {
#if defined(__CUDA_ARCH__)
  return __popc(v);
#else
  return __builtin_popcount(v);
#endif
}

// Leading zeros of a non-zero 64-bit word.
EXMY_HD int clz64(uint64_t v) {
#if defined(__CUDA_ARCH__)
  return __clzll(static_cast<long long>(v));
#else
  return __builtin_clzll(v);
#endif
}

EXMY_HD bool is_finite(float x) { return (bits_of(x) & 0x7f800000u) != 0x7f800000u; }
EXMY_HD double abs_of(double x) { return double_of(bits_of(x) & 0x7fffffffffffffffull); }
EXMY_HD int max_of(int a, int b) { return a < b ? b : a; }
EXMY_HD int min_of(int a, int b) { return b < a ? b : a; }

// log2 of a power of two n.
EXMY_HD int log2_size(int n) {
  int k = 0;
  while ((1 << k) < n) ++k;
  return k;
}

// Whether H_ij = -1.
EXMY_HD bool h_neg(int i, int j) { return (popcount32(static_cast<uint32_t>(i & j)) & 1) != 0; }

// bf16 (rne) of a sum held in round-to-odd form, times 1/sqrt(n): for n = 32
// and 128 the sum is first multiplied by the double nearest 1/sqrt(2) (one
// double rne product); the power of two (1/4 or 1/8) is exact in double; the
// result is first rounded to odd at float precision (24 bits:
// at least two more than bf16 in every binade, float subnormals included),
// then to bf16 with round-to-nearest-even on the float's bits. Overflow gives
// Inf, as bf16 rounding without saturation does.
EXMY_HD float to_bf16(double s_rto, int n) {
  const double r = (n == 32 || n == 128) ? s_rto * 0x1.6a09e667f3bcdp-1 : s_rto;
  const double v = r * (n <= 32 ? 0.25 : 0.125);
  if (is_nan(v)) return float_of(0x7fc00000u);
  const float f = static_cast<float>(v);  // rne, subnormals kept (device: no ftz)
  const double fd = f;
  const uint32_t inexact = fd != v ? 1u : 0u;
  const uint32_t away = abs_of(fd) > abs_of(v) ? 1u : 0u;  // truncate first (Inf -> FLT_MAX)
  uint32_t u = (bits_of(f) - (inexact & away)) | inexact;
  if ((u & 0x7fffffffu) >= 0x7f800000u) return f;  // an infinite input stays infinite
  u += 0x7fffu + ((u >> 16) & 1u);  // carries reach the next binade, or Inf
  return float_of(u & 0xffff0000u);
}

// Lowest binade touched by a float: exponent of its last significand bit.
EXMY_HD int low_exp(float x) {
  const uint32_t b = bits_of(x) & 0x7fffffffu;
  const int e = static_cast<int>(b >> 23);
  return e == 0 ? -149 : e - 150;
}

// Exact sum of n <= 128 signed floats in a 320-bit two's complement fixed-point
// number with its lowest bit worth 2^-149, returned in round-to-odd form.
EXMY_HD double exact_sum_rto(const float* t, int n) {
  uint64_t acc[5] = {0, 0, 0, 0, 0};
  for (int k = 0; k < n; ++k) {
    const uint32_t b = bits_of(t[k]);
    const int e = static_cast<int>((b >> 23) & 0xff);
    uint64_t m = b & 0x7fffffu;
    if (e != 0) m |= 0x800000u;
    if (m == 0) continue;
    const int pos = e == 0 ? 0 : e - 1;  // bit position of m's lowest bit
    // 320-bit value m << pos
    uint64_t v[5] = {0, 0, 0, 0, 0};
    const int limb = pos / 64, off = pos % 64;
    v[limb] = m << off;
    if (off > 40 && limb + 1 < 5) v[limb + 1] = m >> (64 - off);
    if (b >> 31) {  // negate
      uint64_t carry = 1;
      for (int i = 0; i < 5; ++i) {
        const uint64_t nv = ~v[i] + carry;
        carry = (carry && nv == 0) ? 1 : 0;
        v[i] = nv;
      }
    }
    uint64_t carry = 0;
    for (int i = 0; i < 5; ++i) {
      const uint64_t s1 = acc[i] + v[i];
      const uint64_t c1 = s1 < acc[i];
      const uint64_t s2 = s1 + carry;
      const uint64_t c2 = s2 < s1;
      acc[i] = s2;
      carry = c1 | c2;
    }
  }
  const bool neg = acc[4] >> 63;
  if (neg) {
    uint64_t carry = 1;
    for (int i = 0; i < 5; ++i) {
      const uint64_t nv = ~acc[i] + carry;
      carry = (carry && nv == 0) ? 1 : 0;
      acc[i] = nv;
    }
  }
  int top = -1;
  for (int i = 4; i >= 0 && top < 0; --i)
    if (acc[i]) top = i * 64 + 63 - clz64(acc[i]);
  if (top < 0) {
    // An exact zero sum is -0 only when every term is -0, as IEEE addition
    // gives in any order (the butterfly path agrees).
    bool all_neg_zero = true;
    for (int k = 0; k < n; ++k) all_neg_zero = all_neg_zero && bits_of(t[k]) == 0x80000000u;
    return all_neg_zero ? -0.0 : 0.0;
  }
  auto bit = [&](int p) -> uint64_t { return p < 0 ? 0 : (acc[p / 64] >> (p % 64)) & 1u; };
  // Top 53 bits, with every lower bit folded into the last one.
  uint64_t sig = 0;
  for (int p = top; p > top - 53; --p) sig = (sig << 1) | bit(p);
  bool sticky = false;
  for (int p = top - 53; p >= 0 && !sticky; --p) sticky = bit(p) != 0;
  if (sticky) sig |= 1u;
  // sig * 2^(top - 201): sig < 2^53 converts exactly, and the product is a
  // normal double (at least 2^-149), so it is exact (ldexp's value).
  const double mag = static_cast<double>(sig) * pow2(top - 52 - 149);
  return neg ? -mag : mag;
}

}  // namespace rht_detail

// The transform of one segment of n = p.size consecutive floats, in place.
EXMY_HD void rht_transform_segment(float* seg, const RhtParams& p) {
  using namespace rht_detail;
  const int n = p.size;
  float t[kMaxRht];
  bool finite = true;
  int hi = -1000, lo = 1000;
  for (int i = 0; i < n; ++i) {
    t[i] = p.negated(i) ? -seg[i] : seg[i];
    if (!is_finite(t[i])) finite = false;
    if (t[i] != 0.0f) {
      hi = max_of(hi, ilog2(static_cast<double>(t[i])));
      lo = min_of(lo, low_exp(t[i]));
    }
  }
  double y[kMaxRht];
  for (int i = 0; i < n; ++i) y[i] = t[i];
  if (!finite || hi - lo <= 52 - log2_size(n)) {
    // Exact in double: every partial sum is a multiple of 2^lo below 2^(hi+1+log2 n).
    for (int h = 1; h < n; h <<= 1)
      for (int i = 0; i < n; i += 2 * h)
        for (int j = i; j < i + h; ++j) {
          const double a = y[j], b = y[j + h];
          y[j] = a + b;
          y[j + h] = a - b;
        }
    // The butterflies subtract partial sums, and -(c + d) is not (-c) + (-d)
    // for signed zeros. An exact zero output takes the sign of the direct
    // sum: -0 only when all its n terms are -0.
    bool all_zero = true;
    for (int i = 0; i < n; ++i) all_zero = all_zero && t[i] == 0.0f;
    for (int j = 0; j < n; ++j) {
      if (y[j] == 0.0 && finite) {
        bool all_neg = all_zero;
        for (int i = 0; i < n && all_neg; ++i) all_neg = (sign_bit(t[i]) != h_neg(i, j));
        y[j] = all_neg ? -0.0 : 0.0;
      }
      seg[j] = to_bf16(y[j], n);
    }
    return;
  }
  for (int j = 0; j < n; ++j) {
    float u[kMaxRht];
    for (int i = 0; i < n; ++i) u[i] = h_neg(i, j) ? -t[i] : t[i];
    seg[j] = to_bf16(exact_sum_rto(u, n), n);
  }
}

// Segments of a [rows, cols] row-major tensor (the axis length a multiple of
// p.size): rows * cols / p.size.
EXMY_HD int64_t rht_segment_count(int64_t rows, int64_t cols, const RhtParams& p) { return rows * cols / p.size; }

// Segment s of x [rows, cols], in place. Along rows (axis 1) segment s is
// elements [n s, n s + n) of the flat tensor; along columns (axis 0) it is
// column s % cols of row block s / cols (rows n (s / cols) ... + n - 1),
// gathered, transformed and scattered back.
EXMY_HD void rht_segment(float* x, int64_t cols, const RhtParams& p, int64_t s) {
  const int n = p.size;
  if (p.axis == 1) {
    rht_transform_segment(x + n * s, p);
    return;
  }
  float* base = x + (s / cols) * n * cols + (s % cols);
  float seg[kMaxRht];
  for (int i = 0; i < n; ++i) seg[i] = base[i * cols];
  rht_transform_segment(seg, p);
  for (int i = 0; i < n; ++i) base[i * cols] = seg[i];
}

// The transform of x [rows, cols] in place, one thread per segment, over a
// launcher of formats/kernel_launch.hpp (x on the launcher's side: device
// memory for DeviceLaunch, host memory for HostLaunch). p comes from
// rht_params, which checked the shape.
template <class L>
void apply_rht_launches(const L& launch, float* x, int64_t rows, int64_t cols, const RhtParams& p) {
  launch("rht_segments", rht_segment_count(rows, cols, p),
         [=] EXMY_HD_LAMBDA(int64_t s) { rht_segment(x, cols, p, s); });
}

}  // namespace exmy

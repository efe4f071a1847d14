// The 16-point random Hadamard transform of docs/numerics.md §3:
//   x'_j = 1/4 * sum_i s_i x_i H_ij,  H_ij = (-1)^popcount(i & j),
// with the exact sum rounded once to bf16 (rne), as Transformer Engine does
// before quantizing the wgrad operands.
//
// Exactness: a segment whose 16 inputs span at most 48 binades (from the
// lowest set bit of the smallest to the top of the largest) sums exactly in
// double, so the fast Walsh-Hadamard butterflies are exact there. Other
// segments take a 320-bit fixed-point accumulator. Either way the exact sum
// reaches the rounding core in round-to-odd form, so the bf16 result is the
// correctly rounded one.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "formats/error.hpp"
#include "formats/quantize.hpp"
#include "formats/spec.hpp"

namespace exmy {
namespace {

// bf16 (rne) of 1/4 of a sum held in round-to-odd form. The quarter is exact
// in double; the result is first rounded to odd at float precision (24 bits:
// at least two more than bf16 in every binade, float subnormals included),
// then to bf16 with round-to-nearest-even on the float's bits. Overflow gives
// Inf, as bf16 rounding without saturation does.
float to_bf16(double s_rto_times4) {
  const double v = s_rto_times4 * 0.25;
  if (std::isnan(v)) return std::numeric_limits<float>::quiet_NaN();
  const float f = static_cast<float>(v);
  const double fd = f;
  const uint32_t inexact = fd != v ? 1u : 0u;
  const uint32_t away = std::fabs(fd) > std::fabs(v) ? 1u : 0u;  // truncate first (Inf -> FLT_MAX)
  uint32_t u = (bits_of(f) - (inexact & away)) | inexact;
  if ((u & 0x7fffffffu) >= 0x7f800000u) return f;  // an infinite input stays infinite
  u += 0x7fffu + ((u >> 16) & 1u);  // carries reach the next binade, or Inf
  return float_of(u & 0xffff0000u);
}

// Lowest binade touched by a float: exponent of its last significand bit.
int low_exp(float x) {
  const uint32_t b = bits_of(x) & 0x7fffffffu;
  const int e = static_cast<int>(b >> 23);
  return e == 0 ? -149 : e - 150;
}

// Exact sum of 16 signed floats in a 320-bit two's complement fixed-point
// number with its lowest bit worth 2^-149, returned in round-to-odd form.
double exact_sum_rto(const float* t) {
  uint64_t acc[5] = {0, 0, 0, 0, 0};
  for (int k = 0; k < 16; ++k) {
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
    if (acc[i]) top = i * 64 + 63 - __builtin_clzll(acc[i]);
  if (top < 0) {
    // An exact zero sum is -0 only when every term is -0, as IEEE addition
    // gives in any order (the butterfly path agrees).
    bool all_neg_zero = true;
    for (int k = 0; k < 16; ++k) all_neg_zero = all_neg_zero && bits_of(t[k]) == 0x80000000u;
    return all_neg_zero ? -0.0 : 0.0;
  }
  auto bit = [&](int p) -> uint64_t { return p < 0 ? 0 : (acc[p / 64] >> (p % 64)) & 1u; };
  // Top 53 bits, with every lower bit folded into the last one.
  uint64_t sig = 0;
  for (int p = top; p > top - 53; --p) sig = (sig << 1) | bit(p);
  bool sticky = false;
  for (int p = top - 53; p >= 0 && !sticky; --p) sticky = bit(p) != 0;
  if (sticky) sig |= 1u;
  const double mag = std::ldexp(static_cast<double>(sig), top - 52 - 149);
  return neg ? -mag : mag;
}

void transform_segment(float* seg, uint16_t signs) {
  float t[16];
  bool finite = true;
  int hi = -1000, lo = 1000;
  for (int i = 0; i < 16; ++i) {
    t[i] = (signs >> i) & 1 ? -seg[i] : seg[i];
    if (!std::isfinite(t[i])) finite = false;
    if (t[i] != 0.0f) {
      hi = std::max(hi, ilog2(static_cast<double>(t[i])));
      lo = std::min(lo, low_exp(t[i]));
    }
  }
  double y[16];
  for (int i = 0; i < 16; ++i) y[i] = t[i];
  if (!finite || hi - lo <= 48) {
    // Exact in double: every partial sum is a multiple of 2^lo below 2^(hi+5).
    for (int h = 1; h < 16; h <<= 1)
      for (int i = 0; i < 16; i += 2 * h)
        for (int j = i; j < i + h; ++j) {
          const double a = y[j], b = y[j + h];
          y[j] = a + b;
          y[j + h] = a - b;
        }
    // The butterflies subtract partial sums, and -(c + d) is not (-c) + (-d)
    // for signed zeros. An exact zero output takes the sign of the direct
    // sum: -0 only when all its 16 terms are -0.
    bool all_zero = true;
    for (int i = 0; i < 16; ++i) all_zero = all_zero && t[i] == 0.0f;
    for (int j = 0; j < 16; ++j) {
      if (y[j] == 0.0 && finite) {
        bool all_neg = all_zero;
        for (int i = 0; i < 16 && all_neg; ++i)
          all_neg = (sign_bit(t[i]) != ((__builtin_popcount(static_cast<unsigned>(i & j)) & 1) != 0));
        y[j] = all_neg ? -0.0 : 0.0;
      }
      seg[j] = to_bf16(y[j]);
    }
    return;
  }
  for (int j = 0; j < 16; ++j) {
    float u[16];
    for (int i = 0; i < 16; ++i) u[i] = (__builtin_popcount(static_cast<unsigned>(i & j)) & 1) ? -t[i] : t[i];
    seg[j] = to_bf16(exact_sum_rto(u));
  }
}

void check_axis(int64_t rows, int64_t cols, int axis) {
  const int64_t len = axis == 1 ? cols : rows;
  if (len % 16 != 0)
    throw Error("the Hadamard transform runs over 16-element segments, but the " +
                std::string(axis == 1 ? "row length " : "column length ") + std::to_string(len) +
                " is not a multiple of 16");
}

void run(float* x, int64_t rows, int64_t cols, int axis, uint16_t signs, int threads, bool parallel) {
  check_axis(rows, cols, axis);
  if (axis == 1) {
    const int64_t nseg = rows * cols / 16;
#pragma omp parallel for num_threads(threads) if (parallel) schedule(static)
    for (int64_t s = 0; s < nseg; ++s) transform_segment(x + 16 * s, signs);
  } else {
    const int64_t nseg = rows / 16;
#pragma omp parallel for num_threads(threads) if (parallel) schedule(static)
    for (int64_t s = 0; s < nseg; ++s) {
      float seg[16];
      for (int64_t c = 0; c < cols; ++c) {
        for (int i = 0; i < 16; ++i) seg[i] = x[(16 * s + i) * cols + c];
        transform_segment(seg, signs);
        for (int i = 0; i < 16; ++i) x[(16 * s + i) * cols + c] = seg[i];
      }
    }
  }
}

}  // namespace

void hadamard16(float* x, int64_t rows, int64_t cols, int axis, uint16_t signs, int threads) {
  run(x, rows, cols, axis, signs, threads > 0 ? threads : omp_get_max_threads(), true);
}

// The reference: every output an independent exact sum of its 16 terms.
void hadamard16_ref(float* x, int64_t rows, int64_t cols, int axis, uint16_t signs) {
  check_axis(rows, cols, axis);
  const int64_t nseg = axis == 1 ? rows * cols / 16 : (rows / 16) * cols;
  for (int64_t s = 0; s < nseg; ++s) {
    float* base;
    int64_t stride;
    if (axis == 1) {
      base = x + 16 * s;
      stride = 1;
    } else {
      base = x + (s / cols) * 16 * cols + (s % cols);
      stride = cols;
    }
    float in[16];
    for (int i = 0; i < 16; ++i) in[i] = base[i * stride];
    for (int j = 0; j < 16; ++j) {
      float u[16];
      bool finite = true;
      for (int i = 0; i < 16; ++i) {
        const bool neg = (((signs >> i) & 1) ^ (__builtin_popcount(static_cast<unsigned>(i & j)) & 1)) != 0;
        u[i] = neg ? -in[i] : in[i];
        finite = finite && std::isfinite(u[i]);
      }
      double s_rto;
      if (finite) {
        s_rto = exact_sum_rto(u);
      } else {
        s_rto = 0;
        for (int i = 0; i < 16; ++i) s_rto += u[i];
      }
      base[j * stride] = to_bf16(s_rto);
    }
  }
}

}  // namespace exmy

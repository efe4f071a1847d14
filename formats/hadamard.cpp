// The n-point Hadamard transforms of docs/numerics.md §3 (n = 16, 32, 64, 128):
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
// reaches the rounding core in round-to-odd form.
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

// bf16 (rne) of a sum held in round-to-odd form, times 1/sqrt(n): for n = 32
// and 128 the sum is first multiplied by the double nearest 1/sqrt(2) (one
// double rne product); the power of two (1/4 or 1/8) is exact in double; the
// result is first rounded to odd at float precision (24 bits:
// at least two more than bf16 in every binade, float subnormals included),
// then to bf16 with round-to-nearest-even on the float's bits. Overflow gives
// Inf, as bf16 rounding without saturation does.
float to_bf16(double s_rto, int n) {
  const double r = (n == 32 || n == 128) ? s_rto * 0x1.6a09e667f3bcdp-1 : s_rto;
  const double v = r * (n <= 32 ? 0.25 : 0.125);
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

// Exact sum of n <= 128 signed floats in a 320-bit two's complement fixed-point
// number with its lowest bit worth 2^-149, returned in round-to-odd form.
double exact_sum_rto(const float* t, int n) {
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
    if (acc[i]) top = i * 64 + 63 - __builtin_clzll(acc[i]);
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
  const double mag = std::ldexp(static_cast<double>(sig), top - 52 - 149);
  return neg ? -mag : mag;
}

int log2_size(int n) { return __builtin_ctz(static_cast<unsigned>(n)); }

bool h_neg(int i, int j) { return (__builtin_popcount(static_cast<unsigned>(i & j)) & 1) != 0; }

void transform_segment(float* seg, const bool* neg, int n) {
  float t[kMaxRht];
  bool finite = true;
  int hi = -1000, lo = 1000;
  for (int i = 0; i < n; ++i) {
    t[i] = neg[i] ? -seg[i] : seg[i];
    if (!std::isfinite(t[i])) finite = false;
    if (t[i] != 0.0f) {
      hi = std::max(hi, ilog2(static_cast<double>(t[i])));
      lo = std::min(lo, low_exp(t[i]));
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

void check_transform(const Rht& t, int64_t rows, int64_t cols, int axis) {
  t.validate();
  const int64_t len = axis == 1 ? cols : rows;
  if (len % t.size != 0)
    throw Error("the Hadamard transform runs over " + std::to_string(t.size) + "-element segments, but the " +
                std::string(axis == 1 ? "row length " : "column length ") + std::to_string(len) +
                " is not a multiple of " + std::to_string(t.size));
}

// Segment s of the transform's axis: its first element and its stride.
float* segment_base(float* x, int64_t cols, int axis, int n, int64_t s, int64_t& stride) {
  if (axis == 1) {
    stride = 1;
    return x + n * s;
  }
  stride = cols;
  return x + (s / cols) * n * cols + (s % cols);
}

void run(float* x, int64_t rows, int64_t cols, int axis, const Rht& t, int threads, bool parallel) {
  check_transform(t, rows, cols, axis);
  const int n = t.size;
  bool neg[kMaxRht];
  rht_sign_vector(t, neg);
  if (axis == 1) {
    const int64_t nseg = rows * cols / n;
#pragma omp parallel for num_threads(threads) if (parallel) schedule(static)
    for (int64_t s = 0; s < nseg; ++s) transform_segment(x + n * s, neg, n);
  } else {
    const int64_t nseg = rows / n;
#pragma omp parallel for num_threads(threads) if (parallel) schedule(static)
    for (int64_t s = 0; s < nseg; ++s) {
      float seg[kMaxRht];
      for (int64_t c = 0; c < cols; ++c) {
        for (int i = 0; i < n; ++i) seg[i] = x[(n * s + i) * cols + c];
        transform_segment(seg, neg, n);
        for (int i = 0; i < n; ++i) x[(n * s + i) * cols + c] = seg[i];
      }
    }
  }
}

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace

void Rht::validate() const {
  if (size != 16 && size != 32 && size != 64 && size != 128)
    throw Error("Hadamard size " + std::to_string(size) + " is not one of 16, 32, 64, 128");
}

// docs/numerics.md §3: s_i = bit i of the mask for i < 16; for 16 <= i < 128,
// bit i of W = w0 + 2^64 w1, the first two outputs of splitmix64 started
// from the mask. The deterministic kind has every s_i = +1.
void rht_sign_vector(const Rht& t, bool* neg) {
  uint64_t state = t.signs;
  const uint64_t w[2] = {splitmix64(state), splitmix64(state)};
  for (int i = 0; i < t.size; ++i) {
    const bool bit = i < 16 ? ((t.signs >> i) & 1) != 0 : ((w[i / 64] >> (i % 64)) & 1) != 0;
    neg[i] = t.kind == RhtKind::random && bit;
  }
}

void hadamard(float* x, int64_t rows, int64_t cols, int axis, const Rht& t, int threads) {
  run(x, rows, cols, axis, t, threads > 0 ? threads : omp_get_max_threads(), true);
}

// The reference: every output an independent exact sum of its n terms, the
// signs those of the matrix H diag(s) entry by entry.
void hadamard_ref(float* x, int64_t rows, int64_t cols, int axis, const Rht& t) {
  check_transform(t, rows, cols, axis);
  const int n = t.size;
  bool sgn[kMaxRht];
  rht_sign_vector(t, sgn);
  const int64_t nseg = axis == 1 ? rows * cols / n : (rows / n) * cols;
  for (int64_t s = 0; s < nseg; ++s) {
    int64_t stride;
    float* base = segment_base(x, cols, axis, n, s, stride);
    float in[kMaxRht];
    for (int i = 0; i < n; ++i) in[i] = base[i * stride];
    for (int j = 0; j < n; ++j) {
      float u[kMaxRht];
      bool finite = true;
      for (int i = 0; i < n; ++i) {
        u[i] = sgn[i] != h_neg(i, j) ? -in[i] : in[i];
        finite = finite && std::isfinite(u[i]);
      }
      double s_rto;
      if (finite) {
        s_rto = exact_sum_rto(u, n);
      } else {
        s_rto = 0;
        for (int i = 0; i < n; ++i) s_rto += u[i];
      }
      base[j * stride] = to_bf16(s_rto, n);
    }
  }
}

void hadamard16(float* x, int64_t rows, int64_t cols, int axis, uint16_t signs, int threads) {
  hadamard(x, rows, cols, axis, Rht{16, RhtKind::random, signs}, threads);
}

void hadamard16_ref(float* x, int64_t rows, int64_t cols, int axis, uint16_t signs) {
  hadamard_ref(x, rows, cols, axis, Rht{16, RhtKind::random, signs});
}

Rht rht_of(const QuantSpec& spec) { return Rht{spec.rht_size, spec.rht_kind, spec.rht_signs}; }
int rht_axis(const QuantSpec& spec) { return spec.block_rows == 1 ? 1 : 0; }

void apply_rht(const QuantSpec& spec, float* x, int64_t rows, int64_t cols, int threads) {
  hadamard(x, rows, cols, rht_axis(spec), rht_of(spec), threads);
}

void apply_rht_ref(const QuantSpec& spec, float* x, int64_t rows, int64_t cols) {
  hadamard_ref(x, rows, cols, rht_axis(spec), rht_of(spec));
}

}  // namespace exmy

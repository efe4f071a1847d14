// The arithmetic of the `grouped` GEMM output model (docs/recipes.md §6) as
// plain EXMY_HD (host + device) code, shared by the CPU implementations of
// sim/quant/grouped_gemm.cpp and the kernels of
// sim/quant/grouped_launches.hpp (docs/architecture.md, "CPU and GPU share
// code"):
//
//   ExactSum          the exact accumulator of products of doubles, rounded
//                     once to float32 (grouped_gemm_ref, grouped_gemm's
//                     fallback, the kernels' fallback);
//   round_exact       float32 rounding (rne | rtz) of an exact double;
//   add_exact         the accumulator addition a + b rounded to float32;
//   GroupedEpilogue   the output grid, alpha and the canonical NaN;
//   GroupRange        an operand row's exponent range over one group, and
//   pair_exact        the test that a double sum of the group's products
//                     (in any order) is exact for a row pair;
//   grouped_output    one output element from its two operand rows: what a
//                     kernel thread computes.
//
// The CPU's fast grouped_gemm forms the same exact group sums with blocked
// float32 or double GEMMs (a different order, the same values: every sum it
// keeps is exact) and its AVX2 forms of round_exact and add_exact; the
// reference and the fast path call the scalar forms here. Every group sum is
// the exact sum rounded once, so every implementation gives the same bits
// (tests/quant/test_grouped_gemm.cpp, tests/quant/test_grouped_cuda.cpp).
#pragma once

#include <cfloat>
#include <cstdint>

#if !defined(__CUDA_ARCH__)
#include <bit>
#include <cmath>
#endif

#include "formats/format.hpp"  // EXMY_HD, bits_of, pow2
#include "formats/round.hpp"   // Round, fp32_rne_div

namespace exmy::sim::quant {

// The canonical quiet NaN of float32 (std::numeric_limits<float>::quiet_NaN()).
EXMY_HD float canonical_nan() { return float_of(0x7fc00000u); }

// |x| of a float or double, by the host's or the device's fabs.
EXMY_HD double hd_fabs(double x) { return ::fabs(x); }
EXMY_HD float hd_fabs(float x) { return ::fabsf(x); }

// The number of trailing zero bits of a non-zero 64-bit word.
EXMY_HD int countr_zero64(uint64_t m) {
#if defined(__CUDA_ARCH__)
  return __ffsll(static_cast<long long>(m)) - 1;
#else
  return std::countr_zero(m);
#endif
}

// ceil(log2 n) for n >= 1 (0 for n <= 1).
EXMY_HD int ceil_log2(int64_t n) {
  int c = 0;
  while ((int64_t{1} << c) < n) ++c;
  return c;
}

// ---------------------------------------------------------------------------
// ExactSum: exact Σ a_i·b_i of doubles (two's complement limbs over the whole
// range of products of doubles), rounded once to float32.
// ---------------------------------------------------------------------------

namespace grouped_detail {

// |x| = m · 2^e with m a 53-bit integer (x finite, non-zero).
EXMY_HD void split_double(double x, uint64_t& m, int& e) {
  const uint64_t b = bits_of(x);
  const int ef = static_cast<int>((b >> 52) & 0x7ff);
  const uint64_t frac = b & ((uint64_t{1} << 52) - 1);
  if (ef == 0) {
    m = frac;
    e = -1074;
  } else {
    m = frac | (uint64_t{1} << 52);
    e = ef - 1075;
  }
}

EXMY_HD void add_at(uint64_t* limbs, int n, int bitpos, unsigned __int128 v) {
  const int limb = bitpos >> 6, sh = bitpos & 63;
  const uint64_t lo = static_cast<uint64_t>(v), hi = static_cast<uint64_t>(v >> 64);
  uint64_t w[3];
  if (sh == 0) {
    w[0] = lo;
    w[1] = hi;
    w[2] = 0;
  } else {
    w[0] = lo << sh;
    w[1] = (lo >> (64 - sh)) | (hi << sh);
    w[2] = hi >> (64 - sh);
  }
  uint64_t carry = 0;
  for (int i = limb; i < n; ++i) {
    const uint64_t add = i - limb < 3 ? w[i - limb] : 0;
    if (i - limb >= 3 && carry == 0) break;
    const unsigned __int128 s = static_cast<unsigned __int128>(limbs[i]) + add + carry;
    limbs[i] = static_cast<uint64_t>(s);
    carry = static_cast<uint64_t>(s >> 64);
  }
}

EXMY_HD bool bit_at(const uint64_t* limbs, int i) { return (limbs[i >> 6] >> (i & 63)) & 1u; }

}  // namespace grouped_detail

class ExactSum {
 public:
  EXMY_HD ExactSum() { clear(); }
  EXMY_HD void clear() {
    for (int i = 0; i < kLimbs; ++i) pos_[i] = neg_[i] = 0;
    nan_ = pinf_ = ninf_ = false;
  }
  EXMY_HD void add_product(double a, double b) {
    if (is_nan(a) || is_nan(b)) {
      nan_ = true;
      return;
    }
    const bool neg = sign_bit(a) != sign_bit(b);
    if (is_inf(a) || is_inf(b)) {
      if (a == 0 || b == 0) nan_ = true;
      else (neg ? ninf_ : pinf_) = true;
      return;
    }
    if (a == 0 || b == 0) return;
    uint64_t ma, mb;
    int ea, eb;
    grouped_detail::split_double(a, ma, ea);
    grouped_detail::split_double(b, mb, eb);
    const unsigned __int128 m = static_cast<unsigned __int128>(ma) * mb;
    grouped_detail::add_at(neg ? neg_ : pos_, kLimbs, ea + eb - kLsb, m);
  }
  EXMY_HD void add(double a) { add_product(a, 1.0); }
  // Rounds to float32 with Round::rne or Round::rtz (IEEE overflow: rne
  // gives ±Inf, rtz ±FLT_MAX). An exact zero is +0; a NaN, Inf·0 or +Inf and
  // -Inf products give the canonical NaN.
  EXMY_HD float round(Round mode) const {
    using grouped_detail::bit_at;
    const float inf = float_of(0x7f800000u);
    if (nan_ || (pinf_ && ninf_)) return canonical_nan();
    if (pinf_) return inf;
    if (ninf_) return -inf;
    // magnitude = |pos - neg|
    int top = kLimbs - 1;
    while (top >= 0 && pos_[top] == neg_[top]) --top;
    if (top < 0) return 0.0f;
    const bool negative = neg_[top] > pos_[top];
    const uint64_t* big = negative ? neg_ : pos_;
    const uint64_t* small = negative ? pos_ : neg_;
    uint64_t mag[kLimbs];
    uint64_t borrow = 0;
    for (int i = 0; i < kLimbs; ++i) {
      const unsigned __int128 d = static_cast<unsigned __int128>(big[i]) - small[i] - borrow;
      mag[i] = static_cast<uint64_t>(d);
      borrow = (d >> 127) ? 1 : 0;
    }
    int h = kLimbs * 64 - 1;
    while (!bit_at(mag, h)) --h;
    const int E = h + kLsb;  // floor(log2 |sum|)
    const float sign = negative ? -1.0f : 1.0f;
    if (E > 127) return mode == Round::rtz ? sign * FLT_MAX : sign * inf;
    const int L = E - 23 > -149 ? E - 23 : -149;  // weight of the float's last bit
    const int bl = L - kLsb;
    uint64_t k = 0;
    for (int i = h; i >= bl; --i) k = (k << 1) | (bit_at(mag, i) ? 1u : 0u);
    if (mode == Round::rne && bl >= 1 && bit_at(mag, bl - 1)) {
      bool sticky = false;
      for (int i = bl - 2; i >= 0 && !sticky; --i) sticky = bit_at(mag, i);
      if (sticky || (k & 1)) ++k;
    }
    // k < 2^25 and -149 <= L <= 104: k · 2^L is exact in double, and a float
    // (or 2^128, which converts to Inf).
    return sign * static_cast<float>(static_cast<double>(k) * pow2(L));
  }

 private:
  static constexpr int kLimbs = 68;    // 4352 bits
  static constexpr int kLsb = -2148;   // bit 0 weighs 2^kLsb (the smallest product of two doubles)
  uint64_t pos_[kLimbs], neg_[kLimbs];
  bool nan_ = false, pinf_ = false, ninf_ = false;
};

// ---------------------------------------------------------------------------
// Roundings, branch-free (the tile loops vectorize them).
// ---------------------------------------------------------------------------

// float32 rounding of an exact double. RTZ from RNE: the RNE float of an
// exact double is one step too far from zero exactly when its magnitude
// exceeds the value's (Inf -> FLT_MAX).
template <bool kRtz>
EXMY_HD float round_exact(double v) {
  const float f = static_cast<float>(v);
  if constexpr (!kRtz) return f;
  const uint32_t away = hd_fabs(static_cast<double>(f)) > hd_fabs(v) ? 1u : 0u;
  return float_of(bits_of(f) - away);
}

// a + b rounded to float: RNE is the float addition; RTZ forms the double
// sum s, its exact error (TwoSum: s + err == a + b), and steps the RNE float
// of s one toward zero when it lies beyond a + b.
template <bool kRtz>
EXMY_HD float add_exact(float a, float b) {
  if constexpr (!kRtz) return a + b;
  const double s = static_cast<double>(a) + static_cast<double>(b);
  const double bb = s - a;
  const double err = (a - (s - bb)) + (b - bb);
  const float f = static_cast<float>(s);
  const double fd = f;
  const bool finite = hd_fabs(s) <= DBL_MAX;
  const bool beyond = hd_fabs(fd) > hd_fabs(s) || (fd == s && err != 0 && ((err < 0) != (s < 0)));
  return float_of(bits_of(f) - ((finite && beyond) ? 1u : 0u));
}

// ---------------------------------------------------------------------------
// The epilogue: grid, alpha, canonical NaN. Branch-free (the signs of
// outputs are random: branches would mispredict).
// ---------------------------------------------------------------------------

// The epilogue's alpha, the tensor decode scales' product: a value, or
// where `at` is set the float there, read where the epilogue runs (on a
// device the host never reads it: the tensor scales' alpha made there,
// decode_alpha of sim/quant/quant_launches.hpp).
struct GroupedAlpha {
  float value = 1;
  const float* at = nullptr;
  EXMY_HD GroupedAlpha(float v = 1, const float* p = nullptr) : value(v), at(p) {}  // NOLINT: a float converts
};

struct GroupedEpilogue {
  bool grid = false, grid_pow2 = false;
  double d = 1, inv_d = 1;
  float alpha = 1;
  const float* alpha_at = nullptr;
  GroupedEpilogue() = default;
  // grid: d of RNE(d·c)/d (0: none); a: the tensor decode scales' product.
  EXMY_HD GroupedEpilogue(int64_t grid_d, GroupedAlpha a)
      : grid(grid_d > 0), grid_pow2((grid_d & (grid_d - 1)) == 0), d(static_cast<double>(grid_d)),
        inv_d(1.0 / static_cast<double>(grid_d)), alpha(a.value), alpha_at(a.at) {}
  EXMY_HD float operator()(float c) const {
    if (grid) {
      const double v = static_cast<double>(c) * d;  // exact: 24 + 31 bits
      // Round half to even: below 2^52, adding and subtracting 2^52 leaves
      // the nearest integer (IEEE addition rounds to nearest even); above,
      // v is an integer already.
      const double av = hd_fabs(v);
      const double t = (av + 0x1p52) - 0x1p52;
      const double k = av < 0x1p52 ? t : av;
      // k / d rounded once to float (exact division by a power of two)
      const float r = grid_pow2 ? static_cast<float>(k * inv_d) : fp32_rne_div(k, d);
      // copysign(r, c) + 0: a zero is +0
      const float g = float_of((bits_of(r) & 0x7fffffffu) | (bits_of(c) & 0x80000000u)) + 0.0f;
      c = hd_fabs(c) <= FLT_MAX ? g : c;  // Inf and NaN pass through
    }
    const float y = c * (alpha_at ? *alpha_at : alpha);
    return y != y ? canonical_nan() : y;
  }
};

// Row outer scales (apply_outer_alpha): an element c of a C made with alpha
// = 1 times fl(ga · gb), ga and gb the rows' decode scales fl(1/t); a NaN the
// canonical one.
EXMY_HD float outer_alpha_element(float c, float ga, float gb) {
  const float y = c * (ga * gb);
  return y != y ? canonical_nan() : y;
}

// ---------------------------------------------------------------------------
// Exponent ranges and the exactness test of a double sum.
// ---------------------------------------------------------------------------

// Exponent range of one operand row over one group (or sub-block).
struct GroupRange {
  int16_t lo;     // exponent of the lowest set bit over the non-zero elements (+big: none)
  int16_t hi;     // floor(log2 |v|) of the largest element (-big: none)
  int16_t span;   // hi - lo (negative for an all-zero row; +big with a special)
  uint8_t flags;  // kAllZero, kSpecial
};
static_assert(sizeof(GroupRange) == 8);
inline constexpr uint8_t kAllZero = 1, kSpecial = 2;
inline constexpr int kBig = 1 << 13;

// The range of n consecutive elements. A non-finite or subnormal element
// (no format makes a subnormal double: be safe) marks the range special.
EXMY_HD GroupRange range_of(const double* p, int64_t n) {
  int lo = kBig, hi = -kBig;
  uint8_t flags = kAllZero;
  for (int64_t k = 0; k < n; ++k) {
    const uint64_t b = bits_of(p[k]) & 0x7fffffffffffffffull;
    if (b == 0) continue;
    flags &= static_cast<uint8_t>(~kAllZero);
    const int ef = static_cast<int>(b >> 52);
    if (ef == 0x7ff || ef == 0) {
      flags |= kSpecial;
      continue;
    }
    const uint64_t m = (b & ((uint64_t{1} << 52) - 1)) | (uint64_t{1} << 52);
    const int l = ef - 1075 + countr_zero64(m), h = ef - 1023;
    lo = l < lo ? l : lo;
    hi = h > hi ? h : hi;
  }
  const int span = (flags & kSpecial) ? kBig : hi - lo;
  return GroupRange{static_cast<int16_t>(lo), static_cast<int16_t>(hi), static_cast<int16_t>(span), flags};
}

// Every partial sum of products of a row pair is a multiple of 2^(lo_a +
// lo_b) below 2^(hi_a + hi_b + c), c = 2 + ceil(log2 n) for n products, so a
// double sum of the group's products, in any order, is exact when that range
// fits 53 bits and stays inside the normal range: the condition (hi - lo) =
// span_a + span_b + c <= 53 splits over the two operands, which lets one
// test cover a whole tile (grouped_gemm tests a tile's widest ranges).
EXMY_HD bool pair_exact(const GroupRange& a, const GroupRange& b, int c) {
  if ((a.flags | b.flags) & kSpecial) return false;
  if ((a.flags | b.flags) & kAllZero) return true;
  return a.span + b.span + c <= 53 && a.lo + b.lo >= -1074 && a.hi + b.hi + c <= 1023;
}

// The group sum of n products through the exact accumulator, rounded once
// (model.group_round).
EXMY_HD float exact_group_sum(ExactSum& es, const double* a, const double* b, int64_t n, Round mode) {
  es.clear();
  for (int64_t k = 0; k < n; ++k) es.add_product(a[k], b[k]);
  return es.round(mode);
}

// The float32 test of the device's group path (grouped_gemm_launches): a
// float32 GEMM of the group, in any order and with fused multiply-adds,
// gives the exact group sum of a row pair when every partial sum is a
// multiple of 2^(lo_a + lo_b) >= 2^-126 (normal: no flush to zero can touch
// it) below 2^(hi_a + hi_b + c) <= 2^127 within 24 bits, and both rows'
// elements are float32 numbers (a normal exponent, a significand of at most
// span <= 24 bits). All-zero and special rows are left to the double path.
EXMY_HD bool pair_exact_f32_normal(const GroupRange& a, const GroupRange& b, int c) {
  if ((a.flags | b.flags) & (kSpecial | kAllZero)) return false;
  return a.span + b.span + c <= 24 && a.lo + b.lo >= -126 && a.hi + b.hi + c <= 127 && a.lo >= -126 &&
         b.lo >= -126 && a.hi <= 127 && b.hi <= 127;
}

// ---------------------------------------------------------------------------
// One output element.
// ---------------------------------------------------------------------------

// The model's constants for grouped_output (from a GemmModel and alpha).
struct GroupedParams {
  int64_t group = 64;  // G
  bool group_rtz = false, acc_rtz = false;
  GroupedEpilogue epilogue;
};

// One group's sum of a row pair (a, b: the group's gk elements; ra, rb
// their ranges), rounded to float32 (an exact zero +0): the double sum of
// its products in k order when pair_exact says it is exact, else the exact
// accumulator.
template <bool kGroupRtz>
EXMY_HD float group_sum(const double* a, const double* b, int64_t gk, const GroupRange& ra, const GroupRange& rb) {
  if (pair_exact(ra, rb, ceil_log2(gk) + 2)) {
    double d = 0.0;
    for (int64_t k = 0; k < gk; ++k) d += a[k] * b[k];
    return round_exact<kGroupRtz>(d + 0.0);  // + 0: an exact zero sum is +0
  }
  ExactSum es;
  return exact_group_sum(es, a, b, gk, kGroupRtz ? Round::rtz : Round::rne);
}

// One group's step of the device's accumulation (grouped_gemm_launches):
// acc plus the group's sum, which is f (the group's float32 GEMM output,
// + 0) when pair_exact_f32_normal says that is exact, else group_sum.
template <bool kGroupRtz, bool kAccRtz>
EXMY_HD float grouped_step(float acc, float f, const double* a, const double* b, int64_t gk, const GroupRange& ra,
                           const GroupRange& rb) {
  const float s = pair_exact_f32_normal(ra, rb, ceil_log2(gk) + 2) ? f + 0.0f : group_sum<kGroupRtz>(a, b, gk, ra, rb);
  return add_exact<kAccRtz>(acc, s);
}
// grouped_step with the roundings chosen at run time.
EXMY_HD float grouped_step(float acc, float f, const double* a, const double* b, int64_t gk, const GroupRange& ra,
                           const GroupRange& rb, bool group_rtz, bool acc_rtz) {
  if (group_rtz)
    return acc_rtz ? grouped_step<true, true>(acc, f, a, b, gk, ra, rb)
                   : grouped_step<true, false>(acc, f, a, b, gk, ra, rb);
  return acc_rtz ? grouped_step<false, true>(acc, f, a, b, gk, ra, rb)
                 : grouped_step<false, false>(acc, f, a, b, gk, ra, rb);
}

// C[m][n] of the model from row m of A (a, K doubles) and row n of B (b),
// with ra and rb the two rows' group ranges (range_of over each group of G
// columns, ceil(K / G) of them): per group, in K order, the double sum of
// its products in k order when pair_exact says it is exact, else the exact
// accumulator, rounded to float32 (group_round, an exact zero +0); the
// groups added into a float32 accumulator from +0 (accumulate); then the
// epilogue.
template <bool kGroupRtz, bool kAccRtz>
EXMY_HD float grouped_output(const double* a, const double* b, int64_t K, const GroupRange* ra, const GroupRange* rb,
                             const GroupedParams& p) {
  const int64_t G = p.group;
  float acc = 0.0f;
  int64_t g = 0;
  for (int64_t k0 = 0; k0 < K; k0 += G, ++g) {
    const int64_t gk = K - k0 < G ? K - k0 : G;
    acc = add_exact<kAccRtz>(acc, group_sum<kGroupRtz>(a + k0, b + k0, gk, ra[g], rb[g]));
  }
  return p.epilogue(acc);
}

// grouped_output with the roundings chosen at run time.
EXMY_HD float grouped_output(const double* a, const double* b, int64_t K, const GroupRange* ra, const GroupRange* rb,
                             const GroupedParams& p) {
  if (p.group_rtz)
    return p.acc_rtz ? grouped_output<true, true>(a, b, K, ra, rb, p) : grouped_output<true, false>(a, b, K, ra, rb, p);
  return p.acc_rtz ? grouped_output<false, true>(a, b, K, ra, rb, p) : grouped_output<false, false>(a, b, K, ra, rb, p);
}

}  // namespace exmy::sim::quant

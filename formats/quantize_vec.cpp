#include "formats/quantize_vec.hpp"

#include "formats/philox_cpu.hpp"

#include <cfloat>
#include <cmath>
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <limits>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define EXMY_VEC 1
#endif
#if defined(__AVX__)
#include <immintrin.h>  // segment_partials4
#endif

namespace exmy::detail {

namespace {

// The scalar path for one element, used for tails and uncertain lanes.
inline void scalar_element(const QuantPlan& p, const BlockConsts& c, const float* x, int64_t i, int64_t j,
                           uint8_t* codes, float* values, RandomBits& rng, SpanCounts& cnt) {
  const uint32_t r = is_stochastic(p.round) ? rng(static_cast<uint64_t>(i)) : 0u;
  const ElemOut e = encode_element(p, c, x[j], r);
  cnt.saturated += (e.flags & kSaturated) ? 1 : 0;
  cnt.nonzero += x[j] != 0.0f;
  cnt.underflow += (x[j] != 0.0f && e.xhat == 0.0f);
  cnt.subnormal += p.fe.classify(e.code) == CodeClass::subnormal;
  if (codes) {
    if (p.fe.code_bytes() == 1) {
      codes[i] = static_cast<uint8_t>(e.code);
    } else {
      codes[2 * i] = static_cast<uint8_t>(e.code);
      codes[2 * i + 1] = static_cast<uint8_t>(e.code >> 8);
    }
  }
  values[i] = e.xhat;
}

}  // namespace

bool vec_supported(const QuantPlan& p) {
#ifdef EXMY_VEC
  const Format& f = p.fe;
  const int h = is_stochastic(p.round) ? p.sr_bits : 0;
  // (a subnormal max changes the spacing above max: left to the scalar core)
  // The loops take the parity of the index inside a binade for the parity
  // of the code, which holds only when M >= 1: with M = 0 the two differ in
  // every other binade, so rne and odd are left to the scalar core.
  if (f.M == 0 && (p.round == Round::rne || p.round == Round::odd)) return false;
  return p.saturate && f.subnormals && f.has_zero && (f.negzero || !f.is_signed) && f.bits <= 16 && f.M + h <= 40 &&
         f.max >= f.min_normal;
#else
  (void)p;
  return false;
#endif
}

bool vec4_supported(const QuantPlan& p) {
#ifdef EXMY_VEC
  const Format& f = p.fe;
  const int h = is_stochastic(p.round) ? p.sr_bits : 0;
  if (!vec_supported(p) || f.E + f.M > 3 || f.M + h + 2 > 22) return false;
  // Ws = v * 2^(h+1+M-ee) and 2^(ee-M) must stay normal float32 powers of two.
  if (h + 1 + f.M - f.emin > 126 || f.emin - f.M < -126 || f.max_exp > 126) return false;
  // the block scale and tensor scale must be float32 values for fl(t / s)
  return true;
#else
  (void)p;
  return false;
#endif
}

Vec4Mags vec4_magnitudes(const QuantPlan& p) {
  Vec4Mags m;
  for (uint32_t q = 0; q < 8; ++q) {
    m.idx[q] = -1;
    if (q > p.fe.max_mag) continue;
    double v = p.fe.mag_value(q);
    m.mag[q] = static_cast<float>(v);  // at most 4 significant bits: exact
    if (v == 0.0) continue;
    double pw = 1.0;
    // split v = odd * 2^k with an odd integer part
    while (v != std::floor(v)) {
      v *= 2;
      pw /= 2;
    }
    while (std::fmod(v, 2.0) == 0.0) {
      v /= 2;
      pw *= 2;
    }
    int k = 0;
    while (k < m.nodd && m.odd[k] != v) ++k;
    if (k == m.nodd) m.odd[m.nodd++] = v;
    m.idx[q] = k;
    m.pw[q] = pw;
  }
  return m;
}

bool vec4_thr_supported(const QuantPlan& p) {
  const bool symmetric = p.round == Round::rne || p.round == Round::rna || p.round == Round::rtz || p.round == Round::odd;
  return p.has_scale && symmetric && p.fe.is_signed && p.fe.code_bytes() == 1 && vec4_supported(p);
}

namespace {

// Least float32 bit pattern b in [0, 0x7f800000] with pred(b), for a pred
// that is false at 0, monotone in b, and taken as true at Inf; the search
// starts at `guess` and gallops outwards, so a close guess costs a few calls.
template <class Pred>
uint32_t least_bits(uint32_t guess, Pred pred) {
  constexpr uint32_t kInf = 0x7f800000u;
  uint32_t lo, hi;  // pred(lo) is false, pred(hi) true
  const uint32_t g = std::clamp<uint32_t>(guess, 1u, kInf - 1);
  if (pred(g)) {
    hi = g;
    lo = 0;
    for (uint32_t d = 1; d <= g; d <<= 1) {
      if (!pred(g - d)) {
        lo = g - d;
        break;
      }
      hi = g - d;
      if (d > (1u << 30)) break;
    }
  } else {
    lo = g;
    hi = kInf;
    for (uint64_t d = 1; g + d < kInf; d <<= 1) {
      const uint32_t c = static_cast<uint32_t>(g + d);
      if (pred(c)) {
        hi = c;
        break;
      }
      lo = c;
    }
  }
  while (hi - lo > 1) {
    const uint32_t mid = lo + (hi - lo) / 2;
    if (pred(mid)) hi = mid;
    else lo = mid;
  }
  return hi;
}

}  // namespace

void vec4_thresholds(const QuantPlan& p, const BlockConsts& c, const Vec4Block& vb, Vec4Thr& out) {
  const Format& f = p.fe;
  std::copy(vb.table, vb.table + 8, out.table);
  // |x| of a point v of the element grid: v * s / t (exact) or v / m_b (fp32)
  auto x_of = [&](double v) {
    const double x = p.arith == Arith::exact ? v * c.s / p.t : v / static_cast<double>(c.mb);
    const float xf = static_cast<float>(std::min(x, 3.0e38));
    return bits_of(xf);
  };
  auto enc = [&](uint32_t b) { return encode_element(p, c, float_of(b), 0u); };
  for (uint32_t k = 1; k <= 7; ++k) {
    if (k > f.max_mag) {
      out.t[k - 1] = 0x7f7fffff;
      continue;
    }
    const double lo = f.mag_value(k - 1), hi = f.mag_value(k);
    // where the code becomes k: the midpoint (nearest modes), the upper
    // value (toward zero) or just past the lower one (to odd)
    const double v = p.round == Round::rtz ? hi : p.round == Round::odd ? lo : (lo + hi) / 2;
    const uint32_t b = least_bits(x_of(v), [&](uint32_t bb) { return (enc(bb).code & f.mag_mask()) >= k; });
    out.t[k - 1] = static_cast<int32_t>(b - 1);
  }
  const uint32_t bs = least_bits(x_of(f.max), [&](uint32_t bb) { return (enc(bb).flags & kSaturated) != 0; });
  out.sat = static_cast<int32_t>(bs - 1);
}

ScaleThr scale_code_thresholds(const QuantPlan& p) {
  ScaleThr out;
  const Format& f = p.fs;
  const bool pow2_fmt = !f.subnormals && f.M == 0;
  if (!p.has_scale || f.M > 3 || f.code_bytes() != 1 || !((f.subnormals && f.has_zero) || pow2_fmt)) return out;
  // c_lo: the first code whose lower neighbour is normal too (the boundary
  // between the largest subnormal and the smallest normal is not periodic)
  const uint32_t P = 1u << f.M;
  uint32_t c_lo = P + 1;
  // ... and no lower than the code above the one at the least normal float
  // b (float32 subnormals do not double by adding to the exponent field)
  {
    const BlockScale s = block_scale(p, FLT_MIN);
    if (!s.underflow && !s.zero) c_lo = std::max(c_lo, s.code + 1);
  }
  if (f.max_mag < c_lo + P + 1) return out;
  const bool mx = p.rule == ScaleRule::mx_floor || p.rule == ScaleRule::mx_ceil || p.rule == ScaleRule::mx_even;
  const bool fp32 = p.arith == Arith::fp32;
  // fp32 products (from the boundary into c_lo up) must be normal floats
  // for the doubling argument
  const double lo_product = mx ? std::ldexp(f.decode(c_lo - 1), p.fe.max_exp) : f.decode(c_lo - 1);
  if (fp32 && lo_product < std::ldexp(1.0, -126)) return out;
  // b at which the rule's unrounded scale y meets the boundary into code c
  // (a guess: the search settles it)
  auto guess = [&](uint32_t c) {
    const double v = f.decode(c), vp = f.decode(c - 1);
    const double y = p.rule == ScaleRule::amax_up || p.rule == ScaleRule::mx_ceil      ? vp
                     : p.rule == ScaleRule::amax_down || p.rule == ScaleRule::mx_floor ? v
                                                                                       : 0.5 * (v + vp);
    const double b = mx ? std::ldexp(y, p.fe.max_exp) / p.t : fp32 ? y / p.g_over_emax : y * p.fe.max / p.t;
    return bits_of(static_cast<float>(std::clamp(b, 0.0, 3.0e38)));
  };
  // least b (bits) whose code before the zero-scale guard is >= c
  auto least = [&](uint32_t c) {
    return least_bits(guess(c), [&](uint32_t bb) {
      const BlockScale s = block_scale(p, float_of(bb));
      return bb != 0 && !s.underflow && !s.zero && s.code >= c;
    });
  };
  const uint32_t t0 = least(c_lo);
  if (t0 < 0x00800000u || t0 >= 0x7f000000u) return out;
  // the code at t0: c_lo, or above it where the rule skips codes (the MX
  // rules give powers of two only)
  const uint32_t c0 = block_scale(p, float_of(t0)).code;
  if (c0 < c_lo || c0 + P >= f.max_mag) return out;
  for (int j = 0; j < 7; ++j) out.d1[j] = INT32_MAX;
  uint32_t prev = t0;
  for (uint32_t j = 1; j < P; ++j) {
    // a code the octave never reaches has its threshold in the next one:
    // D_j = 2^23, which r never reaches
    const uint32_t tj = std::min(least(c0 + j), t0 + (1u << 23));
    if (tj < prev) return out;
    out.d1[j - 1] = static_cast<int32_t>(tj - t0 - 1);
    prev = tj;
  }
  // the doubling, checked once: code c0 + P starts at 2 t0
  if (least(c0 + P) != t0 + (1u << 23)) return out;
  const uint32_t hi = least(f.max_mag);
  if (hi <= t0 + (1u << 23)) return out;
  out.t0 = t0;
  out.span = hi - t0;
  out.c_lo = c0;
  out.m = static_cast<uint32_t>(f.M);
  out.ok = true;
  return out;
}

void vec4_blocks(const QuantPlan& p, const Vec4Mags& m, const BlockConsts* c, int64_t n, Vec4Block* out) {
#ifdef EXMY_VEC
  const bool exact = p.arith == Arith::exact;
  const __m256d t = _mm256_set1_pd(p.t);
  const __m256d lo = _mm256_set1_pd(std::ldexp(1.0, -126)), hi = _mm256_set1_pd(std::ldexp(1.0, 126));
  int64_t j = 0;
  if (!exact && p.has_scale) {
    // fp32 arithmetic: table[q] = fl(fl(q * s) * Ginv). When s is a float,
    // the float product q * s rounds the exact product once, as the double
    // product (exact) converted to float does: eight lanes, two multiplies.
    const __m256 mags = _mm256_loadu_ps(m.mag), g8 = _mm256_set1_ps(p.ginv);
    for (; j < n; ++j) {
      Vec4Block& o = out[j];
      o.r = 1.0f;
      o.ok = true;
      const float sf = static_cast<float>(c[j].s);
      if (static_cast<double>(sf) == c[j].s) {
        _mm256_storeu_ps(o.table, _mm256_mul_ps(_mm256_mul_ps(mags, _mm256_set1_ps(sf)), g8));
      } else {
        for (uint32_t q = 0; q < 8; ++q) o.table[q] = q <= p.fe.max_mag ? dequant(p, c[j], q) : 0.0f;
      }
    }
    return;
  }
  // Below: exact arithmetic, or no block scale (then q / t is the table in
  // both arithmetics).
  for (; j + 4 <= n; j += 4) {
    const __m256d s = p.has_scale ? _mm256_set_pd(c[j + 3].s, c[j + 2].s, c[j + 1].s, c[j].s) : _mm256_set1_pd(1.0);
    alignas(16) float rr[4] = {0, 0, 0, 0};
    int okm = 0xf;
    if (exact) {
      // r = fl(t / s); it must be a normal float32 for the uncertainty rule
      const __m256d r = p.has_scale ? _mm256_div_pd(t, s) : t;
      okm = _mm256_movemask_pd(_mm256_and_pd(_mm256_cmp_pd(r, lo, _CMP_GE_OQ), _mm256_cmp_pd(r, hi, _CMP_LE_OQ)));
      _mm_store_ps(rr, _mm256_cvtpd_ps(r));
    }
    // x-hat of each odd part, rounded to odd: rto(odd * s / t)
    __m256d y[8] = {};
    for (int k = 0; k < m.nodd; ++k) {
      const __m256d num = _mm256_mul_pd(_mm256_set1_pd(m.odd[k]), s);
      const __m256d q = _mm256_div_pd(num, t);
      const __m256d rem = _mm256_fnmadd_pd(q, t, num);
      __m256i b = _mm256_castpd_si256(q);
      b = _mm256_add_epi64(b, _mm256_castpd_si256(_mm256_cmp_pd(rem, _mm256_setzero_pd(), _CMP_LT_OQ)));
      b = _mm256_or_si256(b, _mm256_and_si256(_mm256_castpd_si256(_mm256_cmp_pd(rem, _mm256_setzero_pd(), _CMP_NEQ_UQ)),
                                              _mm256_set1_epi64x(1)));
      y[k] = _mm256_castsi256_pd(b);
    }
    alignas(16) float tab[8][4];
    for (int q = 0; q < 8; ++q) {
      if (m.idx[q] < 0) {
        _mm_store_ps(tab[q], _mm_setzero_ps());
        continue;
      }
      // scaling a rounded-to-odd double by a power of two keeps it rounded to odd
      const __m256d v = _mm256_mul_pd(y[m.idx[q]], _mm256_set1_pd(m.pw[q]));
      _mm_store_ps(tab[q], _mm256_cvtpd_ps(v));
    }
    for (int l = 0; l < 4; ++l) {
      Vec4Block& o = out[j + l];
      o.r = exact ? rr[l] : 1.0f;
      o.ok = !exact || ((okm >> l) & 1);
      for (int q = 0; q < 8; ++q) o.table[q] = tab[q][l];
    }
  }
  for (; j < n; ++j) {
    Vec4Block& o = out[j];
    if (p.arith == Arith::exact) {
      const double r = p.has_scale ? static_cast<double>(p.t) / c[j].s : static_cast<double>(p.t);
      o.r = static_cast<float>(r);
      o.ok = r >= std::ldexp(1.0, -126) && r <= std::ldexp(1.0, 126);
    }
    for (uint32_t q = 0; q < 8; ++q) o.table[q] = q <= p.fe.max_mag ? dequant(p, c[j], q) : 0.0f;
  }
#else
  (void)m;
  for (int64_t j = 0; j < n; ++j)
    for (uint32_t q = 0; q < 8; ++q) out[j].table[q] = q <= p.fe.max_mag ? dequant(p, c[j], q) : 0.0f;
#endif
}

VecBlock vec_block(const QuantPlan& p, const BlockConsts& c) {
  VecBlock vb;
  vb.s = c.s;
  if (p.arith != Arith::exact) return vb;
  const double t = p.t;
  if (p.has_scale) {
    vb.r = t / c.s;
    vb.r_exact = std::fma(-vb.r, c.s, t) == 0.0;
    vb.u = c.s / t;
    vb.u_exact = std::fma(-vb.u, t, c.s) == 0.0;
  } else {
    vb.r = t;
    vb.r_exact = true;
    vb.u = 1.0 / t;
    vb.u_exact = std::fma(-vb.u, t, 1.0) == 0.0;
  }
  return vb;
}

#ifdef EXMY_VEC

namespace {

inline __m256d pow2_vec(__m256i e) {  // 2^e for int64 lanes in [-1022, 1023]
  return _mm256_castsi256_pd(_mm256_slli_epi64(_mm256_add_epi64(e, _mm256_set1_epi64x(1023)), 52));
}

inline __m256i max_epi64(__m256i a, __m256i b) { return _mm256_blendv_epi8(b, a, _mm256_cmpgt_epi64(a, b)); }

// The integer lane operations the rounding decision needs, for 4 int64 lanes
// (the double loop) and 8 int32 lanes (the float loop of FP4 formats).
struct Lanes64 {
  static __m256i set1(int64_t v) { return _mm256_set1_epi64x(v); }
  static __m256i add(__m256i a, __m256i b) { return _mm256_add_epi64(a, b); }
  static __m256i sub(__m256i a, __m256i b) { return _mm256_sub_epi64(a, b); }
  static __m256i gt(__m256i a, __m256i b) { return _mm256_cmpgt_epi64(a, b); }
  static __m256i eq(__m256i a, __m256i b) { return _mm256_cmpeq_epi64(a, b); }
  static __m256i half(__m256i a) { return _mm256_srli_epi64(a, 1); }
};
struct Lanes32 {
  static __m256i set1(int64_t v) { return _mm256_set1_epi32(static_cast<int>(v)); }
  static __m256i add(__m256i a, __m256i b) { return _mm256_add_epi32(a, b); }
  static __m256i sub(__m256i a, __m256i b) { return _mm256_sub_epi32(a, b); }
  static __m256i gt(__m256i a, __m256i b) { return _mm256_cmpgt_epi32(a, b); }
  static __m256i eq(__m256i a, __m256i b) { return _mm256_cmpeq_epi32(a, b); }
  static __m256i half(__m256i a) { return _mm256_srli_epi32(a, 1); }
};

// docs/numerics.md §2's decision to round a magnitude away from zero, per lane (all
// ones: away). W = floor(|v| / ulp * 2^(h+1)) splits into the index k of the
// lower neighbour (W >> (h+1)) and the h+1 bits F below it; `sticky` marks
// bits lost below F, `negi` negative inputs, r the lane's h random bits
// (stochastic modes only). Bounds: 2^h - 1 and 2^(h+1) - 1 as lanes.
template <Round MODE, class L>
inline __m256i away_from_zero(__m256i k, __m256i F, __m256i sticky, __m256i negi, __m256i r, __m256i two_n_m1,
                              __m256i two_n1_m1) {
  const __m256i zero = _mm256_setzero_si256(), one = L::set1(1);
  const __m256i Fnz = L::gt(F, zero);
  const __m256i inexact = _mm256_or_si256(Fnz, sticky);
  const __m256i lo_odd = L::eq(_mm256_and_si256(k, one), one);
  if constexpr (MODE == Round::rne) {
    return _mm256_and_si256(Fnz, _mm256_or_si256(sticky, lo_odd));
  } else if constexpr (MODE == Round::rna) {
    return Fnz;
  } else if constexpr (MODE == Round::rtz) {
    return zero;
  } else if constexpr (MODE == Round::up) {
    return _mm256_andnot_si256(negi, inexact);
  } else if constexpr (MODE == Round::down) {
    return _mm256_and_si256(negi, inexact);
  } else if constexpr (MODE == Round::odd) {
    return _mm256_andnot_si256(lo_odd, inexact);
  } else if constexpr (MODE == Round::stochastic) {
    // round F/2 to nearest even, then away when that plus r reaches 2^h
    const __m256i jj = L::half(F);
    const __m256i F_odd = L::eq(_mm256_and_si256(F, one), one);
    const __m256i j_odd = L::eq(_mm256_and_si256(jj, one), one);
    const __m256i rn = L::sub(jj, _mm256_and_si256(F_odd, _mm256_or_si256(sticky, j_odd)));  // -1 where set
    return L::gt(L::add(rn, r), two_n_m1);
  } else if constexpr (MODE == Round::stochastic_fast) {
    return L::gt(L::add(L::add(F, L::add(r, r)), one), two_n1_m1);
  } else {
    return L::gt(L::add(L::half(F), r), two_n_m1);
  }
}

template <Round MODE, Arith ARITH>
void span_impl(const QuantPlan& p, const BlockConsts& c, const VecBlock& vb, const float* x, int64_t i0, int64_t n,
               uint8_t* codes, float* values, RandomBits& rng, SpanCounts& cnt) {
  const Format& f = p.fe;
  constexpr bool kSR = MODE == Round::stochastic || MODE == Round::stochastic_fast || MODE == Round::stochastic_fastest;
  const int h = kSR ? p.sr_bits : 0;
  const bool exact_arith = ARITH == Arith::exact;
  const bool check_v = exact_arith && !vb.r_exact;
  const bool check_xh = exact_arith && !vb.u_exact;
  const int cb = f.code_bytes();

  const __m256d abs_mask = _mm256_castsi256_pd(_mm256_set1_epi64x(0x7fffffffffffffffll));
  const __m256d vmax = _mm256_set1_pd(f.max);
  const __m256d vr = _mm256_set1_pd(vb.r);
  const __m256d vu = _mm256_set1_pd(vb.u);
  const __m256d vs = _mm256_set1_pd(vb.s);
  const __m128 vmb = _mm_set1_ps(c.mb);
  const __m128 vt = _mm_set1_ps(p.t);
  const __m128 vginv = _mm_set1_ps(p.ginv);
  const __m256d two52 = _mm256_set1_pd(4503599627370496.0);
  const __m256i two52_bits = _mm256_castpd_si256(two52);
  const __m256d tol_rel = _mm256_set1_pd(std::ldexp(1.0, -48));
  const __m256d one = _mm256_set1_pd(1.0);
  const __m256d inf = _mm256_set1_pd(INFINITY);
  const __m256i emin = _mm256_set1_epi64x(f.emin);
  const __m256i exp_mask = _mm256_set1_epi64x(0x7ff);
  const __m256i e1023 = _mm256_set1_epi64x(1023);
  const __m256i shift_w = _mm256_set1_epi64x(h + 1 + f.M);  // Ws = v * 2^(h+1+M-ee)
  const __m256i Mv = _mm256_set1_epi64x(f.M);
  const __m128i cnt_h1 = _mm_cvtsi32_si128(h + 1);
  const __m128i cnt_M = _mm_cvtsi32_si128(f.M);
  const __m256i Fmask = _mm256_set1_epi64x((int64_t{1} << (h + 1)) - 1);
  const __m256i zero_i = _mm256_setzero_si256();
  const __m256i max_mag = _mm256_set1_epi64x(f.max_mag);
  const __m256i sub_lim = _mm256_set1_epi64x(int64_t{1} << f.M);  // mag codes below are subnormal or zero
  const __m256i sign_bit = _mm256_set1_epi64x(f.sign_bit);
  const __m256i two_n_m1 = _mm256_set1_epi64x((int64_t{1} << h) - 1);
  const __m256i two_n1_m1 = _mm256_set1_epi64x((int64_t{1} << (h + 1)) - 1);
  const __m256i low29 = _mm256_set1_epi64x((int64_t{1} << 29) - 1);
  const __m256i mid29 = _mm256_set1_epi64x(int64_t{1} << 28);
  const __m256i tol29 = _mm256_set1_epi64x(16);
  const __m256d flt_min = _mm256_set1_pd(std::ldexp(1.0, -126));
  const __m256d flt_top = _mm256_set1_pd(std::ldexp(1.0, 127));

  int64_t j = 0;
  for (; j + 4 <= n; j += 4) {
    const __m128 x4 = _mm_loadu_ps(x + j);
    const __m256d xd = _mm256_cvtps_pd(x4);
    const __m256d neg = _mm256_castsi256_pd(_mm256_cmpgt_epi64(zero_i, _mm256_castpd_si256(xd)));  // sign bit set
    // v: the exact (fp32) or nearly exact (exact arithmetic) scaled magnitude
    __m256d v;
    if constexpr (exact_arith) {
      v = _mm256_mul_pd(_mm256_and_pd(xd, abs_mask), vr);
    } else {
      const __m128 y = p.has_scale ? _mm_mul_ps(x4, vmb) : _mm_mul_ps(x4, vt);
      v = _mm256_and_pd(_mm256_cvtps_pd(y), abs_mask);
    }
    // lanes the scalar core must redo: non-finite, unsigned negatives
    __m256d unsure = _mm256_cmp_pd(v, inf, _CMP_NLT_UQ);
    if (!f.is_signed) unsure = _mm256_or_pd(unsure, neg);

    const __m256i vbits = _mm256_castpd_si256(v);
    const __m256i e = _mm256_sub_epi64(_mm256_and_si256(_mm256_srli_epi64(vbits, 52), exp_mask), e1023);
    const __m256i ee = max_epi64(e, emin);
    const __m256d Ws = _mm256_mul_pd(v, pow2_vec(_mm256_sub_epi64(shift_w, ee)));
    const __m256d Wf = _mm256_round_pd(Ws, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    const __m256d frac = _mm256_sub_pd(Ws, Wf);
    if (check_v) {
      const __m256d tol = _mm256_mul_pd(Ws, tol_rel);
      const __m256d nz = _mm256_cmp_pd(v, _mm256_setzero_pd(), _CMP_NEQ_UQ);
      const __m256d near = _mm256_or_pd(_mm256_cmp_pd(frac, tol, _CMP_LE_OQ),
                                        _mm256_cmp_pd(frac, _mm256_sub_pd(one, tol), _CMP_GE_OQ));
      unsure = _mm256_or_pd(unsure, _mm256_and_pd(near, nz));
    }
    const __m256i W = _mm256_sub_epi64(_mm256_castpd_si256(_mm256_add_pd(Wf, two52)), two52_bits);
    const __m256i k = _mm256_srl_epi64(W, cnt_h1);
    const __m256i F = _mm256_and_si256(W, Fmask);
    const __m256i sticky = _mm256_castpd_si256(_mm256_cmp_pd(frac, _mm256_setzero_pd(), _CMP_NEQ_UQ));
    const __m256i negi = _mm256_castpd_si256(neg);
    __m256i r = zero_i;
    if constexpr (kSR) {
      alignas(32) int64_t rr[4];
      for (int l = 0; l < 4; ++l) rr[l] = rng(static_cast<uint64_t>(i0 + j + l));
      r = _mm256_load_si256(reinterpret_cast<const __m256i*>(rr));
    }
    const __m256i away = away_from_zero<MODE, Lanes64>(k, F, sticky, negi, r, two_n_m1, two_n1_m1);
    const __m256i kk = _mm256_sub_epi64(k, away);  // away lanes are -1
    __m256i code = _mm256_add_epi64(_mm256_sll_epi64(_mm256_sub_epi64(ee, emin), cnt_M), kk);
    const __m256i over = _mm256_cmpgt_epi64(code, max_mag);
    code = _mm256_blendv_epi8(code, max_mag, over);
    // the rounded magnitude z = kk * 2^(ee - M), or max when saturated
    const __m256d kkd = _mm256_sub_pd(_mm256_castsi256_pd(_mm256_or_si256(kk, two52_bits)), two52);
    __m256d z = _mm256_mul_pd(kkd, pow2_vec(_mm256_sub_epi64(ee, Mv)));
    z = _mm256_blendv_pd(z, vmax, _mm256_castsi256_pd(over));
    const __m256d above = _mm256_cmp_pd(v, vmax, _CMP_GT_OQ);
    const __m256i is_sub = _mm256_and_si256(_mm256_cmpgt_epi64(sub_lim, code), _mm256_cmpgt_epi64(code, zero_i));
    if (f.is_signed) code = _mm256_or_si256(code, _mm256_and_si256(negi, sign_bit));

    // dequantize
    __m128 xh;
    if constexpr (exact_arith) {
      const __m256d xhd = _mm256_mul_pd(z, vu);
      if (check_xh) {
        const __m256i xb = _mm256_castpd_si256(xhd);
        const __m256i dist = _mm256_sub_epi64(_mm256_and_si256(xb, low29), mid29);
        const __m256i absd = _mm256_blendv_epi8(dist, _mm256_sub_epi64(zero_i, dist), _mm256_cmpgt_epi64(zero_i, dist));
        const __m256d nz = _mm256_cmp_pd(xhd, _mm256_setzero_pd(), _CMP_NEQ_UQ);
        const __m256d bad_range = _mm256_and_pd(
            nz, _mm256_or_pd(_mm256_cmp_pd(xhd, flt_min, _CMP_LT_OQ), _mm256_cmp_pd(xhd, flt_top, _CMP_GE_OQ)));
        unsure = _mm256_or_pd(unsure, _mm256_castsi256_pd(_mm256_cmpgt_epi64(tol29, absd)));
        unsure = _mm256_or_pd(unsure, bad_range);
      }
      xh = _mm256_cvtpd_ps(xhd);
    } else {
      if (p.has_scale) xh = _mm_mul_ps(_mm256_cvtpd_ps(_mm256_mul_pd(z, vs)), vginv);
      else xh = _mm_div_ps(_mm256_cvtpd_ps(z), vt);
    }
    // the sign of x (x-hat is -0 for negative x that rounds to zero, where the format has -0)
    const __m128 sgn = _mm_and_ps(x4, _mm_castsi128_ps(_mm_set1_epi32(static_cast<int>(0x80000000u))));
    if (f.is_signed) xh = _mm_or_ps(xh, sgn);

    alignas(32) int64_t cc[4];
    _mm256_store_si256(reinterpret_cast<__m256i*>(cc), code);
    alignas(16) float xv[4];
    _mm_store_ps(xv, xh);
    const int um = _mm256_movemask_pd(unsure);
    const int am = _mm256_movemask_pd(above);
    const int sm = _mm256_movemask_pd(_mm256_castsi256_pd(is_sub));
    const int nzm = _mm_movemask_ps(_mm_cmpneq_ps(x4, _mm_setzero_ps()));
    const int zm = _mm_movemask_ps(_mm_cmpeq_ps(xh, _mm_setzero_ps()));
    const int ok = ~um & 0xf;
    cnt.saturated += __builtin_popcount(am & ok);
    cnt.subnormal += __builtin_popcount(sm & ok);
    cnt.nonzero += __builtin_popcount(nzm & ok);
    cnt.underflow += __builtin_popcount(nzm & zm & ok);
    float* vout = values + i0 + j;
    for (int l = 0; l < 4; ++l) vout[l] = xv[l];
    if (codes) {
      if (cb == 1) {
        uint8_t* co = codes + i0 + j;
        for (int l = 0; l < 4; ++l) co[l] = static_cast<uint8_t>(cc[l]);
      } else {
        uint8_t* co = codes + 2 * (i0 + j);
        for (int l = 0; l < 4; ++l) {
          co[2 * l] = static_cast<uint8_t>(cc[l]);
          co[2 * l + 1] = static_cast<uint8_t>(cc[l] >> 8);
        }
      }
    }
    if (um) {
      for (int l = 0; l < 4; ++l)
        if (um & (1 << l)) scalar_element(p, c, x, i0 + j + l, j + l, codes, values, rng, cnt);
    }
  }
  for (; j < n; ++j) scalar_element(p, c, x, i0 + j, j, codes, values, rng, cnt);
}

// ----- the 8-lane float32 loop for FP4-class formats -----

// Random bits of the 8 elements i .. i+7 from the words of their row
// (w[k] is word j0 + k); i is a multiple of 4 when n <= 8, of 2 when n <= 16.
inline __m256i random8(const uint32_t* w, uint64_t j0, uint64_t i, int n) {
  if (n <= 8) {
    const uint32_t* p = w + ((i >> 2) - j0);
    long long both;
    std::memcpy(&both, p, 8);
    const __m256i b = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(both));
    return _mm256_srl_epi32(b, _mm_cvtsi32_si128(8 - n));
  }
  if (n <= 16) {
    const __m256i b = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + ((i >> 1) - j0))));
    return _mm256_srl_epi32(b, _mm_cvtsi32_si128(16 - n));
  }
  return _mm256_srl_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + (i - j0))), _mm_cvtsi32_si128(32 - n));
}

// Sum of the int32 lanes, negated (the lanes hold -counts).
inline uint64_t hsum_neg(__m256i v) {
  alignas(32) int32_t l[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(l), v);
  int64_t t = 0;
  for (int k = 0; k < 8; ++k) t += l[k];
  return static_cast<uint64_t>(-t);
}

// Strides and offsets, in floats, of the per-block constants that
// span4_impl's block-per-lane form gathers.
constexpr int kVbStride = sizeof(Vec4Block) / sizeof(float);
constexpr int kVbTable = offsetof(Vec4Block, table) / sizeof(float);
constexpr int kBcStride = sizeof(BlockConsts) / sizeof(float);
constexpr int kBcMb = offsetof(BlockConsts, mb) / sizeof(float);
static_assert(sizeof(Vec4Block) % sizeof(float) == 0 && offsetof(Vec4Block, r) == 0 &&
                  sizeof(BlockConsts) % sizeof(float) == 0 && offsetof(BlockConsts, mb) % sizeof(float) == 0,
              "block constants gathered as float lanes");

// The block index of each of `cols` columns in blocks of `bc` columns, kept
// per thread for the last shape asked (one table for every instantiation of
// span4_impl).
const int32_t* column_blocks(int64_t cols, int64_t bc) {
  thread_local std::vector<int32_t> map;
  thread_local int64_t for_cols = -1, for_bc = -1;
  if (for_cols != cols || for_bc != bc) {
    map.resize(static_cast<size_t>(cols));
    for (int64_t j = 0; j < cols; ++j) map[static_cast<size_t>(j)] = static_cast<int32_t>(j / bc);
    for_cols = cols;
    for_bc = bc;
  }
  return map.data();
}

// The 8-lane loop of one row. Per block (kLanes false): a block's constants
// are broadcast and its 8-element steps run, the last partial step left to
// the scalar core. With a block per lane (kLanes true, for block widths that
// are not a multiple of 8, Bx1 columns above all): the steps run along the
// whole row and each lane gathers the multiplier and x-hat of its own block.
template <Round MODE, Arith ARITH, bool kLanes>
void span4_impl(const QuantPlan& p, const Row4& row, uint8_t* codes, float* values, RandomBits& rng,
                SpanCounts& cnt) {
  const Format& f = p.fe;
  constexpr bool kSR = MODE == Round::stochastic || MODE == Round::stochastic_fast || MODE == Round::stochastic_fastest;
  constexpr bool kExact = ARITH == Arith::exact;
  const int h = kSR ? p.sr_bits : 0;
  // Random words come 8 lanes at a time only from aligned starts.
  const int64_t align = h <= 8 ? 4 : h <= 16 ? 2 : 1;

  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256 sign_mask = _mm256_castsi256_ps(_mm256_set1_epi32(static_cast<int>(0x80000000u)));
  const __m256 vmax = _mm256_set1_ps(static_cast<float>(f.max));
  const __m256 vt = _mm256_set1_ps(p.t);
  const __m256 inf = _mm256_set1_ps(INFINITY);
  const __m256 tiny = _mm256_set1_ps(std::ldexp(1.0f, -100));
  const __m256 tol_rel = _mm256_set1_ps(std::ldexp(1.0f, -20));
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 zero = _mm256_setzero_ps();
  // in biased exponents: ee_b = max(exponent field, emin + 127) and
  // Ws = v * 2^(h+1+M-ee) = v * 2^((h+1+M+254 - ee_b) - 127)
  const __m256i emin_b = _mm256_set1_epi32(f.emin + 127);
  const __m256i shift_b = _mm256_set1_epi32(h + 1 + f.M + 254);
  const __m256i shift_rne = _mm256_set1_epi32(f.M + 254);
  // rne in fp32 arithmetic: v is exact, so the hardware's conversion rounds it
  constexpr bool kCvtRne = MODE == Round::rne;
  const __m256 half = _mm256_set1_ps(0.5f);
  const __m128i cnt_h1 = _mm_cvtsi32_si128(h + 1);
  const __m128i cnt_M = _mm_cvtsi32_si128(f.M);
  const __m256i Fmask = _mm256_set1_epi32((1 << (h + 1)) - 1);
  const __m256i zero_i = _mm256_setzero_si256();
  const __m256i max_mag = _mm256_set1_epi32(static_cast<int>(f.max_mag));
  const __m256i sub_lim = _mm256_set1_epi32(1 << f.M);
  const __m256i sign_bit = _mm256_set1_epi32(static_cast<int>(f.sign_bit));
  const __m256i two_n_m1 = _mm256_set1_epi32((1 << h) - 1);
  const __m256i two_n1_m1 = _mm256_set1_epi32((2 << h) - 1);
  const int cb = f.code_bytes();
  const __m256i all_ones = _mm256_set1_epi32(-1);
  __m256i acc_sat = zero_i, acc_sub = zero_i, acc_nz = zero_i, acc_uf = zero_i;
  // Stochastic modes: the Philox words of the whole row, 8 counter blocks
  // per vector step.
  thread_local std::vector<uint32_t> words;
  uint64_t wj0 = 0;
  if constexpr (kSR) {
    const uint64_t first = random_word_index(static_cast<uint64_t>(row.i0), h) & ~uint64_t{3};
    const uint64_t last = random_word_index(static_cast<uint64_t>(row.i0 + row.cols - 1), h);
    words.resize(static_cast<size_t>(last - first + 1 + 32));
    philox_words(p.seed, p.stream, first, static_cast<int64_t>(last - first + 1), words.data());
    wj0 = first;
  }

  // Lanes the scalar core must redo, collected here and redone after the
  // loop: a function call inside the loop would make the compiler keep the
  // vector state in memory (every ymm register is caller-saved).
  struct Pending {
    int64_t block, j;
    uint32_t mask;
  };
  thread_local std::vector<Pending> pending;
  pending.resize(static_cast<size_t>(row.cols / 8 + 2 * row.nblocks + 2));
  size_t np = 0;

  // kLanes: each column's block index, and, where some blocks are not the
  // loop's, a use flag per block.
  const int32_t* col_block = kLanes ? column_blocks(row.cols, row.bc) : nullptr;
  thread_local std::vector<int32_t> use32;
  bool all_used = true;
  if constexpr (kLanes) {
    all_used = std::memchr(row.use, 0, static_cast<size_t>(row.nblocks)) == nullptr;
    if (!all_used) {
      use32.resize(static_cast<size_t>(row.nblocks));
      for (int64_t b = 0; b < row.nblocks; ++b) use32[static_cast<size_t>(b)] = row.use[b] ? -1 : 0;
    }
  }
  const float* vb_base = reinterpret_cast<const float*>(row.vb);
  const float* bc_base = reinterpret_cast<const float*>(row.consts);

  for (int64_t b = 0; b < (kLanes ? 1 : row.nblocks); ++b) {
  if (!kLanes && !row.use[b]) continue;
  const BlockConsts& c = row.consts[b];
  const Vec4Block& vb = row.vb[b];
  const __m256 vr = _mm256_set1_ps(vb.r);
  const __m256 vmb = _mm256_set1_ps(c.mb);
  const __m256 table = _mm256_loadu_ps(vb.table);
  const int64_t i0 = kLanes ? row.i0 : row.i0 + b * row.bc;
  const int64_t n = kLanes ? row.cols : std::min(row.bc, row.cols - b * row.bc);
  const float* x = kLanes ? row.x : row.x + b * row.bc;
  // One step: elements j .. j+7 of the block (kLanes: of the row).
  auto step = [&](int64_t j) __attribute__((always_inline)) {
    __m256i bidx = zero_i;
    __m256 vr_l = vr, vmb_l = vmb;
    __m256 in_use = _mm256_castsi256_ps(all_ones);  // kLanes: the lanes whose block is the loop's
    if constexpr (kLanes) {
      bidx = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(col_block + j));
      if constexpr (kExact) {
        vr_l = _mm256_i32gather_ps(vb_base, _mm256_mullo_epi32(bidx, _mm256_set1_epi32(kVbStride)), 4);
      } else {
        vmb_l = _mm256_i32gather_ps(bc_base + kBcMb, _mm256_mullo_epi32(bidx, _mm256_set1_epi32(kBcStride)), 4);
      }
      if (!all_used) in_use = _mm256_castsi256_ps(_mm256_i32gather_epi32(use32.data(), bidx, 4));
    }
    const __m256 x8 = _mm256_loadu_ps(x + j);
    const __m256 xs = _mm256_and_ps(x8, sign_mask);
    const __m256i negi = _mm256_srai_epi32(_mm256_castps_si256(x8), 31);
    __m256 v;
    __m256 unsure;
    if constexpr (kExact) {
      v = _mm256_mul_ps(_mm256_and_ps(x8, abs_mask), vr_l);
      // tiny (float-subnormal, or underflowed to 0) products of non-zero x
      // lose precision: let the core decide
      unsure = _mm256_and_ps(_mm256_cmp_ps(v, tiny, _CMP_LT_OQ), _mm256_cmp_ps(x8, zero, _CMP_NEQ_UQ));
    } else {
      v = _mm256_and_ps(_mm256_mul_ps(x8, p.has_scale ? vmb_l : vt), abs_mask);
      unsure = zero;
    }
    unsure = _mm256_or_ps(unsure, _mm256_cmp_ps(v, inf, _CMP_NLT_UQ));
    if (!f.is_signed) unsure = _mm256_or_ps(unsure, _mm256_castsi256_ps(negi));

    // biased exponents (v >= 0, so the shift leaves just the exponent field)
    const __m256i ee = _mm256_max_epi32(_mm256_srli_epi32(_mm256_castps_si256(v), 23), emin_b);
    const __m256 p2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_sub_epi32(shift_b, ee), 23));
    __m256i kk;  // index of the result inside the binade ee, may reach 2^(M+1)
    if constexpr (kCvtRne) {
      // The conversion rounds v * 2^(M-ee) once, to nearest even: with M >= 1
      // the parity of the index is the parity of the code, so this is the
      // rne of docs/numerics.md §2 (exmy never changes MXCSR's rounding mode). In fp32
      // arithmetic v is exact; in exact arithmetic the only decision points
      // of rne are the ties, so lanes near a tie go to the scalar core.
      const __m256 Wr = _mm256_mul_ps(v, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_sub_epi32(shift_rne, ee), 23)));
      kk = _mm256_cvtps_epi32(Wr);
      if constexpr (kExact) {
        const __m256 d = _mm256_and_ps(_mm256_sub_ps(Wr, _mm256_cvtepi32_ps(kk)), abs_mask);
        const __m256 off_tie = _mm256_and_ps(_mm256_sub_ps(d, half), abs_mask);
        unsure = _mm256_or_ps(unsure, _mm256_cmp_ps(off_tie, _mm256_mul_ps(Wr, tol_rel), _CMP_LE_OQ));
      }
    } else {
      const __m256 Ws = _mm256_mul_ps(v, p2);
      const __m256 Wf = _mm256_round_ps(Ws, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
      const __m256 frac = _mm256_sub_ps(Ws, Wf);
      if constexpr (kExact) {
        const __m256 tol = _mm256_mul_ps(Ws, tol_rel);
        const __m256 near = _mm256_or_ps(_mm256_cmp_ps(frac, tol, _CMP_LE_OQ),
                                         _mm256_cmp_ps(frac, _mm256_sub_ps(one, tol), _CMP_GE_OQ));
        unsure = _mm256_or_ps(unsure, _mm256_and_ps(near, _mm256_cmp_ps(v, zero, _CMP_NEQ_UQ)));
      }
      const __m256i W = _mm256_cvttps_epi32(Wf);
      const __m256i k = _mm256_srl_epi32(W, cnt_h1);
      const __m256i F = _mm256_and_si256(W, Fmask);
      const __m256i sticky = _mm256_castps_si256(_mm256_cmp_ps(frac, zero, _CMP_NEQ_UQ));
      __m256i r = zero_i;
      if constexpr (kSR) {
        const uint64_t i = static_cast<uint64_t>(i0 + j);
        if ((i & static_cast<uint64_t>(align - 1)) == 0) {  // align is 1, 2 or 4
          r = random8(words.data(), wj0, i, h);
        } else {
          alignas(32) uint32_t rr[8];
          for (int l = 0; l < 8; ++l) rr[l] = rng(i + l);
          r = _mm256_load_si256(reinterpret_cast<const __m256i*>(rr));
        }
      }
      const __m256i away = away_from_zero<MODE, Lanes32>(k, F, sticky, negi, r, two_n_m1, two_n1_m1);
      kk = _mm256_sub_epi32(k, away);  // away lanes are -1
    }
    __m256i code = _mm256_add_epi32(_mm256_sll_epi32(_mm256_sub_epi32(ee, emin_b), cnt_M), kk);
    code = _mm256_min_epi32(code, max_mag);
    __m256 xh;
    if constexpr (kLanes) {
      // (the low 3 bits, as the permute takes them: lanes left to the scalar
      // core may hold any code)
      const __m256i at = _mm256_add_epi32(_mm256_mullo_epi32(bidx, _mm256_set1_epi32(kVbStride)),
                                          _mm256_and_si256(code, _mm256_set1_epi32(7)));
      xh = _mm256_i32gather_ps(vb_base + kVbTable, at, 4);
    } else {
      xh = _mm256_permutevar8x32_ps(table, code);
    }
    if (f.is_signed) {
      xh = _mm256_or_ps(xh, xs);
      code = _mm256_or_si256(code, _mm256_and_si256(negi, sign_bit));
    }
    _mm256_storeu_ps(values + i0 + j, xh);
    if (codes) {
      const __m128i p16 = _mm_packus_epi32(_mm256_castsi256_si128(code), _mm256_extracti128_si256(code, 1));
      if (cb == 1) _mm_storel_epi64(reinterpret_cast<__m128i*>(codes + i0 + j), _mm_packus_epi16(p16, p16));
      else _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + 2 * (i0 + j)), p16);
    }
    if (row.stats) {
      if constexpr (kCvtRne && kExact) {
        // the saturation count compares with max, itself no rne decision point
        const __m256 dm = _mm256_and_ps(_mm256_sub_ps(v, vmax), abs_mask);
        unsure = _mm256_or_ps(unsure, _mm256_cmp_ps(dm, _mm256_mul_ps(v, tol_rel), _CMP_LE_OQ));
      }
      const __m256 above = _mm256_cmp_ps(v, vmax, _CMP_GT_OQ);
      const __m256i mag = _mm256_andnot_si256(sign_bit, code);
      const __m256i is_sub = _mm256_and_si256(_mm256_cmpgt_epi32(sub_lim, mag), _mm256_cmpgt_epi32(mag, zero_i));
      // counts of the certain lanes, accumulated as -1 per lane
      const __m256i oki = _mm256_castps_si256(_mm256_andnot_ps(unsure, in_use));
      const __m256i nzi = _mm256_castps_si256(_mm256_cmp_ps(x8, zero, _CMP_NEQ_UQ));
      const __m256i zi = _mm256_castps_si256(_mm256_cmp_ps(xh, zero, _CMP_EQ_OQ));
      acc_sat = _mm256_add_epi32(acc_sat, _mm256_and_si256(_mm256_castps_si256(above), oki));
      acc_sub = _mm256_add_epi32(acc_sub, _mm256_and_si256(is_sub, oki));
      acc_nz = _mm256_add_epi32(acc_nz, _mm256_and_si256(nzi, oki));
      acc_uf = _mm256_add_epi32(acc_uf, _mm256_and_si256(_mm256_and_si256(nzi, zi), oki));
    }
    const int um = _mm256_movemask_ps(_mm256_and_ps(unsure, in_use));
    if (um) pending[np++] = Pending{b, j, static_cast<uint32_t>(um)};
  };
  int64_t j = 0;
  if (n == 16) {  // the common 1x16 / 16x16 block row: two independent steps, unrolled
    step(0);
    step(8);
    j = 16;
  } else {
    for (; j + 8 <= n; j += 8) step(j);
  }
  if (j < n) pending[np++] = Pending{b, j, (1u << (n - j)) - 1u};  // the tail (fewer than 8)
  }
  for (size_t k = 0; k < np; ++k) {
    const Pending& q = pending[k];
    if constexpr (kLanes) {  // q.j counts from the row's start; lanes of other blocks are not ours
      for (int l = 0; l < 8; ++l) {
        const int64_t col = q.j + l, blk = col / row.bc;
        if ((q.mask & (1u << l)) && row.use[blk])
          scalar_element(p, row.consts[blk], row.x, row.i0 + col, col, codes, values, rng, cnt);
      }
      continue;
    }
    const float* x = row.x + q.block * row.bc;
    const int64_t i0 = row.i0 + q.block * row.bc;
    for (int l = 0; l < 8; ++l)
      if (q.mask & (1u << l)) scalar_element(p, row.consts[q.block], x, i0 + q.j + l, q.j + l, codes, values, rng, cnt);
  }
  // lane sums stay below 2^31: a row is far shorter than 2^31 elements
  cnt.saturated += hsum_neg(acc_sat);
  cnt.subnormal += hsum_neg(acc_sub);
  cnt.nonzero += hsum_neg(acc_nz);
  cnt.underflow += hsum_neg(acc_uf);
}

// The end of an 8-lane step of the threshold loops, once the magnitude codes
// and x-hat's magnitudes are known: x-hat and the codes take x's sign and are
// stored (non-temporally with kStream), and the lanes' statistics are
// accumulated as -1 per lane until add_to.
template <bool kStream>
struct ThrStep {
  const __m256i sign_mask = _mm256_set1_epi32(static_cast<int>(0x80000000u));
  const __m256i sub_lim;
  const __m128i sign_shift;
  __m256i acc_sat = _mm256_setzero_si256(), acc_sub = acc_sat, acc_nz = acc_sat, acc_uf = acc_sat;

  explicit ThrStep(const Format& f)
      : sub_lim(_mm256_set1_epi32(1 << f.M)), sign_shift(_mm_cvtsi32_si128(31 - __builtin_ctz(f.sign_bit))) {}

  // xi: the input bits; returns x-hat. co is null when no codes are wanted.
  __attribute__((always_inline)) __m256 store(__m256i xi, __m256i code, __m256 mag, float* vo, uint8_t* co) const {
    const __m256i xs = _mm256_and_si256(xi, sign_mask);
    const __m256 xh = _mm256_or_ps(mag, _mm256_castsi256_ps(xs));
    if constexpr (kStream) {
      _mm_stream_ps(vo, _mm256_castps256_ps128(xh));
      _mm_stream_ps(vo + 4, _mm256_extractf128_ps(xh, 1));
    } else {
      _mm256_storeu_ps(vo, xh);
    }
    if (co) {
      const __m256i sc = _mm256_or_si256(code, _mm256_srl_epi32(xs, sign_shift));
      const __m128i p16 = _mm_packus_epi32(_mm256_castsi256_si128(sc), _mm256_extracti128_si256(sc, 1));
      const __m128i p8 = _mm_packus_epi16(p16, p16);
      if constexpr (kStream) _mm_stream_si64(reinterpret_cast<long long*>(co), _mm_cvtsi128_si64(p8));
      else _mm_storel_epi64(reinterpret_cast<__m128i*>(co), p8);
    }
    return xh;
  }

  // nz: the lanes that count and hold x != 0; m1: code >= 1; sat: the lanes
  // counted as saturated.
  __attribute__((always_inline)) void count(__m256i nz, __m256i code, __m256i m1, __m256 xh, __m256i sat) {
    const __m256i zi = _mm256_castps_si256(_mm256_cmp_ps(xh, _mm256_setzero_ps(), _CMP_EQ_OQ));
    const __m256i is_sub = _mm256_and_si256(_mm256_cmpgt_epi32(sub_lim, code), m1);
    acc_sat = _mm256_add_epi32(acc_sat, sat);
    acc_sub = _mm256_add_epi32(acc_sub, is_sub);
    acc_nz = _mm256_add_epi32(acc_nz, nz);
    acc_uf = _mm256_add_epi32(acc_uf, _mm256_and_si256(nz, zi));
  }

  // lane sums stay below 2^31: a call covers far fewer elements
  void add_to(SpanCounts& cnt) const {
    cnt.saturated += hsum_neg(acc_sat);
    cnt.subnormal += hsum_neg(acc_sub);
    cnt.nonzero += hsum_neg(acc_nz);
    cnt.underflow += hsum_neg(acc_uf);
  }
};

// The threshold loop (see Vec4Thr): the magnitude code is the count of
// thresholds |x| reaches, exact for every finite x.
template <bool kStream>
void row_thr_impl(const QuantPlan& p, const Row4T& row, uint8_t* codes, float* values, SpanCounts& cnt) {
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff);
  const __m256i zero_i = _mm256_setzero_si256();
  ThrStep<kStream> out(p.fe);
  // tails of partial blocks go to the scalar core after the loop
  struct Pending {
    int64_t block, j, n;
  };
  thread_local std::vector<Pending> pending;
  pending.clear();
  RandomBits rng(p.seed, p.stream, 8);  // for scalar_element; these modes draw no bits
  for (int64_t b = 0; b < row.nblocks; ++b) {
    const uint8_t sc = row.code[b];
    if (!row.use[sc]) continue;
    const Vec4Thr& th = row.thr[sc];
    const __m256i t1 = _mm256_set1_epi32(th.t[0]), t2 = _mm256_set1_epi32(th.t[1]);
    const __m256i t3 = _mm256_set1_epi32(th.t[2]), t4 = _mm256_set1_epi32(th.t[3]);
    const __m256i t5 = _mm256_set1_epi32(th.t[4]), t6 = _mm256_set1_epi32(th.t[5]);
    const __m256i t7 = _mm256_set1_epi32(th.t[6]);
    const __m256 table = _mm256_loadu_ps(th.table);
    const int64_t i0 = row.i0 + b * row.bc;
    const int64_t n = std::min(row.bc, row.cols - b * row.bc);
    const float* x = row.x + b * row.bc;
    if (row.prefetch) {
      const float* pf = row.prefetch + b * row.bc;
      for (int64_t j = 0; j < n; j += 16) _mm_prefetch(reinterpret_cast<const char*>(pf + j), _MM_HINT_T0);
    }
    auto step = [&](int64_t j) __attribute__((always_inline)) {
      const __m256i xi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + j));
      const __m256i ax = _mm256_and_si256(xi, abs_mask);
      const __m256i m1 = _mm256_cmpgt_epi32(ax, t1);
      __m256i code = _mm256_sub_epi32(zero_i, m1);
      code = _mm256_sub_epi32(code, _mm256_cmpgt_epi32(ax, t2));
      code = _mm256_sub_epi32(code, _mm256_cmpgt_epi32(ax, t3));
      code = _mm256_sub_epi32(code, _mm256_cmpgt_epi32(ax, t4));
      code = _mm256_sub_epi32(code, _mm256_cmpgt_epi32(ax, t5));
      code = _mm256_sub_epi32(code, _mm256_cmpgt_epi32(ax, t6));
      code = _mm256_sub_epi32(code, _mm256_cmpgt_epi32(ax, t7));
      const __m256 xh = out.store(xi, code, _mm256_permutevar8x32_ps(table, code), values + i0 + j,
                                  codes ? codes + i0 + j : nullptr);
      if (row.stats)
        out.count(_mm256_cmpgt_epi32(ax, zero_i), code, m1, xh, _mm256_cmpgt_epi32(ax, _mm256_set1_epi32(th.sat)));
    };
    int64_t j = 0;
    if (n == 16) {
      step(0);
      step(8);
      j = 16;
    } else {
      for (; j + 8 <= n; j += 8) step(j);
    }
    if (j < n) pending.push_back(Pending{b, j, n - j});
  }
  for (const Pending& q : pending) {
    const float* x = row.x + q.block * row.bc;
    const int64_t i0 = row.i0 + q.block * row.bc;
    for (int64_t l = 0; l < q.n; ++l)
      scalar_element(p, row.consts[row.code[q.block]], x, i0 + q.j + l, q.j + l, codes, values, rng, cnt);
  }
  if constexpr (kStream) _mm_sfence();
  out.add_to(cnt);
}

// 8x8 transpose of int32: row k of the result is lane k of every input.
inline void transpose8x8(__m256i r[8]) {
  __m256i t[8], u[8];
  for (int k = 0; k < 4; ++k) {
    t[2 * k] = _mm256_unpacklo_epi32(r[2 * k], r[2 * k + 1]);
    t[2 * k + 1] = _mm256_unpackhi_epi32(r[2 * k], r[2 * k + 1]);
  }
  for (int k = 0; k < 2; ++k) {
    u[4 * k] = _mm256_unpacklo_epi64(t[4 * k], t[4 * k + 2]);
    u[4 * k + 1] = _mm256_unpackhi_epi64(t[4 * k], t[4 * k + 2]);
    u[4 * k + 2] = _mm256_unpacklo_epi64(t[4 * k + 1], t[4 * k + 3]);
    u[4 * k + 3] = _mm256_unpackhi_epi64(t[4 * k + 1], t[4 * k + 3]);
  }
  for (int k = 0; k < 4; ++k) {
    r[k] = _mm256_permute2x128_si256(u[k], u[k + 4], 0x20);
    r[k + 4] = _mm256_permute2x128_si256(u[k], u[k + 4], 0x31);
  }
}

// The threshold loop with a block per lane (see vec4_band_thr_lanes). The
// band goes in chunks of columns: each chunk's constants are laid out column
// by column (the Vec4Thr of eight columns' blocks transposed), small enough
// to stay in L1 while every row of the band runs through the chunk.
template <bool kStream>
void band_thr_lanes_impl(const QuantPlan& p, const Row4T& band, uint8_t* codes, float* values, SpanCounts& cnt) {
  static_assert(sizeof(Vec4Thr) == 16 * sizeof(int32_t), "Vec4Thr: t[7], sat, table[8]");
  const int64_t cols = band.cols, c8 = cols & ~int64_t{7};
  // The layout of a chunk: arrays of kChunk int32, thresholds 1..7, the
  // saturation threshold, the bits of x-hat for magnitude codes 0..7, and
  // -1 where the column's block is the loop's (0 where the scalar core
  // encodes it: those lanes take `unused`, thresholds no |x| exceeds, and
  // count in no statistic).
  constexpr int64_t kChunk = 256;
  constexpr int kT = 0, kSat = 7, kTab = 8, kUse = 16, kArrays = 17;
  alignas(32) int32_t lay[kArrays * kChunk];
  Vec4Thr unused;
  for (int k = 0; k < 7; ++k) unused.t[k] = std::numeric_limits<int32_t>::max();
  unused.sat = std::numeric_limits<int32_t>::max();
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff);
  const __m256i zero_i = _mm256_setzero_si256();
  ThrStep<kStream> out(p.fe);
  for (int64_t c0 = 0; c0 < c8; c0 += kChunk) {
    const int64_t w = std::min(kChunk, c8 - c0);
    for (int64_t c = 0; c < w; c += 8) {
      __m256i lo[8], hi[8];
      alignas(32) int32_t use[8];
      for (int l = 0; l < 8; ++l) {
        const uint8_t sc = band.code[(c0 + c + l) / band.bc];
        const Vec4Thr* th = band.use[sc] ? &band.thr[sc] : &unused;
        use[l] = band.use[sc] ? -1 : 0;
        lo[l] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(th->t));
        hi[l] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(th->table));
      }
      transpose8x8(lo);
      transpose8x8(hi);
      for (int k = 0; k < 8; ++k) {
        _mm256_store_si256(reinterpret_cast<__m256i*>(lay + (kT + k) * kChunk + c), lo[k]);
        _mm256_store_si256(reinterpret_cast<__m256i*>(lay + (kTab + k) * kChunk + c), hi[k]);
      }
      _mm256_store_si256(reinterpret_cast<__m256i*>(lay + kUse * kChunk + c), _mm256_load_si256(reinterpret_cast<const __m256i*>(use)));
    }
    for (int64_t r = 0; r < band.rows; ++r) {
      const float* x = band.x + r * cols + c0;
      float* vo = values + band.i0 + r * cols + c0;
      uint8_t* co = codes ? codes + band.i0 + r * cols + c0 : nullptr;
      for (int64_t c = 0; c < w; c += 8) {
        const int32_t* l = lay + c;
        auto at = [l](int k) { return _mm256_load_si256(reinterpret_cast<const __m256i*>(l + k * kChunk)); };
        auto atf = [l](int k) { return _mm256_load_ps(reinterpret_cast<const float*>(l + k * kChunk)); };
        const __m256i xi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + c));
        const __m256i ax = _mm256_and_si256(xi, abs_mask);
        // the code counts the thresholds |x| exceeds; x-hat follows the same
        // masks up the table (they are nested: each implies the one before)
        const __m256i m1 = _mm256_cmpgt_epi32(ax, at(kT));
        __m256i code = _mm256_sub_epi32(zero_i, m1);
        __m256 xh = _mm256_blendv_ps(atf(kTab), atf(kTab + 1), _mm256_castsi256_ps(m1));
        for (int k = 1; k < 7; ++k) {
          const __m256i m = _mm256_cmpgt_epi32(ax, at(kT + k));
          code = _mm256_sub_epi32(code, m);
          xh = _mm256_blendv_ps(xh, atf(kTab + k + 1), _mm256_castsi256_ps(m));
        }
        xh = out.store(xi, code, xh, vo + c, co ? co + c : nullptr);
        if (band.stats)
          out.count(_mm256_and_si256(_mm256_cmpgt_epi32(ax, zero_i), at(kUse)), code, m1, xh,
                    _mm256_cmpgt_epi32(ax, at(kSat)));
      }
    }
  }
  if constexpr (kStream) _mm_sfence();
  // the last columns (fewer than 8) through the scalar core
  RandomBits rng(p.seed, p.stream, 8);  // for scalar_element; these modes draw no bits
  for (int64_t r = 0; r < band.rows; ++r) {
    for (int64_t c = c8; c < cols; ++c) {
      const uint8_t sc = band.code[c / band.bc];
      if (!band.use[sc]) continue;
      scalar_element(p, band.consts[sc], band.x + r * cols, band.i0 + r * cols + c, c, codes, values, rng, cnt);
    }
  }
  out.add_to(cnt);
}

template <Arith A, bool L>
void span4_dispatch(const QuantPlan& p, const Row4& row, uint8_t* codes, float* values, RandomBits& rng,
                    SpanCounts& cnt) {
  switch (p.round) {
    case Round::rne: return span4_impl<Round::rne, A, L>(p, row, codes, values, rng, cnt);
    case Round::rna: return span4_impl<Round::rna, A, L>(p, row, codes, values, rng, cnt);
    case Round::rtz: return span4_impl<Round::rtz, A, L>(p, row, codes, values, rng, cnt);
    case Round::up: return span4_impl<Round::up, A, L>(p, row, codes, values, rng, cnt);
    case Round::down: return span4_impl<Round::down, A, L>(p, row, codes, values, rng, cnt);
    case Round::odd: return span4_impl<Round::odd, A, L>(p, row, codes, values, rng, cnt);
    case Round::stochastic: return span4_impl<Round::stochastic, A, L>(p, row, codes, values, rng, cnt);
    case Round::stochastic_fast:
      return span4_impl<Round::stochastic_fast, A, L>(p, row, codes, values, rng, cnt);
    case Round::stochastic_fastest:
      return span4_impl<Round::stochastic_fastest, A, L>(p, row, codes, values, rng, cnt);
  }
}

template <Arith A>
void span_dispatch(const QuantPlan& p, const BlockConsts& c, const VecBlock& vb, const float* x, int64_t i0, int64_t n,
                   uint8_t* codes, float* values, RandomBits& rng, SpanCounts& cnt) {
  switch (p.round) {
    case Round::rne: return span_impl<Round::rne, A>(p, c, vb, x, i0, n, codes, values, rng, cnt);
    case Round::rna: return span_impl<Round::rna, A>(p, c, vb, x, i0, n, codes, values, rng, cnt);
    case Round::rtz: return span_impl<Round::rtz, A>(p, c, vb, x, i0, n, codes, values, rng, cnt);
    case Round::up: return span_impl<Round::up, A>(p, c, vb, x, i0, n, codes, values, rng, cnt);
    case Round::down: return span_impl<Round::down, A>(p, c, vb, x, i0, n, codes, values, rng, cnt);
    case Round::odd: return span_impl<Round::odd, A>(p, c, vb, x, i0, n, codes, values, rng, cnt);
    case Round::stochastic: return span_impl<Round::stochastic, A>(p, c, vb, x, i0, n, codes, values, rng, cnt);
    case Round::stochastic_fast:
      return span_impl<Round::stochastic_fast, A>(p, c, vb, x, i0, n, codes, values, rng, cnt);
    case Round::stochastic_fastest:
      return span_impl<Round::stochastic_fastest, A>(p, c, vb, x, i0, n, codes, values, rng, cnt);
  }
}

}  // namespace

void vec_span(const QuantPlan& p, const BlockConsts& c, const VecBlock& vb, const float* x, int64_t i0, int64_t n,
              uint8_t* codes, float* values, RandomBits& rng, SpanCounts& cnt) {
  if (p.arith == Arith::exact) span_dispatch<Arith::exact>(p, c, vb, x, i0, n, codes, values, rng, cnt);
  else span_dispatch<Arith::fp32>(p, c, vb, x, i0, n, codes, values, rng, cnt);
}

void vec4_row(const QuantPlan& p, const Row4& row, uint8_t* codes, float* values, RandomBits& rng, SpanCounts& cnt) {
  // a block per lane where the per-block steps would leave whole blocks, or
  // their ends, to the scalar core
  const bool lanes = row.bc % 8 != 0 && row.nblocks > 1;
  if (p.arith == Arith::exact) {
    if (lanes) span4_dispatch<Arith::exact, true>(p, row, codes, values, rng, cnt);
    else span4_dispatch<Arith::exact, false>(p, row, codes, values, rng, cnt);
  } else {
    if (lanes) span4_dispatch<Arith::fp32, true>(p, row, codes, values, rng, cnt);
    else span4_dispatch<Arith::fp32, false>(p, row, codes, values, rng, cnt);
  }
}

void vec4_row_thr(const QuantPlan& p, const Row4T& row, uint8_t* codes, float* values, SpanCounts& cnt) {
  if (row.stream) row_thr_impl<true>(p, row, codes, values, cnt);
  else row_thr_impl<false>(p, row, codes, values, cnt);
}

void vec4_band_thr_lanes(const QuantPlan& p, const Row4T& band, uint8_t* codes, float* values, SpanCounts& cnt) {
  if (band.stream) band_thr_lanes_impl<true>(p, band, codes, values, cnt);
  else band_thr_lanes_impl<false>(p, band, codes, values, cnt);
}

namespace {

// The vectorised block-scale computation of block_scale(), four blocks at a
// time, for the amax-* rules and scale formats with zero and subnormals, and
// the MX rules with power-of-two formats.
class ScaleVec {
 public:
  explicit ScaleVec(const QuantPlan& p) : p_(p), f_(p.fs) {
    const Format& f = p.fs;
    pow2_fmt_ = !f.subnormals && f.M == 0;
    ok_ = p.has_scale && ((f.subnormals && f.has_zero) || pow2_fmt_) && f.M <= 40 && f.max >= f.min_normal;
    mx_ = p.rule == ScaleRule::mx_floor || p.rule == ScaleRule::mx_ceil || p.rule == ScaleRule::mx_even;
    exact_ = p.arith == Arith::exact;
    mode_ = mx_ ? Round::rne
            : p.rule == ScaleRule::amax_rne ? Round::rne
            : p.rule == ScaleRule::amax_up  ? Round::up
                                            : Round::down;
    emax_ = _mm256_set1_pd(p.fe.max);
    t_ = _mm256_set1_pd(p.t);
    g_ = _mm_set1_ps(p.g_over_emax);
    tf_ = _mm_set1_ps(p.t);
    fmax_ = _mm256_set1_pd(f.max);
    emin_ = _mm256_set1_epi64x(f.emin);
    max_mag_ = _mm256_set1_epi64x(f.max_mag);
    cnt_M_ = _mm_cvtsi32_si128(f.M);
  }
  bool ok() const { return ok_; }
  bool pow2_fmt() const { return pow2_fmt_; }  // a power-of-two format without zero (E8M0 style)

  // Scale codes (int64 lanes, before the zero-scale guard) and (kZ)
  // decoded scales z of four finite block maxima b4; `above`: the lanes
  // whose unrounded scale exceeded Fs.max.
  template <bool kZ = true>
  void run(__m128 b4, __m256i& code_out, __m256d& z, int& above) const {
    const Format& f = f_;
    const __m256d two52 = _mm256_set1_pd(4503599627370496.0);
    const __m256i two52_bits = _mm256_castpd_si256(two52);
    const __m256i one_i = _mm256_set1_epi64x(1);
    const __m256i zero_i = _mm256_setzero_si256();
    const __m256i e1023 = _mm256_set1_epi64x(1023);
    const __m256i exp_mask = _mm256_set1_epi64x(0x7ff);
    // y: the unrounded scale, rounded to odd (exact in fp32 arithmetic)
    __m256d y;
    if (mx_) {
      // 2^(floor/ceil/even log2(b t) - floor(log2 Fe.max)); b t is exact (fp32: fl(b G))
      const __m256d bt = exact_ ? _mm256_mul_pd(_mm256_cvtps_pd(b4), t_) : _mm256_cvtps_pd(_mm_mul_ps(b4, tf_));
      __m256i bits = _mm256_castpd_si256(bt);
      if (p_.rule == ScaleRule::mx_ceil) {
        // any mantissa bit set: the next power of two
        const __m256i mant = _mm256_and_si256(bits, _mm256_set1_epi64x((int64_t{1} << 52) - 1));
        const __m256i up = _mm256_andnot_si256(_mm256_cmpeq_epi64(mant, zero_i), _mm256_set1_epi64x(int64_t{1} << 52));
        bits = _mm256_add_epi64(bits, up);
      } else if (p_.rule == ScaleRule::mx_even) {
        // round to M_e + 1 significant bits (rne) on the bit pattern; a carry bumps the exponent
        const int drop = 52 - p_.fe.M;
        const __m256i lsb = _mm256_and_si256(_mm256_srli_epi64(bits, drop), one_i);
        bits = _mm256_add_epi64(bits, _mm256_add_epi64(_mm256_set1_epi64x((int64_t{1} << (drop - 1)) - 1), lsb));
      }
      const __m256i e = _mm256_sub_epi64(_mm256_and_si256(_mm256_srli_epi64(bits, 52), exp_mask), e1023);
      const __m256i k = _mm256_sub_epi64(e, _mm256_set1_epi64x(p_.fe.max_exp));
      y = pow2_vec(k);
      // b = 0: no power of two; the scale is Fs's encoding of 0
      y = _mm256_and_pd(y, _mm256_cmp_pd(bt, _mm256_setzero_pd(), _CMP_NEQ_UQ));
    } else if (exact_) {
      const __m256d num = _mm256_mul_pd(_mm256_cvtps_pd(b4), t_);
      const __m256d q = _mm256_div_pd(num, emax_);
      const __m256d rem = _mm256_fnmadd_pd(q, emax_, num);
      __m256i bq = _mm256_castpd_si256(q);
      bq = _mm256_add_epi64(bq, _mm256_castpd_si256(_mm256_cmp_pd(rem, _mm256_setzero_pd(), _CMP_LT_OQ)));
      bq = _mm256_or_si256(bq, _mm256_and_si256(_mm256_castpd_si256(_mm256_cmp_pd(rem, _mm256_setzero_pd(), _CMP_NEQ_UQ)), one_i));
      y = _mm256_castsi256_pd(bq);
    } else {
      y = _mm256_cvtps_pd(_mm_mul_ps(b4, g_));
    }
    // Round y to Fs: W = floor(2 y / ulp), k = W >> 1, F = W & 1.
    const __m256i e = _mm256_sub_epi64(_mm256_and_si256(_mm256_srli_epi64(_mm256_castpd_si256(y), 52), exp_mask), e1023);
    const __m256i below = _mm256_cmpgt_epi64(emin_, e);  // below 2^emin (or zero)
    const __m256i ee = _mm256_blendv_epi8(e, emin_, below);
    const __m256d Ws = _mm256_mul_pd(y, pow2_vec(_mm256_sub_epi64(_mm256_set1_epi64x(1 + f.M), ee)));
    const __m256d Wf = _mm256_round_pd(Ws, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    const __m256i sticky = _mm256_castpd_si256(_mm256_cmp_pd(_mm256_sub_pd(Ws, Wf), _mm256_setzero_pd(), _CMP_NEQ_UQ));
    const __m256i W = _mm256_sub_epi64(_mm256_castpd_si256(_mm256_add_pd(Wf, two52)), two52_bits);
    const __m256i k = _mm256_srli_epi64(W, 1);
    const __m256i F = _mm256_cmpeq_epi64(_mm256_and_si256(W, one_i), one_i);
    __m256i away;
    if (mode_ == Round::rne)
      away = _mm256_and_si256(F, _mm256_or_si256(sticky, _mm256_cmpeq_epi64(_mm256_and_si256(k, one_i), one_i)));
    else if (mode_ == Round::up)
      away = _mm256_or_si256(F, sticky);
    else
      away = zero_i;
    const __m256i kk = _mm256_sub_epi64(k, away);
    __m256i code = _mm256_add_epi64(_mm256_sll_epi64(_mm256_sub_epi64(ee, emin_), cnt_M_), kk);
    if (pow2_fmt_) {
      // codes count binades from 2^emin; below it is the smallest value, code 0
      code = _mm256_sub_epi64(code, one_i);
      code = _mm256_andnot_si256(below, code);
    }
    const __m256i over = _mm256_cmpgt_epi64(code, max_mag_);
    code = _mm256_blendv_epi8(code, max_mag_, over);
    if (!kZ) {
      z = _mm256_setzero_pd();
    } else if (pow2_fmt_) {
      z = pow2_vec(_mm256_add_epi64(code, emin_));
    } else {
      const __m256d kkd = _mm256_sub_pd(_mm256_castsi256_pd(_mm256_or_si256(kk, two52_bits)), two52);
      z = _mm256_mul_pd(kkd, pow2_vec(_mm256_sub_epi64(ee, _mm256_set1_epi64x(f.M))));
      z = _mm256_blendv_pd(z, fmax_, _mm256_castsi256_pd(over));
    }
    above = _mm256_movemask_pd(_mm256_cmp_pd(y, fmax_, _CMP_GT_OQ));
    code_out = code;
  }

 private:
  const QuantPlan& p_;
  const Format& f_;
  bool ok_ = false, pow2_fmt_ = false, mx_ = false, exact_ = false;
  Round mode_ = Round::rne;
  __m256d emax_, t_, fmax_;
  __m128 g_, tf_;
  __m256i emin_, max_mag_;
  __m128i cnt_M_;
};

inline __m128 load4(const uint32_t* b) {
  return _mm_castsi128_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b)));
}

inline bool any_non_finite(__m128 b4) { return _mm_movemask_ps(_mm_cmp_ps(b4, _mm_set1_ps(INFINITY), _CMP_NLT_UQ)) != 0; }

}  // namespace

bool block_scales_vec(const QuantPlan& p, const uint32_t* bmax_bits, int64_t n, BlockScale* out) {
  const ScaleVec sv(p);
  if (!sv.ok()) return false;
  int64_t j = 0;
  for (; j + 4 <= n; j += 4) {
    const __m128 b4 = load4(bmax_bits + j);
    if (any_non_finite(b4)) {  // Inf or NaN: scalar
      for (int l = 0; l < 4; ++l) out[j + l] = block_scale(p, float_of(bmax_bits[j + l]));
      continue;
    }
    __m256i code;
    __m256d z;
    int above;
    sv.run(b4, code, z, above);
    alignas(32) int64_t cc[4];
    alignas(32) double zz[4];
    _mm256_store_si256(reinterpret_cast<__m256i*>(cc), code);
    _mm256_store_pd(zz, z);
    for (int l = 0; l < 4; ++l) {
      BlockScale& o = out[j + l];
      o.code = static_cast<uint32_t>(cc[l]);
      o.s = zz[l];
      o.saturated = (above >> l) & 1;
      o.underflow = zz[l] == 0.0 && bmax_bits[j + l] != 0u;
      o.zero = false;
      if (zz[l] == 0.0) {
        if (p.zero_scale == ZeroScale::one) {
          o.code = p.one_code;
          o.s = p.one_value;
        } else {
          o.zero = true;
        }
      }
    }
  }
  for (; j < n; ++j) out[j] = block_scale(p, float_of(bmax_bits[j]));
  return true;
}

bool block_scale_codes(const QuantPlan& p, const ScaleThr* thr, const uint32_t* bmax_bits, int64_t n, uint8_t* codes,
                       ScaleCodeOut& out) {
  const ScaleVec sv(p);
  if (!sv.ok() || p.fs.code_bytes() != 1) return false;
  const __m256i one_code = _mm256_set1_epi64x(p.one_code);
  const bool guard_one = p.zero_scale == ZeroScale::one;
  const bool pow2 = sv.pow2_fmt();
  // scale codes 1 .. P-1 are the subnormal ones (none without subnormals)
  const uint32_t sub_hi = p.fs.subnormals ? (1u << p.fs.M) - 1u : 0u;
  uint64_t sat = 0, uf = 0, sub = 0, fast = 0;
  uint32_t cmin = out.code_min, cmax = out.code_max, bmax = out.max_bits;
  auto note_code = [&](uint32_t c) {
    sub += c - 1u < sub_hi;
    cmin = std::min(cmin, c);
    cmax = std::max(cmax, c);
  };
  // the codes, counts and low bytes of four blocks
  auto finish = [&](int64_t j, __m128 b4, __m256i code, int above) __attribute__((always_inline)) {
    // a zero scale is code 0 (formats with zero; power-of-two formats have none)
    const __m256i zero_s = pow2 ? _mm256_setzero_si256() : _mm256_cmpeq_epi64(code, _mm256_setzero_si256());
    if (guard_one) code = _mm256_blendv_epi8(code, one_code, zero_s);
    const int zm = _mm256_movemask_pd(_mm256_castsi256_pd(zero_s));
    const int nzb = _mm_movemask_ps(_mm_castsi128_ps(
        _mm_xor_si128(_mm_cmpeq_epi32(_mm_castps_si128(b4), _mm_setzero_si128()), _mm_set1_epi32(-1))));
    sat += static_cast<uint64_t>(__builtin_popcount(above));
    uf += static_cast<uint64_t>(__builtin_popcount(zm & nzb));
    // the low byte of each 64-bit lane
    const __m256i packed = _mm256_shuffle_epi8(code, _mm256_setr_epi8(0, 8, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                                                      -1, -1, -1, 0, 8, -1, -1, -1, -1, -1, -1, -1, -1,
                                                                      -1, -1, -1, -1, -1, -1));
    const uint32_t lo = static_cast<uint32_t>(_mm_cvtsi128_si32(_mm256_castsi256_si128(packed)));
    const uint32_t hi = static_cast<uint32_t>(_mm_cvtsi128_si32(_mm256_extracti128_si256(packed, 1)));
    const uint32_t four = (lo & 0xffffu) | (hi << 16);
    std::memcpy(codes + j, &four, 4);
    for (int l = 0; l < 4; ++l) note_code(codes[j + l]);
  };
  // The threshold form (ScaleThr), eight blocks per step: in range, the
  // codes are normal and unsaturated, so they add nothing to the counts.
  const bool use_thr = thr && thr->ok;
  const __m256i t0 = _mm256_set1_epi32(use_thr ? static_cast<int>(thr->t0) : 0);
  const __m256i lim = _mm256_set1_epi32(use_thr ? static_cast<int>(thr->span - 1) : 0);
  const __m256i mant = _mm256_set1_epi32(0x7fffff);
  const __m256i c_lo = _mm256_set1_epi32(use_thr ? static_cast<int>(thr->c_lo) : 0);
  const __m128i m_shift = _mm_cvtsi32_si128(use_thr ? static_cast<int>(thr->m) : 0);
  __m256i d1[7];
  for (int k = 0; k < 7; ++k) d1[k] = _mm256_set1_epi32(use_thr ? thr->d1[k] : 0);
  __m256i vmax = _mm256_setzero_si256(), vcmin = _mm256_set1_epi32(0xff), vcmax = _mm256_setzero_si256();
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bmax_bits + j));
    vmax = _mm256_max_epu32(vmax, a);
    if (use_thr) {
      const __m256i d = _mm256_sub_epi32(a, t0);
      if (_mm256_movemask_epi8(_mm256_cmpeq_epi32(_mm256_max_epu32(d, lim), lim)) == -1) {
        const __m256i r = _mm256_and_si256(d, mant);
        __m256i code = _mm256_add_epi32(c_lo, _mm256_sll_epi32(_mm256_srli_epi32(d, 23), m_shift));
        for (int k = 0; k < 7; ++k) code = _mm256_sub_epi32(code, _mm256_cmpgt_epi32(r, d1[k]));
        vcmin = _mm256_min_epu32(vcmin, code);
        vcmax = _mm256_max_epu32(vcmax, code);
        const __m128i p16 = _mm_packus_epi32(_mm256_castsi256_si128(code), _mm256_extracti128_si256(code, 1));
        _mm_storel_epi64(reinterpret_cast<__m128i*>(codes + j), _mm_packus_epi16(p16, p16));
        fast += 8;
        continue;
      }
    }
    // eight blocks by arithmetic: two independent dependency chains (the
    // scale computation is a long chain; one alone leaves the core waiting)
    const __m128 b4 = load4(bmax_bits + j), c4 = load4(bmax_bits + j + 4);
    if (any_non_finite(b4) || any_non_finite(c4)) return false;  // (max_ps would drop a NaN in b4)
    __m256i code0, code1;
    __m256d z;
    int above0, above1;
    sv.run<false>(b4, code0, z, above0);
    sv.run<false>(c4, code1, z, above1);
    finish(j, b4, code0, above0);
    finish(j + 4, c4, code1, above1);
  }
  for (; j + 4 <= n; j += 4) {
    const __m128 b4 = load4(bmax_bits + j);
    if (any_non_finite(b4)) return false;
    for (int l = 0; l < 4; ++l) bmax = std::max(bmax, bmax_bits[j + l]);
    __m256i code;
    __m256d z;
    int above;
    sv.run<false>(b4, code, z, above);
    finish(j, b4, code, above);
  }
  for (; j < n; ++j) {
    const float b = float_of(bmax_bits[j]);
    if (!(b < INFINITY)) return false;
    bmax = std::max(bmax, bmax_bits[j]);
    const BlockScale bs = block_scale(p, b);
    codes[j] = static_cast<uint8_t>(bs.code);
    note_code(codes[j]);
    sat += bs.saturated;
    uf += bs.underflow;
  }
  auto hreduce = [](__m256i v, bool take_max) {
    alignas(32) uint32_t l[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(l), v);
    uint32_t r = l[0];
    for (int k = 1; k < 8; ++k) r = take_max ? std::max(r, l[k]) : std::min(r, l[k]);
    return r;
  };
  out.max_bits = std::max(bmax, hreduce(vmax, true));
  out.code_min = std::min(cmin, hreduce(vcmin, false));
  out.code_max = std::max(cmax, hreduce(vcmax, true));
  out.saturated += sat;
  out.underflow += uf;
  out.subnormal += sub;
  out.by_threshold += fast;
  return true;
}

namespace {

inline __m256i abs8(const float* p) {
  return _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)), _mm256_set1_epi32(0x7fffffff));
}

// max |x| bits of the bc (a multiple of 8) elements at p, lane-wise.
inline __m256i lane_max(const float* p, int64_t bc) {
  __m256i m = abs8(p);
  for (int64_t c = 8; c < bc; c += 8) m = _mm256_max_epu32(m, abs8(p + c));
  return m;
}

// The lane maxima of eight blocks reduced to one vector of their eight
// maxima, in block order: a transpose in three steps, max instead of move.
inline __m256i reduce8(const __m256i m[8]) {
  auto pair32 = [](__m256i a, __m256i b) {  // per half: [a02 b02 a13 b13]
    return _mm256_max_epu32(_mm256_unpacklo_epi32(a, b), _mm256_unpackhi_epi32(a, b));
  };
  auto pair64 = [](__m256i ab, __m256i cd) {  // per half: [a b c d]
    return _mm256_max_epu32(_mm256_unpacklo_epi64(ab, cd), _mm256_unpackhi_epi64(ab, cd));
  };
  const __m256i abcd = pair64(pair32(m[0], m[1]), pair32(m[2], m[3]));
  const __m256i efgh = pair64(pair32(m[4], m[5]), pair32(m[6], m[7]));
  return _mm256_max_epu32(_mm256_permute2x128_si256(abcd, efgh, 0x20), _mm256_permute2x128_si256(abcd, efgh, 0x31));
}

}  // namespace

namespace {

// acc[j] = (kAssign ? v : max(acc[j], v)) for block j's max |x| bits v
template <bool kAssign>
void row_block_max_impl(const float* row, int64_t cols, int64_t bc, uint32_t* acc) {
  auto put = [acc](int64_t j, uint32_t v) { acc[j] = kAssign || v > acc[j] ? v : acc[j]; };
  const int64_t gc = (cols + bc - 1) / bc;
  if (bc % 8 != 0) {
    for (int64_t j = 0; j < gc; ++j) {
      const int64_t c0 = j * bc;
      put(j, abs_max_bits(row + c0, std::min(cols, c0 + bc) - c0));
    }
    return;
  }
  const int64_t full = cols / bc;
  int64_t j = 0;
  // eight blocks per step, one horizontal reduction for all eight
  for (; j + 8 <= full; j += 8) {
    const float* p = row + j * bc;
    __m256i m[8];
    for (int k = 0; k < 8; ++k) m[k] = lane_max(p + k * bc, bc);
    __m256i* a = reinterpret_cast<__m256i*>(acc + j);
    _mm256_storeu_si256(a, kAssign ? reduce8(m) : _mm256_max_epu32(_mm256_loadu_si256(a), reduce8(m)));
  }
  for (; j < full; ++j) {
    const __m256i m = lane_max(row + j * bc, bc);
    __m128i h = _mm_max_epu32(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1));
    h = _mm_max_epu32(h, _mm_shuffle_epi32(h, 0x4e));
    h = _mm_max_epu32(h, _mm_shuffle_epi32(h, 0xb1));
    put(j, static_cast<uint32_t>(_mm_cvtsi128_si32(h)));
  }
  if (full < gc) {
    put(full, abs_max_bits(row + full * bc, cols - full * bc));
  }
}

}  // namespace

void band_block_max_bits(const float* x, int64_t rows, int64_t cols, int64_t bc, uint32_t* out) {
  if (rows == 1 || cols % 8 != 0) {
    row_block_max_impl<true>(x, cols, bc, out);
    for (int64_t r = 1; r < rows; ++r) row_block_max_impl<false>(x + r * cols, cols, bc, out);
    return;
  }
  // B x B and B x 1 blocks: |x| maxima down the columns first (vertical, no shuffles),
  // two rows per pass over the column maxima, then one row reduction.
  thread_local std::vector<uint32_t> colmax;
  colmax.resize(static_cast<size_t>(cols));
  uint32_t* cm = colmax.data();
  for (int64_t c = 0; c < cols; c += 8)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(cm + c), _mm256_max_epu32(abs8(x + c), abs8(x + cols + c)));
  int64_t r = 2;
  for (; r + 2 <= rows; r += 2) {
    const float* a = x + r * cols;
    const float* b = a + cols;
    for (int64_t c = 0; c < cols; c += 8) {
      __m256i* q = reinterpret_cast<__m256i*>(cm + c);
      const __m256i m = _mm256_max_epu32(abs8(a + c), abs8(b + c));
      _mm256_storeu_si256(q, _mm256_max_epu32(_mm256_loadu_si256(q), m));
    }
  }
  for (; r < rows; ++r) {
    const float* a = x + r * cols;
    for (int64_t c = 0; c < cols; c += 8) {
      __m256i* q = reinterpret_cast<__m256i*>(cm + c);
      _mm256_storeu_si256(q, _mm256_max_epu32(_mm256_loadu_si256(q), abs8(a + c)));
    }
  }
  if (bc == 1) std::memcpy(out, cm, sizeof(uint32_t) * static_cast<size_t>(cols));  // Bx1: one block per column
  else row_block_max_impl<true>(reinterpret_cast<const float*>(cm), cols, bc, out);
}

uint32_t abs_max_bits(const float* x, int64_t n) {
  // |x| as int32 bits orders like the magnitudes, with NaN above Inf.
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff);
  __m256i m = _mm256_setzero_si256();
  int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    m = _mm256_max_epu32(m, _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + j)), abs_mask));
  alignas(32) uint32_t l[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(l), m);
  uint32_t r = 0;
  for (int k = 0; k < 8; ++k) r = l[k] > r ? l[k] : r;
  for (; j < n; ++j) {
    const uint32_t b = bits_of(x[j]) & 0x7fffffffu;
    r = b > r ? b : r;
  }
  return r;
}

#else

void band_block_max_bits(const float* x, int64_t rows, int64_t cols, int64_t bc, uint32_t* out) {
  std::fill(out, out + (cols + bc - 1) / bc, 0u);
  for (int64_t i = 0; i < rows * cols; ++i) {
    const uint32_t b = bits_of(x[i]) & 0x7fffffffu;
    uint32_t& m = out[(i % cols) / bc];
    m = b > m ? b : m;
  }
}

bool block_scales_vec(const QuantPlan&, const uint32_t*, int64_t, BlockScale*) { return false; }
bool block_scale_codes(const QuantPlan&, const ScaleThr*, const uint32_t*, int64_t, uint8_t*, ScaleCodeOut&) {
  return false;
}

void vec4_row(const QuantPlan& p, const Row4& row, uint8_t* codes, float* values, RandomBits& rng, SpanCounts& cnt) {
  for (int64_t b = 0; b < row.nblocks; ++b) {
    if (!row.use[b]) continue;
    const int64_t n = std::min(row.bc, row.cols - b * row.bc);
    for (int64_t j = 0; j < n; ++j)
      scalar_element(p, row.consts[b], row.x + b * row.bc, row.i0 + b * row.bc + j, j, codes, values, rng, cnt);
  }
}

void vec4_row_thr(const QuantPlan& p, const Row4T& row, uint8_t* codes, float* values, SpanCounts& cnt) {
  RandomBits rng(p.seed, p.stream, 8);
  for (int64_t b = 0; b < row.nblocks; ++b) {
    if (!row.use[row.code[b]]) continue;
    const int64_t n = std::min(row.bc, row.cols - b * row.bc);
    for (int64_t j = 0; j < n; ++j)
      scalar_element(p, row.consts[row.code[b]], row.x + b * row.bc, row.i0 + b * row.bc + j, j, codes, values, rng,
                     cnt);
  }
}

void vec4_band_thr_lanes(const QuantPlan& p, const Row4T& band, uint8_t* codes, float* values, SpanCounts& cnt) {
  for (int64_t r = 0; r < band.rows; ++r) {
    Row4T row = band;
    row.x = band.x + r * band.cols;
    row.i0 = band.i0 + r * band.cols;
    row.rows = 1;
    vec4_row_thr(p, row, codes, values, cnt);
  }
}

uint32_t abs_max_bits(const float* x, int64_t n) {
  uint32_t r = 0;
  for (int64_t j = 0; j < n; ++j) {
    const uint32_t b = bits_of(x[j]) & 0x7fffffffu;
    r = b > r ? b : r;
  }
  return r;
}

void vec_span(const QuantPlan& p, const BlockConsts& c, const VecBlock&, const float* x, int64_t i0, int64_t n,
              uint8_t* codes, float* values, RandomBits& rng, SpanCounts& cnt) {
  for (int64_t j = 0; j < n; ++j) scalar_element(p, c, x, i0 + j, j, codes, values, rng, cnt);
}

#endif

// ---------------------------------------------------------------------------
// The double sums: four segment partials side by side
// ---------------------------------------------------------------------------

void segment_partials4(const float* const x[4], const float* const xh[4], int64_t n, SumPartial out[4]) {
#if defined(__AVX__)
  // Each step adds column c of the four segments, lane k holding segment k,
  // with segment_partial's operations lane by lane: exact conversions, one
  // rounding per subtraction, product and sum. The one fma, for x*x, rounds
  // as the product and the sum do: x*x of a float has at most 48 significant
  // bits and lies within the double range, so it is exact.
  __m256d sq = _mm256_setzero_pd(), sq_err = sq, err = sq, abs = sq;
  const __m256d no_sign = _mm256_castsi256_pd(_mm256_set1_epi64x(0x7fffffffffffffffll));
  auto step = [&](__m128 xc, __m128 hc) __attribute__((always_inline)) {
    const __m256d xd = _mm256_cvtps_pd(xc), e = _mm256_sub_pd(_mm256_cvtps_pd(hc), xd);
#if defined(__FMA__)
    sq = _mm256_fmadd_pd(xd, xd, sq);
#else
    sq = _mm256_add_pd(sq, _mm256_mul_pd(xd, xd));
#endif
    sq_err = _mm256_add_pd(sq_err, _mm256_mul_pd(e, e));
    err = _mm256_add_pd(err, e);
    abs = _mm256_add_pd(abs, _mm256_and_pd(xd, no_sign));
  };
  // Eight columns of the four segments, transposed within each 128-bit half:
  // half h of o[j] holds column c + 4h + j of segments 0..3.
  auto columns8 = [](const float* const p[4], int64_t c, __m256 o[4]) __attribute__((always_inline)) {
    const __m256 r0 = _mm256_loadu_ps(p[0] + c), r1 = _mm256_loadu_ps(p[1] + c), r2 = _mm256_loadu_ps(p[2] + c),
                 r3 = _mm256_loadu_ps(p[3] + c);
    const __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1), t2 = _mm256_unpacklo_ps(r2, r3),
                 t3 = _mm256_unpackhi_ps(r2, r3);
    o[0] = _mm256_shuffle_ps(t0, t2, 0x44);
    o[1] = _mm256_shuffle_ps(t0, t2, 0xEE);
    o[2] = _mm256_shuffle_ps(t1, t3, 0x44);
    o[3] = _mm256_shuffle_ps(t1, t3, 0xEE);
  };
  int64_t c = 0;
  for (; c + 8 <= n; c += 8) {
    __m256 xc[4], hc[4];
    columns8(x, c, xc);
    columns8(xh, c, hc);
    for (int j = 0; j < 4; ++j) step(_mm256_castps256_ps128(xc[j]), _mm256_castps256_ps128(hc[j]));
    for (int j = 0; j < 4; ++j) step(_mm256_extractf128_ps(xc[j], 1), _mm256_extractf128_ps(hc[j], 1));
  }
  for (; c < n; ++c)
    step(_mm_setr_ps(x[0][c], x[1][c], x[2][c], x[3][c]), _mm_setr_ps(xh[0][c], xh[1][c], xh[2][c], xh[3][c]));
  alignas(32) double v[4][4];
  _mm256_store_pd(v[0], sq);
  _mm256_store_pd(v[1], sq_err);
  _mm256_store_pd(v[2], err);
  _mm256_store_pd(v[3], abs);
  for (int k = 0; k < 4; ++k) {
    out[k] = SumPartial{v[0][k], v[1][k], v[2][k], v[3][k], false};
    out[k].xh_inf = segment_has_inf(out[k], xh[k], n);
  }
#else
  for (int k = 0; k < 4; ++k) out[k] = segment_partial(x[k], xh[k], n);
#endif
}

}  // namespace exmy::detail

// Block scales and scale codes, four (or eight) blocks at a time (AVX2),
// identical to block_scale() of formats/quant_core.hpp.
#include <algorithm>
#include <cmath>

#include "formats/fast/loops.hpp"
#include "formats/fast/target.hpp"

#if defined(__x86_64__)
EXMY_TARGET_AVX2
#include "formats/fast/avx2_lanes.hpp"

namespace exmy::detail::avx2 {

namespace {

// The vectorised block-scale computation of block_scale(), four blocks at a
// time, for the amax-* rules and scale formats with zero and subnormals, and
// the MX rules with power-of-two formats.
class ScaleVec {
 public:
  explicit ScaleVec(const QuantPlan& p) : p_(p), f_(p.fs) {
    const Format& f = p.fs;
    pow2_fmt_ = !f.subnormals && f.M == 0;
    ok_ = p.has_scale && ((f.subnormals && f.has_zero) || pow2_fmt_) && f.M <= 40 && f.max >= f.min_normal &&
          p.rule != ScaleRule::amax_sr;  // dithered scales need each block's random bits: block_scale()
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

bool scale_codes_cover(const QuantPlan& p) { return ScaleVec(p).ok() && p.fs.code_bytes() == 1; }

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

}  // namespace exmy::detail::avx2
EXMY_TARGET_END
#endif

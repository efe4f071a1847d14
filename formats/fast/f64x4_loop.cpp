// The 4-double multiply-and-convert loop (AVX2 + FMA): every element format
// the fast path covers, in either arithmetic, with the uncertainty rule of
// loops.hpp. One block span at a time.
#include <cmath>
#include <cstring>

#include "formats/fast/loops.hpp"
#include "formats/fast/target.hpp"
#include "formats/fast/tails.hpp"

#if defined(__x86_64__)
EXMY_TARGET_AVX2
#include "formats/fast/avx2_lanes.hpp"

namespace exmy::detail::avx2 {
namespace {

template <Round MODE, Arith ARITH>
void f64x4_impl(const QuantPlan& p, const BlockConsts& c, const F64Block& vb, const float* x, int64_t i0, int64_t n,
               uint8_t* codes, float* values, RandomBits& rng, SpanCounts& cnt) {
  const Format& f = p.fe;
  constexpr bool kSR = is_stochastic(MODE);
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
        if (um & (1 << l)) core_element(p, c, x, i0 + j + l, j + l, codes, values, rng, cnt);
    }
  }
  for (; j < n; ++j) core_element(p, c, x, i0 + j, j, codes, values, rng, cnt);
}

template <Arith A>
void f64x4_by_mode(const QuantPlan& p, const BlockConsts& c, const F64Block& vb, const float* x, int64_t i0, int64_t n,
                   uint8_t* codes, float* values, RandomBits& rng, SpanCounts& cnt) {
  with_round(p.round, [&](auto r) { f64x4_impl<decltype(r)::value, A>(p, c, vb, x, i0, n, codes, values, rng, cnt); });
}

}  // namespace

void f64x4_span(const QuantPlan& p, const BlockConsts& c, const F64Block& vb, const float* x, int64_t i0, int64_t n,
              uint8_t* codes, float* values, RandomBits& rng, SpanCounts& cnt) {
  if (p.arith == Arith::exact) f64x4_by_mode<Arith::exact>(p, c, vb, x, i0, n, codes, values, rng, cnt);
  else f64x4_by_mode<Arith::fp32>(p, c, vb, x, i0, n, codes, values, rng, cnt);
}

}  // namespace exmy::detail::avx2
EXMY_TARGET_END
#endif

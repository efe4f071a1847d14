// The 16-point Hadamard transform of segments along rows
// (formats/hadamard_segment.hpp, rht_transform_segment with n = 16) in 16
// lanes (AVX-512 F/DQ): a segment's 16 signed inputs as two vectors of 8
// doubles, the four butterfly stages by lane swaps and masked blends, and
// the rounding to bf16 of to_bf16 on 16 lanes. The butterflies are exact
// where the scalar path's are (the inputs span at most 48 binades), so
// their order does not matter and the bits are rht_transform_segment's; a
// segment outside that path (a non-finite input, a wider span, an exact
// zero output, whose sign the scalar path settles from the terms) goes to
// rht_transform_segment itself.
#include "formats/fast/loops.hpp"
#include "formats/fast/target.hpp"
#include "formats/hadamard_segment.hpp"

#if defined(__x86_64__)
EXMY_TARGET_AVX512
#include <immintrin.h>

namespace exmy::detail::avx512 {
namespace {

// The transform of the 16 floats at x into out (x == out allowed); false,
// writing nothing, for a segment the fast path does not take.
__attribute__((always_inline)) inline bool rht16_fast(const float* x, float* out, __m512i sign) {
  const __m512i t = _mm512_xor_si512(_mm512_loadu_si512(x), sign);
  const __m512i e = _mm512_and_si512(_mm512_srli_epi32(t, 23), _mm512_set1_epi32(0xff));
  if (_mm512_cmpeq_epi32_mask(e, _mm512_set1_epi32(0xff))) return false;  // Inf or NaN
  const __mmask16 nz = _mm512_test_epi32_mask(t, _mm512_set1_epi32(0x7fffffff));
  if (nz == 0) return false;
  // The span of the scalar path's test, hi - lo <= 48 for n = 16, from the
  // biased exponents: hi <= e_max - 127 (a subnormal's, -127, is above its
  // true one: the test can only be stricter), lo = max(e, 1) - 150.
  const int emax = _mm512_mask_reduce_max_epi32(nz, e);
  const int emin = _mm512_mask_reduce_min_epi32(nz, _mm512_max_epi32(e, _mm512_set1_epi32(1)));
  if (emax - emin > 25) return false;
  __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(_mm512_castsi512_ps(t)));
  __m512d hi = _mm512_cvtps_pd(_mm256_castsi256_ps(_mm512_extracti64x4_epi64(t, 1)));
  // h = 1, 2, 4 inside each vector: lane j with partner j ^ h takes a + b
  // where j < j ^ h, else a - b (a the lower lane's, b the upper's).
  const auto stage = [](__m512d v, __m512d sw, __mmask8 upper) {
    return _mm512_mask_blend_pd(upper, _mm512_add_pd(v, sw), _mm512_sub_pd(sw, v));
  };
  lo = stage(lo, _mm512_permute_pd(lo, 0x55), 0xAA);
  hi = stage(hi, _mm512_permute_pd(hi, 0x55), 0xAA);
  lo = stage(lo, _mm512_permutex_pd(lo, 0x4E), 0xCC);
  hi = stage(hi, _mm512_permutex_pd(hi, 0x4E), 0xCC);
  lo = stage(lo, _mm512_shuffle_f64x2(lo, lo, 0x4E), 0xF0);
  hi = stage(hi, _mm512_shuffle_f64x2(hi, hi, 0x4E), 0xF0);
  const __m512d y0 = _mm512_add_pd(lo, hi), y1 = _mm512_sub_pd(lo, hi);  // h = 8
  const __m512d zero = _mm512_setzero_pd();
  if (_mm512_cmpeq_pd_mask(y0, zero) | _mm512_cmpeq_pd_mask(y1, zero)) return false;
  // to_bf16 for n = 16: v = y / 4 (exact), rounded to odd at float precision,
  // then to nearest even at bf16's.
  const __m512d quarter = _mm512_set1_pd(0.25);
  const __m512d v0 = _mm512_mul_pd(y0, quarter), v1 = _mm512_mul_pd(y1, quarter);
  const __m256 f0 = _mm512_cvtpd_ps(v0), f1 = _mm512_cvtpd_ps(v1);
  const __m512d d0 = _mm512_cvtps_pd(f0), d1 = _mm512_cvtps_pd(f1);
  const __mmask16 inexact = static_cast<__mmask16>(_mm512_cmp_pd_mask(d0, v0, _CMP_NEQ_UQ) |
                                                   (_mm512_cmp_pd_mask(d1, v1, _CMP_NEQ_UQ) << 8));
  const __mmask16 away = static_cast<__mmask16>(
      _mm512_cmp_pd_mask(_mm512_abs_pd(d0), _mm512_abs_pd(v0), _CMP_GT_OQ) |
      (_mm512_cmp_pd_mask(_mm512_abs_pd(d1), _mm512_abs_pd(v1), _CMP_GT_OQ) << 8));
  const __m512i f = _mm512_castps_si512(_mm512_insertf32x8(_mm512_castps256_ps512(f0), f1, 1));
  const __m512i one = _mm512_set1_epi32(1);
  __m512i u = _mm512_mask_sub_epi32(f, inexact & away, f, one);
  u = _mm512_mask_or_epi32(u, inexact, u, one);
  const __mmask16 special =
      _mm512_cmpge_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
  __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff),
                                                   _mm512_and_si512(_mm512_srli_epi32(u, 16), one)));
  r = _mm512_and_si512(r, _mm512_set1_epi32(static_cast<int>(0xffff0000u)));
  r = _mm512_mask_mov_epi32(r, special, f);  // an infinite result stays as the conversion made it
  _mm512_storeu_si512(out, r);
  return true;
}

}  // namespace

void rht16_rows(float* x, int64_t nseg, const RhtParams& p) {
  // the signs s_i as sign-bit masks, lane i for input i
  alignas(64) uint32_t sgn[16];
  for (int i = 0; i < 16; ++i) sgn[i] = p.negated(i) ? 0x80000000u : 0u;
  const __m512i sign = _mm512_load_si512(sgn);
  for (int64_t s = 0; s < nseg; ++s) {
    float* seg = x + 16 * s;
    if (!rht16_fast(seg, seg, sign)) rht_transform_segment(seg, p);
  }
}

}  // namespace exmy::detail::avx512
EXMY_TARGET_END
#endif

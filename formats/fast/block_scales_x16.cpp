// block_scale_codes in 16 lanes (AVX-512): the threshold form (ScaleThr)
// sixteen blocks per step. A step with a block outside the thresholds'
// cover goes to the AVX2 form (vector arithmetic, or false for Inf/NaN), so
// every block gets the code of block_scale() either way.
#include <algorithm>

#include "formats/fast/loops.hpp"
#include "formats/fast/target.hpp"

#if defined(__x86_64__)
EXMY_TARGET_AVX512
#include <immintrin.h>

namespace exmy::detail::avx512 {

bool block_scale_codes(const QuantPlan& p, const ScaleThr* thr, const uint32_t* bmax_bits, int64_t n, uint8_t* codes,
                       ScaleCodeOut& out) {
  if (!thr || !thr->ok || !avx2::scale_codes_cover(p)) return avx2::block_scale_codes(p, thr, bmax_bits, n, codes, out);
  // In the thresholds' range a code is normal and unsaturated: it adds
  // nothing to the counts (as the AVX2 form's eight-block steps).
  const __m512i t0 = _mm512_set1_epi32(static_cast<int>(thr->t0));
  const __m512i lim = _mm512_set1_epi32(static_cast<int>(thr->span - 1));
  const __m512i mant = _mm512_set1_epi32(0x7fffff), one = _mm512_set1_epi32(1);
  const __m512i c_lo = _mm512_set1_epi32(static_cast<int>(thr->c_lo));
  const __m128i m_shift = _mm_cvtsi32_si128(static_cast<int>(thr->m));
  __m512i d1[7];
  for (int k = 0; k < 7; ++k) d1[k] = _mm512_set1_epi32(thr->d1[k]);
  __m512i vmax = _mm512_setzero_si512(), vcmin = _mm512_set1_epi32(0xff), vcmax = _mm512_setzero_si512();
  uint64_t fast = 0;
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) {
    const __m512i a = _mm512_loadu_si512(bmax_bits + j);
    const __m512i d = _mm512_sub_epi32(a, t0);
    if (_mm512_cmple_epu32_mask(d, lim) != 0xffff) {
      if (!avx2::block_scale_codes(p, thr, bmax_bits + j, 16, codes + j, out)) return false;
      continue;
    }
    vmax = _mm512_max_epu32(vmax, a);
    const __m512i r = _mm512_and_si512(d, mant);
    __m512i code = _mm512_add_epi32(c_lo, _mm512_sll_epi32(_mm512_srli_epi32(d, 23), m_shift));
    for (int k = 0; k < 7; ++k) code = _mm512_mask_add_epi32(code, _mm512_cmpgt_epi32_mask(r, d1[k]), code, one);
    vcmin = _mm512_min_epu32(vcmin, code);
    vcmax = _mm512_max_epu32(vcmax, code);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + j), _mm512_cvtepi32_epi8(code));
    fast += 16;
  }
  if (j < n && !avx2::block_scale_codes(p, thr, bmax_bits + j, n - j, codes + j, out)) return false;
  out.max_bits = std::max(out.max_bits, _mm512_reduce_max_epu32(vmax));
  out.code_min = std::min(out.code_min, _mm512_reduce_min_epu32(vcmin));
  out.code_max = std::max(out.code_max, _mm512_reduce_max_epu32(vcmax));
  out.by_threshold += fast;
  return true;
}

}  // namespace exmy::detail::avx512
EXMY_TARGET_END
#endif

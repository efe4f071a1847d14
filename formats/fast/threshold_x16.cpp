// The threshold loop (see ThrBlock) in 16 lanes (AVX-512 F/BW/DQ/VL), for
// blocks whose width is a multiple of 16: per block, the magnitude code is
// the count of thresholds |x| exceeds, x-hat its entry of the block's table.
// The same decisions as the 8-lane form, so the same bits.
#include <algorithm>
#include <vector>

#include "formats/fast/loops.hpp"
#include "formats/fast/target.hpp"
#include "formats/fast/tails.hpp"

#if defined(__x86_64__)
EXMY_TARGET_AVX512
// GCC 12's AVX-512 headers start some intrinsics from an undefined vector,
// which -Wmaybe-uninitialized reports when the file's flags lack AVX-512.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include "formats/fast/threshold_walk.hpp"

namespace exmy::detail::avx512 {
namespace {

template <bool kStream>
void threshold_row_impl(const QuantPlan& p, const ThrRow& row, uint8_t* codes, float* values, SpanCounts& cnt) {
  const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff);
  const __m512i sign_mask = _mm512_set1_epi32(static_cast<int>(0x80000000u));
  const __m512i zero_i = _mm512_setzero_si512(), one = _mm512_set1_epi32(1);
  const __m512i sub_lim = _mm512_set1_epi32(1 << p.fe.M);
  const unsigned sign_shift = 31u - static_cast<unsigned>(__builtin_ctz(p.fe.sign_bit));
  uint64_t n_sat = 0, n_sub = 0, n_nz = 0, n_uf = 0;
  walk_threshold_row(p, row, codes, values, cnt, [&](const ThrBlock& th, const float* x, int64_t i0, int64_t n) {
    __m512i t[7];
    for (int k = 0; k < 7; ++k) t[k] = _mm512_set1_epi32(th.t[k]);
    const __m512i tsat = _mm512_set1_epi32(th.sat);
    // codes are at most 7: the upper half (zeros) is never indexed
    const __m512 table = _mm512_zextps256_ps512(_mm256_loadu_ps(th.table));
    int64_t j = 0;
    for (; j + 16 <= n; j += 16) {
      const __m512i xi = _mm512_loadu_si512(x + j);
      const __m512i ax = _mm512_and_si512(xi, abs_mask);
      const __mmask16 m1 = _mm512_cmpgt_epi32_mask(ax, t[0]);
      __m512i code = _mm512_maskz_mov_epi32(m1, one);
      for (int k = 1; k < 7; ++k) code = _mm512_mask_add_epi32(code, _mm512_cmpgt_epi32_mask(ax, t[k]), code, one);
      const __m512i xs = _mm512_and_si512(xi, sign_mask);
      const __m512 xh = _mm512_or_ps(_mm512_permutexvar_ps(code, table), _mm512_castsi512_ps(xs));
      float* vo = values + i0 + j;
      if constexpr (kStream) {
        _mm_stream_ps(vo, _mm512_castps512_ps128(xh));
        _mm_stream_ps(vo + 4, _mm512_extractf32x4_ps(xh, 1));
        _mm_stream_ps(vo + 8, _mm512_extractf32x4_ps(xh, 2));
        _mm_stream_ps(vo + 12, _mm512_extractf32x4_ps(xh, 3));
      } else {
        _mm512_storeu_ps(vo, xh);
      }
      if (codes) {
        const __m128i c8 = _mm512_cvtepi32_epi8(_mm512_or_si512(code, _mm512_srli_epi32(xs, sign_shift)));
        uint8_t* co = codes + i0 + j;
        if constexpr (kStream) {
          _mm_stream_si64(reinterpret_cast<long long*>(co), _mm_cvtsi128_si64(c8));
          _mm_stream_si64(reinterpret_cast<long long*>(co + 8), _mm_extract_epi64(c8, 1));
        } else {
          _mm_storeu_si128(reinterpret_cast<__m128i*>(co), c8);
        }
      }
      if (row.stats) {
        const __mmask16 nz = _mm512_cmpgt_epi32_mask(ax, zero_i);
        const __mmask16 zh = _mm512_cmp_ps_mask(xh, _mm512_setzero_ps(), _CMP_EQ_OQ);
        n_nz += static_cast<uint64_t>(__builtin_popcount(nz));
        n_uf += static_cast<uint64_t>(__builtin_popcount(nz & zh));
        n_sub += static_cast<uint64_t>(__builtin_popcount(m1 & _mm512_cmpgt_epi32_mask(sub_lim, code)));
        n_sat += static_cast<uint64_t>(__builtin_popcount(_mm512_cmpgt_epi32_mask(ax, tsat)));
      }
    }
    return j;
  });
  if constexpr (kStream) _mm_sfence();
  cnt.saturated += n_sat;
  cnt.subnormal += n_sub;
  cnt.nonzero += n_nz;
  cnt.underflow += n_uf;
}

}  // namespace

void threshold_row(const QuantPlan& p, const ThrRow& row, uint8_t* codes, float* values, SpanCounts& cnt) {
  (row.stream ? threshold_row_impl<true> : threshold_row_impl<false>)(p, row, codes, values, cnt);
}

}  // namespace exmy::detail::avx512
EXMY_TARGET_END
#endif

// The double sums of docs/numerics.md §5: four segment partials side by side.
#include "formats/fast/loops.hpp"

#if defined(__AVX__)
#include <immintrin.h>
#endif

namespace exmy::detail {

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

int segment_lanes() { return simd_width() == Simd::avx512 ? 8 : 4; }

void segment_partials(const float* const* x, const float* const* xh, int64_t n, SumPartial* out) {
#if defined(__x86_64__)
  if (segment_lanes() == 8) return avx512::segment_partials8(x, xh, n, out);
#endif
  segment_partials4(x, xh, n, out);
}

}  // namespace exmy::detail

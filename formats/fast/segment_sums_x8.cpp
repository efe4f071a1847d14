// The double sums of docs/numerics.md §5 with AVX-512: eight segment
// partials side by side, one per lane of an 8-double vector (the 4-lane form
// is segment_sums.cpp). Lane k is exactly segment_partial(x[k], xh[k], n).
#include "formats/fast/loops.hpp"
#include "formats/fast/target.hpp"

#if defined(__x86_64__)
EXMY_TARGET_AVX512
#include <immintrin.h>

namespace exmy::detail::avx512 {
namespace {

// Columns c..c+7 of eight segments: o[j] holds column c + j of segments
// 0..7 (an 8x8 transpose of the rows p[k][c..c+8)).
inline void columns8(const float* const p[8], int64_t c, __m256 o[8]) {
  __m256 r[8], t[8], u[8];
  for (int k = 0; k < 8; ++k) r[k] = _mm256_loadu_ps(p[k] + c);
  for (int k = 0; k < 8; k += 2) {
    t[k] = _mm256_unpacklo_ps(r[k], r[k + 1]);
    t[k + 1] = _mm256_unpackhi_ps(r[k], r[k + 1]);
  }
  for (int k = 0; k < 8; k += 4) {
    u[k] = _mm256_shuffle_ps(t[k], t[k + 2], 0x44);
    u[k + 1] = _mm256_shuffle_ps(t[k], t[k + 2], 0xEE);
    u[k + 2] = _mm256_shuffle_ps(t[k + 1], t[k + 3], 0x44);
    u[k + 3] = _mm256_shuffle_ps(t[k + 1], t[k + 3], 0xEE);
  }
  // u[j] (j < 4) holds, per 128-bit half h, columns c + 4h + j of segments
  // 0..3; u[4 + j] the same of segments 4..7.
  for (int j = 0; j < 4; ++j) {
    o[j] = _mm256_permute2f128_ps(u[j], u[4 + j], 0x20);
    o[4 + j] = _mm256_permute2f128_ps(u[j], u[4 + j], 0x31);
  }
}

}  // namespace

void segment_partials8(const float* const x[8], const float* const xh[8], int64_t n, SumPartial out[8]) {
  // segment_partial's operations lane by lane: exact conversions, one
  // rounding per subtraction, product and sum. x*x is formed by a multiply
  // and added apart (exact either way: at most 48 significant bits), which
  // keeps the fused multiply-add's longer latency off the chain.
  __m512d sq = _mm512_setzero_pd(), sq_err = sq, err = sq, abs = sq;
  auto step = [&](__m256 xc, __m256 hc) __attribute__((always_inline)) {
    const __m512d xd = _mm512_cvtps_pd(xc), e = _mm512_sub_pd(_mm512_cvtps_pd(hc), xd);
    sq = _mm512_add_pd(sq, _mm512_mul_pd(xd, xd));
    sq_err = _mm512_add_pd(sq_err, _mm512_mul_pd(e, e));
    err = _mm512_add_pd(err, e);
    abs = _mm512_add_pd(abs, _mm512_abs_pd(xd));
  };
  int64_t c = 0;
  for (; c + 8 <= n; c += 8) {
    __m256 xc[8], hc[8];
    columns8(x, c, xc);
    columns8(xh, c, hc);
    for (int j = 0; j < 8; ++j) step(xc[j], hc[j]);
  }
  for (; c < n; ++c)
    step(_mm256_setr_ps(x[0][c], x[1][c], x[2][c], x[3][c], x[4][c], x[5][c], x[6][c], x[7][c]),
         _mm256_setr_ps(xh[0][c], xh[1][c], xh[2][c], xh[3][c], xh[4][c], xh[5][c], xh[6][c], xh[7][c]));
  alignas(64) double v[4][8];
  _mm512_store_pd(v[0], sq);
  _mm512_store_pd(v[1], sq_err);
  _mm512_store_pd(v[2], err);
  _mm512_store_pd(v[3], abs);
  for (int k = 0; k < 8; ++k) {
    out[k] = SumPartial{v[0][k], v[1][k], v[2][k], v[3][k], false};
    out[k].xh_inf = segment_has_inf(out[k], xh[k], n);
  }
}

}  // namespace exmy::detail::avx512

EXMY_TARGET_END
#endif

#include "sim/quant/kernels.hpp"

#include <algorithm>
#include <bit>
#include <cmath>

#if defined(__AVX__)
#include <immintrin.h>
#endif

#include "formats/quantize.hpp"
#include "sim/parallel.hpp"

namespace exmy::sim::quant {
namespace {

#if defined(__AVX__)
// 8x8 transpose: d[c * ld + r] = s[r * ls + c].
inline void transpose8(const float* s, int64_t ls, float* d, int64_t ld) {
  const __m256 r0 = _mm256_loadu_ps(s), r1 = _mm256_loadu_ps(s + ls), r2 = _mm256_loadu_ps(s + 2 * ls),
               r3 = _mm256_loadu_ps(s + 3 * ls), r4 = _mm256_loadu_ps(s + 4 * ls), r5 = _mm256_loadu_ps(s + 5 * ls),
               r6 = _mm256_loadu_ps(s + 6 * ls), r7 = _mm256_loadu_ps(s + 7 * ls);
  const __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1), t2 = _mm256_unpacklo_ps(r2, r3),
               t3 = _mm256_unpackhi_ps(r2, r3), t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5),
               t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
  const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE),
               u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE),
               u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE),
               u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
  _mm256_storeu_ps(d, _mm256_permute2f128_ps(u0, u4, 0x20));
  _mm256_storeu_ps(d + ld, _mm256_permute2f128_ps(u1, u5, 0x20));
  _mm256_storeu_ps(d + 2 * ld, _mm256_permute2f128_ps(u2, u6, 0x20));
  _mm256_storeu_ps(d + 3 * ld, _mm256_permute2f128_ps(u3, u7, 0x20));
  _mm256_storeu_ps(d + 4 * ld, _mm256_permute2f128_ps(u0, u4, 0x31));
  _mm256_storeu_ps(d + 5 * ld, _mm256_permute2f128_ps(u1, u5, 0x31));
  _mm256_storeu_ps(d + 6 * ld, _mm256_permute2f128_ps(u2, u6, 0x31));
  _mm256_storeu_ps(d + 7 * ld, _mm256_permute2f128_ps(u3, u7, 0x31));
}
#endif

}  // namespace

void transpose(float* dst, const float* src, int64_t rows, int64_t cols) {
  constexpr int64_t kB = 32;
  const int64_t rb = (rows + kB - 1) / kB;
#pragma omp parallel for schedule(static) if (rows * cols >= 4 * parallel_min_work())
  for (int64_t bi = 0; bi < rb; ++bi) {
    const int64_t r0 = bi * kB, r1 = std::min(rows, r0 + kB);
    for (int64_t c0 = 0; c0 < cols; c0 += kB) {
      const int64_t c1 = std::min(cols, c0 + kB);
#if defined(__AVX__)
      if (r1 - r0 == kB && c1 - c0 == kB) {
        for (int64_t r = r0; r < r1; r += 8)
          for (int64_t c = c0; c < c1; c += 8) transpose8(src + r * cols + c, cols, dst + c * rows + r, rows);
        continue;
      }
#endif
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c) dst[c * rows + r] = src[r * cols + c];
    }
  }
}

}  // namespace exmy::sim::quant

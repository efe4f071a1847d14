// Block maxima and max |x| as float32 bits (NaN bits above Inf).
#include <algorithm>
#include <cstring>
#include <vector>

#include "formats/fast/loops.hpp"
#include "formats/fast/target.hpp"

#if defined(__x86_64__)
EXMY_TARGET_AVX2
#include <immintrin.h>

namespace exmy::detail::avx2 {

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
inline __m256i pair32(__m256i a, __m256i b) {  // per half: [a02 b02 a13 b13]
  return _mm256_max_epu32(_mm256_unpacklo_epi32(a, b), _mm256_unpackhi_epi32(a, b));
}
inline __m256i pair64(__m256i ab, __m256i cd) {  // per half: [a b c d]
  return _mm256_max_epu32(_mm256_unpacklo_epi64(ab, cd), _mm256_unpackhi_epi64(ab, cd));
}
inline __m256i reduce8(const __m256i m[8]) {
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

// (The 8-lane form leaves the next band's prefetch to the element loop.)
bool band_block_max_bits(const float* x, int64_t rows, int64_t cols, int64_t bc, uint32_t* out, const float*) {
  if (rows == 1 || cols % 8 != 0) {
    row_block_max_impl<true>(x, cols, bc, out);
    for (int64_t r = 1; r < rows; ++r) row_block_max_impl<false>(x + r * cols, cols, bc, out);
    return false;
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
  return false;
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

}  // namespace exmy::detail::avx2
EXMY_TARGET_END
#endif

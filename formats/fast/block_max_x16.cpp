// Block maxima and max |x| as float32 bits in 16 lanes (AVX-512): 1xB bands
// with B a multiple of 16, and bands of several rows (BxB, Bx1) whose rows
// are a multiple of 16 long; the other shapes, and the last blocks of a row,
// take the 8-lane form. The same maxima, so the same bits.
#include <cstring>
#include <vector>

#include "formats/fast/loops.hpp"
#include "formats/fast/target.hpp"

#if defined(__x86_64__)
EXMY_TARGET_AVX512
#include <immintrin.h>

namespace exmy::detail::avx512 {
namespace {

// How far ahead the 1xB block maxima prefetch their input (2 KiB).
constexpr int64_t kAheadFloats = 512;

// |x| bits of 16 floats: as integers they order like the magnitudes, NaN
// above Inf.
inline __m512i abs16(const float* p) { return _mm512_and_si512(_mm512_loadu_si512(p), _mm512_set1_epi32(0x7fffffff)); }

// The lane maxima of sixteen blocks to one vector of their sixteen maxima,
// in block order: pairs of 32-bit, then 64-bit lanes within each 128-bit
// lane, then the 128-bit lanes across.
inline __m512i reduce16(const __m512i m[16]) {
  __m512i p[8], q[4];
  for (int i = 0; i < 8; ++i)
    p[i] = _mm512_max_epu32(_mm512_unpacklo_epi32(m[2 * i], m[2 * i + 1]), _mm512_unpackhi_epi32(m[2 * i], m[2 * i + 1]));
  for (int i = 0; i < 4; ++i)
    q[i] = _mm512_max_epu32(_mm512_unpacklo_epi64(p[2 * i], p[2 * i + 1]), _mm512_unpackhi_epi64(p[2 * i], p[2 * i + 1]));
  // 0x88 takes 128-bit lanes 0 and 2 of each operand, 0xdd lanes 1 and 3
  const __m512i r01 = _mm512_max_epu32(_mm512_shuffle_i32x4(q[0], q[1], 0x88), _mm512_shuffle_i32x4(q[0], q[1], 0xdd));
  const __m512i r23 = _mm512_max_epu32(_mm512_shuffle_i32x4(q[2], q[3], 0x88), _mm512_shuffle_i32x4(q[2], q[3], 0xdd));
  return _mm512_max_epu32(_mm512_shuffle_i32x4(r01, r23, 0x88), _mm512_shuffle_i32x4(r01, r23, 0xdd));
}

// Sixteen blocks of a 1xB row a step, while sixteen remain of the row's
// `full`; returns the blocks done. BC: B known at compile time (the
// recipes' 16 and 32: unrolled, the sixteen blocks' lanes in registers), or
// 0 for bc at run time. The input 2 KiB ahead is prefetched (past the row's
// end too: the next band, or nothing — a prefetch never faults): the
// hardware prefetcher alone leaves this pass at 0.80 of a plain max pass's
// rate, with it 0.93 (Intel Xeon, family 6 model 207, one thread, a
// 256 MiB tensor). With `next`, also the line of next + e / 2 for every 32
// elements e of this row: the first half of the next row.
template <int BC>
int64_t row_block_max(const float* x, int64_t full, int64_t bc, uint32_t* out, const float* next) {
  const int64_t w = BC ? BC : bc;
  int64_t j = 0;
  for (; j + 16 <= full; j += 16) {
    const float* b = x + j * w;
    for (int64_t c = 0; c < 16 * w; c += 16)
      _mm_prefetch(reinterpret_cast<const char*>(b + kAheadFloats + c), _MM_HINT_T0);
    if (next)
      for (int64_t c = 0; c < 16 * w; c += 32)
        _mm_prefetch(reinterpret_cast<const char*>(next + (j * w + c) / 2), _MM_HINT_T0);
    __m512i m[16];
    for (int k = 0; k < 16; ++k) {
      m[k] = abs16(b + w * k);
      for (int64_t c = 16; c < w; c += 16) m[k] = _mm512_max_epu32(m[k], abs16(b + w * k + c));
    }
    _mm512_storeu_si512(out + j, reduce16(m));
  }
  return j;
}

}  // namespace

bool band_block_max_bits(const float* x, int64_t rows, int64_t cols, int64_t bc, uint32_t* out, const float* next) {
  if (rows > 1 && cols % 16 == 0) {
    // B x B and B x 1 blocks: |x| maxima down the columns first (vertical,
    // no shuffles), a row at a time in address order with the input 4 KiB
    // ahead prefetched (into the next rows, and past the band's end into the
    // next band, which the same thread reads next), then one row reduction
    // (none for B x 1: a block per column). The hardware prefetcher alone
    // follows rows of a few KiB poorly: 16x1 bands of 4096 columns, two
    // threads, Intel Xeon family 6 model 207: 0.139 ns an element two rows a
    // pass without the prefetch, 0.125 thus (a 1x16 pass: 0.105).
    thread_local std::vector<uint32_t> colmax;
    colmax.resize(static_cast<size_t>(cols));
    uint32_t* cm = colmax.data();
    constexpr int64_t kAhead = 1024;  // floats
    for (int64_t c = 0; c < cols; c += 16) {
      _mm_prefetch(reinterpret_cast<const char*>(x + c + kAhead), _MM_HINT_T0);
      _mm512_storeu_si512(cm + c, abs16(x + c));
    }
    for (int64_t r = 1; r < rows; ++r) {
      const float* a = x + r * cols;
      for (int64_t c = 0; c < cols; c += 16) {
        _mm_prefetch(reinterpret_cast<const char*>(a + c + kAhead), _MM_HINT_T0);
        _mm512_storeu_si512(cm + c, _mm512_max_epu32(_mm512_loadu_si512(cm + c), abs16(a + c)));
      }
    }
    if (bc == 1) std::memcpy(out, cm, sizeof(uint32_t) * static_cast<size_t>(cols));
    else band_block_max_bits(reinterpret_cast<const float*>(cm), 1, cols, bc, out);
    return false;
  }
  if (rows != 1 || bc % 16 != 0) return avx2::band_block_max_bits(x, rows, cols, bc, out);
  const int64_t full = cols / bc, gc = (cols + bc - 1) / bc;
  // the next row's first half, where the steps of sixteen blocks cover the row
  if (full % 16 != 0 || full * bc != cols) next = nullptr;
  const int64_t j = bc == 16   ? row_block_max<16>(x, full, bc, out, next)
                    : bc == 32 ? row_block_max<32>(x, full, bc, out, next)
                               : row_block_max<0>(x, full, bc, out, next);
  if (j < gc) avx2::band_block_max_bits(x + j * bc, 1, cols - j * bc, bc, out + j);
  return next != nullptr;
}

uint32_t abs_max_bits(const float* x, int64_t n) {
  __m512i m = _mm512_setzero_si512();
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) m = _mm512_max_epu32(m, abs16(x + j));
  const uint32_t r = _mm512_reduce_max_epu32(m);
  if (j == n) return r;
  const uint32_t t = avx2::abs_max_bits(x + j, n - j);
  return t > r ? t : r;
}

}  // namespace exmy::detail::avx512
EXMY_TARGET_END
#endif

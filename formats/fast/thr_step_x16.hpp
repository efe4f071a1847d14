// The end of a 16-lane step of the threshold loops (AVX-512), once the
// magnitude codes and x-hat's magnitudes are known: x-hat and the codes take
// x's sign and are stored (the values non-temporally with kStream), and the lanes'
// statistics are counted. Include only after `EXMY_TARGET_AVX512`.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "formats/fast/loops.hpp"

namespace exmy::detail::avx512 {
namespace {

// Non-temporal stores of 16 floats (vo 16-byte aligned): one 64-byte store
// where vo starts a cache line (a training tensor's storage is 64-byte
// aligned), else four 16-byte pieces. The one-byte codes
// of a streamed output go through the cache all the same: 8- or 16-byte
// non-temporal pieces of a line cost more than the line's read for
// ownership (on an Intel Xeon, family 6 model 207, a one-pass quantizer's
// traffic moves at 0.56 of memcpy's rate with the codes streamed and 0.75
// with them cached; docs/benchmarks.md).
__attribute__((always_inline)) inline void stream_values16(float* vo, __m512 v) {
  if ((reinterpret_cast<uintptr_t>(vo) & 63) == 0) {
    _mm512_stream_ps(vo, v);
    return;
  }
  _mm_stream_ps(vo, _mm512_castps512_ps128(v));
  _mm_stream_ps(vo + 4, _mm512_extractf32x4_ps(v, 1));
  _mm_stream_ps(vo + 8, _mm512_extractf32x4_ps(v, 2));
  _mm_stream_ps(vo + 12, _mm512_extractf32x4_ps(v, 3));
}

template <bool kStream>
struct ThrStep16 {
  const __m512i sign_mask = _mm512_set1_epi32(static_cast<int>(0x80000000u));
  const __m512i sub_lim;
  const __m512i sign_code;  // the element format's sign bit in a code
  const __m512i sign_shift;  // (a vector count: VPSRLVD is one micro-op, VPSRLD by a register two)
  uint64_t n_sat = 0, n_sub = 0, n_nz = 0, n_uf = 0;

  explicit ThrStep16(const Format& f)
      : sub_lim(_mm512_set1_epi32(1 << f.M)),
        sign_code(_mm512_set1_epi32(static_cast<int>(f.sign_bit))),
        sign_shift(_mm512_set1_epi32(31 - __builtin_ctz(f.sign_bit))) {}

  // xi: the input bits; returns x-hat. co is null when no codes are wanted.
  // (x's sign goes to x-hat and to the code by one ternary-logic op each:
  // a | (b & c), imm 0xF8.)
  __attribute__((always_inline)) __m512 store(__m512i xi, __m512i code, __m512 mag, float* vo, uint8_t* co) const {
    const __m512 xh = _mm512_castsi512_ps(_mm512_ternarylogic_epi32(_mm512_castps_si512(mag), xi, sign_mask, 0xF8));
    if constexpr (kStream) {
      stream_values16(vo, xh);
    } else {
      _mm512_storeu_ps(vo, xh);
    }
    if (co) {
      const __m512i signed_code = _mm512_ternarylogic_epi32(code, _mm512_srlv_epi32(xi, sign_shift), sign_code, 0xF8);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(co), _mm512_cvtepi32_epi8(signed_code));
    }
    return xh;
  }

  // nz: the lanes that count and hold x != 0; m1: code >= 1; sat: the lanes
  // counted as saturated.
  __attribute__((always_inline)) void count(__mmask16 nz, __m512i code, __mmask16 m1, __m512 xh, __mmask16 sat) {
    const __mmask16 zh = _mm512_cmp_ps_mask(xh, _mm512_setzero_ps(), _CMP_EQ_OQ);
    n_nz += static_cast<uint64_t>(__builtin_popcount(nz));
    n_uf += static_cast<uint64_t>(__builtin_popcount(nz & zh));
    n_sub += static_cast<uint64_t>(__builtin_popcount(m1 & _mm512_cmpgt_epi32_mask(sub_lim, code)));
    n_sat += static_cast<uint64_t>(__builtin_popcount(sat));
  }

  void add_to(SpanCounts& cnt) const {
    cnt.saturated += n_sat;
    cnt.subnormal += n_sub;
    cnt.nonzero += n_nz;
    cnt.underflow += n_uf;
  }
};

}  // namespace
}  // namespace exmy::detail::avx512

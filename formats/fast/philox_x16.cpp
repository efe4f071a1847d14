// Philox4x32-10 words 16 counter blocks at a time (AVX-512 F), the form
// philox_words() takes on CPUs with AVX-512: lane i of the four state
// vectors is counter block c + i, each round is the 8-lane form's on twice
// the lanes, and the words leave in the order philox_block() gives them.
#include <cstdint>

#include "formats/fast/loops.hpp"
#include "formats/fast/target.hpp"

#if defined(__x86_64__)
EXMY_TARGET_AVX512
#include <immintrin.h>

namespace exmy::detail::avx512 {

namespace {

// G steps side by side (G groups of 16 counter blocks, c, c + 16, ...): the
// rounds of one group are a single dependency chain, so two in flight keep
// the multipliers busy while each waits on the other.
template <int G>
inline void philox_steps(uint64_t seed, uint64_t stream, uint64_t c, uint32_t* out) {
  const __m512i M0 = _mm512_set1_epi32(static_cast<int>(0xD2511F53u));
  const __m512i M1 = _mm512_set1_epi32(static_cast<int>(0xCD9E8D57u));
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512i one = _mm512_set1_epi32(1);
  // lane 2m takes dword 2m+1 (high half) or 2m (low) of the even products,
  // lane 2m+1 the same of the odd products (indices 16 and up: the second source)
  const __m512i take_hi = _mm512_setr_epi32(1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31);
  const __m512i take_lo = _mm512_setr_epi32(0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30);
  __m512i C0[G], C1[G], C2[G], C3[G];
  for (int g = 0; g < G; ++g) {
    // counter = (c low, c high, stream low, stream high); c + i may carry into the high word
    const uint64_t cg = c + 16 * static_cast<uint64_t>(g);
    const __m512i base = _mm512_set1_epi32(static_cast<int>(static_cast<uint32_t>(cg)));
    const __m512i lo = _mm512_add_epi32(base, lane);
    const __mmask16 carry = _mm512_cmplt_epu32_mask(lo, base);
    const __m512i hi = _mm512_set1_epi32(static_cast<int>(static_cast<uint32_t>(cg >> 32)));
    C0[g] = lo;
    C1[g] = _mm512_mask_add_epi32(hi, carry, hi, one);
    C2[g] = _mm512_set1_epi32(static_cast<int>(static_cast<uint32_t>(stream)));
    C3[g] = _mm512_set1_epi32(static_cast<int>(static_cast<uint32_t>(stream >> 32)));
  }
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    const __m512i K0 = _mm512_set1_epi32(static_cast<int>(k0)), K1 = _mm512_set1_epi32(static_cast<int>(k1));
    for (int g = 0; g < G; ++g) {
      // (hi, lo) of M0 * C0 and M1 * C2, 32 x 32 -> 64 bits per lane
      const __m512i p0e = _mm512_mul_epu32(C0[g], M0), p0o = _mm512_mul_epu32(_mm512_srli_epi64(C0[g], 32), M0);
      const __m512i p1e = _mm512_mul_epu32(C2[g], M1), p1o = _mm512_mul_epu32(_mm512_srli_epi64(C2[g], 32), M1);
      // the high and low halves back in lane order, one two-source permute each
      const __m512i hi0 = _mm512_permutex2var_epi32(p0e, take_hi, p0o);
      const __m512i lo0 = _mm512_permutex2var_epi32(p0e, take_lo, p0o);
      const __m512i hi1 = _mm512_permutex2var_epi32(p1e, take_hi, p1o);
      const __m512i lo1 = _mm512_permutex2var_epi32(p1e, take_lo, p1o);
      C0[g] = _mm512_ternarylogic_epi32(hi1, C1[g], K0, 0x96);  // hi1 ^ C1 ^ k0
      C1[g] = lo1;
      C2[g] = _mm512_ternarylogic_epi32(hi0, C3[g], K1, 0x96);  // hi0 ^ C3 ^ k1
      C3[g] = lo0;
    }
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  for (int g = 0; g < G; ++g) {
    // block i's words are lane i of C0..C3: transpose within each 128-bit
    // quarter (r_m holds block 4q + m in quarter q), then gather the quarters
    const __m512i a = _mm512_unpacklo_epi32(C0[g], C1[g]), b = _mm512_unpackhi_epi32(C0[g], C1[g]);
    const __m512i e = _mm512_unpacklo_epi32(C2[g], C3[g]), f = _mm512_unpackhi_epi32(C2[g], C3[g]);
    const __m512i r0 = _mm512_unpacklo_epi64(a, e), r1 = _mm512_unpackhi_epi64(a, e);
    const __m512i r2 = _mm512_unpacklo_epi64(b, f), r3 = _mm512_unpackhi_epi64(b, f);
    const __m512i t0 = _mm512_shuffle_i32x4(r0, r1, 0x44), t1 = _mm512_shuffle_i32x4(r2, r3, 0x44);
    const __m512i t2 = _mm512_shuffle_i32x4(r0, r1, 0xEE), t3 = _mm512_shuffle_i32x4(r2, r3, 0xEE);
    uint32_t* o = out + 64 * g;
    _mm512_storeu_si512(o + 0, _mm512_shuffle_i32x4(t0, t1, 0x88));
    _mm512_storeu_si512(o + 16, _mm512_shuffle_i32x4(t0, t1, 0xDD));
    _mm512_storeu_si512(o + 32, _mm512_shuffle_i32x4(t2, t3, 0x88));
    _mm512_storeu_si512(o + 48, _mm512_shuffle_i32x4(t2, t3, 0xDD));
  }
}

}  // namespace

void philox_words64(uint64_t seed, uint64_t stream, uint64_t c, int64_t steps, uint32_t* out) {
  int64_t s = 0;
  for (; s + 2 <= steps; s += 2, c += 32, out += 128) philox_steps<2>(seed, stream, c, out);
  if (s < steps) philox_steps<1>(seed, stream, c, out);
}

}  // namespace exmy::detail::avx512
EXMY_TARGET_END
#endif

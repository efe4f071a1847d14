#include "formats/philox_cpu.hpp"

#include "formats/fast/loops.hpp"
#include "formats/philox.hpp"

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace exmy {

void philox_words(uint64_t seed, uint64_t stream, uint64_t j0, int64_t count, uint32_t* out) {
  uint64_t c = j0 >> 2;  // first counter block
  int64_t k = 0;
#if defined(__x86_64__)
  if (detail::simd_width() >= detail::Simd::avx512 && count >= 64) {  // 16 blocks a step
    const int64_t steps = count / 64;
    detail::avx512::philox_words64(seed, stream, c, steps, out);
    k = steps * 64;
    c += static_cast<uint64_t>(steps) * 16;
  }
#endif
#if defined(__AVX2__)
  // Eight counter blocks side by side: lane i of C0..C3 is the state of block c + i.
  const __m256i M0 = _mm256_set1_epi32(static_cast<int>(0xD2511F53u));
  const __m256i M1 = _mm256_set1_epi32(static_cast<int>(0xCD9E8D57u));
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  for (; k + 32 <= count; k += 32, c += 8) {
    // counter = (c low, c high, stream low, stream high); c + i may carry into the high word
    const __m256i lo = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(static_cast<uint32_t>(c))), lane);
    const __m256i carry = _mm256_cmpgt_epi32(_mm256_xor_si256(_mm256_set1_epi32(static_cast<int>(static_cast<uint32_t>(c))),
                                                              _mm256_set1_epi32(static_cast<int>(0x80000000u))),
                                             _mm256_xor_si256(lo, _mm256_set1_epi32(static_cast<int>(0x80000000u))));
    __m256i C0 = lo;
    __m256i C1 = _mm256_sub_epi32(_mm256_set1_epi32(static_cast<int>(static_cast<uint32_t>(c >> 32))), carry);
    __m256i C2 = _mm256_set1_epi32(static_cast<int>(static_cast<uint32_t>(stream)));
    __m256i C3 = _mm256_set1_epi32(static_cast<int>(static_cast<uint32_t>(stream >> 32)));
    uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
    for (int round = 0; round < 10; ++round) {
      // (hi, lo) of M0 * C0 and M1 * C2, 32 x 32 -> 64 bits per lane
      const __m256i p0e = _mm256_mul_epu32(C0, M0), p0o = _mm256_mul_epu32(_mm256_srli_epi64(C0, 32), M0);
      const __m256i p1e = _mm256_mul_epu32(C2, M1), p1o = _mm256_mul_epu32(_mm256_srli_epi64(C2, 32), M1);
      const __m256i hi0 = _mm256_blend_epi32(_mm256_srli_epi64(p0e, 32), p0o, 0xAA);
      const __m256i lo0 = _mm256_blend_epi32(p0e, _mm256_slli_epi64(p0o, 32), 0xAA);
      const __m256i hi1 = _mm256_blend_epi32(_mm256_srli_epi64(p1e, 32), p1o, 0xAA);
      const __m256i lo1 = _mm256_blend_epi32(p1e, _mm256_slli_epi64(p1o, 32), 0xAA);
      const __m256i n0 = _mm256_xor_si256(_mm256_xor_si256(hi1, C1), _mm256_set1_epi32(static_cast<int>(k0)));
      const __m256i n2 = _mm256_xor_si256(_mm256_xor_si256(hi0, C3), _mm256_set1_epi32(static_cast<int>(k1)));
      C0 = n0;
      C1 = lo1;
      C2 = n2;
      C3 = lo0;
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
    // interleave: block i's words are lane i of C0, C1, C2, C3
    const __m256i a = _mm256_unpacklo_epi32(C0, C1);  // b0w0 b0w1 b1w0 b1w1 | b4.. b5..
    const __m256i b = _mm256_unpackhi_epi32(C0, C1);  // b2w0 b2w1 b3w0 b3w1 | b6.. b7..
    const __m256i e = _mm256_unpacklo_epi32(C2, C3);
    const __m256i f = _mm256_unpackhi_epi32(C2, C3);
    const __m256i r0 = _mm256_unpacklo_epi64(a, e);  // b0 | b4
    const __m256i r1 = _mm256_unpackhi_epi64(a, e);  // b1 | b5
    const __m256i r2 = _mm256_unpacklo_epi64(b, f);  // b2 | b6
    const __m256i r3 = _mm256_unpackhi_epi64(b, f);  // b3 | b7
    auto* o = reinterpret_cast<__m256i*>(out + k);
    _mm256_storeu_si256(o + 0, _mm256_permute2x128_si256(r0, r1, 0x20));
    _mm256_storeu_si256(o + 1, _mm256_permute2x128_si256(r2, r3, 0x20));
    _mm256_storeu_si256(o + 2, _mm256_permute2x128_si256(r0, r1, 0x31));
    _mm256_storeu_si256(o + 3, _mm256_permute2x128_si256(r2, r3, 0x31));
  }
#endif
  for (; k < count; k += 4, ++c) {
    const PhiloxBlock blk = philox_block(seed, stream, c);
    for (int w = 0; w < 4 && k + w < count; ++w) out[k + w] = blk.w[w];
  }
}

}  // namespace exmy

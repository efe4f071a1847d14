// Lane helpers shared by the AVX2 loops. Include only after
// `#pragma GCC target("avx2,fma")` (the functions take that target).
#pragma once

#include <immintrin.h>

#include "formats/fast/loops.hpp"

namespace exmy::detail::avx2 {

inline __m256d pow2_vec(__m256i e) {  // 2^e for int64 lanes in [-1022, 1023]
  return _mm256_castsi256_pd(_mm256_slli_epi64(_mm256_add_epi64(e, _mm256_set1_epi64x(1023)), 52));
}

inline __m256i max_epi64(__m256i a, __m256i b) { return _mm256_blendv_epi8(b, a, _mm256_cmpgt_epi64(a, b)); }

// The integer lane operations the rounding decision needs, for 4 int64 lanes
// (the double loop) and 8 int32 lanes (the float loop of FP4 formats).
struct Lanes64 {
  static __m256i set1(int64_t v) { return _mm256_set1_epi64x(v); }
  static __m256i add(__m256i a, __m256i b) { return _mm256_add_epi64(a, b); }
  static __m256i sub(__m256i a, __m256i b) { return _mm256_sub_epi64(a, b); }
  static __m256i gt(__m256i a, __m256i b) { return _mm256_cmpgt_epi64(a, b); }
  static __m256i eq(__m256i a, __m256i b) { return _mm256_cmpeq_epi64(a, b); }
  static __m256i half(__m256i a) { return _mm256_srli_epi64(a, 1); }
};
struct Lanes32 {
  static __m256i set1(int64_t v) { return _mm256_set1_epi32(static_cast<int>(v)); }
  static __m256i add(__m256i a, __m256i b) { return _mm256_add_epi32(a, b); }
  static __m256i sub(__m256i a, __m256i b) { return _mm256_sub_epi32(a, b); }
  static __m256i gt(__m256i a, __m256i b) { return _mm256_cmpgt_epi32(a, b); }
  static __m256i eq(__m256i a, __m256i b) { return _mm256_cmpeq_epi32(a, b); }
  static __m256i half(__m256i a) { return _mm256_srli_epi32(a, 1); }
};

// docs/numerics.md §2's decision to round a magnitude away from zero, per lane (all
// ones: away). W = floor(|v| / ulp * 2^(h+1)) splits into the index k of the
// lower neighbour (W >> (h+1)) and the h+1 bits F below it; `sticky` marks
// bits lost below F, `negi` negative inputs, r the lane's h random bits
// (stochastic modes only). Bounds: 2^h - 1 and 2^(h+1) - 1 as lanes.
template <Round MODE, class L>
inline __m256i away_from_zero(__m256i k, __m256i F, __m256i sticky, __m256i negi, __m256i r, __m256i two_n_m1,
                              __m256i two_n1_m1) {
  const __m256i zero = _mm256_setzero_si256(), one = L::set1(1);
  const __m256i Fnz = L::gt(F, zero);
  const __m256i inexact = _mm256_or_si256(Fnz, sticky);
  const __m256i lo_odd = L::eq(_mm256_and_si256(k, one), one);
  if constexpr (MODE == Round::rne) {
    return _mm256_and_si256(Fnz, _mm256_or_si256(sticky, lo_odd));
  } else if constexpr (MODE == Round::rna) {
    return Fnz;
  } else if constexpr (MODE == Round::rtz) {
    return zero;
  } else if constexpr (MODE == Round::up) {
    return _mm256_andnot_si256(negi, inexact);
  } else if constexpr (MODE == Round::down) {
    return _mm256_and_si256(negi, inexact);
  } else if constexpr (MODE == Round::odd) {
    return _mm256_andnot_si256(lo_odd, inexact);
  } else if constexpr (MODE == Round::stochastic) {
    // round F/2 to nearest even, then away when that plus r reaches 2^h
    const __m256i jj = L::half(F);
    const __m256i F_odd = L::eq(_mm256_and_si256(F, one), one);
    const __m256i j_odd = L::eq(_mm256_and_si256(jj, one), one);
    const __m256i rn = L::sub(jj, _mm256_and_si256(F_odd, _mm256_or_si256(sticky, j_odd)));  // -1 where set
    return L::gt(L::add(rn, r), two_n_m1);
  } else if constexpr (MODE == Round::stochastic_fast) {
    return L::gt(L::add(L::add(F, L::add(r, r)), one), two_n1_m1);
  } else {
    return L::gt(L::add(L::half(F), r), two_n_m1);
  }
}

// Sum of the int32 lanes, negated (the lanes hold -counts).
inline uint64_t hsum_neg(__m256i v) {
  alignas(32) int32_t l[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(l), v);
  int64_t t = 0;
  for (int k = 0; k < 8; ++k) t += l[k];
  return static_cast<uint64_t>(-t);
}

}  // namespace exmy::detail::avx2

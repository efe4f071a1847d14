// The n-point Hadamard transforms (n = 16, 32, 64, 128) of segments along
// rows (formats/hadamard_segment.hpp, rht_transform_segment) in 16 lanes
// (AVX-512 F/DQ): a segment's n signed inputs as n / 8 vectors of doubles,
// the butterfly stages by lane swaps and masked blends inside a vector and
// by adds between vectors, and the rounding to bf16 of to_bf16 on 16
// lanes. The butterflies are exact where the scalar path's are (the inputs
// span at most 52 - log2 n binades), so their order does not matter and
// the bits are rht_transform_segment's; a segment outside that path (a
// non-finite input, a wider span, an exact zero output, whose sign the
// scalar path settles from the terms) goes to rht_transform_segment itself.
#include "formats/fast/loops.hpp"
#include "formats/fast/target.hpp"
#include "formats/hadamard_segment.hpp"

#if defined(__x86_64__)
EXMY_TARGET_AVX512
#include <immintrin.h>

namespace exmy::detail::avx512 {
namespace {

// log2 of a transform's size.
template <int N>
constexpr int kLog2Size = N == 16 ? 4 : N == 32 ? 5 : N == 64 ? 6 : 7;

// The butterfly stages between `count` vectors (a power of two): vectors k
// and k + h take a + b and a - b.
__attribute__((always_inline)) inline void butterflies_between(__m512d* y, int count) {
  for (int h = 1; h < count; h <<= 1)
    for (int i = 0; i < count; i += 2 * h)
      for (int j = i; j < i + h; ++j) {
        const __m512d a = y[j], b = y[j + h];
        y[j] = _mm512_add_pd(a, b);
        y[j + h] = _mm512_sub_pd(a, b);
      }
}

// Whether any lane of the `count` vectors is an exact zero (whose sign the
// segment function settles from the terms).
__attribute__((always_inline)) inline bool any_zero(const __m512d* y, int count) {
  for (int k = 0; k < count; ++k)
    if (_mm512_cmpeq_pd_mask(y[k], _mm512_setzero_pd())) return true;
  return false;
}

// to_bf16 of 8 exact sums y of an N-point transform: times 1/sqrt(2)
// rounded (N = 32, 128), times 1/4 (N <= 32) or 1/8 (exact), rounded to odd
// at float precision, then to nearest even at bf16's.
template <int N>
__attribute__((always_inline)) inline __m256 to_bf16_x8(__m512d y) {
  if constexpr (N == 32 || N == 128) y = _mm512_mul_pd(y, _mm512_set1_pd(0x1.6a09e667f3bcdp-1));
  const __m512d v = _mm512_mul_pd(y, _mm512_set1_pd(N <= 32 ? 0.25 : 0.125));
  const __m256 f = _mm512_cvtpd_ps(v);
  const __m512d d = _mm512_cvtps_pd(f);
  const __mmask8 inexact = _mm512_cmp_pd_mask(d, v, _CMP_NEQ_UQ);
  const __mmask8 away = _mm512_cmp_pd_mask(_mm512_abs_pd(d), _mm512_abs_pd(v), _CMP_GT_OQ);
  const __m256i fb = _mm256_castps_si256(f), one = _mm256_set1_epi32(1);
  __m256i u = _mm256_mask_sub_epi32(fb, inexact & away, fb, one);
  u = _mm256_mask_or_epi32(u, inexact, u, one);
  const __mmask8 inf =
      _mm256_cmpge_epu32_mask(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)), _mm256_set1_epi32(0x7f800000));
  __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff),
                                                   _mm256_and_si256(_mm256_srli_epi32(u, 16), one)));
  r = _mm256_and_si256(r, _mm256_set1_epi32(static_cast<int>(0xffff0000u)));
  return _mm256_castsi256_ps(_mm256_mask_mov_epi32(r, inf, fb));  // an infinite result stays as converted
}

// The transform of the N floats at x in place (N = 16, 32, 64, 128: N / 8
// vectors of doubles, lane j % 8 of vector j / 8 holding element j); false,
// writing nothing, for a segment the fast path does not take.
template <int N>
bool rht_fast(float* x, const __m512i* sign) {
  constexpr int V = N / 8, F = N / 16;  // vectors of doubles; of floats
  __m512i t[F];
  __m512i emax = _mm512_setzero_si512(), emin = _mm512_set1_epi32(255);
  __mmask16 special = 0, any = 0;
  const __m512i exp_mask = _mm512_set1_epi32(0xff), abs_mask = _mm512_set1_epi32(0x7fffffff);
  for (int f = 0; f < F; ++f) {
    t[f] = _mm512_xor_si512(_mm512_loadu_si512(x + 16 * f), sign[f]);
    const __m512i e = _mm512_and_si512(_mm512_srli_epi32(t[f], 23), exp_mask);
    special |= _mm512_cmpeq_epi32_mask(e, exp_mask);  // Inf or NaN
    const __mmask16 nz = _mm512_test_epi32_mask(t[f], abs_mask);
    any |= nz;
    emax = _mm512_mask_max_epi32(emax, nz, emax, e);
    emin = _mm512_mask_min_epi32(emin, nz, emin, _mm512_max_epi32(e, _mm512_set1_epi32(1)));
  }
  if (special || !any) return false;
  // The span of the scalar path's test, hi - lo <= 52 - log2 N, from the
  // biased exponents: hi <= e_max - 127 (a subnormal's, -127, is above its
  // true one: the test can only be stricter), lo = max(e, 1) - 150.
  if (_mm512_reduce_max_epi32(emax) - _mm512_reduce_min_epi32(emin) > 29 - kLog2Size<N>) return false;
  __m512d y[V];
  for (int f = 0; f < F; ++f) {
    y[2 * f] = _mm512_cvtps_pd(_mm512_castps512_ps256(_mm512_castsi512_ps(t[f])));
    y[2 * f + 1] = _mm512_cvtps_pd(_mm256_castsi256_ps(_mm512_extracti64x4_epi64(t[f], 1)));
  }
  // h = 1, 2, 4 inside each vector: lane j with partner j ^ h takes a + b
  // where j < j ^ h, else a - b (a the lower lane's, b the upper's).
  const auto stage = [](__m512d v, __m512d sw, __mmask8 upper) {
    return _mm512_mask_blend_pd(upper, _mm512_add_pd(v, sw), _mm512_sub_pd(sw, v));
  };
  for (int k = 0; k < V; ++k) {
    y[k] = stage(y[k], _mm512_permute_pd(y[k], 0x55), 0xAA);
    y[k] = stage(y[k], _mm512_permutex_pd(y[k], 0x4E), 0xCC);
    y[k] = stage(y[k], _mm512_shuffle_f64x2(y[k], y[k], 0x4E), 0xF0);
  }
  butterflies_between(y, V);  // h = 8, 16, ...: the stages between vectors
  if (any_zero(y, V)) return false;
  for (int k = 0; k < V; ++k) _mm256_storeu_ps(x + 8 * k, to_bf16_x8<N>(y[k]));
  return true;
}

template <int N>
void rht_rows_n(float* x, int64_t nseg, const RhtParams& p) {
  // the signs s_i as sign-bit masks, lane i % 16 of vector i / 16 for input i
  alignas(64) uint32_t sgn[N];
  for (int i = 0; i < N; ++i) sgn[i] = p.negated(i) ? 0x80000000u : 0u;
  __m512i sign[N / 16];
  for (int f = 0; f < N / 16; ++f) sign[f] = _mm512_load_si512(sgn + 16 * f);
  for (int64_t s = 0; s < nseg; ++s) {
    float* seg = x + N * s;
    if (!rht_fast<N>(seg, sign)) rht_transform_segment(seg, p);
  }
}

// The transforms of the N-element column segments of 8 adjacent columns at
// base (row stride cols; element i of column l at base[i cols + l]), a lane
// per column, in place; false, writing nothing, unless every lane takes the
// fast path.
template <int N>
bool rht_cols_fast(float* base, int64_t cols, const RhtParams& p) {
  __m512d y[N];
  __m256i emax = _mm256_setzero_si256(), emin = _mm256_set1_epi32(255);
  __mmask8 special = 0, any = 0;
  const __m256i exp_mask = _mm256_set1_epi32(0xff), abs_mask = _mm256_set1_epi32(0x7fffffff);
  for (int i = 0; i < N; ++i) {
    __m256i t = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(base + i * cols));
    if (p.negated(i)) t = _mm256_xor_si256(t, _mm256_set1_epi32(static_cast<int>(0x80000000u)));
    const __m256i e = _mm256_and_si256(_mm256_srli_epi32(t, 23), exp_mask);
    special |= _mm256_cmpeq_epi32_mask(e, exp_mask);
    const __mmask8 nz = _mm256_test_epi32_mask(t, abs_mask);
    any |= nz;
    emax = _mm256_mask_max_epi32(emax, nz, emax, e);
    emin = _mm256_mask_min_epi32(emin, nz, emin, _mm256_max_epi32(e, _mm256_set1_epi32(1)));
    y[i] = _mm512_cvtps_pd(_mm256_castsi256_ps(t));
  }
  // every lane: finite, some non-zero input, its span within the scalar
  // path's test (see rht_fast)
  if (special || any != 0xff) return false;
  if (_mm256_cmpgt_epi32_mask(_mm256_sub_epi32(emax, emin), _mm256_set1_epi32(29 - kLog2Size<N>))) return false;
  butterflies_between(y, N);
  if (any_zero(y, N)) return false;
  for (int j = 0; j < N; ++j) _mm256_storeu_ps(base + j * cols, to_bf16_x8<N>(y[j]));
  return true;
}

// Column segments s in [s0, s1) (rht_segment's numbering: column s % cols
// of row block s / cols), eight adjacent columns of a row block at a time
// where the fast path takes all eight, else each by the segment function.
template <int N>
void rht_cols_n(float* x, int64_t cols, int64_t s0, int64_t s1, const RhtParams& p) {
  int64_t s = s0;
  while (s < s1) {
    const int64_t c = s % cols;
    if (c + 8 <= cols && s + 8 <= s1 && rht_cols_fast<N>(x + (s / cols) * N * cols + c, cols, p)) {
      s += 8;
      continue;
    }
    rht_segment(x, cols, p, s);
    ++s;
  }
}

}  // namespace

void rht_cols(float* x, int64_t cols, int64_t s0, int64_t s1, const RhtParams& p) {
  switch (p.size) {
    case 16: return rht_cols_n<16>(x, cols, s0, s1, p);
    case 32: return rht_cols_n<32>(x, cols, s0, s1, p);
    case 64: return rht_cols_n<64>(x, cols, s0, s1, p);
    default: return rht_cols_n<128>(x, cols, s0, s1, p);
  }
}

void rht_rows(float* x, int64_t nseg, const RhtParams& p) {
  switch (p.size) {
    case 16: return rht_rows_n<16>(x, nseg, p);
    case 32: return rht_rows_n<32>(x, nseg, p);
    case 64: return rht_rows_n<64>(x, nseg, p);
    default: return rht_rows_n<128>(x, nseg, p);
  }
}

}  // namespace exmy::detail::avx512
EXMY_TARGET_END
#endif

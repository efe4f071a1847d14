// The threshold loop (AVX2, 8 lanes): for deterministic modes that treat x
// and -x alike, the magnitude code is the count of thresholds |x| exceeds.
// Per block (widths a multiple of 8) and with a block per lane (other
// widths, Bx1 columns above all).
#include <algorithm>
#include <limits>
#include <vector>

#include "formats/fast/loops.hpp"
#include "formats/fast/target.hpp"
#include "formats/fast/tails.hpp"

#if defined(__x86_64__)
EXMY_TARGET_AVX2
#include "formats/fast/avx2_lanes.hpp"
#include "formats/fast/threshold_walk.hpp"

namespace exmy::detail::avx2 {
namespace {

// The end of an 8-lane step of the threshold loops, once the magnitude codes
// and x-hat's magnitudes are known: x-hat and the codes take x's sign and are
// stored (non-temporally with kStream), and the lanes' statistics are
// accumulated as -1 per lane until add_to.
template <bool kStream>
struct ThrStep {
  const __m256i sign_mask = _mm256_set1_epi32(static_cast<int>(0x80000000u));
  const __m256i sub_lim;
  const __m256i sign_shift;  // (a vector count: VPSRLVD, one micro-op on Intel, VPSRLD by a register two)
  __m256i acc_sat = _mm256_setzero_si256(), acc_sub = acc_sat, acc_nz = acc_sat, acc_uf = acc_sat;

  explicit ThrStep(const Format& f)
      : sub_lim(_mm256_set1_epi32(1 << f.M)), sign_shift(_mm256_set1_epi32(31 - __builtin_ctz(f.sign_bit))) {}

  // xi: the input bits; returns x-hat. co is null when no codes are wanted.
  __attribute__((always_inline)) __m256 store(__m256i xi, __m256i code, __m256 mag, float* vo, uint8_t* co) const {
    const __m256i xs = _mm256_and_si256(xi, sign_mask);
    const __m256 xh = _mm256_or_ps(mag, _mm256_castsi256_ps(xs));
    if constexpr (kStream) {
      _mm_stream_ps(vo, _mm256_castps256_ps128(xh));
      _mm_stream_ps(vo + 4, _mm256_extractf128_ps(xh, 1));
    } else {
      _mm256_storeu_ps(vo, xh);
    }
    if (co) {
      const __m256i sc = _mm256_or_si256(code, _mm256_srlv_epi32(xs, sign_shift));
      const __m128i p16 = _mm_packus_epi32(_mm256_castsi256_si128(sc), _mm256_extracti128_si256(sc, 1));
      const __m128i p8 = _mm_packus_epi16(p16, p16);
      // (codes through the cache even when streaming: see thr_step_x16.hpp)
      _mm_storel_epi64(reinterpret_cast<__m128i*>(co), p8);
    }
    return xh;
  }

  // nz: the lanes that count and hold x != 0; m1: code >= 1; sat: the lanes
  // counted as saturated.
  __attribute__((always_inline)) void count(__m256i nz, __m256i code, __m256i m1, __m256 xh, __m256i sat) {
    const __m256i zi = _mm256_castps_si256(_mm256_cmp_ps(xh, _mm256_setzero_ps(), _CMP_EQ_OQ));
    const __m256i is_sub = _mm256_and_si256(_mm256_cmpgt_epi32(sub_lim, code), m1);
    acc_sat = _mm256_add_epi32(acc_sat, sat);
    acc_sub = _mm256_add_epi32(acc_sub, is_sub);
    acc_nz = _mm256_add_epi32(acc_nz, nz);
    acc_uf = _mm256_add_epi32(acc_uf, _mm256_and_si256(nz, zi));
  }

  // lane sums stay below 2^31: a call covers far fewer elements
  void add_to(SpanCounts& cnt) const {
    cnt.saturated += hsum_neg(acc_sat);
    cnt.subnormal += hsum_neg(acc_sub);
    cnt.nonzero += hsum_neg(acc_nz);
    cnt.underflow += hsum_neg(acc_uf);
  }
};

// The threshold loop (see ThrBlock): the magnitude code is the count of
// thresholds |x| reaches, exact for every finite x.
template <bool kStream>
void threshold_row_impl(const QuantPlan& p, const ThrRow& row, uint8_t* codes, float* values, SpanCounts& cnt) {
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff);
  const __m256i zero_i = _mm256_setzero_si256();
  ThrStep<kStream> out(p.fe);
  walk_threshold_row(p, row, codes, values, cnt, [&](const ThrBlock& th, const float* x, int64_t i0, int64_t n) {
    const __m256i t1 = _mm256_set1_epi32(th.t[0]), t2 = _mm256_set1_epi32(th.t[1]);
    const __m256i t3 = _mm256_set1_epi32(th.t[2]), t4 = _mm256_set1_epi32(th.t[3]);
    const __m256i t5 = _mm256_set1_epi32(th.t[4]), t6 = _mm256_set1_epi32(th.t[5]);
    const __m256i t7 = _mm256_set1_epi32(th.t[6]);
    const __m256 table = _mm256_loadu_ps(th.table);
    auto step = [&](int64_t j) __attribute__((always_inline)) {
      const __m256i xi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + j));
      const __m256i ax = _mm256_and_si256(xi, abs_mask);
      const __m256i m1 = _mm256_cmpgt_epi32(ax, t1);
      __m256i code = _mm256_sub_epi32(zero_i, m1);
      code = _mm256_sub_epi32(code, _mm256_cmpgt_epi32(ax, t2));
      code = _mm256_sub_epi32(code, _mm256_cmpgt_epi32(ax, t3));
      code = _mm256_sub_epi32(code, _mm256_cmpgt_epi32(ax, t4));
      code = _mm256_sub_epi32(code, _mm256_cmpgt_epi32(ax, t5));
      code = _mm256_sub_epi32(code, _mm256_cmpgt_epi32(ax, t6));
      code = _mm256_sub_epi32(code, _mm256_cmpgt_epi32(ax, t7));
      const __m256 xh =
          out.store(xi, code, _mm256_permutevar8x32_ps(table, code), values + i0 + j, codes ? codes + i0 + j : nullptr);
      if (row.stats)
        out.count(_mm256_cmpgt_epi32(ax, zero_i), code, m1, xh, _mm256_cmpgt_epi32(ax, _mm256_set1_epi32(th.sat)));
    };
    int64_t j = 0;
    if (n == 16) {
      step(0);
      step(8);
      j = 16;
    } else {
      for (; j + 8 <= n; j += 8) step(j);
    }
    return j;
  });
  out.add_to(cnt);
}

// 8x8 transpose of int32: row k of the result is lane k of every input.
inline void transpose8x8(__m256i r[8]) {
  __m256i t[8], u[8];
  for (int k = 0; k < 4; ++k) {
    t[2 * k] = _mm256_unpacklo_epi32(r[2 * k], r[2 * k + 1]);
    t[2 * k + 1] = _mm256_unpackhi_epi32(r[2 * k], r[2 * k + 1]);
  }
  for (int k = 0; k < 2; ++k) {
    u[4 * k] = _mm256_unpacklo_epi64(t[4 * k], t[4 * k + 2]);
    u[4 * k + 1] = _mm256_unpackhi_epi64(t[4 * k], t[4 * k + 2]);
    u[4 * k + 2] = _mm256_unpacklo_epi64(t[4 * k + 1], t[4 * k + 3]);
    u[4 * k + 3] = _mm256_unpackhi_epi64(t[4 * k + 1], t[4 * k + 3]);
  }
  for (int k = 0; k < 4; ++k) {
    r[k] = _mm256_permute2x128_si256(u[k], u[k + 4], 0x20);
    r[k + 4] = _mm256_permute2x128_si256(u[k], u[k + 4], 0x31);
  }
}

// The threshold loop with a block per lane (see threshold_band_lanes). The
// band goes in chunks of columns: each chunk's constants are laid out column
// by column (the ThrBlock of eight columns' blocks transposed), small enough
// to stay in L1 while every row of the band runs through the chunk.
template <bool kStream>
void threshold_lanes_impl(const QuantPlan& p, const ThrRow& band, uint8_t* codes, float* values, SpanCounts& cnt) {
  static_assert(sizeof(ThrBlock) == 16 * sizeof(int32_t), "ThrBlock: t[7], sat, table[8]");
  const int64_t cols = band.cols, c8 = cols & ~int64_t{7};
  // The layout of a chunk: arrays of kChunk int32, thresholds 1..7, the
  // saturation threshold, the bits of x-hat for magnitude codes 0..7, and
  // -1 where the column's block is the loop's (0 where the scalar core
  // encodes it: those lanes take `unused`, thresholds no |x| exceeds, and
  // count in no statistic).
  constexpr int64_t kChunk = 256;
  constexpr int kT = 0, kSat = 7, kTab = 8, kUse = 16, kArrays = 17;
  alignas(32) int32_t lay[kArrays * kChunk];
  ThrBlock unused;
  for (int k = 0; k < 7; ++k) unused.t[k] = std::numeric_limits<int32_t>::max();
  unused.sat = std::numeric_limits<int32_t>::max();
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff);
  const __m256i zero_i = _mm256_setzero_si256();
  ThrStep<kStream> out(p.fe);
  for (int64_t c0 = 0; c0 < c8; c0 += kChunk) {
    const int64_t w = std::min(kChunk, c8 - c0);
    for (int64_t c = 0; c < w; c += 8) {
      __m256i lo[8], hi[8];
      alignas(32) int32_t use[8];
      // the blocks of columns c0 + c + l: one division per 8 columns
      int64_t blk = (c0 + c) / band.bc, in_blk = (c0 + c) % band.bc;
      for (int l = 0; l < 8; ++l, in_blk = in_blk + 1 == band.bc ? (++blk, 0) : in_blk + 1) {
        const uint8_t sc = band.code[blk];
        const ThrBlock* th = band.use[sc] ? &band.thr[sc] : &unused;
        use[l] = band.use[sc] ? -1 : 0;
        lo[l] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(th->t));
        hi[l] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(th->table));
      }
      transpose8x8(lo);
      transpose8x8(hi);
      for (int k = 0; k < 8; ++k) {
        _mm256_store_si256(reinterpret_cast<__m256i*>(lay + (kT + k) * kChunk + c), lo[k]);
        _mm256_store_si256(reinterpret_cast<__m256i*>(lay + (kTab + k) * kChunk + c), hi[k]);
      }
      _mm256_store_si256(reinterpret_cast<__m256i*>(lay + kUse * kChunk + c),
                         _mm256_load_si256(reinterpret_cast<const __m256i*>(use)));
    }
    for (int64_t r = 0; r < band.rows; ++r) {
      const float* x = band.x + r * cols + c0;
      float* vo = values + band.i0 + r * cols + c0;
      uint8_t* co = codes ? codes + band.i0 + r * cols + c0 : nullptr;
      for (int64_t c = 0; c < w; c += 8) {
        const int32_t* l = lay + c;
        auto at = [l](int k) { return _mm256_load_si256(reinterpret_cast<const __m256i*>(l + k * kChunk)); };
        auto atf = [l](int k) { return _mm256_load_ps(reinterpret_cast<const float*>(l + k * kChunk)); };
        const __m256i xi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + c));
        const __m256i ax = _mm256_and_si256(xi, abs_mask);
        // the code counts the thresholds |x| exceeds; x-hat follows the same
        // masks up the table (they are nested: each implies the one before)
        const __m256i m1 = _mm256_cmpgt_epi32(ax, at(kT));
        __m256i code = _mm256_sub_epi32(zero_i, m1);
        __m256 xh = _mm256_blendv_ps(atf(kTab), atf(kTab + 1), _mm256_castsi256_ps(m1));
        for (int k = 1; k < 7; ++k) {
          const __m256i m = _mm256_cmpgt_epi32(ax, at(kT + k));
          code = _mm256_sub_epi32(code, m);
          xh = _mm256_blendv_ps(xh, atf(kTab + k + 1), _mm256_castsi256_ps(m));
        }
        xh = out.store(xi, code, xh, vo + c, co ? co + c : nullptr);
        if (band.stats)
          out.count(_mm256_and_si256(_mm256_cmpgt_epi32(ax, zero_i), at(kUse)), code, m1, xh,
                    _mm256_cmpgt_epi32(ax, at(kSat)));
      }
    }
  }
  // the last columns (fewer than 8) through the scalar core
  RandomBits rng(p.seed, p.stream, 8);  // for core_element; these modes draw no bits
  for (int64_t r = 0; r < band.rows; ++r) {
    for (int64_t c = c8; c < cols; ++c) {
      const uint8_t sc = band.code[c / band.bc];
      if (!band.use[sc]) continue;
      core_element(p, band.consts[sc], band.x + r * cols, band.i0 + r * cols + c, c, codes, values, rng, cnt);
    }
  }
  out.add_to(cnt);
}

}  // namespace

void threshold_row(const QuantPlan& p, const ThrRow& row, uint8_t* codes, float* values, SpanCounts& cnt) {
  if (row.stream) threshold_row_impl<true>(p, row, codes, values, cnt);
  else threshold_row_impl<false>(p, row, codes, values, cnt);
}

void threshold_band_lanes(const QuantPlan& p, const ThrRow& band, uint8_t* codes, float* values, SpanCounts& cnt) {
  if (band.stream) threshold_lanes_impl<true>(p, band, codes, values, cnt);
  else threshold_lanes_impl<false>(p, band, codes, values, cnt);
}

}  // namespace exmy::detail::avx2
EXMY_TARGET_END
#endif

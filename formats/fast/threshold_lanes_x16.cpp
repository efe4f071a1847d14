// The threshold loop with a block per lane (see threshold_band_lanes) in 16
// lanes (AVX-512 F/BW/DQ/VL): Bx1 columns and other block widths that are
// not a multiple of 8. Each lane compares |x| with the thresholds of its own
// column's block, laid out column by column: a ThrBlock is 16 int32, so the
// blocks of 16 columns transpose, as a 16x16 matrix, into 16 vectors, or,
// for Bx1 blocks whose codes span fewer than 32 values, come from a palette
// of the band's ThrBlocks by one permute per vector (and x-hat, where the
// tables allow, from two units per block instead of eight table entries).
// The same decisions and x-hat as the 8-lane form, so the same bits.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "formats/fast/loops.hpp"
#include "formats/fast/target.hpp"
#include "formats/fast/tails.hpp"

#if defined(__x86_64__)
EXMY_TARGET_AVX512
#include <immintrin.h>

#include "formats/fast/thr_step_x16.hpp"

namespace exmy::detail::avx512 {
namespace {

// 16x16 transpose of int32: vector k of the result holds element k of every
// input. Pairs of 32-bit, then of 64-bit elements within each 128-bit lane,
// then the 128-bit lanes across in two steps.
inline void transpose16x16(__m512i r[16]) {
  __m512i t[16], u[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  // u[4i + j], 128-bit lane L: element 4L + j of r[4i .. 4i+3]
  for (int i = 0; i < 4; ++i) {
    u[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
    u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
    u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  // 0x88 takes 128-bit lanes 0 and 2 of each operand, 0xdd lanes 1 and 3
  for (int j = 0; j < 4; ++j) {
    const __m512i va = _mm512_shuffle_i32x4(u[j], u[4 + j], 0x88), vb = _mm512_shuffle_i32x4(u[j], u[4 + j], 0xdd);
    const __m512i wa = _mm512_shuffle_i32x4(u[8 + j], u[12 + j], 0x88);
    const __m512i wb = _mm512_shuffle_i32x4(u[8 + j], u[12 + j], 0xdd);
    r[j] = _mm512_shuffle_i32x4(va, wa, 0x88);
    r[8 + j] = _mm512_shuffle_i32x4(va, wa, 0xdd);
    r[4 + j] = _mm512_shuffle_i32x4(vb, wb, 0x88);
    r[12 + j] = _mm512_shuffle_i32x4(vb, wb, 0xdd);
  }
}

// A ThrBlock's 16 int32 as the layout's fields: thresholds 1..7, the
// saturation threshold, the x-hat table of magnitude codes 0..7 (with units,
// the two units in the first two table fields).
constexpr int kT = 0, kSat = 7, kTab = 8;

// Bx1 blocks (a block per column) whose scale codes span fewer than 32
// values, lo .. lo + 31: fills pal (pal[k][e]: int32 k of the ThrBlock of
// code lo + e, `unused` for codes the loop does not take) and pal_use (1
// where it takes code lo + e), and returns lo; else -1.
int band_palette(const ThrRow& band, const ThrBlock& unused, int32_t (*pal)[32], int32_t* pal_use) {
  if (band.bc != 1) return -1;
  const int64_t n = band.cols;
  __m512i lo_v = _mm512_set1_epi8(-1), hi_v = _mm512_setzero_si512();
  int64_t c = 0;
  for (; c + 64 <= n; c += 64) {
    const __m512i v = _mm512_loadu_si512(band.code + c);
    lo_v = _mm512_min_epu8(lo_v, v);
    hi_v = _mm512_max_epu8(hi_v, v);
  }
  alignas(64) uint8_t l[64], h[64];
  _mm512_store_si512(l, lo_v);
  _mm512_store_si512(h, hi_v);
  int lo = *std::min_element(l, l + 64), hi = *std::max_element(h, h + 64);
  for (; c < n; ++c) lo = std::min<int>(lo, band.code[c]), hi = std::max<int>(hi, band.code[c]);
  if (hi - lo >= 32) return -1;
  for (int e = 0; e < 32; ++e) {
    const int sc = lo + e;
    const bool take = sc <= hi && band.use[sc];
    int32_t f[16];
    std::memcpy(f, take ? &band.thr[sc] : &unused, sizeof f);
    for (int k = 0; k < 16; ++k) pal[k][e] = f[k];
    pal_use[e] = take ? 1 : 0;
  }
  return lo;
}

// x-hat of magnitude code q as pow2[q] times a unit of its block's, one
// unit for each odd part m of the format's magnitudes v = 2^E m (E2M1:
// m = 1 for 0.5, 1, 2, 4 and m = 1.5 for 1.5, 3, 6): the table entry
// fl(v s / t) is 2^E fl(m s / t) wherever that stays a normal float, which
// band_units checks entry by entry. `ok` is false for formats with more
// than two odd parts (E1M2).
struct UnitForm {
  bool ok = true;
  alignas(64) float pow2[16] = {};
  uint32_t second = 0;  // bit q: code q takes the second unit
  int rep[2] = {0, 0};  // a code of each unit (0: none)
};

UnitForm unit_form(const Format& f) {
  UnitForm u;
  double odd[2] = {0.0, 0.0};
  for (uint32_t q = 1; q < 8 && q <= f.max_mag; ++q) {
    const double v = f.mag_value(q);
    if (v == 0.0) continue;
    int e = 0;
    const double m = 2.0 * std::frexp(v, &e);  // v = m 2^(e-1), m in [1, 2)
    int k = 0;
    while (k < 2 && odd[k] != 0.0 && odd[k] != m) ++k;
    if (k == 2) return UnitForm{.ok = false};
    if (odd[k] == 0.0) odd[k] = m, u.rep[k] = static_cast<int>(q);
    u.pow2[q] = static_cast<float>(std::ldexp(1.0, e - 1));
    u.second |= static_cast<uint32_t>(k) << q;
  }
  return u;
}

// The units of the palette's entries (unit[k][e]), when every entry's
// table is pow2[q] times them bit for bit; else false.
bool band_units(const UnitForm& uf, const int32_t (*pal)[32], float (*unit)[32]) {
  if (!uf.ok) return false;
  for (int e = 0; e < 32; ++e) {
    float tab[8];
    for (int q = 0; q < 8; ++q) std::memcpy(&tab[q], &pal[kTab + q][e], sizeof(float));
    for (int k = 0; k < 2; ++k) unit[k][e] = uf.rep[k] ? tab[uf.rep[k]] / uf.pow2[uf.rep[k]] : 0.0f;
    for (int q = 0; q < 8; ++q) {
      const float xh = uf.pow2[q] * unit[(uf.second >> q) & 1][e];
      if (std::memcmp(&xh, &tab[q], sizeof xh) != 0) return false;
    }
  }
  return true;
}

template <bool kStream>
void threshold_lanes_impl(const QuantPlan& p, const ThrRow& band, uint8_t* codes, float* values, SpanCounts& cnt) {
  static_assert(sizeof(ThrBlock) == 16 * sizeof(int32_t), "ThrBlock: t[7], sat, table[8]");
  const int64_t cols = band.cols, c16 = cols & ~int64_t{15};
  // A chunk's layout: arrays of kChunk int32 (thresholds 1..7, saturation,
  // the bits of x-hat for magnitude codes 0..7), small enough for L1 while
  // every row of the band runs through the chunk; and per 16 columns the
  // lanes whose block is the loop's (the others, which the scalar core
  // encodes, take `unused`: thresholds no |x| exceeds, counted nowhere).
  constexpr int64_t kChunk = 256;
  alignas(64) int32_t lay[16 * kChunk];
  __mmask16 use[kChunk / 16];
  ThrBlock unused;
  for (int k = 0; k < 7; ++k) unused.t[k] = std::numeric_limits<int32_t>::max();
  unused.sat = std::numeric_limits<int32_t>::max();
  // Bx1 blocks whose scale codes span fewer than 32 values (a band of
  // Gaussian 16x1 blocks with UE5M3 or E4M3 scales spans about 20-26): the
  // ThrBlocks of those codes as a palette, column e of pal holding code
  // lo + e's, and a chunk's layout is then 16 two-table permutes by the
  // columns' codes per 16 columns instead of 16 lookups, 16 loads and a
  // 16x16 transpose (e2m1/ue5m3 16x1, 256 MiB, two threads, Intel Xeon
  // family 6 model 207: 0.39-0.42 -> 0.36-0.38 ns an element).
  alignas(64) int32_t pal[16][32];
  alignas(64) int32_t pal_use[32];
  const int pal_lo = band_palette(band, unused, pal, pal_use);
  const bool by_palette = pal_lo >= 0;
  // With a palette, x-hat from per-block units where the tables allow
  // (band_units): the layout's eight tables become two units, made and read
  // in a quarter of the permutes and loads (e2m1/ue5m3 16x1, Intel Xeon
  // family 6 model 207, medians of alternated runs: 256 MiB at two threads
  // 0.406 -> 0.398 ns an element, at one 0.809 -> 0.798; in L2 0.556 ->
  // 0.525).
  const UnitForm uf = unit_form(p.fe);
  alignas(64) float pal_unit[2][32];
  const bool by_unit = by_palette && band_units(uf, pal, pal_unit);
  const __m512 pow2_v = _mm512_load_ps(uf.pow2);
  const __m512i second_v = _mm512_set1_epi32(static_cast<int>(uf.second));
  const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff);
  const __m512i zero_i = _mm512_setzero_si512(), one = _mm512_set1_epi32(1);
  ThrStep16<kStream> out(p.fe);
  // (locals: the code stores may alias the band's fields)
  const float* const bx = band.x;
  const int64_t brows = band.rows, bi0 = band.i0;
  const bool stats = band.stats;
  // The next band (as tall as this one), when known, is prefetched in
  // address order, a line of x a step and a line of codes every four: the
  // chunks visit 16 rows in turn, an order that reads DRAM more slowly than
  // one row after another (a stand-alone pass with the same traffic, AMD
  // EPYC family 26: 2574 Me/s in chunk order, 2923 with this prefetch, 3154
  // row after row). Without it, each row's next chunk.
  // The layout's making takes a share of those lines too (one per 16
  // columns, the steps one fewer per `brows`), so that the traffic runs on
  // through it rather than pausing (e2m1/ue5m3 16x1, 256 MiB, Intel Xeon
  // family 6 model 207: docs/benchmarks.md).
  const float* const next_x = band.prefetch;
  const uint8_t* const next_co = next_x && codes ? codes + bi0 + brows * cols : nullptr;
  int64_t line_no = 0;  // the lines of the next band prefetched so far
  auto prefetch_next = [&]() __attribute__((always_inline)) {
    _mm_prefetch(reinterpret_cast<const char*>(next_x + 16 * line_no), _MM_HINT_T0);
    if (next_co && (line_no & 3) == 0)
      _mm_prefetch(reinterpret_cast<const char*>(next_co + 16 * line_no), _MM_HINT_ET0);
    ++line_no;
  };
  int64_t skip = 0;  // steps since the last one without a prefetch, up to brows
  for (int64_t c0 = 0; c0 < c16; c0 += kChunk) {
    const int64_t w = std::min(kChunk, c16 - c0);
    for (int64_t c = 0; by_palette && c < w; c += 16) {
      if (next_x) prefetch_next();
      const __m512i e = _mm512_sub_epi32(
          _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(band.code + c0 + c))),
          _mm512_set1_epi32(pal_lo));
      // (the saturation field and the use mask serve the statistics alone)
      for (int k = 0; k < (by_unit ? kTab : 16); ++k)
        if (k != kSat || stats)
          _mm512_store_si512(lay + k * kChunk + c,
                             _mm512_permutex2var_epi32(_mm512_load_si512(pal[k]), e, _mm512_load_si512(pal[k] + 16)));
      for (int k = 0; by_unit && k < 2; ++k)
        _mm512_store_ps(lay + (kTab + k) * kChunk + c,
                        _mm512_permutex2var_ps(_mm512_load_ps(pal_unit[k]), e, _mm512_load_ps(pal_unit[k] + 16)));
      if (stats)
        use[c / 16] = _mm512_test_epi32_mask(
            _mm512_permutex2var_epi32(_mm512_load_si512(pal_use), e, _mm512_load_si512(pal_use + 16)), one);
    }
    for (int64_t c = 0; !by_palette && c < w; c += 16) {
      if (next_x) prefetch_next();
      __m512i r[16];
      unsigned u = 0;
      // the blocks of columns c0 + c + l: one division per 16 columns
      int64_t blk = (c0 + c) / band.bc, in_blk = (c0 + c) % band.bc;
      for (int l = 0; l < 16; ++l, in_blk = in_blk + 1 == band.bc ? (++blk, 0) : in_blk + 1) {
        const uint8_t sc = band.code[blk];
        const ThrBlock* th = band.use[sc] ? &band.thr[sc] : &unused;
        u |= band.use[sc] ? 1u << l : 0u;
        r[l] = _mm512_loadu_si512(th);
      }
      transpose16x16(r);
      for (int k = 0; k < 16; ++k) _mm512_store_si512(lay + k * kChunk + c, r[k]);
      use[c / 16] = static_cast<__mmask16>(u);
    }
    // the band's rows through the chunk; kUnit: x-hat from the units
    auto rows = [&]<bool kUnit>() __attribute__((always_inline)) {
      for (int64_t rr = 0; rr < brows; ++rr) {
        const float* x = bx + rr * cols + c0;
        float* vo = values + bi0 + rr * cols + c0;
        uint8_t* co = codes ? codes + bi0 + rr * cols + c0 : nullptr;
        // the row's next chunk while this one computes: the band's rows are
        // more streams than the hardware prefetchers follow
        const float* pf = c0 + kChunk < c16 ? x + kChunk : nullptr;
        for (int64_t c = 0; c < w; c += 16) {
          if (pf) {
            _mm_prefetch(reinterpret_cast<const char*>(pf + c), _MM_HINT_T0);
            if (co && (c & 63) == 0) _mm_prefetch(reinterpret_cast<const char*>(co + kChunk + c), _MM_HINT_ET0);
          }
          if (++skip == brows) skip = 0;
          else if (next_x) prefetch_next();
          const int32_t* l = lay + c;
          auto at = [&](int k) { return _mm512_load_si512(l + k * kChunk); };
          const float* tab = reinterpret_cast<const float*>(l + kTab * kChunk);
          const __m512i xi = _mm512_loadu_si512(x + c);
          const __m512i ax = _mm512_and_si512(xi, abs_mask);
          // the code counts the thresholds |x| exceeds; x-hat follows the same
          // masks up the table (they are nested: each implies the one before)
          const __mmask16 m1 = _mm512_cmpgt_epi32_mask(ax, at(kT));
          __m512i code = _mm512_maskz_mov_epi32(m1, one);
          __m512 xh;
          if constexpr (kUnit) {
            for (int k = 1; k < 7; ++k)
              code = _mm512_mask_add_epi32(code, _mm512_cmpgt_epi32_mask(ax, at(kT + k)), code, one);
            const __mmask16 second = _mm512_test_epi32_mask(_mm512_srlv_epi32(second_v, code), one);
            const __m512 unit = _mm512_mask_blend_ps(second, _mm512_load_ps(tab), _mm512_load_ps(tab + kChunk));
            xh = _mm512_mul_ps(_mm512_permutexvar_ps(code, pow2_v), unit);
          } else {
            xh = _mm512_mask_load_ps(_mm512_load_ps(tab), m1, tab + kChunk);
            for (int k = 1; k < 7; ++k) {
              const __mmask16 m = _mm512_cmpgt_epi32_mask(ax, at(kT + k));
              code = _mm512_mask_add_epi32(code, m, code, one);
              xh = _mm512_mask_load_ps(xh, m, tab + (k + 1) * kChunk);
            }
          }
          xh = out.store(xi, code, xh, vo + c, co ? co + c : nullptr);
          if (stats)
            out.count(_mm512_cmpgt_epi32_mask(ax, zero_i) & use[c / 16], code, m1, xh,
                      _mm512_cmpgt_epi32_mask(ax, at(kSat)));
        }
      }
    };
    if (by_unit) rows.template operator()<true>();
    else rows.template operator()<false>();
  }
  out.add_to(cnt);
  // the last columns (fewer than 16) through the scalar core
  RandomBits rng(p.seed, p.stream, 8);  // for core_element; these modes draw no bits
  for (int64_t rr = 0; rr < band.rows; ++rr) {
    for (int64_t c = c16; c < cols; ++c) {
      const uint8_t sc = band.code[c / band.bc];
      if (!band.use[sc]) continue;
      core_element(p, band.consts[sc], band.x + rr * cols, band.i0 + rr * cols + c, c, codes, values, rng, cnt);
    }
  }
}

}  // namespace

void threshold_band_lanes(const QuantPlan& p, const ThrRow& band, uint8_t* codes, float* values, SpanCounts& cnt) {
  (band.stream ? threshold_lanes_impl<true> : threshold_lanes_impl<false>)(p, band, codes, values, cnt);
}

}  // namespace exmy::detail::avx512
EXMY_TARGET_END
#endif

// The threshold loop (see ThrBlock) in 16 lanes (AVX-512 F/BW/DQ/VL), for
// blocks whose width is a multiple of 16: per block, the magnitude code is
// the count of thresholds |x| exceeds, x-hat its entry of the block's table.
// The same decisions as the 8-lane form, so the same bits.
#include <algorithm>
#include <vector>

#include "formats/fast/loops.hpp"
#include "formats/fast/target.hpp"
#include "formats/fast/tails.hpp"

#if defined(__x86_64__)
EXMY_TARGET_AVX512
#include <immintrin.h>

#include "formats/fast/thr_step_x16.hpp"
#include "formats/fast/threshold_walk.hpp"

namespace exmy::detail::avx512 {
namespace {

// A block's thresholds and its table. The magnitude code (the count of
// thresholds |x| exceeds; they do not decrease) by bisection, as the
// device's detail::thresholds_exceeded: |x| > t3 decides 4, then t1 or t5
// (a lane's own, picked from tv) 2, then t0, t2, t4 or t6 1: three
// comparisons and two lane permutations in place of seven comparisons and
// additions (docs/benchmarks.md, "What was tried").
struct ThrConsts16 {
  __m512i tv, t3, t0, sat;
  __m512 table;
  __attribute__((always_inline)) explicit ThrConsts16(const ThrBlock& th)
      : tv(_mm512_zextsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(th.t)))),  // t0..t6 (and sat)
        t3(_mm512_set1_epi32(th.t[3])),
        t0(_mm512_set1_epi32(th.t[0])),
        sat(_mm512_set1_epi32(th.sat)),
        // codes are at most 7: the table's upper half (zeros) is never indexed
        table(_mm512_zextps256_ps512(_mm256_loadu_ps(th.table))) {}
};

// One 16-lane step: the codes and x-hat of x[0..16) under a block's
// constants c, stored and counted.
template <bool kStream>
__attribute__((always_inline)) inline void thr_step16(ThrStep16<kStream>& out, const ThrConsts16& c, const float* x,
                                                      float* vo, uint8_t* co, bool stats) {
  const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff);
  const __m512i zero_i = _mm512_setzero_si512(), one = _mm512_set1_epi32(1), two = _mm512_set1_epi32(2),
                four = _mm512_set1_epi32(4);
  const __m512i xi = _mm512_loadu_si512(x);
  const __m512i ax = _mm512_and_si512(xi, abs_mask);
  __m512i code = _mm512_maskz_mov_epi32(_mm512_cmpgt_epi32_mask(ax, c.t3), four);
  code = _mm512_mask_add_epi32(code, _mm512_cmpgt_epi32_mask(ax, _mm512_permutexvar_epi32(_mm512_or_si512(code, one),
                                                                                             c.tv)),
                               code, two);
  code = _mm512_mask_add_epi32(code, _mm512_cmpgt_epi32_mask(ax, _mm512_permutexvar_epi32(code, c.tv)), code, one);
  const __m512 xh = out.store(xi, code, _mm512_permutexvar_ps(code, c.table), vo, co);
  if (stats)
    out.count(_mm512_cmpgt_epi32_mask(ax, zero_i), code, _mm512_cmpgt_epi32_mask(ax, c.t0), xh,
              _mm512_cmpgt_epi32_mask(ax, c.sat));
}

// Rows of whole blocks (widths a multiple of 16 that divide the row): with
// a block of one or two steps, the walk's per-block work (its bounds, the
// tail test, the step loop's set-up) is most of the cost; here the row's
// fields are locals and the blocks a plain loop.
template <bool kStream>
void threshold_whole_blocks(const ThrRow& row, uint8_t* codes, float* values, ThrStep16<kStream>& out) {
  const float* const x = row.x;
  const float* const pf = row.prefetch;
  const bool half = row.prefetch_half;
  const uint8_t* const code = row.code;
  const uint8_t* const use = row.use;
  const ThrBlock* const thr = row.thr;
  float* const vo = values + row.i0;
  uint8_t* const co = codes ? codes + row.i0 : nullptr;
  const bool stats = row.stats;
  const int64_t bc = row.bc, nb = row.cols / bc;
  // kSteps: the steps a block (the recipes' widths, 16 and 32, as fixed
  // counts: no inner loop), or 0 for bc / 16 at run time
  auto blocks = [&]<int kSteps>() __attribute__((always_inline)) {
    const int64_t steps = kSteps ? kSteps : bc / 16;
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t sc = code[b];
      if (!use[sc]) continue;
      const ThrConsts16 c(thr[sc]);
      for (int64_t k = 0; k < steps; ++k) {
        const int64_t j = 16 * (steps * b + k);
        if (pf) prefetch_next_line(pf, half, j);
        thr_step16(out, c, x + j, vo + j, co ? co + j : nullptr, stats);
      }
    }
  };
  if (bc == 16) blocks.template operator()<1>();
  else if (bc == 32) blocks.template operator()<2>();
  else blocks.template operator()<0>();
}

template <bool kStream>
void threshold_row_impl(const QuantPlan& p, const ThrRow& row, uint8_t* codes, float* values, SpanCounts& cnt) {
  ThrStep16<kStream> out(p.fe);
  if (row.bc % 16 == 0 && row.cols % row.bc == 0) {
    threshold_whole_blocks(row, codes, values, out);
  } else {
    walk_threshold_row(p, row, codes, values, cnt, [&](const ThrBlock& th, const float* x, int64_t i0, int64_t n) {
      const ThrConsts16 c(th);
      int64_t j = 0;
      for (; j + 16 <= n; j += 16) thr_step16(out, c, x + j, values + i0 + j, codes ? codes + i0 + j : nullptr, row.stats);
      return j;
    });
  }
  out.add_to(cnt);
}

}  // namespace

void threshold_row(const QuantPlan& p, const ThrRow& row, uint8_t* codes, float* values, SpanCounts& cnt) {
  (row.stream ? threshold_row_impl<true> : threshold_row_impl<false>)(p, row, codes, values, cnt);
}

}  // namespace exmy::detail::avx512
EXMY_TARGET_END
#endif

// The 8-lane float32 multiply-and-convert loop for FP4-class formats (at
// most 8 magnitudes), every rounding mode, per block or with a block per
// lane, and the per-block constants it needs (fp4_blocks).
#include <cmath>
#include <cstddef>
#include <cstring>
#include <vector>

#include "formats/fast/loops.hpp"
#include "formats/fast/target.hpp"
#include "formats/fast/tails.hpp"

#if defined(__x86_64__)
EXMY_TARGET_AVX2
#include "formats/fast/avx2_lanes.hpp"

namespace exmy::detail::avx2 {
namespace {

// Random bits of the 8 elements i .. i+7 from the words of their row
// (w[k] is word j0 + k); i is a multiple of 4 when n <= 8, of 2 when n <= 16.
inline __m256i random8(const uint32_t* w, uint64_t j0, uint64_t i, int n) {
  if (n <= 8) {
    const uint32_t* p = w + ((i >> 2) - j0);
    long long both;
    std::memcpy(&both, p, 8);
    const __m256i b = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(both));
    return _mm256_srl_epi32(b, _mm_cvtsi32_si128(8 - n));
  }
  if (n <= 16) {
    const __m256i b = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + ((i >> 1) - j0))));
    return _mm256_srl_epi32(b, _mm_cvtsi32_si128(16 - n));
  }
  return _mm256_srl_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + (i - j0))), _mm_cvtsi32_si128(32 - n));
}

// Strides and offsets, in floats, of the per-block constants that
// fp4x8_impl's block-per-lane form gathers.
constexpr int kVbStride = sizeof(Fp4Block) / sizeof(float);
constexpr int kVbTable = offsetof(Fp4Block, table) / sizeof(float);
constexpr int kBcStride = sizeof(BlockConsts) / sizeof(float);
constexpr int kBcMb = offsetof(BlockConsts, mb) / sizeof(float);
static_assert(sizeof(Fp4Block) % sizeof(float) == 0 && offsetof(Fp4Block, r) == 0 &&
                  sizeof(BlockConsts) % sizeof(float) == 0 && offsetof(BlockConsts, mb) % sizeof(float) == 0,
              "block constants gathered as float lanes");

// The block index of each of `cols` columns in blocks of `bc` columns, kept
// per thread for the last shape asked (one table for every instantiation of
// fp4x8_impl).
const int32_t* column_blocks(int64_t cols, int64_t bc) {
  thread_local std::vector<int32_t> map;
  thread_local int64_t for_cols = -1, for_bc = -1;
  if (for_cols != cols || for_bc != bc) {
    map.resize(static_cast<size_t>(cols));
    for (int64_t j = 0; j < cols; ++j) map[static_cast<size_t>(j)] = static_cast<int32_t>(j / bc);
    for_cols = cols;
    for_bc = bc;
  }
  return map.data();
}

// The 8-lane loop of one row. Per block (kLanes false): a block's constants
// are broadcast and its 8-element steps run, the last partial step left to
// the scalar core. With a block per lane (kLanes true, for block widths that
// are not a multiple of 8, Bx1 columns above all): the steps run along the
// whole row and each lane gathers the multiplier and x-hat of its own block.
template <Round MODE, Arith ARITH, bool kLanes>
void fp4x8_impl(const QuantPlan& p, const Fp4Row& row, uint8_t* codes, float* values, RandomBits& rng,
                SpanCounts& cnt) {
  const Format& f = p.fe;
  constexpr bool kSR = is_stochastic(MODE);
  constexpr bool kExact = ARITH == Arith::exact;
  const int h = kSR ? p.sr_bits : 0;
  // Random words come 8 lanes at a time only from aligned starts.
  const int64_t align = h <= 8 ? 4 : h <= 16 ? 2 : 1;

  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256 sign_mask = _mm256_castsi256_ps(_mm256_set1_epi32(static_cast<int>(0x80000000u)));
  const __m256 vmax = _mm256_set1_ps(static_cast<float>(f.max));
  const __m256 vt = _mm256_set1_ps(p.t);
  const __m256 inf = _mm256_set1_ps(INFINITY);
  const __m256 tiny = _mm256_set1_ps(std::ldexp(1.0f, -100));
  const __m256 tol_rel = _mm256_set1_ps(std::ldexp(1.0f, -22));
  const __m256 zero = _mm256_setzero_ps();
  // in biased exponents: ee_b = max(exponent field, emin + 127) and
  // Ws = v * 2^(h+1+M-ee) = v * 2^((h+1+M+254 - ee_b) - 127)
  const __m256i emin_b = _mm256_set1_epi32(f.emin + 127);
  const __m256i shift_b = _mm256_set1_epi32(h + 1 + f.M + 254);
  const __m256i shift_rne = _mm256_set1_epi32(f.M + 254);
  // rne in fp32 arithmetic: v is exact, so the hardware's conversion rounds it
  constexpr bool kCvtRne = MODE == Round::rne;
  const __m256 half = _mm256_set1_ps(0.5f);
  const __m128i cnt_h1 = _mm_cvtsi32_si128(h + 1);
  const __m128i cnt_M = _mm_cvtsi32_si128(f.M);
  const __m256i Fmask = _mm256_set1_epi32((1 << (h + 1)) - 1);
  const __m256i zero_i = _mm256_setzero_si256();
  const __m256i max_mag = _mm256_set1_epi32(static_cast<int>(f.max_mag));
  const __m256i sub_lim = _mm256_set1_epi32(1 << f.M);
  const __m256i sign_bit = _mm256_set1_epi32(static_cast<int>(f.sign_bit));
  const __m256i two_n_m1 = _mm256_set1_epi32((1 << h) - 1);
  const __m256i two_n1_m1 = _mm256_set1_epi32((2 << h) - 1);
  const int cb = f.code_bytes();
  const __m256i all_ones = _mm256_set1_epi32(-1);
  __m256i acc_sat = zero_i, acc_sub = zero_i, acc_nz = zero_i, acc_uf = zero_i;
  // Stochastic modes: the Philox words of the whole row (fp4_row_words).
  thread_local std::vector<uint32_t> words;
  uint64_t wj0 = 0;
  if constexpr (kSR) wj0 = fp4_row_words(p, row, rng, h, words);

  // Lanes the scalar core must redo, collected here and redone after the
  // loop: a function call inside the loop would make the compiler keep the
  // vector state in memory (every ymm register is caller-saved).
  using Pending = Fp4Pending;
  thread_local std::vector<Pending> pending;
  pending.resize(static_cast<size_t>(row.cols / 8 + 2 * row.nblocks + 2));
  size_t np = 0;

  // kLanes: each column's block index, and, where some blocks are not the
  // loop's, a use flag per block.
  const int32_t* col_block = kLanes ? column_blocks(row.cols, row.bc) : nullptr;
  thread_local std::vector<int32_t> use32;
  bool all_used = true;
  if constexpr (kLanes) {
    all_used = std::memchr(row.use, 0, static_cast<size_t>(row.nblocks)) == nullptr;
    if (!all_used) {
      use32.resize(static_cast<size_t>(row.nblocks));
      for (int64_t b = 0; b < row.nblocks; ++b) use32[static_cast<size_t>(b)] = row.use[b] ? -1 : 0;
    }
  }
  const float* vb_base = reinterpret_cast<const float*>(row.vb);
  const float* bc_base = reinterpret_cast<const float*>(row.consts);

  for (int64_t b = 0; b < (kLanes ? 1 : row.nblocks); ++b) {
  const int64_t key = kLanes ? b : row.key(b);
  if (!kLanes && !row.use[key]) continue;
  const BlockConsts& c = row.consts[key];
  const Fp4Block& vb = row.vb[key];
  const __m256 vr = _mm256_set1_ps(vb.r);
  const __m256 vmb = _mm256_set1_ps(c.mb);
  const __m256 table = _mm256_loadu_ps(vb.table);
  const int64_t i0 = kLanes ? row.i0 : row.i0 + b * row.bc;
  const int64_t n = kLanes ? row.cols : std::min(row.bc, row.cols - b * row.bc);
  const float* x = kLanes ? row.x : row.x + b * row.bc;
  if (!kLanes && row.prefetch) prefetch_next_lines(row.prefetch, row.prefetch_half, b * row.bc, n);
  // One step: elements j .. j+7 of the block (kLanes: of the row).
  auto step = [&](int64_t j) __attribute__((always_inline)) {
    __m256i bidx = zero_i;
    __m256 vr_l = vr, vmb_l = vmb;
    __m256 in_use = _mm256_castsi256_ps(all_ones);  // kLanes: the lanes whose block is the loop's
    if constexpr (kLanes) {
      bidx = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(col_block + j));
      if constexpr (kExact) {
        vr_l = _mm256_i32gather_ps(vb_base, _mm256_mullo_epi32(bidx, _mm256_set1_epi32(kVbStride)), 4);
      } else {
        vmb_l = _mm256_i32gather_ps(bc_base + kBcMb, _mm256_mullo_epi32(bidx, _mm256_set1_epi32(kBcStride)), 4);
      }
      if (!all_used) in_use = _mm256_castsi256_ps(_mm256_i32gather_epi32(use32.data(), bidx, 4));
    }
    const __m256 x8 = _mm256_loadu_ps(x + j);
    const __m256 xs = _mm256_and_ps(x8, sign_mask);
    const __m256i negi = _mm256_srai_epi32(_mm256_castps_si256(x8), 31);
    __m256 v;
    __m256 unsure;
    if constexpr (kExact) {
      v = _mm256_mul_ps(_mm256_and_ps(x8, abs_mask), vr_l);
      // tiny (float-subnormal, or underflowed to 0) products of non-zero x
      // lose precision: let the core decide
      unsure = _mm256_and_ps(_mm256_cmp_ps(v, tiny, _CMP_LT_OQ), _mm256_cmp_ps(x8, zero, _CMP_NEQ_UQ));
    } else {
      v = _mm256_and_ps(_mm256_mul_ps(x8, p.has_scale ? vmb_l : vt), abs_mask);
      unsure = zero;
    }
    unsure = _mm256_or_ps(unsure, _mm256_cmp_ps(v, inf, _CMP_NLT_UQ));
    if (!f.is_signed) unsure = _mm256_or_ps(unsure, _mm256_castsi256_ps(negi));

    // biased exponents (v >= 0, so the shift leaves just the exponent field)
    const __m256i ee = _mm256_max_epi32(_mm256_srli_epi32(_mm256_castps_si256(v), 23), emin_b);
    const __m256 p2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_sub_epi32(shift_b, ee), 23));
    __m256i kk;  // index of the result inside the binade ee, may reach 2^(M+1)
    if constexpr (kCvtRne) {
      // The conversion rounds v * 2^(M-ee) once, to nearest even: with M >= 1
      // the parity of the index is the parity of the code, so this is the
      // rne of docs/numerics.md §2 (exmy never changes MXCSR's rounding mode). In fp32
      // arithmetic v is exact; in exact arithmetic the only decision points
      // of rne are the ties, so lanes near a tie go to the scalar core.
      const __m256 Wr = _mm256_mul_ps(v, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_sub_epi32(shift_rne, ee), 23)));
      kk = _mm256_cvtps_epi32(Wr);
      if constexpr (kExact) {
        const __m256 d = _mm256_and_ps(_mm256_sub_ps(Wr, _mm256_cvtepi32_ps(kk)), abs_mask);
        const __m256 off_tie = _mm256_and_ps(_mm256_sub_ps(d, half), abs_mask);
        unsure = _mm256_or_ps(unsure, _mm256_cmp_ps(off_tie, _mm256_mul_ps(Wr, tol_rel), _CMP_LE_OQ));
      }
    } else {
      const __m256 Ws = _mm256_mul_ps(v, p2);
      // W = floor(Ws) (Ws >= 0 and below 2^22: truncation), its fraction exact
      const __m256i W = _mm256_cvttps_epi32(Ws);
      const __m256 frac = _mm256_sub_ps(Ws, _mm256_cvtepi32_ps(W));
      if constexpr (kExact) {
        // Within Ws * 2^-22 of an integer, v's error (two roundings, about
        // 2^-23 of v) may move floor(Ws): the core decides, by |frac - 1/2|
        // >= 1/2 - Ws * 2^-22 (the 16-lane form's test: fp4x16_loop.cpp).
        // (v = 0 with x != 0 is unsure as tiny already.)
        const __m256 off_half = _mm256_and_ps(_mm256_sub_ps(frac, half), abs_mask);
        const __m256 near = _mm256_cmp_ps(off_half, _mm256_fnmadd_ps(Ws, tol_rel, half), _CMP_GE_OQ);
        unsure = _mm256_or_ps(unsure, _mm256_and_ps(near, _mm256_cmp_ps(x8, zero, _CMP_NEQ_UQ)));
      }
      const __m256i k = _mm256_srl_epi32(W, cnt_h1);
      const __m256i F = _mm256_and_si256(W, Fmask);
      const __m256i sticky = _mm256_castps_si256(_mm256_cmp_ps(frac, zero, _CMP_NEQ_UQ));
      __m256i r = zero_i;
      if constexpr (kSR) {
        const uint64_t i = static_cast<uint64_t>(i0 + j), g = rng.first() + i;
        if ((g & static_cast<uint64_t>(align - 1)) == 0) {  // align is 1, 2 or 4
          r = random8(words.data(), wj0, g, h);
        } else {
          alignas(32) uint32_t rr[8];
          for (int l = 0; l < 8; ++l) rr[l] = rng(i + l);
          r = _mm256_load_si256(reinterpret_cast<const __m256i*>(rr));
        }
      }
      if constexpr (MODE == Round::stochastic_fast) {
        // away exactly when F + 2r + 1 carries into bit h+1 (F + 2r + 1 <
        // 2^(h+2)): k + away in one sum
        kk = _mm256_srl_epi32(_mm256_add_epi32(_mm256_add_epi32(W, _mm256_add_epi32(r, r)), _mm256_set1_epi32(1)),
                              cnt_h1);
      } else if constexpr (MODE == Round::stochastic_fastest) {
        // away exactly when F/2 + r carries into bit h (F/2 + r < 2^(h+1))
        kk = _mm256_srl_epi32(_mm256_add_epi32(_mm256_srli_epi32(W, 1), r), _mm_cvtsi32_si128(h));
      } else {
        const __m256i away = away_from_zero<MODE, Lanes32>(k, F, sticky, negi, r, two_n_m1, two_n1_m1);
        kk = _mm256_sub_epi32(k, away);  // away lanes are -1
      }
    }
    __m256i code = _mm256_add_epi32(_mm256_sll_epi32(_mm256_sub_epi32(ee, emin_b), cnt_M), kk);
    code = _mm256_min_epi32(code, max_mag);
    __m256 xh;
    if constexpr (kLanes) {
      // (the low 3 bits, as the permute takes them: lanes left to the scalar
      // core may hold any code)
      const __m256i at = _mm256_add_epi32(_mm256_mullo_epi32(bidx, _mm256_set1_epi32(kVbStride)),
                                          _mm256_and_si256(code, _mm256_set1_epi32(7)));
      xh = _mm256_i32gather_ps(vb_base + kVbTable, at, 4);
    } else {
      xh = _mm256_permutevar8x32_ps(table, code);
    }
    if (f.is_signed) {
      xh = _mm256_or_ps(xh, xs);
      code = _mm256_or_si256(code, _mm256_and_si256(negi, sign_bit));
    }
    _mm256_storeu_ps(values + i0 + j, xh);
    if (codes) {
      const __m128i p16 = _mm_packus_epi32(_mm256_castsi256_si128(code), _mm256_extracti128_si256(code, 1));
      if (cb == 1) _mm_storel_epi64(reinterpret_cast<__m128i*>(codes + i0 + j), _mm_packus_epi16(p16, p16));
      else _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + 2 * (i0 + j)), p16);
    }
    if (row.stats) {
      if constexpr (kCvtRne && kExact) {
        // the saturation count compares with max, itself no rne decision point
        const __m256 dm = _mm256_and_ps(_mm256_sub_ps(v, vmax), abs_mask);
        unsure = _mm256_or_ps(unsure, _mm256_cmp_ps(dm, _mm256_mul_ps(v, tol_rel), _CMP_LE_OQ));
      }
      const __m256 above = _mm256_cmp_ps(v, vmax, _CMP_GT_OQ);
      const __m256i mag = _mm256_andnot_si256(sign_bit, code);
      const __m256i is_sub = _mm256_and_si256(_mm256_cmpgt_epi32(sub_lim, mag), _mm256_cmpgt_epi32(mag, zero_i));
      // counts of the certain lanes, accumulated as -1 per lane
      const __m256i oki = _mm256_castps_si256(_mm256_andnot_ps(unsure, in_use));
      const __m256i nzi = _mm256_castps_si256(_mm256_cmp_ps(x8, zero, _CMP_NEQ_UQ));
      const __m256i zi = _mm256_castps_si256(_mm256_cmp_ps(xh, zero, _CMP_EQ_OQ));
      acc_sat = _mm256_add_epi32(acc_sat, _mm256_and_si256(_mm256_castps_si256(above), oki));
      acc_sub = _mm256_add_epi32(acc_sub, _mm256_and_si256(is_sub, oki));
      acc_nz = _mm256_add_epi32(acc_nz, _mm256_and_si256(nzi, oki));
      acc_uf = _mm256_add_epi32(acc_uf, _mm256_and_si256(_mm256_and_si256(nzi, zi), oki));
    }
    const int um = _mm256_movemask_ps(_mm256_and_ps(unsure, in_use));
    if (um) pending[np++] = Pending{b, j, static_cast<uint32_t>(um)};
  };
  int64_t j = 0;
  if (n == 16) {  // the common 1x16 / 16x16 block row: two independent steps, unrolled
    step(0);
    step(8);
    j = 16;
  } else {
    for (; j + 8 <= n; j += 8) step(j);
  }
  if (j < n) pending[np++] = Pending{b, j, (1u << (n - j)) - 1u};  // the tail (fewer than 8)
  }
  if constexpr (kLanes) {  // q.j counts from the row's start; lanes of other blocks are not ours
    for (size_t k = 0; k < np; ++k) {
      const Pending& q = pending[k];
      for (int l = 0; l < 8; ++l) {
        const int64_t col = q.j + l, blk = col / row.bc;
        if ((q.mask & (1u << l)) && row.use[blk])
          core_element(p, row.consts[blk], row.x, row.i0 + col, col, codes, values, rng, cnt);
      }
    }
  } else {
    fp4_redo_pending(p, row, pending, np, 8, codes, values, rng, words.data(), wj0, cnt);
  }
  // lane sums stay below 2^31: a row is far shorter than 2^31 elements
  cnt.saturated += hsum_neg(acc_sat);
  cnt.subnormal += hsum_neg(acc_sub);
  cnt.nonzero += hsum_neg(acc_nz);
  cnt.underflow += hsum_neg(acc_uf);
}

template <Arith A, bool L>
void fp4x8_by_mode(const QuantPlan& p, const Fp4Row& row, uint8_t* codes, float* values, RandomBits& rng,
                    SpanCounts& cnt) {
  with_round(p.round, [&](auto r) { fp4x8_impl<decltype(r)::value, A, L>(p, row, codes, values, rng, cnt); });
}

}  // namespace

void fp4x8_row(const QuantPlan& p, const Fp4Row& row, uint8_t* codes, float* values, RandomBits& rng, SpanCounts& cnt) {
  // a block per lane where the per-block steps would leave whole blocks, or
  // their ends, to the scalar core
  const bool lanes = row.bc % 8 != 0 && row.nblocks > 1;
  if (p.arith == Arith::exact) {
    if (lanes) fp4x8_by_mode<Arith::exact, true>(p, row, codes, values, rng, cnt);
    else fp4x8_by_mode<Arith::exact, false>(p, row, codes, values, rng, cnt);
  } else {
    if (lanes) fp4x8_by_mode<Arith::fp32, true>(p, row, codes, values, rng, cnt);
    else fp4x8_by_mode<Arith::fp32, false>(p, row, codes, values, rng, cnt);
  }
}

void fp4_blocks(const QuantPlan& p, const Fp4Magnitudes& m, const BlockConsts* c, int64_t n, Fp4Block* out) {
  const bool exact = p.arith == Arith::exact;
  const __m256d t = _mm256_set1_pd(p.t);
  const __m256d lo = _mm256_set1_pd(std::ldexp(1.0, -126)), hi = _mm256_set1_pd(std::ldexp(1.0, 126));
  int64_t j = 0;
  if (!exact && p.has_scale) {
    // fp32 arithmetic: table[q] = fl(fl(q * s) * Ginv). When s is a float,
    // the float product q * s rounds the exact product once, as the double
    // product (exact) converted to float does: eight lanes, two multiplies.
    const __m256 mags = _mm256_loadu_ps(m.mag), g8 = _mm256_set1_ps(p.ginv);
    for (; j < n; ++j) {
      Fp4Block& o = out[j];
      o.r = 1.0f;
      o.ok = true;
      const float sf = static_cast<float>(c[j].s);
      if (static_cast<double>(sf) == c[j].s) {
        _mm256_storeu_ps(o.table, _mm256_mul_ps(_mm256_mul_ps(mags, _mm256_set1_ps(sf)), g8));
      } else {
        for (uint32_t q = 0; q < 8; ++q) o.table[q] = q <= p.fe.max_mag ? dequant(p, c[j], q) : 0.0f;
      }
    }
    return;
  }
  // Below: exact arithmetic, or no block scale (then q / t is the table in
  // both arithmetics).
  for (; j + 4 <= n; j += 4) {
    const __m256d s = p.has_scale ? _mm256_set_pd(c[j + 3].s, c[j + 2].s, c[j + 1].s, c[j].s) : _mm256_set1_pd(1.0);
    alignas(16) float rr[4] = {0, 0, 0, 0};
    int okm = 0xf;
    if (exact) {
      // r = fl(t / s); it must be a normal float32 for the uncertainty rule
      const __m256d r = p.has_scale ? _mm256_div_pd(t, s) : t;
      okm = _mm256_movemask_pd(_mm256_and_pd(_mm256_cmp_pd(r, lo, _CMP_GE_OQ), _mm256_cmp_pd(r, hi, _CMP_LE_OQ)));
      _mm_store_ps(rr, _mm256_cvtpd_ps(r));
    }
    // x-hat of each odd part, rounded to odd: rto(odd * s / t)
    __m256d y[8] = {};
    for (int k = 0; k < m.nodd; ++k) {
      const __m256d num = _mm256_mul_pd(_mm256_set1_pd(m.odd[k]), s);
      const __m256d q = _mm256_div_pd(num, t);
      const __m256d rem = _mm256_fnmadd_pd(q, t, num);
      __m256i b = _mm256_castpd_si256(q);
      b = _mm256_add_epi64(b, _mm256_castpd_si256(_mm256_cmp_pd(rem, _mm256_setzero_pd(), _CMP_LT_OQ)));
      b = _mm256_or_si256(b, _mm256_and_si256(_mm256_castpd_si256(_mm256_cmp_pd(rem, _mm256_setzero_pd(), _CMP_NEQ_UQ)),
                                              _mm256_set1_epi64x(1)));
      y[k] = _mm256_castsi256_pd(b);
    }
    alignas(16) float tab[8][4];
    for (int q = 0; q < 8; ++q) {
      if (m.idx[q] < 0) {
        _mm_store_ps(tab[q], _mm_setzero_ps());
        continue;
      }
      // scaling a rounded-to-odd double by a power of two keeps it rounded to odd
      const __m256d v = _mm256_mul_pd(y[m.idx[q]], _mm256_set1_pd(m.pw[q]));
      _mm_store_ps(tab[q], _mm256_cvtpd_ps(v));
    }
    for (int l = 0; l < 4; ++l) {
      Fp4Block& o = out[j + l];
      o.r = exact ? rr[l] : 1.0f;
      o.ok = !exact || ((okm >> l) & 1);
      for (int q = 0; q < 8; ++q) o.table[q] = tab[q][l];
    }
  }
  for (; j < n; ++j) {
    Fp4Block& o = out[j];
    if (p.arith == Arith::exact) {
      const double r = p.has_scale ? static_cast<double>(p.t) / c[j].s : static_cast<double>(p.t);
      o.r = static_cast<float>(r);
      o.ok = r >= std::ldexp(1.0, -126) && r <= std::ldexp(1.0, 126);
    }
    for (uint32_t q = 0; q < 8; ++q) o.table[q] = q <= p.fe.max_mag ? dequant(p, c[j], q) : 0.0f;
  }
}
}  // namespace exmy::detail::avx2
EXMY_TARGET_END
#endif

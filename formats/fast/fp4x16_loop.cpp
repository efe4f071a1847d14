// The FP4 multiply-and-convert loop (see fp4x8_loop.cpp) in 16 lanes
// (AVX-512 F/BW/DQ/VL), per block, for blocks whose width is a multiple of
// 16: every rounding mode, both arithmetics. Each lane computes the 8-lane
// form's float32 values and decisions; the lanes whose decision v's rounding
// could change (the same margin, tested with mask compares), and the last
// partial step of a row, go to the scalar core, so the bits are the same.
#include <cmath>
#include <cstring>
#include <vector>

#include "formats/fast/loops.hpp"
#include "formats/fast/target.hpp"
#include "formats/fast/tails.hpp"

#if defined(__x86_64__)
EXMY_TARGET_AVX512
#include <immintrin.h>

#include "formats/fast/thr_step_x16.hpp"

namespace exmy::detail::avx512 {
namespace {

// Random bits of the 16 elements i .. i+15 from the words of their row
// (w[k] is word j0 + k), a word's share per element kW = 8, 16 or 32 bits
// of which the low n are drawn (shift: kW - n); i is a multiple of 4 when
// kW = 8, of 2 when kW = 16.
template <int kW>
inline __m512i random16_w(const uint32_t* w, uint64_t j0, uint64_t i, __m512i shift) {
  if constexpr (kW == 8) {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + ((i >> 2) - j0)));
    return _mm512_srlv_epi32(_mm512_cvtepu8_epi32(b), shift);
  } else if constexpr (kW == 16) {
    return _mm512_srlv_epi32(
        _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + ((i >> 1) - j0)))), shift);
  } else {
    return _mm512_srlv_epi32(_mm512_loadu_si512(w + (i - j0)), shift);
  }
}

// The same with n bits drawn known only at run time.
inline __m512i random16(const uint32_t* w, uint64_t j0, uint64_t i, int n) {
  if (n <= 8) return random16_w<8>(w, j0, i, _mm512_set1_epi32(8 - n));
  if (n <= 16) return random16_w<16>(w, j0, i, _mm512_set1_epi32(16 - n));
  return random16_w<32>(w, j0, i, _mm512_set1_epi32(32 - n));
}

// docs/numerics.md §2's decision to round a magnitude away from zero (the
// 8-lane away_from_zero as a lane mask): k the index of the lower
// neighbour, F the h+1 bits below it, sticky the lanes with bits lost below
// F, neg the negative inputs, r the lane's h random bits. (stochastic_fast
// and _fastest need no mask: the step adds their carry to k directly.)
template <Round MODE>
inline __mmask16 away_mask(__m512i k, __m512i F, __mmask16 sticky, __mmask16 neg, __m512i r, __m512i two_n_m1) {
  const __m512i zero = _mm512_setzero_si512(), one = _mm512_set1_epi32(1);
  const __mmask16 Fnz = _mm512_cmpgt_epi32_mask(F, zero);
  const __mmask16 inexact = Fnz | sticky;
  const __mmask16 lo_odd = _mm512_test_epi32_mask(k, one);
  if constexpr (MODE == Round::rne) {
    return Fnz & (sticky | lo_odd);
  } else if constexpr (MODE == Round::rna) {
    return Fnz;
  } else if constexpr (MODE == Round::rtz) {
    return 0;
  } else if constexpr (MODE == Round::up) {
    return static_cast<__mmask16>(~neg & inexact);
  } else if constexpr (MODE == Round::down) {
    return neg & inexact;
  } else if constexpr (MODE == Round::odd) {
    return static_cast<__mmask16>(~lo_odd & inexact);
  } else if constexpr (MODE == Round::stochastic) {
    // round F/2 to nearest even, then away when that plus r reaches 2^h
    const __m512i jj = _mm512_srli_epi32(F, 1);
    const __mmask16 F_odd = _mm512_test_epi32_mask(F, one);
    const __mmask16 j_odd = _mm512_test_epi32_mask(jj, one);
    const __m512i rn = _mm512_mask_add_epi32(jj, F_odd & (sticky | j_odd), jj, one);
    return _mm512_cmpgt_epi32_mask(_mm512_add_epi32(rn, r), two_n_m1);
  } else {
    static_assert(MODE == Round::stochastic, "stochastic_fast and _fastest add their carry in the step");
    return 0;
  }
}

// kLean: streamed values, one-byte codes, no statistics (the large calls'
// case), known at compile time.
template <Round MODE, Arith ARITH, bool kLean>
void fp4x16_impl(const QuantPlan& p, const Fp4Row& row, uint8_t* codes, float* values, RandomBits& rng,
                 SpanCounts& cnt) {
  const Format& f = p.fe;
  constexpr bool kSR = is_stochastic(MODE);
  constexpr bool kExact = ARITH == Arith::exact;
  constexpr bool kCvtRne = MODE == Round::rne;
  const int h = kSR ? p.sr_bits : 0;
  const int64_t align = h <= 8 ? 4 : h <= 16 ? 2 : 1;

  const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff);
  const __m512i sign_mask = _mm512_set1_epi32(static_cast<int>(0x80000000u));
  const __m512 vmax = _mm512_set1_ps(static_cast<float>(f.max));
  const __m512 inf = _mm512_set1_ps(INFINITY);
  const __m512 tol_rel = _mm512_set1_ps(std::ldexp(1.0f, -22));
  const __m512 half = _mm512_set1_ps(0.5f);
  const __m512 zero = _mm512_setzero_ps();
  const __m512i emin_b = _mm512_set1_epi32(f.emin + 127);
  const __m512i shift_b = _mm512_set1_epi32(h + 1 + f.M + 254);
  const __m512i shift_rne = _mm512_set1_epi32(f.M + 254);
  // (shift counts as vectors: VPSRLVD is one micro-op, VPSRLD by an xmm two)
  const __m512i vh1 = _mm512_set1_epi32(h + 1);
  const __m512i vM = _mm512_set1_epi32(f.M);
  const __m512i exp_lo = _mm512_set1_epi32(127 - 100), exp_span = _mm512_set1_epi32(254 - (127 - 100));
  const __m512i Fmask = _mm512_set1_epi32((1 << (h + 1)) - 1);
  const __m512i zero_i = _mm512_setzero_si512();
  const __m512i max_mag = _mm512_set1_epi32(static_cast<int>(f.max_mag));
  const __m512i sub_lim = _mm512_set1_epi32(1 << f.M);
  const __m512i sign_bit = _mm512_set1_epi32(static_cast<int>(f.sign_bit));
  const __m512i two_n_m1 = _mm512_set1_epi32((1 << h) - 1);
  const int cb = kLean ? 1 : f.code_bytes();
  // The row's fields as locals: the code stores may alias anything, so
  // fields read through `row` would be loaded again after every step.
  const float* const x_row = row.x;
  const float* const pf_row = row.prefetch;
  const bool pf_half = row.prefetch_half;
  const int64_t row_i0 = row.i0, cols = row.cols, bc = row.bc, nblocks = row.nblocks;
  const uint8_t* const key = row.code;
  const uint8_t* const use = row.use;
  const BlockConsts* const consts = row.consts;
  const Fp4Block* const vbs = row.vb;
  const bool stream = kLean || row.stream, stats = !kLean && row.stats;
  const bool is_signed = f.is_signed;
  // the random words' alignment holds for every step of the row when it
  // holds for its first (steps are 16 elements, blocks a multiple of 16 wide)
  const bool words_aligned = (rng.first() + static_cast<uint64_t>(row_i0)) % static_cast<uint64_t>(align) == 0;
  uint64_t n_sat = 0, n_sub = 0, n_nz = 0, n_uf = 0;

  // Stochastic modes: the Philox words of the whole row (element i of the
  // call is element rng.first() + i of its tensor).
  thread_local std::vector<uint32_t> words;
  uint64_t wj0 = 0;
  if constexpr (kSR) wj0 = fp4_row_words(p, row, rng, h, words);
  const uint32_t* const wd = words.data();
  const uint64_t g0 = rng.first();
  // (random16_w's shift: the words' share per element less the bits drawn)
  const __m512i rshift = _mm512_set1_epi32(h <= 8 ? 8 - h : h <= 16 ? 16 - h : 32 - h);

  // Lanes the scalar core redoes after the loop (Fp4Pending).
  using Pending = Fp4Pending;
  thread_local std::vector<Pending> pending;
  pending.resize(static_cast<size_t>(cols / 16 + 2 * nblocks + 2));
  Pending* const pend = pending.data();
  size_t np = 0;
  const bool has_scale = p.has_scale;
  const float tensor_mul = p.t;

  // The constants of the blocks with key k, broadcast: 1/scale (exact
  // arithmetic), the multiplier (fp32), the table of x-hat magnitudes.
  struct BlockVecs {
    __m512 vr, vmul, table;
  };
  auto block_vecs = [&](int64_t k) __attribute__((always_inline)) {
    const Fp4Block& vb = vbs[k];
    return BlockVecs{_mm512_set1_ps(vb.r), _mm512_set1_ps(has_scale ? consts[k].mb : tensor_mul),
                     _mm512_zextps256_ps512(_mm256_loadu_ps(vb.table))};
  };

  // One 16-lane step at element j of block b (x the block's first input, i0
  // its index in the call) under the block's constants.
  // kW: the random words' width class when known (8, 16, 32; 0: from h at
  // run time, aligned or not); kSigned: the element format known signed.
  auto step16 = [&]<int kW, bool kSigned>(const float* x, int64_t i0, int64_t j, __m512 vr, __m512 vmul,
                                          __m512 table, int64_t b) __attribute__((always_inline)) {
    const __m512 x16 = _mm512_loadu_ps(x + j);
    const __m512i xi = _mm512_castps_si512(x16);
    const __mmask16 neg = _mm512_movepi32_mask(xi);
    const __mmask16 nz = _mm512_cmp_ps_mask(x16, zero, _CMP_NEQ_UQ);
    const __m512 v =
        kExact ? _mm512_mul_ps(_mm512_castsi512_ps(_mm512_and_si512(xi, abs_mask)), vr)
               : _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(_mm512_mul_ps(x16, vmul)), abs_mask));
    const __m512i ev = _mm512_srli_epi32(_mm512_castps_si512(v), 23);  // v's biased exponent (v >= 0)
    __mmask16 unsure;
    if constexpr (kExact) {
      // tiny (below 2^-100: float-subnormal, or underflowed to 0) products
      // of non-zero x lose precision, and infinite or NaN ones have no
      // code: let the core decide, by one unsigned test of v's exponent
      // for both (ev - 27 > 227)
      unsure = _mm512_mask_cmpgt_epu32_mask(nz, _mm512_sub_epi32(ev, exp_lo), exp_span);
    } else {
      unsure = _mm512_cmp_ps_mask(v, inf, _CMP_NLT_UQ);
    }
    if (!kSigned && !is_signed) unsure |= neg;

    const __m512i ee = _mm512_max_epi32(ev, emin_b);
    __m512i kk;
    if constexpr (kCvtRne) {
      // one rounding of v * 2^(M-ee) to nearest even (fp4x8_impl)
      const __m512 Wr =
          _mm512_mul_ps(v, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_sub_epi32(shift_rne, ee), 23)));
      kk = _mm512_cvtps_epi32(Wr);
      if constexpr (kExact) {
        const __m512 d = _mm512_abs_ps(_mm512_sub_ps(Wr, _mm512_cvtepi32_ps(kk)));
        const __m512 off_tie = _mm512_abs_ps(_mm512_sub_ps(d, half));
        unsure |= _mm512_cmp_ps_mask(off_tie, _mm512_mul_ps(Wr, tol_rel), _CMP_LE_OQ);
      }
    } else {
      const __m512 p2 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_sub_epi32(shift_b, ee), 23));
      const __m512 Ws = _mm512_mul_ps(v, p2);
      // W = floor(Ws) (Ws >= 0 and below 2^22: truncation), its fraction exact
      const __m512i W = _mm512_cvttps_epi32(Ws);
      const __m512 frac = _mm512_sub_ps(Ws, _mm512_cvtepi32_ps(W));
      if constexpr (kExact) {
        // Within Ws * 2^-22 of an integer, v's error (two roundings, about
        // 2^-23 of v) may move floor(Ws): the core decides, by |frac - 1/2|
        // >= 1/2 - Ws * 2^-22. (The subtraction's rounding is monotone and
        // the bound's below 2^-25, so the test covers v's error wherever Ws
        // >= 1/4; below, frac = Ws cannot reach an integer. x = 0 has W = 0
        // exactly.)
        const __m512 off_half = _mm512_abs_ps(_mm512_sub_ps(frac, half));
        unsure |= _mm512_mask_cmp_ps_mask(nz, off_half, _mm512_fnmadd_ps(Ws, tol_rel, half), _CMP_GE_OQ);
      }
      const __m512i k = _mm512_srlv_epi32(W, vh1);
      const __m512i F = _mm512_and_si512(W, Fmask);
      const __mmask16 sticky = _mm512_cmp_ps_mask(frac, zero, _CMP_NEQ_UQ);
      __m512i r = zero_i;
      if constexpr (kSR) {
        const uint64_t i = static_cast<uint64_t>(i0 + j), g = g0 + i;
        if constexpr (kW != 0) {
          r = random16_w<kW>(wd, wj0, g, rshift);
        } else if (words_aligned || (g & static_cast<uint64_t>(align - 1)) == 0) {  // align is 1, 2 or 4
          r = random16(wd, wj0, g, h);
        } else {
          alignas(64) uint32_t rr[16];
          for (int l = 0; l < 16; ++l) rr[l] = rng(i + l);
          r = _mm512_load_si512(rr);
        }
      }
      if constexpr (MODE == Round::stochastic_fast) {
        // away exactly when F + 2r + 1 carries into bit h+1 (F + 2r + 1 <
        // 2^(h+2)): k + away in one sum
        kk = _mm512_srlv_epi32(_mm512_add_epi32(_mm512_add_epi32(W, _mm512_add_epi32(r, r)), _mm512_set1_epi32(1)),
                               vh1);
      } else if constexpr (MODE == Round::stochastic_fastest) {
        // away exactly when F/2 + r carries into bit h (F/2 + r < 2^(h+1))
        kk = _mm512_srlv_epi32(_mm512_add_epi32(_mm512_srli_epi32(W, 1), r), _mm512_set1_epi32(h));
      } else {
        const __mmask16 away = away_mask<MODE>(k, F, sticky, neg, r, two_n_m1);
        kk = _mm512_mask_add_epi32(k, away, k, _mm512_set1_epi32(1));
      }
    }
    __m512i code = _mm512_add_epi32(_mm512_sllv_epi32(_mm512_sub_epi32(ee, emin_b), vM), kk);
    code = _mm512_min_epi32(code, max_mag);
    // (permutexvar takes the low 4 bits: codes above 7 are lanes the
    // scalar core redoes)
    __m512 xh = _mm512_permutexvar_ps(code, table);
    if (kSigned || is_signed) {
      xh = _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(xh), _mm512_and_si512(xi, sign_mask)));
      code = _mm512_mask_or_epi32(code, neg, code, sign_bit);
    }
    float* vo = values + i0 + j;
    if (stream) {  // (16-byte aligned: see Fp4Row::stream)
      stream_values16(vo, xh);
    } else {
      _mm512_storeu_ps(vo, xh);
    }
    if (kLean || codes) {
      uint8_t* co = codes + cb * (i0 + j);
      if (cb == 2) _mm256_storeu_si256(reinterpret_cast<__m256i*>(co), _mm512_cvtepi32_epi16(code));
      else _mm_storeu_si128(reinterpret_cast<__m128i*>(co), _mm512_cvtepi32_epi8(code));  // (cached: thr_step_x16.hpp)
    }
    if (stats) {
      if constexpr (kCvtRne && kExact) {
        const __m512 dm = _mm512_abs_ps(_mm512_sub_ps(v, vmax));
        unsure |= _mm512_cmp_ps_mask(dm, _mm512_mul_ps(v, tol_rel), _CMP_LE_OQ);
      }
      const __mmask16 ok = static_cast<__mmask16>(~unsure);
      const __mmask16 above = _mm512_cmp_ps_mask(v, vmax, _CMP_GT_OQ);
      const __m512i mag = _mm512_andnot_si512(sign_bit, code);
      const __mmask16 is_sub = _mm512_cmpgt_epi32_mask(sub_lim, mag) & _mm512_cmpgt_epi32_mask(mag, zero_i);
      const __mmask16 zh = _mm512_cmp_ps_mask(xh, zero, _CMP_EQ_OQ);
      n_sat += static_cast<uint64_t>(__builtin_popcount(above & ok));
      n_sub += static_cast<uint64_t>(__builtin_popcount(is_sub & ok));
      n_nz += static_cast<uint64_t>(__builtin_popcount(nz & ok));
      n_uf += static_cast<uint64_t>(__builtin_popcount(nz & zh & ok));
    }
    if (unsure) pend[np++] = Pending{b, j, unsure};
  };

  // Rows of whole 16-wide blocks (the NVFP4 and UE5M3 recipes' 1x16) with,
  // for stochastic modes, aligned random words: a step a block, without the
  // general loop's per-block bounds, inner loop and tail test (sr-fast8
  // 1x16: 0.73 -> 0.65 ns an element in L2, Intel Xeon family 6 model 207).
  int64_t b0 = 0;
  // (The random words' width and the format's sign known at compile time.)
  if (bc == 16 && cols == 16 * nblocks && (!kSR || words_aligned) && is_signed) {
    auto blocks = [&]<int kW>() __attribute__((always_inline)) {
      for (int64_t b = 0; b < nblocks; ++b) {
        const int64_t k = key ? key[b] : b;
        if (!use[k]) continue;
        const BlockVecs c = block_vecs(k);
        if (pf_row) prefetch_next_line(pf_row, pf_half, 16 * b);
        step16.template operator()<kW, true>(x_row + 16 * b, row_i0 + 16 * b, 0, c.vr, c.vmul, c.table, b);
      }
    };
    if (!kSR) blocks.template operator()<32>();  // (no random bits drawn)
    else if (h <= 8) blocks.template operator()<8>();
    else if (h <= 16) blocks.template operator()<16>();
    else blocks.template operator()<32>();
    b0 = nblocks;
  }
  for (int64_t b = b0; b < nblocks; ++b) {
    const int64_t k = key ? key[b] : b;
    if (!use[k]) continue;
    const BlockVecs c = block_vecs(k);
    const int64_t i0 = row_i0 + b * bc;
    const int64_t n = std::min(bc, cols - b * bc);
    const float* x = x_row + b * bc;
    if (pf_row) prefetch_next_lines(pf_row, pf_half, b * bc, n);
    auto step = [&](int64_t j) __attribute__((always_inline)) {
      step16.template operator()<0, false>(x, i0, j, c.vr, c.vmul, c.table, b);
    };
    int64_t j = 0;
    for (; j + 16 <= n; j += 16) step(j);
    if (j < n) pend[np++] = Pending{b, j, (1u << (n - j)) - 1u};  // the tail (fewer than 16)
  }
  if (stream && np) _mm_sfence();  // the streamed stores land before the scalar core's
  fp4_redo_pending(p, row, pending, np, 16, codes, values, rng, words.data(), wj0, cnt);
  cnt.saturated += n_sat;
  cnt.subnormal += n_sub;
  cnt.nonzero += n_nz;
  cnt.underflow += n_uf;
}

template <Arith A, bool L>
void fp4x16_by_mode(const QuantPlan& p, const Fp4Row& row, uint8_t* codes, float* values, RandomBits& rng,
                    SpanCounts& cnt) {
  with_round(p.round, [&](auto r) { fp4x16_impl<decltype(r)::value, A, L>(p, row, codes, values, rng, cnt); });
}

}  // namespace

void fp4x16_row(const QuantPlan& p, const Fp4Row& row, uint8_t* codes, float* values, RandomBits& rng,
                SpanCounts& cnt) {
  const bool lean = row.stream && codes && p.fe.code_bytes() == 1 && !row.stats;
  if (p.arith == Arith::exact) {
    if (lean) fp4x16_by_mode<Arith::exact, true>(p, row, codes, values, rng, cnt);
    else fp4x16_by_mode<Arith::exact, false>(p, row, codes, values, rng, cnt);
  } else {
    if (lean) fp4x16_by_mode<Arith::fp32, true>(p, row, codes, values, rng, cnt);
    else fp4x16_by_mode<Arith::fp32, false>(p, row, codes, values, rng, cnt);
  }
}

}  // namespace exmy::detail::avx512
EXMY_TARGET_END
#endif

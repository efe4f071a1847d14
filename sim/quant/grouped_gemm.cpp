#include "sim/quant/grouped_gemm.hpp"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cfloat>
#include <climits>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "sim/bf16.hpp"
#include "sim/gemm.hpp"
#include "sim/parallel.hpp"

namespace exmy::sim::quant {

// ---------------------------------------------------------------------------
// The fast path's vector forms of round_exact and add_exact
// (sim/quant/grouped_items.hpp), and the scalar wrappers
// ---------------------------------------------------------------------------

namespace {

#if defined(__AVX2__)
// ac[j] = add_exact<kAccRtz>(ac[j], round_exact<kGroupRtz>(gs[j] + 0.0)) for
// j < n, four lanes at a time (the same operations as the scalar forms).
template <bool kGroupRtz, bool kAccRtz>
inline void accumulate_row(float* ac, const double* gs, int64_t n) {
  int64_t j = 0;
  const __m256d zero = _mm256_setzero_pd();
  const __m256d absmask = _mm256_castsi256_pd(_mm256_set1_epi64x(0x7fffffffffffffffll));
  const __m256d dmax = _mm256_set1_pd(DBL_MAX);
  const __m256i pick = _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6);
  // 64-bit lane masks -> 32-bit lane masks
  auto narrow = [&](__m256d m) {
    return _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(_mm256_castpd_si256(m), pick));
  };
  for (; j + 4 <= n; j += 4) {
    const __m256d gd = _mm256_add_pd(_mm256_loadu_pd(gs + j), zero);
    __m128 g = _mm256_cvtpd_ps(gd);
    if constexpr (kGroupRtz) {
      const __m256d away = _mm256_cmp_pd(_mm256_and_pd(_mm256_cvtps_pd(g), absmask), _mm256_and_pd(gd, absmask), _CMP_GT_OQ);
      g = _mm_castsi128_ps(_mm_add_epi32(_mm_castps_si128(g), narrow(away)));  // mask is -1: one step down
    }
    const __m128 acc = _mm_loadu_ps(ac + j);
    if constexpr (!kAccRtz) {
      _mm_storeu_ps(ac + j, _mm_add_ps(acc, g));
      continue;
    }
    const __m256d a = _mm256_cvtps_pd(acc), b = _mm256_cvtps_pd(g);
    const __m256d sum = _mm256_add_pd(a, b);
    const __m256d bb = _mm256_sub_pd(sum, a);
    const __m256d err = _mm256_add_pd(_mm256_sub_pd(a, _mm256_sub_pd(sum, bb)), _mm256_sub_pd(b, bb));
    const __m128 f = _mm256_cvtpd_ps(sum);
    const __m256d fd = _mm256_cvtps_pd(f);
    const __m256d abs_s = _mm256_and_pd(sum, absmask);
    const __m256d gt = _mm256_cmp_pd(_mm256_and_pd(fd, absmask), abs_s, _CMP_GT_OQ);
    const __m256d eq = _mm256_cmp_pd(fd, sum, _CMP_EQ_OQ);
    const __m256d nz = _mm256_cmp_pd(err, zero, _CMP_NEQ_OQ);
    const __m256d opp = _mm256_castsi256_pd(
        _mm256_cmpgt_epi64(_mm256_setzero_si256(), _mm256_castpd_si256(_mm256_xor_pd(err, sum))));
    const __m256d finite = _mm256_cmp_pd(abs_s, dmax, _CMP_LE_OQ);
    const __m256d beyond = _mm256_and_pd(finite, _mm256_or_pd(gt, _mm256_and_pd(eq, _mm256_and_pd(nz, opp))));
    _mm_storeu_ps(ac + j, _mm_castsi128_ps(_mm_add_epi32(_mm_castps_si128(f), narrow(beyond))));
  }
  for (; j < n; ++j) ac[j] = add_exact<kAccRtz>(ac[j], round_exact<kGroupRtz>(gs[j] + 0.0));
}

// The same for group sums that are exact floats (the group rounding leaves
// them unchanged), eight lanes at a time: the float sum s = fl(a + b), its
// exact error by TwoSum (s + err == a + b while s is finite), and for RTZ
// the step of s one toward zero when err points back to zero; an overflow
// of finite inputs to ±Inf steps back to ±FLT_MAX the same way.
template <bool kAccRtz>
inline void accumulate_row_f32(float* ac, const float* gs, int64_t n) {
  int64_t j = 0;
  const __m256 zero = _mm256_setzero_ps();
  const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256 fmax = _mm256_set1_ps(FLT_MAX);
  const __m256 inf = _mm256_set1_ps(std::numeric_limits<float>::infinity());
  for (; j + 8 <= n; j += 8) {
    const __m256 a = _mm256_loadu_ps(ac + j);
    const __m256 b = _mm256_add_ps(_mm256_loadu_ps(gs + j), zero);  // an exact zero sum is +0
    const __m256 s = _mm256_add_ps(a, b);
    if constexpr (!kAccRtz) {
      _mm256_storeu_ps(ac + j, s);
      continue;
    }
    const __m256 bb = _mm256_sub_ps(s, a);
    const __m256 err = _mm256_add_ps(_mm256_sub_ps(a, _mm256_sub_ps(s, bb)), _mm256_sub_ps(b, bb));
    const __m256 finite = _mm256_and_ps(_mm256_cmp_ps(_mm256_and_ps(a, absmask), fmax, _CMP_LE_OQ),
                                        _mm256_cmp_ps(_mm256_and_ps(b, absmask), fmax, _CMP_LE_OQ));
    const __m256 overflow = _mm256_cmp_ps(_mm256_and_ps(s, absmask), inf, _CMP_EQ_OQ);
    const __m256 inexact = _mm256_cmp_ps(err, zero, _CMP_NEQ_OQ);
    const __m256 opposite = _mm256_castsi256_ps(
        _mm256_cmpgt_epi32(_mm256_setzero_si256(), _mm256_castps_si256(_mm256_xor_ps(err, s))));
    const __m256 beyond = _mm256_and_ps(finite, _mm256_or_ps(overflow, _mm256_and_ps(inexact, opposite)));
    // beyond is -1 in the lanes to step: one unit less of magnitude
    _mm256_storeu_ps(ac + j, _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(s), _mm256_castps_si256(beyond))));
  }
  for (; j < n; ++j) ac[j] = add_exact<kAccRtz>(ac[j], gs[j] + 0.0f);
}
#else
template <bool kGroupRtz, bool kAccRtz>
inline void accumulate_row(float* ac, const double* gs, int64_t n) {
  for (int64_t j = 0; j < n; ++j) ac[j] = add_exact<kAccRtz>(ac[j], round_exact<kGroupRtz>(gs[j] + 0.0));
}
template <bool kAccRtz>
inline void accumulate_row_f32(float* ac, const float* gs, int64_t n) {
  for (int64_t j = 0; j < n; ++j) ac[j] = add_exact<kAccRtz>(ac[j], gs[j] + 0.0f);
}
#endif

}  // namespace

float round_to_float(double v, Round mode) {
  return mode == Round::rtz ? round_exact<true>(v) : round_exact<false>(v);
}

float add_float(float a, float b, Round mode) { return mode == Round::rtz ? add_exact<true>(a, b) : add_exact<false>(a, b); }

float tensor_decode_alpha(float t_a, float t_b) {
  const float ga = fp32_rne_div(1.0, t_a), gb = fp32_rne_div(1.0, t_b);
  return ga * gb;
}

void apply_outer_alpha(float* C, int64_t M, int64_t N, float t_a, const float* row_t_a, float t_b,
                       const float* row_t_b) {
  std::vector<float> gb(static_cast<size_t>(N));
  for (int64_t j = 0; j < N; ++j) gb[static_cast<size_t>(j)] = fp32_rne_div(1.0, row_t_b ? row_t_b[j] : t_b);
  for (int64_t i = 0; i < M; ++i) {
    const float ga = fp32_rne_div(1.0, row_t_a ? row_t_a[i] : t_a);
    float* c = C + i * N;
    for (int64_t j = 0; j < N; ++j) c[j] = outer_alpha_element(c[j], ga, gb[static_cast<size_t>(j)]);
  }
}

// The epilogue of both implementations is GroupedEpilogue (grid, alpha,
// canonical NaN; sim/quant/grouped_items.hpp).

// ---------------------------------------------------------------------------
// The slow exact reference
// ---------------------------------------------------------------------------

void grouped_gemm_ref(float* C, const double* A, const double* B, int64_t M, int64_t N, int64_t K,
                      const GemmModel& model, float alpha) {
  const int64_t G = model.group;
  ExactSum es;
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      float acc = 0.0f;
      for (int64_t k0 = 0; k0 < K; k0 += G) {
        es.clear();
        for (int64_t k = k0; k < std::min(K, k0 + G); ++k) es.add_product(A[i * K + k], B[j * K + k]);
        const float g = es.round(model.group_round);
        // The accumulator addition, also through the exact sum (IEEE special
        // cases first).
        if (!std::isfinite(acc) || !std::isfinite(g)) {
          acc = acc + g;
        } else {
          ExactSum two;
          two.add(acc);
          two.add(g);
          acc = two.round(model.accumulate);
        }
      }
      C[i * N + j] = GroupedEpilogue(model.grid, alpha)(acc);
    }
}

// ---------------------------------------------------------------------------
// The fast path
// ---------------------------------------------------------------------------

namespace {

// GroupRange, range_of and pair_exact: sim/quant/grouped_items.hpp.

// Ranges of sub-blocks of `sub` columns inside each group of G columns:
// rows x (ceil(G / sub) per group, in K order; sub-blocks past K are
// all-zero). sub == G gives the groups' own ranges.
void sub_ranges(const double* V, int64_t rows, int64_t K, int64_t G, int64_t sub, std::vector<GroupRange>& out) {
  const int64_t ng = (K + G - 1) / G, per = (G + sub - 1) / sub;
  out.assign(static_cast<size_t>(rows * ng * per), GroupRange{kBig, -kBig, -kBig, kAllZero});
#pragma omp parallel for schedule(static) if (rows * K >= parallel_min_work())
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t g = 0; g < ng; ++g) {
      const int64_t end = std::min(K, (g + 1) * G);
      for (int64_t s = 0; s < per; ++s) {
        const int64_t c0 = g * G + s * sub;
        if (c0 >= end) break;
        out[static_cast<size_t>(r * ng * per + g * per + s)] = range_of(V + r * K + c0, std::min(sub, end - c0));
      }
    }
}

// The ranges of whole groups from those of their `per` sub-blocks.
void merge_ranges(const std::vector<GroupRange>& sub, int64_t per, std::vector<GroupRange>& out) {
  const size_t n = sub.size() / static_cast<size_t>(per);
  out.resize(n);
  for (size_t i = 0; i < n; ++i) {
    GroupRange w{kBig, -kBig, -kBig, kAllZero};
    for (int64_t s = 0; s < per; ++s) {
      const GroupRange& r = sub[i * static_cast<size_t>(per) + static_cast<size_t>(s)];
      if (r.flags & kAllZero) continue;
      w.flags = static_cast<uint8_t>((w.flags | r.flags) & kSpecial);  // not all-zero; special if any is
      w.lo = std::min(w.lo, r.lo);
      w.hi = std::max(w.hi, r.hi);
    }
    // A group's span is its own hi - lo, not the widest sub-block's.
    w.span = static_cast<int16_t>((w.flags & kSpecial) ? kBig : (w.flags & kAllZero) ? -kBig : w.hi - w.lo);
    out[i] = w;
  }
}

void to_float(const double* v, int64_t n, float* out) {
#pragma omp parallel for schedule(static) if (n >= parallel_min_work())
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(v[i]);
}

// The float32 analogue for a sub-block of a group: every partial sum of
// products is a multiple of 2^(lo_a + lo_b) below 2^(hi_a + hi_b + c), so a
// float32 GEMM of the sub-block is exact when that range fits 24 bits, the
// products' lowest bits stay at or above float32's 2^-149 and the sums below
// 2^128 (the operands then convert to float32 exactly, too).
inline bool pair_exact_f32(const GroupRange& a, const GroupRange& b, int c) {
  if ((a.flags | b.flags) & kSpecial) return false;
  if ((a.flags | b.flags) & kAllZero) return true;
  return a.span + b.span + c <= 24 && a.lo + b.lo >= -149 && a.hi + b.hi + c <= 127 && a.lo >= -149 &&
         b.lo >= -149 && a.hi <= 127 && b.hi <= 127;
}

constexpr int64_t kTile = 128;
// Products per float32 sub-block of a group (path 2 of grouped_tiles).
constexpr int64_t kSubBlock = 16;

// Widest range over a set of rows (all-zero rows do not widen it).
inline void widen(GroupRange& w, const GroupRange& r) {
  if (r.flags & kAllZero) return;
  w.flags = static_cast<uint8_t>((w.flags & r.flags & kAllZero) | ((w.flags | r.flags) & kSpecial));
  w.lo = std::min(w.lo, r.lo);
  w.hi = std::max(w.hi, r.hi);
  w.span = std::max(w.span, r.span);
}

// Operands and ranges shared by the tiles.
struct GroupedInputs {
  const double* A;
  const double* B;
  // float32 copies of A and B (exact wherever the float paths use them)
  std::vector<float> fa, fb;
  std::vector<GroupRange> ra, rb;  // rows x groups
  // Sub-blocks of `sub` products: rows x (per_group per group, in K order;
  // the last of a group may be shorter). sub == G when G <= kSubBlock
  // (path 2 does not apply).
  int64_t sub = 0, per_group = 0;
  std::vector<GroupRange> sa, sb;
};

// The tile loop for one (group rounding, accumulator rounding) pair.
//
// Per 128 x 128 tile and group, three ways to the exact group sums, the
// first that is exact for every row pair of the tile (checked on the tile's
// widest ranges):
//   1. one float32 GEMM of the group (exact when all its partial sums fit
//      24 bits: narrow formats with close block scales);
//   2. float32 GEMMs of sub-blocks of kSubBlock products (with blocks of 16
//      or 32 along K a sub-block row has one block scale, and E2M1 payloads
//      with 4-bit scales need at most 18 bits), added into the double group
//      sums (exact when the whole group fits 53 bits);
//   3. a double GEMM of the group, with the exact accumulator for the row
//      pairs it cannot hold.
// A float32 GEMM costs half a double one on AVX2, so 1 and 2 carry the
// common recipes.
template <bool kGroupRtz, bool kAccRtz>
void grouped_tiles(float* C, int64_t M, int64_t N, int64_t K, const GemmModel& model, float alpha,
                   const GroupedInputs& in) {
  GroupedGemmPaths& paths = grouped_gemm_paths();
  const double* A = in.A;
  const double* B = in.B;
  const std::vector<GroupRange>& ra = in.ra;
  const std::vector<GroupRange>& rb = in.rb;
  const int64_t G = model.group;
  const int64_t ng = (K + G - 1) / G;
  const int64_t tm = (M + kTile - 1) / kTile, tn = (N + kTile - 1) / kTile;
  const int64_t tiles = tm * tn;
#pragma omp parallel if (tiles > 1 && M * N * K >= parallel_min_work())
  {
    std::vector<double> gsum(static_cast<size_t>(kTile * kTile));
    std::vector<float> part(static_cast<size_t>(kTile * kTile));
    std::vector<float> acc(static_cast<size_t>(kTile * kTile));
    ExactSum es;
    // True when every sub-block of group g passes the float32 test over the tile.
    auto sub_blocks_ok = [&](int64_t m0, int64_t mb, int64_t n0, int64_t nb, int64_t g, int64_t gk) {
      const int64_t nsub = (gk + in.sub - 1) / in.sub;
      const size_t stride = static_cast<size_t>(ng * in.per_group);
      for (int64_t s = 0; s < nsub; ++s) {
        const int64_t sk = std::min(in.sub, gk - s * in.sub);
        GroupRange wa{kBig, -kBig, -kBig, kAllZero}, wb{kBig, -kBig, -kBig, kAllZero};
        const size_t col = static_cast<size_t>(g * in.per_group + s);
        for (int64_t i = 0; i < mb; ++i) widen(wa, in.sa[static_cast<size_t>(m0 + i) * stride + col]);
        for (int64_t j = 0; j < nb; ++j) widen(wb, in.sb[static_cast<size_t>(n0 + j) * stride + col]);
        if (!pair_exact_f32(wa, wb, ceil_log2(sk) + 2)) return false;
      }
      return true;
    };
    // gsum = the group's sums from float32 GEMMs of its sub-blocks.
    auto sub_block_sums = [&](int64_t m0, int64_t mb, int64_t n0, int64_t nb, int64_t k0, int64_t gk) {
      for (int64_t s0 = 0; s0 < gk; s0 += in.sub) {
        const int64_t sk = std::min(in.sub, gk - s0);
        gemm_serial<float>(part.data(), nb, in.fa.data() + m0 * K + k0 + s0, K, Op::N, in.fb.data() + n0 * K + k0 + s0,
                           K, Op::T, mb, nb, sk, false);
        const int64_t n = mb * nb;
        if (s0 == 0) {
          for (int64_t i = 0; i < n; ++i) gsum[static_cast<size_t>(i)] = part[static_cast<size_t>(i)];
        } else {
          for (int64_t i = 0; i < n; ++i) gsum[static_cast<size_t>(i)] += part[static_cast<size_t>(i)];
        }
      }
    };
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < tiles; ++t) {
      const int64_t m0 = (t / tn) * kTile, n0 = (t % tn) * kTile;
      const int64_t mb = std::min(kTile, M - m0), nb = std::min(kTile, N - n0);
      std::fill(acc.begin(), acc.begin() + mb * nb, 0.0f);
      for (int64_t g = 0; g < ng; ++g) {
        const int64_t k0 = g * G, gk = std::min(G, K - k0);
        const int c = ceil_log2(gk) + 2;
        // The whole tile at once when its worst rows pass the test.
        GroupRange wa{kBig, -kBig, -kBig, kAllZero}, wb{kBig, -kBig, -kBig, kAllZero};
        for (int64_t i = 0; i < mb; ++i) widen(wa, ra[static_cast<size_t>((m0 + i) * ng + g)]);
        for (int64_t j = 0; j < nb; ++j) widen(wb, rb[static_cast<size_t>((n0 + j) * ng + g)]);
        // (the tile test uses the smallest lo with the largest span: a
        // sufficient condition)
        const bool tile_exact = pair_exact(wa, wb, c);
        if (tile_exact && pair_exact_f32(wa, wb, c)) {
          // Path 1: the float32 sums are the exact group sums.
          gemm_serial<float>(part.data(), nb, in.fa.data() + m0 * K + k0, K, Op::N, in.fb.data() + n0 * K + k0, K,
                             Op::T, mb, nb, gk, false);
          paths.f32_group.fetch_add(1, std::memory_order_relaxed);
          for (int64_t i = 0; i < mb; ++i) accumulate_row_f32<kAccRtz>(acc.data() + i * nb, part.data() + i * nb, nb);
          continue;
        }
        if (tile_exact && in.sub < G && sub_blocks_ok(m0, mb, n0, nb, g, gk)) {
          sub_block_sums(m0, mb, n0, nb, k0, gk);
          paths.f32_split.fetch_add(1, std::memory_order_relaxed);
        } else {
          gemm_serial<double>(gsum.data(), nb, A + m0 * K + k0, K, Op::N, B + n0 * K + k0, K, Op::T, mb, nb, gk, false);
          paths.f64.fetch_add(1, std::memory_order_relaxed);
        }
        for (int64_t i = 0; i < mb; ++i) {
          float* ac = acc.data() + i * nb;
          const double* gs = gsum.data() + i * nb;
          if (tile_exact) {
            accumulate_row<kGroupRtz, kAccRtz>(ac, gs, nb);  // (+ 0.0 inside: an exact zero sum is +0)
            continue;
          }
          const GroupRange a = ra[static_cast<size_t>((m0 + i) * ng + g)];
          for (int64_t j = 0; j < nb; ++j) {
            float s;
            if (pair_exact(a, rb[static_cast<size_t>((n0 + j) * ng + g)], c)) {
              s = round_exact<kGroupRtz>(gs[j] + 0.0);
            } else {
              s = exact_group_sum(es, A + (m0 + i) * K + k0, B + (n0 + j) * K + k0, gk, model.group_round);
            }
            ac[j] = add_exact<kAccRtz>(ac[j], s);
          }
        }
      }
      const GroupedEpilogue ep(model.grid, alpha);
      for (int64_t i = 0; i < mb; ++i)
        for (int64_t j = 0; j < nb; ++j) C[(m0 + i) * N + n0 + j] = ep(acc[i * nb + j]);
    }
  }
}

}  // namespace

GroupedGemmPaths& grouped_gemm_paths() {
  static GroupedGemmPaths p;
  return p;
}

void grouped_gemm(float* C, const double* A, const double* B, int64_t M, int64_t N, int64_t K, const GemmModel& model,
                  float alpha) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) {
    for (int64_t i = 0; i < M * N; ++i) C[i] = GroupedEpilogue(model.grid, alpha)(0.0f);
    return;
  }
  const int64_t G = model.group;
  GroupedInputs in;
  in.A = A;
  in.B = B;
  in.fa.resize(static_cast<size_t>(M * K));
  in.fb.resize(static_cast<size_t>(N * K));
  to_float(A, M * K, in.fa.data());
  to_float(B, N * K, in.fb.data());
  in.sub = std::min(G, kSubBlock);
  if (in.sub < G) {
    // The groups' ranges from their sub-blocks' (one pass over the operands).
    in.per_group = (G + in.sub - 1) / in.sub;
    sub_ranges(A, M, K, G, in.sub, in.sa);
    sub_ranges(B, N, K, G, in.sub, in.sb);
    merge_ranges(in.sa, in.per_group, in.ra);
    merge_ranges(in.sb, in.per_group, in.rb);
  } else {
    sub_ranges(A, M, K, G, G, in.ra);
    sub_ranges(B, N, K, G, G, in.rb);
  }
  const bool grtz = model.group_round == Round::rtz, artz = model.accumulate == Round::rtz;
  if (grtz && artz) grouped_tiles<true, true>(C, M, N, K, model, alpha, in);
  else if (grtz) grouped_tiles<true, false>(C, M, N, K, model, alpha, in);
  else if (artz) grouped_tiles<false, true>(C, M, N, K, model, alpha, in);
  else grouped_tiles<false, false>(C, M, N, K, model, alpha, in);
}

// ---------------------------------------------------------------------------
// Encoded operands
// ---------------------------------------------------------------------------

namespace {

uint32_t load_code(const uint8_t* p, int bytes, int64_t i) {
  uint32_t c = 0;
  for (int k = 0; k < bytes; ++k) c |= static_cast<uint32_t>(p[i * bytes + k]) << (8 * k);
  return c;
}

std::vector<double> value_table(const Format& f) {
  std::vector<double> t;
  if (f.bits > 16) return t;
  t.resize(size_t{1} << f.bits);
  for (uint32_t c = 0; c < t.size(); ++c) t[c] = f.decode(c);
  return t;
}

}  // namespace

namespace {

// The encoded values of encode_operand, each handed to store(i, value).
template <class Store>
void encode_rows(const QuantSpec& spec, const void* codes, const void* scale_codes, int64_t rows, int64_t cols,
                 Store&& store) {
  if (rows <= 0 || cols <= 0) return;
  const Format& fe = spec.elem;
  const std::vector<double> et = value_table(fe);
  std::vector<double> st;
  if (spec.scale) st = value_table(*spec.scale);
  const auto* pc = static_cast<const uint8_t*>(codes);
  const auto* ps = static_cast<const uint8_t*>(scale_codes);
  const int cb = fe.code_bytes(), sb = spec.scale ? spec.scale->code_bytes() : 1;
  const int64_t br = spec.scale ? spec.block_rows : 1, bc = spec.scale ? spec.block_cols : cols;
  const int64_t gc = (cols + bc - 1) / bc;
#pragma omp parallel for schedule(static) if (rows * cols >= parallel_min_work())
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t i0 = r * cols;
    for (int64_t c0 = 0; c0 < cols; c0 += bc) {
      const int64_t c1 = std::min(cols, c0 + bc);
      double s = 1.0;
      if (spec.scale) {
        const uint32_t sc = load_code(ps, sb, (r / br) * gc + c0 / bc);
        s = st.empty() ? spec.scale->decode(sc) : st[sc];
      }
      if (cb == 1 && !et.empty()) {
        for (int64_t c = c0; c < c1; ++c) store(i0 + c, et[pc[i0 + c]] * s);
      } else {
        for (int64_t c = c0; c < c1; ++c) {
          const uint32_t code = load_code(pc, cb, i0 + c);
          store(i0 + c, (et.empty() ? fe.decode(code) : et[code]) * s);
        }
      }
    }
  }
}

}  // namespace

void encode_operand(double* v, const QuantSpec& spec, const void* codes, const void* scale_codes, int64_t rows,
                    int64_t cols) {
  encode_rows(spec, codes, scale_codes, rows, cols, [v](int64_t i, double x) { v[i] = x; });
}

void encode_operand_bf16(uint16_t* v, const QuantSpec& spec, const void* codes, const void* scale_codes, int64_t rows,
                         int64_t cols) {
  encode_rows(spec, codes, scale_codes, rows, cols,
              [v](int64_t i, double x) { v[i] = bf16_bits(static_cast<float>(x)); });
}

std::vector<double> quantize_encoded(const QuantSpec& spec, const float* x, int64_t rows, int64_t cols,
                                     QuantInfo* info, std::vector<float>* values) {
  const size_t n = static_cast<size_t>(rows * cols);
  std::vector<uint8_t> codes(n * static_cast<size_t>(spec.elem.code_bytes()));
  std::vector<uint8_t> scale_codes(
      static_cast<size_t>(std::max<int64_t>(1, block_count(spec, rows, cols) * (spec.scale ? spec.scale->code_bytes() : 1))));
  std::vector<float> own;
  std::vector<float>& dq = values ? *values : own;
  dq.resize(n);
  QuantOutput out;
  out.values = dq.data();
  out.codes = codes.data();
  out.scale_codes = scale_codes.data();
  const QuantInfo qi = quantize(spec, x, rows, cols, out);
  if (info) *info = qi;
  std::vector<double> v(n);
  encode_operand(v.data(), spec, codes.data(), scale_codes.data(), rows, cols);
  return v;
}

}  // namespace exmy::sim::quant

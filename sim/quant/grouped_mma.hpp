// The `grouped` GEMM output model (docs/recipes.md §6) on tensor cores: one
// kernel that forms each group's sum with BF16 MMAs (m16n8k16, FP32
// accumulation) where that sum is exact, and adds it into the output's
// float32 accumulator in the same kernel, instead of a float32 GEMM per
// group and a pass over C per group (grouped_gemm_launches). The pieces a
// thread runs are EXMY_HD functions here, shared by the CUDA kernel
// (sim/quant/cuda/grouped_gemm.cu) and its host emulation
// (grouped_mma_host, below), which differ only in who runs the threads and
// who does the MMA (the instruction on a device; mma_m16n8k16_host on the
// host, from the PTX ISA's fragment layouts).
//
// Why the bits are the CPU's. A group's products of a row pair are summed
// exactly by the MMAs when
//   (1) every element of both rows over the group is a BF16 number (the
//       conversion from the encoded doubles is exact: E2M1 payloads times
//       UE5M3/UE4M3/UE8M0 block scales have at most 6 significant bits), and
//   (2) the rows' exponent ranges put every partial sum on multiples of
//       2^L >= 2^-126 below 2^(L+24) (pair_exact_f32_normal), so that a
//       tensor core that forms BF16 products exactly and adds them with at
//       least 24 bits below the largest term (Fasi et al. 2021 for V100 and
//       A100; Khattak and Mikaitis 2025 for H100) loses nothing, in any
//       order and whatever C it chains in.
// The group's sum is then an exact float32, which group_round leaves as it
// is, and the thread adds it into its accumulator with `accumulate`'s
// rounding (add_exact; __fadd_rz on a device for RTZ, the IEEE operation
// add_exact computes). Per CTA tile (128 rows of A x 128 rows of B) and
// group the test is made once on the tile's widest ranges (tile_pair_fast:
// it implies the test for every row pair in the tile). A tile and group
// that fail it because their blocks' scales lie far apart pass it block by
// block of 16 (E2M1 block pairs always do): each block's MMAs from zero,
// the exact block sums added in double, exact where the tiles' ranges over
// the group pass pair_exact, rounded once (mma_group_class, kMmaBlocks).
// The rest take, per output, the test of its own row pair and the double
// or exact accumulator's group_sum from the doubles where even that fails
// (grouped_step's rule), which is slow and no E2M1 recipe's operands need
// (tests/quant/test_grouped_cuda.cpp counts the classes).
// The groups are added in K order, each output by one thread: no atomics.
//
// It applies to groups of a multiple of 16 elements (every shipped grouped
// recipe's 64); other groups take grouped_gemm_launches.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "formats/format.hpp"  // EXMY_HD, bits_of, float_of
#include "sim/kernel_launch.hpp"
#include "sim/mma_bf16.hpp"
#include "sim/quant/grouped_items.hpp"
#include "sim/quant/recipe.hpp"  // GemmModel

namespace exmy::sim::quant {

// A row's elements over a group are not all BF16 numbers (set by the
// conversion; range_of never sets it).
inline constexpr uint8_t kNotBf16 = 4;

namespace mma {

// The columns of group g (G wide, the last one cut at K).
EXMY_HD int64_t group_cols(int64_t K, int64_t G, int64_t g) { return K - g * G < G ? K - g * G : G; }

inline constexpr int kTile = 128;        // rows of A and of B a CTA covers
inline constexpr int kThreads = 256;     // 8 warps: 2 (along A's rows) x 4 (along B's)
inline constexpr int kChunkMax = 64;     // K columns a stage holds
inline constexpr int kLd = kChunkMax + 8;  // shared row stride in BF16 (144 bytes: no bank conflicts on fragment loads)
inline constexpr int kWarpRows = 64, kWarpCols = 32;
inline constexpr int kMi = kWarpRows / 16, kNi = kWarpCols / 8;  // m16 x n8 MMAs a warp keeps
inline constexpr int kElems = kMi * kNi * 4;                     // accumulator elements a thread keeps

// The stage width for groups of G: the largest of 64, 32, 16 dividing G.
EXMY_HD int chunk_of(int64_t G) { return G % 64 == 0 ? 64 : G % 32 == 0 ? 32 : 16; }

}  // namespace mma

// Whether the MMA kernel takes the model (groups of a multiple of 16), and
// whether EXMY_CUDA_GROUPED=tiles asks for grouped_gemm_launches instead (to
// compare the two in one sitting).
bool grouped_tiles_chosen();
inline bool grouped_mma_applies(const GemmModel& model) { return model.group >= 16 && model.group % 16 == 0; }

// The MMA kernel's scratch for groups of G (a multiple of 16), in
// GroupRange units (8 bytes): the rows' group ranges ((M + N) ceil(K/G)),
// the tiles' ((ceil(M/128) + ceil(N/128)) ceil(K/G)), the tiles' over each
// block of 16 columns ((ceil(M/128) + ceil(N/128)) ceil(K/G)·G/16), each
// padded to 64 bytes, then A's and B's rows as BF16, ceil(K/G)·G columns
// each (zeros past K), padded to 64 bytes.
struct MmaLayout {
  int64_t ng = 0, kp = 0, nb = 0, tm = 0, tn = 0;  // nb: blocks of 16 columns a row, kp / 16
  int64_t tiles_at = 0, btiles_at = 0, bf_at = 0, units = 0;  // offsets and size in units
};
inline MmaLayout grouped_mma_layout(int64_t M, int64_t N, int64_t K, int64_t G) {
  const auto pad8 = [](int64_t u) { return (u + 7) / 8 * 8; };
  MmaLayout l;
  l.ng = (K + G - 1) / G;
  l.kp = l.ng * G;
  l.tm = (M + mma::kTile - 1) / mma::kTile;
  l.tn = (N + mma::kTile - 1) / mma::kTile;
  l.nb = l.kp / 16;
  l.tiles_at = pad8((M + N) * l.ng);
  l.btiles_at = l.tiles_at + pad8((l.tm + l.tn) * l.ng);
  l.bf_at = l.btiles_at + pad8((l.tm + l.tn) * l.nb);
  l.units = l.bf_at + pad8(((M + N) * l.kp * 2 + 7) / 8);
  return l;
}

// The exactness test of a tile pair's group (a, b: the tiles' folded ranges,
// fold_tile_range): every row pair's group sum is exact in the MMAs.
EXMY_HD bool tile_pair_fast(const GroupRange& a, const GroupRange& b, int c) {
  if ((a.flags | b.flags) & (kSpecial | kNotBf16)) return false;
  if ((a.flags | b.flags) & kAllZero) return true;  // every product is zero: +0 either way
  return pair_exact_f32_normal(a, b, c);
}
// The same test for one row pair (the slow tiles' per-output test).
EXMY_HD bool row_pair_fast(const GroupRange& a, const GroupRange& b, int c) {
  return !((a.flags | b.flags) & kNotBf16) && pair_exact_f32_normal(a, b, c);
}

// A tile's range over a group from its rows' (n rows, `stride` apart):
// lo the least, hi the greatest, span the widest over the rows that are not
// all zero; kAllZero when every row is; kSpecial and kNotBf16 when any row
// has them. pair_exact_f32_normal of two such ranges implies it for every
// row pair of the tiles that are not all zero.
struct TileFold {
  int lo = kBig, hi = -kBig, span = -kBig;
  uint8_t flags = kAllZero;
  EXMY_HD void add(const GroupRange& x) {
    flags |= static_cast<uint8_t>(x.flags & (kSpecial | kNotBf16));
    if (x.flags & kAllZero) return;
    flags &= static_cast<uint8_t>(~kAllZero);
    lo = x.lo < lo ? x.lo : lo;
    hi = x.hi > hi ? x.hi : hi;
    span = x.span > span ? x.span : span;
  }
  EXMY_HD GroupRange range() const {
    return GroupRange{static_cast<int16_t>(lo), static_cast<int16_t>(hi), static_cast<int16_t>(span), flags};
  }
};
// Tile t of the layout's (A's tm, then B's tn): its first row in the
// rows of A then B (as the ranges and bf count them), its first row within
// its operand, and how many rows it has (at most 128).
struct TileRows {
  int64_t row, first, n;
};
EXMY_HD TileRows tile_rows(const MmaLayout& l, int64_t M, int64_t N, int64_t t) {
  const bool of_a = t < l.tm;
  const int64_t first = (of_a ? t : t - l.tm) * mma::kTile, rows = of_a ? M : N;
  return TileRows{(of_a ? 0 : M) + first, first, rows - first < mma::kTile ? rows - first : mma::kTile};
}
EXMY_HD GroupRange fold_tile_range(const GroupRange* rows, int64_t n, int64_t stride) {
  TileFold f;
  for (int64_t r = 0; r < n; ++r) f.add(rows[r * stride]);
  return f.range();
}

// A double's BF16 bits when it is a BF16 number (finite; a zero keeps its
// sign), else false.
EXMY_HD bool bf16_exact(double v, uint16_t& out) {
  const float f = static_cast<float>(v);
  const uint32_t b = bits_of(f);
  out = static_cast<uint16_t>(b >> 16);
  return static_cast<double>(f) == v && (b & 0xffffu) == 0;
}

// The conversion thread of row r (A's rows, then B's) over group g: its
// range (kNotBf16 added where an element is not a BF16 number) and its
// elements as BF16 at bf[r·kp + g·G ...], zeros up to the group's end.
EXMY_HD void mma_prepare_row(int64_t i, const double* A, const double* B, int64_t M, int64_t K, int64_t G,
                             const MmaLayout& l, GroupRange* ranges, uint16_t* bf) {
  const int64_t r = i / l.ng, g = i % l.ng, k0 = g * G, gk = mma::group_cols(K, G, g);
  const double* row = (r < M ? A + r * K : B + (r - M) * K) + k0;
  GroupRange x = range_of(row, gk);
  uint16_t* out = bf + r * l.kp + k0;
  bool exact = true;
  for (int64_t k = 0; k < gk; ++k) exact = bf16_exact(row[k], out[k]) && exact;
  for (int64_t k = gk; k < G; ++k) out[k] = 0;
  if (!exact) x.flags |= kNotBf16;
  ranges[i] = x;
}

// ---------------------------------------------------------------------------
// The CTA's threads: staging, fragments, the accumulator steps, the stores.
// ---------------------------------------------------------------------------

// Thread tid's share of staging one operand's tile rows [r0, r0 + 128)
// (rows < nrows exist; the others are zeros) over columns [kc, kc + chunk)
// of bf (row stride kp) into the shared array s (row stride mma::kLd).
EXMY_HD void mma_stage(int tid, const uint16_t* bf, int64_t kp, int64_t r0, int64_t nrows, int64_t kc, int chunk,
                       uint16_t* s) {
  const int per_row = chunk / 8;  // sixteen-byte units a row
  for (int u = tid; u < mma::kTile * per_row; u += mma::kThreads) {
    const int r = u / per_row, c = (u % per_row) * 8;
    Bf16x8 v{{0, 0, 0, 0}};
    if (r0 + r < nrows) v = load_as<Bf16x8>(bf + (r0 + r) * kp + kc + c);
    store_as(s + r * mma::kLd + c, v);
  }
}

// The A and B fragments of m16n8k16 from a staged tile (row stride
// mma::kLd; sim/mma_bf16.hpp).
EXMY_HD void mma_load_a(const uint16_t* s, int r0, int k0, int lane, uint32_t a[4]) {
  mma_frag_a(s, mma::kLd, r0, k0, lane, a);
}
EXMY_HD void mma_load_b(const uint16_t* s, int n0, int k0, int lane, uint32_t b[2]) {
  mma_frag_b(s, mma::kLd, n0, k0, lane, b);
}

// The CTA-tile coordinates of a thread's accumulator element e = (mi·kNi +
// ni)·4 + i: C fragment element i of lane = row groupID (+8 for i >= 2),
// column 2·threadID_in_group + (i & 1).
EXMY_HD void mma_elem_coord(int warp, int lane, int e, int& row, int& col) {
  const int mi = e / (mma::kNi * 4), ni = (e / 4) % mma::kNi, i = e % 4;
  const int g = lane >> 2, t = lane & 3;
  row = (warp / 4) * mma::kWarpRows + mi * 16 + g + (i >= 2 ? 8 : 0);
  col = (warp % 4) * mma::kWarpCols + ni * 8 + 2 * t + (i & 1);
}

// The accumulator addition: add_exact's rounding; on a device RTZ is the
// hardware's IEEE round-toward-zero addition (the value add_exact forms).
template <bool kAccRtz>
EXMY_HD float mma_add(float acc, float s) {
#if defined(__CUDA_ARCH__)
  if constexpr (kAccRtz) return __fadd_rz(acc, s);
#endif
  return add_exact<kAccRtz>(acc, s);
}

// What the MMA kernel needs of a call.
struct MmaArgs {
  float* C = nullptr;
  const double* A = nullptr;
  const double* B = nullptr;
  int64_t M = 0, N = 0, K = 0, G = 64;
  MmaLayout l;
  const GroupRange* ranges = nullptr;  // rows' (A's, then B's), ng each
  const GroupRange* tiles = nullptr;   // tiles' (A's tm, then B's tn), ng each
  const GroupRange* btiles = nullptr;  // tiles' over each block of 16 columns, nb each
  const uint16_t* bf = nullptr;        // rows as BF16, kp each
  GroupedEpilogue epilogue;
  bool group_rtz = false, acc_rtz = false;
};

// Thread tid's share of staging both operands' tile rows (CTA tile m0, n0)
// over columns [kc, kc + chunk): A's into As, B's into Bs.
EXMY_HD void mma_stage_both(int tid, const MmaArgs& p, int64_t m0, int64_t n0, int64_t kc, int chunk, uint16_t* As,
                            uint16_t* Bs) {
  mma_stage(tid, p.bf, p.l.kp, m0, p.M, kc, chunk, As);
  mma_stage(tid, p.bf + p.M * p.l.kp, p.l.kp, n0, p.N, kc, chunk, Bs);
}

// Output (m, n)'s sum over group g in a tile that failed the tiles' test:
// f (its element of the MMAs' product, + 0) where the row pair's test
// holds, else group_sum from the doubles. Not inlined on a device (a
// thread's 64 elements would copy the exact accumulator 64 times).
template <bool kGroupRtz>
EXMY_HD EXMY_MMA_NOINLINE float mma_slow_sum(const MmaArgs& p, int64_t m, int64_t n, int64_t g, float f) {
  const int64_t k0 = g * p.G, gk = mma::group_cols(p.K, p.G, g);
  const GroupRange& ra = p.ranges[m * p.l.ng + g];
  const GroupRange& rb = p.ranges[(p.M + n) * p.l.ng + g];
  if (row_pair_fast(ra, rb, ceil_log2(gk) + 2)) return f + 0.0f;
  return group_sum<kGroupRtz>(p.A + m * p.K + k0, p.B + n * p.K + k0, gk, ra, rb);
}

// A thread's step after group g's MMAs (grp: its elements of the group's
// product): each accumulator element plus the group's sum, which is grp
// (+ 0) where the tile's test or the row pair's holds, else group_sum from
// the doubles (grouped_step's rule).
template <bool kGroupRtz, bool kAccRtz>
EXMY_HD void mma_group_step(const MmaArgs& p, int64_t m0, int64_t n0, int64_t g, bool fast, int warp, int lane,
                            float* acc, const float* grp) {
  if (fast) {
    EXMY_MMA_UNROLL
    for (int e = 0; e < mma::kElems; ++e) acc[e] = mma_add<kAccRtz>(acc[e], grp[e] + 0.0f);
    return;
  }
  EXMY_MMA_UNROLL
  for (int e = 0; e < mma::kElems; ++e) {
    int row, col;
    mma_elem_coord(warp, lane, e, row, col);
    const int64_t m = m0 + row, n = n0 + col;
    if (m < p.M && n < p.N) acc[e] = mma_add<kAccRtz>(acc[e], mma_slow_sum<kGroupRtz>(p, m, n, g, grp[e]));
  }
}

// How group g of CTA tile (bm, bn) is summed (the same answer for every
// thread of the CTA):
//   kMmaChain      the group's MMAs chained: the tiles' test over the group
//                  holds, every output's group sum is exact in float32;
//   kMmaBlocks     each block of 16 columns its own MMA from zero, exact by
//                  the tiles' test over the block, the block sums added in
//                  double, exact by the tiles' double test over the group
//                  (pair_exact), rounded once (group_round): groups whose
//                  blocks' scales lie too far apart for one float32 window
//                  (G of 16, 32 or 64: the group staged whole);
//   kMmaPerOutput  else: per output, its rows' own test or group_sum.
enum MmaClass : int { kMmaChain = 0, kMmaBlocks = 1, kMmaPerOutput = 2 };
EXMY_HD int mma_group_class(const MmaArgs& p, int64_t bm, int64_t bn, int64_t g) {
  const int64_t k0 = g * p.G, gk = mma::group_cols(p.K, p.G, g);
  const GroupRange& ta = p.tiles[bm * p.l.ng + g];
  const GroupRange& tb = p.tiles[(p.l.tm + bn) * p.l.ng + g];
  const int c = ceil_log2(gk) + 2;
  if (tile_pair_fast(ta, tb, c)) return kMmaChain;
  if (mma::chunk_of(p.G) != p.G || ((ta.flags | tb.flags) & (kSpecial | kNotBf16)) || !pair_exact(ta, tb, c))
    return kMmaPerOutput;
  for (int64_t j = 0; j * 16 < gk; ++j) {
    const int64_t b = k0 / 16 + j, bk = gk - j * 16 < 16 ? gk - j * 16 : 16;
    if (!tile_pair_fast(p.btiles[bm * p.l.nb + b], p.btiles[(p.l.tm + bn) * p.l.nb + b], ceil_log2(bk) + 2))
      return kMmaPerOutput;
  }
  return kMmaBlocks;
}

// kMmaBlocks, one m16 row block mi of the warp's at a time (kPart of a
// thread's elements, [mi·kPart, (mi + 1)·kPart): few registers for the
// double sums): a block's product (blk) into the group's double sums; at
// the group's end, each sum rounded once (+ 0: an exact zero is +0) and
// added into the accumulator.
inline constexpr int kPart = mma::kNi * 4;
EXMY_HD void mma_block_add(double* gd, const float* blk) {
  EXMY_MMA_UNROLL
  for (int e = 0; e < kPart; ++e) gd[e] += static_cast<double>(blk[e]);
}
template <bool kGroupRtz, bool kAccRtz>
EXMY_HD void mma_blocks_finish(float* acc_part, const double* gd) {
  EXMY_MMA_UNROLL
  for (int e = 0; e < kPart; ++e) acc_part[e] = mma_add<kAccRtz>(acc_part[e], round_exact<kGroupRtz>(gd[e] + 0.0));
}

// A thread's stores: the epilogue of each of its elements inside C.
EXMY_HD void mma_store(const MmaArgs& p, int64_t m0, int64_t n0, int warp, int lane, const float* acc) {
  EXMY_MMA_UNROLL
  for (int e = 0; e < mma::kElems; ++e) {
    int row, col;
    mma_elem_coord(warp, lane, e, row, col);
    const int64_t m = m0 + row, n = n0 + col;
    if (m < p.M && n < p.N) p.C[m * p.N + n] = p.epilogue(acc[e]);
  }
}

// ---------------------------------------------------------------------------
// The host emulation.
// ---------------------------------------------------------------------------

// One warp's m16n8k16 MMAs over columns [ks, ks + 16) of the staged tiles
// for its row blocks mi in [mi0, mi1), into d (the warp's 32 lanes'
// elements, kElems a lane, element (mi·kNi + ni)·4 + i; `off` subtracted
// from the element index: a half's array); MMAs whose 16 rows or 8 columns
// all lie past M or N are skipped (no thread stores their outputs).
inline void mma_warp_host(const uint16_t* As, const uint16_t* Bs, int warp, int ks, int mi0, int mi1, int64_t m0,
                          int64_t n0, int64_t M, int64_t N, float* d, int stride, int off) {
  using namespace mma;
  uint32_t a[32][4], b[32][2];
  float c[32][4];
  for (int mi = mi0; mi < mi1; ++mi)
    for (int ni = 0; ni < kNi; ++ni) {
      const int r0 = (warp / 4) * kWarpRows + mi * 16, c0 = (warp % 4) * kWarpCols + ni * 8;
      if (m0 + r0 >= M || n0 + c0 >= N) continue;
      float* const at = d + warp * 32 * stride + (mi * kNi + ni) * 4 - off;
      for (int lane = 0; lane < 32; ++lane) {
        mma_load_a(As, r0, ks, lane, a[lane]);
        mma_load_b(Bs, c0, ks, lane, b[lane]);
        for (int i = 0; i < 4; ++i) c[lane][i] = at[lane * stride + i];
      }
      mma_m16n8k16_host(a, b, c);
      for (int lane = 0; lane < 32; ++lane)
        for (int i = 0; i < 4; ++i) at[lane * stride + i] = c[lane][i];
    }
}

// The kernel's CTAs one after another, their warps and lanes in turn (the
// kernel's order of stages, MMAs and group steps; sim/quant/cuda/grouped_gemm.cu).
template <bool kGroupRtz, bool kAccRtz>
void grouped_mma_host(const MmaArgs& p) {
  using namespace mma;
  static_assert(kThreads == 256 && kMi * 16 * 2 == kTile && kNi * 8 * 4 == kTile);
  const int chunk = chunk_of(p.G);
  const int64_t M = p.M, N = p.N;
  std::vector<uint16_t> As(kTile * kLd), Bs(kTile * kLd);
  std::vector<float> acc(static_cast<size_t>(kThreads) * kElems), grp(acc.size()), blk(static_cast<size_t>(kThreads) * kPart);
  std::vector<double> gd(blk.size());
  const auto stage = [&](int64_t m0, int64_t n0, int64_t kc) {
    for (int tid = 0; tid < kThreads; ++tid) mma_stage_both(tid, p, m0, n0, kc, chunk, As.data(), Bs.data());
  };
  for (int64_t bm = 0; bm < p.l.tm; ++bm)
    for (int64_t bn = 0; bn < p.l.tn; ++bn) {
      const int64_t m0 = bm * kTile, n0 = bn * kTile;
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t g = 0; g < p.l.ng; ++g) {
        const int64_t k0 = g * p.G, gk = mma::group_cols(p.K, p.G, g);
        const int cls = mma_group_class(p, bm, bn, g);
        if (cls == kMmaBlocks) {  // the group staged whole (G <= 64)
          stage(m0, n0, k0);
          for (int h = 0; h < kMi; ++h) {
            std::fill(gd.begin(), gd.end(), 0.0);
            for (int ks = 0; ks < gk; ks += 16) {
              std::fill(blk.begin(), blk.end(), 0.0f);
              for (int warp = 0; warp < kThreads / 32; ++warp)
                mma_warp_host(As.data(), Bs.data(), warp, ks, h, h + 1, m0, n0, M, N, blk.data(), kPart, h * kPart);
              for (int tid = 0; tid < kThreads; ++tid) mma_block_add(gd.data() + tid * kPart, blk.data() + tid * kPart);
            }
            for (int tid = 0; tid < kThreads; ++tid)
              mma_blocks_finish<kGroupRtz, kAccRtz>(acc.data() + tid * kElems + h * kPart, gd.data() + tid * kPart);
          }
          continue;
        }
        std::fill(grp.begin(), grp.end(), 0.0f);
        for (int64_t kc = k0; kc < k0 + gk; kc += chunk) {
          stage(m0, n0, kc);
          for (int warp = 0; warp < kThreads / 32; ++warp)
            for (int ks = 0; ks < chunk; ks += 16)
              mma_warp_host(As.data(), Bs.data(), warp, ks, 0, kMi, m0, n0, M, N, grp.data(), kElems, 0);
        }
        for (int tid = 0; tid < kThreads; ++tid)
          mma_group_step<kGroupRtz, kAccRtz>(p, m0, n0, g, cls == kMmaChain, tid / 32, tid % 32,
                                             acc.data() + tid * kElems, grp.data() + tid * kElems);
      }
      for (int tid = 0; tid < kThreads; ++tid) mma_store(p, m0, n0, tid / 32, tid % 32, acc.data() + tid * kElems);
    }
}

// The launches before the MMA kernel (over a launcher): the rows'
// conversion and ranges, the tiles' ranges. Returns the kernel's arguments.
template <class L>
MmaArgs grouped_mma_prepare(const L& launch, float* C, const double* A, const double* B, int64_t M, int64_t N,
                            int64_t K, const GemmModel& model, GroupedAlpha alpha, GroupRange* scratch) {
  const MmaLayout l = grouped_mma_layout(M, N, K, model.group);
  const int64_t G = model.group;
  GroupRange* const ranges = scratch;
  GroupRange* const tiles = scratch + l.tiles_at;
  GroupRange* const btiles = scratch + l.btiles_at;
  uint16_t* const bf = reinterpret_cast<uint16_t*>(scratch + l.bf_at);
  launch("grouped_mma prepare", (M + N) * l.ng,
         [=] EXMY_HD_LAMBDA(int64_t i) { mma_prepare_row(i, A, B, M, K, G, l, ranges, bf); });
  launch("grouped_mma tiles", (l.tm + l.tn) * l.ng, [=] EXMY_HD_LAMBDA(int64_t i) {
    const TileRows tr = tile_rows(l, M, N, i / l.ng);
    tiles[i] = fold_tile_range(ranges + tr.row * l.ng + i % l.ng, tr.n, l.ng);
  });
  // the tiles' ranges over each block of 16 columns, from the doubles
  // (columns past K: none, an all-zero range)
  launch("grouped_mma block tiles", (l.tm + l.tn) * l.nb, [=] EXMY_HD_LAMBDA(int64_t i) {
    const int64_t t = i / l.nb, k0 = (i % l.nb) * 16, bk = mma::group_cols(K, 16, k0 / 16);
    const TileRows tr = tile_rows(l, M, N, t);
    const double* const base = (t < l.tm ? A : B) + tr.first * K + k0;
    TileFold f;
    for (int64_t r = 0; r < tr.n && bk > 0; ++r) f.add(range_of(base + r * K, bk));
    btiles[i] = f.range();
  });
  return MmaArgs{.C = C, .A = A, .B = B, .M = M, .N = N, .K = K, .G = G, .l = l, .ranges = ranges, .tiles = tiles,
                 .btiles = btiles, .bf = bf, .epilogue = GroupedEpilogue(model.grid, alpha),
                 .group_rtz = model.group_round == Round::rtz, .acc_rtz = model.accumulate == Round::rtz};
}

}  // namespace exmy::sim::quant

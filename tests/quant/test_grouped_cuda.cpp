// The grouped GEMM output model's kernels (sim/quant/cuda/grouped_gemm_cuda.hpp)
// against the CPU's grouped_gemm (itself checked against grouped_gemm_ref
// and rational arithmetic in test_grouped_gemm.cpp), bit for bit: shapes
// that cut the CPU's 128-wide tiles and the model's groups anywhere (K < G,
// partial last groups, K = 0, one output), every (group_round, accumulate)
// pair, grids that are and are not powers of two, the built-in model and
// the models of the shipped recipes with their own operand specs; operands
// with all-zero rows and signed zeros, blocks with subnormal scales, double
// subnormals, NaN, ±Inf (Inf·0, +Inf and -Inf in one group), spreads past
// 53 bits (the exact accumulator's path), accumulator overflow; the row
// outer scales' epilogue. The entry points run the MMA kernel for groups of
// a multiple of 16 (sim/quant/grouped_mma.hpp; its fragment loads, its
// tiles' exactness test on training-like operands, elements that are not
// BF16 numbers) and the float32 tiles otherwise (tested on their own too).
//
// Built twice (tests/quant/CMakeLists.txt):
// - test_grouped_cuda_emulated (label "unit"): the launches with their
//   threads run on the host (sim::HostLaunch), on every machine;
// - test_grouped_cuda (label "gpu", only with CUDA): the kernels on the
//   device; every test reports SKIPPED without a CUDA device.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "formats/quantize.hpp"
#include "formats/spec.hpp"
#include "sim/quant/cuda/grouped_gemm_cuda.hpp"
#include "sim/quant/grouped_gemm.hpp"
#include "sim/quant/grouped_mma.hpp"
#include "sim/quant/recipe.hpp"
#include "tests/models/kernel_test.hpp"  // BufferOf, KERNEL, EXMY_REQUIRE_CUDA, expect_bits

#if !defined(EXMY_TEST_EMULATED)
#include <cuda_runtime.h>

#include "sim/cuda/gemm_cuda.hpp"  // CudaGemm: the BF16 GEMM the MMA kernel's time is set against
#endif

namespace exmy::sim::quant {
namespace {

using models::BufferOf;
using models::bits;
using models::expect_bits;
using Vec = std::vector<float>;
using Doubles = std::vector<double>;

std::string shape_name(int64_t M, int64_t N, int64_t K, const GemmModel& m) {
  return std::to_string(M) + "x" + std::to_string(N) + "x" + std::to_string(K) + " G=" + std::to_string(m.group) +
         (m.group_round == Round::rtz ? " group rtz" : " group rne") +
         (m.accumulate == Round::rtz ? " acc rtz" : " acc rne") + " grid=" + std::to_string(m.grid);
}

// The CPU's C (grouped_gemm) and the kernels' (on the device's copies of the
// operands, C prefilled with a value neither writes), compared bit for bit.
// Returns the CPU's C.
Vec check(const Doubles& A, const Doubles& B, int64_t M, int64_t N, int64_t K, const GemmModel& m, float alpha,
          const std::string& what, bool with_ref = false) {
  Vec want(static_cast<size_t>(M * N));
  grouped_gemm(want.data(), A.data(), B.data(), M, N, K, m, alpha);
  if (with_ref) {  // the reference too, where it is cheap enough
    Vec ref(want.size());
    grouped_gemm_ref(ref.data(), A.data(), B.data(), M, N, K, m, alpha);
    expect_bits(want, ref, what + " (CPU fast vs reference)");
  }
  BufferOf<double> a(A), b(B);
  BufferOf<float> c(Vec(want.size(), -1234.5f));
  BufferOf<GroupRange> r(std::vector<GroupRange>(static_cast<size_t>(std::max<int64_t>(1, grouped_gemm_scratch(M, N, K, m)))));
  KERNEL(grouped_gemm)(c.ptr(), a.ptr(), b.ptr(), M, N, K, m, alpha, r.ptr());
  expect_bits(c.get(), want, what);
  // alpha in the kernels' memory (GroupedAlpha::at: training's
  // grouped_gemm_scaled, whose host never reads it), a decoy value beside it
  BufferOf<float> at(Vec{alpha}), c2(Vec(want.size(), -1234.5f));
  KERNEL(grouped_gemm)(c2.ptr(), a.ptr(), b.ptr(), M, N, K, m, GroupedAlpha(alpha == 2.0f ? 3.0f : 2.0f, at.ptr()),
                       r.ptr());
  expect_bits(c2.get(), want, what + " (alpha in memory)");
  return want;
}

// How many elements are neither zero nor NaN (a check with mostly zero
// outputs would be vacuous).
int64_t nonzero(const Vec& C) {
  int64_t n = 0;
  for (const float v : C) n += v != 0 && v == v;
  return n;
}

// Normal data (rows, K) with every 97th element times `outlier` (spreading
// the block scales) and rows `tiny_every` apart (from row 1) times `tiny`
// (blocks whose scales fall below the scale format's normal range).
Vec data(int64_t rows, int64_t K, uint32_t seed, double outlier = 1.0, int64_t tiny_every = 0, float tiny = 1.0f) {
  Vec x = models::randn(static_cast<size_t>(rows * K), seed);
  for (size_t i = 0; i < x.size(); i += 97) x[i] *= static_cast<float>(outlier);
  if (tiny_every > 0)
    for (int64_t r = 1; r < rows; r += tiny_every)
      for (int64_t k = 0; k < K; ++k) x[static_cast<size_t>(r * K + k)] *= tiny;
  return x;
}

QuantSpec operand_spec(const char* scale, int br, int bc) {
  QuantSpec s;
  s.elem = parse_format("e2m1");
  s.scale = parse_format(scale);
  s.block_rows = br;
  s.block_cols = bc;
  if (std::string(scale) == "ue8m0") {
    s.rule = ScaleRule::mx_floor;
    s.amax_kind = AmaxKind::none;
  } else {
    s.amax_kind = AmaxKind::current;
    s.scale_target = 448;
  }
  return s;
}

struct Shape {
  int64_t M, N, K;
};
// Past the CPU's 128 x 128 tiles, K < G, partial last groups, one output,
// K a multiple of the group, K = 0.
const Shape kShapes[] = {{37, 45, 200}, {130, 260, 96}, {33, 20, 48}, {24, 19, 160}, {17, 31, 150},
                         {1, 1, 1},     {129, 3, 70},   {2, 131, 64}, {5, 3, 0}};

// The built-in model (GemmModel's defaults with kind = grouped) and models
// over every rounding pair, groups of 5 to 200, grids none, 3, 7, 1024, 2^30.
std::vector<GemmModel> models_to_check() {
  GemmModel builtin;
  builtin.kind = GemmModel::Kind::grouped;
  return {builtin,
          {GemmModel::Kind::grouped, 64, Round::rne, Round::rtz, 1024},
          {GemmModel::Kind::grouped, 7, Round::rtz, Round::rne, 0},
          {GemmModel::Kind::grouped, 200, Round::rne, Round::rne, 3},
          {GemmModel::Kind::grouped, 16, Round::rtz, Round::rtz, 1024},
          {GemmModel::Kind::grouped, 5, Round::rne, Round::rtz, 7},
          {GemmModel::Kind::grouped, 32, Round::rtz, Round::rtz, int64_t{1} << 30}};
}

// The scratch: the ranges (3 groups for 3 + 5 rows: 24; 1 group: 8, both
// already a multiple of 64 bytes), then the float32 arrays, each a
// multiple of 16 floats: the tile's rows over a group of 64 (3 x 64 and 5 x
// 64) and their product (3 x 5 -> 16), two floats a unit.
TEST(GroupedKernels, ScratchSize) {
  GemmModel m;
  m.group = 64;
  EXPECT_EQ(grouped_tiles_scratch(3, 5, 130, m), 24 + (192 + 320 + 16) / 2);
  EXPECT_EQ(grouped_tiles_scratch(3, 5, 64, m), 8 + (192 + 320 + 16) / 2);
  EXPECT_EQ(grouped_tiles_scratch(3, 5, 0, m), 0);
  EXPECT_EQ(grouped_gemm_scratch(3, 5, 0, m), 0);
  EXPECT_EQ(sizeof(GroupRange), 8u);
  // Tiles: at most `cap` floats an array, at least one row; all of A's rows
  // where the product holds them.
  for (const int64_t cap : {int64_t{200}, int64_t{1000}, int64_t{1} << 24})
    for (const auto& [M, N, K] : {std::array<int64_t, 3>{4096, 21504, 4096}, {21504, 4096, 4096}, {37, 45, 200},
                                  {8, 3, 5000}}) {
      const GroupedTiles t = grouped_tiles(M, N, K, 64, cap);
      const std::string what = std::to_string(cap) + ": " + std::to_string(M) + " x " + std::to_string(N);
      EXPECT_TRUE(t.ta >= 1 && t.ta <= M && t.tb >= 1 && t.tb <= N) << what;
      EXPECT_EQ(t.width, 64) << what;
      EXPECT_TRUE(t.ta * t.width <= cap && t.tb * t.width <= cap && t.ta * t.tb <= cap) << what;
    }
  EXPECT_EQ(grouped_tiles(4096, 21504, 4096, 64).ta, 4096);
  EXPECT_EQ(grouped_tiles(4096, 21504, 4096, 64).tb, 4096);
}

#if defined(EXMY_TEST_EMULATED)
// The float32 path cut into tiles of one to a few rows (caps of 200 to 5000
// floats an array) gives the CPU's bits, and it takes most (row pair,
// group) sums of E2M1 operands with UE5M3 scales (else the bit-for-bit
// tests here would check the double path alone).
TEST(GroupedKernels, FloatTilesGiveTheCpuBitsAndCarryMostGroups) {
  const int64_t M = 37, N = 45, K = 200;
  QuantInfo ia, ib;
  const Vec xa = data(M, K, 3), xb = data(N, K, 4);
  const Doubles A = quantize_encoded(operand_spec("ue5m3", 1, 16), xa.data(), M, K, &ia);
  const Doubles B = quantize_encoded(operand_spec("ue5m3", 16, 16), xb.data(), N, K, &ib);
  const GemmModel m{GemmModel::Kind::grouped, 64, Round::rne, Round::rtz, 1024};
  const float alpha = tensor_decode_alpha(ia.t, ib.t);
  Vec want(static_cast<size_t>(M * N));
  grouped_gemm(want.data(), A.data(), B.data(), M, N, K, m, alpha);
  for (const int64_t cap : {200, 1000, 5000}) {
    std::vector<GroupRange> s(static_cast<size_t>(grouped_tiles_scratch(M, N, K, m, cap)));
    Vec c(want.size(), -1234.5f);
    grouped_gemm_launches(HostLaunch{}, HostFloatGemm{}, c.data(), A.data(), B.data(), M, N, K, m, alpha, s.data(), cap);
    expect_bits(c, want, "float32 tiles of at most " + std::to_string(cap) + " floats");
  }
  int64_t f32 = 0, all = 0;
  for (int64_t k0 = 0; k0 < K; k0 += m.group) {
    const int64_t gk = std::min(m.group, K - k0);
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j, ++all)
        f32 += pair_exact_f32_normal(range_of(A.data() + i * K + k0, gk), range_of(B.data() + j * K + k0, gk),
                                     ceil_log2(gk) + 2);
  }
  std::printf("float32 path: %lld of %lld group sums\n", static_cast<long long>(f32), static_cast<long long>(all));
  EXPECT_GT(f32, all * 3 / 4);
}
#endif

// The MMA kernel's pieces (sim/quant/grouped_mma.hpp): the fragment loads
// of a shared tile against the PTX ISA's element coordinates (through the
// host MMA: A·B of a 16 x 16 and a 16 x 8 of distinct small integers,
// exact in any order), at an offset inside the shared tile.
TEST(GroupedKernels, MmaFragmentsFollowThePtxLayout) {
  std::vector<uint16_t> As(mma::kTile * mma::kLd), Bs(As.size());
  const int r0 = 48, c0 = 24, k0 = 16;
  float a[16][16], b[16][8];  // b: k x n
  for (int r = 0; r < 16; ++r)
    for (int k = 0; k < 16; ++k) {
      a[r][k] = static_cast<float>((r * 16 + k) % 23 - 11);
      As[static_cast<size_t>((r0 + r) * mma::kLd + k0 + k)] = static_cast<uint16_t>(bits(a[r][k]) >> 16);
    }
  for (int k = 0; k < 16; ++k)
    for (int n = 0; n < 8; ++n) {
      b[k][n] = static_cast<float>((k * 8 + n * 5) % 19 - 9);
      Bs[static_cast<size_t>((c0 + n) * mma::kLd + k0 + k)] = static_cast<uint16_t>(bits(b[k][n]) >> 16);
    }
  uint32_t fa[32][4], fb[32][2];
  float d[32][4] = {};
  for (int lane = 0; lane < 32; ++lane) {
    mma_load_a(As.data(), r0, k0, lane, fa[lane]);
    mma_load_b(Bs.data(), c0, k0, lane, fb[lane]);
    for (int i = 0; i < 4; ++i) d[lane][i] = static_cast<float>(lane * 4 + i);  // C
  }
  mma_m16n8k16_host(fa, fb, d);
  for (int lane = 0; lane < 32; ++lane)
    for (int i = 0; i < 4; ++i) {
      int r, n;
      mma_c_coord(lane, i, r, n);
      float want = static_cast<float>(lane * 4 + i);
      for (int k = 0; k < 16; ++k) want += a[r][k] * b[k][n];
      EXPECT_EQ(d[lane][i], want) << "lane " << lane << " element " << i;
      // the accumulator element's place in the CTA tile (warp 5: rows 64.., columns 32..)
      int row, col;
      mma_elem_coord(5, lane, (1 * mma::kNi + 2) * 4 + i, row, col);
      EXPECT_EQ(row, 64 + 16 + r);
      EXPECT_EQ(col, 32 + 16 + n);
    }
}

// Operands like a training step's (normal data with outliers, E2M1 with
// UE5M3 scales 1x16 and 16x16, ue5m3-b16's model): the MMA kernel's
// emulation gives the CPU's bits, and every (CTA tile, group) takes the
// MMAs: chained on plain normal data; with every 97th element 30 times the
// rest (block scales too far apart for one float32 window), most per block
// (else the kernel would run its slow per-output path, and the tests here
// would not check the MMAs).
TEST(GroupedKernels, MmaTilesCarryTrainingOperands) {
  const int64_t M = 300, N = 260, K = 512;
  const GemmModel m{GemmModel::Kind::grouped, 64, Round::rne, Round::rtz, 1024};
  for (const double outlier : {1.0, 30.0}) {
    QuantInfo ia, ib;
    const Vec xa = data(M, K, 51, outlier), xb = data(N, K, 52);
    const Doubles A = quantize_encoded(operand_spec("ue5m3", 1, 16), xa.data(), M, K, &ia);
    const Doubles B = quantize_encoded(operand_spec("ue5m3", 16, 16), xb.data(), N, K, &ib);
    const float alpha = tensor_decode_alpha(ia.t, ib.t);
    Vec want(static_cast<size_t>(M * N)), c(want.size(), -1234.5f);
    grouped_gemm(want.data(), A.data(), B.data(), M, N, K, m, alpha);
    std::vector<GroupRange> s(static_cast<size_t>(grouped_gemm_scratch(M, N, K, m)));
    const MmaArgs p = grouped_mma_prepare(HostLaunch{}, c.data(), A.data(), B.data(), M, N, K, m, alpha, s.data());
    // tile groups by class (chained MMAs, per-block MMAs, per output); output
    // groups on group_sum (in per-output tiles, where the rows' own test fails)
    int64_t cls[3] = {0, 0, 0}, tiles = 0, on_sum = 0, pairs = 0;
    for (int64_t bm = 0; bm < p.l.tm; ++bm)
      for (int64_t bn = 0; bn < p.l.tn; ++bn)
        for (int64_t g = 0; g < p.l.ng; ++g, ++tiles) {
          const int c = mma_group_class(p, bm, bn, g);
          ++cls[c];
          const int64_t gk = std::min(m.group, K - g * m.group);
          for (int64_t i = bm * mma::kTile; i < std::min(M, (bm + 1) * mma::kTile); ++i)
            for (int64_t j = bn * mma::kTile; j < std::min(N, (bn + 1) * mma::kTile); ++j, ++pairs)
              on_sum += c == kMmaPerOutput &&
                        !row_pair_fast(p.ranges[i * p.l.ng + g], p.ranges[(M + j) * p.l.ng + g], ceil_log2(gk) + 2);
        }
    std::printf("outlier %g: of %lld tile groups %lld chained, %lld per block, %lld per output; %lld of %lld output "
                "groups on group_sum\n",
                outlier, static_cast<long long>(tiles), static_cast<long long>(cls[0]), static_cast<long long>(cls[1]),
                static_cast<long long>(cls[2]), static_cast<long long>(on_sum), static_cast<long long>(pairs));
    if (outlier == 1.0) {
      EXPECT_EQ(cls[kMmaChain], tiles);
    } else {
      EXPECT_EQ(cls[kMmaChain] + cls[kMmaBlocks], tiles);
      EXPECT_GT(cls[kMmaBlocks], tiles / 2);
    }
    grouped_mma_host<false, true>(p);
    expect_bits(c, want, "MMA kernel, outlier " + std::to_string(outlier));
  }
}

// Operands whose group sums are exact in float32 but whose elements are
// not BF16 numbers (12 significant bits against powers of two): the MMA
// kernel must not take its BF16 products for them. Such rows in all of A,
// or only in B's second tile of 128 rows (the others powers of two).
TEST(GroupedKernels, ElementsPastBf16) {
  EXMY_REQUIRE_CUDA();
  std::mt19937 g(17);
  const auto wide = [&] { return static_cast<double>(2048 + g() % 2048) * ((g() & 1) ? 1 : -1) / 1024.0; };
  const auto pow2 = [&] { return (g() & 1) ? 1.0 : -2.0; };
  for (const bool in_a : {true, false}) {
    const int64_t M = 40, N = in_a ? 24 : 140, K = 128;
    Doubles A(static_cast<size_t>(M * K)), B(static_cast<size_t>(N * K));
    for (double& v : A) v = in_a ? wide() : pow2();
    for (int64_t j = 0; j < N; ++j)
      for (int64_t k = 0; k < K; ++k) B[static_cast<size_t>(j * K + k)] = !in_a && j >= 128 ? wide() : pow2();
    for (const int64_t G : {int64_t{16}, int64_t{64}}) {
      const GemmModel m{GemmModel::Kind::grouped, G, Round::rne, Round::rtz, 0};
      const Vec C = check(A, B, M, N, K, m, 1.0f, shape_name(M, N, K, m) + (in_a ? " A" : " B") + " 12-bit elements",
                          true);
      EXPECT_GT(nonzero(C), M * N / 2);
    }
  }
}

// A group with 1 and -2^-30 (the exact sum needs 31 bits; group_round RTZ
// tells one rounding from two) in one block of 16, or in two blocks: within
// a block the MMA's float32 sum cannot be exact (the per-output path must
// take it), across blocks the per-block sums added in double are.
TEST(GroupedKernels, WideSpreadsWithinAndAcrossBlocks) {
  EXMY_REQUIRE_CUDA();
  const int64_t M = 6, N = 5, K = 64;
  for (const int64_t second : {int64_t{3}, int64_t{20}}) {  // the -2^-30's column: block 0 or block 1
    Doubles A(static_cast<size_t>(M * K), 0.0), B(static_cast<size_t>(N * K), 1.0);
    for (int64_t i = 0; i < M; ++i) {
      A[static_cast<size_t>(i * K + 1)] = 1.0 + static_cast<double>(i);
      A[static_cast<size_t>(i * K + second)] = -std::ldexp(1.0, -30);
    }
    const GemmModel m{GemmModel::Kind::grouped, 64, Round::rtz, Round::rne, 0};
    const Vec C = check(A, B, M, N, K, m, 1.0f, std::string("-2^-30 in block ") + (second < 16 ? "0" : "1"), true);
    EXPECT_EQ(C[0], std::nextafter(1.0f, 0.0f));  // RTZ(1 - 2^-30), rounded once
  }
}

TEST(GroupedKernels, MatchTheCpuOverShapesModelsAndScales) {
  EXMY_REQUIRE_CUDA();
  struct Scale {
    const char* scale;
    double outlier;
  };
  // ue5m3 with narrow and wide block-scale spreads, ue4m3, ue8m0 (MX) with
  // a spread past float32's range
  const Scale scales[] = {{"ue5m3", 1.0}, {"ue5m3", 1e4}, {"ue4m3", 1.0}, {"ue8m0", 1e30}};
  uint32_t seed = 10;
  for (const Shape& s : kShapes)
    for (const Scale& sc : scales) {
      float ta = 1, tb = 1;
      QuantInfo ia, ib;
      const Vec xa = data(s.M, s.K, ++seed, sc.outlier), xb = data(s.N, s.K, ++seed);
      const Doubles A = s.K > 0 ? quantize_encoded(operand_spec(sc.scale, 1, 16), xa.data(), s.M, s.K, &ia) : Doubles();
      const Doubles B = s.K > 0 ? quantize_encoded(operand_spec(sc.scale, 16, 16), xb.data(), s.N, s.K, &ib) : Doubles();
      if (s.K > 0) ta = ia.t, tb = ib.t;
      const float alpha = tensor_decode_alpha(ta, tb);
      for (const GemmModel& m : models_to_check()) {
        const bool small = s.M * s.N * s.K <= 200000;
        const Vec C = check(A, B, s.M, s.N, s.K, m, alpha, shape_name(s.M, s.N, s.K, m) + " " + sc.scale, small);
        if (s.K >= 16) {
          EXPECT_GT(nonzero(C), s.M * s.N / 2) << shape_name(s.M, s.N, s.K, m) << " " << sc.scale;
        }
      }
    }
}

// Every shipped recipe that quantizes: operands quantized with its own
// resolved specs (RHT off: it changes the data, not the numbers the GEMM
// sees) for the three GEMMs of a linear, under its grouped model, or for the
// recipes with the fp32 model, under the grouped model the shipped grouped
// recipes set (as `--set recipe.gemm.model=grouped` would). Operands with
// row outer scales (nvfp4-row-scaled) take apply_outer_alpha, as
// QuantizedLinear::run_gemm.
TEST(GroupedKernels, ShippedRecipes) {
  EXMY_REQUIRE_CUDA();
  int grouped = 0, row_scaled = 0;
  const GemmModel shipped{GemmModel::Kind::grouped, 64, Round::rne, Round::rtz, 1024};  // ue5m3-b16's
  for (const std::string& name : recipe_names()) {
    Recipe r = load_recipe(name);
    if (!r.quantize) continue;
    if (r.gemm.kind == GemmModel::Kind::grouped) {
      ++grouped;
      EXPECT_EQ(r.gemm, shipped) << name << ": a new grouped model; add it to models_to_check()";
    } else {
      r.gemm = shipped;
    }
    LinearInfo info;
    info.name = "layers.1.mixer.up_proj";
    info.layer = 1;
    info.kind = LinearKind::mlp_up;
    info.in_features = 160;
    info.out_features = 96;
    const int64_t blocks = 8;
    ASSERT_TRUE(r.quantizes(info, blocks)) << name;
    const std::array<RoleSpec, kNumRoles> specs = r.resolve(info, blocks);
    uint32_t seed = 100;
    for (const Gemm g : {Gemm::fprop, Gemm::dgrad, Gemm::wgrad}) {
      const auto [left, right] = gemm_roles(g);
      const int64_t M = 70, N = 45, K = g == Gemm::wgrad ? 96 : 160;
      QuantSpec sa = specs[static_cast<size_t>(role_index(left))].q, sb = specs[static_cast<size_t>(role_index(right))].q;
      for (QuantSpec* q : {&sa, &sb}) {
        q->rht = false;
        if (q->amax_kind == AmaxKind::given) q->amax_kind = AmaxKind::current;
      }
      QuantInfo ia, ib;
      const Vec xa = data(M, K, ++seed, 30.0), xb = data(N, K, ++seed);
      const Doubles A = quantize_encoded(sa, xa.data(), M, K, &ia), B = quantize_encoded(sb, xb.data(), N, K, &ib);
      const std::string what = name + " " + std::string(gemm_name(g));
      if (ia.row_t.empty() && ib.row_t.empty()) {
        const Vec C = check(A, B, M, N, K, r.gemm, tensor_decode_alpha(ia.t, ib.t), what);
        EXPECT_GT(nonzero(C), M * N / 2) << what;
        continue;
      }
      ++row_scaled;
      Vec want = check(A, B, M, N, K, r.gemm, 1.0f, what + " (alpha 1)");
      apply_outer_alpha(want.data(), M, N, ia.t, ia.row_t.empty() ? nullptr : ia.row_t.data(), ib.t,
                        ib.row_t.empty() ? nullptr : ib.row_t.data());
      BufferOf<float> c(Vec(want.size())), rta(ia.row_t), rtb(ib.row_t);
      BufferOf<double> a(A), b(B);
      BufferOf<GroupRange> s(std::vector<GroupRange>(static_cast<size_t>(grouped_gemm_scratch(M, N, K, r.gemm))));
      KERNEL(grouped_gemm)(c.ptr(), a.ptr(), b.ptr(), M, N, K, r.gemm, 1.0f, s.ptr());
      KERNEL(apply_outer_alpha)(c.ptr(), M, N, ia.t, ia.row_t.empty() ? nullptr : rta.ptr(), ib.t,
                                ib.row_t.empty() ? nullptr : rtb.ptr());
      expect_bits(c.get(), want, what + " with row outer scales");
    }
  }
  // ue5m3-b16, ue5m3-b32, te-nvfp4-grouped, nvfp4-no-rht-all-grouped
  EXPECT_GE(grouped, 4);
  EXPECT_GE(row_scaled, 1);  // nvfp4-row-scaled's fprop and dgrad and wgrad
}

// Row outer scales on either operand, both or neither, with an alpha that
// underflows (t = FLT_MAX) and one that overflows, on operands quantized
// with per-row scales.
TEST(GroupedKernels, OuterAlpha) {
  EXMY_REQUIRE_CUDA();
  const int64_t M = 23, N = 37, K = 80;
  QuantSpec sa = operand_spec("ue5m3", 1, 16), sb = operand_spec("ue5m3", 1, 16);
  sa.outer = OuterScale::row;
  QuantInfo ia, ib;
  const Vec xa = data(M, K, 41, 40.0), xb = data(N, K, 42);
  const Doubles A = quantize_encoded(sa, xa.data(), M, K, &ia), B = quantize_encoded(sb, xb.data(), N, K, &ib);
  ASSERT_EQ(ia.row_t.size(), static_cast<size_t>(M));
  Vec row_ta = ia.row_t, row_tb(static_cast<size_t>(N));
  for (int64_t j = 0; j < N; ++j) row_tb[static_cast<size_t>(j)] = std::ldexp(1.25f, 30 - static_cast<int>(j) * 3);
  row_ta[2] = FLT_MAX;    // an alpha that underflows
  row_ta[3] = 1e-30f;     // and one that overflows
  const GemmModel m{GemmModel::Kind::grouped, 16, Round::rne, Round::rtz, 1024};
  for (const bool a_rows : {true, false})
    for (const bool b_rows : {true, false}) {
      const std::string what = std::string("outer alpha, rows ") + (a_rows ? "A" : "-") + (b_rows ? "B" : "-");
      Vec want = check(A, B, M, N, K, m, 1.0f, what + " (alpha 1)");
      apply_outer_alpha(want.data(), M, N, ia.t, a_rows ? row_ta.data() : nullptr, ib.t,
                        b_rows ? row_tb.data() : nullptr);
      BufferOf<double> a(A), b(B);
      BufferOf<float> c(Vec(want.size())), rta(row_ta), rtb(row_tb);
      BufferOf<GroupRange> s(std::vector<GroupRange>(static_cast<size_t>(grouped_gemm_scratch(M, N, K, m))));
      KERNEL(grouped_gemm)(c.ptr(), a.ptr(), b.ptr(), M, N, K, m, 1.0f, s.ptr());
      KERNEL(apply_outer_alpha)(c.ptr(), M, N, ia.t, a_rows ? rta.ptr() : nullptr, ib.t, b_rows ? rtb.ptr() : nullptr);
      expect_bits(c.get(), want, what);
    }
}

// Blocks whose scale codes are subnormals of the scale format (UE5M3 below
// 2^-14, UE4M3 below 2^-6) and MX blocks with scales at 2^-127, whose group
// sums round to float32 subnormals (against normal blocks) or to zero
// (against each other).
TEST(GroupedKernels, SubnormalScaleBlocks) {
  EXMY_REQUIRE_CUDA();
  const int64_t M = 40, N = 33, K = 150;
  struct Case {
    const char* scale;
    float tiny;
    double below;  // an encoded |a| below this has a subnormal block scale
  };
  const Case cases[] = {{"ue5m3", 1e-7f, 0.5 * std::ldexp(1.0, -14)},
                        {"ue4m3", 1e-5f, 0.5 * std::ldexp(1.0, -6)},
                        {"ue8m0", 1e-38f, std::ldexp(1.0, -110)}};
  for (const Case& c : cases) {
    QuantInfo ia, ib;
    const Vec xa = data(M, K, 51, 1.0, 3, c.tiny), xb = data(N, K, 52, 1.0, 4, c.tiny);
    const Doubles A = quantize_encoded(operand_spec(c.scale, 1, 16), xa.data(), M, K, &ia);
    const Doubles B = quantize_encoded(operand_spec(c.scale, 1, 16), xb.data(), N, K, &ib);
    int tiny = 0;
    for (const double v : A) tiny += v != 0 && std::fabs(v) < c.below;
    EXPECT_GT(tiny, 0) << c.scale << ": no block of A has a subnormal scale; the test would be vacuous";
    int subnormal = 0;
    for (const GemmModel& m : models_to_check()) {
      const Vec C =
          check(A, B, M, N, K, m, tensor_decode_alpha(ia.t, ib.t), shape_name(M, N, K, m) + " tiny " + c.scale, true);
      for (const float v : C) subnormal += std::fpclassify(v) == FP_SUBNORMAL;
    }
    if (std::string(c.scale) == "ue8m0") {
      EXPECT_GT(subnormal, 0) << "no float32 subnormal output";
    }
  }
}

// Hand-made operands: spreads past 53 bits, a double subnormal, NaN, +Inf
// with a zero (Inf·0), +Inf and -Inf in one group, all-zero rows of signed
// zeros, a row that cancels exactly; groups that need the exact
// accumulator on some row pairs and not on others.
TEST(GroupedKernels, ZerosSpecialsAndWideSpreads) {
  EXMY_REQUIRE_CUDA();
  const int64_t M = 9, N = 7, K = 70;
  std::mt19937_64 g(5);
  std::uniform_int_distribution<int> e(-3, 3);
  std::uniform_int_distribution<int> mant(0, 15);
  auto value = [&] { return std::ldexp(1.0 + mant(g) / 16.0, e(g)) * ((g() & 1) ? -1.0 : 1.0); };
  Doubles A(static_cast<size_t>(M * K)), B(static_cast<size_t>(N * K));
  for (auto& v : A) v = value();
  for (auto& v : B) v = value();
  auto a = [&](int64_t i, int64_t k) -> double& { return A[static_cast<size_t>(i * K + k)]; };
  auto b = [&](int64_t j, int64_t k) -> double& { return B[static_cast<size_t>(j * K + k)]; };
  a(0, 3) = std::ldexp(1.0, 90);
  a(0, 4) = std::ldexp(1.0, -90);      // a group spanning 180 bits
  a(1, 10) = std::ldexp(1.5, -1000);   // products below double's normal range
  a(1, 11) = 4.9406564584124654e-324;  // a double subnormal
  a(2, 65) = INFINITY;
  b(3, 65) = 0.0;  // Inf·0 for output (2, 3)
  a(3, 1) = std::nan("");
  for (int64_t k = 0; k < K; ++k) a(4, k) = (k & 1) ? -0.0 : 0.0;  // signed zeros
  b(1, 2) = -INFINITY;
  a(5, 20) = INFINITY;
  b(4, 20) = 1.0;
  b(4, 21) = -1.0;
  a(5, 21) = INFINITY;  // +Inf and -Inf products in one group of output (5, 4)
  for (int64_t k = 0; k < K; ++k) a(6, k) = (k % 2 ? -1.0 : 1.0) * std::ldexp(1.0, 40);
  for (int64_t k = 0; k < K; ++k) b(5, k) = 1.0;  // (6, 5) cancels to an exact zero per pair of products
  for (int64_t k = 0; k < K; ++k) a(7, k) = std::ldexp(1.0 + mant(g) / 16.0, 120);  // float overflow
  for (int64_t k = 0; k < K; ++k) a(8, k) = std::ldexp(1.0, -75);                   // float underflow
  // The exact accumulator is needed on some row pairs and not on others.
  int exact_pairs = 0, fallback_pairs = 0;
  for (const int64_t G : {int64_t{16}, int64_t{64}})
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j)
        for (int64_t k0 = 0; k0 < K; k0 += G) {
          const int64_t gk = std::min(G, K - k0);
          const bool ok = pair_exact(range_of(&a(i, k0), gk), range_of(&b(j, k0), gk), ceil_log2(gk) + 2);
          (ok ? exact_pairs : fallback_pairs) += 1;
        }
  EXPECT_GT(exact_pairs, 0);
  EXPECT_GT(fallback_pairs, 0);
  for (const GemmModel& m : models_to_check())
    for (const float alpha : {0.75f, 1.0f, 3e38f}) {
      const Vec C = check(A, B, M, N, K, m, alpha, shape_name(M, N, K, m) + " specials", true);
      EXPECT_EQ(bits(C[3 * N + 0]), 0x7fc00000u);  // NaN operand: the canonical NaN
      EXPECT_EQ(bits(C[2 * N + 3]), 0x7fc00000u);  // Inf·0
      EXPECT_EQ(bits(C[5 * N + 4]), 0x7fc00000u);  // +Inf and -Inf
      EXPECT_EQ(bits(C[4 * N + 0]), 0u);           // all zeros: +0
      EXPECT_EQ(bits(C[6 * N + 5]), 0u);           // exact cancellation: +0
    }
}

// Float32 accumulator overflow and cancellation (group sums near 2^124):
// RTZ saturates at ±FLT_MAX, RNE overflows to ±Inf.
TEST(GroupedKernels, AccumulatorOverflowAndCancellation) {
  EXMY_REQUIRE_CUDA();
  const int64_t M = 5, N = 13, K = 256;
  Doubles A(static_cast<size_t>(M * K)), B(static_cast<size_t>(N * K));
  std::mt19937 g(9);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t k = 0; k < K; ++k) A[static_cast<size_t>(i * K + k)] = std::ldexp((g() & 1) ? 1.5 : 1.0, 60) * (i == 1 ? -1 : 1);
  for (int64_t j = 0; j < N; ++j)
    for (int64_t k = 0; k < K; ++k) {
      const double sign = j % 3 == 2 ? ((k / 16) % 2 ? -1.0 : 1.0) : 1.0;
      B[static_cast<size_t>(j * K + k)] = sign * std::ldexp((g() & 1) ? 1.25 : 1.0, 60 - (j % 5));
    }
  for (const Round acc : {Round::rtz, Round::rne}) {
    const GemmModel m{GemmModel::Kind::grouped, 16, Round::rne, acc, 0};
    const Vec C = check(A, B, M, N, K, m, 1.0f, shape_name(M, N, K, m) + " overflow", true);
    const float top = acc == Round::rtz ? FLT_MAX : INFINITY;
    EXPECT_EQ(C[0], top);
    EXPECT_EQ(C[1 * N + 0], -top);
  }
}

#if !defined(EXMY_TEST_EMULATED)
// Not a check: the MMA kernel's time on E2M1/UE5M3 operands of 4096 x 4096 x
// 4096 (normal data: chained MMAs; every 97th element 30 times the rest:
// per-block MMAs), against cuBLASLt's BF16 GEMM of the same operands in
// the same run (printed "[grouped mma] ..." for tools/gpu-check.sh's
// report; the median of 5 after a warm-up).
TEST(GroupedKernels, TimesTheMmaKernel) {
  EXMY_REQUIRE_CUDA();
  const int64_t M = 4096, N = 4096, K = 4096;
  const GemmModel m{GemmModel::Kind::grouped, 64, Round::rne, Round::rtz, 1024};
  CudaGemm bf16_gemm;
  cudaEvent_t t0, t1;
  ASSERT_EQ(cudaEventCreate(&t0), cudaSuccess);
  ASSERT_EQ(cudaEventCreate(&t1), cudaSuccess);
  const auto median_ms = [&](const auto& f) {
    std::vector<float> ms;
    for (int r = 0; r < 6; ++r) {
      cudaEventRecord(t0);
      f();
      cudaEventRecord(t1);
      EXPECT_EQ(cudaEventSynchronize(t1), cudaSuccess);
      float t = 0;
      cudaEventElapsedTime(&t, t0, t1);
      if (r) ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    return ms[2];
  };
  for (const double outlier : {1.0, 30.0}) {
    QuantInfo ia, ib;
    const Vec xa = data(M, K, 61, outlier), xb = data(N, K, 62);
    const Doubles A = quantize_encoded(operand_spec("ue5m3", 1, 16), xa.data(), M, K, &ia);
    const Doubles B = quantize_encoded(operand_spec("ue5m3", 16, 16), xb.data(), N, K, &ib);
    std::vector<uint16_t> ab(A.size()), bb(B.size());  // the encoded values are BF16 numbers
    for (size_t i = 0; i < A.size(); ++i) ab[i] = static_cast<uint16_t>(bits(static_cast<float>(A[i])) >> 16);
    for (size_t i = 0; i < B.size(); ++i) bb[i] = static_cast<uint16_t>(bits(static_cast<float>(B[i])) >> 16);
    BufferOf<double> a(A), b(B);
    BufferOf<uint16_t> a16(ab), b16(bb);
    BufferOf<float> c(Vec(static_cast<size_t>(M * N), 0.0f));
    BufferOf<GroupRange> sc(std::vector<GroupRange>(static_cast<size_t>(grouped_gemm_scratch(M, N, K, m))));
    const float alpha = tensor_decode_alpha(ia.t, ib.t);
    const float mma_ms = median_ms([&] { grouped_gemm_cuda(c.ptr(), a.ptr(), b.ptr(), M, N, K, m, alpha, sc.ptr()); });
    const float bf16_ms = median_ms([&] {
      bf16_gemm.run(c.ptr(), N, a16.ptr(), K, Op::N, b16.ptr(), K, Op::T, M, N, K, false, GemmOperands::bf16);
    });
    const double flops = 2.0 * static_cast<double>(M) * N * K;
    std::printf("[grouped mma] E2M1/UE5M3 %lldx%lldx%lld G=64, outlier %g: %.3f ms (%.1f TFLOP/s); cuBLASLt BF16 "
                "GEMM %.3f ms (%.1f TFLOP/s); ratio %.2f\n",
                static_cast<long long>(M), static_cast<long long>(N), static_cast<long long>(K), outlier, mma_ms,
                flops / mma_ms * 1e-9, bf16_ms, flops / bf16_ms * 1e-9, mma_ms / bf16_ms);
  }
  cudaEventDestroy(t0);
  cudaEventDestroy(t1);
}
#endif

}  // namespace
}  // namespace exmy::sim::quant

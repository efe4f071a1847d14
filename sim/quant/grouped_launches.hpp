// The float32-tiles launch sequence of the `grouped` GEMM output model
// (docs/recipes.md §6; the kernels' entry points take it for groups that
// are not a multiple of 16, or with EXMY_CUDA_GROUPED=tiles, and the MMA
// kernel of sim/quant/grouped_mma.hpp otherwise), written once over a
// launcher (sim/kernel_launch.hpp) and a float32 GEMM functor: sim/quant/cuda/grouped_gemm.cu instantiates it with
// DeviceLaunch and cuBLASLt, sim/quant/grouped_emulated.cpp with HostLaunch
// and sim::gemm. The thread bodies call the
// EXMY_HD functions of sim/quant/grouped_items.hpp, which the CPU's
// grouped_gemm and grouped_gemm_ref call too; every group sum is the exact
// sum rounded once and the groups are added in K order, so C equals the
// CPU's bit for bit. No thread reads what another thread of the same launch
// writes; no atomics.
#pragma once

#include <cstdint>

#include "formats/round.hpp"  // fp32_rne_div
#include "sim/gemm.hpp"     // Op
#include "sim/kernel_launch.hpp"
#include "sim/quant/grouped_items.hpp"
#include "sim/quant/grouped_mma.hpp"  // the MMA kernel's layout, for the scratch
#include "sim/quant/recipe.hpp"  // GemmModel

namespace exmy::sim::quant {

// The float32 path's tiles: rows of A and of B per tile, so that each of its
// three float32 arrays (the tile's rows of A and of B over one group
// converted, and the group's product, A rows x B rows) holds at most `cap`
// floats, the product's A rows first (all of them where they fit).
inline constexpr int64_t kGroupedTileFloats = int64_t{1} << 24;  // 64 MiB an array
struct GroupedTiles {
  int64_t ta = 1, tb = 1, width = 1;  // width: the widest group, min(G, K)
};
inline GroupedTiles grouped_tiles(int64_t M, int64_t N, int64_t K, int64_t G, int64_t cap = kGroupedTileFloats) {
  const auto clamp = [](int64_t v, int64_t hi) { return v < 1 ? int64_t{1} : v < hi ? v : hi; };
  GroupedTiles t;
  t.width = clamp(G < K ? G : K, K);
  const int64_t rows = clamp(cap / t.width, cap);  // operand rows a slice holds
  t.tb = clamp(cap / clamp(M, cap), clamp(N, rows));
  t.ta = clamp(cap / t.tb, clamp(M, rows));
  return t;
}

// Scratch of grouped_gemm_launches (grouped_tiles_scratch), in GroupRange
// (8 bytes): the group ranges of A's rows, then of B's rows ((M + N)
// ceil(K / G)), padded to 64 bytes, then the float32 arrays (A slice, B
// slice, product), each padded to 64 bytes.
inline int64_t grouped_ranges_units(int64_t M, int64_t N, int64_t K, const GemmModel& model) {
  return (M + N) * ((K + model.group - 1) / model.group);
}
inline int64_t grouped_tile_floats(int64_t n) { return (n + 15) / 16 * 16; }
inline int64_t grouped_tiles_scratch(int64_t M, int64_t N, int64_t K, const GemmModel& model,
                                     int64_t cap = kGroupedTileFloats) {
  if (M <= 0 || N <= 0 || K <= 0) return 0;
  const GroupedTiles t = grouped_tiles(M, N, K, model.group, cap);
  const int64_t floats = grouped_tile_floats(t.ta * t.width) + grouped_tile_floats(t.tb * t.width) +
                         grouped_tile_floats(t.ta * t.tb);
  return (grouped_ranges_units(M, N, K, model) + 7) / 8 * 8 + floats / 2;
}

// The scratch of the kernels' entry points (sim/quant/cuda/grouped_gemm_cuda.hpp),
// in GroupRange units: enough for the MMA kernel (sim/quant/grouped_mma.hpp)
// where it applies and for grouped_gemm_launches (which
// EXMY_CUDA_GROUPED=tiles chooses), the larger of the two.
inline int64_t grouped_gemm_scratch(int64_t M, int64_t N, int64_t K, const GemmModel& model) {
  if (M <= 0 || N <= 0 || K <= 0) return 0;
  const int64_t tiles = grouped_tiles_scratch(M, N, K, model);
  if (!grouped_mma_applies(model)) return tiles;
  const int64_t mma = grouped_mma_layout(M, N, K, model.group).units;
  return mma > tiles ? mma : tiles;
}

inline GroupedParams grouped_params(const GemmModel& model, GroupedAlpha alpha) {
  GroupedParams p;
  p.group = model.group;
  p.group_rtz = model.group_round == Round::rtz;
  p.acc_rtz = model.accumulate == Round::rtz;
  p.epilogue = GroupedEpilogue(model.grid, alpha);
  return p;
}

// The host's float32 GEMM functor for grouped_gemm_launches (sim::gemm; the
// host emulation and the tests pass it).
struct HostFloatGemm {
  void operator()(float* C, int64_t ldc, const float* A, int64_t lda, Op opA, const float* B, int64_t ldb, Op opB,
                  int64_t M, int64_t N, int64_t K) const {
    gemm<float>(C, ldc, A, lda, opA, B, ldb, opB, M, N, K, false);
  }
};

// grouped_gemm of sim/quant/grouped_gemm.hpp: C (M,N) = the model's product
// of the encoded operands A (M,K) and B (N,K), with alpha, through a float32
// GEMM functor gemm(C, ldc, A, lda, opA, B, ldb, opB, M, N, K) (C
// overwritten; cuBLASLt on a device, sim::gemm on the host; its order does
// not matter: only the outputs it forms exactly are used). A thread per
// (operand row, group) for the row's range over the group; C, the float32
// accumulator, from +0; per tile of A rows and B rows (grouped_tiles) and
// per group, in K order, the tile's rows over the group converted to
// float32, their float32 product and a thread per output element adding the
// group's sum (grouped_step: the product's value where
// pair_exact_f32_normal says it is exact, which it is for the common
// recipes, else the double or the exact accumulator's sum, as
// grouped_output); then the epilogue. Every group sum is exact before its
// one rounding: the CPU's bits.
template <class L, class Gemm>
void grouped_gemm_launches(const L& launch, const Gemm& gemm, float* C, const double* A, const double* B, int64_t M,
                           int64_t N, int64_t K, const GemmModel& model, GroupedAlpha alpha, GroupRange* scratch,
                           int64_t cap = kGroupedTileFloats) {
  if (M <= 0 || N <= 0) return;
  const GroupedParams p = grouped_params(model, alpha);
  if (K <= 0) {
    launch("grouped_gemm empty", M * N, [=] EXMY_HD_LAMBDA(int64_t i) { C[i] = p.epilogue(0.0f); });
    return;
  }
  const int64_t G = model.group, ng = (K + G - 1) / G;
  GroupRange* const ranges = scratch;
  launch("grouped_gemm ranges", (M + N) * ng, [=] EXMY_HD_LAMBDA(int64_t i) {
    const int64_t r = i / ng, g = i % ng;
    const double* row = r < M ? A + r * K : B + (r - M) * K;
    const int64_t k0 = g * G;
    ranges[i] = range_of(row + k0, K - k0 < G ? K - k0 : G);
  });
  const GroupedTiles t = grouped_tiles(M, N, K, G, cap);
  float* const fa = reinterpret_cast<float*>(scratch + (grouped_ranges_units(M, N, K, model) + 7) / 8 * 8);
  float* const fb = fa + grouped_tile_floats(t.ta * t.width);
  float* const part = fb + grouped_tile_floats(t.tb * t.width);
  launch("grouped_gemm zero", M * N, [=] EXMY_HD_LAMBDA(int64_t i) { C[i] = 0.0f; });
  for (int64_t m0 = 0; m0 < M; m0 += t.ta) {
    const int64_t mb = M - m0 < t.ta ? M - m0 : t.ta;
    for (int64_t n0 = 0; n0 < N; n0 += t.tb) {
      const int64_t nb = N - n0 < t.tb ? N - n0 : t.tb;
      for (int64_t g = 0; g < ng; ++g) {
        const int64_t k0 = g * G, gk = K - k0 < G ? K - k0 : G;
        // The tile's rows over the group, as float32 (rows gk apart).
        launch("grouped_gemm float a", mb * gk, [=] EXMY_HD_LAMBDA(int64_t i) {
          fa[i] = static_cast<float>(A[(m0 + i / gk) * K + k0 + i % gk]);
        });
        launch("grouped_gemm float b", nb * gk, [=] EXMY_HD_LAMBDA(int64_t i) {
          fb[i] = static_cast<float>(B[(n0 + i / gk) * K + k0 + i % gk]);
        });
        gemm(part, nb, static_cast<const float*>(fa), gk, Op::N, static_cast<const float*>(fb), gk, Op::T, mb, nb,
             gk);
        launch("grouped_gemm group", mb * nb, [=] EXMY_HD_LAMBDA(int64_t i) {
          const int64_t m = m0 + i / nb, n = n0 + i % nb;
          float& c = C[m * N + n];
          c = grouped_step(c, part[i], A + m * K + k0, B + n * K + k0, gk, ranges[m * ng + g], ranges[(M + n) * ng + g],
                           p.group_rtz, p.acc_rtz);
        });
      }
    }
  }
  launch("grouped_gemm epilogue", M * N, [=] EXMY_HD_LAMBDA(int64_t i) { C[i] = p.epilogue(C[i]); });
}

// apply_outer_alpha of sim/quant/grouped_gemm.hpp: C (M,N), made with alpha
// = 1, becomes fl(C · fl(fl(1/t_a,m) · fl(1/t_b,n))); an operand without row
// scales (row_t null) takes its tensor scale t for every row. A thread per
// element.
template <class L>
void apply_outer_alpha_launches(const L& launch, float* C, int64_t M, int64_t N, float t_a, const float* row_t_a,
                                float t_b, const float* row_t_b) {
  if (M <= 0 || N <= 0) return;
  launch("grouped_gemm outer alpha", M * N, [=] EXMY_HD_LAMBDA(int64_t i) {
    const int64_t m = i / N, n = i % N;
    const float ga = fp32_rne_div(1.0, row_t_a ? row_t_a[m] : t_a);
    const float gb = fp32_rne_div(1.0, row_t_b ? row_t_b[n] : t_b);
    C[i] = outer_alpha_element(C[i], ga, gb);
  });
}

}  // namespace exmy::sim::quant

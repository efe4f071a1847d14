// The launch sequence of the `grouped` GEMM output model (docs/recipes.md
// §6), written once over a launcher (sim/kernel_launch.hpp):
// sim/quant/cuda/grouped_gemm.cu instantiates it with DeviceLaunch,
// sim/quant/grouped_emulated.cpp with HostLaunch. The thread bodies call the
// EXMY_HD functions of sim/quant/grouped_items.hpp, which the CPU's
// grouped_gemm and grouped_gemm_ref call too; every group sum is the exact
// sum rounded once and the groups are added in K order, so C equals the
// CPU's bit for bit. No thread reads what another thread of the same launch
// writes; no atomics.
#pragma once

#include <cstdint>

#include "formats/round.hpp"  // fp32_rne_div
#include "sim/kernel_launch.hpp"
#include "sim/quant/grouped_items.hpp"
#include "sim/quant/recipe.hpp"  // GemmModel

namespace exmy::sim::quant {

// Scratch of grouped_gemm_launches: (M + N) · ceil(K / G) GroupRange (8
// bytes each): the group ranges of A's rows, then of B's rows.
inline int64_t grouped_gemm_scratch(int64_t M, int64_t N, int64_t K, const GemmModel& model) {
  if (M <= 0 || N <= 0 || K <= 0) return 0;
  return (M + N) * ((K + model.group - 1) / model.group);
}

inline GroupedParams grouped_params(const GemmModel& model, float alpha) {
  GroupedParams p;
  p.group = model.group;
  p.group_rtz = model.group_round == Round::rtz;
  p.acc_rtz = model.accumulate == Round::rtz;
  p.epilogue = GroupedEpilogue(model.grid, alpha);
  return p;
}

// grouped_gemm of sim/quant/grouped_gemm.hpp: C (M,N) = the model's product
// of the encoded operands A (M,K) and B (N,K), with alpha. A thread per
// (operand row, group) for the row's range over the group, then a thread per
// output element (grouped_output: its groups in K order). `ranges` holds
// grouped_gemm_scratch(M, N, K, model) GroupRange.
template <class L>
void grouped_gemm_launches(const L& launch, float* C, const double* A, const double* B, int64_t M, int64_t N,
                           int64_t K, const GemmModel& model, float alpha, GroupRange* ranges) {
  if (M <= 0 || N <= 0) return;
  const GroupedParams p = grouped_params(model, alpha);
  const int64_t G = model.group;
  const int64_t ng = K > 0 ? (K + G - 1) / G : 0;
  if (ng > 0) {
    launch("grouped_gemm ranges", (M + N) * ng, [=] EXMY_HD_LAMBDA(int64_t i) {
      const int64_t r = i / ng, g = i % ng;
      const double* row = r < M ? A + r * K : B + (r - M) * K;
      const int64_t k0 = g * G;
      ranges[i] = range_of(row + k0, K - k0 < G ? K - k0 : G);
    });
  }
  const int64_t K0 = K > 0 ? K : 0;
  launch("grouped_gemm outputs", M * N, [=] EXMY_HD_LAMBDA(int64_t i) {
    const int64_t m = i / N, n = i % N;
    C[i] = grouped_output(A + m * K0, B + n * K0, K0, ranges + m * ng, ranges + (M + n) * ng, p);
  });
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

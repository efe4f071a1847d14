// Defines the entry points of sim/quant/cuda/grouped_gemm_cuda.hpp for one
// launcher: included by sim/quant/cuda/grouped_gemm.cu (DeviceLaunch,
// cuBLASLt, suffix cuda) and sim/quant/grouped_emulated.cpp (HostLaunch,
// sim::gemm, suffix emulated) with EXMY_LAUNCHER, EXMY_FLOAT_GEMM (a float32
// GEMM functor, sim/quant/grouped_launches.hpp), EXMY_MMA_RUN (runs the MMA
// kernel on its MmaArgs, sim/quant/grouped_mma.hpp) and EXMY_SUFFIX defined.
// Groups of a multiple of 16 take the MMA kernel unless
// EXMY_CUDA_GROUPED=tiles; others take grouped_gemm_launches.
#include "sim/quant/grouped_launches.hpp"

#define EXMY_CAT2(a, b) a##_##b
#define EXMY_CAT(a, b) EXMY_CAT2(a, b)

namespace exmy::sim::quant {

void EXMY_CAT(grouped_gemm, EXMY_SUFFIX)(float* C, const double* A, const double* B, int64_t M, int64_t N, int64_t K,
                                         const GemmModel& model, GroupedAlpha alpha, GroupRange* scratch) {
  if (M > 0 && N > 0 && K > 0 && grouped_mma_applies(model) && !grouped_tiles_chosen()) {
    EXMY_MMA_RUN(grouped_mma_prepare(EXMY_LAUNCHER{}, C, A, B, M, N, K, model, alpha, scratch));
    return;
  }
  grouped_gemm_launches(EXMY_LAUNCHER{}, EXMY_FLOAT_GEMM{}, C, A, B, M, N, K, model, alpha, scratch);
}
void EXMY_CAT(apply_outer_alpha, EXMY_SUFFIX)(float* C, int64_t M, int64_t N, float t_a, const float* row_t_a,
                                              float t_b, const float* row_t_b) {
  apply_outer_alpha_launches(EXMY_LAUNCHER{}, C, M, N, t_a, row_t_a, t_b, row_t_b);
}

}  // namespace exmy::sim::quant

#undef EXMY_CAT
#undef EXMY_CAT2

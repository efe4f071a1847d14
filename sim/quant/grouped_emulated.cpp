// The host emulation of the grouped GEMM kernels: the launches of
// sim/quant/grouped_launches.hpp with sim::HostLaunch (threads one after
// another) and the CPU's float32 GEMM.
#include "sim/gemm.hpp"
#include "sim/quant/cuda/grouped_gemm_cuda.hpp"

namespace exmy::sim::quant {
namespace {

struct HostFloatGemm {
  void operator()(float* C, int64_t ldc, const float* A, int64_t lda, Op opA, const float* B, int64_t ldb, Op opB,
                  int64_t M, int64_t N, int64_t K) const {
    sim::gemm<float>(C, ldc, A, lda, opA, B, ldb, opB, M, N, K, false);
  }
};

}  // namespace
}  // namespace exmy::sim::quant

#define EXMY_LAUNCHER sim::HostLaunch
#define EXMY_FLOAT_GEMM HostFloatGemm
#define EXMY_SUFFIX emulated
#include "sim/quant/cuda/grouped_define.hpp"

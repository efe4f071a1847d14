// The grouped GEMM output model on a CUDA device: the launches of
// sim/quant/grouped_launches.hpp with sim::DeviceLaunch and cuBLASLt's
// float32 GEMM (the launch shape only; the arithmetic is
// sim/quant/grouped_items.hpp, shared with the CPU).
#include "sim/cuda/gemm_cuda.hpp"
#include "sim/quant/cuda/grouped_gemm_cuda.hpp"

namespace exmy::sim::quant {
namespace {

// One float32 product on cuBLASLt (FP32 arithmetic, no TF32), through the
// block launches' handle (sim::DeviceBatchedGemm, one entry).
struct DeviceFloatGemm {
  void operator()(float* C, int64_t ldc, const float* A, int64_t lda, Op opA, const float* B, int64_t ldb, Op opB,
                  int64_t M, int64_t N, int64_t K) const {
    sim::DeviceBatchedGemm{}(1, C, ldc, 0, A, lda, 0, opA, B, ldb, 0, opB, M, N, K, false);
  }
};

}  // namespace
}  // namespace exmy::sim::quant

#define EXMY_LAUNCHER sim::DeviceLaunch
#define EXMY_FLOAT_GEMM DeviceFloatGemm
#define EXMY_SUFFIX cuda
#include "sim/quant/cuda/grouped_define.hpp"

// The plain precision policies of sim/linear.hpp on a CUDA device: Linears
// whose forward and backward take DEVICE pointers (X, W, Y, dY, dX, dW all
// float32 in device memory, laid out as in sim/linear.hpp) and run the CPU
// Linear's three GEMMs through sim::CudaGemm (sim/cuda/gemm_cuda.hpp):
//
//   `fp32`: the GEMMs on the float operands as given (FP32, no TF32);
//   `bf16`: each GEMM's operands rounded to bfloat16 first, as the CPU's
//           `bf16` Linear rounds them (forward X and W; backward dY, W for
//           dgrad when dX is wanted, X for wgrad; round to nearest even with
//           sim::bf16_bits, the function sim::round_bf16 calls), then
//           BF16 operands with FP32 accumulation; the outputs Y, dX, dW stay
//           float32, unrounded, as on the CPU.
//
// BF16 holds the rounded operands exactly, so a result differs from the
// CPU's only in the order of each output's sum (tests/sim/test_linear_cuda.cpp
// states the budget). backward accumulates into dX and dW, forward overwrites
// Y; dX may be null. recompute_forward is forward (the CPU's default): the
// same call gives the same bits (CudaGemm keeps a shape's algorithm).
//
// Everything is enqueued on the default stream, which orders it with the
// model's other kernels. The `bf16` Linears of one factory share one set of
// bfloat16 scratch buffers (X, W, dY), kept between calls and grown as needed
// (growing frees the old buffer, which waits for the device): so a factory's
// Linears are called from one host thread, as CudaGemm itself is. The scratch
// lives as long as the factory or any Linear it made.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>

#include "sim/cuda/gemm_cuda.hpp"
#include "sim/linear.hpp"

namespace exmy::sim {

// The device Linears of `policy`, "fp32" or "bf16"; any other name throws
// exmy::Error "unknown precision policy 'NAME' (expected fp32 or bf16)"
// (sim::parse_linear_policy) before anything touches the device. The
// factory and its Linears run their GEMMs on `gemm`, which must outlive
// them all (the device training step owns one CudaGemm for the run).
std::unique_ptr<LinearFactory<float>> make_cuda_linear_factory(std::string_view policy, CudaGemm& gemm);

// out[i] = the bfloat16 bits of in[i] rounded to nearest even (sim::bf16_bits,
// sim/bf16.hpp), i in [0, n); device pointers, the default stream. The
// `bf16` Linears' operand rounding.
void bf16_bits_cuda(uint16_t* out, const float* in, int64_t n);

}  // namespace exmy::sim

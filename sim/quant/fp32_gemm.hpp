// train.fp32_gemm: how a recipe's `fp32` GEMM output model runs
// (QuantizedLinear, RuntimeOptions::fp32_gemm). Apart from the quantized
// linear so that the run configuration's parser (and its fuzz target) reads
// it without the training libraries.
#pragma once

#include <cstdint>
#include <string_view>

namespace exmy::sim::quant {

// How the `fp32` GEMM output model's GEMMs run (train.fp32_gemm):
//   sgemm: FP32 GEMMs of the decoded operands x̂ (docs/recipes.md §6; the
//          CPU's default and its bits);
//   bf16:  where bfloat16 holds every encoded value q·s of both operands'
//          formats (bf16_holds_encoded), a BF16 GEMM of the encoded
//          operands with FP32 accumulation and the tensor decode scales
//          applied to its result, C = fl(alpha · Σ (q·s)_a (q·s)_b) with
//          alpha = fl(fl(1/t_a) · fl(1/t_b)) (per output element with row
//          outer scales), as a tensor-core GEMM computes it; sgemm
//          otherwise. It differs from sgemm by the placement of the tensor
//          scales' roundings besides the order of the sums (the budget:
//          docs/recipes.md §6, tests/quant/test_fp32_gemm_bf16.cpp).
enum class Fp32Gemm : uint8_t { sgemm, bf16 };

// train.fp32_gemm's values: sgemm, bf16, or auto (bf16 on a CUDA device,
// sgemm on the CPU and cuda-emulated). Throws exmy::Error naming `what`
// (the key or option) and the value.
Fp32Gemm parse_fp32_gemm(std::string_view v, bool on_cuda, std::string_view what = "train.fp32_gemm");
// "sgemm" or "bf16"
const char* fp32_gemm_name(Fp32Gemm g);

}  // namespace exmy::sim::quant

#include "sim/quant/fp32_gemm.hpp"

#include <string>

#include "formats/error.hpp"

namespace exmy::sim::quant {

Fp32Gemm parse_fp32_gemm(std::string_view v, bool on_cuda, std::string_view what) {
  if (v == "auto") return on_cuda ? Fp32Gemm::bf16 : Fp32Gemm::sgemm;
  if (v == "sgemm") return Fp32Gemm::sgemm;
  if (v == "bf16") return Fp32Gemm::bf16;
  throw Error(std::string(what) + ": bad value '" + std::string(v) + "' (expected auto, sgemm or bf16)");
}

const char* fp32_gemm_name(Fp32Gemm g) { return g == Fp32Gemm::bf16 ? "bf16" : "sgemm"; }

}  // namespace exmy::sim::quant

// The `bf16` device Linears' operand rounding (sim/cuda/linear_cuda.hpp):
// sim/bf16.hpp's launch with sim::DeviceLaunch (the rounding is bf16_bits,
// shared with the CPU's sim::round_bf16).
#include "sim/bf16.hpp"
#include "sim/cuda/linear_cuda.hpp"

namespace exmy::sim {

void bf16_bits_cuda(uint16_t* out, const float* in, int64_t n) { bf16_bits_launches(DeviceLaunch{}, out, in, n); }

}  // namespace exmy::sim

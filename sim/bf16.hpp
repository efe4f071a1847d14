// Rounding float to bfloat16, as one EXMY_HD function for the CPU and the
// device: sim::round_bf16 (sim/linear.cpp, the `bf16` policy's operands on
// the CPU) returns bf16_value(bf16_bits(x)), and the device's copies of the
// operands (sim/cuda/linear_cuda.hpp) are bf16_bits_launches with
// sim::DeviceLaunch, so both round every float to the same bfloat16.
#pragma once

#include <cstdint>

#include "formats/format.hpp"  // EXMY_HD, bits_of, float_of
#include "sim/kernel_launch.hpp"

namespace exmy::sim {

// The bfloat16 bits of x rounded to nearest, ties to even. Adding half an
// ulp of bf16 (minus one when the kept last bit is 0) and truncating is
// round-to-nearest-even on the 16 dropped bits; carries into the exponent
// are the correct rounding up to the next binade or to Inf (no saturation).
// Subnormals need nothing special: float and bf16 share the exponent range,
// so the same bit positions are dropped. A NaN stays a NaN of the same sign,
// quieted, with the top 6 bits of its payload.
EXMY_HD uint16_t bf16_bits(float x) {
  uint32_t u = bits_of(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u | 0x00400000u) >> 16);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// The float a bfloat16 holds (exact).
EXMY_HD float bf16_value(uint16_t b) { return float_of(static_cast<uint32_t>(b) << 16); }

// x rounded to the nearest bfloat16, as a float: sim::round_bf16 (float)
// and the layers' round_bf16 kernel (models/layer_launches.hpp).
EXMY_HD float round_bf16_hd(float x) { return bf16_value(bf16_bits(x)); }

// out[i] = bf16_bits(in[i]) for i in [0, n): one thread per element.
template <class Launch>
void bf16_bits_launches(const Launch& launch, uint16_t* out, const float* in, int64_t n) {
  launch("round_bf16", n, [=] EXMY_HD_LAMBDA(int64_t i) { out[i] = bf16_bits(in[i]); });
}

}  // namespace exmy::sim

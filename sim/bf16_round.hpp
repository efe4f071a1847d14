// Rounding a float to the nearest bfloat16 by its bits, as plain EXMY_HD
// (host + device) code: sim::round_bf16 (sim/linear.cpp) and the round_bf16
// kernel (models/layer_launches.hpp) both call it, so they agree bit for bit
// on every input (integer arithmetic only, nothing that differs on a device).
#pragma once

#include <cstdint>

#include "formats/format.hpp"  // EXMY_HD, bits_of, float_of

namespace exmy::sim {

// A NaN stays a NaN (quieted, its payload's top bits kept). Otherwise adding
// half an ulp of bf16 (minus one when the kept last bit is 0) and truncating
// is round-to-nearest-even on the 16 dropped bits; carries into the exponent
// are the correct rounding up to the next binade or to Inf. Subnormals need
// nothing special: float and bf16 share the exponent range, so the same bit
// positions are dropped. Tested against exmy::encode_exact.
EXMY_HD float round_bf16_hd(float x) {
  uint32_t u = bits_of(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return float_of((u | 0x00400000u) & 0xffff0000u);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return float_of(u & 0xffff0000u);
}

}  // namespace exmy::sim

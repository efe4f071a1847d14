// The memory floors of `exmy bench quantize --device cuda` (sim/cli/bench_cmd.cpp):
// what the device's memory alone allows a quantizer, the CPU floors'
// counterpart. Device pointers, the default stream, no synchronisation.
#pragma once

#include <cstdint>

namespace exmy::sim {

// The traffic of a one-pass quantize + dequantize with next to no
// arithmetic: read x, write y = x * k and a one-byte code per element; with
// amax_pass, a read-only pass over x first (the max of the bits of |x|, as
// the current tensor amax needs) whose result k depends on (1, or 0 when it
// is NaN), so that the pass cannot be skipped. `scratch` is one device word.
void cuda_memory_floor(const float* x, float* y, uint8_t* codes, int64_t n, bool amax_pass, unsigned* scratch);

}  // namespace exmy::sim

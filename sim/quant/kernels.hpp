// Small kernels of the quantized linear: a blocked transpose.
#pragma once

#include <cstdint>

namespace exmy::sim::quant {

// dst (cols, rows) = src (rows, cols)^T; threaded, blocked (AVX 8x8 tiles
// where available).
void transpose(float* dst, const float* src, int64_t rows, int64_t cols);

}  // namespace exmy::sim::quant

// Block-scaled quantization on a CUDA device (docs/numerics.md §3, §5): the same
// bits as exmy::quantize_ref, made by the same header-only core
// (formats/quant_core.hpp, round.hpp, philox.hpp) compiled for the device.
//
// What runs where:
// - device: the tensor amax for `--tensor-amax auto` (an integer max over the
//   bits of |x|, NaN if any element is NaN), block amax, block scales and
//   element encoding, integer statistics (atomics), the segment partials of
//   the double sums;
// - host: validation and the plan, the random Hadamard transform (applied
//   with exmy::hadamard16 before upload, for now), the error message for the
//   first unrepresentable element, and the tree that combines the segment
//   partials of the double sums (docs/numerics.md §5), which the device
//   makes one thread per segment.
//
// Host pointers in and out; device buffers are allocated and freed inside
// each call. Only available when exmy is built with CUDA (EXMY_HAVE_CUDA).
#pragma once

#include <cstdint>
#include <string>

#include "formats/quantize.hpp"

namespace exmy {

// True when the CUDA runtime finds at least one usable device.
bool cuda_available();

// Name of device 0 and its compute capability, or why there is none.
std::string cuda_device_description();

// Same contract as quantize_ref / quantize: x is [rows, cols] row-major on
// the host; every non-null pointer of `out` is filled on the host. Throws
// exmy::Error for invalid specs, for unrepresentable elements (the lowest
// flat index is named, as quantize does), when no device is available, or
// when a CUDA call fails.
QuantInfo quantize_cuda(const QuantSpec& spec, const float* x, int64_t rows, int64_t cols, const QuantOutput& out);

// For tests: the same call with the kernels' per-block code run on the host
// (blocks in order, the lanes of each block's group one after another), no
// device needed. It checks the kernels' traversal, NaN-block, zero-scale and
// statistics logic where no GPU is present; it does not check the device
// compilation of the core, which only a device run can.
QuantInfo quantize_cuda_emulated(const QuantSpec& spec, const float* x, int64_t rows, int64_t cols,
                                 const QuantOutput& out);

}  // namespace exmy

// The host emulation of the random Hadamard transform's kernel: the launches
// of apply_rht_launches (formats/hadamard_segment.hpp) with HostLaunch, the
// threads one after another. Built with or without CUDA, so CI compares it
// with the CPU's transform (tests/formats/test_hadamard_launch.cpp).
#include "formats/cuda/quantize_cuda.hpp"
#include "formats/hadamard_segment.hpp"
#include "formats/kernel_launch.hpp"
#include "formats/quantize.hpp"

namespace exmy {

void apply_rht_emulated(const QuantSpec& spec, float* x, int64_t rows, int64_t cols) {
  apply_rht_launches(HostLaunch{}, x, rows, cols, rht_params(spec, rows, cols));
}

}  // namespace exmy

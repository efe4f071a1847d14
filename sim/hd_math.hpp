// Math for EXMY_HD (host + device) code shared by the CPU and the CUDA
// kernels: the same correctly rounded operation on both sides (device code
// is compiled with --prec-div=true --prec-sqrt=true --fmad=false).
#pragma once

#include <cmath>

#include "formats/format.hpp"  // EXMY_HD

namespace exmy::sim {

EXMY_HD float hd_sqrt(float x) {
#if defined(__CUDA_ARCH__)
  return sqrtf(x);
#else
  return std::sqrt(x);
#endif
}
EXMY_HD double hd_sqrt(double x) {
#if defined(__CUDA_ARCH__)
  return ::sqrt(x);
#else
  return std::sqrt(x);
#endif
}

}  // namespace exmy::sim

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

// exp and log: the host's libm (glibc) and the device's libdevice are each
// accurate to a few ulp but not the same functions, so results through them
// are bit-identical between the CPU and its host emulation only; on a
// device they carry the FP32 budget their callers state.
EXMY_HD float hd_exp(float x) {
#if defined(__CUDA_ARCH__)
  return expf(x);
#else
  return std::exp(x);
#endif
}
EXMY_HD double hd_exp(double x) {
#if defined(__CUDA_ARCH__)
  return ::exp(x);
#else
  return std::exp(x);
#endif
}
EXMY_HD double hd_log(double x) {
#if defined(__CUDA_ARCH__)
  return ::log(x);
#else
  return std::log(x);
#endif
}

}  // namespace exmy::sim

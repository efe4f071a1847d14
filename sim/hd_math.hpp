// Math for EXMY_HD (host + device) code shared by the CPU and the CUDA
// kernels. max is exact and sqrt correctly rounded on both sides (device
// code is compiled with --prec-div=true --prec-sqrt=true --fmad=false), so
// results through them are the same bits. exp, log and log1p: the host's
// libm (glibc) and the device's libdevice are each accurate to a few ulp but
// not the same functions, so results through them are bit-identical between
// the CPU and its host emulation only; on a device they carry the FP32
// budget their callers state.
#pragma once

#include <cmath>

#include "formats/format.hpp"  // EXMY_HD

namespace exmy::sim {

// hd_NAME(float) and hd_NAME(double): std::NAME on the host, the device's
// NAMEf / NAME in device code.
#if defined(__CUDA_ARCH__)
#define EXMY_HD_MATH(name)                                         \
  EXMY_HD float hd_##name(float x) { return ::name##f(x); }        \
  EXMY_HD double hd_##name(double x) { return ::name(x); }
#else
#define EXMY_HD_MATH(name)                                         \
  EXMY_HD float hd_##name(float x) { return std::name(x); }        \
  EXMY_HD double hd_##name(double x) { return std::name(x); }
#endif
EXMY_HD_MATH(sqrt)
EXMY_HD_MATH(exp)
EXMY_HD_MATH(log)
EXMY_HD_MATH(log1p)
#undef EXMY_HD_MATH

// std::max's choice, (a < b) ? b : a, for EXMY_HD code: a NaN b keeps a.
template <class T>
EXMY_HD T hd_max(T a, T b) {
  return a < b ? b : a;
}

}  // namespace exmy::sim

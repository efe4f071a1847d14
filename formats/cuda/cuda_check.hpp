// One check for the CUDA runtime's calls on the host: a failure becomes an
// exmy::Error naming the call ("CUDA error in WHAT: the runtime's words").
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "formats/error.hpp"

namespace exmy {

inline void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(std::string("CUDA error in ") + what + ": " + cudaGetErrorString(e));
}

}  // namespace exmy

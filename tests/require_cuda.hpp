// EXMY_REQUIRE_CUDA(): the first line of a device test, which reports
// SKIPPED ("needs a CUDA device", the words tools/gpu-check.sh looks for)
// where no CUDA device is visible.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#define EXMY_REQUIRE_CUDA()                                \
  do {                                                     \
    int n = 0;                                             \
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) { \
      cudaGetLastError();                                  \
      GTEST_SKIP() << "needs a CUDA device";               \
    }                                                      \
  } while (0)

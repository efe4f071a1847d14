// How a kernel's per-thread work is launched, in two implementations with
// one interface, so that a sequence of launches (a layer's, the random
// Hadamard transform's) is written once (a template over the launcher) and
// runs both on a CUDA device and, in CI, on the host:
//   launch(name, n, f)   calls f(i) for every i in [0, n), f an EXMY_HD_LAMBDA
// - HostLaunch runs the threads one after another (the host emulation of the
//   launch; docs/architecture.md, "CPU and GPU share code");
// - DeviceLaunch (CUDA compilation only) runs a grid-stride kernel on the
//   default stream; launches are stream-ordered, a failed launch throws
//   exmy::Error naming the kernel.
// A thread body must write only locations no other index of the same launch
// touches (no atomics, no reductions across threads): reductions are a
// thread's own loop in a fixed order, so results cannot depend on the launch.
// While a launch profile is on (formats/launch_profile.hpp), each launch is
// timed under its name: by the host's clock in HostLaunch, by two CUDA
// events in DeviceLaunch (DeviceProfileScope, which the other launch sites
// of the CUDA code use too).
// It lives in formats/ (which includes nothing of the simulator) so that the
// formats' kernels use it too; sim/kernel_launch.hpp names it in exmy::sim.
#pragma once

#include <cstdint>
#include <string>

#include "formats/format.hpp"  // EXMY_HD
#include "formats/launch_profile.hpp"

#if defined(__CUDACC__)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "formats/error.hpp"
#define EXMY_HD_LAMBDA __host__ __device__
#else
#define EXMY_HD_LAMBDA
#endif

namespace exmy {

struct HostLaunch {
  template <class F>
  void operator()(const char* name, int64_t n, F&& f) const {
    launch_profile_host(name, 0, [&] {
      for (int64_t i = 0; i < n; ++i) f(i);
    });
  }
};

#if defined(__CUDACC__)
template <class F>
__global__ void for_each_index_kernel(int64_t n, F f) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) f(i);
}

// A fault inside a kernel (an illegal address, ...) surfaces at the next
// call that waits for the device, naming that call; with the environment
// variable EXMY_CUDA_SYNC=1 every launch is waited for, so the error names
// the kernel (slower: for finding a fault).
inline bool cuda_sync_launches() {
  static const bool on = [] {
    const char* v = std::getenv("EXMY_CUDA_SYNC");
    return v && v[0] == '1';
  }();
  return on;
}

// Times the device work issued on the default stream during its life under
// `name` while a launch profile is on (an event before, one after); does
// nothing otherwise. A failure to make or record an event drops the record
// (the profile is a measurement, never a reason for a run to fail).
class DeviceProfileScope {
 public:
  explicit DeviceProfileScope(const char* name, double flops = 0) {
    if (!launch_profile_on()) return;
    if (cudaEventCreate(&start_) != cudaSuccess || cudaEventCreate(&stop_) != cudaSuccess ||
        cudaEventRecord(start_, 0) != cudaSuccess) {
      release();
      return;
    }
    name_ = name;
    flops_ = flops;
  }
  explicit DeviceProfileScope(const std::string& name, double flops = 0) : DeviceProfileScope(name.c_str(), flops) {}
  DeviceProfileScope(const DeviceProfileScope&) = delete;
  DeviceProfileScope& operator=(const DeviceProfileScope&) = delete;
  ~DeviceProfileScope() {
    if (start_ && stop_ && cudaEventRecord(stop_, 0) == cudaSuccess)
      launch_profile_add_device(name_, start_, stop_, &elapsed_ms, &destroy, flops_);  // the events are its now
    else
      release();
  }

 private:
  static double elapsed_ms(void* a, void* b) {
    float ms = 0;
    return cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(a), static_cast<cudaEvent_t>(b)) == cudaSuccess ? ms
                                                                                                           : 0.0;
  }
  static void destroy(void* e) {
    if (e) cudaEventDestroy(static_cast<cudaEvent_t>(e));
  }
  void release() {
    destroy(start_);
    destroy(stop_);
    start_ = stop_ = nullptr;
  }
  std::string name_;
  double flops_ = 0;
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
};

struct DeviceLaunch {
  static constexpr int kThreads = 256;
  static constexpr int64_t kMaxGrid = int64_t{1} << 16;  // grid-stride loops cover the rest
  template <class F>
  void operator()(const char* name, int64_t n, F f) const {
    if (n <= 0) return;
    const int64_t grid = std::min<int64_t>((n + kThreads - 1) / kThreads, kMaxGrid);
    DeviceProfileScope timed(name);
    for_each_index_kernel<<<static_cast<unsigned>(grid), kThreads>>>(n, f);
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess && cuda_sync_launches()) e = cudaDeviceSynchronize();
    if (e != cudaSuccess) throw Error(std::string("CUDA error in kernel ") + name + ": " + cudaGetErrorString(e));
  }
};
#endif

}  // namespace exmy

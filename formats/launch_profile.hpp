// Where a training pass spends its time: while a profile is on, every kernel
// launch (formats/kernel_launch.hpp's launchers, the quantization kernels of
// formats/cuda/quantize.cu) and every cuBLASLt GEMM (sim/cuda/gemm.cu) is
// timed under its name — by a pair of CUDA events around it on a device, by
// the host's clock in the host emulation — and so, by the host's clock, is
// each call of the CPU backend's layers, the linears' GEMMs and the
// quantizer's operations (models/backend.cpp, sim/linear.cpp,
// sim/quant/quant_ops.cpp); launch_profile_stop() sums the times per name. `exmy bench train
// --profile` prints that table after its timed rounds (one more pass with
// the profile on), so one run on a device says which kernels to speed up.
// Off (the default), a launch pays one relaxed atomic load.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace exmy {

namespace detail {
inline std::atomic<bool>& launch_profile_flag() {
  static std::atomic<bool> on{false};
  return on;
}
}  // namespace detail

// Whether launches are being timed.
inline bool launch_profile_on() { return detail::launch_profile_flag().load(std::memory_order_relaxed); }

// Drops what was recorded and starts timing launches.
void launch_profile_start();

// One name's launches: how many, their summed time, and (GEMMs) their
// summed FLOPs (0 for kernels).
struct LaunchProfileRow {
  std::string name;
  int64_t calls = 0;
  double ms = 0;
  double flops = 0;
};

// Stops timing and returns one row per name, the longest first. Device
// intervals are read from their events, so the device must have finished
// the recorded work (the caller waits for it first).
std::vector<LaunchProfileRow> launch_profile_stop();

// Recording (the launchers call these only while launch_profile_on()):
// an interval the host timed, or one between two device events that
// `elapsed_ms` reads and `release` frees (the CUDA side passes its own
// functions, so this file needs no CUDA runtime).
void launch_profile_add_host(std::string name, double ms, double flops = 0);
void launch_profile_add_device(std::string name, void* start, void* stop, double (*elapsed_ms)(void*, void*),
                               void (*release)(void*), double flops = 0);

// f() timed by the host's clock under `name` while a profile is on (a host
// launch, a CPU layer call, a host GEMM or quantizer call).
template <class F>
void launch_profile_host(const char* name, double flops, F&& f) {
  if (!launch_profile_on()) return f();
  const auto t0 = std::chrono::steady_clock::now();
  f();
  launch_profile_add_host(name, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count(),
                          flops);
}

// The table as `exmy bench train --profile` prints it: name, calls, total ms,
// share of `pass_ms`, mean us per call, and GFLOP/s for GEMM rows; rows past
// `max_rows` folded into one; then the launches' sum against the pass (the
// rest is host work, copies and the gaps between launches).
std::string launch_profile_table(const std::vector<LaunchProfileRow>& rows, double pass_ms, int max_rows = 40);

}  // namespace exmy

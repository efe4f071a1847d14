// Where a command runs: the host CPU or a CUDA device (`cpu | cuda |
// cuda:N`), or `cuda-emulated`: the CUDA backend's code (its kernels'
// launches, its memory handling) run on the host, thread after thread —
// slow, and there for checking the device path on a machine without a GPU
// (CI trains with it and compares with the CPU bit for bit). One parser and one wording of the errors for every command
// (`--device` of quantize, bench quantize, train, eval, bench train, and the
// run configuration's train.device). Checks happen before any work.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "formats/quantize.hpp"

namespace exmy::sim {

struct Device {
  enum class Kind { cpu, cuda, emulated };
  Kind kind = Kind::cpu;
  int index = 0;         // CUDA device index (cuda means cuda:0)
  bool indexed = false;  // written as cuda:N (names keep the user's spelling)
  bool is_cuda() const { return kind == Kind::cuda; }
  bool is_emulated() const { return kind == Kind::emulated; }
  bool is_cpu() const { return kind == Kind::cpu; }
  bool operator==(const Device&) const = default;
};

// "cpu", "cuda", "cuda:N" (N a decimal device index) or "cuda-emulated".
// `what` names the option or key in the error, e.g. "--device" or
// "train.device":
//   --device gpu: expected cpu, cuda, cuda:N (N a CUDA device index, e.g. cuda:1) or cuda-emulated
Device parse_device(std::string_view s, std::string_view what);

// The spelling parse_device read: "cpu", "cuda", "cuda:1", ...
std::string device_name(const Device& d);

// What the machine offers: whether exmy was built with CUDA, how many
// devices the runtime sees, and the runtime's words when it sees none
// because the query failed.
struct DeviceInventory {
  bool built_with_cuda = false;
  int count = 0;
  std::string error;  // cudaGetDeviceCount's error string, empty when it succeeded
};
DeviceInventory device_inventory();

// The one line naming why `d` cannot be used on a machine with `inv`, or
// empty when it can:
//   --device cuda: exmy was built without CUDA (EXMY_CUDA=OFF, or no nvcc at build time)
//   --device cuda: no CUDA device is visible (cudaGetDeviceCount: <error>)
//   --device cuda:3: this machine has 1 CUDA device (0)
std::string device_problem(const Device& d, const DeviceInventory& inv, std::string_view what);

// Throws exmy::Error with device_problem's line when `d` is not usable
// here; for a CUDA device it then makes it the current device.
void require_device(const Device& d, std::string_view what);

// For the training commands (train, eval, bench train): require_device.
void require_training_device(const Device& d, std::string_view what);

// Quantization of a host tensor on `d` (checked by require_device first):
// exmy::quantize with `threads` on the CPU, exmy::quantize_cuda on a CUDA
// device, its host emulation for cuda-emulated; the same bits every way
// (tests/formats/test_cuda.cpp).
QuantInfo quantize_on(const Device& d, const QuantSpec& spec, const float* x, int64_t rows, int64_t cols,
                      const QuantOutput& out, int threads);

}  // namespace exmy::sim

// The emulated device backend: the CUDA kernels' launches with the threads
// run one after another on the host (sim::HostLaunch), on host memory that
// says it is not the host's, so the model takes the same staged copies it
// takes on a device (models/backend.hpp).
#include <cstring>
#include <new>
#include <string>

#include "formats/error.hpp"

#define EXMY_SUFFIX emulated
#define EXMY_ITEM_KERNELS 1  // block launches with the CPU's products, attention's CPU blocking: the CPU's bits
#include "models/device_backend_define.hpp"

namespace exmy::models {

namespace {

class EmulatedDeviceMemory final : public sim::CountedMemory {
 public:
  const char* name() const override { return "cuda-emulated"; }
  bool on_host() const override { return false; }
  void* allocate_raw(size_t bytes) override { return sim::host_memory().allocate(bytes); }
  void deallocate_raw(void* p) noexcept override { sim::host_memory().deallocate(p); }
  void zero(void* p, size_t bytes) override { sim::host_memory().zero(p, bytes); }
  void to_host(void* dst, const void* src, size_t bytes) override { sim::host_memory().copy(dst, src, bytes); }
  void from_host(void* dst, const void* src, size_t bytes) override { sim::host_memory().copy(dst, src, bytes); }
  void copy(void* dst, const void* src, size_t bytes) override { sim::host_memory().copy(dst, src, bytes); }
};

}  // namespace

std::unique_ptr<Backend<float>> make_emulated_device_backend() {
  static EmulatedDeviceMemory* memory = new EmulatedDeviceMemory;  // never destroyed (see host_memory)
  return std::make_unique<DeviceBackend>("cuda-emulated", *memory);
}

}  // namespace exmy::models

// The CUDA device backend: models/device_backend_define.hpp with the _cuda
// kernels and the device's memory.
#include "models/cuda/backend_cuda.hpp"

#include <cuda_runtime.h>

#include <mutex>
#include <string>
#include <vector>

#include "formats/cuda/cuda_check.hpp"
#include "formats/error.hpp"

#define EXMY_SUFFIX cuda
#define EXMY_ITEM_KERNELS 0  // block launches on cuBLASLt, attention's device blocking (or the thread and row kernels)
#include "models/device_backend_define.hpp"

namespace exmy::models {

namespace {

class CudaMemory final : public sim::CountedMemory {
 public:
  const char* name() const override { return "cuda"; }
  bool on_host() const override { return false; }
  void* allocate_raw(size_t bytes) override {
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, bytes ? bytes : 256);
    if (e == cudaErrorMemoryAllocation) {
      cudaGetLastError();  // clear the sticky-free error state of this call
      size_t free_b = 0, total_b = 0;
      cudaMemGetInfo(&free_b, &total_b);
      throw Error("out of device memory: " + std::to_string(bytes) + " bytes asked for, " + std::to_string(free_b) +
                  " free of " + std::to_string(total_b));
    }
    cuda_check(e, "cudaMalloc");
    return p;  // cudaMalloc aligns to 256 bytes
  }
  void deallocate_raw(void* p) noexcept override { cudaFree(p); }
  void zero(void* p, size_t bytes) override {
    if (bytes) cuda_check(cudaMemsetAsync(p, 0, bytes, nullptr), "cudaMemsetAsync");
  }
  void to_host(void* dst, const void* src, size_t bytes) override {
    if (bytes) cuda_check(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy to the host");
  }
  void from_host(void* dst, const void* src, size_t bytes) override {
    if (bytes) cuda_check(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy from the host");
  }
  void copy(void* dst, const void* src, size_t bytes) override {
    if (bytes && dst != src)
      cuda_check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, nullptr), "cudaMemcpyAsync");
  }
  // The kernels run on the (legacy) default stream; an async copy waits on
  // an event recorded there, runs on its direction's own non-blocking
  // stream (an H200 has separate copy engines each way) and records the
  // event its token names.
  sim::CopyToken to_host_async(void* dst, const void* src, size_t bytes) override {
    return copy_async(dst, src, bytes, cudaMemcpyDeviceToHost, down_);
  }
  sim::CopyToken from_host_async(void* dst, const void* src, size_t bytes) override {
    return copy_async(dst, src, bytes, cudaMemcpyHostToDevice, up_);
  }
  void wait(sim::CopyToken& t) override {
    if (t.done()) return;
    cudaEvent_t e = nullptr;
    {
      std::lock_guard<std::mutex> g(m_);
      e = events_.at(static_cast<size_t>(t.id - 1));
    }
    cuda_check(cudaEventSynchronize(e), "cudaEventSynchronize of an async copy");
    std::lock_guard<std::mutex> g(m_);
    free_.push_back(static_cast<size_t>(t.id - 1));
    t = {};
  }
  void synchronize() override { cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }

 private:
  std::mutex m_;
  cudaStream_t down_ = nullptr, up_ = nullptr;  // made at the first async copy
  std::vector<cudaEvent_t> events_;             // token id - 1 indexes them
  std::vector<size_t> free_;                    // events no token holds

  // An event no token holds (made when none is free); under m_.
  size_t take_event() {
    if (free_.empty()) {
      cudaEvent_t e = nullptr;
      cuda_check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
      events_.push_back(e);
      return events_.size() - 1;
    }
    const size_t i = free_.back();
    free_.pop_back();
    return i;
  }
  sim::CopyToken copy_async(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t& stream) {
    if (!bytes) return {};
    std::lock_guard<std::mutex> g(m_);
    if (!stream) cuda_check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
    // After what the default stream has queued (the gradients' backward and reduction).
    const size_t after = take_event(), done = take_event();
    cuda_check(cudaEventRecord(events_[after], nullptr), "cudaEventRecord");
    cuda_check(cudaStreamWaitEvent(stream, events_[after], 0), "cudaStreamWaitEvent");
    free_.push_back(after);  // the wait is queued: the event may be recorded again
    cuda_check(cudaMemcpyAsync(dst, src, bytes, kind, stream), "cudaMemcpyAsync");
    cuda_check(cudaEventRecord(events_[done], stream), "cudaEventRecord");
    return {static_cast<uint64_t>(done) + 1};
  }
};

class PinnedMemory final : public sim::HostAddressedMemory {
 public:
  const char* name() const override { return "pinned host"; }
  void* allocate(size_t bytes) override {
    void* p = nullptr;
    const cudaError_t e = cudaHostAlloc(&p, bytes ? bytes : 64, cudaHostAllocDefault);
    if (e != cudaSuccess) {
      cudaGetLastError();
      throw Error("out of pinned host memory: " + std::to_string(bytes) + " bytes could not be allocated (" +
                  cudaGetErrorString(e) + ")");
    }
    return p;  // page aligned
  }
  void deallocate(void* p) noexcept override { cudaFreeHost(p); }
};

}  // namespace

sim::Memory& cuda_memory() {
  static CudaMemory* m = new CudaMemory;  // never destroyed (see sim::host_memory)
  return *m;
}

sim::Memory& cuda_pinned_memory() {
  static PinnedMemory* m = new PinnedMemory;  // never destroyed (see sim::host_memory)
  return *m;
}

std::unique_ptr<Backend<float>> make_cuda_backend(int device) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    cudaGetLastError();
    throw Error("no CUDA device is visible (train.device = cuda)");
  }
  if (device < 0 || device >= count)
    throw Error("CUDA device " + std::to_string(device) + " does not exist (" + std::to_string(count) +
                " visible: 0.." + std::to_string(count - 1) + ")");
  cuda_check(cudaSetDevice(device), "cudaSetDevice");
  return std::make_unique<DeviceBackend>("cuda", cuda_memory());
}

}  // namespace exmy::models

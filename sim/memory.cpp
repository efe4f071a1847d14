#include "sim/memory.hpp"

#include <cstring>
#include <mutex>
#include <new>
#include <string>
#include <unordered_map>

#include "formats/error.hpp"

namespace exmy::sim {

namespace {

class HostMemory final : public HostAddressedMemory {
 public:
  const char* name() const override { return "host"; }
  void* allocate(size_t bytes) override {
    if (bytes == 0) bytes = 64;
    void* p = ::operator new(bytes, kAlign, std::nothrow);
    if (!p) throw Error("out of host memory: " + std::to_string(bytes) + " bytes could not be allocated");
    return p;
  }
  void deallocate(void* p) noexcept override { ::operator delete(p, kAlign); }

 private:
  static constexpr std::align_val_t kAlign{64};
};

}  // namespace

void HostAddressedMemory::zero(void* p, size_t bytes) {
  if (bytes) std::memset(p, 0, bytes);
}
void HostAddressedMemory::copy(void* dst, const void* src, size_t bytes) {
  if (bytes && dst != src) std::memmove(dst, src, bytes);
}

struct AllocationCount::State {
  std::mutex m;
  std::unordered_map<const void*, size_t> sizes;
  int64_t live = 0, peak = 0;
};

AllocationCount::State& AllocationCount::state() const {
  if (!s_) s_ = new State;  // lives as long as the (static) memory that owns it
  return *s_;
}
void AllocationCount::add(const void* p, size_t bytes) {
  State& s = state();
  std::lock_guard<std::mutex> g(s.m);
  s.sizes[p] = bytes;
  s.live += static_cast<int64_t>(bytes);
  if (s.live > s.peak) s.peak = s.live;
}
void AllocationCount::remove(const void* p) {
  State& s = state();
  std::lock_guard<std::mutex> g(s.m);
  const auto it = s.sizes.find(p);
  if (it == s.sizes.end()) return;
  s.live -= static_cast<int64_t>(it->second);
  s.sizes.erase(it);
}
int64_t AllocationCount::live() const {
  State& s = state();
  std::lock_guard<std::mutex> g(s.m);
  return s.live;
}
int64_t AllocationCount::peak() const {
  State& s = state();
  std::lock_guard<std::mutex> g(s.m);
  return s.peak;
}
void AllocationCount::reset_peak() {
  State& s = state();
  std::lock_guard<std::mutex> g(s.m);
  s.peak = s.live;
}

Memory& host_memory() {
  static HostMemory* m = new HostMemory;  // never destroyed: buffers in static objects outlive any order of exit
  return *m;
}

}  // namespace exmy::sim

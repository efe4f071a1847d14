#include "sim/memory.hpp"

#include <cstring>
#include <new>
#include <string>

#include "formats/error.hpp"

namespace exmy::sim {

namespace {

class HostMemory final : public Memory {
 public:
  const char* name() const override { return "host"; }
  bool on_host() const override { return true; }
  void* allocate(size_t bytes) override {
    if (bytes == 0) bytes = 64;
    void* p = ::operator new(bytes, kAlign, std::nothrow);
    if (!p) throw Error("out of host memory: " + std::to_string(bytes) + " bytes could not be allocated");
    return p;
  }
  void deallocate(void* p) noexcept override { ::operator delete(p, kAlign); }
  void zero(void* p, size_t bytes) override {
    if (bytes) std::memset(p, 0, bytes);
  }
  void to_host(void* dst, const void* src, size_t bytes) override { copy(dst, src, bytes); }
  void from_host(void* dst, const void* src, size_t bytes) override { copy(dst, src, bytes); }
  void copy(void* dst, const void* src, size_t bytes) override {
    if (bytes && dst != src) std::memmove(dst, src, bytes);
  }

 private:
  static constexpr std::align_val_t kAlign{64};
};

}  // namespace

Memory& host_memory() {
  static HostMemory m;
  return m;
}

}  // namespace exmy::sim

// Plain buffers for activations and parameters: contiguous, 64-byte aligned
// (so Eigen's packed loads and the compiler's vector code never straddle a
// cache line at the start of a row), and row-major everywhere. Layers take raw
// pointers with their shapes in comments, llm.c style; this header only owns
// the storage.
#pragma once

#include <cstddef>
#include <cstdint>
#include <new>
#include <cstring>
#include <vector>

namespace exmy::sim {

// Allocates on 64-byte (cache-line) boundaries. Eigen's aligned_allocator
// only guarantees its packet alignment (32 bytes with AVX).
template <class T>
struct CacheAligned {
  using value_type = T;
  static constexpr std::align_val_t kAlign{64};
  CacheAligned() = default;
  template <class U>
  CacheAligned(const CacheAligned<U>&) {}
  T* allocate(size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), kAlign)); }
  void deallocate(T* p, size_t) { ::operator delete(p, kAlign); }
  template <class U>
  bool operator==(const CacheAligned<U>&) const { return true; }
};

template <class T>
using Buf = std::vector<T, CacheAligned<T>>;

// Elements a view is rounded up to, so every view starts 64-byte aligned.
inline constexpr int64_t kAlignElems = 16;

inline int64_t align_up(int64_t n, int64_t a = kAlignElems) { return (n + a - 1) / a * a; }

template <class T>
void zero(T* p, int64_t n) {
  if (n > 0) std::memset(static_cast<void*>(p), 0, static_cast<size_t>(n) * sizeof(T));
}

template <class T>
void zero(Buf<T>& b) {
  zero(b.data(), static_cast<int64_t>(b.size()));
}

// Resizes to n elements (never shrinks the allocation) and zeroes them.
template <class T>
void resize_zero(Buf<T>& b, int64_t n) {
  b.resize(static_cast<size_t>(n));
  zero(b);
}

}  // namespace exmy::sim

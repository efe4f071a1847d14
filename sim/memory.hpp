// Where a model's buffers live: host memory or a CUDA device's. A backend
// (models/backend.hpp) owns one Memory and every buffer of a model on that
// backend is a MemBuf in it, so the model's code is the same for the CPU and
// the device: it passes raw pointers to the backend's kernels and never
// touches the elements itself. Reading or writing elements from the host
// goes through to_host / from_host, which are plain copies on the host.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace exmy::sim {

// A copy in flight between a memory and the host (Memory::to_host_async,
// from_host_async); id 0: finished. Memory::wait finishes it and sets it
// back to 0, so waiting twice is harmless.
struct CopyToken {
  uint64_t id = 0;
  bool done() const { return id == 0; }
};

class Memory {
 public:
  virtual ~Memory() = default;
  virtual const char* name() const = 0;  // "host", "cuda:0"
  // True when the host may read and write the elements directly.
  virtual bool on_host() const = 0;
  // 64-byte aligned (or better); not zeroed. Throws exmy::Error when the
  // memory is full, naming the bytes asked for and the bytes free.
  virtual void* allocate(size_t bytes) = 0;
  virtual void deallocate(void* p) noexcept = 0;
  virtual void zero(void* p, size_t bytes) = 0;
  // Copies between this memory and the host (dst or src a host pointer),
  // or within this memory; all finished when they return.
  virtual void to_host(void* host_dst, const void* src, size_t bytes) = 0;
  virtual void from_host(void* dst, const void* host_src, size_t bytes) = 0;
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;
  // The same copies, started and perhaps not finished when they return:
  // each starts after the work queued on this memory's device so far (the
  // kernels that wrote the source), copies to the host run one after
  // another and copies from the host too (the two directions may run at
  // once), and until wait(token) returns the destination must not be read
  // nor the source written. Here (the host's, an emulation) they finish at
  // once; a CUDA device queues them on its copy streams.
  virtual CopyToken to_host_async(void* host_dst, const void* src, size_t bytes) {
    to_host(host_dst, src, bytes);
    return {};
  }
  virtual CopyToken from_host_async(void* dst, const void* host_src, size_t bytes) {
    from_host(dst, host_src, bytes);
    return {};
  }
  // Blocks until the copy of `t` has landed, then sets t to finished. Work
  // queued on the device afterwards sees what it wrote. Every token an
  // async copy returns is waited for once.
  virtual void wait(CopyToken& t) { t = {}; }
  // Waits until the work queued on this memory's device is done (timing).
  virtual void synchronize() {}
  // Bytes allocated and not freed, and the most at any time since
  // reset_peak(); -1 where not counted (the host's).
  virtual int64_t live_bytes() const { return -1; }
  virtual int64_t peak_bytes() const { return -1; }
  virtual void reset_peak() {}
};

// A memory the host addresses directly (the process's heap, CUDA's
// page-locked host memory): on_host, zeroing and every copy are memset and
// memmove; only allocating differs.
class HostAddressedMemory : public Memory {
 public:
  bool on_host() const final { return true; }
  void zero(void* p, size_t bytes) final;
  void to_host(void* dst, const void* src, size_t bytes) final { copy(dst, src, bytes); }
  void from_host(void* dst, const void* src, size_t bytes) final { copy(dst, src, bytes); }
  void copy(void* dst, const void* src, size_t bytes) final;
};

// The allocation count of a device memory: live bytes and their peak.
class AllocationCount {
 public:
  void add(const void* p, size_t bytes);
  void remove(const void* p);
  int64_t live() const;
  int64_t peak() const;
  void reset_peak();

 private:
  struct State;
  State& state() const;
  mutable State* s_ = nullptr;
};

// A memory that counts what it allocates (the device memories): it gives
// the raw allocation and freeing; allocate/deallocate count around them.
class CountedMemory : public Memory {
 public:
  void* allocate(size_t bytes) final {
    void* p = allocate_raw(bytes);
    count_.add(p, bytes);
    return p;
  }
  void deallocate(void* p) noexcept final {
    count_.remove(p);
    deallocate_raw(p);
  }
  int64_t live_bytes() const final { return count_.live(); }
  int64_t peak_bytes() const final { return count_.peak(); }
  void reset_peak() final { count_.reset_peak(); }

 protected:
  virtual void* allocate_raw(size_t bytes) = 0;
  virtual void deallocate_raw(void* p) noexcept = 0;

 private:
  AllocationCount count_;
};

// The process's host memory (64-byte aligned operator new).
Memory& host_memory();

// An owning buffer of n elements of T in a Memory: move-only, grows (never
// shrinks its allocation), zeroes what it is resized to.
template <class T>
class MemBuf {
 public:
  MemBuf() = default;
  explicit MemBuf(Memory& m) : mem_(&m) {}
  MemBuf(Memory& m, int64_t n) : mem_(&m) { resize_zero(n); }
  ~MemBuf() { release(); }
  MemBuf(MemBuf&& o) noexcept : mem_(o.mem_), p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)),
                                cap_(std::exchange(o.cap_, 0)) {}
  MemBuf& operator=(MemBuf&& o) noexcept {
    if (this != &o) {
      release();
      mem_ = o.mem_;
      p_ = std::exchange(o.p_, nullptr);
      n_ = std::exchange(o.n_, 0);
      cap_ = std::exchange(o.cap_, 0);
    }
    return *this;
  }
  MemBuf(const MemBuf&) = delete;
  MemBuf& operator=(const MemBuf&) = delete;

  Memory& memory() const { return *mem_; }
  // Moves to another memory (drops the elements) when it differs.
  void place(Memory& m) {
    if (&m != mem_) release(), mem_ = &m;
  }
  T* data() { return p_; }
  const T* data() const { return p_; }
  int64_t size() const { return n_; }
  bool empty() const { return n_ == 0; }

  // n elements, all zero.
  void resize_zero(int64_t n) {
    if (n > cap_) {
      release();
      p_ = static_cast<T*>(mem_->allocate(static_cast<size_t>(n) * sizeof(T)));
      cap_ = n;
    }
    n_ = n;
    zero();
  }
  void zero() {
    if (n_ > 0) mem_->zero(p_, static_cast<size_t>(n_) * sizeof(T));
  }

 private:
  Memory* mem_ = &host_memory();
  T* p_ = nullptr;
  int64_t n_ = 0, cap_ = 0;
  void release() noexcept {
    if (p_) mem_->deallocate(p_);
    p_ = nullptr;
    n_ = cap_ = 0;
  }
};

template <class T>
void resize_zero(MemBuf<T>& b, int64_t n) {
  b.resize_zero(n);
}

// The n elements at p in `m` as the host sees them: p itself when m is the
// host's, else a copy in `staging` (for checkpoints, norms, exports).
template <class T>
const T* host_view(Memory& m, const T* p, int64_t n, std::vector<T>& staging) {
  if (m.on_host()) return p;
  staging.resize(static_cast<size_t>(n));
  if (n > 0) m.to_host(staging.data(), p, static_cast<size_t>(n) * sizeof(T));
  return staging.data();
}

// Writes n host elements to p in `m` through a host pointer the caller
// fills: fill(q) with q = p on the host, else a staging buffer copied over
// afterwards (for checkpoint and weight loading).
template <class T, class Fill>
void write_through_host(Memory& m, T* p, int64_t n, std::vector<T>& staging, Fill fill) {
  if (m.on_host()) return fill(p);
  staging.resize(static_cast<size_t>(n));
  fill(staging.data());
  if (n > 0) m.from_host(p, staging.data(), static_cast<size_t>(n) * sizeof(T));
}

}  // namespace exmy::sim

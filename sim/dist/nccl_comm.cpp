// dist::NcclComm (nccl_comm.hpp): NCCL on device buffers, the host Comm for
// the rest. Built with CUDA when nccl.h is found; libnccl is loaded at the
// first use, not linked.
#include "sim/dist/nccl_comm.hpp"

#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nccl.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <string>
#include <type_traits>

namespace exmy::dist {
namespace {

// The NCCL entry points this file calls, listed once, X(name) for each:
// the pointer table and the dlsym loop read the list.
#define EXMY_NCCL_FUNCTIONS(X) \
  X(ncclGetVersion)            \
  X(ncclGetErrorString)        \
  X(ncclGetUniqueId)           \
  X(ncclCommInitRankConfig)    \
  X(ncclCommGetAsyncError)     \
  X(ncclCommAbort)             \
  X(ncclSend)                  \
  X(ncclRecv)                  \
  X(ncclBroadcast)

struct Nccl {
#define EXMY_NCCL(name) decltype(&::name) name = nullptr;
  EXMY_NCCL_FUNCTIONS(EXMY_NCCL)
#undef EXMY_NCCL
};

// Non-blocking communicator setup (config.blocking = 0) came with 2.14.
constexpr int kOldestVersion = 21400;

// Loads `library` into `t`: empty, or the one line why it cannot be used.
// The handle stays open when it loads (the process keeps it).
std::string load(const std::string& library, Nccl& t) {
  void* h = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
#if defined(EXMY_NCCL_DIR)
  if (!h && library.find('/') == std::string::npos)
    h = dlopen((std::string(EXMY_NCCL_DIR) + "/" + library).c_str(), RTLD_NOW | RTLD_LOCAL);
#endif
  if (!h)
    return "cannot load " + library + " (NCCL, for the transfers of ranks on CUDA devices; train.comm = mpi sends "
           "them through the host, EXMY_NCCL_LIBRARY names another libnccl): " + dlerror();
  std::string missing;
  auto get = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(h, name));
    if (!fn && missing.empty()) missing = name;
  };
#define EXMY_NCCL(name) get(t.name, #name);
  EXMY_NCCL_FUNCTIONS(EXMY_NCCL)
#undef EXMY_NCCL
  if (!missing.empty()) {
    dlclose(h);
    return library + " has no " + missing + " (not a libnccl, or one older than 2.14)";
  }
  int v = 0;
  t.ncclGetVersion(&v);
  if (v < kOldestVersion) {
    dlclose(h);
    return library + " is NCCL " + std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." +
           std::to_string(v % 100) + "; exmy needs 2.14 or newer (non-blocking communicator setup)";
  }
  return {};
}

struct Loaded {
  Nccl fns;
  std::string problem;
};

const Loaded& loaded() {
  static const Loaded l = [] {
    Loaded x;
    const char* env = std::getenv("EXMY_NCCL_LIBRARY");
    x.problem = load(env && *env ? env : "libnccl.so." + std::to_string(NCCL_MAJOR), x.fns);
    return x;
  }();
  return l;
}

class NcclComm final : public ForwardingComm {
 public:
  // Rank 0 makes the id, the host Comm carries it to every rank, and every
  // rank joins on its current device; the setup is waited for like a
  // transfer.
  NcclComm(Comm& host, const Nccl& f) : ForwardingComm(host), f_(f), timeout_s_(comm_timeout_seconds()) {
    ncclUniqueId id{};
    if (host.rank() == 0) check(f_.ncclGetUniqueId(&id), "ncclGetUniqueId");
    host.broadcast(&id, sizeof id, 0);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    const ncclResult_t r = f_.ncclCommInitRankConfig(&comm_, host.size(), id, host.rank(), &config);
    if (r != ncclInProgress) check(r, "ncclCommInitRankConfig");
    wait(r, "NCCL communicator setup: waiting for", -1, false);
  }
  // Every transfer was waited for, so nothing is in flight: abort frees the
  // communicator without the peers (destroy may wait for them, and a rank
  // that leaves on an error must not).
  ~NcclComm() override {
    if (comm_) f_.ncclCommAbort(comm_);
  }

  std::string name() const override { return "nccl"; }
  bool device_buffers() const override { return true; }
  void send(const void* data, size_t bytes, int dest) override {
    if (bytes > 0) wait(f_.ncclSend(data, bytes, ncclUint8, dest, comm_, nullptr), "NCCL send to", dest, true);
  }
  void recv(void* data, size_t bytes, int src) override {
    if (bytes > 0) wait(f_.ncclRecv(data, bytes, ncclUint8, src, comm_, nullptr), "NCCL receive from", src, true);
  }
  void broadcast(void* data, size_t bytes, int root) override {
    if (bytes > 0)
      wait(f_.ncclBroadcast(data, data, bytes, ncclUint8, root, comm_, nullptr),
           inner_.rank() == root ? "NCCL broadcast to" : "NCCL broadcast from",
           collective_peer(inner_.rank(), inner_.size(), root), true);
  }
  [[noreturn]] void abort(int code) override {
    if (comm_) f_.ncclCommAbort(comm_);
    comm_ = nullptr;
    inner_.abort(code);
    std::abort();  // a virtual call's [[noreturn]] is not part of its type
  }

 private:
  void check(ncclResult_t r, const char* call) const {
    if (r != ncclSuccess) throw Error(std::string(call) + " failed: " + f_.ncclGetErrorString(r));
  }

  // Waits for the call that returned `r` (a non-blocking communicator
  // answers ncclInProgress until it has taken the call) and, for a
  // transfer, for the default stream it was queued on. An NCCL or CUDA
  // error is thrown; past the timeout one line names this rank, `what` and
  // `peer` (-1: the other ranks), and the job ends. Sleeps between polls
  // (up to 1 ms), leaving the cores to the other ranks.
  void wait(ncclResult_t r, const char* what, int peer, bool stream) {
    auto failed = [&](const char* why) {
      return Error(std::string(what) + (peer >= 0 ? " rank " + std::to_string(peer) : std::string(" the other ranks")) +
                   " failed: " + why);
    };
    if (r != ncclSuccess && r != ncclInProgress) throw failed(f_.ncclGetErrorString(r));
    const auto t0 = std::chrono::steady_clock::now();
    long sleep_ns = 1000;
    for (;;) {
      ncclResult_t state = ncclSuccess;
      f_.ncclCommGetAsyncError(comm_, &state);
      if (state != ncclSuccess && state != ncclInProgress) throw failed(f_.ncclGetErrorString(state));
      if (state == ncclSuccess) {
        const cudaError_t e = stream ? cudaStreamQuery(nullptr) : cudaSuccess;
        if (e == cudaSuccess) return;
        if (e != cudaErrorNotReady) throw failed(cudaGetErrorString(e));
      }
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (waited > timeout_s_) {
        print_timeout(inner_.rank(), what, peer >= 0 ? std::span<const int>(&peer, 1) : std::span<const int>(),
                      waited);
        abort(1);
      }
      const timespec ts{0, sleep_ns};
      nanosleep(&ts, nullptr);
      sleep_ns = std::min(sleep_ns * 2, 1000000L);
    }
  }

  const Nccl& f_;
  ncclComm_t comm_ = nullptr;
  double timeout_s_ = 600;
};

}  // namespace

std::string nccl_problem() { return loaded().problem; }

std::string nccl_load_problem(const std::string& library) {
  Nccl t;
  return load(library, t);
}

std::unique_ptr<Comm> make_nccl_comm(Comm& host) {
  if (!loaded().problem.empty()) throw Error(loaded().problem);
  return std::make_unique<NcclComm>(host, loaded().fns);
}

#undef EXMY_NCCL_FUNCTIONS

}  // namespace exmy::dist

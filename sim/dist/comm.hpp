// The ranks of a data-parallel job and the collectives the training loop
// needs (docs/training.md "Data-parallel runs"; docs/architecture.md).
//
// A Comm is one process's view of the job: its rank, the number of ranks,
// and a handful of operations every rank calls in the same order. The
// implementations are
//   SingleComm   one process, no MPI: every collective is the identity;
//   MPI          CPU ranks (sim/dist/mpi_comm.cpp, built with EXMY_MPI),
//                used when exmy is started by mpirun or srun;
//   NcclComm     GPU ranks (sim/dist/nccl_comm.cpp, built with CUDA): send,
//                recv and broadcast move device buffers with NCCL, the
//                other operations go through the host Comm it wraps (MPI),
//                which also carries the NCCL id at setup;
//   EmulatedDeviceComm  NcclComm's stand-in for cuda-emulated ranks: the
//                host Comm handed the emulated device's buffers (host
//                memory), so the trainer's device-buffer path runs in CI.
// device_buffers() says which memory send/recv/broadcast take.
//
// Results must not depend on the number of ranks, so there is no
// "all-reduce sum" here: floating-point sums are formed by ordered_sum,
// a chain through the ranks in rank order (rank 0 starts, each rank adds
// its terms in its own order, the last rank broadcasts), so a sum over
// terms spread contiguously across ranks is added in the same order for
// any number of ranks. Max is exact in any order and is an all-reduce.
//
// Every blocking operation of the MPI and NCCL implementations gives up
// after a timeout (EXMY_COMM_TIMEOUT_S, default 600 s), prints one line naming this
// rank, the operation and the rank(s) it waited for (max and barrier go
// through rank 0, which names the ranks that never arrived), and aborts the
// job: a rank that hangs ends the job in bounded time. A rank that dies ends it at once
// (mpirun or srun terminates the others).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "formats/error.hpp"

namespace exmy::dist {

class Comm {
 public:
  virtual ~Comm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string name() const = 0;  // "single", "mpi", "nccl", "nccl-emulated"
  // Where the buffers of send, recv and broadcast live: false, host memory;
  // true, the memory of this rank's device (the training device's Memory).
  virtual bool device_buffers() const { return false; }

  // Point to point (the chain of ordered_sum).
  virtual void send(const void* data, size_t bytes, int dest) = 0;
  virtual void recv(void* data, size_t bytes, int src) = 0;
  // `bytes` of root's `data` to every rank.
  virtual void broadcast(void* data, size_t bytes, int root) = 0;
  // Element-wise max over the ranks, on every rank; NaN if any rank holds NaN.
  virtual void max(std::span<double> v) = 0;
  virtual void barrier() = 0;
  // Rank 0 gets every rank's bytes, in rank order; the other ranks get {}.
  virtual std::vector<std::string> gather(const std::string& mine) = 0;
  // Ends every rank of the job with exit status `code` (after this rank has
  // printed its error line).
  [[noreturn]] virtual void abort(int code) = 0;
};

// One process.
class SingleComm final : public Comm {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string name() const override { return "single"; }
  void send(const void*, size_t, int) override { throw Error("SingleComm::send: there is no other rank"); }
  void recv(void*, size_t, int) override { throw Error("SingleComm::recv: there is no other rank"); }
  void broadcast(void*, size_t, int) override {}
  void max(std::span<double>) override {}
  void barrier() override {}
  std::vector<std::string> gather(const std::string& mine) override { return {mine}; }
  [[noreturn]] void abort(int code) override;
};

// Another Comm's operations, each passed on; the Comms below that change a
// few of them derive from it.
class ForwardingComm : public Comm {
 public:
  explicit ForwardingComm(Comm& inner) : inner_(inner) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  std::string name() const override { return inner_.name(); }
  bool device_buffers() const override { return inner_.device_buffers(); }
  void send(const void* data, size_t bytes, int dest) override { inner_.send(data, bytes, dest); }
  void recv(void* data, size_t bytes, int src) override { inner_.recv(data, bytes, src); }
  void broadcast(void* data, size_t bytes, int root) override { inner_.broadcast(data, bytes, root); }
  void max(std::span<double> v) override { inner_.max(v); }
  void barrier() override { inner_.barrier(); }
  std::vector<std::string> gather(const std::string& mine) override { return inner_.gather(mine); }
  [[noreturn]] void abort(int code) override {
    inner_.abort(code);
    std::abort();  // a virtual call's [[noreturn]] is not part of its type
  }

 protected:
  Comm& inner_;
};

// Another Comm with the wall time spent in its calls added up (waits for
// slower ranks included): the training loop's communication share.
class TimedComm final : public ForwardingComm {
 public:
  using ForwardingComm::ForwardingComm;
  void send(const void* data, size_t bytes, int dest) override { timed([&] { inner_.send(data, bytes, dest); }); }
  void recv(void* data, size_t bytes, int src) override { timed([&] { inner_.recv(data, bytes, src); }); }
  void broadcast(void* data, size_t bytes, int root) override { timed([&] { inner_.broadcast(data, bytes, root); }); }
  void max(std::span<double> v) override { timed([&] { inner_.max(v); }); }
  void barrier() override { timed([&] { inner_.barrier(); }); }
  std::vector<std::string> gather(const std::string& mine) override {
    std::vector<std::string> out;
    timed([&] { out = inner_.gather(mine); });
    return out;
  }
  double seconds() const { return seconds_; }  // in calls so far

 private:
  template <class F>
  void timed(const F& f) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  double seconds_ = 0;
};

// cuda-emulated ranks' stand-in for NcclComm: the host Comm (MPI) declared
// to take device buffers. The emulated device's memory is host memory, so
// its pointers go to MPI as they are, and the trainer runs the code path of
// NCCL ranks (sums added on the device, shards and moments sent from device
// memory) without a GPU.
class EmulatedDeviceComm final : public ForwardingComm {
 public:
  using ForwardingComm::ForwardingComm;
  std::string name() const override { return "nccl-emulated"; }
  bool device_buffers() const override { return true; }
};

// train.comm: which Comm moves the buffers of ranks on devices. One row per
// choice (name, value, help); the parser, the printer and the help of the
// configuration key loop over it.
enum class CommChoice { automatic, mpi, nccl };
struct CommChoiceRow {
  const char* name;
  CommChoice value;
  const char* help;
};
std::span<const CommChoiceRow> comm_choices();
// Throws one line naming `what` (e.g. "train.comm"), the value and the accepted names.
CommChoice parse_comm_choice(std::string_view s, std::string_view what);
const char* comm_choice_name(CommChoice c);

// An error every rank raises at the same point (a configuration that
// differs across ranks, a bad rank count): rank 0 prints it, the others
// exit with the same status silently.
class CollectiveError : public Error {
 public:
  using Error::Error;
};

// The job this process belongs to: an MPI communicator when a launcher
// started it (mpirun: OMPI_COMM_WORLD_SIZE; srun or other PMI launchers:
// PMI_SIZE, PMIX_RANK) and exmy was built with MPI, else SingleComm. MPI is
// initialised on the first call and finalised at exit; a build without MPI
// started by a launcher with more than one rank throws. Sets the OpenMP
// thread count nowhere (train.threads does).
Comm& world();
// True when world() has been created with more than one rank (error paths
// use it to abort the job instead of leaving peers waiting).
bool in_multi_rank_job();

// sum = terms of rank 0, then rank 1's added, ...: `add_mine(buf, prefix)`
// is called on every rank in rank order with buf holding the sum of the
// lower ranks' terms (prefix = true) or, on rank 0, unspecified contents
// (prefix = false: it must write its first term, not add it). The result is
// on every rank. T is float or double.
template <class T>
void ordered_sum(Comm& c, std::span<T> buf, const std::function<void(std::span<T>, bool prefix)>& add_mine) {
  const int r = c.rank(), n = c.size();
  if (r > 0) c.recv(buf.data(), buf.size_bytes(), r - 1);
  add_mine(buf, r > 0);
  if (n == 1) return;
  if (r + 1 < n) c.send(buf.data(), buf.size_bytes(), r + 1);
  c.broadcast(buf.data(), buf.size_bytes(), n - 1);
}

// root's string to every rank (c's buffers in host memory).
void broadcast_string(Comm& c, std::string& s, int root = 0);

// Something every rank checks for itself and all must agree on (the same
// configuration, NCCL loading): each rank's finding (empty: none). Every
// rank learns whether any rank has one; rank 0 also which rank is the
// lowest with one (-1: none) and what it found.
struct RankFinding {
  bool any = false;
  int rank = -1;
  std::string text;
};
RankFinding first_finding(Comm& c, const std::string& mine);

// The collective timeout of every Comm's waits: EXMY_COMM_TIMEOUT_S
// (seconds, default 600).
double comm_timeout_seconds();
// The line of a wait that timed out on rank `rank`, naming `what` it
// waited for ("receive from", "max all-reduce: waiting for") and the ranks
// still pending (`peers`; empty: the other ranks), on stderr.
void print_timeout(int rank, const char* what, std::span<const int> peers, double waited);

// The rank a timed-out wait in a collective rooted at `root` names: the root,
// on the other ranks; on the root, the other rank of a 2-rank job, else -1
// (any of the others may be the one missing: "the other ranks").
int collective_peer(int rank, int size, int root);

// The contiguous share [begin, end) of `count` items rank r of n takes (the
// first count % n ranks take one more).
struct Share {
  int64_t begin = 0, end = 0;
};
inline Share share_of(int64_t count, int r, int n) {
  const int64_t q = count / n, rem = count % n;
  const int64_t b = r * q + std::min<int64_t>(r, rem);
  return {b, b + q + (r < rem ? 1 : 0)};
}

}  // namespace exmy::dist

// dist::Comm over MPI (Open MPI on Debian: libopenmpi-dev). Every operation
// is non-blocking underneath and waited for with a deadline, so that a rank
// that hangs ends the job with one line instead of a silent stall.
// The C API only (Open MPI and MPICH add C++ bindings to C++ translation
// units otherwise, which need their own library).
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "sim/dist/mpi_comm.hpp"

namespace exmy::dist {
namespace {

// MPI counts are int: large buffers go in pieces of at most 1 GiB.
constexpr size_t kPiece = size_t{1} << 30;
// Point-to-point messages of max and barrier, apart from the chain's (tag 0).
constexpr int kCollectiveTag = 1;

double nan_max(double a, double b) {
  return std::isnan(a) || std::isnan(b) ? std::numeric_limits<double>::quiet_NaN() : std::max(a, b);
}

class MpiComm final : public Comm {
 public:
  MpiComm() {
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) {
      int provided = 0;
      MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
    }
    MPI_Comm_dup(MPI_COMM_WORLD, &comm_);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    timeout_s_ = comm_timeout_seconds();
  }
  ~MpiComm() override {
    MPI_Comm_free(&comm_);
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "mpi"; }

  void send(const void* data, size_t bytes, int dest) override {
    for (size_t off = 0; off < bytes || off == 0; off += kPiece) {
      MPI_Request rq;
      const int n = static_cast<int>(std::min(kPiece, bytes - off));
      MPI_Isend(static_cast<const char*>(data) + off, n, MPI_BYTE, dest, 0, comm_, &rq);
      wait(rq, "send to", dest);
      if (bytes == 0) break;
    }
  }
  void recv(void* data, size_t bytes, int src) override {
    for (size_t off = 0; off < bytes || off == 0; off += kPiece) {
      MPI_Request rq;
      const int n = static_cast<int>(std::min(kPiece, bytes - off));
      MPI_Irecv(static_cast<char*>(data) + off, n, MPI_BYTE, src, 0, comm_, &rq);
      wait(rq, "receive from", src);
      if (bytes == 0) break;
    }
  }
  void broadcast(void* data, size_t bytes, int root) override {
    for (size_t off = 0; off < bytes; off += kPiece) {
      MPI_Request rq;
      MPI_Ibcast(static_cast<char*>(data) + off, static_cast<int>(std::min(kPiece, bytes - off)), MPI_BYTE, root,
                 comm_, &rq);
      // (the root waits for the others: it names them, not itself)
      wait(rq, rank_ == root ? "broadcast to" : "broadcast from", collective_peer(rank_, size_, root));
    }
  }
  // Max and barrier go through rank 0 point to point (they are small), so
  // that a rank that never arrives is named: rank 0 waits for each rank's
  // message and reports the missing ones; the other ranks wait for rank 0's
  // answer a little longer, so that rank 0's line comes first.
  void max(std::span<double> v) override {
    if (size_ == 1) return;
    const int n = static_cast<int>(v.size());
    if (rank_ != 0) {
      MPI_Request rq[2];
      const int peers[2] = {0, 0};
      MPI_Isend(v.data(), n, MPI_DOUBLE, 0, kCollectiveTag, comm_, &rq[0]);
      MPI_Irecv(v.data(), n, MPI_DOUBLE, 0, kCollectiveTag, comm_, &rq[1]);
      wait_all(rq, peers, "max all-reduce with", timeout_s_ * 1.1 + 2);
      return;
    }
    const size_t others = static_cast<size_t>(size_ - 1);
    std::vector<double> got(v.size() * others);
    std::vector<MPI_Request> rq(others);
    std::vector<int> peers(others);
    for (size_t i = 0; i < others; ++i) {
      peers[i] = static_cast<int>(i) + 1;
      MPI_Irecv(got.data() + v.size() * i, n, MPI_DOUBLE, peers[i], kCollectiveTag, comm_, &rq[i]);
    }
    wait_all(rq, peers, "max all-reduce: waiting for", timeout_s_);
    for (size_t i = 0; i < others; ++i)
      for (size_t k = 0; k < v.size(); ++k) v[k] = nan_max(v[k], got[v.size() * i + k]);
    for (size_t i = 0; i < others; ++i) MPI_Isend(v.data(), n, MPI_DOUBLE, peers[i], kCollectiveTag, comm_, &rq[i]);
    wait_all(rq, peers, "max all-reduce: answering", timeout_s_);
  }
  void barrier() override {
    double x = 0;
    max(std::span<double>(&x, 1));
  }
  std::vector<std::string> gather(const std::string& mine) override {
    // Sizes first, then the bytes rank by rank (point to point: no int
    // displacement limit on the total).
    std::vector<uint64_t> sizes(static_cast<size_t>(size_));
    uint64_t n = mine.size();
    MPI_Request rq;
    MPI_Igather(&n, 1, MPI_UINT64_T, sizes.data(), 1, MPI_UINT64_T, 0, comm_, &rq);
    wait(rq, rank_ == 0 ? "gather from" : "gather to", collective_peer(rank_, size_, 0));
    if (rank_ != 0) {
      send(mine.data(), mine.size(), 0);
      return {};
    }
    std::vector<std::string> all(static_cast<size_t>(size_));
    all[0] = mine;
    for (int r = 1; r < size_; ++r) {
      all[static_cast<size_t>(r)].resize(sizes[static_cast<size_t>(r)]);
      recv(all[static_cast<size_t>(r)].data(), sizes[static_cast<size_t>(r)], r);
    }
    return all;
  }
  [[noreturn]] void abort(int code) override {
    std::fflush(stdout);
    std::fflush(stderr);
    MPI_Abort(comm_, code);
    std::_Exit(code);
  }

 private:
  // One request; peer -1: a collective, no one rank to name.
  void wait(MPI_Request& rq, const char* what, int peer) {
    wait_all(std::span<MPI_Request>(&rq, 1), peer >= 0 ? std::span<const int>(&peer, 1) : std::span<const int>(),
             what, timeout_s_);
  }

  // Polls the requests until all complete or `timeout` seconds pass, then
  // prints one line naming the ranks (peers[i]: the rank of request i) whose
  // requests are still pending and aborts the job. Sleeps between tests (up
  // to 1 ms) so that a waiting rank leaves the cores to the others.
  void wait_all(std::span<MPI_Request> rq, std::span<const int> peers, const char* what, double timeout) {
    const auto t0 = std::chrono::steady_clock::now();
    long sleep_ns = 1000;
    for (;;) {
      bool all = true;
      for (MPI_Request& r : rq) {
        int done = 1;
        if (r != MPI_REQUEST_NULL) MPI_Test(&r, &done, MPI_STATUS_IGNORE);
        all = all && done;
      }
      if (all) return;
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (waited > timeout) {
        std::vector<int> pending;
        for (size_t i = 0; i < rq.size() && i < peers.size(); ++i)
          if (rq[i] != MPI_REQUEST_NULL && std::find(pending.begin(), pending.end(), peers[i]) == pending.end())
            pending.push_back(peers[i]);
        print_timeout(rank_, what, pending, waited);
        abort(1);
      }
      const timespec ts{0, sleep_ns};
      nanosleep(&ts, nullptr);
      sleep_ns = std::min(sleep_ns * 2, 1000000L);
    }
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  double timeout_s_ = 600;
};

}  // namespace

bool mpi_available() { return true; }
std::unique_ptr<Comm> make_mpi_comm() { return std::make_unique<MpiComm>(); }

}  // namespace exmy::dist

// dist::Comm over MPI (Open MPI on Debian: libopenmpi-dev). Every operation
// is non-blocking underneath and waited for with a deadline, so that a rank
// that hangs ends the job with one line instead of a silent stall.
// The C API only (Open MPI and MPICH add C++ bindings to C++ translation
// units otherwise, which need their own library).
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#include <time.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>

#include "sim/dist/mpi_comm.hpp"

namespace exmy::dist {
namespace {

// MPI counts are int: large buffers go in pieces of at most 1 GiB.
constexpr size_t kPiece = size_t{1} << 30;

void nan_max_op(void* in, void* inout, int* len, MPI_Datatype*) {
  const double* a = static_cast<const double*>(in);
  double* b = static_cast<double*>(inout);
  for (int i = 0; i < *len; ++i)
    b[i] = std::isnan(a[i]) || std::isnan(b[i]) ? std::numeric_limits<double>::quiet_NaN() : std::max(a[i], b[i]);
}

double timeout_seconds() {
  if (const char* s = std::getenv("EXMY_COMM_TIMEOUT_S")) {
    const double t = std::atof(s);
    if (t > 0) return t;
  }
  return 600;
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
    MPI_Op_create(&nan_max_op, /*commute=*/1, &max_op_);
    timeout_s_ = timeout_seconds();
  }
  ~MpiComm() override {
    MPI_Op_free(&max_op_);
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
      wait(rq, "broadcast from", root);
    }
  }
  void max(std::span<double> v) override {
    MPI_Request rq;
    MPI_Iallreduce(MPI_IN_PLACE, v.data(), static_cast<int>(v.size()), MPI_DOUBLE, max_op_, comm_, &rq);
    wait(rq, "max all-reduce with", -1);
  }
  void barrier() override {
    MPI_Request rq;
    MPI_Ibarrier(comm_, &rq);
    wait(rq, "barrier with", -1);
  }
  std::vector<std::string> gather(const std::string& mine) override {
    // Sizes first, then the bytes rank by rank (point to point: no int
    // displacement limit on the total).
    std::vector<uint64_t> sizes(static_cast<size_t>(size_));
    uint64_t n = mine.size();
    MPI_Request rq;
    MPI_Igather(&n, 1, MPI_UINT64_T, sizes.data(), 1, MPI_UINT64_T, 0, comm_, &rq);
    wait(rq, "gather to", 0);
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
  // Polls `rq` until it completes or the timeout passes; sleeps between
  // tests (up to 1 ms) so that a waiting rank leaves the cores to the others.
  void wait(MPI_Request& rq, const char* what, int peer) {
    const auto t0 = std::chrono::steady_clock::now();
    long sleep_ns = 1000;
    for (;;) {
      int done = 0;
      MPI_Test(&rq, &done, MPI_STATUS_IGNORE);
      if (done) return;
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (waited > timeout_s_) {
        if (peer >= 0)
          std::fprintf(stderr, "exmy: error: rank %d: %s rank %d timed out after %.0f s (rank %d hangs or died)\n",
                       rank_, what, peer, waited, peer);
        else
          std::fprintf(stderr, "exmy: error: rank %d: %s the other ranks timed out after %.0f s (a rank hangs or died)\n",
                       rank_, what, waited);
        abort(1);
      }
      const timespec ts{0, sleep_ns};
      nanosleep(&ts, nullptr);
      sleep_ns = std::min(sleep_ns * 2, 1000000L);
    }
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  MPI_Op max_op_ = MPI_OP_NULL;
  int rank_ = 0, size_ = 1;
  double timeout_s_ = 600;
};

}  // namespace

bool mpi_available() { return true; }
std::unique_ptr<Comm> make_mpi_comm() { return std::make_unique<MpiComm>(); }

}  // namespace exmy::dist

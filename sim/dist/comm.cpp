#include "sim/dist/comm.hpp"

#include <cstdio>
#include <cstdlib>
#include <string>

#include "sim/dist/mpi_comm.hpp"

namespace exmy::dist {
namespace {

// The number of ranks a launcher says this process belongs to (0: not
// started by one).
int launcher_size() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "MPI_LOCALNRANKS"}) {
    if (const char* s = std::getenv(v)) return std::max(1, std::atoi(s));
  }
  if (std::getenv("PMIX_RANK")) return 1;  // PMIx without a size variable: MPI_Init tells
  return 0;
}

std::unique_ptr<Comm> make_world() {
  const int n = launcher_size();
  if (n == 0) return std::make_unique<SingleComm>();
  if (mpi_available()) return make_mpi_comm();
  if (n > 1)
    throw Error("started by an MPI launcher with " + std::to_string(n) +
                " ranks, but this exmy was built without MPI (configure with -DEXMY_MPI=ON; Debian: libopenmpi-dev)");
  return std::make_unique<SingleComm>();
}

Comm* g_world = nullptr;

}  // namespace

void SingleComm::abort(int code) { std::_Exit(code); }

Comm& world() {
  static std::unique_ptr<Comm> w = [] {
    auto c = make_world();
    g_world = c.get();
    return c;
  }();
  return *w;
}

bool in_multi_rank_job() { return g_world && g_world->size() > 1; }

RankFinding first_finding(Comm& c, const std::string& mine) {
  RankFinding f;
  if (c.size() == 1) {
    if (!mine.empty()) f = {true, 0, mine};
    return f;
  }
  const auto all = c.gather(mine);
  for (size_t r = 0; r < all.size(); ++r)
    if (!all[r].empty()) {
      f.rank = static_cast<int>(r), f.text = all[r];
      break;
    }
  double any = mine.empty() ? 0 : 1;
  c.max(std::span<double>(&any, 1));
  f.any = any != 0;
  return f;
}

double comm_timeout_seconds() {
  if (const char* s = std::getenv("EXMY_COMM_TIMEOUT_S")) {
    const double t = std::atof(s);
    if (t > 0) return t;
  }
  return 600;
}

void print_timeout(int rank, const char* what, std::span<const int> peers, double waited) {
  std::string ranks;
  for (const int p : peers) ranks += (ranks.empty() ? "" : ", ") + std::to_string(p);
  if (!ranks.empty())
    std::fprintf(stderr, "exmy: error: rank %d: %s rank %s timed out after %.0f s (rank %s hangs or died)\n", rank,
                 what, ranks.c_str(), waited, ranks.c_str());
  else
    std::fprintf(stderr, "exmy: error: rank %d: %s the other ranks timed out after %.0f s (a rank hangs or died)\n",
                 rank, what, waited);
}

int collective_peer(int rank, int size, int root) {
  if (rank != root) return root;
  return size == 2 ? 1 - root : -1;
}

void broadcast_string(Comm& c, std::string& s, int root) {
  if (c.size() == 1) return;
  uint64_t n = s.size();
  c.broadcast(&n, sizeof n, root);
  s.resize(n);
  if (n) c.broadcast(s.data(), n, root);
}

}  // namespace exmy::dist

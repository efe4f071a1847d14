// The train.comm choices (sim/dist/comm.hpp): their table and parser, in a
// file of their own so that what reads a run configuration (the fuzz
// target's parsers) need not link the ranks' transports.
#include <string>

#include "formats/error.hpp"
#include "sim/dist/comm.hpp"

namespace exmy::dist {

std::span<const CommChoiceRow> comm_choices() {
  static const CommChoiceRow rows[] = {
      {"auto", CommChoice::automatic,
       "NCCL when every rank trains on a CUDA device and libnccl loads on every rank, else MPI"},
      {"mpi", CommChoice::mpi, "MPI; ranks on CUDA devices stage their buffers through host copies"},
      {"nccl", CommChoice::nccl,
       "NCCL on the devices' buffers (cuda, cuda:N; its host emulation on cuda-emulated), bootstrapped over MPI"},
  };
  return rows;
}

CommChoice parse_comm_choice(std::string_view s, std::string_view what) {
  std::string names;
  const auto rows = comm_choices();
  for (size_t i = 0; i < rows.size(); ++i) {
    if (s == rows[i].name) return rows[i].value;
    names += std::string(i == 0 ? "" : i + 1 == rows.size() ? " or " : ", ") + rows[i].name;
  }
  throw Error(std::string(what) + ": bad value '" + std::string(s) + "' (expected " + names + ")");
}

const char* comm_choice_name(CommChoice c) {
  for (const CommChoiceRow& r : comm_choices())
    if (r.value == c) return r.name;
  return "?";
}

}  // namespace exmy::dist

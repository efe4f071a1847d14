// A build without NCCL (no CUDA toolkit, or no nccl.h in it).
#include "sim/dist/nccl_comm.hpp"

namespace exmy::dist {
namespace {
const char* const kNoNccl = "this exmy was built without NCCL (no CUDA toolkit with nccl.h at build time)";
}

std::string nccl_problem() { return kNoNccl; }
std::string nccl_load_problem(const std::string&) { return kNoNccl; }
std::unique_ptr<Comm> make_nccl_comm(Comm&) { throw Error(kNoNccl); }

}  // namespace exmy::dist

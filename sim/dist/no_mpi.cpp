// A build without MPI (EXMY_MPI=OFF or no MPI found).
#include "sim/dist/mpi_comm.hpp"

namespace exmy::dist {

bool mpi_available() { return false; }
std::unique_ptr<Comm> make_mpi_comm() { throw Error("this exmy was built without MPI"); }

}  // namespace exmy::dist

// The MPI implementation of dist::Comm (mpi_comm.cpp when exmy is built with
// EXMY_MPI; otherwise mpi_available() is false). Internal to sim/dist.
#pragma once

#include <memory>

#include "sim/dist/comm.hpp"

namespace exmy::dist {

bool mpi_available();
// MPI_Init_thread (funneled: only the main thread calls MPI) and a Comm over
// a duplicate of MPI_COMM_WORLD; MPI_Finalize when it is destroyed.
std::unique_ptr<Comm> make_mpi_comm();

}  // namespace exmy::dist

// NcclComm: the Comm of ranks on CUDA devices (docs/training.md
// "Data-parallel runs"). send, recv and broadcast take DEVICE pointers and
// run as NCCL point-to-point calls and broadcasts on the default stream
// (the stream of the model's kernels, so they follow the kernels that wrote
// the buffer), each waited for before it returns; rank, size, max,
// barrier, gather and abort are the host Comm's it wraps (MPI across
// processes), which also carries the NCCL id at setup. One rank per device:
// the communicator is made on the current CUDA device.
//
// libnccl is loaded with dlopen at the first use (nccl_problem or
// make_nccl_comm): a process that never uses NCCL never maps it. The
// library is EXMY_NCCL_LIBRARY when set (a path or a soname), else
// libnccl.so.2 from the loader's path, else from the CUDA toolkit exmy was
// built with.
//
// Every wait (the communicator's setup, each transfer) gives up after the
// Comm timeout (EXMY_COMM_TIMEOUT_S), polling NCCL's asynchronous error
// meanwhile: one line naming the rank and the operation, then the
// communicator is aborted and the job ended through the host Comm.
#pragma once

#include <memory>
#include <string>

#include "sim/dist/comm.hpp"

namespace exmy::dist {

// Empty when NCCL can be used by this process; else the one line why not
// (exmy built without CUDA or without nccl.h, libnccl not found or missing
// an entry point, a libnccl older than 2.14). Loads libnccl on the first call.
std::string nccl_problem();
// The same for the library at `library` (a path or soname), loaded on its
// own (nccl_problem does not keep the result): for tests of the loader.
std::string nccl_load_problem(const std::string& library);
// A communicator over every rank of `host` on the current CUDA device;
// every rank calls it together. Throws exmy::Error when NCCL cannot be
// used (nccl_problem) or its setup fails; a setup that does not finish in
// the timeout ends the job.
std::unique_ptr<Comm> make_nccl_comm(Comm& host);

}  // namespace exmy::dist

// The CUDA device backend of models/backend.hpp: the model's memory on a
// CUDA device (cudaMalloc) and the layer, SSD and attention kernels of
// models/cuda/*.cu, on the default stream. CUDA builds only
// (EXMY_HAVE_CUDA).
#pragma once

#include <memory>

#include "models/backend.hpp"

namespace exmy::models {

// Makes `device` current and returns its backend; exmy::Error (one line)
// when there is no such device.
std::unique_ptr<Backend<float>> make_cuda_backend(int device);

// The memory of the current CUDA device: an allocation that does not fit
// throws exmy::Error naming the bytes asked for and the bytes free.
sim::Memory& cuda_memory();

// Page-locked host memory (cudaHostAlloc): on_host() like the host's, and
// copies between it and cuda_memory() run at the link's full rate. The
// offloaded optimizer state (train.offload = optimizer) lives here. An
// allocation that cannot be pinned throws exmy::Error naming the bytes.
sim::Memory& cuda_pinned_memory();

}  // namespace exmy::models

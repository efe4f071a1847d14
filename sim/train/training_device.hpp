// What a training run runs on (train.device): the model's backend
// (models/backend.hpp), the linears of the recipe's unquantized policy on
// that backend's memory, the quantized linears' ops
// (sim/quant/quant_ops.hpp) and the optimizer's kernels. On the CPU these are
// the CPU backend, sim::make_linear_factory and the CPU AdamW; on
// cuda-emulated the device backend's launches run on the host (with the
// CPU's linears: its memory is the host's); on cuda[:N] the device's
// kernels, cuBLASLt linears and memory.
#pragma once

#include <memory>
#include <string_view>

#include "models/backend.hpp"
#include "sim/device/device.hpp"
#include "sim/linear.hpp"
#include "sim/optim.hpp"
#include "sim/quant/quant_ops.hpp"
#include "sim/sysmem.hpp"

namespace exmy::train {

// Free and total bytes of CUDA device d (cudaMemGetInfo on it); false
// without CUDA or for another kind of device.
bool cuda_device_memory(const sim::Device& d, size_t* free_bytes, size_t* total_bytes);
// The same as sim::require_memory's AvailableMemory, its free bytes with
// the source "cuda:N: F GiB free of T GiB"; false as above.
bool cuda_available_memory(const sim::Device& d, sim::AvailableMemory* out);

class TrainingDevice {
 public:
  // One line (exmy::Error) when `d` cannot be used here.
  explicit TrainingDevice(const sim::Device& d);
  ~TrainingDevice();
  TrainingDevice(const TrainingDevice&) = delete;
  TrainingDevice& operator=(const TrainingDevice&) = delete;

  const sim::Device& device() const { return device_; }
  bool on_device() const { return !device_.is_cpu(); }
  models::Backend<float>& backend() { return be_ ? *be_ : models::cpu_backend<float>(); }
  sim::Memory& memory() { return backend().memory(); }
  const sim::OptimKernels& optim() const { return optim_; }
  // Where train.offload = optimizer puts the optimizer state: page-locked
  // host memory for a CUDA device, the host's for cuda-emulated; null on
  // the CPU (whose optimizer state is in host memory already).
  sim::Memory* offload_memory();
  // Where the recipe's quantized linears run (their runtime's ops).
  sim::quant::QuantOps& quant_ops() { return quant_ ? *quant_ : sim::quant::cpu_quant_ops(); }
  // The linears of a plain policy (fp32 | bf16) on the backend's memory.
  std::unique_ptr<sim::LinearFactory<float>> plain_linears(std::string_view policy);

 private:
  sim::Device device_;
  std::unique_ptr<models::Backend<float>> be_;  // null: the CPU
  std::shared_ptr<void> gemm_;                  // CUDA: the sim::CudaGemm the linears share
  sim::OptimKernels optim_;
  std::unique_ptr<sim::quant::QuantOps> quant_;  // null: the CPU
};

}  // namespace exmy::train

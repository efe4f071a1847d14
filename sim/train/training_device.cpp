#include "sim/train/training_device.hpp"

#include "formats/error.hpp"
#include "sim/adamw_update.hpp"

#if defined(EXMY_HAVE_CUDA)
#include "models/cuda/backend_cuda.hpp"
#include "sim/cuda/gemm_cuda.hpp"
#include "sim/cuda/linear_cuda.hpp"
#endif

namespace exmy::train {

TrainingDevice::TrainingDevice(const sim::Device& d) : device_(d) {
  sim::require_training_device(d, "train.device");
  if (d.is_emulated()) {
    be_ = models::make_emulated_device_backend();
    optim_ = {sim::adamw_update_emulated, sim::global_norm_partials_emulated};
  } else if (d.is_cuda()) {
#if defined(EXMY_HAVE_CUDA)
    be_ = models::make_cuda_backend(d.index);
    optim_ = {sim::adamw_update_cuda, sim::global_norm_partials_cuda};
#endif
  }
}

TrainingDevice::~TrainingDevice() = default;

std::unique_ptr<sim::LinearFactory<float>> TrainingDevice::plain_linears(std::string_view policy) {
#if defined(EXMY_HAVE_CUDA)
  if (device_.is_cuda()) {
    if (!gemm_) gemm_ = std::make_shared<sim::CudaGemm>();
    return sim::make_cuda_linear_factory(policy, *static_cast<sim::CudaGemm*>(gemm_.get()));
  }
#endif
  // The CPU's linears: the CPU's memory, and cuda-emulated's, which is the host's.
  return sim::make_linear_factory<float>(policy);
}

}  // namespace exmy::train

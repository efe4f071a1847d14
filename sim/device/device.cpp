#include "sim/device/device.hpp"

#include <charconv>

#include "formats/error.hpp"

#include "formats/cuda/quantize_cuda.hpp"  // the host emulation always; the kernel with CUDA

namespace exmy::sim {

Device parse_device(std::string_view s, std::string_view what) {
  if (s == "cpu") return {};
  if (s == "cuda") return {Device::Kind::cuda, 0, false};
  if (s == "cuda-emulated") return {Device::Kind::emulated, 0, false};
  if (s.starts_with("cuda:")) {
    const std::string_view num = s.substr(5);
    int index = -1;
    const auto [p, ec] = std::from_chars(num.data(), num.data() + num.size(), index);
    if (!num.empty() && ec == std::errc() && p == num.data() + num.size() && index >= 0 && num[0] != '+')
      return {Device::Kind::cuda, index, true};
  }
  throw Error(std::string(what) + " " + std::string(s) +
              ": expected cpu, cuda, cuda:N (N a CUDA device index, e.g. cuda:1) or cuda-emulated");
}

std::string device_name(const Device& d) {
  if (d.is_emulated()) return "cuda-emulated";
  if (!d.is_cuda()) return "cpu";
  return d.indexed ? "cuda:" + std::to_string(d.index) : std::string("cuda");
}

DeviceInventory device_inventory() {
  DeviceInventory inv;
#if defined(EXMY_HAVE_CUDA)
  inv.built_with_cuda = true;
  inv.count = cuda_device_count(&inv.error);
#endif
  return inv;
}

std::string device_problem(const Device& d, const DeviceInventory& inv, std::string_view what) {
  if (!d.is_cuda()) return {};
  const std::string head = std::string(what) + " " + device_name(d) + ": ";
  if (!inv.built_with_cuda) return head + "exmy was built without CUDA (EXMY_CUDA=OFF, or no nvcc at build time)";
  if (inv.count <= 0)
    return head + "no CUDA device is visible (cudaGetDeviceCount: " +
           (inv.error.empty() ? std::string("0 devices") : inv.error) + ")";
  if (d.index >= inv.count)
    return head + "this machine has " + std::to_string(inv.count) + " CUDA device" + (inv.count == 1 ? "" : "s") +
           " (" + (inv.count == 1 ? std::string("0") : "0-" + std::to_string(inv.count - 1)) + ")";
  return {};
}

void require_device(const Device& d, std::string_view what) {
  if (!d.is_cuda()) return;
  const std::string problem = device_problem(d, device_inventory(), what);
  if (!problem.empty()) throw Error(problem);
#if defined(EXMY_HAVE_CUDA)
  cuda_select_device(d.index);
#endif
}

void require_training_device(const Device& d, std::string_view what) { require_device(d, what); }

QuantInfo quantize_on(const Device& d, const QuantSpec& spec, const float* x, int64_t rows, int64_t cols,
                      const QuantOutput& out, int threads) {
#if defined(EXMY_HAVE_CUDA)
  if (d.is_emulated()) return quantize_cuda_emulated(spec, x, rows, cols, out);
#else
  if (d.is_emulated()) return quantize(spec, x, rows, cols, out, threads);  // no emulation without CUDA: the same bits
#endif
  if (!d.is_cuda()) return quantize(spec, x, rows, cols, out, threads);
#if defined(EXMY_HAVE_CUDA)
  return quantize_cuda(spec, x, rows, cols, out);
#else
  throw Error(device_problem(d, device_inventory(), "--device"));
#endif
}

}  // namespace exmy::sim

#include "sim/sweep/device_pool.hpp"

#include <algorithm>
#include <charconv>

#include "formats/error.hpp"

namespace exmy::sweep {
namespace {

constexpr const char* kExpected = "expected CUDA device indices N, cuda:N, cuda or cuda-emulated, e.g. --devices 0,1,2,3";

std::string trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return std::string(s);
}

}  // namespace

std::vector<sim::Device> parse_device_list(std::string_view list) {
  const std::string head = "--devices '" + std::string(list) + "': ";
  if (trim(list).empty()) throw Error("--devices is empty (" + std::string(kExpected) + ")");
  std::vector<std::string> entries;
  for (size_t start = 0;;) {
    const size_t comma = list.find(',', start);
    entries.push_back(trim(list.substr(start, comma == std::string_view::npos ? std::string_view::npos : comma - start)));
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  std::vector<sim::Device> out;
  for (size_t i = 0; i < entries.size(); ++i) {
    const std::string& e = entries[i];
    if (e.empty()) throw Error(head + "entry " + std::to_string(i + 1) + " is empty (" + kExpected + ")");
    sim::Device d;
    int index = -1;
    const auto [p, ec] = std::from_chars(e.data(), e.data() + e.size(), index);
    if (ec == std::errc() && p == e.data() + e.size() && index >= 0) {
      d = {sim::Device::Kind::cuda, index, true};
    } else {
      try {
        d = sim::parse_device(e, "--devices");
      } catch (const Error&) {
        throw Error(head + "'" + e + "' is not a device (" + kExpected + ")");
      }
    }
    if (d.is_cpu())
      throw Error(head + "cpu is not a device to place runs on (without --devices every run trains as its configuration says, "
                         "--jobs at a time)");
    if (d.is_cuda())
      for (size_t j = 0; j < out.size(); ++j)
        if (out[j].is_cuda() && out[j].index == d.index)
          throw Error(head + "cuda:" + std::to_string(d.index) + " is listed twice (entries " + std::to_string(j + 1) +
                      " and " + std::to_string(i + 1) + "; one run per device at a time)");
    out.push_back(d);
  }
  return out;
}

DevicePool::DevicePool(std::vector<sim::Device> devices) : devices_(std::move(devices)), held_(devices_.size(), false) {}

size_t DevicePool::free_count() const {
  return static_cast<size_t>(std::count(held_.begin(), held_.end(), false));
}

std::optional<size_t> DevicePool::acquire() {
  for (size_t i = 0; i < held_.size(); ++i)
    if (!held_[i]) {
      held_[i] = true;
      return i;
    }
  return std::nullopt;
}

void DevicePool::release(size_t slot) {
  if (!held(slot))
    throw Error("device pool: slot " + std::to_string(slot) + " is not held (of " + std::to_string(size()) + ")");
  held_[slot] = false;
}

}  // namespace exmy::sweep

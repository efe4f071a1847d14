// Placing the runs of a sweep on devices (`exmy sweep --devices LIST`,
// docs/sweeps.md): the list's parser and the pool the runner takes a free
// device from for each run it starts, so that no two runs train on the same
// device at once.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sim/device/device.hpp"

namespace exmy::sweep {

// The devices of `--devices LIST`: comma-separated entries, each a CUDA
// device index N (cuda:N), cuda:N, cuda (cuda:0) or cuda-emulated (the
// device code on the host; it may be listed more than once, one slot on the
// host per entry). Blanks around an entry are ignored. Throws exmy::Error
// with one line naming the problem: an empty list or entry, an entry that
// is not a device, cpu, a CUDA device listed twice (cuda and cuda:0 are the
// same device). Whether the devices exist is not checked here
// (sim::device_problem). A run placed on device d gets
// `--set train.device=<sim::device_name(d)>`: cuda:N for an entry N, the
// others as written.
std::vector<sim::Device> parse_device_list(std::string_view list);

// A fixed list of devices, each free or held by one run. acquire() hands
// out the free device of lowest position in the list (so the placement of a
// given order of starts and ends is deterministic: the first runs get the
// devices in list order); release() gives it back.
class DevicePool {
 public:
  explicit DevicePool(std::vector<sim::Device> devices);

  size_t size() const { return devices_.size(); }
  size_t free_count() const;
  bool empty() const { return devices_.empty(); }

  // The position of the device now held, or nullopt when every one is busy.
  std::optional<size_t> acquire();
  // Gives back the device at `slot`; throws exmy::Error if it is not held.
  void release(size_t slot);
  bool held(size_t slot) const { return slot < held_.size() && held_[slot]; }

  const sim::Device& device(size_t slot) const { return devices_.at(slot); }

 private:
  std::vector<sim::Device> devices_;
  std::vector<bool> held_;
};

}  // namespace exmy::sweep

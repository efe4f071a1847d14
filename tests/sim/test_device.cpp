// Device selection (sim/device/device.hpp): the one parser of cpu | cuda |
// cuda:N and the one wording of its errors, for every machine this runs on
// (the inventories are given, so the messages are checked without a GPU),
// and require_device against this machine's own inventory.
#include <gtest/gtest.h>

#include <string>

#include "formats/error.hpp"
#include "sim/device/device.hpp"

namespace exmy::sim {
namespace {

std::string parse_error(const std::string& s) {
  try {
    parse_device(s, "--device");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Device, ParsesTheThreeSpellings) {
  EXPECT_EQ(parse_device("cpu", "--device"), Device{});
  EXPECT_FALSE(parse_device("cpu", "--device").is_cuda());
  const Device c = parse_device("cuda", "--device");
  EXPECT_TRUE(c.is_cuda());
  EXPECT_EQ(c.index, 0);
  EXPECT_EQ(device_name(c), "cuda");
  const Device c3 = parse_device("cuda:3", "--device");
  EXPECT_TRUE(c3.is_cuda());
  EXPECT_EQ(c3.index, 3);
  EXPECT_EQ(device_name(c3), "cuda:3");
  EXPECT_EQ(device_name(parse_device("cuda:0", "x")), "cuda:0");
  EXPECT_EQ(device_name(Device{}), "cpu");
}

TEST(Device, BadSpellingsNameTheOptionAndTheChoices) {
  for (const char* bad : {"gpu", "", "CUDA", "cuda:", "cuda:-1", "cuda:+1", "cuda:1x", "cuda0", "cpu:0", " cuda"}) {
    EXPECT_EQ(parse_error(bad),
              std::string("--device ") + bad + ": expected cpu, cuda, cuda:N (N a CUDA device index, e.g. cuda:1) or cuda-emulated")
        << bad;
  }
  try {
    parse_device("tpu", "train.device");
    ADD_FAILURE() << "tpu parsed";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("train.device tpu: expected cpu, cuda, cuda:N", 0), 0u) << e.what();
  }
}

TEST(Device, ProblemsInOneLine) {
  const Device cpu{}, cuda = parse_device("cuda", "d"), cuda3 = parse_device("cuda:3", "d"),
               cuda1 = parse_device("cuda:1", "d");
  const DeviceInventory none{false, 0, ""};
  const DeviceInventory failed{true, 0, "no CUDA-capable device is detected"};
  const DeviceInventory zero{true, 0, ""};
  const DeviceInventory one{true, 1, ""}, four{true, 4, ""};
  for (const DeviceInventory& inv : {none, failed, zero, one, four}) EXPECT_EQ(device_problem(cpu, inv, "--device"), "");
  EXPECT_EQ(device_problem(cuda, none, "--device"), "--device cuda: exmy was built without CUDA (EXMY_CUDA=OFF, or no nvcc at build time)");
  EXPECT_EQ(device_problem(cuda3, failed, "--device"),
            "--device cuda:3: no CUDA device is visible (cudaGetDeviceCount: no CUDA-capable device is detected)");
  EXPECT_EQ(device_problem(cuda, zero, "train.device"), "train.device cuda: no CUDA device is visible (cudaGetDeviceCount: 0 devices)");
  EXPECT_EQ(device_problem(cuda3, one, "--device"), "--device cuda:3: this machine has 1 CUDA device (0)");
  EXPECT_EQ(device_problem(cuda1, one, "--device"), "--device cuda:1: this machine has 1 CUDA device (0)");
  EXPECT_EQ(device_problem(cuda, one, "--device"), "");
  EXPECT_EQ(device_problem(cuda3, four, "--device"), "");
  EXPECT_EQ(device_problem(parse_device("cuda:4", "d"), four, "--device"), "--device cuda:4: this machine has 4 CUDA devices (0-3)");
}

// This machine: a usable device passes, the first index past the last one
// (or any CUDA device where there is none) fails with device_problem's line.
TEST(Device, RequireDeviceOnThisMachine) {
  const DeviceInventory inv = device_inventory();
#if defined(EXMY_HAVE_CUDA)
  EXPECT_TRUE(inv.built_with_cuda);
#else
  EXPECT_FALSE(inv.built_with_cuda);
  EXPECT_EQ(inv.count, 0);
#endif
  EXPECT_NO_THROW(require_device(Device{}, "--device"));
  const Device past{Device::Kind::cuda, inv.count, true};
  try {
    require_device(past, "--device");
    ADD_FAILURE() << "cuda:" << inv.count << " accepted on a machine with " << inv.count << " devices";
  } catch (const Error& e) {
    EXPECT_EQ(e.what(), device_problem(past, inv, "--device"));
  }
  if (inv.count > 0) {
    EXPECT_NO_THROW(require_device(Device{Device::Kind::cuda, 0, false}, "--device"));
  }
  // Training on a CUDA device: accepted where the device is there, else
  // device_problem's line; cuda-emulated and the CPU everywhere.
  const Device cuda{Device::Kind::cuda, 0, false};
  const std::string problem = device_problem(cuda, inv, "--device");
  if (problem.empty()) {
    EXPECT_NO_THROW(require_training_device(cuda, "--device"));
  } else {
    try {
      require_training_device(cuda, "--device");
      ADD_FAILURE() << "GPU training accepted without a device";
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()), problem);
    }
  }
  EXPECT_NO_THROW(require_training_device(Device{}, "--device"));
  EXPECT_NO_THROW(require_training_device(parse_device("cuda-emulated", "--device"), "--device"));
  EXPECT_EQ(device_name(parse_device("cuda-emulated", "--device")), "cuda-emulated");
}

}  // namespace
}  // namespace exmy::sim

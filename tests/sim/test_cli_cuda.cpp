// `exmy quantize --device cuda` and `exmy bench quantize --device cuda` on a
// CUDA device (CTest label "gpu"; every test reports SKIPPED without one):
// the files written on the device equal the CPU's byte for byte (values,
// codes, scale codes, statistics JSON) over formats, block shapes, rounding
// modes, tensor-amax policies, the Hadamard transform and TE's codes; the
// device benchmark prints every row with a throughput and a ratio; and
// `exmy bench train --profile` times the device's launches.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "sim/device/device.hpp"
#include "tests/cli_support.hpp"

namespace fs = std::filesystem;

namespace {

// The exmy binary: $EXMY_BINARY_PATH (tools/gpu-check.sh runs a carried
// build elsewhere), else the one this test was built with.
std::string exmy_binary() {
  const char* p = std::getenv("EXMY_BINARY_PATH");
  return p && *p ? p : EXMY_BINARY;
}

#define EXMY_REQUIRE_CUDA()                                                                    \
  do {                                                                                         \
    const exmy::sim::DeviceInventory inv = exmy::sim::device_inventory();                      \
    if (inv.count == 0) GTEST_SKIP() << "needs a CUDA device: " << (inv.error.empty() ? "none" : inv.error); \
  } while (0)

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

TEST(CliCuda, QuantizeWritesTheCpuFiles) {
  EXMY_REQUIRE_CUDA();
  const fs::path dir = fs::temp_directory_path() / ("exmy_cli_cuda_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const int64_t rows = 96, cols = 160;
  {
    std::mt19937 rng(3);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> x(static_cast<size_t>(rows * cols));
    for (size_t i = 0; i < x.size(); ++i) x[i] = nd(rng) * std::ldexp(1.0f, static_cast<int>(i % 23) - 11);
    x[17] = 0.0f;
    x[18] = -0.0f;
    std::ofstream(dir / "x.f32", std::ios::binary)
        .write(reinterpret_cast<const char*>(x.data()), static_cast<std::streamsize>(x.size() * 4));
  }
  const std::vector<std::string> specs = {
      "--elem e2m1 --scale ue5m3 --block 1x16 --tensor-amax auto",
      "--elem e2m1 --scale e4m3 --block 16x16 --arith fp32 --tensor-amax auto",
      "--elem e2m1 --scale ue8m0 --block 1x32 --scale-rule mx-floor",
      "--elem e2m1 --scale ue5m3 --block 16x1 --round stochastic-fast --sr-bits 8 --seed 7",
      "--elem e4m3 --tensor-amax 3.5",
      "--elem e2m1 --scale e4m3 --block 1x16 --arith fp32 --tensor-amax auto --rht --round stochastic",
      "--elem e2m1 --scale e4m3 --block 1x16 --arith fp32 --tensor-amax auto --convention te",
      "--elem e2m1 --scale e4m3 --block 1x16 --arith fp32 --tensor-amax auto --outer-scale row --convention te",
      "--elem e4m3 --block 1x16 --tensor-amax auto --outer-scale row --round stochastic --seed 5",
  };
  int compared = 0;
  for (const std::string& spec : specs) {
    for (const char* device : {"cpu", "cuda"}) {
      const std::string d = (dir / device).string();
      const std::string cmd = exmy_binary() + " quantize --input " + (dir / "x.f32").string() + " --shape " +
                              std::to_string(rows) + "," + std::to_string(cols) + " " + spec + " --device " + device +
                              " --output " + d + ".y --codes " + d + ".c --scales " + d + ".s --stats " + d + ".json";
      const auto r = exmy::test::run_cli({"/bin/sh", "-c", cmd});
      ASSERT_EQ(r.status, 0) << cmd << "\n" << r.out;
    }
    for (const char* ext : {".y", ".c", ".s", ".json"}) {
      const std::string a = slurp(dir / (std::string("cpu") + ext)), b = slurp(dir / (std::string("cuda") + ext));
      EXPECT_FALSE(a.empty() && std::string(ext) != ".s") << spec << ext;
      EXPECT_EQ(a == b, true) << spec << ": " << ext << " differs between --device cpu and --device cuda";
      ++compared;
    }
  }
  EXPECT_EQ(compared, static_cast<int>(specs.size()) * 4);
  fs::remove_all(dir);
}

TEST(CliCuda, BenchQuantizeOnTheDevice) {
  EXMY_REQUIRE_CUDA();
  const auto r = exmy::test::run_cli(
      {exmy_binary(), "bench", "quantize", "--device", "cuda", "--elements", "1048576", "--cols", "1024", "--repeat", "2"});
  ASSERT_EQ(r.status, 0) << r.out;
  for (const char* row : {"float32 copy (d2d)", "memory floor, 1 pass", "memory floor, 2 passes", "e2m1/ue5m3 1x16 rne exact", "e2m1/ue5m3 1x16 exact, held",
                          "e2m1/ue5m3 16x1 rne exact", "e2m1/e4m3 16x16 rne fp32", "e2m1/e4m3 1x16 fp32 (NVFP4)",
                          "e2m1/ue8m0 1x32 mx-floor", "e2m1/ue5m3 1x16 sr-fast8"}) {
    const size_t at = r.out.find(std::string(row) + " ");
    ASSERT_NE(at, std::string::npos) << row << "\n" << r.out;
    const std::string line = r.out.substr(at, r.out.find('\n', at) - at);
    EXPECT_NE(line.find(" Me/s"), std::string::npos) << line;
  }
}

// `exmy bench train --device cuda --profile`: the extra pass's table names
// the layer kernels, the quantizer's kernels and the cuBLASLt GEMMs (with a
// rate), and the launches' sum is within the pass (events, not host time).
TEST(CliCuda, BenchTrainProfileTimesTheDevicesLaunches) {
  EXMY_REQUIRE_CUDA();
  const auto r = exmy::test::run_cli({exmy_binary(), "bench", "train", "--device", "cuda", "--model", "proxy-tiny",
                                      "--seq-len", "64", "--batch", "2", "--steps", "1", "--recipe", "bf16,te-nvfp4",
                                      "--stats", "none", "--profile"});
  ASSERT_EQ(r.status, 0) << r.out;
  const size_t at = r.out.find("launch profile of one te-nvfp4 pass (");
  ASSERT_NE(at, std::string::npos) << r.out;
  const size_t end = r.out.find("\nlaunches: ", at);
  ASSERT_NE(end, std::string::npos) << r.out;
  const std::string table = r.out.substr(at, end - at);
  for (const char* row : {"\nrmsnorm_forward rstd ", "\nquantize ", "\ncublasLt fp32 "})
    EXPECT_NE(table.find(row), std::string::npos) << row << "\n" << table;
  // "launches: N, X ms of the pass's Y ms (P%)"
  std::istringstream line(r.out.substr(end + std::string("\nlaunches: ").size()));
  long long calls = 0;
  char comma = 0;
  double sum_ms = 0, pass_ms = 0;
  std::string of, the, pass;
  line >> calls >> comma >> sum_ms >> of >> of >> the >> pass >> pass_ms;
  EXPECT_GT(calls, 0) << r.out.substr(end, 200);
  EXPECT_GT(sum_ms, 0.0) << r.out.substr(end, 200);
  EXPECT_LE(sum_ms, pass_ms) << r.out.substr(end, 200);
}

}  // namespace

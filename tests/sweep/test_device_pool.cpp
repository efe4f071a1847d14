// Placing sweep runs on devices (`exmy sweep --devices`,
// sim/sweep/device_pool.hpp): the list's parser and its one-line errors,
// the pool's order, a simulated schedule of many runs, and run_sweep itself
// with a stand-in trainer that records which device each run got and
// whether another run held it at the same time. No GPU needed: the device
// names are only passed on.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "formats/error.hpp"
#include "sim/sweep/device_pool.hpp"
#include "sim/sweep/runner.hpp"
#include "sim/sweep/sweep.hpp"
#include "tests/train/test_support.hpp"

namespace exmy::sweep {
namespace {

namespace fs = std::filesystem;

std::vector<std::string> names(const std::vector<sim::Device>& d) {
  std::vector<std::string> n;
  for (const auto& x : d) n.push_back(sim::device_name(x));
  return n;
}

// The one-line message parse_device_list(list) throws ("" when none).
std::string list_error(const std::string& list) {
  try {
    parse_device_list(list);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(DevicePool, ParsesDeviceLists) {
  EXPECT_EQ(names(parse_device_list("0,1,2,3")),
            (std::vector<std::string>{"cuda:0", "cuda:1", "cuda:2", "cuda:3"}));
  EXPECT_EQ(names(parse_device_list("cuda:2, cuda ,7")), (std::vector<std::string>{"cuda:2", "cuda", "cuda:7"}));
  EXPECT_EQ(names(parse_device_list("cuda-emulated")), (std::vector<std::string>{"cuda-emulated"}));
  // The emulated device is the host: each entry is one more slot.
  EXPECT_EQ(names(parse_device_list("cuda-emulated,cuda-emulated")),
            (std::vector<std::string>{"cuda-emulated", "cuda-emulated"}));
  const auto d = parse_device_list("3");
  ASSERT_EQ(d.size(), 1u);
  EXPECT_TRUE(d[0].is_cuda());
  EXPECT_EQ(d[0].index, 3);
}

TEST(DevicePool, BadListsAreOneLineNamingTheProblem) {
  struct Case {
    const char* list;
    const char* message;  // the start of it
  };
  for (const Case& c : {
           Case{"", "--devices is empty (expected CUDA device indices N, cuda:N, cuda or cuda-emulated"},
           Case{" ", "--devices is empty"},
           Case{"0,,1", "--devices '0,,1': entry 2 is empty"},
           Case{"0,", "--devices '0,': entry 2 is empty"},
           Case{"gpu", "--devices 'gpu': 'gpu' is not a device (expected CUDA device indices N, cuda:N"},
           Case{"0,-1", "--devices '0,-1': '-1' is not a device"},
           Case{"cuda:x", "--devices 'cuda:x': 'cuda:x' is not a device"},
           Case{"0 1", "--devices '0 1': '0 1' is not a device"},
           Case{"cpu", "--devices 'cpu': cpu is not a device to place runs on"},
           Case{"0,1,0", "--devices '0,1,0': cuda:0 is listed twice (entries 1 and 3; one run per device at a time)"},
           Case{"cuda,cuda:0", "--devices 'cuda,cuda:0': cuda:0 is listed twice (entries 1 and 2"},
           Case{"1,cuda:1", "--devices '1,cuda:1': cuda:1 is listed twice"},
       }) {
    const std::string e = list_error(c.list);
    EXPECT_EQ(e.rfind(c.message, 0), 0u) << "'" << c.list << "': " << e;
    EXPECT_EQ(e.find('\n'), std::string::npos) << e;
  }
}

// acquire() hands out the free device of lowest position; release() gives
// it back; nothing is handed out twice.
TEST(DevicePool, LowestFreeDeviceFirst) {
  DevicePool pool(parse_device_list("4,5,6"));
  EXPECT_EQ(pool.size(), 3u);
  EXPECT_EQ(pool.acquire(), 0u);
  EXPECT_EQ(pool.acquire(), 1u);
  EXPECT_EQ(pool.acquire(), 2u);
  EXPECT_EQ(pool.free_count(), 0u);
  EXPECT_EQ(pool.acquire(), std::nullopt);
  EXPECT_EQ(sim::device_name(pool.device(1)), "cuda:5");
  pool.release(1);
  EXPECT_FALSE(pool.held(1));
  EXPECT_EQ(pool.acquire(), 1u);
  pool.release(0);
  pool.release(2);
  EXPECT_EQ(pool.acquire(), 0u);
  EXPECT_EQ(pool.acquire(), 2u);
  EXPECT_THROW(pool.release(7), Error);
  pool.release(2);
  EXPECT_THROW(pool.release(2), Error);  // not held any more
  DevicePool none({});
  EXPECT_TRUE(none.empty());
  EXPECT_EQ(none.acquire(), std::nullopt);
}

// The runner's loop in miniature: start runs in order while a device is
// free, end them in an order drawn from `seed`. Returns each run's device
// position; fails the test if a device is handed to a second run while
// held, or a run never gets one.
std::vector<size_t> simulate(size_t devices, size_t runs, uint32_t seed) {
  std::vector<sim::Device> list;
  for (size_t i = 0; i < devices; ++i) list.push_back({sim::Device::Kind::cuda, static_cast<int>(i), true});
  DevicePool pool(list);
  std::vector<size_t> device_of(runs, SIZE_MAX);
  std::vector<std::optional<size_t>> holder(devices);  // run holding each device
  std::vector<size_t> active;
  size_t next = 0;
  uint32_t state = seed;
  while (next < runs || !active.empty()) {
    while (next < runs && pool.free_count() > 0) {
      const auto slot = pool.acquire();
      if (!slot) {
        ADD_FAILURE() << "free_count > 0 but nothing to acquire";
        return device_of;
      }
      if (holder[*slot]) ADD_FAILURE() << "device " << *slot << " given to run " << next << " while run "
                                       << *holder[*slot] << " holds it";
      holder[*slot] = next;
      device_of[next] = *slot;
      active.push_back(next++);
    }
    state = state * 1664525u + 1013904223u;  // one run ends
    const size_t k = (state >> 8) % active.size();
    const size_t done = active[k];
    holder[device_of[done]].reset();
    pool.release(device_of[done]);
    active.erase(active.begin() + static_cast<std::ptrdiff_t>(k));
  }
  for (size_t r = 0; r < runs; ++r) EXPECT_LT(device_of[r], devices) << "run " << r << " got no device";
  EXPECT_EQ(pool.free_count(), devices);
  return device_of;
}

TEST(DevicePool, ScheduleNeverSharesADeviceAndIsDeterministic) {
  for (uint32_t seed : {1u, 2u, 3u, 99u}) {
    const std::vector<size_t> a = simulate(4, 40, seed);
    // The first four runs get the devices in list order.
    EXPECT_EQ(std::vector<size_t>(a.begin(), a.begin() + 4), (std::vector<size_t>{0, 1, 2, 3}));
    // The same starts and ends give the same placement.
    EXPECT_EQ(simulate(4, 40, seed), a) << seed;
    // Every device is used.
    EXPECT_EQ(std::set<size_t>(a.begin(), a.end()).size(), 4u) << seed;
  }
  EXPECT_EQ(simulate(1, 5, 7), std::vector<size_t>(5, 0));
}

std::string read_text(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// run_sweep with --devices 0,1 and a stand-in trainer (a shell script):
// each run gets one device as --set train.device=cuda:N, the first two runs
// get cuda:0 and cuda:1, and no run starts on a device another run still
// holds (the stand-in claims it with mkdir, which fails if it exists, and
// frees it just before it exits). Runs take 0.1-0.3 s so that they end out
// of order.
TEST(DevicePool, RunSweepPlacesOneRunPerDevice) {
  test::TempDir tmp;
  const fs::path held = tmp / "held", log = tmp / "placements", clash = tmp / "clashes";
  fs::create_directories(held);
  const fs::path script = tmp / "fake-exmy";
  {
    std::ofstream s(script);
    s << "#!/bin/sh\n"
         "dev=''; out=''; prev=''\n"
         "for a in \"$@\"; do\n"
         "  case \"$a\" in train.device=*) dev=\"${a#train.device=}\";; esac\n"
         "  [ \"$prev\" = --out ] && out=\"$a\"\n"
         "  prev=\"$a\"\n"
         "done\n"
         "run=$(basename \"$out\")\n"
         "mkdir '" << held.string() << "'/\"$dev\" 2>/dev/null || echo \"$run $dev\" >> '" << clash.string() << "'\n"
         "echo \"$run $dev\" >> '" << log.string() << "'\n"
         "case $(expr \"$(echo \"$run\" | cut -c1-3)\" % 3) in 0) sleep 0.3;; 1) sleep 0.1;; *) sleep 0.2;; esac\n"
         "rmdir '" << held.string() << "'/\"$dev\"\n"
         "echo 'exmy: error: a stand-in trainer'\n"
         "exit 1\n";
  }
  fs::permissions(script, fs::perms::owner_all);
  const SweepSpec spec = parse_sweep("[sweep]\nname = place\nbase = base.ini\n[grid]\ntrain.seed = 1, 2, 3, 4, 5, 6, 7\n",
                                     "place.ini");
  const auto runs = expand(spec);
  RunnerOptions opt;
  opt.exmy = script.string();
  opt.devices = parse_device_list("0,1");
  opt.jobs = 2;
  opt.threads = 1;
  opt.out = nullptr;
  const std::string out = tmp / "out";
  const SweepOutcome o = run_sweep(spec, runs, out, opt);
  EXPECT_EQ(o.ran, 7);
  EXPECT_EQ(o.failed, 7);  // the stand-in trains nothing
  EXPECT_FALSE(fs::exists(clash)) << read_text(clash);
  std::map<std::string, std::string> device_of;
  std::istringstream lines(read_text(log));
  std::vector<std::string> order;
  for (std::string run, dev; lines >> run >> dev;) {
    EXPECT_TRUE(device_of.emplace(run, dev).second) << run << " started twice";
    EXPECT_TRUE(dev == "cuda:0" || dev == "cuda:1") << run << " on '" << dev << "'";
    order.push_back(run);
  }
  ASSERT_EQ(device_of.size(), 7u);
  EXPECT_EQ(device_of.at("000_seed=1"), "cuda:0");
  EXPECT_EQ(device_of.at("001_seed=2"), "cuda:1");
  // The device is in the log's header line, not in the run's identity.
  for (const auto& r : runs) {
    EXPECT_NE(read_text(fs::path(out) / r.name / "train.log").find("--set train.device=" + device_of.at(r.name)),
              std::string::npos)
        << r.name;
    EXPECT_EQ(read_text(fs::path(out) / r.name / "sweep-run.json").find("train.device"), std::string::npos) << r.name;
  }
}

// The sweep's own train.device, and more jobs than devices, are refused
// before anything is written.
TEST(DevicePool, RunSweepRefusesConflicts) {
  test::TempDir tmp;
  RunnerOptions opt;
  opt.exmy = "/bin/false";
  opt.devices = parse_device_list("0,1");
  opt.out = nullptr;
  const std::string out = tmp / "out";
  auto error = [&](const std::string& text, int jobs) {
    opt.jobs = jobs;
    const SweepSpec spec = parse_sweep(text, "c.ini");
    try {
      run_sweep(spec, expand(spec), out, opt);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  const std::string head = "[sweep]\nbase = base.ini\n";
  EXPECT_EQ(error(head + "[set]\ntrain.device = cuda:3\n[grid]\ntrain.seed = 1, 2\n", 2),
            "--devices places each run on a device, but the sweep sets train.device = cuda:3 itself ([set] or --set); "
            "drop one of them");
  EXPECT_EQ(error(head + "[grid]\ntrain.device = cuda:0, cuda:1\n", 2),
            "--devices places each run on a device, but train.device is an axis of the sweep; drop one of them");
  EXPECT_EQ(error(head + "[grid]\ntrain.seed = 1, 2\n", 3),
            "--jobs 3 is more than the 2 devices of --devices (one run per device at a time)");
  EXPECT_FALSE(fs::exists(out));
}

}  // namespace
}  // namespace exmy::sweep

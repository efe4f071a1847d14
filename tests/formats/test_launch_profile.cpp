// The launch profile (formats/launch_profile.hpp): what it records while on
// and off, how it sums per name, and its table.
#include "formats/launch_profile.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "formats/kernel_launch.hpp"

namespace {

using exmy::LaunchProfileRow;

const LaunchProfileRow* row_named(const std::vector<LaunchProfileRow>& rows, const std::string& name) {
  for (const auto& r : rows)
    if (r.name == name) return &r;
  return nullptr;
}

TEST(LaunchProfile, OffRecordsNothing) {
  ASSERT_FALSE(exmy::launch_profile_on());
  int ran = 0;
  exmy::HostLaunch{}("off", 5, [&](int64_t) { ++ran; });
  EXPECT_EQ(ran, 5);
  exmy::launch_profile_start();
  EXPECT_TRUE(exmy::launch_profile_stop().empty());  // the launch before start is not there
}

TEST(LaunchProfile, HostLaunchesSumPerName) {
  exmy::launch_profile_start();
  EXPECT_TRUE(exmy::launch_profile_on());
  std::vector<int> seen(7, 0);
  const exmy::HostLaunch launch;
  launch("a", 7, [&](int64_t i) { ++seen[static_cast<size_t>(i)]; });
  launch("b", 3, [&](int64_t) {});
  launch("a", 7, [&](int64_t i) { ++seen[static_cast<size_t>(i)]; });
  const auto rows = exmy::launch_profile_stop();
  EXPECT_FALSE(exmy::launch_profile_on());
  for (int v : seen) EXPECT_EQ(v, 2);  // timing does not change what runs
  ASSERT_EQ(rows.size(), 2u);
  ASSERT_NE(row_named(rows, "a"), nullptr);
  ASSERT_NE(row_named(rows, "b"), nullptr);
  EXPECT_EQ(row_named(rows, "a")->calls, 2);
  EXPECT_EQ(row_named(rows, "b")->calls, 1);
  EXPECT_GE(row_named(rows, "a")->ms, 0.0);
}

TEST(LaunchProfile, StartDropsEarlierRecords) {
  exmy::launch_profile_start();
  exmy::launch_profile_add_host("old", 1.0);
  exmy::launch_profile_start();
  exmy::launch_profile_add_host("new", 2.0);
  const auto rows = exmy::launch_profile_stop();
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].name, "new");
}

// Device records read their time through the given function and free their
// two events through the other, once each, whether read or dropped.
int g_released = 0;
double fake_elapsed(void* a, void* b) {
  return static_cast<double>(reinterpret_cast<intptr_t>(b) - reinterpret_cast<intptr_t>(a));
}
void fake_release(void* e) {
  if (e) ++g_released;
}

TEST(LaunchProfile, DeviceRecordsReadAndReleaseTheirEvents) {
  g_released = 0;
  exmy::launch_profile_start();
  auto ev = [](intptr_t v) { return reinterpret_cast<void*>(v); };
  exmy::launch_profile_add_device("gemm", ev(10), ev(13), fake_elapsed, fake_release, 6e9);
  exmy::launch_profile_add_device("gemm", ev(20), ev(21), fake_elapsed, fake_release, 2e9);
  exmy::launch_profile_add_device("kernel", ev(30), ev(35), fake_elapsed, fake_release);
  exmy::launch_profile_add_host("host", 0.5);
  const auto rows = exmy::launch_profile_stop();
  EXPECT_EQ(g_released, 6);
  ASSERT_EQ(rows.size(), 3u);
  // the longest first
  EXPECT_EQ(rows[0].name, "kernel");
  EXPECT_DOUBLE_EQ(rows[0].ms, 5.0);
  EXPECT_EQ(rows[1].name, "gemm");
  EXPECT_EQ(rows[1].calls, 2);
  EXPECT_DOUBLE_EQ(rows[1].ms, 4.0);
  EXPECT_DOUBLE_EQ(rows[1].flops, 8e9);
  EXPECT_EQ(rows[2].name, "host");
  // records dropped by a new start release their events too
  g_released = 0;
  exmy::launch_profile_start();
  exmy::launch_profile_add_device("dropped", ev(1), ev(2), fake_elapsed, fake_release);
  exmy::launch_profile_start();
  EXPECT_EQ(g_released, 2);
  EXPECT_TRUE(exmy::launch_profile_stop().empty());
}

TEST(LaunchProfile, TableSharesRatesAndFoldedRows) {
  std::vector<LaunchProfileRow> rows = {{"gemm", 2, 4.0, 8e9}, {"kernel", 4, 2.0, 0}, {"tail", 1, 1.0, 0}};
  const std::string t = exmy::launch_profile_table(rows, 10.0, 2);
  // gemm: 4 ms of 10 (40%), 2000 us a call, 8 GFLOP in 4 ms = 2000 GFLOP/s
  EXPECT_NE(t.find("gemm"), std::string::npos) << t;
  EXPECT_NE(t.find("40.0%"), std::string::npos) << t;
  EXPECT_NE(t.find("2000.0"), std::string::npos) << t;
  EXPECT_NE(t.find("   2000.0\n"), std::string::npos) << t;
  // kernel: 20%, 500 us a call, no rate
  EXPECT_NE(t.find("20.0%"), std::string::npos) << t;
  EXPECT_NE(t.find("500.0"), std::string::npos) << t;
  // the third row folded
  EXPECT_EQ(t.find("tail"), std::string::npos) << t;
  EXPECT_NE(t.find("(1 other names)"), std::string::npos) << t;
  EXPECT_NE(t.find("launches: 7, 7.000 ms of the pass's 10.000 ms (70.0%)"), std::string::npos) << t;
}

}  // namespace

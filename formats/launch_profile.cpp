// The launch profile's records and table (formats/launch_profile.hpp).
#include "formats/launch_profile.hpp"

#include <algorithm>
#include <cstdio>
#include <map>
#include <mutex>

namespace exmy {
namespace {

struct Record {
  std::string name;
  double ms = 0;  // host intervals
  void* start = nullptr;  // device intervals: events, read at stop
  void* stop = nullptr;
  double (*elapsed_ms)(void*, void*) = nullptr;
  void (*release)(void*) = nullptr;
  double flops = 0;
};

struct Store {
  std::mutex mu;
  std::vector<Record> records;
};

Store& store() {
  static Store s;
  return s;
}

void release_all(std::vector<Record>& records) {
  for (auto& r : records) {
    if (r.release) {
      r.release(r.start);
      r.release(r.stop);
    }
  }
  records.clear();
}

}  // namespace

void launch_profile_start() {
  Store& s = store();
  std::lock_guard<std::mutex> lock(s.mu);
  release_all(s.records);
  detail::launch_profile_flag().store(true);
}

std::vector<LaunchProfileRow> launch_profile_stop() {
  detail::launch_profile_flag().store(false);
  Store& s = store();
  std::lock_guard<std::mutex> lock(s.mu);
  std::map<std::string, LaunchProfileRow> by_name;
  for (const auto& r : s.records) {
    LaunchProfileRow& row = by_name[r.name];
    row.name = r.name;
    row.calls += 1;
    row.ms += r.elapsed_ms ? r.elapsed_ms(r.start, r.stop) : r.ms;
    row.flops += r.flops;
  }
  release_all(s.records);
  std::vector<LaunchProfileRow> rows;
  rows.reserve(by_name.size());
  for (auto& [name, row] : by_name) rows.push_back(std::move(row));
  std::stable_sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.ms > b.ms; });
  return rows;
}

void launch_profile_add_host(std::string name, double ms, double flops) {
  Store& s = store();
  std::lock_guard<std::mutex> lock(s.mu);
  s.records.push_back(Record{std::move(name), ms, nullptr, nullptr, nullptr, nullptr, flops});
}

void launch_profile_add_device(std::string name, void* start, void* stop, double (*elapsed_ms)(void*, void*),
                               void (*release)(void*), double flops) {
  Store& s = store();
  std::lock_guard<std::mutex> lock(s.mu);
  s.records.push_back(Record{std::move(name), 0, start, stop, elapsed_ms, release, flops});
}

std::string launch_profile_table(const std::vector<LaunchProfileRow>& rows, double pass_ms, int max_rows) {
  std::string out;
  char line[512];
  std::snprintf(line, sizeof line, "%-52s %7s %10s %7s %10s %9s\n", "launch", "calls", "total ms", "share",
                "mean us", "GFLOP/s");
  out += line;
  double sum = 0;
  int64_t calls = 0;
  double rest_ms = 0;
  int64_t rest_calls = 0, rest_names = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto& r = rows[i];
    sum += r.ms;
    calls += r.calls;
    if (static_cast<int>(i) >= max_rows) {
      rest_ms += r.ms;
      rest_calls += r.calls;
      ++rest_names;
      continue;
    }
    char rate[32] = "";
    if (r.flops > 0 && r.ms > 0) std::snprintf(rate, sizeof rate, "%9.1f", r.flops / (r.ms * 1e-3) / 1e9);
    std::snprintf(line, sizeof line, "%-52.52s %7lld %10.3f %6.1f%% %10.1f %9s\n", r.name.c_str(),
                  static_cast<long long>(r.calls), r.ms, pass_ms > 0 ? 100.0 * r.ms / pass_ms : 0.0,
                  r.calls ? 1e3 * r.ms / static_cast<double>(r.calls) : 0.0, rate);
    out += line;
  }
  if (rest_names > 0) {
    std::snprintf(line, sizeof line, "%-52s %7lld %10.3f %6.1f%%\n",
                  ("(" + std::to_string(rest_names) + " other names)").c_str(), static_cast<long long>(rest_calls),
                  rest_ms, pass_ms > 0 ? 100.0 * rest_ms / pass_ms : 0.0);
    out += line;
  }
  std::snprintf(line, sizeof line,
                "launches: %lld, %.3f ms of the pass's %.3f ms (%.1f%%); the rest is work outside the timed calls "
                "(host work, copies, the gaps between launches)\n",
                static_cast<long long>(calls), sum, pass_ms, pass_ms > 0 ? 100.0 * sum / pass_ms : 0.0);
  out += line;
  return out;
}

}  // namespace exmy

// Memory the machine can give this process, and the check that `train`,
// `eval` and `bench train` make against their estimated peak before they
// allocate a model: a model that does not fit is a one-line error naming
// bytes needed and available, not a death in the allocator or by the OOM
// killer minutes later.
//
// Available = MemAvailable of /proc/meminfo, lowered to what the memory
// cgroup of this process (v2: memory.max - memory.current of its group and
// each parent; v1: memory.limit_in_bytes - memory.usage_in_bytes) leaves.
// EXMY_MEMORY_CHECK=off skips the check (for a machine whose swap or
// overcommit the user trusts).
#pragma once

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>

#include "formats/error.hpp"

namespace exmy::sim {

struct AvailableMemory {
  double bytes = std::numeric_limits<double>::infinity();  // +inf: unknown
  std::string source;                                      // "MemAvailable", "cgroup limit 8.00 GiB", ...
};

namespace detail {

// A number from the first line of `path`, or NaN ("max", absent, unreadable).
inline double read_number_file(const std::string& path) {
  std::ifstream in(path);
  std::string s;
  if (!(in >> s) || s == "max") return std::nan("");
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  return end && *end == '\0' ? v : std::nan("");
}

}  // namespace detail

// Bytes as "12.34 GiB", as exmy's memory messages and model-info print them.
inline std::string gib_text(double b) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.2f GiB", b / (1024.0 * 1024.0 * 1024.0));
  return buf;
}

inline AvailableMemory available_memory() {
  AvailableMemory a;
  {
    std::ifstream in("/proc/meminfo");
    std::string key, unit;
    double kb = 0;
    while (in >> key >> kb) {
      std::getline(in, unit);
      if (key == "MemAvailable:") {
        a.bytes = kb * 1024.0;
        a.source = "MemAvailable";
        break;
      }
    }
  }
  auto lower = [&](double limit, double used, const std::string& where) {
    if (!std::isfinite(limit) || !std::isfinite(used) || limit > 1e18) return;
    const double left = std::max(0.0, limit - used);
    if (left < a.bytes) {
      a.bytes = left;
      a.source = "cgroup " + where + " limit " + gib_text(limit) + ", " + gib_text(used) + " used";
    }
  };
  std::ifstream cg("/proc/self/cgroup");
  for (std::string line; std::getline(cg, line);) {
    if (line.rfind("0::", 0) == 0) {  // cgroup v2: this group and its parents
      for (std::string g = line.substr(3);; g = g.substr(0, g.rfind('/'))) {
        const std::string dir = "/sys/fs/cgroup" + (g == "/" ? std::string() : g);
        lower(detail::read_number_file(dir + "/memory.max"), detail::read_number_file(dir + "/memory.current"),
              g.empty() ? "/" : g);
        if (g.empty() || g == "/" || g.rfind('/') == std::string::npos) break;
      }
    } else if (line.find(":memory:") != std::string::npos) {  // cgroup v1
      const std::string dir = "/sys/fs/cgroup/memory";
      lower(detail::read_number_file(dir + "/memory.limit_in_bytes"),
            detail::read_number_file(dir + "/memory.usage_in_bytes"), "v1");
    }
  }
  return a;
}

// Throws exmy::Error when `need` bytes (the estimated peak of `what`) exceed
// what the machine has available; `hint` says how to need less.
// `available`: the memory to check against (default: the host's).
inline void require_memory(double need, const std::string& what, const std::string& hint,
                           const AvailableMemory* available = nullptr) {
  const char* env = std::getenv("EXMY_MEMORY_CHECK");
  if (env && (std::string(env) == "off" || std::string(env) == "0")) return;
  const AvailableMemory a = available ? *available : available_memory();
  if (!(need > a.bytes)) return;
  throw Error(what + " needs about " + gib_text(need) + " of memory, but " + gib_text(a.bytes) +
              " are available (" + a.source + ")" + (hint.empty() ? "" : "; " + hint) +
              " (EXMY_MEMORY_CHECK=off skips this check)");
}

}  // namespace exmy::sim

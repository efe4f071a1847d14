// Pieces the long-running `exmy` subcommands share: the stop flag raised by
// SIGINT/SIGTERM, and files found in the checkout or the source tree.
#pragma once

#include <atomic>
#include <csignal>
#include <filesystem>
#include <string>

#ifndef EXMY_SOURCE_DIR
#define EXMY_SOURCE_DIR "."
#endif

namespace exmy::cli {

// The first SIGINT/SIGTERM stores its number here; the command finishes what
// it is doing, saves and returns 128 + the number. A second signal of
// either kind ends the process the default way.
inline std::atomic<int> g_stop_signal{0};

extern "C" inline void exmy_on_stop_signal(int sig) {
  g_stop_signal.store(sig);
  std::signal(SIGINT, SIG_DFL);
  std::signal(SIGTERM, SIG_DFL);
}

inline const std::atomic<int>& install_stop_signals() {
  std::signal(SIGINT, exmy_on_stop_signal);
  std::signal(SIGTERM, exmy_on_stop_signal);
  return g_stop_signal;
}

// `rel` (a path inside the repository) from the working directory when it
// exists there (the README runs exmy from the repository root), else from
// the source tree this binary was built from; empty when neither has it.
inline std::string find_in_checkout(const std::string& rel) {
  std::error_code ec;
  if (std::filesystem::exists(rel, ec)) return rel;
  const std::string abs = std::string(EXMY_SOURCE_DIR) + "/" + rel;
  if (std::filesystem::exists(abs, ec)) return abs;
  return {};
}

}  // namespace exmy::cli

// Pieces the `exmy` subcommands share: parsing with --help, the stop flag
// raised by SIGINT/SIGTERM, and files found in the checkout or the source
// tree.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <boost/program_options.hpp>
#include <csignal>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "sim/device/device.hpp"

#ifndef EXMY_SOURCE_DIR
#define EXMY_SOURCE_DIR "."
#endif

namespace exmy::cli {

// Parses a subcommand's arguments into vm; with --help prints the options
// and returns true (the command then exits 0).
inline bool parse_or_help(const std::vector<std::string>& args, const boost::program_options::options_description& desc,
                          const boost::program_options::positional_options_description& pos,
                          boost::program_options::variables_map& vm) {
  namespace po = boost::program_options;
  po::store(po::command_line_parser(args).options(desc).positional(pos).run(), vm);
  po::notify(vm);
  if (!vm.count("help")) return false;
  std::cout << desc << "\n";
  return true;
}

// The first SIGINT/SIGTERM/SIGPIPE stores its number here; the command
// finishes what it is doing, saves and returns 128 + the number. A second
// SIGINT or SIGTERM ends the process the default way. SIGPIPE (the reader
// of `exmy train | head` went away) is ignored from then on: the output
// that is left goes nowhere (writes fail with EPIPE), the checkpoint and
// the run file are written as after SIGINT.
inline std::atomic<int> g_stop_signal{0};

// Set by a command whose output may stop being read when the stop arrives:
// mpirun, on Ctrl-C, sends SIGTERM to the ranks and stops draining their
// terminals until it kills them (Open MPI: odls_base_sigkill_timeout, 1 s by
// default), so rank 0 would block in a write of its progress line and never
// reach the checkpoint. With the flag, the first stop signal makes stdout and
// stderr non-blocking: a line that cannot be written then is lost, never the
// checkpoint.
inline std::atomic<bool> g_unblock_output_on_stop{false};

extern "C" inline void exmy_on_stop_signal(int sig) {
  int none = 0;
  g_stop_signal.compare_exchange_strong(none, sig);
  if (g_unblock_output_on_stop.load())
    for (const int fd : {STDOUT_FILENO, STDERR_FILENO}) {
      const int flags = ::fcntl(fd, F_GETFL);  // fcntl is async-signal-safe
      if (flags != -1) ::fcntl(fd, F_SETFL, flags | O_NONBLOCK);
    }
  std::signal(SIGPIPE, SIG_IGN);
  if (sig != SIGPIPE) {
    std::signal(SIGINT, SIG_DFL);
    std::signal(SIGTERM, SIG_DFL);
  }
}

inline const std::atomic<int>& install_stop_signals() {
  std::signal(SIGINT, exmy_on_stop_signal);
  std::signal(SIGTERM, exmy_on_stop_signal);
  std::signal(SIGPIPE, exmy_on_stop_signal);
  return g_stop_signal;
}

// The --device option of the training commands (train, eval, bench train),
// checked before any work: its canonical value ("cpu"), empty when absent.
// A device that is not there fails with one line (sim/device/device.hpp);
// so does any device for a command that runs only on the CPU so far
// (`runs_on_devices` false: eval, bench train).
inline const char* const kTrainingDeviceHelp =
    "cpu, cuda, cuda:N or cuda-emulated (sets train.device; cuda-emulated runs the device's code on the host, "
    "for checks)";

inline std::string training_device_option(const boost::program_options::variables_map& vm, const char* command,
                                          bool runs_on_devices) {
  if (!vm.count("device")) return {};
  const sim::Device d = sim::parse_device(vm["device"].as<std::string>(), "--device");
  sim::require_training_device(d, "--device");
  if (!runs_on_devices && !d.is_cpu())
    throw Error("--device " + sim::device_name(d) + ": exmy " + command +
                " runs on the CPU only so far (exmy train runs on a device)");
  return sim::device_name(d);
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

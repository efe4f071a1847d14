// `exmy sweep`: expand a sweep file into named runs, run them as `exmy
// train` child processes, and summarize them (sim/sweep/, docs/sweeps.md).
//
//   exmy sweep FILE --list [--out DIR]           the runs (and their status)
//   exmy sweep FILE --out DIR [--jobs N]         run every run not done yet, then summarize
//   exmy sweep FILE --out DIR --devices 0,1,2,3  the same, one run per device at a time
//   exmy sweep FILE --out DIR --run I            run only run I (a Slurm array task)
//   exmy sweep FILE --out DIR --summarize        only the summary and plots
//
// SIGINT/SIGTERM: no new run starts; each running run gets one SIGINT,
// writes a checkpoint and ends; the same command later resumes them. A
// second signal ends the sweep at once (its children finish their step,
// checkpoint and exit on their own).
#include <boost/program_options.hpp>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <sstream>
#include <string>

#include "formats/error.hpp"
#include "sim/cli/cli_support.hpp"
#include "sim/parallel.hpp"
#include "sim/cli/commands.hpp"
#include "sim/device/device.hpp"
#include "sim/sweep/device_pool.hpp"
#include "sim/sweep/runner.hpp"
#include "sim/sweep/summary.hpp"
#include "sim/sweep/sweep.hpp"

namespace po = boost::program_options;
namespace fs = std::filesystem;

namespace exmy::cli {
namespace {

std::string self_exe() {
  std::error_code ec;
  const auto p = fs::read_symlink("/proc/self/exe", ec);
  if (ec) throw Error("cannot find the exmy binary (/proc/self/exe): " + ec.message());
  return p.string();
}

// analysis/sweep_plots.py in the working directory's checkout, else in the
// source tree this binary was built from.
std::string plot_script() {
  const std::string rel = "analysis/sweep_plots.py";
  const std::string path = find_in_checkout(rel);
  return path.empty() ? std::string(EXMY_SOURCE_DIR) + "/" + rel : path;
}

po::options_description sweep_options() {
  po::options_description desc(
      "exmy sweep: run a grid of training runs and summarize them (docs/sweeps.md)\n\n"
      "usage: exmy sweep FILE --out DIR [--jobs N] [--devices LIST] [--run I] [--set key=value ...]\n"
      "       exmy sweep FILE --list [--out DIR]\n"
      "       exmy sweep FILE --out DIR --summarize\n\n"
      "Each run is `exmy train` in DIR/<run>; a rerun skips finished runs, resumes interrupted ones from\n"
      "their checkpoints and retries failed ones. Slurm array: #SBATCH --array=0-<runs-1>, then\n"
      "exmy sweep FILE --out DIR --run $SLURM_ARRAY_TASK_ID. GPUs: --devices 0,1,2,3 runs one run per device\n"
      "at a time, each with --set train.device=cuda:N\n\noptions");
  // clang-format off
  desc.add_options()
    ("help,h", "show this help")
    ("file", po::value<std::string>(), "the sweep file (INI; experiments/sweeps/)")
    ("out", po::value<std::string>(), "sweep directory (index, runs, summary)")
    ("list", "print the runs (with their status when --out holds the sweep) and exit")
    ("run", po::value<int64_t>(), "run only the run with this index")
    ("jobs,j", po::value<int>()->default_value(1), "runs at the same time (child processes; with --devices: by default one per device, at most that)")
    ("devices", po::value<std::string>(),
        "place the runs on these devices, one run per device at a time: CUDA indices 0,1,2,3 (cuda:N), cuda:N, "
        "cuda or cuda-emulated (which may be listed more than once); each run gets --set train.device=DEVICE")
    ("threads", po::value<int>()->default_value(0), "train.threads of each run (0: cores / jobs)")
    ("launch", po::value<std::string>(),
        "start each run under this launcher, e.g. \"mpirun -np 4\" (data-parallel ranks; give --threads per rank)")
    ("set", po::value<std::vector<std::string>>()->composing(),
        "key=value for every run, after the file's [set] (repeatable; changes the runs' identity)")
    ("summarize", "only write the summary and plots of what DIR holds")
    ("no-summary", "do not summarize after running")
    ("no-plots", "summarize without running the plot script");
  // clang-format on
  return desc;
}

// --set key=value: fixed for every run, after the file's [set]; an axis
// cannot be set.
void add_sets(sweep::SweepSpec& spec, const std::vector<std::string>& sets) {
  for (const auto& a : sets) {
    const size_t eq = a.find('=');
    if (eq == std::string::npos || eq == 0) throw Error("bad --set '" + a + "' (expected section.key=value)");
    const std::string key = sweep::canonical_key(a.substr(0, eq));
    for (const auto& k : spec.axis_keys())
      if (k == key) throw Error("--set " + key + ": '" + key + "' is an axis of the sweep");
    spec.fixed.emplace_back(key, a.substr(eq + 1));
  }
}

// --list: the runs, with their status when `out` holds the sweep.
void list_runs(const sweep::SweepSpec& spec, const std::vector<sweep::RunSpec>& runs, const std::string& out) {
  const bool status = !out.empty() && fs::exists(fs::path(out) / "index.json");
  const int w = static_cast<int>(std::to_string(runs.size()).size());
  std::printf("sweep %s: %zu runs (base %s)\n", spec.name.c_str(), runs.size(), spec.base.c_str());
  for (const auto& r : runs) {
    std::string st;
    if (status) {
      const auto s = sweep::run_state(out, r);
      st = std::string(sweep::status_name(s.status));
      if (s.status == sweep::RunStatus::interrupted) st += " at step " + std::to_string(s.checkpoint);
      if (!s.message.empty()) st += ": " + s.message;
    }
    std::printf("%*lld  %s%s%s\n", w, static_cast<long long>(r.index), r.name.c_str(), st.empty() ? "" : "  ",
                st.c_str());
  }
}

void summarize(const sweep::SweepSpec& spec, const std::vector<sweep::RunSpec>& runs, const std::string& out,
               const sweep::SummaryOptions& sopt) {
  sweep::write_summary(spec, runs, out, sopt);
  std::printf("summary: %s/summary.md, %s/summary.csv\n", out.c_str(), out.c_str());
}

// --devices: the list, each CUDA device checked against this machine.
std::vector<sim::Device> devices_option(const po::variables_map& vm) {
  if (!vm.count("devices")) return {};
  std::vector<sim::Device> devices = sweep::parse_device_list(vm["devices"].as<std::string>());
  if (std::any_of(devices.begin(), devices.end(), [](const sim::Device& d) { return d.is_cuda(); })) {
    const sim::DeviceInventory inv = sim::device_inventory();
    for (const auto& d : devices) {
      const std::string problem = sim::device_problem(d, inv, "--devices");
      if (!problem.empty()) throw Error(problem);
    }
  }
  return devices;
}

// --jobs, --devices, --threads, --run, --launch.
sweep::RunnerOptions runner_options(const po::variables_map& vm) {
  sweep::RunnerOptions ropt;
  ropt.exmy = self_exe();
  ropt.jobs = vm["jobs"].as<int>();
  ropt.devices = devices_option(vm);
  if (!ropt.devices.empty() && vm["jobs"].defaulted()) ropt.jobs = static_cast<int>(ropt.devices.size());
  ropt.threads = sim::checked_threads(vm["threads"].as<int>(), "--threads");
  if (ropt.jobs < 1) throw Error("--jobs must be at least 1");
  if (ropt.threads < 0) throw Error("--threads must be 0 (cores / jobs) or more");
  if (vm.count("run")) ropt.only = vm["run"].as<int64_t>();
  if (vm.count("launch")) {
    std::istringstream words(vm["launch"].as<std::string>());
    for (std::string w; words >> w;) ropt.launch.push_back(w);
    if (ropt.launch.empty()) throw Error("--launch needs a launcher command, e.g. --launch \"mpirun -np 4\"");
  }
  return ropt;
}

}  // namespace

int cmd_sweep(const Args& args) {
  po::options_description desc = sweep_options();
  po::positional_options_description pos;
  pos.add("file", 1);
  po::variables_map vm;
  if (parse_or_help(args, desc, pos, vm)) return 0;
  if (!vm.count("file")) throw Error("missing the sweep file (usage: exmy sweep FILE --out DIR; see --help)");
  sweep::SweepSpec spec = sweep::load_sweep(vm["file"].as<std::string>());
  if (vm.count("set")) add_sets(spec, vm["set"].as<std::vector<std::string>>());
  const auto runs = sweep::expand(spec);
  const std::string out = vm.count("out") ? vm["out"].as<std::string>() : "";

  if (vm.count("list")) {
    list_runs(spec, runs, out);
    return 0;
  }
  if (out.empty()) throw Error("--out DIR is required (or --list)");

  sweep::SummaryOptions sopt;
  if (!vm.count("no-plots")) sopt.plot_script = plot_script();

  if (vm.count("summarize")) {
    if (!fs::exists(fs::path(out) / "index.json")) throw Error("'" + out + "' holds no sweep (no index.json)");
    summarize(spec, runs, out, sopt);
    return 0;
  }

  if (!fs::exists(spec.base))
    throw Error(spec.path + ": base configuration '" + spec.base +
                "' not found (paths in a sweep file are relative to the working directory)");
  sweep::RunnerOptions ropt = runner_options(vm);
  ropt.stop = &install_stop_signals();
  const sweep::SweepOutcome o = sweep::run_sweep(spec, runs, out, ropt);
  std::signal(SIGINT, SIG_DFL);
  std::signal(SIGTERM, SIG_DFL);

  // Summarize once no run of the whole sweep is left to do.
  int64_t unfinished = 0;
  for (const auto& r : runs) {
    const auto s = sweep::run_state(out, r).status;
    if (s != sweep::RunStatus::done && s != sweep::RunStatus::diverged && s != sweep::RunStatus::failed) ++unfinished;
  }
  if (unfinished == 0 && !vm.count("no-summary")) {
    summarize(spec, runs, out, sopt);
  } else if (unfinished > 0) {
    std::printf("%lld of %zu runs not finished yet; the summary is written when all are (or with --summarize)\n",
                static_cast<long long>(unfinished), runs.size());
  }
  std::fflush(stdout);  // the progress before the one-line error on stderr
  if (o.stopped) return 128 + g_stop_signal.load();
  if (o.failed > 0)
    throw Error(std::to_string(o.failed) + " of " + std::to_string(o.selected) +
                " runs failed (their errors: DIR/<run>/FAILED, exmy sweep " + vm["file"].as<std::string>() +
                " --list --out " + out + ")");
  if (o.interrupted > 0)
    throw Error(std::to_string(o.interrupted) + " runs were interrupted; run the same command again to resume them");
  return 0;
}

}  // namespace exmy::cli

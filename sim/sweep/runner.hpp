// Running the runs of a sweep: one `exmy train` child process per run, up
// to `jobs` at a time (docs/sweeps.md).
//
// The sweep directory holds
//   index.csv, index.json     every run: index, name, directory, axis values (rewritten each time)
//   sweep.ini                 the sweep file as read
//   <run>/                    the run directory of `exmy train` (config.ini, run.h5, checkpoints/)
//   <run>/sweep-run.json      what the run is: sweep, index, name, axis values, train arguments
//   <run>/train.log           the child's stdout and stderr, appended by every session
//   <run>/DONE                the run completed and its run.h5 carries the sweep attributes
//   <run>/DIVERGED            the trainer stopped it on a non-finite loss or gradient (one line)
//   <run>/FAILED              it failed: the one-line error
//   <run>/.lock               flock()ed while a process works on the run
//
// A run is done (DONE), diverged (DIVERGED: a result, not retried), failed
// (FAILED: retried by the next session), running (its lock is held by
// another process), interrupted (checkpoints, no marker: resumed with
// `exmy train --resume`) or pending (started from scratch, replacing any
// partial run without a checkpoint).
//
// Why markers instead of asking the run file: the sweep attributes are
// written into run.h5 after the child exits (exmy train replaces run.h5
// when it starts a run, and copies root attributes forward when it
// resumes one), so DONE means "trained, and labelled".
#pragma once

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sim/device/device.hpp"
#include "sim/sweep/sweep.hpp"

namespace exmy::sweep {

enum class RunStatus { pending, interrupted, running, done, diverged, failed };
std::string_view status_name(RunStatus s);

struct RunState {
  RunStatus status = RunStatus::pending;
  std::string message;       // DIVERGED / FAILED text
  int64_t checkpoint = -1;   // newest checkpoint's step (interrupted)
};

std::string run_dir(const std::string& out, const RunSpec& r);
RunState run_state(const std::string& out, const RunSpec& r);

struct RunnerOptions {
  std::string exmy;                      // the exmy binary the children run
  // A launcher each run starts under (`--launch "mpirun -np 4"`: a
  // data-parallel run of 4 ranks, docs/training.md), split at spaces and
  // put before the exmy binary; looked up in PATH. Empty: exmy itself.
  std::vector<std::string> launch;
  int jobs = 1;                          // concurrent runs
  // --devices: each run started gets a free one of these (DevicePool,
  // sim/sweep/device_pool.hpp) as `--set train.device=NAME`, and no two runs
  // hold the same one at once; jobs may not exceed their number. Empty: no
  // placement (the runs train where their configuration says).
  std::vector<sim::Device> devices;
  int threads = 0;                       // train.threads of each run; 0: max(1, cores / jobs)
  std::optional<int64_t> only;           // run only this index
  const std::atomic<int>* stop = nullptr;  // non-zero: interrupt the children and return
  std::FILE* out = stdout;               // progress lines (nullptr: silent)
};

struct SweepOutcome {
  int64_t selected = 0;  // runs this session looked at
  int64_t done = 0, diverged = 0, failed = 0, interrupted = 0, running_elsewhere = 0;
  int64_t ran = 0;       // children started
  bool stopped = false;  // the stop flag was raised
};

// Writes the index files, checks that every existing run directory of the
// selected runs belongs to this sweep with the same arguments (throws
// exmy::Error naming the first that does not), and runs every selected run
// that is not done or diverged. With devices, a sweep that sets
// train.device itself ([set], --set or an axis) is refused in one line
// before anything is written (the base file's train.device is replaced, as
// the sweep's settings replace any base value).
SweepOutcome run_sweep(const SweepSpec& spec, const std::vector<RunSpec>& runs, const std::string& out,
                       const RunnerOptions& opt);

// index.csv, index.json and sweep.ini in `out` (created if needed).
void write_index(const SweepSpec& spec, const std::vector<RunSpec>& runs, const std::string& out);

// Root attributes of a finished run file: sweep_name, sweep_file,
// sweep_run, sweep_index, sweep_axes (the axis keys, comma-separated) and
// sweep_axis.<key> (each axis value, as text).
void write_run_attributes(const std::string& run_h5, const SweepSpec& spec, const RunSpec& r);

// CPUs this process may run on (sched_getaffinity: respects taskset and
// Slurm's allocation).
int available_cores();

// train.threads for each run: `requested`, else max(1, cores / jobs).
int threads_per_run(int requested, int jobs);

}  // namespace exmy::sweep

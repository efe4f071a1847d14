#include "sim/sweep/runner.hpp"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "formats/error.hpp"
#include "sim/io/atomic_file.hpp"
#include "sim/io/h5.hpp"
#include "sim/io/run_file.hpp"
#include "sim/sweep/device_pool.hpp"
#include "sim/train/checkpoint.hpp"
#include "sim/train/loss_window.hpp"

extern char** environ;

namespace exmy::sweep {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

using io::write_text_atomic;

std::string first_line(std::string s) {
  const size_t nl = s.find('\n');
  if (nl != std::string::npos) s.resize(nl);
  while (!s.empty() && (s.back() == '\r' || s.back() == ' ')) s.pop_back();
  return s;
}

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

std::string duration(double s) {
  char buf[32];
  const long t = std::lround(s);
  if (t >= 3600) std::snprintf(buf, sizeof buf, "%ldh%02ldm%02lds", t / 3600, t / 60 % 60, t % 60);
  else if (t >= 60) std::snprintf(buf, sizeof buf, "%ldm%02lds", t / 60, t % 60);
  else std::snprintf(buf, sizeof buf, "%.1fs", s);
  return buf;
}

nlohmann::ordered_json run_json(const SweepSpec& spec, const RunSpec& r) {
  nlohmann::ordered_json j;
  j["sweep"] = spec.name;
  j["index"] = r.index;
  j["name"] = r.name;
  nlohmann::ordered_json v = nlohmann::ordered_json::object();
  for (const auto& [k, x] : r.values) v[k] = x;
  j["values"] = v;
  j["args"] = r.args;
  return j;
}

// Whether some process holds the run's lock (without taking it).
bool lock_held(const fs::path& dir) {
  const int fd = ::open((dir / ".lock").c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool held = ::flock(fd, LOCK_SH | LOCK_NB) != 0;
  ::close(fd);
  return held;
}

// True when the process still has a handler for both SIGINT and SIGTERM
// (exmy train resets them to the default after the first signal, so a
// child that already got one from elsewhere - a terminal, scancel - is not
// signalled twice, which would kill it before its checkpoint).
bool still_catches_stop_signals(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (!line.starts_with("SigCgt:")) continue;
    const uint64_t mask = std::stoull(line.substr(7), nullptr, 16);
    return (mask >> (SIGINT - 1) & 1) && (mask >> (SIGTERM - 1) & 1);
  }
  return false;
}

// The one-line error of a child from its log (what it wrote since `from`).
std::string error_from_log(const fs::path& log, std::streamoff from, int status_code) {
  std::ifstream in(log, std::ios::binary);
  in.seekg(from);
  std::string line, err, last;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.starts_with("exmy") && line.find("error: ") != std::string::npos) err = line;
    if (!line.empty()) last = line;
  }
  if (!err.empty()) {
    const size_t p = err.find("error: ");
    return err.substr(p + 7);
  }
  if (!last.empty()) return "exit status " + std::to_string(status_code) + ": " + last;
  return "exit status " + std::to_string(status_code);
}

struct Child {
  const RunSpec* run = nullptr;
  pid_t pid = -1;
  int lock_fd = -1;
  fs::path dir, log;
  std::streamoff log_from = 0;
  Clock::time_point start;
  bool signalled = false;
  int64_t number = 0;  // 1-based position in this session's list, for progress lines
  std::optional<size_t> slot;  // the device it holds in the session's DevicePool
};

class Session {
 public:
  Session(const SweepSpec& spec, const std::string& out, const RunnerOptions& opt, int64_t total)
      : spec_(spec), out_(out), opt_(opt), total_(total) {
    threads_ = threads_per_run(opt.threads, opt.jobs);
    for (const auto& [k, v] : spec.fixed) explicit_threads_ = explicit_threads_ || k == "train.threads";
    for (const auto& k : spec.axis_keys()) explicit_threads_ = explicit_threads_ || k == "train.threads";
  }

  int threads() const { return explicit_threads_ ? 0 : threads_; }

  void say(const char* fmt, auto... args) {
    if (!opt_.out) return;
    if constexpr (sizeof...(args) == 0) std::fputs(fmt, opt_.out);
    else std::fprintf(opt_.out, fmt, args...);
    std::fflush(opt_.out);
  }

  // Starts run r (on `device` unless null); false when another process
  // holds its lock.
  bool start(const RunSpec& r, const RunState& st, int64_t number, const sim::Device* device, Child& c) {
    c.run = &r;
    c.number = number;
    c.dir = run_dir(out_, r);
    fs::create_directories(c.dir);
    c.lock_fd = ::open((c.dir / ".lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (c.lock_fd < 0) throw Error("cannot create '" + (c.dir / ".lock").string() + "'");
    if (::flock(c.lock_fd, LOCK_EX | LOCK_NB) != 0) {
      ::close(c.lock_fd);
      c.lock_fd = -1;
      return false;
    }
    std::error_code ec;
    fs::remove(c.dir / "FAILED", ec);
    write_text_atomic(c.dir / "sweep-run.json", run_json(spec_, r).dump(2) + "\n");

    // Resume from a checkpoint when there is one (interrupted, or a failed
    // run killed after a checkpoint), else start afresh.
    const auto ckpts = fs::exists(c.dir / "checkpoints") ? train::list_checkpoints((c.dir / "checkpoints").string())
                                                          : std::vector<std::string>{};
    std::vector<std::string> argv = opt_.launch;
    argv.insert(argv.end(), {opt_.exmy, "train"});
    std::string what;
    if (!ckpts.empty()) {
      argv.insert(argv.end(), {"--resume", c.dir.string()});
      what = "resuming from " + fs::path(ckpts.back()).filename().string();
    } else {
      argv.insert(argv.end(), r.args.begin(), r.args.end());
      argv.insert(argv.end(), {"--out", c.dir.string(), "--force"});
      what = st.status == RunStatus::failed ? "retrying" : "starting";
    }
    if (threads() > 0) argv.insert(argv.end(), {"--set", "train.threads=" + std::to_string(threads())});
    // The device is where this session runs it, not part of the run's
    // identity (its arguments in sweep-run.json): a resumed run may land on
    // another device (train.device may change on --resume).
    if (device) {
      argv.insert(argv.end(), {"--set", "train.device=" + sim::device_name(*device)});
      what += " on " + sim::device_name(*device);
    }

    c.log = c.dir / "train.log";
    const int log_fd = ::open(c.log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (log_fd < 0) throw Error("cannot write '" + c.log.string() + "'");
    c.log_from = static_cast<std::streamoff>(::lseek(log_fd, 0, SEEK_END));
    std::string header = "=== exmy sweep " + spec_.name + ": run " + std::to_string(r.index) + " (" + what + "):";
    for (const auto& a : argv) header += " " + a;
    header += "\n";
    if (::write(log_fd, header.data(), header.size()) < 0) { /* the log is best effort */ }

    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&fa, log_fd, 1);
    posix_spawn_file_actions_adddup2(&fa, log_fd, 2);
    // The child holds the run's lock too (fd 3), so the lock outlives a
    // killed sweep for as long as the training runs.
    posix_spawn_file_actions_adddup2(&fa, c.lock_fd, 3);
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    // Its own process group: a terminal's Ctrl-C reaches only the sweep,
    // which passes exactly one signal on to each child.
    posix_spawnattr_setpgroup(&attr, 0);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
    std::vector<char*> cargv;
    for (auto& a : argv) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    const int rc = opt_.launch.empty() ? ::posix_spawn(&c.pid, argv[0].c_str(), &fa, &attr, cargv.data(), environ)
                                       : ::posix_spawnp(&c.pid, argv[0].c_str(), &fa, &attr, cargv.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&attr);
    ::close(log_fd);
    if (rc != 0) {
      ::close(c.lock_fd);
      throw Error("cannot start '" + argv[0] + "': " + std::strerror(rc));
    }
    c.start = Clock::now();
    say("[%*lld/%lld] %s: %s (log %s)\n", width(), static_cast<long long>(number), static_cast<long long>(total_),
        r.name.c_str(), what.c_str(), c.log.string().c_str());
    return true;
  }

  // Records the outcome of a child that exited with wait status `ws`.
  RunStatus finish(Child& c, int ws, SweepOutcome& o) {
    const RunSpec& r = *c.run;
    const double secs = std::chrono::duration<double>(Clock::now() - c.start).count();
    const fs::path h5 = c.dir / "run.h5";
    const int code = WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);
    auto label = [&]() -> std::string {
      try {
        write_run_attributes(h5.string(), spec_, r);
        return "";
      } catch (const Error& e) {
        return e.what();
      }
    };
    RunStatus status;
    std::string line;
    if (code == 0) {
      const std::string err = label();
      if (err.empty()) {
        write_text_atomic(c.dir / "DONE", "done in " + duration(secs) + "\n");
        status = RunStatus::done;
        line = "done in " + duration(secs) + final_losses(h5);
      } else {
        write_text_atomic(c.dir / "FAILED", "trained, but the sweep attributes could not be written: " + err + "\n");
        status = RunStatus::failed;
        line = "FAILED: " + err;
      }
    } else if (code == 128 + SIGINT || code == 128 + SIGTERM || code == 128 + SIGHUP ||
               (WIFSIGNALED(ws) && c.signalled)) {
      if (fs::exists(h5)) label();  // resume copies root attributes forward
      status = RunStatus::interrupted;
      line = "interrupted after " + duration(secs) + " (the next session resumes it)";
    } else {
      const std::string msg = WIFSIGNALED(ws) ? "killed by signal " + std::to_string(WTERMSIG(ws))
                                              : error_from_log(c.log, c.log_from, code);
      // The trainer's stop on a non-finite loss or gradient: a result.
      if (WIFEXITED(ws) && code == 1 && msg.find("stopped before the update") != std::string::npos) {
        label();
        write_text_atomic(c.dir / "DIVERGED", msg + "\n");
        status = RunStatus::diverged;
        line = "diverged: " + msg;
      } else {
        write_text_atomic(c.dir / "FAILED", msg + "\n");
        status = RunStatus::failed;
        line = "FAILED: " + msg;
      }
    }
    ::close(c.lock_fd);
    c.lock_fd = -1;
    switch (status) {
      case RunStatus::done: ++o.done; break;
      case RunStatus::diverged: ++o.diverged; break;
      case RunStatus::failed: ++o.failed; break;
      default: ++o.interrupted; break;
    }
    say("[%*lld/%lld] %s: %s\n", width(), static_cast<long long>(c.number), static_cast<long long>(total_),
        r.name.c_str(), line.c_str());
    return status;
  }

 private:
  int width() const { return static_cast<int>(std::to_string(total_).size()); }

  static std::string final_losses(const fs::path& h5) {
    try {
      const auto loss = io::read_run_column(h5.string(), "/step_loss/loss");
      const auto val = io::read_run_column(h5.string(), "/eval/loss");
      char buf[160];
      std::snprintf(buf, sizeof buf, ": %s %.4f, val loss %.4f",
                    train::final_window_label(static_cast<int64_t>(loss.size())).c_str(), train::final_window_loss(loss),
                    val.empty() ? NAN : val.back());
      return buf;
    } catch (const Error&) {
      return "";
    }
  }

  const SweepSpec& spec_;
  std::string out_;
  const RunnerOptions& opt_;
  int64_t total_;
  int threads_ = 1;
  bool explicit_threads_ = false;
};

}  // namespace

std::string_view status_name(RunStatus s) {
  switch (s) {
    case RunStatus::pending: return "pending";
    case RunStatus::interrupted: return "interrupted";
    case RunStatus::running: return "running";
    case RunStatus::done: return "done";
    case RunStatus::diverged: return "diverged";
    case RunStatus::failed: return "failed";
  }
  return "?";
}

std::string run_dir(const std::string& out, const RunSpec& r) { return (fs::path(out) / r.name).string(); }

RunState run_state(const std::string& out, const RunSpec& r) {
  const fs::path dir = run_dir(out, r);
  RunState s;
  std::error_code ec;
  if (fs::exists(dir / "DONE", ec)) {
    s.status = RunStatus::done;
  } else if (fs::exists(dir / "DIVERGED", ec)) {
    s.status = RunStatus::diverged;
    s.message = first_line(read_text(dir / "DIVERGED"));
  } else if (lock_held(dir)) {
    s.status = RunStatus::running;
  } else if (fs::exists(dir / "FAILED", ec)) {
    s.status = RunStatus::failed;
    s.message = first_line(read_text(dir / "FAILED"));
  } else if (fs::exists(dir / "checkpoints", ec)) {
    const auto ck = train::list_checkpoints((dir / "checkpoints").string());
    if (!ck.empty()) {
      s.status = RunStatus::interrupted;
      const std::string stem = fs::path(ck.back()).stem().string();  // step_00000100
      if (stem.starts_with("step_")) s.checkpoint = std::stoll(stem.substr(5));
    }
  }
  return s;
}

int available_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

int threads_per_run(int requested, int jobs) {
  if (requested > 0) return requested;
  return std::max(1, available_cores() / std::max(1, jobs));
}

void write_index(const SweepSpec& spec, const std::vector<RunSpec>& runs, const std::string& out) {
  const fs::path dir(out);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw Error("cannot create '" + out + "': " + ec.message());
  const auto keys = spec.axis_keys();
  std::string csv = "index,name";
  for (const auto& k : keys) {
    csv += ',';
    csv += csv_field(k);
  }
  csv += ",reference\n";
  nlohmann::ordered_json j;
  j["sweep"] = spec.name;
  j["file"] = spec.path;
  j["base"] = spec.base;
  nlohmann::ordered_json fixed = nlohmann::ordered_json::object();
  for (const auto& [k, v] : spec.fixed) fixed[k] = v;
  j["set"] = fixed;
  nlohmann::ordered_json axes = nlohmann::ordered_json::array();
  for (const auto& a : spec.axes) {
    nlohmann::ordered_json ax;
    ax["name"] = a.name;
    ax["keys"] = a.keys;
    ax["values"] = a.values;
    axes.push_back(ax);
  }
  j["axes"] = axes;
  j["reference"] = nlohmann::ordered_json::object();
  for (const auto& [k, v] : spec.reference) j["reference"][k] = v;
  if (spec.diverge_above) j["diverge_above"] = *spec.diverge_above;
  j["group_over"] = spec.group_over;
  nlohmann::ordered_json list = nlohmann::ordered_json::array();
  for (const auto& r : runs) {
    csv += std::to_string(r.index) + "," + csv_field(r.name);
    for (const auto& [k, v] : r.values) {
      csv += ',';
      csv += csv_field(v);
    }
    csv += ',';
    if (r.reference) csv += std::to_string(*r.reference);
    csv += '\n';
    auto rj = run_json(spec, r);
    rj.erase("sweep");
    rj["dir"] = r.name;
    if (r.reference) rj["reference"] = *r.reference;
    list.push_back(rj);
  }
  j["runs"] = list;
  write_text_atomic(dir / "index.csv", csv);
  write_text_atomic(dir / "index.json", j.dump(2) + "\n");
  if (!spec.path.empty() && fs::exists(spec.path, ec)) write_text_atomic(dir / "sweep.ini", read_text(spec.path));
}

void write_run_attributes(const std::string& run_h5, const SweepSpec& spec, const RunSpec& r) {
  io::h5::silence_errors();
  std::error_code ec;
  if (!fs::exists(run_h5, ec)) throw Error("'" + run_h5 + "' does not exist");
  io::h5::Handle f = io::h5::open_file(run_h5, true);
  if (!f.valid()) throw Error("cannot open '" + run_h5 + "' for writing (still open, or killed while writing?)");
  io::h5::Handle root = io::h5::open_root(f.get());
  std::string keys;
  for (const auto& k : spec.axis_keys()) keys += (keys.empty() ? "" : ",") + k;
  io::h5::write_attribute(root.get(), "sweep_name", spec.name);
  io::h5::write_attribute(root.get(), "sweep_file", spec.path);
  io::h5::write_attribute(root.get(), "sweep_run", r.name);
  io::h5::write_attribute(root.get(), "sweep_index", r.index);
  io::h5::write_attribute(root.get(), "sweep_axes", keys);
  for (const auto& [k, v] : r.values) io::h5::write_attribute(root.get(), "sweep_axis." + k, v);
  if (!io::h5::flush_file(f.get())) throw Error("cannot flush '" + run_h5 + "'");
}

namespace {

// The runs this call runs: all, or --run's one.
std::vector<const RunSpec*> select_runs(const std::vector<RunSpec>& runs, const RunnerOptions& opt) {
  std::vector<const RunSpec*> selected;
  if (opt.only) {
    if (*opt.only < 0 || *opt.only >= static_cast<int64_t>(runs.size()))
      throw Error("--run " + std::to_string(*opt.only) + " is out of range (the sweep has runs 0.." +
                  std::to_string(runs.size() - 1) + ")");
    selected.push_back(&runs[static_cast<size_t>(*opt.only)]);
  } else {
    for (const auto& r : runs) selected.push_back(&r);
  }
  return selected;
}

// Every existing run directory must be this run of this sweep.
void check_run_dirs(const std::vector<const RunSpec*>& selected, const std::string& out) {
  for (const RunSpec* r : selected) {
    const fs::path dir = run_dir(out, *r);
    std::error_code ec;
    if (!fs::exists(dir, ec)) continue;
    const fs::path id = dir / "sweep-run.json";
    if (!fs::exists(id, ec)) {
      if (fs::exists(dir / "run.h5", ec) || fs::exists(dir / "checkpoints", ec))
        throw Error("'" + dir.string() + "' holds a run this sweep did not make; move it away or choose another --out");
      continue;
    }
    nlohmann::json saved;
    try {
      saved = nlohmann::json::parse(read_text(id));
    } catch (const std::exception&) {
      throw Error("'" + id.string() + "' is not valid JSON; remove the run directory to redo the run");
    }
    if (saved.value("args", nlohmann::json::array()) != nlohmann::json(r->args))
      throw Error("'" + dir.string() + "' was run with other settings (" + saved.value("args", nlohmann::json()).dump() +
                  "); choose another --out, or remove it to redo it");
  }
}

// --devices against --jobs and the sweep's own train.device.
void check_devices(const SweepSpec& spec, const RunnerOptions& opt) {
  if (opt.devices.empty()) return;
  const size_t n = opt.devices.size();
  if (static_cast<size_t>(opt.jobs) > n)
    throw Error("--jobs " + std::to_string(opt.jobs) + " is more than the " + std::to_string(n) + " device" +
                (n == 1 ? "" : "s") + " of --devices (one run per device at a time)");
  for (const auto& [k, v] : spec.fixed)
    if (k == "train.device")
      throw Error("--devices places each run on a device, but the sweep sets train.device = " + v +
                  " itself ([set] or --set); drop one of them");
  for (const auto& k : spec.axis_keys())
    if (k == "train.device")
      throw Error("--devices places each run on a device, but train.device is an axis of the sweep; drop one of them");
}

std::string device_names(const std::vector<sim::Device>& devices) {
  std::string s;
  for (const auto& d : devices) s += (s.empty() ? "" : ", ") + sim::device_name(d);
  return s;
}

}  // namespace

SweepOutcome run_sweep(const SweepSpec& spec, const std::vector<RunSpec>& runs, const std::string& out,
                       const RunnerOptions& opt) {
  if (opt.exmy.empty()) throw Error("run_sweep: no exmy binary given");
  if (opt.jobs < 1) throw Error("--jobs must be at least 1, got " + std::to_string(opt.jobs));
  check_devices(spec, opt);
  const std::vector<const RunSpec*> selected = select_runs(runs, opt);
  write_index(spec, runs, out);
  check_run_dirs(selected, out);

  SweepOutcome o;
  o.selected = static_cast<int64_t>(selected.size());
  Session session(spec, out, opt, static_cast<int64_t>(runs.size()));
  std::vector<std::pair<const RunSpec*, RunState>> todo;
  int64_t already_done = 0, already_diverged = 0;
  for (const RunSpec* r : selected) {
    RunState st = run_state(out, *r);
    switch (st.status) {
      case RunStatus::done: ++o.done; ++already_done; break;
      case RunStatus::diverged: ++o.diverged; ++already_diverged; break;
      case RunStatus::running:
        ++o.running_elsewhere;
        session.say("run %lld %s: running in another process; skipped\n", static_cast<long long>(r->index),
                    r->name.c_str());
        break;
      default: todo.emplace_back(r, st); break;
    }
  }
  const std::string placement = opt.devices.empty() ? "" : " on devices " + device_names(opt.devices) + " (one run each)";
  session.say("exmy sweep %s: %lld runs, %lld selected (%lld done, %lld diverged, %lld to run) into %s; %d worker%s%s, %s\n",
              spec.name.c_str(), static_cast<long long>(runs.size()), static_cast<long long>(selected.size()),
              static_cast<long long>(already_done), static_cast<long long>(already_diverged),
              static_cast<long long>(todo.size()), out.c_str(), opt.jobs, opt.jobs == 1 ? "" : "s", placement.c_str(),
              session.threads() > 0 ? (std::to_string(session.threads()) + " thread" +
                                       (session.threads() == 1 ? "" : "s") + " per run").c_str()
                                    : "train.threads from the sweep file");

  std::vector<Child> active;
  DevicePool pool(opt.devices);  // empty: no placement
  size_t next = 0;
  std::optional<Clock::time_point> stop_seen;
  for (;;) {
    const bool stopping = opt.stop && opt.stop->load() != 0;
    if (stopping && !stop_seen) {
      stop_seen = Clock::now();
      o.stopped = true;
      session.say("exmy sweep: stopping: the running runs write a checkpoint and end; rerun the same command to continue\n");
    }
    // Pass the stop on once, after a moment in which a signal sent to the
    // whole job (scancel) has reached the children directly.
    if (stop_seen && Clock::now() - *stop_seen > std::chrono::milliseconds(300)) {
      for (auto& c : active) {
        if (c.signalled) continue;
        if (still_catches_stop_signals(c.pid)) ::kill(c.pid, SIGINT);
        c.signalled = true;
      }
    }
    while (!stopping && static_cast<int>(active.size()) < opt.jobs && next < todo.size() &&
           (pool.empty() || pool.free_count() > 0)) {
      const auto& [r, st] = todo[next++];
      Child c;
      if (!pool.empty()) c.slot = pool.acquire();
      if (session.start(*r, st, r->index + 1, c.slot ? &pool.device(*c.slot) : nullptr, c)) {
        ++o.ran;
        active.push_back(std::move(c));
      } else {
        if (c.slot) pool.release(*c.slot);
        ++o.running_elsewhere;
        session.say("run %lld %s: running in another process; skipped\n", static_cast<long long>(r->index),
                    r->name.c_str());
      }
    }
    if (active.empty() && (stopping || next >= todo.size())) break;
    bool reaped = false;
    for (size_t i = 0; i < active.size();) {
      int ws = 0;
      const pid_t p = ::waitpid(active[i].pid, &ws, WNOHANG);
      if (p == active[i].pid) {
        session.finish(active[i], ws, o);
        if (active[i].slot) pool.release(*active[i].slot);
        active.erase(active.begin() + static_cast<std::ptrdiff_t>(i));
        reaped = true;
      } else {
        ++i;
      }
    }
    if (!reaped) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  // Runs never started because of the stop stay as they were.
  for (size_t i = next; i < todo.size(); ++i)
    if (todo[i].second.status == RunStatus::interrupted) ++o.interrupted;
  return o;
}

}  // namespace exmy::sweep

// `exmy sweep` end to end through the built binary, on proxy-tiny runs of a
// few steps: running, skipping done runs, `--run I`, resuming runs cut short
// or killed, failure isolation, the summary against figures computed here
// from the run files, and one-line errors.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "sim/device/device.hpp"
#include "sim/io/run_file.hpp"
#include "tests/cli_support.hpp"
#include "tests/train/test_support.hpp"

namespace exmy::sweep {
namespace {

namespace fs = std::filesystem;
using test::TempDir;

const std::string kExmy = EXMY_BINARY;
const std::string kSource = EXMY_SOURCE_DIR;
const std::string kTinyIni = kSource + "/experiments/proxy-tiny.ini";

using Result = test::CliResult;
inline Result run(const std::vector<std::string>& argv) { return test::run_cli(argv); }

// Starts argv in the background, its output to `log`.
pid_t spawn(const std::vector<std::string>& argv, const std::string& log) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    std::vector<char*> a;
    for (const auto& s : argv) a.push_back(const_cast<char*>(s.c_str()));
    a.push_back(nullptr);
    ::execv(a[0], a.data());
    ::_exit(127);
  }
  return pid;
}

int wait_status(pid_t pid) {
  int ws = 0;
  ::waitpid(pid, &ws, 0);
  return WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);
}

// The pid of the `exmy train` process whose arguments name `dir` (0: none).
pid_t find_trainer(const std::string& dir) {
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.empty() || !std::all_of(name.begin(), name.end(), ::isdigit)) continue;
    std::ifstream in(e.path() / "cmdline", std::ios::binary);
    std::string cmd((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::vector<std::string> args;
    size_t a = 0;
    while (a < cmd.size()) {
      const size_t z = cmd.find('\0', a);
      args.push_back(cmd.substr(a, z == std::string::npos ? std::string::npos : z - a));
      if (z == std::string::npos) break;
      a = z + 1;
    }
    if (args.size() > 1 && args[1] == "train" && std::find(args.begin(), args.end(), dir) != args.end())
      return static_cast<pid_t>(std::stol(name));
  }
  return 0;
}

// True once `sig` is pending for process `pid` (sent to the process, not yet
// delivered: the process is stopped), within `seconds`.
bool wait_for_pending(pid_t pid, int sig, double seconds) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < until) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/status");
    std::string line;
    while (std::getline(in, line))
      if (line.starts_with("ShdPnd:") && (std::stoull(line.substr(7), nullptr, 16) >> (sig - 1) & 1)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

bool wait_for_file(const fs::path& p, double seconds) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < until) {
    if (fs::exists(p)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream o(path);
  o << text;
}

// A CSV file as header -> value maps (quoted fields with commas allowed).
using test::read_csv;

double as_double(const std::string& s) { return s.empty() ? NAN : std::stod(s); }

// The run directories of a sweep directory, by index.
std::vector<fs::path> run_dirs(const std::string& out) {
  std::vector<fs::path> d;
  for (const auto& e : fs::directory_iterator(out))
    if (e.is_directory() && e.path().filename().string().size() > 3 &&
        std::isdigit(static_cast<unsigned char>(e.path().filename().string()[0])))
      d.push_back(e.path());
  std::sort(d.begin(), d.end());
  return d;
}

void expect_same_curves(const fs::path& a, const fs::path& b) {
  for (const char* d : {"/train/step", "/train/loss", "/train/grad_norm", "/eval/step", "/eval/loss"}) {
    const auto x = io::read_run_column(a.string(), d);
    const auto y = io::read_run_column(b.string(), d);
    ASSERT_FALSE(x.empty()) << a << d;
    ASSERT_EQ(x.size(), y.size()) << d;
    for (size_t i = 0; i < x.size(); ++i)
      EXPECT_EQ(std::memcmp(&x[i], &y[i], sizeof(double)), 0) << d << "[" << i << "]: " << x[i] << " vs " << y[i];
  }
}

// Small runs: 12 steps of 2 x 16 tokens, a checkpoint every 4 steps.
const std::string kSmallSet =
    "[set]\n"
    "train.steps = 12\n"
    "train.batch_size = 2\n"
    "train.seq_len = 16\n"
    "train.eval_batches = 1\n"
    "data.synthetic_tokens = 8192\n"
    "train.log_interval = 2\n"
    "train.eval_interval = 6\n"
    "train.checkpoint_interval = 4\n"
    "train.keep_checkpoints = 5\n"
    "train.stats_interval = 4\n";

// Two recipes x two seeds, run with two workers; then: a rerun skips them,
// the summary equals figures computed here, `--run 3` alone gives the same
// run file, and a run cut back to a checkpoint resumes to the same losses.
TEST(CliSweep, TinySweepSummaryRunIAndResume) {
  TempDir tmp;
  const std::string file = tmp / "tiny.ini";
  write_text(file, "[sweep]\nname = tiny\nbase = " + kTinyIni +
                       "\nreference = recipe=fp32\ngroup_over = train.seed\n" + kSmallSet +
                       "[grid]\nrecipe = fp32, ue5m3-b16\ntrain.seed = 1, 2\n");
  const std::string out = tmp / "a";
  const Result r = run({kExmy, "sweep", file, "--out", out, "--jobs", "2", "--threads", "1"});
  ASSERT_EQ(r.status, 0) << r.out;
  const auto dirs = run_dirs(out);
  ASSERT_EQ(dirs.size(), 4u);
  const std::vector<std::string> names = {"000_recipe=fp32_seed=1", "001_recipe=fp32_seed=2",
                                          "002_recipe=ue5m3-b16_seed=1", "003_recipe=ue5m3-b16_seed=2"};
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(dirs[i].filename().string(), names[i]);
    EXPECT_TRUE(fs::exists(dirs[i] / "DONE")) << dirs[i];
    // The axis values are attributes of the run file.
    const std::string h5 = (dirs[i] / "run.h5").string();
    EXPECT_EQ(io::read_run_attribute(h5, "sweep_name").value_or("?"), "tiny");
    EXPECT_EQ(io::read_run_attribute(h5, "sweep_run").value_or("?"), names[i]);
    EXPECT_EQ(io::read_run_attribute(h5, "sweep_axes").value_or("?"), "train.recipe,train.seed");
    EXPECT_EQ(io::read_run_attribute(h5, "sweep_axis.train.recipe").value_or("?"), i < 2 ? "fp32" : "ue5m3-b16");
    EXPECT_EQ(io::read_run_attribute(h5, "sweep_axis.train.seed").value_or("?"), i % 2 ? "2" : "1");
    // And the run is what its name says.
    const std::string config = io::read_run_attribute(h5, "config").value_or("");
    EXPECT_NE(config.find(i % 2 ? "seed = 2" : "seed = 1"), std::string::npos) << config;
  }

  // The summary against the run files.
  const auto rows = read_csv(fs::path(out) / "summary.csv");
  ASSERT_EQ(rows.size(), 4u);
  std::vector<double> val(4);
  for (size_t i = 0; i < 4; ++i) val[i] = io::read_run_column((dirs[i] / "run.h5").string(), "/eval/loss").back();
  for (size_t i = 0; i < 4; ++i) {
    const auto& row = rows[i];
    const std::string h5 = (dirs[i] / "run.h5").string();
    EXPECT_EQ(row.at("index"), std::to_string(i));
    EXPECT_EQ(row.at("name"), names[i]);
    EXPECT_EQ(row.at("status"), "done");
    EXPECT_EQ(row.at("train.recipe"), i < 2 ? "fp32" : "ue5m3-b16");
    EXPECT_EQ(row.at("train.seed"), i % 2 ? "2" : "1");
    EXPECT_EQ(row.at("last_step"), "12");
    ASSERT_EQ(io::read_run_column(h5, "/train/loss").size(), 7u);  // logged: steps 1, 2, 4, ..., 12
    // The final-window train loss: every step's loss, the last max(1,
    // round(12/10)) = 1 of them.
    const auto loss = io::read_run_column(h5, "/step_loss/loss");
    ASSERT_EQ(loss.size(), 12u);
    EXPECT_EQ(as_double(row.at("final_window_train_loss")), loss[11]);
    EXPECT_EQ(row.at("final_window_steps"), "1");
    EXPECT_EQ(as_double(row.at("final_val_loss")), val[i]);
    const size_t ref = i % 2;  // fp32 with the same seed
    EXPECT_EQ(row.at("reference"), std::to_string(ref));
    EXPECT_EQ(as_double(row.at("gap_val")), val[i] - val[ref]);
    EXPECT_EQ(row.at("diverged"), "");
    const auto tokens = io::read_run_column(h5, "/train/tokens");
    const auto elapsed = io::read_run_column(h5, "/train/elapsed_s");
    EXPECT_EQ(row.at("tokens"), "384");  // 12 x 2 x 16
    EXPECT_EQ(as_double(row.at("tokens_per_s")), tokens.back() / elapsed.back());
    if (i < 2) {  // fp32: no statistics
      EXPECT_EQ(row.at("underflow"), "");
      EXPECT_EQ(row.at("grad_bias"), "");
      continue;
    }
    // Worst underflow (underflow / nonzero) and block-scale underflow
    // (scale_underflow / blocks) over every quantized operand and row; grad
    // bias: mean multiplicative bias gain - 1 of the wgrad GEMMs.
    double uf = -1, suf = -1, bias_sum = 0;
    std::string uf_at;
    int64_t bias_n = 0, groups = 0;
    for (const auto& d : io::list_run_datasets(h5)) {
      if (d.starts_with("/quant/") && d.ends_with("/underflow")) {
        const std::string g = d.substr(0, d.size() - 10);
        const auto step = io::read_run_column(h5, g + "/step");
        const auto u = io::read_run_column(h5, g + "/underflow");
        const auto nz = io::read_run_column(h5, g + "/nonzero");
        const auto su = io::read_run_column(h5, g + "/scale_underflow");
        const auto bl = io::read_run_column(h5, g + "/blocks");
        ASSERT_EQ(step.size(), 4u) << g;  // steps 1, 4, 8, 12
        ++groups;
        for (size_t k = 0; k < step.size(); ++k) {
          if (u[k] / nz[k] > uf) {
            uf = u[k] / nz[k];
            uf_at = g.substr(7) + "@" + std::to_string(static_cast<int64_t>(step[k]));
          }
          suf = std::max(suf, su[k] / bl[k]);
        }
      }
      if (d.starts_with("/gemm/") && d.ends_with("/wgrad/gain")) {
        for (double g : io::read_run_column(h5, d)) {
          bias_sum += g - 1.0;
          ++bias_n;
        }
      }
    }
    ASSERT_GT(groups, 0);
    ASSERT_GT(bias_n, 0);
    EXPECT_GT(uf, 0);
    EXPECT_EQ(as_double(row.at("underflow")), uf);
    EXPECT_EQ(row.at("underflow_at"), uf_at);
    EXPECT_EQ(as_double(row.at("scale_underflow")), suf);
    EXPECT_NEAR(as_double(row.at("grad_bias")), bias_sum / static_cast<double>(bias_n), 1e-12);
  }
  const std::string md = read_text(fs::path(out) / "summary.md");
  EXPECT_NE(md.find("4 runs: 4 done, 0 diverged, 0 failed"), std::string::npos) << md;
  EXPECT_NE(md.find("| 2 | 002_recipe=ue5m3-b16_seed=1 | done | ue5m3-b16 | 1 |"), std::string::npos) << md;
  EXPECT_NE(md.find("## Over train.seed"), std::string::npos) << md;
  EXPECT_NE(md.find("| final-window train loss (last N steps) | val loss |"), std::string::npos) << md;
  const auto groups = read_csv(fs::path(out) / "summary_groups.csv");
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[1].at("train.recipe"), "ue5m3-b16");
  EXPECT_EQ(as_double(groups[1].at("val_loss_mean")), (val[2] + val[3]) / 2);
  // Plots, where Debian's python3 with h5py and matplotlib is present.
  if (run({"/usr/bin/python3", "-c", "import h5py, matplotlib"}).status == 0) {
    EXPECT_GT(fs::file_size(fs::path(out) / "plots" / "loss_curves.png"), 1000u) << r.out;
    EXPECT_TRUE(fs::exists(fs::path(out) / "plots" / "final_val_loss_by_train.recipe.png"));
    EXPECT_TRUE(fs::exists(fs::path(out) / "plots" / "gap_val_by_train.seed.png"));
  }

  // A rerun skips every done run: nothing is trained or rewritten.
  const auto log_size = fs::file_size(dirs[2] / "train.log");
  const auto h5_time = fs::last_write_time(dirs[2] / "run.h5");
  const Result again = run({kExmy, "sweep", file, "--out", out, "--jobs", "2", "--threads", "1", "--no-plots"});
  ASSERT_EQ(again.status, 0) << again.out;
  EXPECT_NE(again.out.find("(4 done, 0 diverged, 0 to run)"), std::string::npos) << again.out;
  EXPECT_EQ(again.out.find("starting"), std::string::npos) << again.out;
  EXPECT_EQ(fs::file_size(dirs[2] / "train.log"), log_size);
  EXPECT_EQ(fs::last_write_time(dirs[2] / "run.h5"), h5_time);

  // `--run 3` alone (two threads) gives the same run as the full sweep.
  const std::string only = tmp / "b";
  const Result r3 = run({kExmy, "sweep", file, "--out", only, "--run", "3", "--threads", "2"});
  ASSERT_EQ(r3.status, 0) << r3.out;
  EXPECT_NE(r3.out.find("3 of 4 runs not finished yet"), std::string::npos) << r3.out;
  EXPECT_FALSE(fs::exists(fs::path(only) / "summary.csv"));
  expect_same_curves(dirs[3] / "run.h5", fs::path(only) / names[3] / "run.h5");
  const Result list = run({kExmy, "sweep", file, "--out", only, "--list"});
  ASSERT_EQ(list.status, 0) << list.out;
  EXPECT_NE(list.out.find("0  000_recipe=fp32_seed=1  pending"), std::string::npos) << list.out;
  EXPECT_NE(list.out.find("3  003_recipe=ue5m3-b16_seed=2  done"), std::string::npos) << list.out;

  // Run 1 alone, then cut back to its checkpoint of step 4, as a kill after
  // step 5 would leave it (run.h5 keeps rows past the checkpoint): the rerun
  // resumes it from there and ends with the same losses, bit for bit.
  const fs::path cut = fs::path(only) / names[1];
  ASSERT_EQ(run({kExmy, "sweep", file, "--out", only, "--run", "1", "--threads", "1"}).status, 0);
  ASSERT_TRUE(fs::remove(cut / "DONE"));
  for (const char* ck : {"step_00000008.h5", "step_00000012.h5"}) ASSERT_TRUE(fs::remove(cut / "checkpoints" / ck));
  const Result l2 = run({kExmy, "sweep", file, "--out", only, "--list"});
  EXPECT_NE(l2.out.find("001_recipe=fp32_seed=2  interrupted at step 4"), std::string::npos) << l2.out;
  const Result resumed = run({kExmy, "sweep", file, "--out", only, "--run", "1", "--threads", "1"});
  ASSERT_EQ(resumed.status, 0) << resumed.out;
  EXPECT_NE(resumed.out.find("resuming from step_00000004.h5"), std::string::npos) << resumed.out;
  EXPECT_NE(read_text(cut / "train.log").find("resuming at step 4"), std::string::npos);
  EXPECT_TRUE(fs::exists(cut / "DONE"));
  expect_same_curves(dirs[1] / "run.h5", cut / "run.h5");
  EXPECT_EQ(io::read_run_attribute((cut / "run.h5").string(), "sweep_axis.train.seed").value_or("?"), "2");
}

// The file of the interruption tests: one run long enough to be stopped
// well before its end (400 steps; a checkpoint every 10).
std::string long_sweep(const TempDir& tmp) {
  const std::string file = tmp / "long.ini";
  write_text(file, "[sweep]\nbase = " + kTinyIni +
                       "\n[set]\ntrain.steps = 400\ntrain.batch_size = 2\ntrain.seq_len = 16\ntrain.eval_batches = 1\n"
                       "data.synthetic_tokens = 8192\ntrain.log_interval = 10\ntrain.eval_interval = 200\n"
                       "train.checkpoint_interval = 10\n[grid]\ntrain.seed = 3\n");
  return file;
}

// A run whose trainer is killed (SIGKILL) after a checkpoint is recorded as
// failed; the next session resumes it from the checkpoint, and it ends as
// an uninterrupted run does, bit for bit.
TEST(CliSweep, KilledRunResumesFromItsCheckpoint) {
  TempDir tmp;
  const std::string file = long_sweep(tmp);
  const std::string out = tmp / "k";
  const fs::path dir = fs::path(out) / "000_seed=3";
  const pid_t sweep = spawn({kExmy, "sweep", file, "--out", out, "--threads", "1", "--no-plots"}, tmp / "k.log");
  ASSERT_TRUE(wait_for_file(dir / "checkpoints" / "step_00000010.h5", 60)) << read_text(tmp / "k.log");
  const pid_t trainer = find_trainer(dir.string());
  ASSERT_GT(trainer, 0) << "no trainer found; " << read_text(tmp / "k.log");
  ASSERT_EQ(::kill(trainer, SIGKILL), 0);
  EXPECT_EQ(wait_status(sweep), 1) << read_text(tmp / "k.log");
  ASSERT_FALSE(fs::exists(dir / "DONE")) << "the run ended before the kill";
  EXPECT_EQ(read_text(dir / "FAILED"), "killed by signal 9\n");

  const Result again = run({kExmy, "sweep", file, "--out", out, "--threads", "1", "--no-plots"});
  ASSERT_EQ(again.status, 0) << again.out;
  EXPECT_NE(again.out.find("resuming from step_000000"), std::string::npos) << again.out;
  EXPECT_TRUE(fs::exists(dir / "DONE"));
  EXPECT_FALSE(fs::exists(dir / "FAILED"));

  const std::string ref = tmp / "r";
  const Result whole = run({kExmy, "sweep", file, "--out", ref, "--threads", "2", "--no-plots"});
  ASSERT_EQ(whole.status, 0) << whole.out;
  expect_same_curves(fs::path(ref) / "000_seed=3" / "run.h5", dir / "run.h5");
}

// SIGINT to the sweep: the running run checkpoints and ends, the sweep
// exits 130, the run is listed as interrupted, and the same command
// resumes it. The sweep passes the signal on after 300 ms, in which a fast
// machine trains the rest of the run (a 16-core Xeon did), so the trainer is
// held stopped from before the signal until the sweep's SIGINT is pending.
TEST(CliSweep, SigintInterruptsAndTheRerunResumes) {
  TempDir tmp;
  const std::string file = long_sweep(tmp);
  const std::string out = tmp / "i";
  const fs::path dir = fs::path(out) / "000_seed=3";
  const pid_t sweep = spawn({kExmy, "sweep", file, "--out", out, "--threads", "1", "--no-plots"}, tmp / "i.log");
  ASSERT_TRUE(wait_for_file(dir / "checkpoints" / "step_00000010.h5", 60)) << read_text(tmp / "i.log");
  const pid_t trainer = find_trainer(dir.string());
  ASSERT_GT(trainer, 0) << "no trainer found; " << read_text(tmp / "i.log");
  ASSERT_EQ(::kill(trainer, SIGSTOP), 0);
  ASSERT_EQ(::kill(sweep, SIGINT), 0);
  const bool passed_on = wait_for_pending(trainer, SIGINT, 30);
  ASSERT_EQ(::kill(trainer, SIGCONT), 0);
  ASSERT_TRUE(passed_on) << "the sweep did not pass SIGINT on; " << read_text(tmp / "i.log");
  EXPECT_EQ(wait_status(sweep), 130) << read_text(tmp / "i.log");
  ASSERT_FALSE(fs::exists(dir / "DONE")) << "the run ended before the signal";
  EXPECT_FALSE(fs::exists(dir / "FAILED"));
  EXPECT_NE(read_text(tmp / "i.log").find("interrupted after"), std::string::npos) << read_text(tmp / "i.log");
  const Result list = run({kExmy, "sweep", file, "--out", out, "--list"});
  EXPECT_NE(list.out.find("000_seed=3  interrupted at step "), std::string::npos) << list.out;

  const Result again = run({kExmy, "sweep", file, "--out", out, "--threads", "1", "--no-plots"});
  ASSERT_EQ(again.status, 0) << again.out;
  EXPECT_NE(again.out.find("resuming from step_"), std::string::npos) << again.out;
  EXPECT_TRUE(fs::exists(dir / "DONE"));
  EXPECT_EQ(io::read_run_column((dir / "run.h5").string(), "/train/step").back(), 400);
}

// A run with a bad value fails with its error recorded; the others run to
// the end; the exit status says so; the summary lists the failure.
TEST(CliSweep, FailedRunIsRecordedAndOthersComplete) {
  TempDir tmp;
  const std::string file = tmp / "f.ini";
  write_text(file, "[sweep]\nbase = " + kTinyIni + "\n" + kSmallSet + "[grid]\noptim.lr = 1e-2, fast, 3e-3\n");
  const std::string out = tmp / "f";
  const Result r = run({kExmy, "sweep", file, "--out", out, "--jobs", "2", "--threads", "1", "--no-plots"});
  EXPECT_EQ(r.status, 1) << r.out;
  const std::string last = r.out.substr(r.out.rfind("exmy: error: "));
  EXPECT_EQ(std::count(last.begin(), last.end(), '\n'), 1) << last;
  EXPECT_NE(last.find("1 of 3 runs failed"), std::string::npos) << last;
  const fs::path bad = fs::path(out) / "001_lr=fast";
  EXPECT_EQ(read_text(bad / "FAILED"), "optim.lr: bad value 'fast' (expected a finite number)\n");
  EXPECT_FALSE(fs::exists(bad / "DONE"));
  for (const char* ok : {"000_lr=1e-2", "002_lr=3e-3"}) {
    EXPECT_TRUE(fs::exists(fs::path(out) / ok / "DONE")) << ok;
    EXPECT_EQ(io::read_run_column((fs::path(out) / ok / "run.h5").string(), "/train/step").back(), 12) << ok;
  }
  const auto rows = read_csv(fs::path(out) / "summary.csv");
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[1].at("status"), "failed");
  EXPECT_EQ(rows[1].at("message"), "optim.lr: bad value 'fast' (expected a finite number)");
  EXPECT_EQ(rows[1].at("final_window_train_loss"), "");
  EXPECT_EQ(rows[2].at("status"), "done");

  // The next session retries only the failed run.
  const Result again = run({kExmy, "sweep", file, "--out", out, "--threads", "1", "--no-plots"});
  EXPECT_EQ(again.status, 1) << again.out;
  EXPECT_NE(again.out.find("(2 done, 0 diverged, 1 to run)"), std::string::npos) << again.out;
  EXPECT_NE(again.out.find("001_lr=fast: retrying"), std::string::npos) << again.out;
}

// A run the trainer stops on a NaN is a result: DIVERGED, flagged in the
// summary, exit status 0, and not retried.
TEST(CliSweep, DivergedRunIsAResultNotRetried) {
  TempDir tmp;
  const std::string file = tmp / "d.ini";
  write_text(file, "[sweep]\nbase = " + kTinyIni +
                       "\n[set]\ntrain.steps = 30\ntrain.batch_size = 2\ntrain.seq_len = 16\n"
                       "data.synthetic_tokens = 8192\noptim.grad_clip = 0\noptim.warmup_steps = 0\n"
                       "[grid]\noptim.lr = 1e-2, 1e4\n");
  const std::string out = tmp / "d";
  const Result r = run({kExmy, "sweep", file, "--out", out, "--threads", "1", "--no-plots"});
  ASSERT_EQ(r.status, 0) << r.out;
  const fs::path dir = fs::path(out) / "001_lr=1e4";
  EXPECT_NE(read_text(dir / "DIVERGED").find("stopped before the update"), std::string::npos);
  EXPECT_FALSE(fs::exists(dir / "DONE"));
  const auto rows = read_csv(fs::path(out) / "summary.csv");
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].at("diverged"), "");
  EXPECT_EQ(rows[1].at("status"), "diverged");
  EXPECT_EQ(rows[1].at("diverged"), "nonfinite");
  EXPECT_EQ(io::read_run_attribute((dir / "run.h5").string(), "sweep_axis.optim.lr").value_or("?"), "1e4");
  const Result again = run({kExmy, "sweep", file, "--out", out, "--threads", "1", "--no-plots"});
  ASSERT_EQ(again.status, 0) << again.out;
  EXPECT_NE(again.out.find("(1 done, 1 diverged, 0 to run)"), std::string::npos) << again.out;
}

// --devices cuda-emulated: two tiny runs, one after the other on the one
// (emulated) device, each trained there as its config.ini records; the
// device is not part of a run's identity, so a session without --devices
// finds them done. Bad lists and conflicts are one line, nothing written.
TEST(CliSweep, DevicesPlaceEachRunOnADevice) {
  TempDir tmp;
  const std::string file = tmp / "dev.ini";
  write_text(file, "[sweep]\nbase = " + kTinyIni +
                       "\n[set]\ntrain.steps = 2\ntrain.batch_size = 2\ntrain.seq_len = 16\ntrain.eval_batches = 1\n"
                       "data.synthetic_tokens = 8192\n[grid]\ntrain.seed = 1, 2\n");
  const std::string out = tmp / "d";
  const Result r = run({kExmy, "sweep", file, "--out", out, "--devices", "cuda-emulated", "--threads", "1", "--no-plots"});
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("1 worker on devices cuda-emulated (one run each)"), std::string::npos) << r.out;
  for (const char* name : {"000_seed=1", "001_seed=2"}) {
    const fs::path dir = fs::path(out) / name;
    EXPECT_TRUE(fs::exists(dir / "DONE")) << name;
    EXPECT_NE(r.out.find(std::string(name) + ": starting on cuda-emulated"), std::string::npos) << r.out;
    const std::string config = read_text(dir / "config.ini");
    EXPECT_NE(config.find("\ndevice = cuda-emulated\n"), std::string::npos) << name << ":\n" << config;
  }
  const Result again = run({kExmy, "sweep", file, "--out", out, "--threads", "1", "--no-plots"});
  ASSERT_EQ(again.status, 0) << again.out;
  EXPECT_NE(again.out.find("(2 done, 0 diverged, 0 to run)"), std::string::npos) << again.out;

  auto one_line = [&](const std::vector<std::string>& extra, const std::string& message) {
    std::vector<std::string> argv = {kExmy, "sweep", file, "--out", tmp / "e"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    const Result e = run(argv);
    EXPECT_EQ(e.status, 1) << e.out;
    EXPECT_EQ(e.out.rfind("exmy: error: " + message, 0), 0u) << e.out;
    EXPECT_EQ(std::count(e.out.begin(), e.out.end(), '\n'), 1) << e.out;
  };
  one_line({"--devices", "0,gpu"}, "--devices '0,gpu': 'gpu' is not a device (expected CUDA device indices N");
  one_line({"--devices", "1,1"}, "--devices '1,1': cuda:1 is listed twice");
  one_line({"--devices", ""}, "--devices is empty");
  one_line({"--devices", "cuda-emulated", "--jobs", "2"},
           "--jobs 2 is more than the 1 device of --devices (one run per device at a time)");
  one_line({"--devices", "cuda-emulated", "--set", "train.device=cpu"},
           "--devices places each run on a device, but the sweep sets train.device = cpu itself");
  // A CUDA device this machine does not have: the device check's own words.
  const sim::DeviceInventory inv = sim::device_inventory();
  const std::string missing = "cuda:" + std::to_string(inv.count);
  one_line({"--devices", std::to_string(inv.count)},
           "--devices " + missing + ": " +
               (!inv.built_with_cuda ? "exmy was built without CUDA"
                : inv.count == 0     ? "no CUDA device is visible"
                                     : "this machine has " + std::to_string(inv.count) + " CUDA device"));
  EXPECT_FALSE(fs::exists(tmp / "e"));
}

// Bad sweep files and arguments: one line naming the problem, nothing written.
TEST(CliSweep, ErrorsAreOneLine) {
  TempDir tmp;
  const std::string file = tmp / "bad.ini";
  write_text(file, "[sweep]\nbase = " + kTinyIni + "\n[grid]\ntrain.seed = 1, 1\n");
  const std::string out = tmp / "o";
  const Result r = run({kExmy, "sweep", file, "--out", out});
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.out, "exmy: error: " + file + ":4: train.seed lists '1' twice\n");
  EXPECT_FALSE(fs::exists(out));

  write_text(file, "[sweep]\nbase = " + kTinyIni + "\n[grid]\ntrain.seed = 1, 2\n");
  const Result range = run({kExmy, "sweep", file, "--out", out, "--run", "2"});
  EXPECT_EQ(range.status, 1);
  EXPECT_EQ(range.out, "exmy: error: --run 2 is out of range (the sweep has runs 0..1)\n");
  const Result axis = run({kExmy, "sweep", file, "--out", out, "--set", "train.seed=4"});
  EXPECT_EQ(axis.status, 1);
  EXPECT_NE(axis.out.find("'train.seed' is an axis of the sweep"), std::string::npos) << axis.out;
  const std::string nobase = tmp / "nobase.ini";
  write_text(nobase, "[sweep]\nbase = no/such.ini\n[grid]\ntrain.seed = 1, 2\n");
  const Result missing = run({kExmy, "sweep", nobase, "--out", out});
  EXPECT_EQ(missing.status, 1);
  EXPECT_EQ(missing.out, "exmy: error: " + nobase +
                             ": base configuration 'no/such.ini' not found (paths in a sweep file are relative to "
                             "the working directory)\n");
  const Result none = run({kExmy, "sweep", file, "--out", out, "--summarize"});
  EXPECT_EQ(none.status, 1);
  EXPECT_NE(none.out.find("holds no sweep"), std::string::npos) << none.out;

  // A directory that holds a run of other settings is refused, not overwritten.
  fs::create_directories(fs::path(out) / "000_seed=1");
  write_text(fs::path(out) / "000_seed=1" / "sweep-run.json",
             "{\"args\": [\"--config\", \"other.ini\"], \"index\": 0}\n");
  const Result other = run({kExmy, "sweep", file, "--out", out});
  EXPECT_EQ(other.status, 1);
  EXPECT_NE(other.out.find("was run with other settings"), std::string::npos) << other.out;
  EXPECT_EQ(std::count(other.out.begin(), other.out.end(), '\n'), 1) << other.out;
  EXPECT_FALSE(fs::exists(fs::path(out) / "000_seed=1" / "run.h5"));
}

}  // namespace
}  // namespace exmy::sweep

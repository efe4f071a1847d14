// `exmy train` and `exmy prepare-data` through the built binary: the run file
// read by h5py (Debian's python3-h5py), a real SIGINT, a kill -9 with a SWMR
// reader before and after, a Megatron data set made by prepare-data, and
// one-line errors for bad input.
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <fcntl.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <chrono>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "models/config.hpp"
#include "sim/device/device.hpp"
#include "sim/io/run_file.hpp"
#include "sim/quant/recipe.hpp"
#include "sim/sysmem.hpp"
#include "sim/train/checkpoint.hpp"
#include "sim/train/trainer.hpp"
#include "tests/cli_support.hpp"
#include "tests/train/test_support.hpp"

namespace exmy::train {
namespace {

namespace fs = std::filesystem;
using test::TempDir;

const std::string kExmy = EXMY_BINARY;
const std::string kTinyIni = std::string(EXMY_SOURCE_DIR) + "/experiments/proxy-tiny.ini";
const char* kPython = "/usr/bin/python3";

using Result = test::CliResult;
using test::Child;

Result run(const std::vector<std::string>& argv) { return Child(argv).finish(); }

std::vector<std::string> train_args(const std::string& out, std::vector<std::string> sets) {
  std::vector<std::string> a = {kExmy, "train", "--config", kTinyIni, "--out", out};
  for (const auto& s : sets) {
    a.push_back("--set");
    a.push_back(s);
  }
  return a;
}

bool have_h5py() {
  return fs::exists(kPython) && run({kPython, "-c", "import h5py"}).status == 0;
}

// Checks a run file the way an analysis script reads it; prints
// "<train rows> <eval rows>".
const char* kCheckScript = R"(
import sys, h5py
path, swmr = sys.argv[1], sys.argv[2] == "1"
f = h5py.File(path, "r", swmr=True) if swmr else h5py.File(path, "r")
t = f["train"]
n = t["step"].shape[0]
# A row is complete once its step is there: other datasets of the group hold
# at least as many rows (more only while a flush is under way or was cut).
for k in ("loss", "lr", "grad_norm", "tokens_per_s", "tokens", "elapsed_s"):
    assert t[k].shape[0] >= n and len(t[k].shape) == 1, k
    if not swmr: assert t[k].shape == (n,), k
assert t["loss"].dtype == "float64" and t["step"].dtype == "int64"
steps = t["step"][:]
assert all(steps[i] < steps[i + 1] for i in range(n - 1))
for a in ("schema_version", "exmy_version", "git_commit", "config", "seed", "start_time", "host"):
    assert a in f.attrs, a
assert int(f.attrs["schema_version"]) == 2
assert "[train]" in f.attrs["config"] and "[model]" in f.attrs["config"]
# the binary names the commit it was built from (at build time, not configure time)
import subprocess
try:
    head = subprocess.run(["git", "-C", sys.argv[3], "rev-parse", "--short=12", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
except FileNotFoundError:
    head = ""
commit = f.attrs["git_commit"]
commit = commit.decode() if isinstance(commit, bytes) else commit
if head: assert commit in (head, head + "-dirty"), (commit, head)
e = f["eval"]["step"].shape[0] if "eval" in f else 0
print(n, e)
)";

std::string check_run_file(const TempDir& d, const std::string& path, bool swmr) {
  const std::string script = d / "check.py";
  std::ofstream(script) << kCheckScript;
  const Result r = run({kPython, script, path, swmr ? "1" : "0", EXMY_SOURCE_DIR});
  EXPECT_EQ(r.status, 0) << r.out;
  return r.out;
}

// --help states where recipe names are looked up, in order.
TEST(CliTrain, HelpGivesTheRecipeLookupOrder) {
  const Result r = run({kExmy, "train", "--help"});
  ASSERT_EQ(r.status, 0) << r.out;
  const size_t env = r.out.find("$EXMY_RECIPE_DIR"), cwd = r.out.find("working\ndirectory's experiments/recipes"),
               src = r.out.find("then the source tree's");
  EXPECT_NE(env, std::string::npos) << r.out;
  EXPECT_NE(cwd, std::string::npos) << r.out;
  EXPECT_NE(src, std::string::npos) << r.out;
  EXPECT_LT(env, cwd);
  EXPECT_LT(cwd, src);
}

TEST(CliTrain, RunFileIsReadableByH5py) {
  if (!have_h5py()) GTEST_SKIP() << "needs /usr/bin/python3 with h5py (Debian python3-h5py)";
  TempDir d;
  const Result r = run(train_args(d / "run", {"train.steps=20", "train.log_interval=5", "train.eval_interval=10",
                                              "train.batch_size=2", "train.seq_len=16", "train.eval_batches=1"}));
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("step 20/20 | loss "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("eval step 20 | val loss"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("done: 20 steps"), std::string::npos) << r.out;
  EXPECT_EQ(check_run_file(d, d / "run/run.h5", false), "5 2\n");  // steps 1, 5, 10, 15, 20; evals 10, 20
  EXPECT_TRUE(fs::exists(d / "run/config.ini"));
  EXPECT_TRUE(fs::exists(d / "run/checkpoints/step_00000020.h5"));
}

// docs/hdf5-schema.md against a real run file: a quantized run (ue5m3-b16,
// the last block in BF16, two micro-batches) with statistics, a capture
// step and a resume, checked by tests/train/check_schema.py, which parses
// the document's tables and reads the file with h5py.
TEST(CliTrain, RunFileMatchesTheSchemaDocument) {
  if (!have_h5py()) GTEST_SKIP() << "needs /usr/bin/python3 with h5py (Debian python3-h5py)";
  TempDir d;
  std::vector<std::string> a =
      train_args(d / "run", {"train.steps=3", "train.batch_size=2", "train.seq_len=16", "train.grad_accum=2",
                             "train.eval_batches=1", "train.log_interval=2", "train.eval_interval=2",
                             "train.checkpoint_interval=3", "recipe.keep_last_bf16=1"});
  for (const char* x : {"--recipe", "ue5m3-b16", "--capture-step", "2"}) a.push_back(x);
  const Result r = run(a);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("captured 60 operands of step 2"), std::string::npos) << r.out;  // 10 of 12 linears
  const Result r2 = run({kExmy, "train", "--resume", d / "run", "--steps", "4"});
  ASSERT_EQ(r2.status, 0) << r2.out;
  const Result c = run({kPython, std::string(EXMY_SOURCE_DIR) + "/tests/train/check_schema.py",
                        std::string(EXMY_SOURCE_DIR) + "/docs/hdf5-schema.md", d / "run/run.h5",
                        "always,quantized,capture,synthetic,resumed"});
  EXPECT_EQ(c.status, 0) << c.out;
  EXPECT_EQ(c.out.rfind("ok: ", 0), 0u) << c.out;
  // Rows of every statistics step: 1, 2, 3 (the first session's last) and 4, two micro-batches each.
  EXPECT_EQ(io::read_run_column(d / "run/run.h5", "/quant/layers.0.mixer.in_proj/wgrad/wgrad-dy/step"),
            (std::vector<double>{1, 1, 2, 2, 3, 3, 4, 4}));
}

TEST(CliTrain, SigintWritesACheckpointAndTheRunResumes) {
  TempDir d;
  Child c(train_args(d / "run", {"train.steps=100000", "train.log_interval=1", "train.eval_interval=0",
                                 "train.batch_size=2", "train.seq_len=16", "train.eval_batches=1"}));
  ASSERT_TRUE(c.wait_for("| loss ", 3)) << c.output();
  c.signal(SIGINT);
  const Result r = c.finish();
  EXPECT_EQ(r.status, 128 + SIGINT) << r.out;
  EXPECT_NE(r.out.find("interrupted at step"), std::string::npos) << r.out;
  const auto ck = list_checkpoints(d / "run/checkpoints");
  ASSERT_EQ(ck.size(), 1u) << r.out;
  const int64_t step = std::stoll(fs::path(ck[0]).stem().string().substr(5));
  EXPECT_GE(step, 3);
  const Result r2 = run({kExmy, "train", "--resume", d / "run", "--steps", std::to_string(step + 3)});
  ASSERT_EQ(r2.status, 0) << r2.out;
  EXPECT_NE(r2.out.find("resuming at step " + std::to_string(step)), std::string::npos) << r2.out;
  // The run's length changed: what happens to the schedule is said.
  EXPECT_NE(r2.out.find("the run's length changes from 100000 to " + std::to_string(step + 3) +
                        " steps: the cosine LR schedule is recomputed over " + std::to_string(step + 3) + " steps"),
            std::string::npos)
      << r2.out;
  EXPECT_TRUE(fs::exists(d / ("run/checkpoints/" + checkpoint_name(step + 3)))) << r2.out;
  EXPECT_EQ(io::read_run_column(d / "run/run.h5", "/train/step").back(), static_cast<double>(step + 3));
}

TEST(CliTrain, RunFileIsReadableDuringTheRunAndAfterKill9) {
  if (!have_h5py()) GTEST_SKIP() << "needs /usr/bin/python3 with h5py (Debian python3-h5py)";
  TempDir d;
  Child c(train_args(d / "run", {"train.steps=100000", "train.log_interval=1", "train.eval_interval=0",
                                 "train.batch_size=2", "train.seq_len=16", "train.eval_batches=1",
                                 "train.checkpoint_interval=3"}));
  ASSERT_TRUE(c.wait_for("| loss ", 4)) << c.output();
  const std::string during = check_run_file(d, d / "run/run.h5", true);  // SWMR read while writing
  c.signal(SIGKILL);
  const Result r = c.finish();
  EXPECT_EQ(r.status, 128 + SIGKILL);
  const std::string after = check_run_file(d, d / "run/run.h5", true);
  const int rows_during = std::atoi(during.c_str()), rows_after = std::atoi(after.c_str());
  EXPECT_GE(rows_during, 1) << during;
  EXPECT_GE(rows_after, rows_during) << after;
  // exmy's own reader sees the same rows (the loss column may hold one more,
  // written just before the kill, whose step never made it).
  EXPECT_EQ(static_cast<int>(io::read_run_column(d / "run/run.h5", "/train/step").size()), rows_after);
  EXPECT_GE(static_cast<int>(io::read_run_column(d / "run/run.h5", "/train/loss").size()), rows_after);
  // The killed run resumes from its newest checkpoint, its run file cut there.
  const auto ck = list_checkpoints(d / "run/checkpoints");
  ASSERT_FALSE(ck.empty());
  const int64_t step = std::stoll(fs::path(ck.back()).stem().string().substr(5));
  const Result r2 = run({kExmy, "train", "--resume", d / "run", "--steps", std::to_string(step + 2)});
  ASSERT_EQ(r2.status, 0) << r2.out;
  const auto steps = io::read_run_column(d / "run/run.h5", "/train/step");
  EXPECT_EQ(steps.back(), static_cast<double>(step + 2));
  EXPECT_EQ(io::read_run_column(d / "run/run.h5", "/train/loss").size(), steps.size());
  for (size_t i = 1; i < steps.size(); ++i) EXPECT_EQ(steps[i], steps[i - 1] + 1);
}

// One writer per run directory: while a run trains, a second train (with
// or without --force), a --resume and an eval of it fail at once, naming
// the PID that holds the directory; after the run stops, resume works.
TEST(CliTrain, OneWriterPerRunDirectory) {
  TempDir d;
  const std::vector<std::string> sets = {"train.steps=100000", "train.log_interval=1", "train.eval_interval=0",
                                         "train.batch_size=2", "train.seq_len=16", "train.eval_batches=1",
                                         "train.checkpoint_interval=2"};
  Child c(train_args(d / "run", sets));
  ASSERT_TRUE(c.wait_for("| loss ", 3)) << c.output();
  const std::string holder = "in use by PID " + std::to_string(c.pid()) + " (exmy train)";
  auto refused = [&](std::vector<std::string> argv) {
    const auto t0 = std::chrono::steady_clock::now();
    const Result r = run(argv);
    EXPECT_EQ(r.status, 1) << r.out;
    EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
    EXPECT_NE(r.out.find(holder), std::string::npos) << r.out;
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 20.0);
  };
  refused(train_args(d / "run", sets));
  auto forced = train_args(d / "run", sets);
  forced.push_back("--force");
  refused(forced);
  ASSERT_TRUE(c.wait_for("| loss ", 5)) << c.output();  // a checkpoint exists by now
  refused({kExmy, "train", "--resume", d / "run", "--steps", "100"});
  refused({kExmy, "eval", d / "run", "--recipe", "fp32"});
  EXPECT_TRUE(c.wait_for("| loss ", 8)) << c.output();  // the run went on
  c.signal(SIGINT);
  const Result r = c.finish();
  ASSERT_EQ(r.status, 128 + SIGINT) << r.out;
  const auto ck = list_checkpoints(d / "run/checkpoints");
  ASSERT_FALSE(ck.empty());
  const int64_t step = std::stoll(fs::path(ck.back()).stem().string().substr(5));
  const Result r2 = run({kExmy, "train", "--resume", d / "run", "--steps", std::to_string(step + 1)});
  EXPECT_EQ(r2.status, 0) << r2.out;
  const Result e = run({kExmy, "eval", d / "run", "--recipe", "fp32", "--batches", "1"});
  EXPECT_EQ(e.status, 0) << e.out;
}

// exmy makes idle OpenMP threads sleep (OMP_WAIT_POLICY=passive) unless
// the user chose a policy: the variable is in the environment the process
// runs with (libgomp reads it at load, so exmy executes itself again).
TEST(CliTrain, IdleThreadsSleepUnlessTheUserChoseOtherwise) {
  auto environ_of = [](pid_t pid) {
    std::ifstream f("/proc/" + std::to_string(pid) + "/environ", std::ios::binary);
    std::string all((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    std::vector<std::string> vars;
    for (size_t a = 0, b; a < all.size(); a = b + 1) {
      b = all.find('\0', a);
      if (b == std::string::npos) b = all.size();
      vars.push_back(all.substr(a, b - a));
    }
    return vars;
  };
  for (const std::string policy : {"", "active"}) {
    TempDir d;
    std::vector<std::string> env = {"PATH=/usr/bin:/bin", "HOME=/tmp"};
    if (!policy.empty()) env.push_back("OMP_WAIT_POLICY=" + policy);
    Child c(train_args(d / "run", {"train.steps=100000", "train.log_interval=1", "train.eval_interval=0",
                                   "train.batch_size=2", "train.seq_len=16", "train.eval_batches=1"}),
            env);
    ASSERT_TRUE(c.wait_for("| loss ", 2)) << c.output();
    const auto vars = environ_of(c.pid());
    const std::string want = "OMP_WAIT_POLICY=" + (policy.empty() ? std::string("passive") : policy);
    EXPECT_EQ(std::count(vars.begin(), vars.end(), want), 1) << policy;
    c.signal(SIGINT);
    EXPECT_EQ(c.finish().status, 128 + SIGINT);
  }
}

// Temporaries that a killed process left in a run directory are removed by
// the next resume (and by a new run with --force); one whose writer still
// runs is not. The lock file a killed run left does not block the resume.
TEST(CliTrain, LeftoverTemporariesAreRemovedByTheNextRun) {
  TempDir d;
  const std::vector<std::string> sets = {"train.steps=3", "train.batch_size=2", "train.seq_len=16",
                                         "train.eval_batches=1"};
  ASSERT_EQ(run(train_args(d / "run", sets)).status, 0);
  // PIDs above the kernel's limit (4194304) belong to no process.
  const std::vector<std::string> stale = {"run/run.h5.resume-4194999", "run/config.ini.tmp-4194998",
                                          "run/checkpoints/step_00000004.h5.tmp-4194997"};
  for (const auto& f : stale) std::ofstream(d / f) << "left by a killed exmy";
  std::ofstream(d / "run/exmy.lock") << "PID 4194999 (exmy train)\n";  // the lock file of a killed run
  const std::string live = "run/config.ini.tmp-" + std::to_string(::getpid());
  std::ofstream(d / live) << "its writer still runs";
  const Result r = run({kExmy, "train", "--resume", d / "run", "--steps", "5"});
  ASSERT_EQ(r.status, 0) << r.out;
  for (const auto& f : stale) EXPECT_FALSE(fs::exists(d / f)) << f;
  EXPECT_TRUE(fs::exists(d / live));
  for (const auto& f : stale) std::ofstream(d / f) << "left by a killed exmy";
  auto forced = train_args(d / "run", sets);
  forced.push_back("--force");
  ASSERT_EQ(run(forced).status, 0);
  for (const auto& f : stale) EXPECT_FALSE(fs::exists(d / f)) << f;
}

// `exmy train | head`: the reader goes away, and SIGPIPE stops the run as
// SIGINT does (checkpoint, a run file that opens, status 128 + 13); the run
// resumes.
TEST(CliTrain, SigpipeStopsTheRunLikeSigint) {
  TempDir d;
  std::string cmd;
  for (const auto& a : train_args(d / "run", {"train.steps=100000", "train.log_interval=1", "train.eval_interval=0",
                                              "train.batch_size=2", "train.seq_len=16", "train.eval_batches=1"}))
    cmd += "'" + a + "' ";
  const std::string script = "set -o pipefail; " + cmd + "2>" + (d / "err") + " | head -n 4 > " + (d / "head") +
                             "; echo ${PIPESTATUS[0]} > " + (d / "status");
  ASSERT_EQ(run({"/bin/bash", "-c", script}).status, 0);
  std::ifstream st(d / "status");
  int status = -1;
  st >> status;
  std::ifstream ef(d / "err");
  const std::string err((std::istreambuf_iterator<char>(ef)), std::istreambuf_iterator<char>());
  EXPECT_EQ(status, 128 + SIGPIPE) << err;
  EXPECT_TRUE(err.empty()) << err;
  const auto ck = list_checkpoints(d / "run/checkpoints");
  ASSERT_EQ(ck.size(), 1u);
  const int64_t step = std::stoll(fs::path(ck[0]).stem().string().substr(5));
  const auto steps = io::read_run_column(d / "run/run.h5", "/train/step");
  ASSERT_FALSE(steps.empty());
  EXPECT_EQ(steps.back(), static_cast<double>(step));
  const Result r2 = run({kExmy, "train", "--resume", d / "run", "--steps", std::to_string(step + 2)});
  EXPECT_EQ(r2.status, 0) << r2.out;
}

// A full disk (a small tmpfs filled while the run trains): one error line
// and exit status 1 (libhdf5 used to crash at exit: 139), no row of a step
// that was never written, and after space is freed the resumed run gives
// the same bits as a run that never stopped.
TEST(CliTrain, FullDiskIsOneErrorAndTheRunResumesBitIdentical) {
  TempDir d;
  const std::string mnt = d / "disk";
  fs::create_directories(mnt);
  if (::mount("tmpfs", mnt.c_str(), "tmpfs", 0, "size=16m") != 0)
    GTEST_SKIP() << "cannot mount a tmpfs here (needs root): " << std::strerror(errno);
  struct Unmount {
    std::string p;
    ~Unmount() { ::umount2(p.c_str(), MNT_DETACH); }
  } unmount{mnt};
  const std::vector<std::string> sets = {"train.log_interval=1", "train.eval_interval=0", "train.batch_size=2",
                                         "train.seq_len=16", "train.eval_batches=1", "train.checkpoint_interval=4",
                                         "optim.schedule=constant", "optim.warmup_steps=0"};
  auto with_steps = [&](std::vector<std::string> s, int64_t n) {
    s.push_back("train.steps=" + std::to_string(n));
    return s;
  };
  Child c(train_args(mnt + "/run", with_steps(sets, 100000)));
  ASSERT_TRUE(c.wait_for("| loss ", 6)) << c.output();
  {  // fill the disk
    std::ofstream fill(mnt + "/filler", std::ios::binary);
    const std::vector<char> block(1 << 16, 'x');
    while (fill.write(block.data(), static_cast<std::streamsize>(block.size()))) fill.flush();
  }
  const Result r = c.finish(120);
  ASSERT_EQ(r.status, 1) << r.out;
  const size_t last = r.out.rfind('\n', r.out.size() - 2);
  const std::string tail = r.out.substr(last == std::string::npos ? 0 : last + 1);
  EXPECT_EQ(tail.rfind("exmy: error: ", 0), 0u) << r.out;
  EXPECT_NE(tail.find("the disk is full"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("exmy: error: ", r.out.find("exmy: error: ") + 1), std::string::npos) << r.out;
  // exmy inspect reads the file and lists no step 0.
  const Result ins = run({kExmy, "inspect", mnt + "/run"});
  EXPECT_EQ(ins.status, 0) << ins.out;
  EXPECT_EQ(ins.out.find("step 0 "), std::string::npos) << ins.out;
  fs::remove(mnt + "/filler");
  const auto ck = list_checkpoints(mnt + "/run/checkpoints");
  ASSERT_FALSE(ck.empty()) << r.out;
  const int64_t step = std::stoll(fs::path(ck.back()).stem().string().substr(5));
  const int64_t total = step + 3;
  const Result r2 = run({kExmy, "train", "--resume", mnt + "/run", "--steps", std::to_string(total)});
  ASSERT_EQ(r2.status, 0) << r2.out;
  const Result ref = run(train_args(d / "ref", with_steps(sets, total)));
  ASSERT_EQ(ref.status, 0) << ref.out;
  const auto steps = io::read_run_column(mnt + "/run/run.h5", "/train/step");
  EXPECT_EQ(steps, io::read_run_column(d / "ref/run.h5", "/train/step"));
  const auto a = io::read_run_column(mnt + "/run/run.h5", "/train/loss");
  const auto b = io::read_run_column(d / "ref/run.h5", "/train/loss");
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(test::bits(a[i]), test::bits(b[i])) << "row " << i;
}

// The memory estimate that `exmy train` checks before allocating (and
// `exmy model-info` prints) is the peak it reaches: proxy-10m at 8 x 256
// tokens, with and without block recompute, measured as the child's maximum
// resident set, within 10% of the estimate.
TEST(CliTrain, MemoryEstimateIsThePeakWithinTenPercent) {
#if defined(__SANITIZE_ADDRESS__)  // GCC
  GTEST_SKIP() << "AddressSanitizer's shadow memory and quarantine are not exmy's";
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)  // clang
  GTEST_SKIP() << "AddressSanitizer's shadow memory and quarantine are not exmy's";
#endif
#endif
  for (const std::string recompute : {"none", "blocks"}) {
    TempDir d;
    const Result info = run({kExmy, "model-info", "--model", "proxy-10m", "--seq-len", "256", "--batch", "8",
                             "--recompute", recompute});
    ASSERT_EQ(info.status, 0) << info.out;
    const size_t at = info.out.find(" bytes; exmy train checks");
    ASSERT_NE(at, std::string::npos) << info.out;
    const size_t open = info.out.rfind('(', at);
    const double estimate = std::stod(info.out.substr(open + 1, at - open - 1));
    std::vector<std::string> argv = train_args(d / "run", {"model.name=proxy-10m", "train.batch_size=8",
                                                           "train.seq_len=256", "train.steps=2", "train.eval_batches=1",
                                                           "data.synthetic_tokens=65536", "train.recompute=" + recompute});
    std::vector<char*> args;
    for (auto& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    pid_t pid = 0;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    ASSERT_EQ(posix_spawn(&pid, args[0], &fa, nullptr, args.data(), environ), 0);
    posix_spawn_file_actions_destroy(&fa);
    int st = 0;
    rusage ru{};
    ASSERT_EQ(::wait4(pid, &st, 0, &ru), pid);
    ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << recompute;
    const double peak = static_cast<double>(ru.ru_maxrss) * 1024.0;
    std::printf("[recompute %s] estimate %.1f MiB, measured peak %.1f MiB (%+.1f%%)\n", recompute.c_str(),
                estimate / 1048576.0, peak / 1048576.0, 100.0 * (peak - estimate) / estimate);
    EXPECT_LT(std::fabs(peak - estimate), 0.10 * estimate) << recompute;
  }
}

// `model-info --recipe`: the plan holds the recipe's quantized linears'
// scratch (the bytes `exmy train` checks: tests/train/test_trainer.cpp
// compares them with a device run's peak), the same as train's plan of the
// same run; bad recipes and fp32-gemm values are one line.
TEST(CliTrain, ModelInfoPlansTheRecipesScratch) {
  const auto total = [](const std::string& out) {
    const size_t at = out.find(" bytes; exmy train checks");
    EXPECT_NE(at, std::string::npos) << out;
    const size_t open = out.rfind('(', at);
    return std::stod(out.substr(open + 1, at - open - 1));
  };
  const std::vector<std::string> base = {kExmy, "model-info", "--model", "proxy-10m", "--seq-len", "256",
                                         "--batch", "4", "--device", "cuda-emulated"};
  const Result plain = run(base);
  ASSERT_EQ(plain.status, 0) << plain.out;
  EXPECT_EQ(plain.out.find("quantized linears' scratch"), std::string::npos);
  auto with = base;
  for (const char* a : {"--recipe", "te-nvfp4", "--fp32-gemm", "bf16"}) with.push_back(a);
  const Result q = run(with);
  ASSERT_EQ(q.status, 0) << q.out;
  EXPECT_NE(q.out.find("quantized linears' scratch (te-nvfp4, fp32 GEMM model bf16, statistics on)"), std::string::npos)
      << q.out;
  const RunConfig c = parse_run_config("", "t", {"model.name=proxy-10m", "train.batch_size=4", "train.seq_len=256",
                                                 "train.recipe=te-nvfp4", "train.fp32_gemm=bf16",
                                                 "train.device=cuda-emulated"});
  const models::MemoryEstimate m = rank_training_memory(c.model, 4, 256, false, rank_plan(c, 1));
  EXPECT_GT(m.quant_scratch, 0);
  EXPECT_EQ(total(q.out), m.total());
  EXPECT_EQ(total(plain.out) + m.quant_scratch, m.total());
  for (const auto& [flag, value] : {std::pair<const char*, const char*>{"--recipe", "nope"}, {"--fp32-gemm", "tf32"}}) {
    auto bad = base;
    bad.push_back(flag);
    bad.push_back(value);
    const Result r = run(bad);
    EXPECT_NE(r.status, 0);
    EXPECT_NE(r.out.find(value), std::string::npos) << r.out;
    EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
  }
}

// A CUDA device's `bf16` plain Linears keep BF16 copies of their largest X,
// W and dY (sim/cuda/linear_cuda.cpp): the plan counts them for the linears
// a recipe leaves to its `unquantized` policy, only on a CUDA device (the
// CPU's and cuda-emulated's Linears are the CPU's), and model-info prints
// the same bytes as train's plan.
TEST(CliTrain, PlanCountsTheDevicesBf16OperandCopies) {
  const models::NemotronHConfig model = models::resolve_config("proxy-10m");
  const int64_t tokens = 4 * 256;
  int64_t x = 0, w = 0, dy = 0;  // every linear unquantized: the largest of each operand
  for (const sim::LinearInfo& l : models::linear_infos(model)) {
    x = std::max(x, tokens * l.in_features);
    w = std::max(w, l.out_features * l.in_features);
    dy = std::max(dy, tokens * l.out_features);
  }
  const sim::quant::Recipe bf16 = sim::quant::load_recipe("bf16"), fp32 = sim::quant::load_recipe("fp32");
  const sim::Device cuda = sim::parse_device("cuda", "t"), emulated = sim::parse_device("cuda-emulated", "t");
  EXPECT_EQ(plain_linear_scratch(model, bf16, cuda, tokens), 2.0 * static_cast<double>(x + w + dy));
  EXPECT_EQ(plain_linear_scratch(model, fp32, cuda, tokens), 0.0);
  EXPECT_EQ(plain_linear_scratch(model, bf16, emulated, tokens), 0.0);
  EXPECT_EQ(plain_linear_scratch(model, bf16, sim::Device{}, tokens), 0.0);
  // a recipe that quantizes some linears leaves fewer copies, never more
  const sim::quant::Recipe nv = sim::quant::load_recipe("te-nvfp4");
  const double some = plain_linear_scratch(model, nv, cuda, tokens);
  EXPECT_GT(some, 0.0);
  EXPECT_LE(some, 2.0 * static_cast<double>(x + w + dy));
  const RunConfig c = parse_run_config("", "t", {"model.name=proxy-10m", "train.batch_size=4", "train.seq_len=256",
                                                 "train.precision=bf16", "train.device=cuda"});
  EXPECT_EQ(rank_plan(c, 1).linear_scratch, 2.0 * static_cast<double>(x + w + dy));
  const Result r = run({kExmy, "model-info", "--model", "proxy-10m", "--seq-len", "256", "--batch", "4", "--device",
                        "cuda", "--recipe", "bf16", "--memory", "100"});
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("BF16 operand copies of the bf16 linears " + sim::gib_text(2.0 * static_cast<double>(x + w + dy))),
            std::string::npos)
      << r.out;
}

// `model-info --ranks N`: one rank's plan with the AdamW moments sharded
// (train.shard_optimizer): an N-th of the moments, up to the imbalance of
// shards of whole parameters; the weights and gradients stay whole.
TEST(CliTrain, ModelInfoRanksShardsTheMoments) {
  const auto gib = [](const std::string& out, const std::string& what) {
    const size_t at = out.find(what + " ", out.find("\n  weights "));  // in the plan's first line
    EXPECT_NE(at, std::string::npos) << out;
    return at == std::string::npos ? 0.0 : std::stod(out.substr(at + what.size() + 1));
  };
  const Result one = run({kExmy, "model-info", "--model", "nemotron-h-8b"});
  const Result eight = run({kExmy, "model-info", "--model", "nemotron-h-8b", "--ranks", "8"});
  ASSERT_EQ(one.status, 0) << one.out;
  ASSERT_EQ(eight.status, 0) << eight.out;
  EXPECT_NE(eight.out.find("per rank of 8 (AdamW moments sharded)"), std::string::npos) << eight.out;
  EXPECT_EQ(gib(one.out, "weights"), gib(eight.out, "weights"));
  EXPECT_EQ(gib(one.out, "gradients"), gib(eight.out, "gradients"));
  const double m1 = gib(one.out, "AdamW moments"), m8 = gib(eight.out, "AdamW moments");
  EXPECT_GE(m8, m1 / 8 - 0.01);
  EXPECT_LE(m8, m1 / 8 * 1.15);  // the largest shard; the 8B's embedding is 6.6% of the parameters
  EXPECT_NE(run({kExmy, "model-info", "--ranks", "0"}).out.find("--ranks must be at least 1"), std::string::npos);
}

TEST(CliTrain, PrepareDataThenTrainOnTheMegatronFiles) {
  TempDir d;
  fs::create_directories(d / "text");
  {
    std::ofstream a(d / "text/a.txt"), b(d / "text/b.txt");
    for (int i = 0; i < 40; ++i) a << "Line " << i << " of a small English text about training models.\n";
    for (int i = 0; i < 40; ++i) b << "Another document, line " << i << ", with other words in it.\n";
  }
  const Result p = run({kExmy, "prepare-data", "--out", d / "data", "--format", "both", d / "text"});
  ASSERT_EQ(p.status, 0) << p.out;
  EXPECT_NE(p.out.find("2 files"), std::string::npos) << p.out;
  const Result r = run(train_args(d / "run", {"data.path=" + (d / "data/tokens"), "data.format=megatron",
                                              "model.vocab_size=256", "train.steps=3", "train.batch_size=2",
                                              "train.seq_len=16", "train.eval_batches=1"}));
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("Megatron dataset"), std::string::npos) << r.out;
  const Result bpe =
      run({kExmy, "prepare-data", "--out", d / "bpe", "--tokenizer", "bpe", "--vocab-size", "300", d / "text"});
  ASSERT_EQ(bpe.status, 0) << bpe.out;
  EXPECT_NE(bpe.out.find("bpe tokenizer"), std::string::npos) << bpe.out;
}

// Bad input: exit status 1 and exactly one line, "exmy: error: ...".
void expect_one_line_error(const std::vector<std::string>& argv, const std::string& needle) {
  const Result r = run(argv);
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_EQ(r.out.rfind("exmy: error: ", 0), 0u) << r.out;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
  EXPECT_NE(r.out.find(needle), std::string::npos) << r.out;
}

// model-info --device cuda: the plan of a device run (everything in device
// memory), against --memory; 8B with block recompute fits an H200's 139 GiB,
// without it does not.
TEST(CliTrain, ModelInfoPlansADeviceRun) {
  for (const auto& [recompute, fits] : {std::pair<const char*, bool>{"blocks", true}, {"none", false}}) {
    const Result r = run({kExmy, "model-info", "--model", "nemotron-h-8b", "--device", "cuda", "--memory", "139",
                          "--recompute", recompute});
    ASSERT_EQ(r.status, 0) << r.out;
    EXPECT_NE(r.out.find("training memory on cuda, all in device memory"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find(std::string(fits ? "  fits" : "  does not fit") + " in 139.00 GiB (--memory)"),
              std::string::npos)
        << r.out;
  }
  expect_one_line_error({kExmy, "model-info", "--device", "gpu"}, "--device gpu: expected cpu, cuda");
  // train.offload = optimizer: the moments leave the device (8 bytes a
  // parameter), the master weights and moments go to the host: the 8B then
  // fits without recompute (30.18 + 30.18 + 44.65 + 3.81 GiB)
  {
    const Result r = run({kExmy, "model-info", "--model", "nemotron-h-8b", "--device", "cuda", "--memory", "139",
                          "--offload", "optimizer", "--host-memory", "128"});
    ASSERT_EQ(r.status, 0) << r.out;
    for (const char* want : {"training memory on cuda, optimizer state in host memory", "total 108.81 GiB",
                             "  fits in 139.00 GiB (--memory)", "host memory 90.66 GiB",
                             "fits in 128.00 GiB (--host-memory)"})
      EXPECT_NE(r.out.find(want), std::string::npos) << want << "\n" << r.out;
  }
  expect_one_line_error({kExmy, "model-info", "--offload", "optimizer"}, "--offload optimizer plans a device run");
  // a GiB figure that is no amount: one line, before any of the plan
  expect_one_line_error({kExmy, "model-info", "--model", "proxy-1m", "--memory", "0"},
                        "--memory must be a positive number of GiB");
  expect_one_line_error({kExmy, "model-info", "--model", "proxy-1m", "--device", "cuda", "--memory", "80", "--offload",
                         "optimizer", "--host-memory", "-3"},
                        "--host-memory must be a positive number of GiB");
  // gradient accumulation keeps the step's running sum (one more arena):
  // the 8B with recompute then needs 161.89 GiB, with the optimizer
  // offloaded too 101.54
  for (const auto& [offload, total, fits] :
       {std::tuple<const char*, const char*, bool>{"none", "total 161.89 GiB", false},
        {"optimizer", "total 101.54 GiB", true}}) {
    const Result r = run({kExmy, "model-info", "--model", "nemotron-h-8b", "--device", "cuda", "--memory", "139",
                          "--recompute", "blocks", "--grad-accum", "8", "--offload", offload, "--host-memory", "128"});
    ASSERT_EQ(r.status, 0) << r.out;
    for (const char* want : {"gradient sums of 8 micro-batches 30.18 GiB", total})
      EXPECT_NE(r.out.find(want), std::string::npos) << want << "\n" << r.out;
    EXPECT_NE(r.out.find(fits ? "  fits in 139.00 GiB" : "  does not fit in 139.00 GiB"), std::string::npos) << r.out;
  }
  expect_one_line_error({kExmy, "model-info", "--grad-accum", "3", "--ranks", "2"},
                        "--grad-accum 3: a positive multiple of --ranks (2)");
  expect_one_line_error({kExmy, "model-info", "--device", "cuda", "--offload", "all"},
                        "--offload 'all' (expected none or optimizer)");
  // --working-weights bf16: the FP32 master (4 bytes a parameter, 30.18
  // GiB for the 8B) beside the moments on the device, the working weights
  // still FP32 storage: 169.17 + 30.18 GiB; with the optimizer offloaded
  // the master is on the host already (its 90.66 GiB held one; 64 MiB more
  // for the third staging chunk)
  {
    const Result r = run({kExmy, "model-info", "--model", "nemotron-h-8b", "--device", "cuda", "--memory", "139",
                          "--working-weights", "bf16"});
    ASSERT_EQ(r.status, 0) << r.out;
    for (const char* want : {"BF16 working weights in FP32 storage with FP32 master weights",
                             "FP32 master weights 30.18 GiB", "total 199.35 GiB"})
      EXPECT_NE(r.out.find(want), std::string::npos) << want << "\n" << r.out;
    const Result off = run({kExmy, "model-info", "--model", "nemotron-h-8b", "--device", "cuda", "--memory", "139",
                            "--working-weights", "bf16", "--offload", "optimizer", "--host-memory", "128"});
    ASSERT_EQ(off.status, 0) << off.out;
    for (const char* want : {"total 108.81 GiB", "host memory 90.72 GiB"})
      EXPECT_NE(off.out.find(want), std::string::npos) << want << "\n" << off.out;
  }
  expect_one_line_error({kExmy, "model-info", "--working-weights", "fp8"},
                        "--working-weights: bad value 'fp8' (expected fp32 or bf16)");
}

// EXMY_CUDA_ATTENTION=fused, EXMY_CUDA_SSD=fused, pieces and fused,pieces:
// the emulated device trains through the fused kernels' host emulations
// (models/attention_fused.hpp, models/ssd_fused.hpp, ssd_fused_bwd.hpp) and
// the SSD block launches' products on bfloat16 pieces (SplitGemm over
// HostBf16Gemm): its losses are not the CPU's bits (the chosen path ran:
// another algorithm, products on bfloat16 pieces) but within 1e-4 of them
// over 20 steps of proxy-tiny in fp32 (the kernels' own tests hold each
// call to its derived budget; this holds the backend's calls of them).
TEST(CliTrain, FusedKernelsTrainOnTheEmulatedDevice) {
  TempDir d;
  const auto args = [&](const std::string& env, const std::string& out, const std::string& device) {
    return std::vector<std::string>{"/usr/bin/env", env, kExmy, "train", "--config",
                                    kTinyIni, "--out", out, "--steps", "20", "--device", device,
                                    "--set", "train.log_interval=1", "--set", "train.precision=fp32"};
  };
  const Result cpu = run(args("EXMY_CUDA_ATTENTION=fused", d / "cpu", "cpu"));
  ASSERT_EQ(cpu.status, 0) << cpu.out;
  const auto a = io::read_run_column(d / "cpu/run.h5", "/train/loss");
  ASSERT_EQ(a.size(), 20u);
  int which = 0;
  for (const std::string env : {"EXMY_CUDA_ATTENTION=fused", "EXMY_CUDA_SSD=fused", "EXMY_CUDA_SSD=pieces",
                                  "EXMY_CUDA_SSD=fused,pieces"}) {
    const std::string out = d / ("emu" + std::to_string(which++));
    const Result emu = run(args(env, out, "cuda-emulated"));
    ASSERT_EQ(emu.status, 0) << env << "\n" << emu.out;
    const auto b = io::read_run_column(out + "/run.h5", "/train/loss");
    ASSERT_EQ(b.size(), 20u) << env;
    bool differ = false;
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_NEAR(b[i], a[i], 1e-4 * a[i]) << env << ", step " << i + 1;
      differ = differ || a[i] != b[i];
    }
    EXPECT_TRUE(differ) << env << ": the emulated device's losses are the CPU's bits: the chosen kernels did not run";
  }
}

// --device / train.device: cpu and cuda-emulated train; a CUDA device that
// is not there is refused in one line before any work, naming why (no CUDA
// build, no device); eval refuses any device (it runs on the CPU only so
// far); bench train times the device's passes; row outer scales
// (nvfp4-row-scaled) train on a device.
TEST(CliTrain, DeviceChoicesAndRefusalsAreOneLine) {
  TempDir d;
  const sim::DeviceInventory inv = sim::device_inventory();
  auto with_device = [&](const std::string& out, const std::string& device) {
    return std::vector<std::string>{kExmy, "train", "--config", kTinyIni, "--out", out, "--device", device};
  };
  if (!inv.built_with_cuda || inv.count == 0) {
    const std::string why = !inv.built_with_cuda ? "exmy was built without CUDA" : "no CUDA device is visible";
    expect_one_line_error(with_device(d / "a", "cuda"), "--device cuda: " + why);
    expect_one_line_error(train_args(d / "b", {"train.device=cuda:0"}), "train.device cuda:0: " + why);
    expect_one_line_error({kExmy, "eval", "--device", "cuda"}, "--device cuda: " + why);
  }
  expect_one_line_error(with_device(d / "c", "cuda:x"), "--device cuda:x: expected cpu, cuda, cuda:N");
  expect_one_line_error(train_args(d / "e", {"train.device=gpu"}), "train.device gpu: expected cpu, cuda, cuda:N");
  expect_one_line_error(train_args(d / "f", {"train.offload=optimizer"}),
                        "train.offload = optimizer moves the optimizer state from a device's memory");
  expect_one_line_error(train_args(d / "h", {"train.device=cuda-emulated", "train.offload=gpu"}),
                        "train.offload");
  // eval takes the device (tests/eval/test_cli_eval.cpp runs it); without a target it stops at that
  expect_one_line_error({kExmy, "eval", "--device", "cuda-emulated"}, "exmy eval needs a checkpoint");
  // bench train's sizes and counts (--steps 0 was once taken as 1)
  for (const char* bad : {"--steps", "--batch", "--seq-len"})
    expect_one_line_error({kExmy, "bench", "train", "--model", "proxy-tiny", bad, "0"},
                          "--seq-len, --batch and --steps must be positive");
  {  // bench train times the device backend's passes, and --profile each launch of one more pass
    const Result b = run({kExmy, "bench", "train", "--device", "cuda-emulated", "--model", "proxy-tiny", "--seq-len",
                          "32", "--batch", "1", "--steps", "1", "--gemm-size", "64", "--profile"});
    ASSERT_EQ(b.status, 0) << b.out;
    EXPECT_NE(b.out.find("device cuda-emulated"), std::string::npos) << b.out;
    EXPECT_NE(b.out.find("\nbf16 "), std::string::npos) << b.out;
    // a profile's table of one pass, and the calls of its row `name` (-1: none)
    auto table_of = [](const std::string& out, const std::string& label) {
      const size_t at = out.find("launch profile of one " + label + " pass");
      return at == std::string::npos ? std::string() : out.substr(at, out.find("\nlaunches: ", at) - at);
    };
    auto calls_of = [](const std::string& table, const std::string& name) {
      const size_t row = table.find("\n" + name + " ");
      if (row == std::string::npos) return int64_t{-1};
      std::istringstream fields(table.substr(row + name.size() + 2));
      int64_t calls = -1;
      fields >> calls;
      return calls;
    };
    // proxy-tiny's pre-norms and its final norm: one rstd launch each
    const int64_t norms = models::resolve_config("proxy-tiny").num_hidden_layers + 1;
    for (const char* policy : {"fp32", "bf16"})
      EXPECT_EQ(calls_of(table_of(b.out, policy), "rmsnorm_forward rstd"), norms) << b.out;
    // a recipe's pass, emulated and on the CPU: its quantizer calls and GEMMs
    // have rows of their own (the CPU's: every layer call too, one
    // rmsnorm_forward a norm)
    for (const char* device : {"cuda-emulated", "cpu"}) {
      const Result q = run({kExmy, "bench", "train", "--device", device, "--model", "proxy-tiny", "--seq-len", "32",
                            "--batch", "1", "--steps", "1", "--recipe", "bf16,te-nvfp4", "--stats", "none",
                            "--profile"});
      ASSERT_EQ(q.status, 0) << q.out;
      const std::string table = table_of(q.out, "te-nvfp4");
      const bool cpu = std::string(device) == "cpu";
      // (the emulation's quantizer row says which it is: the kernels' host
      // emulation, or the CPU's in a build without CUDA)
      EXPECT_NE(table.find("\nquantize "), std::string::npos) << device << table;
      EXPECT_GT(calls_of(table, "gemm (quantized operands, sim::gemm)"), 0) << device << table;
      if (cpu) EXPECT_EQ(calls_of(table, "rmsnorm_forward"), norms) << table;
    }
  }
  for (const char* dir : {"a", "b", "c", "e", "f", "h"}) EXPECT_FALSE(fs::exists(d / dir)) << dir;
  {  // row outer scales run on the device's quantizer
    const Result r = run(train_args(d / "g", {"train.device=cuda-emulated", "train.recipe=nvfp4-row-scaled",
                                              "train.steps=2", "train.stats_interval=1"}));
    ASSERT_EQ(r.status, 0) << r.out;
    EXPECT_NE(r.out.find("done: 2 steps"), std::string::npos) << r.out;
    EXPECT_EQ(io::read_run_column(d / "g/run.h5", "/quant/layers.0.mixer.in_proj/fprop/fprop-x/blocks").size(), 2u);
  }
  // cpu and cuda-emulated train, and the resolved configuration records the device
  for (const char* device : {"cpu", "cuda-emulated"}) {
    auto argv = with_device(d / device, device);
    for (const char* s : {"train.steps=2", "train.batch_size=2", "train.seq_len=16", "train.eval_batches=1"})
      argv.insert(argv.end(), {"--set", s});
    const Result r = run(argv);
    ASSERT_EQ(r.status, 0) << r.out;
    std::ifstream f(d / (std::string(device) + "/config.ini"));
    std::stringstream ss;
    ss << f.rdbuf();
    EXPECT_NE(ss.str().find(std::string("\ndevice = ") + device + "\n"), std::string::npos) << ss.str();
  }
}

// The shipped four-over-six recipe trains, and its /quant rows count the
// blocks that chose the 4 scale (some, not all).
TEST(CliTrain, FourOverSixRecipeTrainsAndCountsItsBlocks) {
  TempDir d;
  std::vector<std::string> a = train_args(d / "run", {"train.steps=2", "train.stats_interval=1"});
  for (const char* x : {"--recipe", "nvfp4-4over6"}) a.push_back(x);
  const Result r = run(a);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("done: 2 steps"), std::string::npos) << r.out;
  const std::string g = "/quant/layers.0.mixer.in_proj/fprop/fprop-x/";
  const std::vector<double> four = io::read_run_column(d / "run/run.h5", g + "scale_four"),
                            blocks = io::read_run_column(d / "run/run.h5", g + "blocks");
  ASSERT_EQ(four.size(), 2u);
  ASSERT_EQ(blocks.size(), 2u);
  for (size_t k = 0; k < four.size(); ++k) {
    EXPECT_GT(four[k], 0.0);
    EXPECT_LT(four[k], blocks[k]);
  }
}

// The shipped H32 recipe, and a deterministic 128-point transform on
// wgrad, train.
TEST(CliTrain, HadamardSizesAndKindsTrain) {
  TempDir d;
  struct Case {
    const char* dir;
    const char* recipe;
    std::vector<std::string> sets;
  };
  for (const Case& c : {Case{"h32", "nvfp4-h32-wgrad", {"train.steps=2"}},
                        Case{"h128", "te-nvfp4", {"train.steps=2", "recipe.all.rht_size=128", "recipe.all.rht_kind=deterministic"}}}) {
    std::vector<std::string> a = train_args(d / c.dir, c.sets);
    a.push_back("--recipe");
    a.push_back(c.recipe);
    const Result r = run(a);
    ASSERT_EQ(r.status, 0) << c.dir << ": " << r.out;
    EXPECT_NE(r.out.find("done: 2 steps"), std::string::npos) << r.out;
  }
}

TEST(CliTrain, BadInputGetsOneLineErrors) {
  TempDir d;
  expect_one_line_error(train_args(d / "a", {"train.bogus=1"}), "unknown configuration key 'train.bogus'");
  expect_one_line_error(train_args(d / "b", {"model.hybrid_override_pattern=M?M"}), "unknown layer letter '?'");
  expect_one_line_error(train_args(d / "c", {"model.bogus_field=1"}), "unknown configuration key 'model.bogus_field'");
  expect_one_line_error(train_args(d / "d", {"data.path=" + (d / "missing.tok")}), "does not exist");
  expect_one_line_error({kExmy, "train", "--config", d / "nope.ini", "--out", d / "e"}, "cannot open configuration");
  fs::create_directories(d / "adir");
  expect_one_line_error({kExmy, "train", "--config", d / "adir", "--out", d / "e2"}, "is a directory, not a file");
  expect_one_line_error(train_args(d / "e3", {"train.recipe=" + (d / "adir")}), "is a directory, not a file");
  expect_one_line_error({kExmy, "train", "--resume", d / "nothing"}, "no run to resume");
  expect_one_line_error({kExmy, "train", "--config", kTinyIni, "--out", d / "ac", "--allow-changes"},
                        "--allow-changes goes with --resume");
  expect_one_line_error({kExmy, "prepare-data", "--out", d / "f", d / "no-such-text"}, "does not exist");
  // Bad recipes are refused at start, naming the key.
  auto with = [&](const std::string& out, std::vector<std::string> extra, std::vector<std::string> sets = {}) {
    std::vector<std::string> a = train_args(d / out, sets);
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  expect_one_line_error(with("r1", {"--recipe", "no-such-recipe"}), "train.recipe: unknown recipe 'no-such-recipe'");
  expect_one_line_error(with("r2", {"--recipe", "te-nvfp4"}, {"recipe.all.round=sometimes"}),
                        "recipe.all.round=sometimes: all.round: unknown rounding mode 'sometimes'");
  expect_one_line_error(with("r3", {}, {"recipe.gemm.bogus=1"}), "gemm.bogus: unknown key");
  expect_one_line_error(with("r4", {"--recipe", "nvfp4-no-rht-all"}, {"recipe.wgrad-x.rht=true"}),
                        "recipe.wgrad-x.rht=true: recipe 'nvfp4-no-rht-all': wgrad");
  {
    std::ofstream(d / "bad.ini") << "[recipe]\nlayers = all\n[all]\nelem = e2m1\nbogus = 3\n";
    expect_one_line_error(with("r5", {"--recipe", d / "bad.ini"}), "(" + (d / "bad.ini") + ":5): all.bogus: unknown knob");
  }
  // The RHT along K = 15 tokens (wgrad): refused before the run starts.
  expect_one_line_error(with("r6", {"--recipe", "te-nvfp4"}, {"recipe.keep_last_bf16=0", "train.seq_len=15",
                                                              "train.batch_size=1"}),
                        "wgrad-dy has rht = true, which needs K a multiple of 16, but K is train.batch_size x "
                        "train.seq_len = 15");
  EXPECT_FALSE(fs::exists(d / "r6/run.h5"));
  // The same with a 32-point transform along 48 tokens: a multiple of 16, not of 32.
  expect_one_line_error(with("r6b", {"--recipe", "nvfp4-h32-wgrad"}, {"recipe.keep_last_bf16=0", "train.seq_len=48",
                                                                       "train.batch_size=1"}),
                        "wgrad-dy has rht = true, which needs K a multiple of 32, but K is train.batch_size x "
                        "train.seq_len = 48");
  expect_one_line_error(with("r7", {"--capture-step", "0"}), "--capture-step must be positive");
  expect_one_line_error(train_args(d / "t1", {"train.threads=100000"}), "train.threads = 100000 is outside");
  {  // A model far larger than any machine: refused before anything is allocated.
    const auto t0 = std::chrono::steady_clock::now();
    auto a = train_args(d / "m8b", {"train.batch_size=64", "train.seq_len=4096"});
    a.insert(a.end(), {"--model", "nemotron-h-8b"});
    expect_one_line_error(a, "training model nemotron-h-8b (micro-batch 64 x 4096 tokens: weights, gradients");
    const Result r = run(a);
    EXPECT_NE(r.out.find(" are available ("), std::string::npos) << r.out;
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 30.0);
    EXPECT_FALSE(fs::exists(d / "m8b/run.h5"));
  }
  expect_one_line_error({kExmy, "bench", "train", "--threads", "100000"}, "--threads = 100000 is outside");
  expect_one_line_error(with("r8", {}, {"train.stats_interval=-1"}), "train.stats_interval");
  // NaN: a learning rate no model survives. Progress lines come first; the
  // last line is the error.
  const Result r = run(train_args(d / "g", {"optim.lr=1e6", "optim.grad_clip=0", "optim.schedule=constant",
                                            "optim.warmup_steps=0", "train.steps=50", "train.batch_size=2",
                                            "train.seq_len=16", "train.eval_batches=1"}));
  EXPECT_EQ(r.status, 1) << r.out;
  const size_t last = r.out.rfind('\n', r.out.size() - 2);
  const std::string tail = r.out.substr(last == std::string::npos ? 0 : last + 1);
  EXPECT_EQ(tail.rfind("exmy: error: ", 0), 0u) << r.out;
  EXPECT_NE(tail.find("stopped before the update; checkpoint of step"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace exmy::train

// The run file writer: rows of every type, creation on first use (also after
// SWMR started), type checks, and cutting a run file at a step for resume.
#include <gtest/gtest.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "sim/io/run_file.hpp"
#include "tests/train/test_support.hpp"

namespace exmy::io {
namespace {

using test::expect_error;
using test::TempDir;

TEST(RunFile, AppendsScalarAndVectorRowsCreatingDatasetsOnFirstUse) {
  TempDir d;
  const std::string p = d / "run.h5";
  {
    RunFile f(p);
    f.set_attribute("schema_version", int64_t{1});
    f.set_attribute("config", std::string("[train]\nsteps = 3\n"));
    f.append("/train/step", int64_t{1});
    f.append("/train/loss", 2.5);
    const std::vector<float> hist = {1, 2, 3, 4};
    f.append("/quant/layers.0.mixer.in_proj/fprop/x/hist", std::span<const float>(hist));
    f.start_swmr();
    f.append("/train/step", int64_t{2});
    f.append("/train/loss", 1.5);
    // First use after SWMR started: the writer leaves SWMR mode around the
    // creation and comes back.
    const std::vector<uint64_t> counts = {7, 8};
    f.append("/quant/layers.0.mixer.in_proj/fprop/x/counts", std::span<const uint64_t>(counts));
    f.append("/quant/layers.0.mixer.in_proj/fprop/x/counts", std::span<const uint64_t>(counts));
    f.set_attribute("late", 3.5);
    f.flush();
    EXPECT_EQ(f.rows("/train/loss"), 2);
    expect_error([&] { f.append("/train/loss", int64_t{3}); }, "holds float64 rows");
    expect_error([&] { f.append("/quant/layers.0.mixer.in_proj/fprop/x/hist", std::span<const float>(hist.data(), 3)); },
                 "of width 4");
    expect_error([&] { f.append("train/x", 1.0); }, "absolute path");
  }
  EXPECT_EQ(read_run_column(p, "/train/step"), (std::vector<double>{1, 2}));
  EXPECT_EQ(read_run_column(p, "/train/loss"), (std::vector<double>{2.5, 1.5}));
  EXPECT_EQ(read_run_column(p, "/quant/layers.0.mixer.in_proj/fprop/x/hist"), (std::vector<double>{1, 2, 3, 4}));
  EXPECT_EQ(read_run_column(p, "/quant/layers.0.mixer.in_proj/fprop/x/counts"), (std::vector<double>{7, 8, 7, 8}));
  EXPECT_EQ(read_run_attribute(p, "config"), std::string("[train]\nsteps = 3\n"));
  expect_error([&] { read_run_column(p, "/train/nope"); }, "has no dataset '/train/nope'");
  expect_error([&] { read_run_column(d / "missing.h5", "/train/loss"); }, "does not exist");
}

// A run file whose metadata checksums no longer match (every object header
// altered): reading it is an error, at once. (Opened as an SWMR reader with
// libhdf5's default 100 metadata read attempts and their doubling back-off,
// it used to stall for hours.) The test runs in a child process with a 60 s
// alarm, so a stall fails it instead of holding CI; and libhdf5 (not
// instrumented) never frees one object header after the failed read, which
// LeakSanitizer would report at the child's exit, which a bare exit_group
// system call skips.
TEST(RunFile, CorruptMetadataIsAnErrorNotAStall) {
  TempDir d;
  const std::string p = d / "run.h5";
  std::fflush(nullptr);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    alarm(60);
    {
      RunFile f(p);
      f.append("/train/loss", 2.5);
    }
    std::string bytes;
    {
      std::ifstream in(p, std::ios::binary);
      bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
    int headers = 0;
    for (size_t at = bytes.find("OHDR"); at != std::string::npos; at = bytes.find("OHDR", at + 4)) {
      bytes[at + 24] = static_cast<char>(bytes[at + 24] ^ 0x40);  // inside the header: its checksum no longer matches
      ++headers;
    }
    {
      std::ofstream out(p, std::ios::binary | std::ios::trunc);
      out << bytes;
    }
    int status = headers > 0 ? 3 : 2;  // 3: no error thrown
    try {
      read_run_column(p, "/train/loss");
    } catch (const Error& e) {
      status = std::string(e.what()).find(p) != std::string::npos ? 0 : 4;
    }
    syscall(SYS_exit_group, status);  // not _exit, which LeakSanitizer intercepts
  }
  int st = 0;
  ASSERT_EQ(waitpid(pid, &st, 0), pid);
  ASSERT_TRUE(WIFEXITED(st)) << "the reader was killed (signal " << (WIFSIGNALED(st) ? WTERMSIG(st) : 0)
                             << "; SIGALRM = 14: it stalled)";
  EXPECT_EQ(WEXITSTATUS(st), 0) << "2: no object header found; 3: no error; 4: the error does not name the file";
}

TEST(RunFile, ContinueFromKeepsEachGroupsRowsUpToTheStep) {
  TempDir d;
  const std::string p = d / "run.h5";
  {
    RunFile f(p);
    f.set_attribute("start_time", std::string("2025-01-01T00:00:00Z"));
    f.set_attribute("seed", int64_t{7});
    f.start_swmr();
    for (int64_t s = 10; s <= 100; s += 10) {
      f.append("/train/step", s);
      f.append("/train/loss", 1.0 / static_cast<double>(s));
      const std::vector<double> row = {static_cast<double>(s), -static_cast<double>(s)};
      f.append("/train/pair", std::span<const double>(row));
      if (s % 50 == 0) {
        f.append("/eval/step", s);
        f.append("/eval/loss", 2.0 / static_cast<double>(s));
      }
      f.flush();
    }
    f.append("/notes/anything", 1.0);  // a group without `step`: kept whole
  }
  const std::string q = d / "cut.h5";
  {
    auto f = RunFile::continue_from(p, q, 55);
    EXPECT_EQ(f->rows("/train/step"), 5);
    EXPECT_EQ(f->rows("/train/pair"), 5);
    EXPECT_EQ(f->rows("/eval/loss"), 1);
    EXPECT_EQ(f->rows("/notes/anything"), 1);
    f->close();
  }
  {
    auto f = RunFile::open_append(q);
    f->start_swmr();
    f->append("/train/step", int64_t{60});
    f->append("/train/loss", 0.5);
  }
  EXPECT_EQ(read_run_column(q, "/train/step"), (std::vector<double>{10, 20, 30, 40, 50, 60}));
  EXPECT_EQ(read_run_column(q, "/train/loss").back(), 0.5);
  EXPECT_EQ(read_run_column(q, "/train/pair").size(), 10u);
  EXPECT_EQ(read_run_column(q, "/eval/step"), (std::vector<double>{50}));
  EXPECT_EQ(read_run_attribute(q, "start_time"), std::string("2025-01-01T00:00:00Z"));
  expect_error([&] { RunFile::continue_from(d / "none.h5", d / "x.h5", 1); }, "cannot open run file");
}

// Thousands of datasets whose rows cross chunk boundaries in the same flush
// (the statistics' pattern): flush() syncs the file part-way through such
// flushes, and appends go to an uncompressed last chunk that is compressed
// once full. Every row must read back, while the writer is still open and
// after it closed, and full chunks must still be compressed.
TEST(RunFile, ManyDatasetsCrossingChunkBoundariesReadBackAndFullChunksAreCompressed) {
  TempDir d;
  const std::string p = d / "run.h5";
  constexpr int kGroups = 1100;  // > the flush's batch of 1024 chunk writes
  constexpr int kFlushes = 7;
  auto path = [](int g, const char* name) { return "/quant/g" + std::to_string(g) + "/" + name; };
  auto value = [](int g, int k) { return 1000.0 * g + k + 0.25; };
  {
    RunFile f(p);
    for (int g = 0; g < kGroups; ++g) {
      f.declare(path(g, "step"), ElemType::i64, 0, 3);
      f.declare(path(g, "v"), ElemType::f64, 0, 3);
    }
    f.declare("/flat/c", ElemType::f64, 0, 64);
    f.start_swmr();
    for (int k = 0; k < kFlushes; ++k) {
      for (int g = 0; g < kGroups; ++g) {
        f.append(path(g, "v"), value(g, k));
        if (k % 3 == 1) f.append(path(g, "v"), value(g, k) + 0.5);  // two rows: may cross a boundary
        f.append(path(g, "step"), int64_t{k});
        if (k % 3 == 1) f.append(path(g, "step"), int64_t{k});
      }
      for (int i = 0; i < 100; ++i) f.append("/flat/c", 3.0);
      f.flush();
      if (k == kFlushes - 1) {
        // A SWMR reader of the live file sees every flushed row.
        const auto v = read_run_column(p, path(kGroups - 1, "v"));
        ASSERT_FALSE(v.empty());
        EXPECT_EQ(v.back(), value(kGroups - 1, k));
      }
    }
  }
  for (int g : {0, 1, 517, 1023, 1024, kGroups - 1}) {
    std::vector<double> want, steps;
    for (int k = 0; k < kFlushes; ++k) {
      want.push_back(value(g, k));
      steps.push_back(k);
      if (k % 3 == 1) {
        want.push_back(value(g, k) + 0.5);
        steps.push_back(k);
      }
    }
    EXPECT_EQ(read_run_column(p, path(g, "v")), want) << "group " << g;
    EXPECT_EQ(read_run_column(p, path(g, "step")), steps) << "group " << g;
  }
  // 700 rows of one value: ten full chunks of 64 rows compress to far less
  // than their 5 KiB of raw bytes each; the partial last chunk is stored raw.
  EXPECT_EQ(read_run_column(p, "/flat/c"), std::vector<double>(700, 3.0));
  h5::Handle file(H5Fopen(p.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  h5::Handle set(H5Dopen2(file.get(), "/flat/c", H5P_DEFAULT), H5Dclose);
  ASSERT_TRUE(set.valid());
  const hsize_t stored = H5Dget_storage_size(set.get());
  EXPECT_LT(stored, 64u * 8u + 10u * 64u * 8u / 4u);
  EXPECT_GE(stored, 64u * 8u);
}

}  // namespace
}  // namespace exmy::io

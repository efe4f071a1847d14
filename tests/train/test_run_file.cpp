// The run file writer: rows of every type, creation on first use (also after
// SWMR started), type checks, and cutting a run file at a step for resume.
#include <gtest/gtest.h>

#include <filesystem>

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
  expect_error([&] { read_run_column(d / "missing.h5", "/train/loss"); }, "cannot open run file");
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

}  // namespace
}  // namespace exmy::io

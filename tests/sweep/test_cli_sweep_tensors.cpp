// `exmy sweep-tensors` end to end on the tensors captured by a real
// `exmy train --capture-step 2` run: every row equals exmy::quantize on the
// same tensor with the same parameters, bit for bit, in the CSV and in the
// HDF5 output; the "recorded" combination reproduces the training step's own
// statistics (/quant rows of step 2); errors are one line.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "formats/quantize.hpp"
#include "formats/spec.hpp"
#include "formats/vocab.hpp"
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

using test::read_csv;

bool same_double(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

// Every figure of a CSV row against a QuantStats, exactly.
void expect_row(const std::map<std::string, std::string>& row, const QuantStats& s, const std::string& what) {
  for (const QuantStat& st : quant_stats()) {
    if (st.kind == StatKind::count) {
      EXPECT_EQ(row.at(st.name), std::to_string(st.count(s))) << what << " " << st.name;
    } else {
      EXPECT_TRUE(same_double(std::stod(row.at(st.name)), st.value(s)))
          << what << " " << st.name << ": " << row.at(st.name) << " vs " << st.value(s);
    }
  }
}

// One capture for the suite's tests (each test runs in its own process).
class Captured : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    const Result r = run({kExmy, "train", "--config", kTinyIni, "--out", run_dir(), "--steps", "3", "--recipe",
                          "ue5m3-b16", "--capture-step", "2", "--set", "train.batch_size=2", "--set",
                          "train.seq_len=32", "--set", "train.eval_batches=1", "--set", "data.synthetic_tokens=8192",
                          "--set", "train.threads=1"});
    ASSERT_EQ(r.status, 0) << r.out;
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  static std::string run_dir() { return *dir_ / "cap"; }
  static std::string run_h5() { return *dir_ / "cap/run.h5"; }
  static std::string path(const std::string& name) { return *dir_ / name; }
  static std::vector<std::string> captured() {
    std::vector<std::string> t;
    for (const auto& d : io::list_run_datasets(run_h5()))
      if (d.starts_with("/capture/step_2/")) t.push_back(d);
    return t;
  }
  static TempDir* dir_;
};
TempDir* Captured::dir_ = nullptr;

// One test: the capture is a training run, made once per test process.
TEST_F(Captured, RowsEqualQuantizeAndRecordedReplaysTraining) {
  const auto tensors = captured();
  ASSERT_EQ(tensors.size(), 72u);  // 12 linears x 6 operands
  const std::string csv = path("t.csv"), h5 = path("t.h5");
  const Result r = run({kExmy, "sweep-tensors", run_h5(), "--formats", "e2m1/e4m3/1x16,e2m1/ue5m3/1x32",
                        "--tensor-amax", "auto", "--scale-target", "448,2688", "--round", "rne,stochastic", "--seed",
                        "7", "--csv", csv, "--h5", h5});
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("72 tensors x 8 combinations: 576 results (0 not applicable"), std::string::npos) << r.out;
  const auto rows = read_csv(csv);
  ASSERT_EQ(rows.size(), 576u);

  // The eight specs, built here field by field; combinations vary the last
  // list fastest (format, scale target, rounding).
  std::vector<QuantSpec> specs;
  std::vector<std::string> names;
  for (const char* scale : {"e4m3", "ue5m3"})
    for (double target : {448.0, 2688.0})
      for (Round round : {Round::rne, Round::stochastic}) {
        QuantSpec q;
        q.elem = parse_format("e2m1");
        q.scale = parse_format(scale);
        q.block_rows = 1;
        q.block_cols = std::string(scale) == "e4m3" ? 16 : 32;
        q.amax_kind = AmaxKind::current;
        q.scale_target = target;
        q.round = round;
        q.seed = 7;
        specs.push_back(q);
        names.push_back(std::string("cli:format=e2m1/") + scale + (q.block_cols == 16 ? "/1x16" : "/1x32") +
                        ",scale-target=" + (target == 448 ? "448" : "2688") +
                        ",round=" + (round == Round::rne ? "rne" : "stochastic"));
      }

  const auto h5_underflow = io::read_run_column(h5, "/results/underflow");
  const auto h5_sum_sq_err = io::read_run_column(h5, "/results/sum_sq_err");
  const auto h5_sum_err = io::read_run_column(h5, "/results/sum_err");
  const auto h5_combo = io::read_run_column(h5, "/results/combo");
  ASSERT_EQ(h5_underflow.size(), 576u);
  size_t i = 0;
  for (const auto& t : tensors) {
    int64_t rows_, cols_;
    const auto x = io::read_run_tensor(run_h5(), t, rows_, cols_);
    for (size_t c = 0; c < specs.size(); ++c, ++i) {
      const auto& row = rows[i];
      ASSERT_EQ(row.at("tensor"), t);
      ASSERT_EQ(row.at("combo"), names[c]);
      EXPECT_EQ(row.at("rows"), std::to_string(rows_));
      EXPECT_EQ(row.at("cols"), std::to_string(cols_));
      QuantStats s;
      const QuantInfo info = quantize(specs[c], x.data(), rows_, cols_, QuantOutput{nullptr, nullptr, nullptr, &s}, 1);
      expect_row(row, s, t + " " + names[c]);
      EXPECT_TRUE(same_double(std::stod(row.at("amax")), info.amax)) << t;
      EXPECT_TRUE(same_double(std::stod(row.at("t")), static_cast<double>(info.t))) << t;
      EXPECT_EQ(row.at("error"), "");
      // The HDF5 output holds the same figures.
      EXPECT_EQ(h5_combo[i], static_cast<double>(c));
      EXPECT_EQ(h5_underflow[i], static_cast<double>(s.underflow)) << t;
      EXPECT_TRUE(same_double(h5_sum_sq_err[i], s.sum_sq_err)) << t;
      EXPECT_TRUE(same_double(h5_sum_err[i], s.sum_err)) << t;
    }
  }
  // Stochastic rounding really was stochastic on some tensor: the rows differ.
  bool differs = false;
  for (size_t k = 0; k + 1 < rows.size(); k += 2) differs = differs || rows[k].at("sum_err") != rows[k + 1].at("sum_err");
  EXPECT_TRUE(differs);

  // The "recorded" combination replays each tensor's own settings from the
  // capture's attributes: its figures are those of the training step.
  const std::string rec = path("rec.csv");
  const Result rr = run({kExmy, "sweep-tensors", run_h5(), "--recorded", "--csv", rec});
  ASSERT_EQ(rr.status, 0) << rr.out;
  const auto recorded = read_csv(rec);
  ASSERT_EQ(recorded.size(), 72u);
  size_t stochastic = 0;
  for (const auto& row : recorded) {
    EXPECT_EQ(row.at("combo"), "recorded");
    // /capture/step_2/<layer>/<gemm>/<operand> -> /quant/<layer>/<gemm>/<operand>, row of step 2.
    const std::string t = row.at("tensor");
    const std::string q = "/quant/" + t.substr(std::string("/capture/step_2/").size());
    const auto step = io::read_run_column(run_h5(), q + "/step");
    const auto mb = io::read_run_column(run_h5(), q + "/micro_batch");
    size_t k = 0;
    while (k < step.size() && !(step[k] == 2 && mb[k] == 0)) ++k;
    ASSERT_LT(k, step.size()) << q;
    for (const QuantStat& st : quant_stats()) {
      const char* c = st.name;
      if (st.kind == StatKind::count) {
        EXPECT_EQ(std::stod(row.at(c)), io::read_run_column(run_h5(), q + "/" + c)[k]) << q << " " << c;
      } else if (st.kind == StatKind::sum) {
        EXPECT_TRUE(same_double(std::stod(row.at(c)), io::read_run_column(run_h5(), q + "/" + c)[k])) << q << " " << c;
      }
    }
    stochastic += row.at("round").starts_with("stochastic");
  }
  EXPECT_EQ(stochastic, 24u);  // dgrad-dy and wgrad-dy of the 12 linears
}

// A 64 x 100 float32 .npy tensor (x_i = sin(i) * 2^(i mod 13 - 6)).
void write_npy(const std::string& path, std::vector<float>& x) {
  x.resize(64 * 100);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(std::sin(double(i)) * std::ldexp(1.0, int(i % 13) - 6));
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (64, 100), }";
  while ((10 + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::ofstream o(path, std::ios::binary);
  o.write("\x93NUMPY\x01\x00", 8);
  const uint16_t n = static_cast<uint16_t>(header.size());
  o.write(reinterpret_cast<const char*>(&n), 2);
  o << header;
  o.write(reinterpret_cast<const char*>(x.data()), static_cast<std::streamsize>(x.size() * sizeof(float)));
}

TEST(SweepTensors, GridFileNpyInputAndErrors) {
  TempDir tmp;
  const std::string npy = tmp / "x.npy";
  std::vector<float> x;
  write_npy(npy, x);
  const std::string grid = tmp / "grid.ini";
  {
    std::ofstream o(grid);
    o << "[nvfp4]\nformat = e2m1/e4m3/1x16\ntensor-amax = auto\nscale-target = 2688\n"
         "[mx]\nformat = e2m1/ue8m0/1x32\nscale_rule = mx-floor\nround = rne, rtz\n"
         "[rht]\nformat = e2m1/e4m3/1x16\nrht = on\n"
         "[rows]\nformat = e2m1/e4m3/1x16\ntensor-amax = auto\narith = fp32\nouter-scale = tensor, row\n";
  }
  const std::string csv = tmp / "g.csv";
  const Result r = run({kExmy, "sweep-tensors", npy, "--grid", grid, "--csv", csv});
  ASSERT_EQ(r.status, 0) << r.out;
  const auto rows = read_csv(csv);
  ASSERT_EQ(rows.size(), 6u);
  EXPECT_EQ(rows[0].at("tensor"), "x.npy");
  EXPECT_EQ(rows[0].at("combo"), "nvfp4");
  EXPECT_EQ(rows[1].at("combo"), "mx:round=rne");
  EXPECT_EQ(rows[2].at("combo"), "mx:round=rtz");
  EXPECT_EQ(rows[2].at("scale_rule"), "mx-floor");
  // The mx-floor row is quantize() with that spec.
  QuantSpec q;
  q.elem = parse_format("e2m1");
  q.scale = parse_format("ue8m0");
  q.block_cols = 32;
  q.rule = parse_scale_rule("mx-floor");
  q.round = Round::rtz;
  QuantStats s;
  quantize(q, x.data(), 64, 100, QuantOutput{nullptr, nullptr, nullptr, &s}, 1);
  expect_row(rows[2], s, "mx:round=rtz");
  // The RHT needs rows of a multiple of 16 elements: reported in its row.
  EXPECT_EQ(rows[3].at("combo"), "rht");
  EXPECT_NE(rows[3].at("error").find("not a multiple of 16"), std::string::npos) << rows[3].at("error");
  EXPECT_EQ(rows[3].at("underflow"), "");
  EXPECT_NE(r.out.find("(1 not applicable"), std::string::npos) << r.out;
  // Row outer scales: the rows family's second row is quantize() with one
  // scale per row, and differs from the tensor scale's row.
  EXPECT_EQ(rows[5].at("combo"), "rows:outer-scale=row");
  EXPECT_EQ(rows[5].at("outer_scale"), "row");
  QuantSpec by_row;
  by_row.elem = parse_format("e2m1");
  by_row.scale = parse_format("e4m3");
  by_row.amax_kind = AmaxKind::current;
  by_row.arith = Arith::fp32;
  by_row.outer = OuterScale::row;
  QuantStats rs;
  quantize(by_row, x.data(), 64, 100, QuantOutput{nullptr, nullptr, nullptr, &rs}, 1);
  expect_row(rows[5], rs, "rows:outer-scale=row");
  EXPECT_NE(rows[4].at("sum_sq_err"), rows[5].at("sum_sq_err"));

  auto one_line = [](const Result& x, const std::string& needle) {
    EXPECT_EQ(x.status, 1) << x.out;
    EXPECT_EQ(x.out.rfind("exmy: error: ", 0), 0u) << x.out;
    EXPECT_EQ(std::count(x.out.begin(), x.out.end(), '\n'), 1) << x.out;
    EXPECT_NE(x.out.find(needle), std::string::npos) << x.out;
  };
  const std::string bad = tmp / "bad.csv";
  one_line(run({kExmy, "sweep-tensors", npy, "--formats", "e2x1", "--csv", bad}), "e2x1");
  one_line(run({kExmy, "sweep-tensors", npy, "--formats", "e2m1", "--round", "nearest", "--csv", bad}), "nearest");
  one_line(run({kExmy, "sweep-tensors", tmp / "none.h5", "--formats", "e2m1", "--csv", bad}), "does not exist");
  const std::string empty = tmp / "empty.h5";
  H5Fclose(H5Fcreate(empty.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT));
  one_line(run({kExmy, "sweep-tensors", empty, "--formats", "e2m1", "--csv", bad}), "has no group '/capture'");
  one_line(run({kExmy, "sweep-tensors", empty, "--group", "/", "--formats", "e2m1", "--csv", bad}),
           "holds no 2-D float32 dataset");
  // A file libhdf5 itself crashes on (tests/fuzz/upstream; a fuzz input:
  // the file starts after 4 bytes): an error naming it, in both the listing
  // and the reading path, not a crash.
  const std::string crash = tmp / "crash.h5";
  {
    std::ifstream in(kSource + "/tests/fuzz/upstream/libhdf5-1.10.8-null-memcpy-H5F__accum_read", std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    ASSERT_GT(bytes.size(), 4u);
    std::ofstream o(crash, std::ios::binary);
    o << bytes.substr(4);
  }
  for (const std::string& in : {crash, crash + ":/x"}) {
    one_line(run({kExmy, "sweep-tensors", in, "--group", "/", "--formats", "e2m1", "--csv", bad}),
             "cannot read '" + crash + "': the HDF5 library crashed on it");
    EXPECT_FALSE(fs::exists(bad)) << in;
  }
  one_line(run({kExmy, "sweep-tensors", npy, "--formats", "e2m1"}), "no output");
  {
    std::ofstream o(grid);
    o << "[a]\nformat = e2m1\nrounding = rne\n";
  }
  one_line(run({kExmy, "sweep-tensors", npy, "--grid", grid, "--csv", bad}), grid + ":3: unknown knob 'rounding'");
  EXPECT_FALSE(fs::exists(bad));
}

}  // namespace
}  // namespace exmy::sweep

// `exmy eval`, `exmy inspect`, analysis/plot_runs.py and analysis/run_digest.py end to end, on two
// proxy-tiny runs trained once with `exmy train --config
// experiments/proxy-tiny.ini` (an fp32 run, and one with a quantized recipe
// and per-tensor statistics).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "sim/io/run_file.hpp"
#include "tests/cli_support.hpp"
#include "tests/train/test_support.hpp"

namespace exmy::eval {
namespace {

namespace fs = std::filesystem;
using test::TempDir;

const std::string kExmy = EXMY_BINARY;
const std::string kSource = EXMY_SOURCE_DIR;
const std::string kTinyIni = kSource + "/experiments/proxy-tiny.ini";
const std::string kPython = "/usr/bin/python3";

using Result = test::CliResult;
inline Result run(const std::vector<std::string>& argv) { return test::run_cli(argv); }

size_t count_lines(const std::string& s) { return static_cast<size_t>(std::count(s.begin(), s.end(), '\n')); }

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Two runs of 4 steps, trained once for the whole suite.
class Runs : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    const std::vector<std::string> small = {"--steps",  "4", "--set", "train.batch_size=4", "--set", "train.seq_len=16",
                                            "--set",    "train.eval_batches=2", "--set", "data.synthetic_tokens=8192",
                                            "--set",    "train.log_interval=2", "--set", "train.eval_interval=2"};
    std::vector<std::string> a = {kExmy, "train", "--config", kTinyIni, "--out", fp32_dir()};
    a.insert(a.end(), small.begin(), small.end());
    const Result r1 = run(a);
    ASSERT_EQ(r1.status, 0) << r1.out;
    std::vector<std::string> b = {kExmy, "train", "--config", kTinyIni, "--out", quant_dir(), "--recipe",
                                  "nvfp4-no-rht-all", "--set", "train.stats_interval=2"};
    b.insert(b.end(), small.begin(), small.end());
    const Result r2 = run(b);
    ASSERT_EQ(r2.status, 0) << r2.out;
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  static std::string fp32_dir() { return *dir_ / "fp32"; }
  static std::string quant_dir() { return *dir_ / "quant"; }
  static TempDir* dir_;
};
TempDir* Runs::dir_ = nullptr;

void expect_one_line_error(const Result& r, const std::string& needle) {
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_EQ(count_lines(r.out), 1u) << r.out;
  EXPECT_NE(r.out.find("exmy: error: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(needle), std::string::npos) << r.out;
}

TEST_F(Runs, EvalAppendsOneRowPerPolicy) {
  // A copy, so that the other tests see the run file as training left it.
  TempDir d;
  fs::copy(fp32_dir(), d / "run", fs::copy_options::recursive);
  const std::string file = d / "run/run.h5";
  Result r = run({kExmy, "eval", d / "run", "--recipe", "nvfp4-no-rht-all", "--policy", "current", "--policy",
                  "replay:2", "--policy", "calibrated:4"});
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("(step 4)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("12 linears quantized"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("calibrated:4"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("appended 3 rows"), std::string::npos) << r.out;
  for (const char* p : {"current", "replay:2", "calibrated:4"}) {
    const std::string g = std::string("/eval/nvfp4-no-rht-all/") + p;
    EXPECT_EQ(io::read_run_column(file, g + "/step"), std::vector<double>{4}) << g;
    const auto loss = io::read_run_column(file, g + "/loss");
    ASSERT_EQ(loss.size(), 1u);
    EXPECT_TRUE(std::isfinite(loss[0]) && loss[0] > 0);
    EXPECT_EQ(io::read_run_column(file, g + "/tokens"), std::vector<double>{2 * 4 * 16}) << g;
  }
  EXPECT_TRUE(io::read_run_attribute(file, "eval_recipe:nvfp4-no-rht-all").has_value());
  // The trainer's rows are untouched; a second evaluation adds a row.
  EXPECT_EQ(io::read_run_column(file, "/eval/step"), (std::vector<double>{2, 4}));
  r = run({kExmy, "eval", d / "run/checkpoints/step_00000004.h5", "--recipe", "nvfp4-no-rht-all"});
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(io::read_run_column(file, "/eval/nvfp4-no-rht-all/current/step"), (std::vector<double>{4, 4}));

  // The fp32 recipe reproduces the training's validation loss.
  r = run({kExmy, "eval", d / "run", "--recipe", "fp32"});
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("(+0.000000)"), std::string::npos) << r.out;
  EXPECT_EQ(io::read_run_column(file, "/eval/fp32/current/loss").back(), io::read_run_column(file, "/eval/loss").back());

  // Another recipe text under the same name is refused; --name files it apart.
  r = run({kExmy, "eval", d / "run", "--recipe", "nvfp4-no-rht-all", "--set", "recipe.keep_first_bf16=1"});
  expect_one_line_error(r, "different recipe text");
  r = run({kExmy, "eval", d / "run", "--recipe", "nvfp4-no-rht-all", "--set", "recipe.keep_first_bf16=1", "--name",
           "nvfp4-first-bf16", "--batches", "1"});
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("10 linears quantized"), std::string::npos) << r.out;
  EXPECT_EQ(io::read_run_column(file, "/eval/nvfp4-first-bf16/current/batches"), std::vector<double>{1});

  // exmy inspect lists the evaluations with their last row.
  {
    const Result ins = run({kExmy, "inspect", file, "--no-config"});
    ASSERT_EQ(ins.status, 0) << ins.out;
    char want[160];
    std::snprintf(want, sizeof want, "  eval nvfp4-no-rht-all/replay:2: %.4f (step 4)\n",
                  io::read_run_column(file, "/eval/nvfp4-no-rht-all/replay:2/loss").back());
    EXPECT_NE(ins.out.find(want), std::string::npos) << want << ins.out;
    EXPECT_NE(ins.out.find("  eval nvfp4-no-rht-all/current: "), std::string::npos) << ins.out;
  }

  // --no-write leaves the file alone.
  r = run({kExmy, "eval", d / "run", "--recipe", "mxfp4", "--no-write"});
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("no tensor scale"), std::string::npos) << r.out;
  const auto sets = io::list_run_datasets(file);
  EXPECT_EQ(std::count_if(sets.begin(), sets.end(), [](const std::string& s) { return s.starts_with("/eval/mxfp4"); }), 0);
}

// eval.recipes / eval.policies switch the quantized evaluation on inside
// `exmy train`: its rows at a validation step equal a standalone `exmy eval`
// of the checkpoint of that step, bit for bit; a bad recipe stops the run
// before it starts.
TEST(CliTrainEval, ConfigKeysRunTheEvaluationAtValidationSteps) {
  TempDir d;
  const std::string dir = d / "run";
  const std::vector<std::string> base = {kExmy, "train", "--config", kTinyIni, "--steps", "4", "--set",
                                         "train.batch_size=4", "--set", "train.seq_len=16", "--set",
                                         "train.eval_batches=2", "--set", "data.synthetic_tokens=8192", "--set",
                                         "train.eval_interval=2", "--set", "train.checkpoint_interval=2", "--set",
                                         "train.keep_checkpoints=4"};
  std::vector<std::string> a = base;
  for (const char* x : {"--out", "", "--set", "eval.recipes=mxfp4", "--set", "eval.policies=current,replay:2"})
    a.push_back(x);
  a[a.size() - 5] = dir;
  Result r = run(a);
  ASSERT_EQ(r.status, 0) << r.out;
  const std::string file = dir + "/run.h5";
  for (const char* p : {"current", "replay:2"})
    EXPECT_EQ(io::read_run_column(file, std::string("/eval/mxfp4/") + p + "/step"), (std::vector<double>{2, 4})) << p;
  const auto in_training = io::read_run_column(file, "/eval/mxfp4/replay:2/loss");
  // The standalone evaluation of the step-2 checkpoint, into a copy.
  fs::copy(dir, d / "copy", fs::copy_options::recursive);
  r = run({kExmy, "eval", d / "copy/checkpoints/step_00000002.h5", "--recipe", "mxfp4", "--policy", "replay:2",
           "--name", "again"});
  ASSERT_EQ(r.status, 0) << r.out;
  const auto standalone = io::read_run_column(d / "copy/run.h5", "/eval/again/replay:2/loss");
  ASSERT_EQ(standalone.size(), 1u);
  ASSERT_EQ(in_training.size(), 2u);
  EXPECT_EQ(std::bit_cast<uint64_t>(standalone[0]), std::bit_cast<uint64_t>(in_training[0]));

  std::vector<std::string> b = base;
  for (const char* x : {"--out", "", "--set", "eval.recipes=nosuch"}) b.push_back(x);
  b[b.size() - 3] = std::string(d / "bad");
  r = run(b);
  expect_one_line_error(r, "unknown recipe 'nosuch'");
  EXPECT_FALSE(fs::exists(d / "bad/run.h5"));
}

// exmy eval takes an HF checkpoint directly (config.json + safetensors):
// a run exported with train.export_hf evaluates to the same loss and the
// same logits (--dump-logits) as its exmy checkpoint; the exported
// config.json is strict JSON with torch_dtype; the shipped transformers
// fixture loads too.
TEST(CliEvalHf, HfCheckpointGivesTheCheckpointsLossAndLogits) {
  TempDir d;
  const Result t = run({kExmy, "train", "--config", kTinyIni, "--out", d / "run", "--steps", "3", "--set",
                        "train.batch_size=4", "--set", "train.seq_len=16", "--set", "train.eval_batches=2", "--set",
                        "train.export_hf=fp32"});
  ASSERT_EQ(t.status, 0) << t.out;
  const std::string cfg_text = read_text(d / "run/hf/config.json");
  nlohmann::json j;
  ASSERT_NO_THROW(j = nlohmann::json::parse(cfg_text)) << cfg_text;  // nlohmann rejects bare Infinity
  EXPECT_EQ(j.value("torch_dtype", ""), "float32");
  EXPECT_EQ(j["time_step_limit"][1]["__float__"], "Infinity");
  const Result a = run({kExmy, "eval", d / "run", "--recipe", "fp32", "--no-write", "--dump-logits", d / "a.npy"});
  ASSERT_EQ(a.status, 0) << a.out;
  const Result b = run({kExmy, "eval", d / "run/hf", "--recipe", "fp32", "--config", d / "run/config.ini",
                        "--dump-logits", d / "b.npy"});
  ASSERT_EQ(b.status, 0) << b.out;
  auto loss_of = [](const std::string& out) {
    const size_t p = out.find("val loss ");
    return p == std::string::npos ? std::string() : out.substr(p, 24);
  };
  EXPECT_FALSE(loss_of(a.out).empty()) << a.out;
  EXPECT_EQ(loss_of(a.out), loss_of(b.out)) << a.out << b.out;
  const std::string la = read_text(d / "a.npy"), lb = read_text(d / "b.npy");
  EXPECT_EQ(la.size(), 128u + 2 * 4 * 16 * 64 * 4);  // header + batches x B x T x vocab float32
  EXPECT_TRUE(la == lb);
  EXPECT_NE(b.out.find("an HF checkpoint has no run file"), std::string::npos) << b.out;
  // The transformers-written fixture (transformers 5, {"__float__": ...}).
  const Result f = run({kExmy, "eval", kSource + "/tests/reference/nemotron_h_tiny", "--recipe", "fp32", "--set",
                        "train.batch_size=2", "--set", "train.seq_len=16", "--set", "data.synthetic_tokens=4096",
                        "--batches", "1", "--dump-logits", d / "f.npy"});
  ASSERT_EQ(f.status, 0) << f.out;
  EXPECT_NE(f.out.find("val loss "), std::string::npos) << f.out;
  // Bad input.
  expect_one_line_error(run({kExmy, "eval", d / "run", "--recipe", "fp32", "--no-write", "--policy", "current",
                             "--policy", "replay:2", "--dump-logits", d / "c.npy"}),
                        "--dump-logits takes one --policy");
  expect_one_line_error(run({kExmy, "eval", d / "run", "--recipe", "fp32", "--config", kTinyIni}),
                        "--config goes with an HF checkpoint");
  fs::create_directories(d / "nohf");
  std::ofstream(d / "nohf/config.json") << "{}";
  expect_one_line_error(run({kExmy, "eval", d / "nohf", "--recipe", "fp32"}), "has no model.safetensors");
}

// --device cuda-emulated: the model on the device backend, every printed
// loss and the logits the CPU's bit for bit. A run trained on a device is
// evaluated on the CPU unless --device says otherwise.
TEST_F(Runs, EvalOnEmulatedDeviceGivesTheCpuLines) {
  auto loss_lines = [](const std::string& out) {
    std::string v;
    std::istringstream in(out);
    for (std::string line; std::getline(in, line);)
      if (line.find("val loss ") != std::string::npos) v += line + "\n";
    return v;
  };
  TempDir d;
  std::string lines[2];
  int i = 0;
  for (const char* device : {"cpu", "cuda-emulated"}) {
    const Result r = run({kExmy, "eval", quant_dir(), "--recipe", "nvfp4-no-rht-all", "--policy", "current", "--policy",
                          "calibrated:4", "--policy", "replay:2", "--no-write", "--device", device});
    ASSERT_EQ(r.status, 0) << r.out;
    EXPECT_NE(r.out.find(std::string(" threads, ") + device + "\n"), std::string::npos) << r.out;
    lines[i++] = loss_lines(r.out);
    const Result l = run({kExmy, "eval", quant_dir(), "--recipe", "te-nvfp4", "--policy", "calibrated:4", "--no-write",
                          "--device", device, "--dump-logits", d / (std::string(device) + ".npy")});
    ASSERT_EQ(l.status, 0) << l.out;
  }
  EXPECT_EQ(count_lines(lines[0]), 3u) << lines[0];
  EXPECT_EQ(lines[0], lines[1]);
  const std::string la = read_text(d / "cpu.npy"), lb = read_text(d / "cuda-emulated.npy");
  EXPECT_GT(la.size(), 128u);
  EXPECT_TRUE(la == lb);

  // trained on cuda-emulated, evaluated without --device: on the CPU, and
  // appended to its run file
  const Result t = run({kExmy, "train", "--config", kTinyIni, "--out", d / "dev", "--device", "cuda-emulated", "--steps",
                        "2", "--set", "train.batch_size=2", "--set", "train.seq_len=16", "--set",
                        "train.eval_batches=1", "--set", "data.synthetic_tokens=8192"});
  ASSERT_EQ(t.status, 0) << t.out;
  const Result c = run({kExmy, "eval", d / "dev", "--recipe", "fp32"});
  ASSERT_EQ(c.status, 0) << c.out;
  EXPECT_NE(c.out.find(" threads, cpu\n"), std::string::npos) << c.out;
  EXPECT_NE(c.out.find("(+0.000000)"), std::string::npos) << c.out;  // the training's validation loss
  const Result e = run({kExmy, "eval", d / "dev", "--recipe", "fp32", "--device", "cuda-emulated", "--no-write"});
  ASSERT_EQ(e.status, 0) << e.out;
  EXPECT_NE(e.out.find(" threads, cuda-emulated\n"), std::string::npos) << e.out;
  EXPECT_EQ(loss_lines(c.out), loss_lines(e.out));
}

TEST_F(Runs, EvalErrorsAreOneLine) {
  expect_one_line_error(run({kExmy, "eval", *dir_ / "nothing", "--recipe", "fp32"}), "does not exist");
  expect_one_line_error(run({kExmy, "eval", fp32_dir(), "--recipe", "fp32", "--policy", "replay:0"}),
                        "activation-scale policy");
  expect_one_line_error(run({kExmy, "eval", fp32_dir(), "--recipe", "no-such-recipe"}), "no-such-recipe");
  expect_one_line_error(run({kExmy, "eval", fp32_dir()}), "--recipe");
  expect_one_line_error(run({kExmy, "eval", fp32_dir(), "--recipe", "fp32", "--batches", "1000", "--no-write"}),
                        "validation region");
  expect_one_line_error(run({kExmy, "eval", fp32_dir(), "--recipe", "fp32", "--policy", "calibrated:100000", "--no-write"}),
                        "disjoint training windows");
  expect_one_line_error(run({kExmy, "eval", *dir_ / "fp32/run.h5", "--recipe", "fp32"}), "not an exmy checkpoint");
}

TEST_F(Runs, InspectPrintsTablesAndWritesCsv) {
  TempDir d;
  const Result r = run({kExmy, "inspect", quant_dir() + "/run.h5", "--csv", d / "t.csv"});
  ASSERT_EQ(r.status, 0) << r.out;
  for (const char* needle : {"configuration (resolved)", "recipe = nvfp4-no-rht-all", "train loss: first",
                             "validation loss: final", "steps 4", "worst figures over 3 sampled steps",
                             "layers.0.mixer.in_proj", "fprop-x", "wgrad-dy", "bias (gain-1)", "magnitude bias", "lm_head" /* plan */})
    EXPECT_NE(r.out.find(needle), std::string::npos) << needle << "\n" << r.out;
  const std::string csv = read_text(d / "t.csv");
  // 12 quantized linears: 6 operands x 5 figures, 3 GEMMs x 4 figures
  // (multiplicative and magnitude bias, relative error, cosine).
  EXPECT_EQ(count_lines(csv), 1u + 12 * 6 * 5 + 12 * 3 * 4) << csv.substr(0, 400);
  EXPECT_TRUE(csv.starts_with("table,layer,gemm,operand,statistic,worst,step,last,rows\n"));

  // One figure checked against the run file: the worst underflow fraction of
  // an operand is the largest of its rows.
  const std::string g = "/quant/layers.1.mixer.up_proj/fprop/fprop-x";
  const auto uf = io::read_run_column(quant_dir() + "/run.h5", g + "/underflow_fraction");
  ASSERT_FALSE(uf.empty());
  const double worst = *std::max_element(uf.begin(), uf.end());
  const std::string prefix = "operand,layers.1.mixer.up_proj,fprop,fprop-x,underflow_fraction,";
  const size_t at = csv.find(prefix);
  ASSERT_NE(at, std::string::npos) << csv.substr(0, 400);
  EXPECT_EQ(std::stod(csv.substr(at + prefix.size())), worst);
  EXPECT_GT(worst, 0);  // not vacuous

  // --top keeps the N worst rows of each table.
  const Result top = run({kExmy, "inspect", quant_dir(), "--top", "2", "--no-config"});
  ASSERT_EQ(top.status, 0) << top.out;
  EXPECT_EQ(top.out.find("configuration (resolved)"), std::string::npos);
  EXPECT_LT(count_lines(top.out), 40u) << top.out;
}

TEST_F(Runs, InspectRunWithoutStatistics) {
  TempDir d;
  const Result r = run({kExmy, "inspect", fp32_dir(), "--csv", d / "t.csv"});
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("no per-tensor statistics (no /quant or /gemm group)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("validation loss: final"), std::string::npos) << r.out;
  EXPECT_EQ(read_text(d / "t.csv"), "table,layer,gemm,operand,statistic,worst,step,last,rows\n");
}

TEST_F(Runs, InspectErrorsAreOneLine) {
  expect_one_line_error(run({kExmy, "inspect", *dir_ / "missing.h5"}), "does not exist");
  expect_one_line_error(run({kExmy, "inspect", fp32_dir() + "/checkpoints/step_00000004.h5"}), "checkpoint, not a run file");
  expect_one_line_error(run({kExmy, "inspect", kTinyIni}), "not an HDF5 file");
  // An HDF5 file that is not a run file.
  TempDir d;
  {
    io::RunFile f(d / "other.h5");
    f.append("/x/step", int64_t{1});
    f.close();
  }
  expect_one_line_error(run({kExmy, "inspect", d / "other.h5"}), "not an exmy run file");
  EXPECT_EQ(run({kExmy, "inspect"}).status, 1);
}

bool have_plotting() {
  return fs::exists(kPython) && run({kPython, "-c", "import h5py, matplotlib"}).status == 0;
}

TEST_F(Runs, PlotScriptWritesPngs) {
  if (!have_plotting())
    GTEST_SKIP() << "needs /usr/bin/python3 with h5py and matplotlib (Debian python3-h5py, python3-matplotlib; "
                    "tools/setup.sh installs them)";
  TempDir d;
  const Result r = run({kPython, kSource + "/analysis/plot_runs.py", quant_dir() + "/run.h5", fp32_dir(), "--out",
                        d / "png"});
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("fp32 (fp32): no per-tensor statistics"), std::string::npos) << r.out;
  std::vector<std::string> pngs;
  for (const auto& e : fs::directory_iterator(d / "png")) pngs.push_back(e.path().filename().string());
  std::sort(pngs.begin(), pngs.end());
  EXPECT_EQ(pngs, (std::vector<std::string>{"loss.png", "quant_nvfp4-no-rht-all_range_hist.png",
                                            "quant_nvfp4-no-rht-all_saturation.png",
                                            "quant_nvfp4-no-rht-all_scale_hist.png",
                                            "quant_nvfp4-no-rht-all_underflow.png"}));
  for (const auto& p : pngs) {
    const std::string bytes = read_text(d / "png/" + p);
    EXPECT_GT(bytes.size(), 10000u) << p;
    EXPECT_EQ(bytes.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8)) << p;
  }
  // The printed summary describes what was drawn: the heatmaps' largest
  // values are the largest rows of the run file, the histograms count every
  // block of the sampled steps.
  const std::string file = quant_dir() + "/run.h5";
  double uf_max = -1, sat_max = -1;
  size_t operands = 0;
  for (const auto& ds : io::list_run_datasets(file)) {
    if (!ds.starts_with("/quant/") || !ds.ends_with("/underflow_fraction")) continue;
    ++operands;
    const std::string g = ds.substr(0, ds.size() - std::string("/underflow_fraction").size());
    for (double v : io::read_run_column(file, ds)) uf_max = std::max(uf_max, v);
    const auto sat = io::read_run_column(file, g + "/saturated"), el = io::read_run_column(file, g + "/elements");
    for (size_t i = 0; i < sat.size(); ++i) sat_max = std::max(sat_max, sat[i] / el[i]);
  }
  ASSERT_EQ(operands, 12u * 6u);
  ASSERT_GT(uf_max, 0);
  ASSERT_GT(sat_max, 0);
  char want[200];
  std::snprintf(want, sizeof want, "underflow heatmaps of 12 layers x 3 steps x 6 operands, max %.6g%%", 100 * uf_max);
  EXPECT_NE(r.out.find(want), std::string::npos) << want << "\n" << r.out;
  std::snprintf(want, sizeof want, "saturation heatmaps of 12 layers x 3 steps x 6 operands, max %.6g%%", 100 * sat_max);
  EXPECT_NE(r.out.find(want), std::string::npos) << want << "\n" << r.out;
  EXPECT_NE(r.out.find("block-scale histograms, fprop-x step 1: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("fp32 (fp32): 3 training rows"), std::string::npos) << r.out;

  // Bad input: one line.
  const Result bad = run({kPython, kSource + "/analysis/plot_runs.py", *dir_ / "missing.h5", "--out", d / "x"});
  EXPECT_NE(bad.status, 0);
  EXPECT_EQ(count_lines(bad.out), 1u) << bad.out;
  EXPECT_NE(bad.out.find("does not exist"), std::string::npos) << bad.out;
  // A file that is not HDF5, and a truncated run file.
  const Result notrun = run({kPython, kSource + "/analysis/plot_runs.py", kTinyIni, "--out", d / "x"});
  EXPECT_NE(notrun.status, 0);
  EXPECT_EQ(count_lines(notrun.out), 1u) << notrun.out;
  EXPECT_NE(notrun.out.find("not an HDF5 file"), std::string::npos) << notrun.out;
  {
    const std::string bytes = read_text(file);
    std::ofstream(d / "cut.h5", std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size() / 2));
  }
  const Result cut = run({kPython, kSource + "/analysis/plot_runs.py", d / "cut.h5", "--out", d / "x"});
  EXPECT_NE(cut.status, 0);
  EXPECT_EQ(count_lines(cut.out), 1u) << cut.out;
  EXPECT_NE(cut.out.find("plot_runs.py: error: "), std::string::npos) << cut.out;
  // A run file without training rows is an error, not an empty plot.
  const Result mk = run({kPython, "-c",
                         "import h5py, sys; f = h5py.File(sys.argv[1], 'w'); f.attrs['config'] = 'x'; "
                         "f.attrs['schema_version'] = 2; f.create_dataset('train/step', data=[], dtype='i8')",
                         d / "empty.h5"});
  ASSERT_EQ(mk.status, 0) << mk.out;
  const Result empty = run({kPython, kSource + "/analysis/plot_runs.py", d / "empty.h5", "--out", d / "x"});
  EXPECT_NE(empty.status, 0);
  EXPECT_EQ(count_lines(empty.out), 1u) << empty.out;
  EXPECT_NE(empty.out.find("has no training rows"), std::string::npos) << empty.out;
  // A BF16 run is labelled bf16.
  const Result b16 = run({kExmy, "train", "--config", kTinyIni, "--out", d / "b16", "--steps", "2", "--set",
                          "train.precision=bf16", "--set", "train.batch_size=2", "--set", "train.seq_len=16", "--set",
                          "train.eval_batches=1"});
  ASSERT_EQ(b16.status, 0) << b16.out;
  const Result pb = run({kPython, kSource + "/analysis/plot_runs.py", d / "b16", "--out", d / "b16png"});
  ASSERT_EQ(pb.status, 0) << pb.out;
  EXPECT_NE(pb.out.find("b16 (bf16): 2 training rows"), std::string::npos) << pb.out;
  // --help
  const Result help = run({kPython, kSource + "/analysis/plot_runs.py", "--help"});
  EXPECT_EQ(help.status, 0) << help.out;
  EXPECT_NE(help.out.find("--out"), std::string::npos) << help.out;
}

// analysis/run_digest.py: the same run trained again (on one thread) digests
// to the same lines, run file and checkpoint; a different run does not; the
// wall-clock datasets are the only ones --skip-timing leaves out.
TEST_F(Runs, DigestScriptFindsTheSameBitsInARunTrainedAgain) {
  if (!have_plotting()) GTEST_SKIP() << "needs /usr/bin/python3 with h5py (Debian python3-h5py)";
  TempDir d;
  std::vector<std::string> again = {kExmy, "train", "--config", kTinyIni, "--out", d / "again", "--recipe",
                                    "nvfp4-no-rht-all", "--set", "train.stats_interval=2", "--set", "train.threads=1",
                                    "--steps", "4", "--set", "train.batch_size=4", "--set", "train.seq_len=16",
                                    "--set", "train.eval_batches=2", "--set", "data.synthetic_tokens=8192",
                                    "--set", "train.log_interval=2", "--set", "train.eval_interval=2"};
  const Result t = run(again);
  ASSERT_EQ(t.status, 0) << t.out;
  const std::string script = kSource + "/analysis/run_digest.py";
  auto digest = [&](const std::string& dir, bool skip) {
    std::vector<std::string> argv = {kPython, script, dir + "/run.h5", dir + "/checkpoints/step_00000004.h5"};
    if (skip) argv.push_back("--skip-timing");
    const Result r = run(argv);
    EXPECT_EQ(r.status, 0) << r.out;
    return r.out;
  };
  const std::string a = digest(quant_dir(), true), b = digest(d / "again", true);
  EXPECT_EQ(a, b);
  EXPECT_GT(count_lines(a), 100u);
  EXPECT_NE(a.find("\n/train/loss [3] <f8 "), std::string::npos) << a.substr(0, 2000);
  EXPECT_NE(a.find("\n/params/"), std::string::npos) << "checkpoint parameters";
  // the fp32 run: other losses
  const std::string f = digest(fp32_dir(), true);
  const auto line_of = [](const std::string& text, const std::string& name) {
    const size_t at = text.find("\n" + name + " ");
    return at == std::string::npos ? std::string() : text.substr(at + 1, text.find('\n', at + 1) - at - 1);
  };
  ASSERT_FALSE(line_of(f, "/train/loss").empty()) << f.substr(0, 2000);
  EXPECT_NE(line_of(f, "/train/loss"), line_of(a, "/train/loss"));
  EXPECT_EQ(line_of(f, "/train/step"), line_of(a, "/train/step"));
  // without --skip-timing the wall-clock columns are there, and differ
  const std::string at = digest(quant_dir(), false), bt = digest(d / "again", false);
  EXPECT_FALSE(line_of(at, "/train/elapsed_s").empty()) << at.substr(0, 2000);
  EXPECT_TRUE(line_of(a, "/train/elapsed_s").empty());
  EXPECT_NE(line_of(at, "/train/elapsed_s"), line_of(bt, "/train/elapsed_s"));
  // bad input: one line
  const Result bad = run({kPython, script, *dir_ / "missing.h5"});
  EXPECT_EQ(bad.status, 1) << bad.out;
  EXPECT_EQ(count_lines(bad.out), 1u) << bad.out;
  EXPECT_NE(bad.out.find("run_digest: cannot read"), std::string::npos) << bad.out;
}

// Run files libhdf5 cannot read safely (tests/reference/corrupt/README.md):
// one that makes it loop forever and one that makes it crash give a
// one-line error naming the file, in the idle limit set here, and no CSV;
// the intact file they were made from reads.
TEST(InspectCorrupt, LoopingOrCrashingHdf5LibraryIsAOneLineError) {
  TempDir d;
  const std::string dir = kSource + "/tests/reference/corrupt/";
  for (const char* name : {"heap-loops-libhdf5.h5", "heap-crashes-libhdf5.h5"}) {
    const auto t0 = std::chrono::steady_clock::now();
    // (timeout: a reader without the idle limit would wait forever)
    const Result r =
        run({"timeout", "60", "env", "EXMY_HDF5_IDLE_LIMIT=2", kExmy, "inspect", dir + name, "--csv", d / "t.csv"});
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_EQ(r.status, 1) << name << ": " << r.out;
    EXPECT_EQ(count_lines(r.out), 1u) << r.out;
    EXPECT_NE(r.out.find("exmy: error: cannot read '" + dir + name + "': the HDF5 "), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("corrupt file?)"), std::string::npos) << r.out;
    EXPECT_LT(took, 20.0) << name;
    EXPECT_FALSE(fs::exists(d / "t.csv")) << name;
  }
  const Result loops = run({"env", "EXMY_HDF5_IDLE_LIMIT=2", kExmy, "inspect", dir + "heap-loops-libhdf5.h5"});
  EXPECT_NE(loops.out.find("made no progress on it for 2 s"), std::string::npos) << loops.out;
  const Result ok = run({kExmy, "inspect", dir + "heap-intact.h5", "--csv", d / "t.csv"});
  EXPECT_EQ(ok.status, 0) << ok.out;
  EXPECT_NE(ok.out.find("no per-tensor statistics"), std::string::npos) << ok.out;
  EXPECT_TRUE(fs::exists(d / "t.csv"));
}

}  // namespace
}  // namespace exmy::eval

// `exmy bench train`: forward+backward throughput of a model next to the
// machine's dense float32 GEMM rate measured in the same run. Their ratio is
// the CPU's model FLOPs utilisation (MFU): the model's useful FLOPs (from
// models::flops_per_token, causal attention counted as half of T x T) per
// second over what sim::gemm reaches on a large square product.
//
// With --recipe LIST it compares quantized recipes instead: the
// forward+backward time of each recipe and its ratio to `bf16` measured in
// the same interleaved rounds, and the cost of statistics collection at every
// step (the same recipe with the run file's statistics sink on, rows flushed
// after every pass, against statistics off).
//
// --device cuda[:N] (or cuda-emulated) times the same passes on the device
// backend (sim/train/training_device.hpp), each pass waited for; the
// reference rates are then cuBLASLt's FP32 and BF16 GEMMs on the device
// (sim::gemm's for cuda-emulated), and the recipes the device does not run
// yet are listed as such instead of timed.
//
// Started by mpirun or srun with N > 1 ranks it times the data-parallel
// training step instead: `exmy train`'s own step (train::TimedSteps: the
// global batch's micro-batches split over the ranks, the gradient sums
// chained in rank order, the sharded AdamW update) on N ranks, alternated
// with rank 0 stepping the same global batch alone on a 1-rank
// communicator while the other ranks wait, so that the scaling t1/tN is a
// ratio measured in one run.
#include <omp.h>

#include <algorithm>
#include <boost/program_options.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <unistd.h>
#include <iostream>
#include <random>
#include <sstream>
#include <thread>

#include "formats/error.hpp"
#include "formats/launch_profile.hpp"
#include "models/config.hpp"
#include "models/nemotron_h.hpp"
#include "sim/cli/cli_support.hpp"
#include "sim/parallel.hpp"
#include "sim/sysmem.hpp"
#include "sim/cli/commands.hpp"
#include "sim/dist/comm.hpp"
#include "sim/gemm.hpp"
#include "sim/io/run_file.hpp"
#include "sim/linear.hpp"
#include "sim/quant/quantized_linear.hpp"
#include "sim/tensor.hpp"
#include "sim/train/quant_io.hpp"
#include "sim/train/run_config.hpp"
#include "sim/train/trainer.hpp"
#include "sim/train/training_device.hpp"

#if defined(EXMY_HAVE_CUDA)
#include "sim/cuda/gemm_cuda.hpp"
#endif

namespace po = boost::program_options;

namespace exmy::cli {
namespace {

using Clock = std::chrono::steady_clock;

double seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

// sim::gemm on an n x n x n float32 product: the machine's dense GEMM rate
// as exmy computes it (the same tiles and Eigen kernels the model uses).
struct DenseGemm {
  int64_t n;
  sim::Buf<float> a, b, c;
  explicit DenseGemm(int64_t n_) : n(n_), a(static_cast<size_t>(n * n)), b(a.size()), c(a.size()) {
    std::mt19937 g(1);
    std::uniform_real_distribution<float> u(-1, 1);
    for (auto& x : a) x = u(g);
    for (auto& x : b) x = u(g);
  }
  double seconds_once() {
    const auto t0 = Clock::now();
    sim::gemm(c.data(), n, a.data(), n, sim::Op::N, b.data(), n, sim::Op::N, n, n, n, false);
    return seconds(t0, Clock::now());
  }
  double gflops(double s) const { return 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n) / s / 1e9; }
};

// The dense GEMM rate on a CUDA device: cuBLASLt on n x n x n operands in
// FP32 (no TF32) or BF16 (FP32 accumulation), each call waited for.
struct DeviceGemmRate {
#if defined(EXMY_HAVE_CUDA)
  int64_t n;
  sim::GemmOperands kind;
  sim::CudaGemm gemm;
  sim::MemBuf<float> a, b, c;
  DeviceGemmRate(sim::Memory& m, int64_t n_, sim::GemmOperands k)
      : n(n_), kind(k), a(m, n_ * n_), b(m, n_ * n_), c(m, n_ * n_) {}  // zeros: the rate does not depend on values
  double seconds_once() {
    a.memory().synchronize();
    const auto t0 = Clock::now();
    gemm.run(c.data(), n, a.data(), n, sim::Op::N, b.data(), n, sim::Op::N, n, n, n, false, kind);
    a.memory().synchronize();
    return seconds(t0, Clock::now());
  }
  double gflops(double s) const {
    return 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n) / s / 1e9;
  }
#endif
};

const char* const kDefaultRecipes = "bf16,te-nvfp4,nvfp4-no-rht-all,ue5m3-b16,ue5m3-b16-fp32gemm,mxfp4";

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> v;
  std::stringstream ss(s);
  for (std::string p; std::getline(ss, p, ',');)
    if (!p.empty()) v.push_back(p);
  return v;
}

// --profile: one more pass, with every kernel launch and GEMM timed under
// its name (formats/launch_profile.hpp), printed as a table.
template <class Pass>
void print_launch_profile(const std::string& label, Pass&& pass) {
  launch_profile_start();
  double s = 0;
  try {
    s = pass();
  } catch (...) {
    launch_profile_stop();
    throw;
  }
  const std::vector<LaunchProfileRow> rows = launch_profile_stop();
  // Every name (a pass has a few dozen): a cheap launch called often, or a
  // short one that should not be there, is what a profile is read for.
  std::printf("\nlaunch profile of one %s pass (%.2f ms with every launch timed):\n%s", label.c_str(), s * 1e3,
              launch_profile_table(rows, s * 1e3, static_cast<int>(rows.size())).c_str());
}

// One model per (recipe, statistics on/off), all from the same weights.
struct RecipeRun {
  std::string label;  // recipe name, "+stats" for the statistics variant
  sim::quant::Recipe recipe;
  bool stats = false;
  bool quantized = false;
  std::shared_ptr<sim::quant::QuantRuntime> rt;
  std::unique_ptr<sim::quant::RecipeLinearFactory> factory;
  std::unique_ptr<models::NemotronH<float>> model;
  std::unique_ptr<io::RunFile> file;  // statistics variant: a scratch run file
  std::unique_ptr<train::RunFileStatsSink> sink;
  std::vector<double> times, flush_times;  // forward+backward; the statistics variant's flush of its rows
  double best() const { return *std::min_element(times.begin(), times.end()); }
  double mean() const {
    double s = 0;
    for (double t : times) s += t;
    return s / static_cast<double>(times.size());
  }
};

// n random tokens and targets of cfg's vocabulary (the same for every run).
void random_tokens(const models::NemotronHConfig& cfg, int64_t n, std::vector<int32_t>& tokens,
                   std::vector<int32_t>& targets) {
  tokens.resize(static_cast<size_t>(n));
  targets.resize(tokens.size());
  std::mt19937 g(7);
  for (size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = static_cast<int32_t>(g() % static_cast<uint32_t>(cfg.vocab_size));
    targets[i] = static_cast<int32_t>(g() % static_cast<uint32_t>(cfg.vocab_size));
  }
}

// The table of bench_recipes: each row against bf16, and each +stats row
// against its recipe without statistics.
void print_recipe_table(const std::vector<RecipeRun>& runs, int64_t B, int64_t T, int steps) {
  const RecipeRun& ref = *std::find_if(runs.begin(), runs.end(), [](const RecipeRun& r) { return r.label == "bf16"; });
  std::printf("\n%-28s %-8s %10s %10s %9s %9s %12s %9s %9s %10s\n", "recipe", "GEMM", "best ms", "tokens/s", "x bf16",
              "(mean)", "stats extra", "(mean)", "(median)", "flush ms");
  for (const auto& r : runs) {
    const char* gemm = r.quantized ? (r.recipe.gemm.kind == sim::quant::GemmModel::Kind::grouped ? "grouped" : "fp32")
                                   : "-";
    char extra[32] = "", extra_mean[32] = "", extra_median[32] = "", flush[32] = "";
    if (r.stats) {
      double fb = 1e30;
      for (size_t i = 1; i < r.flush_times.size(); ++i) fb = std::min(fb, r.flush_times[i]);  // not the warm-up's
      std::snprintf(flush, sizeof flush, "%.1f", fb * 1e3);
      const auto off = std::find_if(runs.begin(), runs.end(),
                                    [&](const RecipeRun& o) { return !o.stats && o.recipe.name == r.recipe.name; });
      std::snprintf(extra, sizeof extra, "%+.1f%%", 100.0 * (r.best() / off->best() - 1));
      std::snprintf(extra_mean, sizeof extra_mean, "%+.1f%%", 100.0 * (r.mean() / off->mean() - 1));
      // Round by round, against the pass without statistics that ran just
      // before it: a slow spell of the machine hits both, and the median
      // drops the rounds one of them caught alone.
      std::vector<double> ratio;
      for (size_t i = 0; i < r.times.size(); ++i) ratio.push_back(r.times[i] / off->times[i]);
      std::sort(ratio.begin(), ratio.end());
      const size_t m = ratio.size() / 2;
      const double med = ratio.size() % 2 ? ratio[m] : 0.5 * (ratio[m - 1] + ratio[m]);
      std::snprintf(extra_median, sizeof extra_median, "%+.1f%%", 100.0 * (med - 1));
    }
    std::printf("%-28s %-8s %10.1f %10.0f %8.2fx %8.2fx %12s %9s %9s %10s\n", r.label.c_str(), gemm, r.best() * 1e3,
                static_cast<double>(B * T) / r.best(), r.best() / ref.best(), r.mean() / ref.mean(), extra,
                extra_mean, extra_median, flush);
  }
  std::printf("\n(a pass = forward + backward with the recipe; %d rounds after a warm-up, each running every row\n"
              "once; best times give the main columns, means the bracketed ones, and (median) the median over\n"
              "the rounds of each +stats pass against the pass without statistics just before it. +stats:\n"
              "statistics of every operand and GEMM recorded as run-file rows; `flush ms` writes one pass's rows\n"
              "to the file (the trainer flushes at each logging step), not counted in the pass. Targets: FP4\n"
              "recipes <= 1.5x bf16 with fp32 GEMM output, <= 3x with grouped; statistics at every step\n"
              "<= +10%%.)\n",
              steps);
}

int bench_recipes(train::TrainingDevice& td, const models::NemotronHConfig& cfg, int64_t B, int64_t T, int steps,
                  const std::string& list, const std::string& stats_list, const sim::quant::RuntimeOptions& rt_opt,
                  bool profile) {
  const std::vector<std::string> names = split_list(list);
  if (names.empty()) throw Error("--recipe: empty list");
  if (std::find(names.begin(), names.end(), "bf16") == names.end())
    throw Error("--recipe: the list must hold bf16 (the reference of the ratios)");
  std::vector<std::string> with_stats;
  if (stats_list == "all") {
    with_stats = names;
  } else if (stats_list != "none") {
    with_stats = split_list(stats_list);
    for (const auto& n : with_stats)
      if (std::find(names.begin(), names.end(), n) == names.end())
        throw Error("--stats: '" + n + "' is not in --recipe");
  }
  std::printf("exmy bench train --recipe: %s (%.1fM parameters), batch %lld x seq %lld, %d threads (%u hardware), "
              "device %s, fp32 model GEMMs: %s\n",
              cfg.name.c_str(), static_cast<double>(models::parameter_count(cfg)) / 1e6, static_cast<long long>(B),
              static_cast<long long>(T), omp_get_max_threads(), std::thread::hardware_concurrency(),
              sim::device_name(td.device()).c_str(),
              rt_opt.fp32_gemm == sim::quant::Fp32Gemm::bf16 ? "bf16 where bfloat16 holds the encoded operands"
                                                            : "sgemm");
  std::vector<int32_t> tokens, targets;
  random_tokens(cfg, B * T, tokens, targets);
  namespace fs = std::filesystem;
  const fs::path scratch = fs::temp_directory_path() / ("exmy-bench-stats-" + std::to_string(::getpid()));
  std::vector<RecipeRun> runs;
  std::vector<std::string> not_here;  // recipes the device does not run yet, with the reason
  auto add = [&](const std::string& name, bool stats) {
    RecipeRun r;
    r.recipe = sim::quant::load_recipe(name);
    r.label = name + (stats ? " +stats" : "");
    r.stats = stats;
    r.rt = std::make_shared<sim::quant::QuantRuntime>(rt_opt);
    r.rt->set_ops(td.quant_ops());
    try {
      r.factory = std::make_unique<sim::quant::RecipeLinearFactory>(
          r.recipe, cfg.num_hidden_layers, r.rt, td.on_device() ? td.plain_linears(r.recipe.unquantized) : nullptr);
      r.model = std::make_unique<models::NemotronH<float>>(cfg, *r.factory, td.backend());
    } catch (const Error& e) {
      if (!td.on_device() || name == "bf16") throw;
      if (!stats) not_here.push_back(name + ": " + e.what());
      return;
    }
    r.model->init_weights(1);
    for (const auto& e : r.factory->plan()) r.quantized |= e.quantized;
    if (stats) {
      if (!r.quantized) return;  // nothing to record
      fs::create_directories(scratch);
      r.file = std::make_unique<io::RunFile>((scratch / (name + ".h5")).string());
      r.sink = std::make_unique<train::RunFileStatsSink>(*r.file);
      r.sink->declare(r.factory->plan());
      r.file->start_swmr();
      r.rt->set_stats_sink(r.sink.get());
    }
    runs.push_back(std::move(r));
  };
  for (const auto& n : names) {
    add(n, false);
    if (std::find(with_stats.begin(), with_stats.end(), n) != with_stats.end()) add(n, true);
  }
  int64_t step = 1;
  auto pass = [&](RecipeRun& r) {
    const auto t0 = Clock::now();
    r.rt->begin({step, 0, r.stats, false});
    r.model->arena().zero_grad();
    r.model->forward(tokens.data(), targets.data(), B, T);
    r.model->backward();
    r.rt->finish();
    td.memory().synchronize();
    const auto t1 = Clock::now();
    // The trainer writes the rows at its logging steps (train.log_interval);
    // here after every pass, timed apart.
    if (r.file) {
      r.file->flush();
      r.flush_times.push_back(seconds(t1, Clock::now()));
    }
    return seconds(t0, t1);
  };
  // Warm-up (step 1: periodic references sample here), then rounds that
  // interleave every configuration, so a busy spell hits all of them.
  for (auto& r : runs) pass(r);
  for (int s = 0; s < steps; ++s) {
    ++step;
    for (auto& r : runs) r.times.push_back(pass(r));
  }
  for (auto& r : runs)
    if (r.file) r.file->close();
  std::error_code ec;
  fs::remove_all(scratch, ec);

  print_recipe_table(runs, B, T, steps);
  for (const auto& n : not_here) std::printf("not on %s yet: %s\n", sim::device_name(td.device()).c_str(), n.c_str());
  if (profile) {
    for (auto& r : runs) {
      if (r.file) continue;  // (closed above; the +stats rows' launches are the recipe's plus the statistics')
      ++step;
      print_launch_profile(r.label, [&] { return pass(r); });
    }
  }
  return 0;
}

// One precision policy's model and its pass times.
struct PrecisionRun {
  std::string policy;
  std::unique_ptr<sim::LinearFactory<float>> factory;
  std::unique_ptr<models::NemotronH<float>> model;
  double best = 1e30, total = 0;
};

#if defined(EXMY_HAVE_CUDA)
// bench_precisions on a CUDA device: the passes against cuBLASLt's dense
// FP32 and BF16 GEMM rates on the same device, in interleaved rounds.
template <class Pass>
int device_precisions(train::TrainingDevice& td, std::vector<PrecisionRun>& runs, Pass pass, double flops_tok,
                      int64_t B, int64_t T, int steps, int64_t n, bool profile) {
  DeviceGemmRate f32(td.memory(), n, sim::GemmOperands::fp32), b16(td.memory(), n, sim::GemmOperands::bf16);
  f32.seconds_once(), b16.seconds_once();
  for (auto& r : runs) pass(*r.model);
  double f32_best = 1e30, b16_best = 1e30;
  for (int s = 0; s < steps; ++s) {
    f32_best = std::min(f32_best, f32.seconds_once());
    b16_best = std::min(b16_best, b16.seconds_once());
    for (auto& r : runs) {
      const double dt = pass(*r.model);
      r.best = std::min(r.best, dt);
      r.total += dt;
    }
  }
  const double g32 = f32.gflops(f32_best), g16 = b16.gflops(b16_best);
  std::printf("dense GEMM on the device (cuBLASLt %lld^3): FP32 %.1f TFLOP/s, BF16 %.1f TFLOP/s (best of %d)\n\n",
              static_cast<long long>(n), g32 / 1e3, g16 / 1e3, steps);
  std::printf("%-9s %10s %10s %10s %12s %12s\n", "precision", "best ms", "tokens/s", "TFLOP/s", "of FP32 GEMM",
              "of BF16 GEMM");
  for (const auto& r : runs) {
    const double tps = static_cast<double>(B * T) / r.best;
    const double gf = flops_tok * tps / 1e9;
    std::printf("%-9s %10.1f %10.0f %10.2f %11.1f%% %11.1f%%\n", r.policy.c_str(), r.best * 1e3, tps, gf / 1e3,
                100.0 * gf / g32, 100.0 * gf / g16);
  }
  std::printf("\n(a pass = forward + backward on the device, waited for; %d rounds after a warm-up; TFLOP/s counts\n"
              "the model's FLOPs. Target: the bf16 pass at >= 35%% of the BF16 GEMM rate on proxy-350m at seq 4096.)\n",
              steps);
  if (profile)
    for (auto& r : runs) print_launch_profile(r.policy, [&] { return pass(*r.model); });
  return 0;
}
#endif

// The MFU: a pass of each precision policy against the dense float32 GEMM
// rate (sim::gemm on n x n x n), in interleaved rounds.
int bench_precisions(train::TrainingDevice& td, const models::NemotronHConfig& cfg, int64_t B, int64_t T, int steps,
                     const std::string& precisions, int64_t n, bool profile) {
  const double flops_tok = models::flops_per_token(cfg, T).training();
  std::printf("exmy bench train: %s (%.1fM parameters), batch %lld x seq %lld, %d threads (%u hardware), device %s\n",
              cfg.name.c_str(), static_cast<double>(models::parameter_count(cfg)) / 1e6, static_cast<long long>(B),
              static_cast<long long>(T), omp_get_max_threads(), std::thread::hardware_concurrency(),
              sim::device_name(td.device()).c_str());
  std::printf("model FLOPs per token (forward + backward): %.3f MFLOP\n", flops_tok / 1e6);
  std::vector<int32_t> tokens, targets;
  random_tokens(cfg, B * T, tokens, targets);
  using Run = PrecisionRun;
  std::vector<Run> runs;
  std::stringstream ss(precisions);
  for (std::string p; std::getline(ss, p, ',');) {
    Run r;
    r.policy = p;
    r.factory = td.plain_linears(p);
    r.model = std::make_unique<models::NemotronH<float>>(cfg, *r.factory, td.backend());
    r.model->set_bf16_activations(p == "bf16");
    r.model->init_weights(1);
    runs.push_back(std::move(r));
  }
  auto pass = [&](models::NemotronH<float>& m) {
    const auto t0 = Clock::now();
    m.arena().zero_grad();
    m.forward(tokens.data(), targets.data(), B, T);
    m.backward();
    td.memory().synchronize();
    return seconds(t0, Clock::now());
  };
#if defined(EXMY_HAVE_CUDA)
  if (td.device().is_cuda()) return device_precisions(td, runs, pass, flops_tok, B, T, steps, n, profile);
#endif
  DenseGemm dense(n);
  dense.seconds_once();  // warm-up: first touch of the matrices
  for (auto& r : runs) pass(*r.model);  // warm-up: allocation and first touch
  // Rounds interleave the reference GEMM with each policy's pass, so that a
  // busy spell on a shared machine hits both sides of the ratio; the best
  // time of each is the least disturbed one.
  double gemm_best = 1e30, gemm_total = 0;
  for (int s = 0; s < steps; ++s) {
    const double gs = dense.seconds_once();
    gemm_best = std::min(gemm_best, gs);
    gemm_total += gs;
    for (auto& r : runs) {
      const double dt = pass(*r.model);
      r.best = std::min(r.best, dt);
      r.total += dt;
    }
  }
  const double gemm = dense.gflops(gemm_best), gemm_mean = dense.gflops(gemm_total / steps);
  std::printf("dense float32 GEMM (sim::gemm %lld^3): best %.1f GFLOP/s, mean %.1f GFLOP/s\n\n",
              static_cast<long long>(n), gemm, gemm_mean);
  std::printf("%-9s %10s %10s %10s %9s %11s\n", "precision", "best ms", "tokens/s", "GFLOP/s", "of GEMM",
              "(mean: %)");
  for (const auto& r : runs) {
    const double tps = static_cast<double>(B * T) / r.best;
    const double gf = flops_tok * tps / 1e9;
    const double gf_mean = flops_tok * static_cast<double>(B * T) / (r.total / steps) / 1e9;
    std::printf("%-9s %10.1f %10.0f %10.1f %8.1f%% %10.1f%%\n", r.policy.c_str(), r.best * 1e3, tps, gf,
                100.0 * gf / gemm, 100.0 * gf_mean / gemm_mean);
  }
  std::printf("\n(a pass = forward + backward; %d rounds after a warm-up, each timing the GEMM once and every\n"
              "policy once; best times give the main columns, means the last; GFLOP/s counts the model's FLOPs)\n",
              steps);
  if (profile)
    for (auto& r : runs) print_launch_profile(r.policy, [&] { return pass(*r.model); });
  return 0;
}

// The data-parallel step on the job's N ranks against the same global batch
// on rank 0 alone (the file's comment). Every rank parses the same options,
// so their errors are collective: rank 0 prints the line.
int bench_ranks(dist::Comm& world, const po::variables_map& vm) {
  const int N = world.size(), me = world.rank();
  auto refuse = [](const std::string& what) {
    throw dist::CollectiveError(what + " (exmy bench train on ranks times exmy train's data-parallel step on the CPU)");
  };
  if (vm.count("device")) refuse("--device: not on ranks");
  for (const char* o : {"gemm-size", "stats", "gemm-stats-rows", "gemm-stats-sample", "profile"})
    if (!vm[o].defaulted()) refuse(std::string("--") + o + ": not on ranks");
  std::string precision = "fp32";
  if (!vm["precision"].defaulted()) {
    precision = vm["precision"].as<std::string>();
    if (split_list(precision).size() != 1) refuse("--precision: one policy on ranks, not '" + precision + "'");
  }
  std::string recipe;
  if (vm.count("recipe")) {
    recipe = vm["recipe"].as<std::string>();
    if (split_list(recipe).size() != 1) refuse("--recipe: one recipe on ranks, not '" + recipe + "'");
  }
  const int64_t T = vm["seq-len"].as<int64_t>(), B = vm["batch"].as<int64_t>();
  const int64_t G = vm.count("grad-accum") ? vm["grad-accum"].as<int64_t>() : N;
  const int steps = vm["steps"].as<int>();
  if (T <= 0 || B <= 0 || G <= 0 || steps <= 0)
    throw dist::CollectiveError("--seq-len, --batch, --grad-accum and --steps must be positive");
  // The run configuration of both: the options, then --set (any run
  // configuration key), then what a timing run needs (no statistics,
  // evaluation or checkpoints; train.steps: the warm-up and the rounds).
  std::vector<std::string> sets = {"model.name=" + vm["model"].as<std::string>(),
                                   "train.batch_size=" + std::to_string(B),
                                   "train.seq_len=" + std::to_string(T),
                                   "train.grad_accum=" + std::to_string(G),
                                   "train.threads=" + std::to_string(vm["threads"].as<int>()),
                                   "train.precision=" + precision,
                                   // validation windows of one micro-batch in the 5% held out
                                   "data.synthetic_tokens=" + std::to_string(std::max<int64_t>(262144, 40 * B * (T + 1)))};
  if (!recipe.empty()) sets.push_back("train.recipe=" + recipe);
  if (vm.count("set"))
    for (const auto& s : vm["set"].as<std::vector<std::string>>()) sets.push_back(s);
  for (const std::string s : {"train.steps=" + std::to_string(steps + 1), std::string("train.stats_interval=0"),
                              std::string("train.capture_step=0"), std::string("train.eval_interval=0"),
                              std::string("train.keep_checkpoints=0")})
    sets.push_back(s);
  train::RunConfig cfg;
  try {
    cfg = train::load_run_config("", sets);
  } catch (const dist::CollectiveError&) {
    throw;
  } catch (const Error& e) {
    throw dist::CollectiveError(e.what());
  }
  if (!cfg.device.is_cpu()) refuse("train.device = " + sim::device_name(cfg.device) + ": not on ranks");
  if (cfg.grad_accum % N != 0)
    throw dist::CollectiveError("--grad-accum " + std::to_string(cfg.grad_accum) + " micro-batches do not divide among " +
                                std::to_string(N) + " ranks (give a multiple of " + std::to_string(N) + ")");
  // Every rank holds its N-rank model; rank 0 the 1-rank one besides.
  train::require_training_memory(cfg, N);
  if (me == 0) {
    const bool recompute = cfg.recompute == "blocks";
    const double both = train::rank_training_memory(cfg.model, B, T, recompute, train::rank_plan(cfg, N)).total() +
                        train::rank_training_memory(cfg.model, B, T, recompute, train::rank_plan(cfg, 1)).total();
    sim::require_memory(both, "exmy bench train on rank 0 (" + cfg.model_name + " on " + std::to_string(N) +
                                  " ranks and alone, micro-batch " + std::to_string(B) + " x " + std::to_string(T) + ")",
                        "lower --batch or --seq-len");
  }

  train::TimedSteps ranks(cfg, &world);
  std::unique_ptr<train::TimedSteps> alone;
  if (me == 0) alone = std::make_unique<train::TimedSteps>(cfg, nullptr);
  // Rounds after a warm-up: the N-rank step (its time: the slowest rank's),
  // then rank 0's step alone while the others wait at the barrier, whose
  // polling sleeps and leaves the cores to rank 0.
  std::vector<double> tN, t1;
  double rank0_s = 0, rank0_comm_s = 0;
  for (int round = 0; round <= steps; ++round) {
    world.barrier();
    const train::TimedSteps::Timing d = ranks.step();
    double slowest = d.seconds;
    world.max(std::span<double>(&slowest, 1));
    const double a = me == 0 ? alone->step().seconds : 0;
    world.barrier();
    if (round == 0) continue;
    tN.push_back(slowest);
    t1.push_back(a);
    rank0_s += d.seconds;
    rank0_comm_s += d.comm_seconds;
  }
  if (me != 0) return 0;

  const auto best = [](const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); };
  const auto mean = [](const std::vector<double>& v) {
    double s = 0;
    for (const double x : v) s += x;
    return s / static_cast<double>(v.size());
  };
  const double tokens = static_cast<double>(cfg.tokens_per_step());
  std::printf("exmy bench train on %d ranks: %s (%.2fM parameters), global batch %lld micro-batches x %lld x seq %lld "
              "(%lld per rank), %s, recipe %s, %d threads per rank (%u hardware), AdamW state %s\n",
              N, cfg.model_name.c_str(), static_cast<double>(models::parameter_count(cfg.model)) / 1e6,
              static_cast<long long>(cfg.grad_accum), static_cast<long long>(cfg.batch_size),
              static_cast<long long>(cfg.seq_len), static_cast<long long>(cfg.grad_accum / N), cfg.precision.c_str(),
              cfg.recipe.name.c_str(), omp_get_max_threads(), std::thread::hardware_concurrency(),
              cfg.shard_optimizer ? "sharded" : "on every rank");
  std::printf("\n%-6s %10s %10s %10s %14s\n", "ranks", "best ms", "mean ms", "tokens/s", "comm (rank 0)");
  std::printf("%-6d %10.1f %10.1f %10.0f %14s\n", 1, best(t1) * 1e3, mean(t1) * 1e3, tokens / best(t1), "-");
  char share[32];
  std::snprintf(share, sizeof share, "%.1f%%", rank0_s > 0 ? 100.0 * rank0_comm_s / rank0_s : 0.0);
  std::printf("%-6d %10.1f %10.1f %10.0f %14s\n", N, best(tN) * 1e3, mean(tN) * 1e3, tokens / best(tN), share);
  const double scaling = best(t1) / best(tN), scaling_mean = mean(t1) / mean(tN);
  // Round by round, t1 against the N-rank step just before it: the median
  // drops the rounds a busy spell of a shared machine caught on one side.
  std::vector<double> ratio;
  for (size_t i = 0; i < t1.size(); ++i) ratio.push_back(t1[i] / tN[i]);
  std::sort(ratio.begin(), ratio.end());
  const size_t m = ratio.size() / 2;
  const double scaling_median = ratio.size() % 2 ? ratio[m] : 0.5 * (ratio[m - 1] + ratio[m]);
  std::printf("\nscaling t1/t%d: %.2fx, efficiency %.1f%% (means: %.2fx, %.1f%%; median of the rounds: %.2fx, "
              "%.1f%%)\n",
              N, scaling, 100.0 * scaling / N, scaling_mean, 100.0 * scaling_mean / N, scaling_median,
              100.0 * scaling_median / N);
  std::printf("\n(a step = exmy train's optimizer step of the global batch: forward + backward of its %lld micro-batches,\n"
              "the gradient sum chained through the ranks in rank order, the AdamW update; %d rounds after a warm-up,\n"
              "each timing the %d-rank step, then rank 0 stepping the same global batch alone on a 1-rank\n"
              "communicator while the other ranks wait; best times give the main columns; the %d-rank time is the\n"
              "slowest rank's; comm: the share of rank 0's %d-rank step time in the job's collectives, waits for the\n"
              "slower ranks included, as exmy train's summary reports it; the median is that of each round's t1/t%d)\n",
              static_cast<long long>(cfg.grad_accum), steps, N, N, N, N);
  return 0;
}

po::options_description bench_train_options() {
  po::options_description desc(
      "exmy bench train: forward+backward throughput of a Nemotron-H model and its ratio to the\n"
      "machine's dense float32 GEMM rate (the CPU MFU)\n\n"
      "usage: exmy bench train [--model proxy-50m] [--seq-len 512] [--batch 4] [--steps 3] [--threads T]\n"
      "       exmy bench train --recipe [LIST] [--stats LIST|all|none] [...]: quantized recipes against bf16\n"
      "       mpirun -np N exmy bench train --threads 1 [--grad-accum G] [--precision P] [--recipe NAME] [...]:\n"
      "         exmy train's data-parallel step of G micro-batches (default N) on N ranks against the same\n"
      "         global batch on 1 rank, alternated in one run: step times, tokens/s, rank 0's communication\n"
      "         share, the scaling t1/tN and its efficiency (rank 0 prints; docs/training.md \"Data-parallel runs\")\n"
      "\noptions");
  // clang-format off
  desc.add_options()
    ("help,h", "show this help")
    ("model", po::value<std::string>()->default_value("proxy-50m"), "preset or config.json")
    ("set", po::value<std::vector<std::string>>()->composing(), "override a model field: model.FIELD=VALUE "
     "(on ranks: any run configuration key, e.g. train.shard_optimizer=off)")
    ("seq-len", po::value<int64_t>()->default_value(512), "sequence length")
    ("batch", po::value<int64_t>()->default_value(4), "sequences per forward/backward")
    ("steps", po::value<int>()->default_value(3), "timed rounds (each: the reference GEMM once, every precision once; "
     "on ranks: the N-rank step once, the 1-rank step once)")
    ("grad-accum", po::value<int64_t>(), "on ranks: micro-batches of --batch sequences per optimizer step, all ranks "
     "together (a multiple of N; default N)")
    ("precision", po::value<std::string>()->default_value("fp32,bf16"), "comma-separated precision policies (on "
     "ranks: one, default fp32)")
    ("gemm-size", po::value<int64_t>()->default_value(2048), "edge of the reference square GEMM")
    ("recipe", po::value<std::string>()->implicit_value(kDefaultRecipes),
     "compare recipes (comma-separated names or .ini files, must include bf16) instead of the MFU; "
     "alone: bf16,te-nvfp4,nvfp4-no-rht-all,ue5m3-b16,ue5m3-b16-fp32gemm,mxfp4")
    ("gemm-stats-rows", po::value<int64_t>()->default_value(sim::quant::RuntimeOptions{}.gemm_stats_rows),
     "with --stats: GEMM statistics compare at most this many output rows (train.gemm_stats_rows; 0: all)")
    ("gemm-stats-sample", po::value<int64_t>()->default_value(sim::quant::RuntimeOptions{}.gemm_stats_sample),
     "with --stats: one output row in this many (train.gemm_stats_sample)")
    ("fp32-gemm", po::value<std::string>()->default_value("auto"),
     "with --recipe: how the fp32 GEMM output model runs: sgemm, bf16 or auto (train.fp32_gemm)")
    ("stats", po::value<std::string>()->default_value("all"),
     "with --recipe: recipes also timed with statistics at every step (comma-separated, all, none)")
    ("threads", po::value<int>()->default_value(0), "OpenMP threads (0: OpenMP's default); on ranks, per rank")
    ("device", po::value<std::string>(), "cpu, cuda, cuda:N or cuda-emulated: where the passes run (on a device, "
     "against its cuBLASLt FP32 and BF16 GEMM rates)")
    ("profile", po::bool_switch(), "after the rounds, one more pass of each configuration with every kernel launch "
     "and GEMM timed (on the CPU: every layer call, linear GEMM and quantizer call), printed per name: where the "
     "pass's time goes");
  // clang-format on
  return desc;
}

}  // namespace

int cmd_bench_train(const Args& args) {
  po::options_description desc = bench_train_options();
  po::variables_map vm;
  if (parse_or_help(args, desc, {}, vm)) return 0;
  // Started by mpirun or srun with several ranks: the data-parallel step.
  if (dist::Comm& world = dist::world(); world.size() > 1) return bench_ranks(world, vm);
  if (vm.count("grad-accum"))
    throw Error("--grad-accum: only on ranks (mpirun -np N exmy bench train ...; exmy train's train.grad_accum)");
  const std::string device = training_device_option(vm, "bench train", true);
  train::TrainingDevice td(device.empty() ? sim::Device{} : sim::parse_device(device, "--device"));
  const bool profile = vm["profile"].as<bool>();
  if (const int n = sim::checked_threads(vm["threads"].as<int>(), "--threads"); n > 0) omp_set_num_threads(n);
  models::NemotronHConfig cfg = models::resolve_config(vm["model"].as<std::string>());
  if (vm.count("set"))
    for (const auto& s : vm["set"].as<std::vector<std::string>>()) models::apply_override(cfg, s);
  models::validate(cfg);
  const int64_t T = vm["seq-len"].as<int64_t>(), B = vm["batch"].as<int64_t>();
  const int steps = vm["steps"].as<int>();
  if (T <= 0 || B <= 0 || steps <= 0) throw Error("--seq-len, --batch and --steps must be positive");
  sim::quant::RuntimeOptions rt_opt;
  if (vm.count("recipe")) {
    rt_opt.seed = 1;
    rt_opt.gemm_stats_rows = vm["gemm-stats-rows"].as<int64_t>();
    rt_opt.gemm_stats_sample = vm["gemm-stats-sample"].as<int64_t>();
    rt_opt.fp32_gemm = sim::quant::parse_fp32_gemm(vm["fp32-gemm"].as<std::string>(), td.device().is_cuda(), "--fp32-gemm");
    if (rt_opt.gemm_stats_rows < 0 || rt_opt.gemm_stats_sample < 1)
      throw Error("--gemm-stats-rows must be >= 0 and --gemm-stats-sample >= 1");
  }
  {  // every model of the comparison is built up front, each with its quantized linears' scratch
    const double model = models::training_memory(cfg, B, T).total();
    double need = 0;
    size_t count = 0;
    if (vm.count("recipe")) {
      const std::vector<std::string> names = split_list(vm["recipe"].as<std::string>());
      const std::string st = vm["stats"].as<std::string>();
      const std::vector<std::string> with_stats = st == "all" ? names : st == "none" ? std::vector<std::string>{}
                                                                                      : split_list(st);
      const std::vector<sim::LinearInfo> linears = models::linear_infos(cfg);
      const auto add = [&](const std::string& name, bool stats) {
        need += model + sim::quant::quant_scratch_bytes(sim::quant::load_recipe(name), cfg.num_hidden_layers, linears,
                                                        B * T, rt_opt, stats);
        ++count;
      };
      for (const std::string& n : names) add(n, false);
      for (const std::string& n : with_stats)  // (a name not in --recipe: bench_recipes says so)
        if (std::find(names.begin(), names.end(), n) != names.end()) add(n, true);
    } else {
      count = split_list(vm["precision"].as<std::string>()).size();
      need = static_cast<double>(count) * model;
    }
    // the host's memory holds the models (cuda-emulated's too), a CUDA device's its own
    sim::AvailableMemory device;
    const bool on_cuda = train::cuda_available_memory(td.device(), &device);
    sim::require_memory(need,
                        "exmy bench train (" + std::to_string(count) + " models " + cfg.name + ", batch " +
                            std::to_string(B) + " x " + std::to_string(T) + ")",
                        "lower --batch or --seq-len, or compare fewer recipes at once", on_cuda ? &device : nullptr);
  }
  if (vm.count("recipe"))
    return bench_recipes(td, cfg, B, T, steps, vm["recipe"].as<std::string>(), vm["stats"].as<std::string>(), rt_opt,
                         profile);
  const int64_t n = vm["gemm-size"].as<int64_t>();
  if (n <= 0) throw Error("--gemm-size must be positive");

  return bench_precisions(td, cfg, B, T, steps, vm["precision"].as<std::string>(), n, profile);
}

}  // namespace exmy::cli

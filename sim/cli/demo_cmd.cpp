// `exmy demo`: quantizes a built-in activation-like tensor (Gaussian rows
// with log-normal row scales and a few outlier channels) with the UE5M3
// paper's recipe and with the formats it is compared against, and prints the
// statistics of each.
#include <boost/program_options.hpp>
#include <cmath>
#include <cstdio>
#include <iostream>

#include "formats/error.hpp"
#include "formats/philox.hpp"
#include "formats/quantize.hpp"
#include "formats/spec.hpp"
#include "sim/cli/cli_support.hpp"
#include "sim/cli/commands.hpp"

namespace po = boost::program_options;

namespace exmy::cli {
namespace {

double uniform(uint64_t seed, uint64_t i) {
  // (0, 1), 32 bits from Philox word i
  return (static_cast<double>(philox_word(seed, 7, i)) + 0.5) / 4294967296.0;
}

std::vector<float> builtin_tensor(int64_t rows, int64_t cols, uint64_t seed) {
  std::vector<float> x(static_cast<size_t>(rows * cols));
  const double kPi = 3.14159265358979323846;
  for (int64_t r = 0; r < rows; ++r) {
    // log-normal row scale spanning a few binades
    const double u1 = uniform(seed, 2 * static_cast<uint64_t>(rows * cols) + 2 * r);
    const double u2 = uniform(seed, 2 * static_cast<uint64_t>(rows * cols) + 2 * r + 1);
    const double row_scale = std::exp(1.5 * std::sqrt(-2 * std::log(u1)) * std::cos(2 * kPi * u2)) * 1e-2;
    for (int64_t c = 0; c < cols; ++c) {
      const uint64_t i = static_cast<uint64_t>(r * cols + c);
      const double a = uniform(seed, 2 * i), b = uniform(seed, 2 * i + 1);
      double v = std::sqrt(-2 * std::log(a)) * std::cos(2 * kPi * b) * row_scale;
      if (c % 509 == 7) v *= 60.0;  // outlier channels
      x[i] = static_cast<float>(v);
    }
  }
  return x;
}

struct Row {
  const char* name;
  QuantSpec spec;
};

}  // namespace

int cmd_demo(const Args& args) {
  po::options_description desc(
      "exmy demo: quantize a built-in activation-like tensor with the UE5M3 recipe and the formats it is\n"
      "compared against, and print the statistics of each (docs/numerics.md §5)\n\n"
      "usage: exmy demo [--rows R] [--cols C] [--seed S]\n\noptions");
  desc.add_options()("help,h", "show this help")("rows", po::value<int64_t>()->default_value(512), "rows")(
      "cols", po::value<int64_t>()->default_value(4096), "columns")("seed", po::value<uint64_t>()->default_value(1),
                                                                   "seed of the built-in tensor");
  po::variables_map vm;
  if (parse_or_help(args, desc, {}, vm)) return 0;
  const int64_t rows = vm["rows"].as<int64_t>(), cols = vm["cols"].as<int64_t>();
  if (rows <= 0 || cols <= 0 || cols % 16 != 0) throw Error("--rows must be positive and --cols a positive multiple of 16");
  const std::vector<float> x = builtin_tensor(rows, cols, vm["seed"].as<uint64_t>());

  std::vector<Row> table;
  {
    // The UE5M3 paper's recipe for activations: E2M1 payloads, unsigned
    // E5M3 block scales over 1x16 blocks, scale target 448, FP32 operation
    // order, the zero-scale guard. Current scaling here (one tensor).
    QuantSpec s;
    s.elem = parse_format("e2m1");
    s.scale = parse_format("ue5m3");
    s.block_cols = 16;
    s.amax_kind = AmaxKind::current;
    s.scale_target = 448.0;
    s.arith = Arith::fp32;
    s.zero_scale = ZeroScale::one;
    table.push_back({"UE5M3 recipe (e2m1/ue5m3 1x16)", s});
    // The same with a stale reference amax, 16x below the tensor's: what a
    // periodic (sample-and-hold) reference meets when the tensor grows.
    QuantSpec stale = s;
    stale.amax_kind = AmaxKind::given;
    table.push_back({"  ... reference amax 16x stale", stale});
    QuantSpec nv = s;
    nv.scale = parse_format("ue4m3");
    nv.scale_target.reset();
    nv.zero_scale = ZeroScale::zero;
    table.push_back({"NVFP4 (e2m1/ue4m3 1x16)", nv});
    QuantSpec nvstale = nv;
    nvstale.amax_kind = AmaxKind::given;
    table.push_back({"  ... reference amax 16x stale", nvstale});
    QuantSpec mx;
    mx.elem = parse_format("e2m1");
    mx.scale = parse_format("ue8m0");
    mx.block_cols = 32;
    mx.rule = ScaleRule::mx_floor;
    table.push_back({"MXFP4 (e2m1/ue8m0 1x32)", mx});
    QuantSpec f8;
    f8.elem = parse_format("e4m3");
    f8.amax_kind = AmaxKind::current;
    table.push_back({"FP8 e4m3 per-tensor", f8});
  }
  float amax = 0;
  for (float v : x) amax = std::max(amax, std::fabs(v));
  for (auto& row : table)
    if (row.spec.amax_kind == AmaxKind::given) row.spec.amax_value = static_cast<double>(static_cast<float>(amax / 16.0));

  std::printf("exmy demo: built-in %lld x %lld activation-like tensor, amax %.4g\n\n", static_cast<long long>(rows),
              static_cast<long long>(cols), static_cast<double>(amax));
  std::printf("%-34s %9s %10s %10s %10s %10s %10s %10s\n", "format", "SQNR dB", "underflow", "saturated", "subnormal",
              "scale uf", "scale sat", "rel bias");
  std::vector<float> y(x.size());
  for (const auto& row : table) {
    QuantStats st;
    QuantOutput out{y.data(), nullptr, nullptr, &st};
    quantize(row.spec, x.data(), rows, cols, out);
    auto frac = [](uint64_t a, uint64_t b) { return b ? static_cast<double>(a) / static_cast<double>(b) : 0.0; };
    std::printf("%-34s %9.2f %9.4f%% %9.4f%% %9.3f%% %9.4f%% %9.4f%% %10.2e\n", row.name, st.sqnr_db(),
                100 * st.underflow_fraction(), 100 * frac(st.saturated, st.elements), 100 * frac(st.subnormal, st.elements),
                100 * frac(st.scale_underflow, st.blocks), 100 * frac(st.scale_saturated, st.blocks), st.relative_bias());
  }
  std::printf("\nunderflow: of non-zero elements; saturated, subnormal: of elements; scale uf/sat: of blocks\n");
  return 0;
}

}  // namespace exmy::cli

// Google Benchmark: the `grouped` GEMM output model (docs/recipes.md §6) against the
// FP32 GEMM of the same shape, on operands from a real quantization (E2M1
// payloads, UE5M3 scales on 1x16 blocks for the activations and 16x16 tiles
// for the weights, current tensor scaling), so the exactness tests pick the
// paths a UE5M3 recipe's training run takes. Compare the two times of one
// run; the machine is shared and noisy.
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "formats/quantize.hpp"
#include "formats/spec.hpp"
#include "sim/gemm.hpp"
#include "sim/quant/grouped_gemm.hpp"

namespace {

using namespace exmy;

constexpr int64_t kM = 512, kN = 1536, kK = 1024;  // tokens x out-features x in-features

struct Operand {
  std::vector<float> x;       // high precision
  std::vector<double> enc;    // payload x block scale
};

Operand make_operand(int64_t rows, int64_t cols, int block_rows, uint32_t seed) {
  QuantSpec s;
  s.elem = parse_format("e2m1");
  s.scale = parse_format("ue5m3");
  s.block_rows = block_rows;
  s.block_cols = 16;
  s.amax_kind = AmaxKind::current;
  s.scale_target = 448;
  Operand o;
  std::mt19937 g(seed);
  std::normal_distribution<float> n(0.0f, 1.0f);
  o.x.resize(static_cast<size_t>(rows * cols));
  for (auto& v : o.x) v = n(g);
  o.enc = sim::quant::quantize_encoded(s, o.x.data(), rows, cols);
  return o;
}

const Operand& act() {
  static const Operand a = make_operand(kM, kK, 1, 1);
  return a;
}
const Operand& weight() {
  static const Operand w = make_operand(kN, kK, 16, 2);
  return w;
}

void BM_Fp32Gemm(benchmark::State& state) {
  std::vector<float> c(static_cast<size_t>(kM * kN));
  for (auto _ : state) {
    sim::gemm<float>(c.data(), kN, act().x.data(), kK, sim::Op::N, weight().x.data(), kK, sim::Op::T, kM, kN, kK,
                     false);
    benchmark::DoNotOptimize(c.data());
  }
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * kM * kN * kK, benchmark::Counter::kIsIterationInvariantRate,
                                                 benchmark::Counter::kIs1000);
}

void BM_GroupedGemm(benchmark::State& state) {
  const sim::quant::GemmModel m{sim::quant::GemmModel::Kind::grouped, 64, Round::rne, Round::rtz, 1024};
  std::vector<float> c(static_cast<size_t>(kM * kN));
  auto& paths = sim::quant::grouped_gemm_paths();
  paths.zero();
  for (auto _ : state) {
    sim::quant::grouped_gemm(c.data(), act().enc.data(), weight().enc.data(), kM, kN, kK, m, 1.0f);
    benchmark::DoNotOptimize(c.data());
  }
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * kM * kN * kK, benchmark::Counter::kIsIterationInvariantRate,
                                                 benchmark::Counter::kIs1000);
  // Share of (tile, group) pieces on each path: float32 group, float32 sub-blocks, double.
  const double total = static_cast<double>(paths.f32_group + paths.f32_split + paths.f64);
  state.counters["f32_group"] = static_cast<double>(paths.f32_group) / total;
  state.counters["f32_split"] = static_cast<double>(paths.f32_split) / total;
  state.counters["f64"] = static_cast<double>(paths.f64) / total;
}

}  // namespace

BENCHMARK(BM_Fp32Gemm)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_GroupedGemm)->Unit(benchmark::kMillisecond)->UseRealTime();

BENCHMARK_MAIN();

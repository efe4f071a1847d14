// Micro-benchmarks of the formats library: the scalar rounding core per
// element, and the threaded quantizer per format and block shape on one
// thread. `exmy bench quantize` is the end-to-end benchmark with the copy
// baseline; these isolate the pieces when optimizing.
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "formats/quantize.hpp"
#include "formats/spec.hpp"

namespace {

std::vector<float> normal_data(size_t n) {
  std::vector<float> x(n);
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (auto& v : x) v = nd(rng);
  return x;
}

// The scalar core alone: encode one exact value into a format.
void BM_EncodeExact(benchmark::State& state, const char* fmt, exmy::Round mode) {
  const exmy::Format f = exmy::parse_format(fmt);
  const std::vector<float> x = normal_data(4096);
  uint32_t acc = 0;
  for (auto _ : state) {
    for (float v : x) acc += exmy::encode_exact(f, v * 3.0, mode, 8, 77, true).code;
    benchmark::DoNotOptimize(acc);
  }
  state.SetItemsProcessed(state.iterations() * static_cast<int64_t>(x.size()));
}
BENCHMARK_CAPTURE(BM_EncodeExact, e2m1_rne, "e2m1", exmy::Round::rne);
BENCHMARK_CAPTURE(BM_EncodeExact, e4m3_rne, "e4m3", exmy::Round::rne);
BENCHMARK_CAPTURE(BM_EncodeExact, e2m1_sr, "e2m1", exmy::Round::stochastic_fast);
BENCHMARK_CAPTURE(BM_EncodeExact, bf16_rne, "bf16", exmy::Round::rne);

// quantize() on one thread: 256 x 4096 floats.
void BM_Quantize(benchmark::State& state, const char* elem, const char* scale, int br, int bc, exmy::Arith arith,
                 exmy::Round mode) {
  const int64_t rows = 256, cols = 4096;
  const std::vector<float> x = normal_data(static_cast<size_t>(rows * cols));
  exmy::QuantSpec s;
  s.elem = exmy::parse_format(elem);
  if (scale) s.scale = exmy::parse_format(scale);
  s.block_rows = br;
  s.block_cols = bc;
  s.arith = arith;
  s.round = mode;
  s.amax_kind = exmy::AmaxKind::current;
  std::vector<float> y(x.size());
  std::vector<uint8_t> codes(x.size() * 2);
  for (auto _ : state) {
    exmy::quantize(s, x.data(), rows, cols, exmy::QuantOutput{y.data(), codes.data(), nullptr, nullptr}, 1);
    benchmark::DoNotOptimize(y.data());
  }
  state.SetItemsProcessed(state.iterations() * rows * cols);
  state.SetBytesProcessed(state.iterations() * rows * cols * 4);
}
BENCHMARK_CAPTURE(BM_Quantize, e2m1_ue5m3_1x16_exact, "e2m1", "ue5m3", 1, 16, exmy::Arith::exact, exmy::Round::rne);
BENCHMARK_CAPTURE(BM_Quantize, e2m1_ue5m3_16x1_exact, "e2m1", "ue5m3", 16, 1, exmy::Arith::exact, exmy::Round::rne);
BENCHMARK_CAPTURE(BM_Quantize, e2m1_ue4m3_1x16_fp32, "e2m1", "ue4m3", 1, 16, exmy::Arith::fp32, exmy::Round::rne);
BENCHMARK_CAPTURE(BM_Quantize, e2m1_ue4m3_16x16_fp32, "e2m1", "ue4m3", 16, 16, exmy::Arith::fp32, exmy::Round::rne);
BENCHMARK_CAPTURE(BM_Quantize, e2m1_ue5m3_1x16_srfast, "e2m1", "ue5m3", 1, 16, exmy::Arith::fp32,
                  exmy::Round::stochastic_fast);
BENCHMARK_CAPTURE(BM_Quantize, e4m3_ue8m0_1x32_exact, "e4m3", "ue8m0", 1, 32, exmy::Arith::exact, exmy::Round::rne);
BENCHMARK_CAPTURE(BM_Quantize, e4m3_tensor_exact, "e4m3", nullptr, 1, 16, exmy::Arith::exact, exmy::Round::rne);
BENCHMARK_CAPTURE(BM_Quantize, e3m2_ue8m0_1x32_exact, "e3m2", "ue8m0", 1, 32, exmy::Arith::exact, exmy::Round::rne);

// The 16-point random Hadamard transform (te-nvfp4's wgrad operands) in
// place, along rows or columns, on one thread. The data is refreshed outside
// the timing so that every pass transforms normal values.
void BM_Hadamard16(benchmark::State& state, int axis) {
  const int64_t rows = 256, cols = 4096;
  const std::vector<float> x = normal_data(static_cast<size_t>(rows * cols));
  std::vector<float> y(x.size());
  for (auto _ : state) {
    state.PauseTiming();
    y = x;
    state.ResumeTiming();
    exmy::hadamard(y.data(), rows, cols, axis, exmy::Rht{16, exmy::RhtKind::random, 0x5a3c}, 1);
    benchmark::DoNotOptimize(y.data());
  }
  state.SetItemsProcessed(state.iterations() * rows * cols);
}
BENCHMARK_CAPTURE(BM_Hadamard16, rows, 1);
BENCHMARK_CAPTURE(BM_Hadamard16, columns, 0);

}  // namespace

BENCHMARK_MAIN();

// Google Benchmark: the run file's flush with as many statistics datasets as
// a quantized training run writes (a quantized linear has ~240: 6 operands x
// ~30 statistics, 3 GEMMs x ~14; proxy-50m's 60 linears ~14,000). Each
// iteration appends one row to every dataset and flushes in SWMR mode, the
// trainer's logging step; the counters give the once-per-run costs:
// declaring the datasets, entering SWMR mode, the first flush (it allocates
// every dataset's first chunk), and closing the file.
//
//   build/bench/bench_run_file                       # 3,000 and 14,000 datasets
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <unistd.h>
#include <vector>

#include "sim/io/run_file.hpp"

namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

void BM_RunFileFlush(benchmark::State& state) {
  const int64_t n = state.range(0);
  const std::string path =
      (std::filesystem::temp_directory_path() / ("exmy-bench-run-file-" + std::to_string(::getpid()) + ".h5")).string();
  std::vector<std::string> names;
  for (int64_t i = 0; i < n; ++i)
    names.push_back("/quant/layer" + std::to_string(i / 240) + "/gemm" + std::to_string((i / 30) % 8) + "/stat" +
                    std::to_string(i % 30));
  auto t = Clock::now();
  auto file = std::make_unique<exmy::io::RunFile>(path);
  for (const auto& name : names) file->declare(name, exmy::io::ElemType::f64, 0, 256);  // the statistics' chunking
  const double declare_ms = ms_since(t);
  t = Clock::now();
  file->start_swmr();
  const double swmr_ms = ms_since(t);
  double row = 0;
  auto append_all = [&] {
    for (const auto& name : names) file->append(name, row);
    row += 1;
  };
  append_all();
  t = Clock::now();
  file->flush();
  const double first_ms = ms_since(t);
  for (auto _ : state) {
    state.PauseTiming();
    append_all();
    state.ResumeTiming();
    file->flush();
  }
  t = Clock::now();
  file->close();
  const double close_ms = ms_since(t);
  std::filesystem::remove(path);
  state.counters["datasets"] = static_cast<double>(n);
  state.counters["declare_ms"] = declare_ms;
  state.counters["start_swmr_ms"] = swmr_ms;
  state.counters["first_flush_ms"] = first_ms;
  state.counters["close_ms"] = close_ms;
}

}  // namespace

BENCHMARK(BM_RunFileFlush)->Arg(3000)->Arg(14000)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(20);

BENCHMARK_MAIN();

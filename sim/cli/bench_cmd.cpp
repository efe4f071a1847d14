// `exmy bench quantize`: throughput of quantize+dequantize against a plain
// float32 copy measured in the same run, on the CPU or (--device cuda) on a
// CUDA device with the data resident there.
#include <omp.h>

#if defined(EXMY_HAVE_CUDA)
#include <cuda_runtime.h>

#include "formats/cuda/cuda_check.hpp"
#include "formats/cuda/quantize_cuda.hpp"
#include "sim/cuda/memory_floor.hpp"
#endif

#if defined(__x86_64__)
#include <immintrin.h>  // (the AVX-512 floor is a target("avx512f") function: any baseline)
#endif

#include <algorithm>
#include <boost/program_options.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <random>
#include <thread>

#include "formats/error.hpp"
#include "formats/fast/loops.hpp"
#include "formats/quantize.hpp"
#include "formats/spec.hpp"
#include "sim/cli/commands.hpp"
#include "sim/device/device.hpp"
#include "sim/parallel.hpp"
#include "sim/sysmem.hpp"
#include "sim/tensor.hpp"

namespace po = boost::program_options;

namespace exmy::cli {
namespace {

struct Variant {
  const char* name;
  QuantSpec spec;
};

// held_amax: the tensor amax a periodic (sample-and-hold) scaling would
// hold, for the variant that quantizes with a given amax.
std::vector<Variant> variants(double held_amax) {
  std::vector<Variant> v;
  QuantSpec a;
  a.elem = parse_format("e2m1");
  a.scale = parse_format("ue5m3");
  a.block_rows = 1;
  a.block_cols = 16;
  a.amax_kind = AmaxKind::current;
  a.scale_target = 448.0;
  v.push_back({"e2m1/ue5m3 1x16 rne exact", a});
  // the UE5M3 recipe's periodic tensor scaling: the amax is given, so no
  // pass over x precedes the quantization
  QuantSpec h = a;
  h.amax_kind = AmaxKind::given;
  h.amax_value = held_amax;
  v.push_back({"e2m1/ue5m3 1x16 exact, held", h});
  // column blocks (the loop with a block per lane)
  QuantSpec col = a;
  col.block_rows = 16;
  col.block_cols = 1;
  v.push_back({"e2m1/ue5m3 16x1 rne exact", col});
  QuantSpec b = a;
  b.scale = parse_format("e4m3");
  b.block_rows = b.block_cols = 16;
  b.arith = Arith::fp32;
  b.scale_target.reset();
  v.push_back({"e2m1/e4m3 16x16 rne fp32", b});
  // NVFP4 as Transformer Engine quantizes it: 1x16 blocks of E4M3 scales,
  // fp32 arithmetic, the current tensor amax (T = Fs.max = 448)
  QuantSpec nv = a;
  nv.scale = parse_format("e4m3");
  nv.arith = Arith::fp32;
  nv.scale_target.reset();
  v.push_back({"e2m1/e4m3 1x16 fp32 (NVFP4)", nv});
  QuantSpec c;
  c.elem = parse_format("e2m1");
  c.scale = parse_format("ue8m0");
  c.block_rows = 1;
  c.block_cols = 32;
  c.rule = ScaleRule::mx_floor;
  v.push_back({"e2m1/ue8m0 1x32 mx-floor", c});
  QuantSpec d = a;
  d.round = Round::stochastic_fast;
  d.sr_bits = 8;
  d.seed = 1234;
  d.stream = 99;
  v.push_back({"e2m1/ue5m3 1x16 sr-fast8", d});
  return v;
}

// The configurations whose name contains `only` (all of them for "").
std::vector<Variant> chosen_variants(double held_amax, const std::string& only) {
  std::vector<Variant> v;
  for (const Variant& c : variants(held_amax))
    if (std::string(c.name).find(only) != std::string::npos) v.push_back(c);
  return v;
}

template <class F>
double best_seconds(int repeat, F&& f) {
  double best = 1e30;
  for (int i = 0; i < repeat; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    const auto t1 = std::chrono::steady_clock::now();
    best = std::min(best, std::chrono::duration<double>(t1 - t0).count());
  }
  return best;
}

std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown CPU";
}

void parallel_copy(float* dst, const float* src, int64_t n, int threads) {
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
    const int64_t chunk = (n + nt - 1) / nt, b = std::min(n, t * chunk), e = std::min(n, b + chunk);
    if (e > b) std::memcpy(dst + b, src + b, sizeof(float) * static_cast<size_t>(e - b));
  }
}

// What the memory system alone allows a quantizer: the traffic of a
// one-pass quantize+dequantize (read x; write values and one-byte codes)
// with next to no arithmetic, written the way exmy::quantize writes large
// outputs (the values with non-temporal stores unless statistics are on, the
// codes through the cache), and the same after
// a read-only pass over x, as the current tensor amax needs.
// With AVX-512 (where the loops use it) and y 64-byte aligned, the values
// go out a whole cache line per non-temporal store, as the 16-lane loops
// store them (formats/fast/thr_step_x16.hpp).
#if defined(__x86_64__)
// Returns where it stopped (the last e - i < 16 elements are memory_floor's).
__attribute__((target("avx512f"))) int64_t floor_lines_avx512(const float* x, float* y, uint8_t* codes, int64_t i,
                                                             int64_t e, float k) {
  for (; i + 16 <= e; i += 16) {
    _mm512_stream_ps(y + i, _mm512_mul_ps(_mm512_loadu_ps(x + i), _mm512_set1_ps(k)));
    const long long c8[2] = {static_cast<long long>(i), static_cast<long long>(i)};
    std::memcpy(codes + i, c8, 16);
  }
  _mm_sfence();
  return i;
}
#endif

void memory_floor(const float* x, float* y, uint8_t* codes, int64_t n, int threads, bool amax_pass, bool stream) {
  const int64_t chunk = 1 << 14;  // multiple of 16
  const double amax = amax_pass ? tensor_abs_max(x, n, threads) : 1.0;
  const float k = std::isnan(amax) ? 0.0f : 1.0f;  // keeps the amax pass from being optimised away
#if defined(__x86_64__)
  const bool wide = stream && detail::simd_width() == detail::Simd::avx512 && reinterpret_cast<uintptr_t>(y) % 64 == 0;
#else
  const bool wide = false;
#endif
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t c = 0; c < n; c += chunk) {
    const int64_t e = std::min(n, c + chunk);
    int64_t i = c;
#if defined(__x86_64__)
    if (wide) i = floor_lines_avx512(x, y, codes, i, e, k);
#endif
#ifdef __AVX2__
    if (!wide && stream && reinterpret_cast<uintptr_t>(y) % 16 == 0) {
      for (; i + 8 <= e; i += 8) {
        const __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + i), _mm256_set1_ps(k));
        _mm_stream_ps(y + i, _mm256_castps256_ps128(v));
        _mm_stream_ps(y + i + 4, _mm256_extractf128_ps(v, 1));
        const long long c8 = static_cast<long long>(i);  // codes through the cache, as quantize stores them
        std::memcpy(codes + i, &c8, 8);
      }
      _mm_sfence();
    }
#endif
    for (; i < e; ++i) {
      y[i] = x[i] * k;
      codes[i] = static_cast<uint8_t>(i);
    }
  }
}

#if defined(EXMY_HAVE_CUDA)

// A device allocation freed on scope exit.
struct DeviceBytes {
  void* ptr = nullptr;
  explicit DeviceBytes(size_t bytes) { cuda_check(cudaMalloc(&ptr, bytes), "cudaMalloc"); }
  ~DeviceBytes() { cudaFree(ptr); }
  DeviceBytes(const DeviceBytes&) = delete;
  DeviceBytes& operator=(const DeviceBytes&) = delete;
};

// The same rows on the current CUDA device: x, the values, codes and scale
// codes stay on the device; every timing is a CUDA-event interval on the
// default stream, the copy a device-to-device cudaMemcpy of the float32
// tensor, timed in alternation with each row. A quantize call includes its
// final copy of the counters (and the plan) to the host, which it needs to
// report unrepresentable elements: that synchronisation is in the time.
void bench_quantize_cuda(const std::vector<float>& x, int64_t rows, int64_t cols, int repeat, bool with_stats,
                         const std::string& only) {
  const int64_t n = rows * cols;
  int dev = 0;
  cuda_check(cudaGetDevice(&dev), "cudaGetDevice");
  cudaDeviceProp prop{};
  cuda_check(cudaGetDeviceProperties(&prop, dev), "cudaGetDeviceProperties");
  size_t free_bytes = 0, total_bytes = 0;
  cuda_check(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
  const double need = static_cast<double>(n) * (4.0 + 4.0 + 1.0 + 4.0) + static_cast<double>(n) / 16.0 + 64;
  if (need > static_cast<double>(free_bytes))
    throw Error("exmy bench quantize --device cuda:" + std::to_string(dev) + " needs " +
                std::to_string(static_cast<long long>(need)) + " bytes of device memory, " +
                std::to_string(free_bytes) + " free (lower --elements)");
  DeviceBytes dx(sizeof(float) * n), dy(sizeof(float) * n), dcodes(static_cast<size_t>(n)),
      dscales(static_cast<size_t>(n / 16 + 16)), dword(sizeof(unsigned));
  cuda_check(cudaMemcpy(dx.ptr, x.data(), sizeof(float) * n, cudaMemcpyHostToDevice), "cudaMemcpy (input)");
  cudaEvent_t start, stop;
  cuda_check(cudaEventCreate(&start), "cudaEventCreate");
  cuda_check(cudaEventCreate(&stop), "cudaEventCreate");
  auto seconds = [&](auto&& f) {
    cuda_check(cudaEventRecord(start), "cudaEventRecord");
    f();
    cuda_check(cudaEventRecord(stop), "cudaEventRecord");
    cuda_check(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float ms = 0;
    cuda_check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    return ms * 1e-3;
  };
  auto copy = [&] {
    cuda_check(cudaMemcpyAsync(dy.ptr, dx.ptr, sizeof(float) * n, cudaMemcpyDeviceToDevice), "cudaMemcpy (copy)");
  };
  CudaQuantizer quantizer;  // its scratch is allocated by the warm-up call
  const float* xd = static_cast<const float*>(dx.ptr);
  std::printf("exmy bench quantize --device cuda: %lld x %lld float32 (%.0f MiB) on the device, best of %d, stats %s\n",
              static_cast<long long>(rows), static_cast<long long>(cols), n * 4.0 / (1 << 20), repeat,
              with_stats ? "on" : "off");
  std::printf("device: cuda:%d %s (sm_%d%d, %.0f GiB)\n", dev, prop.name, prop.major, prop.minor,
              total_bytes / double(1 << 30));
  double copy_best = 1e30;
  std::printf("%-28s %14s %8s\n", "", "device", "ratio");
  struct Row {
    std::string name;
    double copy_s, kernel_s;
  };
  std::vector<Row> table;
  auto timed_row = [&](const std::string& name, auto&& kernel) {
    copy();
    kernel();  // warm-up
    Row r{name, 1e30, 1e30};
    for (int i = 0; i < repeat; ++i) {
      r.copy_s = std::min(r.copy_s, seconds(copy));
      r.kernel_s = std::min(r.kernel_s, seconds(kernel));
    }
    copy_best = std::min(copy_best, r.copy_s);
    table.push_back(r);
  };
  for (const bool amax_pass : {false, true})
    timed_row(amax_pass ? "memory floor, 2 passes" : "memory floor, 1 pass", [&] {
      sim::cuda_memory_floor(xd, static_cast<float*>(dy.ptr), static_cast<uint8_t*>(dcodes.ptr), n, amax_pass,
                             static_cast<unsigned*>(dword.ptr));
    });
  for (const auto& v : chosen_variants(tensor_abs_max(x.data(), n, 0), only)) {
    QuantStats st;
    const QuantOutput out{static_cast<float*>(dy.ptr), static_cast<uint8_t*>(dcodes.ptr),
                          static_cast<uint8_t*>(dscales.ptr), with_stats ? &st : nullptr};
    timed_row(v.name, [&] { quantizer.run(v.spec, xd, rows, cols, out); });
  }
  std::printf("%-28s %10.1f Me/s %8s\n", "float32 copy (d2d)", n / copy_best / 1e6, "1.00");
  for (const Row& r : table)
    std::printf("%-28s %10.1f Me/s %8.2f\n", r.name.c_str(), n / r.kernel_s / 1e6, r.copy_s / r.kernel_s);
  std::printf("(ratio = device-to-device copy time / quantize+dequantize time, CUDA events, timed in alternation;\n"
              " the memory floors move what a one-pass quantizer, and one after a tensor-amax pass, must move;\n"
              " each quantize call includes the copy of its counters to the host)\n");
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
}
#endif

}  // namespace

int cmd_bench(const Args& args) {
  po::options_description desc(
      "exmy bench: throughput benchmarks\n\n"
      "usage: exmy bench quantize [--elements N] [--repeat K] [--threads T] [--stats] [--rows TEXT]\n"
      "                          [--device cpu|cuda|cuda:N]\n\noptions");
  // clang-format off
  desc.add_options()
    ("help,h", "show this help")
    ("what", po::value<std::string>(), "benchmark: quantize")
    ("elements", po::value<int64_t>()->default_value(int64_t{64} << 20), "tensor size (float32 elements)")
    ("cols", po::value<int64_t>()->default_value(4096), "row length of the tensor")
    ("repeat", po::value<int>()->default_value(5), "repetitions; the best time is reported")
    ("threads", po::value<int>()->default_value(0), "threads for the multi-threaded column (0: all cores)")
    ("stats", "also collect the statistics of each call (docs/numerics.md §5)")
    ("rows", po::value<std::string>()->default_value(""),
     "time only the configurations whose name contains TEXT (the copy and the memory floors always run)")
    ("device", po::value<std::string>()->default_value("cpu"),
     "cpu, or cuda[:N]: the tensors resident on that CUDA device, timed with CUDA events");
  // clang-format on
  po::positional_options_description pos;
  pos.add("what", 1);
  po::variables_map vm;
  po::store(po::command_line_parser(args).options(desc).positional(pos).run(), vm);
  po::notify(vm);
  if (vm.count("help") || !vm.count("what")) {
    std::cout << desc << "\n";
    return vm.count("help") ? 0 : 2;
  }
  if (vm["what"].as<std::string>() != "quantize")
    throw Error("unknown benchmark '" + vm["what"].as<std::string>() + "' (expected quantize)");
  const int64_t cols = vm["cols"].as<int64_t>();
  if (cols < 1) throw Error("--cols must be at least 1 (got " + std::to_string(cols) + ")");
  const int64_t n = vm["elements"].as<int64_t>() / cols * cols;
  if (n <= 0) throw Error("--elements must be at least --cols");
  const int64_t rows = n / cols;
  const int repeat = vm["repeat"].as<int>();
  if (repeat < 1) throw Error("--repeat must be at least 1 (got " + std::to_string(repeat) + ")");
  const int asked = sim::checked_threads(vm["threads"].as<int>(), "--threads");
  const int all = asked > 0 ? asked : omp_get_max_threads();
  const bool with_stats = vm.count("stats") > 0;
  const sim::Device device = sim::parse_device(vm["device"].as<std::string>(), "--device");
  sim::require_device(device, "--device");
  const std::string only = vm["rows"].as<std::string>();
  if (chosen_variants(1.0, only).empty())  // (before the tensor is made)
    throw Error("--rows '" + only + "' names no configuration of exmy bench quantize");

  if (device.is_cuda()) {
    std::vector<float> x(static_cast<size_t>(n));
    std::mt19937 rng(42);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (auto& v : x) v = nd(rng);
#if defined(EXMY_HAVE_CUDA)
    bench_quantize_cuda(x, rows, cols, repeat, with_stats, only);
#endif
    return 0;
  }
  // input, copy/values, codes, scale codes, and the kernels' own scratch (at most one more float32 tensor)
  sim::require_memory(static_cast<double>(n) * (4.0 + 4.0 + 1.0 + 4.0) + static_cast<double>(n) / 16.0,
                      "exmy bench quantize (" + std::to_string(n) + " elements)", "lower --elements");
  // (64-byte aligned, as a training tensor's storage is: sim/tensor.hpp)
  sim::Buf<float> x(static_cast<size_t>(n)), y(static_cast<size_t>(n));
  sim::Buf<uint8_t> codes(static_cast<size_t>(n));
  sim::Buf<uint8_t> scodes(static_cast<size_t>(n / 16 + 16));
  {
    std::mt19937 rng(42);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (auto& v : x) v = nd(rng);
  }
  const std::vector<Variant> chosen = chosen_variants(tensor_abs_max(x.data(), n, all), only);
  std::printf("exmy bench quantize: %lld x %lld float32 (%.0f MiB), best of %d, stats %s\n",
              static_cast<long long>(rows), static_cast<long long>(cols), n * 4.0 / (1 << 20), repeat,
              with_stats ? "on" : "off");
  std::printf("machine: %s, %d hardware threads\n", cpu_model().c_str(),
              static_cast<int>(std::thread::hardware_concurrency()));
  const int thread_counts[2] = {1, all};
  // Each ratio compares timings taken in alternation (copy, then the
  // kernel, repeat times), so a slow spell of this shared machine lands on
  // both sides of it; the copy row shows the best copy over the whole run.
  double copy_best[2] = {1e30, 1e30};
  auto timed_pair = [&](int k, auto&& kernel, double& copy_s, double& kernel_s) {
    parallel_copy(y.data(), x.data(), n, thread_counts[k]);
    kernel();  // warm-up
    copy_s = kernel_s = 1e30;
    for (int r = 0; r < repeat; ++r) {
      copy_s = std::min(copy_s, best_seconds(1, [&] { parallel_copy(y.data(), x.data(), n, thread_counts[k]); }));
      kernel_s = std::min(kernel_s, best_seconds(1, kernel));
    }
    copy_best[k] = std::min(copy_best[k], copy_s);
  };
  struct Row {
    std::string name;
    double c[2], s[2];
    int floor = -1;  // the floor the row is held to: 0 one pass, 1 two passes (-1: a floor itself)
  };
  std::vector<Row> table;
  // the memory floors (see memory_floor), streamed as quantize would stream
  const bool stream = !with_stats && n * 5 >= (int64_t{64} << 20);
  for (const bool amax_pass : {false, true}) {
    Row r{amax_pass ? "memory floor, 2 passes" : "memory floor, 1 pass", {}, {}, -1};
    for (int k = 0; k < 2; ++k)
      timed_pair(k, [&] { memory_floor(x.data(), y.data(), codes.data(), n, thread_counts[k], amax_pass, stream); },
                 r.c[k], r.s[k]);
    table.push_back(r);
  }
  for (const auto& v : chosen) {
    // (a current tensor amax is measured by a pass of its own before the blocks)
    Row r{v.name, {}, {}, v.spec.amax_kind == AmaxKind::current ? 1 : 0};
    for (int k = 0; k < 2; ++k) {
      QuantStats st;
      QuantOutput out{y.data(), codes.data(), scodes.data(), with_stats ? &st : nullptr};
      timed_pair(k, [&] { quantize(v.spec, x.data(), rows, cols, out, thread_counts[k]); }, r.c[k], r.s[k]);
    }
    table.push_back(r);
  }
  std::printf("%-28s %14s %8s %14s %8s %16s\n", "", "1 thread", "ratio", (std::to_string(all) + " threads").c_str(),
              "ratio", ("of floor (1, " + std::to_string(all) + ")").c_str());
  std::printf("%-28s %10.1f Me/s %8s %10.1f Me/s %8s\n", "float32 copy", n / copy_best[0] / 1e6, "1.00",
              n / copy_best[1] / 1e6, "1.00");
  for (const Row& r : table) {
    std::printf("%-28s %10.1f Me/s %8.2f %10.1f Me/s %8.2f", r.name.c_str(), n / r.s[0] / 1e6, r.c[0] / r.s[0],
                n / r.s[1] / 1e6, r.c[1] / r.s[1]);
    if (r.floor >= 0) {
      const Row& f = table[static_cast<size_t>(r.floor)];
      std::printf(" %7.2f %7.2f %s", (r.c[0] / r.s[0]) / (f.c[0] / f.s[0]), (r.c[1] / r.s[1]) / (f.c[1] / f.s[1]),
                  r.floor ? "(2 passes)" : "(1 pass)");
    }
    std::printf("\n");
  }
  std::printf("(ratio = copy time / quantize+dequantize time, in the same thread setting, timed in alternation;\n"
              " the memory floors move what a one-pass quantizer, and one after a tensor-amax pass, must move,\n"
              " with next to no arithmetic; of floor = the row's ratio over its floor's, each against the copy\n"
              " timed with it, so a change of the machine's bandwidth between rows cancels: the floor of two\n"
              " passes for a current tensor amax, else one; `held`: the amax given, as periodic tensor scaling\n"
              " holds it)\n");
  return 0;
}

}  // namespace exmy::cli

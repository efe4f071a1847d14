// Deterministic parallel loops. Work is cut into blocks whose boundaries
// depend on the problem size only; OpenMP hands out whole blocks, and any sum
// that crosses blocks is formed from per-block partial results added in block
// order. A result therefore never depends on the number of threads.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <thread>

#include "formats/error.hpp"
#include "sim/tensor.hpp"

namespace exmy::sim {

// The most threads a command accepts (--threads, train.threads): 1024, or 4
// per hardware thread on a larger machine. Far more would only exhaust the
// OpenMP runtime's thread stacks (it crashed at 100,000).
inline int max_threads_allowed() {
  return std::max(1024, 4 * static_cast<int>(std::thread::hardware_concurrency()));
}

// `n` as a thread count named `name` (0: the default), or an exmy::Error.
inline int checked_threads(int64_t n, const std::string& name) {
  if (n < 0 || n > max_threads_allowed())
    throw Error(name + " = " + std::to_string(n) + " is outside 0.." + std::to_string(max_threads_allowed()) +
                " (0: one per core; at most 1024, or 4 per hardware thread)");
  return static_cast<int>(n);
}

// Loops with less work than this (in multiply-adds or elements) run on the
// calling thread: starting a parallel region costs microseconds, and far
// more on a loaded machine where a spinning thread waits for a descheduled
// one. Whether a loop runs in parallel never changes its result; tests set
// it to 0 to run every loop threaded and prove that.
inline int64_t& parallel_min_work() {
  static int64_t threshold = int64_t{1} << 15;
  return threshold;
}

// Rows per block of rows_with_column_sums.
inline constexpr int64_t kRowBlock = 32;

// Calls row(n, partial) for n in [0, N), where `partial` is the (C) partial
// column sum of n's block; then acc (C) += the partials in block order.
template <class T, class RowFn>
void rows_with_column_sums(T* acc, int64_t N, int64_t C, RowFn&& row) {
  const int64_t nb = (N + kRowBlock - 1) / kRowBlock;
  Buf<T> part(static_cast<size_t>(nb * C), T(0));
#pragma omp parallel for schedule(static) if (N * C >= parallel_min_work())
  for (int64_t b = 0; b < nb; ++b) {
    T* p = part.data() + b * C;
    for (int64_t n = b * kRowBlock; n < std::min(N, (b + 1) * kRowBlock); ++n) row(n, p);
  }
  for (int64_t b = 0; b < nb; ++b)
    for (int64_t c = 0; c < C; ++c) acc[c] += part[static_cast<size_t>(b * C + c)];
}

}  // namespace exmy::sim

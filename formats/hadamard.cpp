// The n-point Hadamard transforms of docs/numerics.md §3 (n = 16, 32, 64,
// 128): the CPU's loops over the segments, the reference, the sign vector.
// A segment's transform is formats/hadamard_segment.hpp's rht_segment, the
// function the CUDA kernel runs too (formats/cuda/quantize.cu).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "formats/error.hpp"
#include "formats/fast/loops.hpp"
#include "formats/hadamard_segment.hpp"
#include "formats/quantize.hpp"
#include "formats/spec.hpp"

namespace exmy {
namespace {

using rht_detail::exact_sum_rto;
using rht_detail::h_neg;
using rht_detail::to_bf16;

void check_transform(const Rht& t, int64_t rows, int64_t cols, int axis) {
  t.validate();
  const int64_t len = axis == 1 ? cols : rows;
  if (len % t.size != 0)
    throw Error("the Hadamard transform runs over " + std::to_string(t.size) + "-element segments, but the " +
                std::string(axis == 1 ? "row length " : "column length ") + std::to_string(len) +
                " is not a multiple of " + std::to_string(t.size));
}

// Segment s of the transform's axis: its first element and its stride.
float* segment_base(float* x, int64_t cols, int axis, int n, int64_t s, int64_t& stride) {
  if (axis == 1) {
    stride = 1;
    return x + n * s;
  }
  stride = cols;
  return x + (s / cols) * n * cols + (s % cols);
}

// Every segment of the transform's axis by the shared rht_segment (the
// device kernel's thread body), segments split statically over the threads.
// The transforms take the AVX-512 forms where the CPU has AVX-512 (their
// bits are rht_segment's: tests/formats/test_hadamard_launch.cpp): along
// rows runs of 4096 elements a task, along columns runs of 64 column
// segments, eight columns a step.
void run(float* x, int64_t rows, int64_t cols, int axis, const Rht& t, int threads, bool parallel) {
  const RhtParams p = rht_params(t, rows, cols, axis);
  const int64_t nseg = rht_segment_count(rows, cols, p);
#if defined(__x86_64__)
  if (detail::simd_width() >= detail::Simd::avx512) {
    const int64_t run = p.axis == 1 ? 4096 / p.size : 64, runs = (nseg + run - 1) / run;
#pragma omp parallel for num_threads(threads) if (parallel) schedule(static)
    for (int64_t r = 0; r < runs; ++r) {
      const int64_t s0 = run * r, s1 = std::min(nseg, s0 + run);
      if (p.axis == 1) detail::avx512::rht_rows(x + p.size * s0, s1 - s0, p);
      else detail::avx512::rht_cols(x, cols, s0, s1, p);
    }
    return;
  }
#endif
#pragma omp parallel for num_threads(threads) if (parallel) schedule(static)
  for (int64_t s = 0; s < nseg; ++s) rht_segment(x, cols, p, s);
}

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace

void Rht::validate() const {
  if (size != 16 && size != 32 && size != 64 && size != 128)
    throw Error("Hadamard size " + std::to_string(size) + " is not one of 16, 32, 64, 128");
}

// docs/numerics.md §3: s_i = bit i of the mask for i < 16; for 16 <= i < 128,
// bit i of W = w0 + 2^64 w1, the first two outputs of splitmix64 started
// from the mask. The deterministic kind has every s_i = +1.
void rht_sign_vector(const Rht& t, bool* neg) {
  uint64_t state = t.signs;
  const uint64_t w[2] = {splitmix64(state), splitmix64(state)};
  for (int i = 0; i < t.size; ++i) {
    const bool bit = i < 16 ? ((t.signs >> i) & 1) != 0 : ((w[i / 64] >> (i % 64)) & 1) != 0;
    neg[i] = t.kind == RhtKind::random && bit;
  }
}

RhtParams rht_params(const Rht& t, int64_t rows, int64_t cols, int axis) {
  check_transform(t, rows, cols, axis);
  RhtParams p;
  p.size = t.size;
  p.axis = axis;
  bool neg[kMaxRht];
  rht_sign_vector(t, neg);
  for (int i = 0; i < t.size; ++i)
    if (neg[i]) p.neg[i / 32] |= 1u << (i % 32);
  return p;
}

RhtParams rht_params(const QuantSpec& spec, int64_t rows, int64_t cols) {
  return rht_params(rht_of(spec), rows, cols, rht_axis(spec));
}

void hadamard(float* x, int64_t rows, int64_t cols, int axis, const Rht& t, int threads) {
  run(x, rows, cols, axis, t, threads > 0 ? threads : omp_get_max_threads(), true);
}

// The reference: every output an independent exact sum of its n terms, the
// signs those of the matrix H diag(s) entry by entry.
void hadamard_ref(float* x, int64_t rows, int64_t cols, int axis, const Rht& t) {
  check_transform(t, rows, cols, axis);
  const int n = t.size;
  bool sgn[kMaxRht];
  rht_sign_vector(t, sgn);
  const int64_t nseg = axis == 1 ? rows * cols / n : (rows / n) * cols;
  for (int64_t s = 0; s < nseg; ++s) {
    int64_t stride;
    float* base = segment_base(x, cols, axis, n, s, stride);
    float in[kMaxRht];
    for (int i = 0; i < n; ++i) in[i] = base[i * stride];
    for (int j = 0; j < n; ++j) {
      float u[kMaxRht];
      bool finite = true;
      for (int i = 0; i < n; ++i) {
        u[i] = sgn[i] != h_neg(i, j) ? -in[i] : in[i];
        finite = finite && std::isfinite(u[i]);
      }
      double s_rto;
      if (finite) {
        s_rto = exact_sum_rto(u, n);
      } else {
        s_rto = 0;
        for (int i = 0; i < n; ++i) s_rto += u[i];
      }
      base[j * stride] = to_bf16(s_rto, n);
    }
  }
}

void hadamard16(float* x, int64_t rows, int64_t cols, int axis, uint16_t signs, int threads) {
  hadamard(x, rows, cols, axis, Rht{16, RhtKind::random, signs}, threads);
}

void hadamard16_ref(float* x, int64_t rows, int64_t cols, int axis, uint16_t signs) {
  hadamard_ref(x, rows, cols, axis, Rht{16, RhtKind::random, signs});
}

Rht rht_of(const QuantSpec& spec) { return Rht{spec.rht_size, spec.rht_kind, spec.rht_signs}; }
int rht_axis(const QuantSpec& spec) { return spec.block_rows == 1 ? 1 : 0; }

void apply_rht(const QuantSpec& spec, float* x, int64_t rows, int64_t cols, int threads) {
  hadamard(x, rows, cols, rht_axis(spec), rht_of(spec), threads);
}

void apply_rht_ref(const QuantSpec& spec, float* x, int64_t rows, int64_t cols) {
  hadamard_ref(x, rows, cols, rht_axis(spec), rht_of(spec));
}

}  // namespace exmy

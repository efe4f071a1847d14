// The declarations of the fast loops, the run-time choice of vector width,
// and the entry points that pick each loop's form for that width (with the
// scalar forms for CPUs without one).
#include "formats/fast/loops.hpp"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "formats/fast/tails.hpp"

namespace exmy::detail {

// ---------------------------------------------------------------------------
// Vector widths
// ---------------------------------------------------------------------------

const char* simd_name(Simd w) {
  switch (w) {
    case Simd::scalar: return "scalar";
    case Simd::avx2: return "avx2";
    case Simd::avx512: return "avx512";
  }
  return "?";
}

Simd simd_available() {
#if defined(__x86_64__)
  static const Simd have = [] {
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) return Simd::scalar;
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"))
      return Simd::avx512;
    return Simd::avx2;
  }();
  return have;
#else
  return Simd::scalar;
#endif
}

namespace {

Simd simd_from_env() {
  const Simd have = simd_available();
  const char* e = std::getenv("EXMY_SIMD");
  if (!e || !*e) return have;
  const std::string_view v(e);
  Simd want;
  if (v == "scalar") want = Simd::scalar;
  else if (v == "avx2") want = Simd::avx2;
  else if (v == "avx512") want = Simd::avx512;
  else {
    // Read on first use, which may be inside a parallel region: a line on
    // stderr, not an exception, and the widest width the CPU has.
    std::fprintf(stderr, "exmy: EXMY_SIMD=%s is not a vector width (expected scalar, avx2 or avx512); using %s\n", e,
                 simd_name(have));
    return have;
  }
  return std::min(want, have);
}

std::atomic<int> g_width{-1};

}  // namespace

Simd simd_width() {
  int w = g_width.load(std::memory_order_relaxed);
  if (w < 0) {
    w = static_cast<int>(simd_from_env());
    g_width.store(w, std::memory_order_relaxed);
  }
  return static_cast<Simd>(w);
}

Simd set_simd_width(Simd w) {
  const Simd got = std::min(w, simd_available());
  g_width.store(static_cast<int>(got), std::memory_order_relaxed);
  return got;
}

// ---------------------------------------------------------------------------
// What the loops handle
// ---------------------------------------------------------------------------

bool f64x4_handles(const QuantPlan& p) {
  const Format& f = p.fe;
  const int h = is_stochastic(p.round) ? p.sr_bits : 0;
  // (a subnormal max changes the spacing above max: left to the scalar core)
  // The loops take the parity of the index inside a binade for the parity
  // of the code, which holds only when M >= 1: with M = 0 the two differ in
  // every other binade, so rne and odd are left to the scalar core.
  if (f.M == 0 && (p.round == Round::rne || p.round == Round::odd)) return false;
  return p.saturate && f.subnormals && f.has_zero && (f.negzero || !f.is_signed) && f.bits <= 16 && f.M + h <= 40 &&
         f.max >= f.min_normal;
}

bool fp4x8_handles(const QuantPlan& p) {
  const Format& f = p.fe;
  const int h = is_stochastic(p.round) ? p.sr_bits : 0;
  if (!f64x4_handles(p) || f.E + f.M > 3 || f.M + h + 2 > 22) return false;
  // Ws = v * 2^(h+1+M-ee) and 2^(ee-M) must stay normal float32 powers of two.
  return !(h + 1 + f.M - f.emin > 126 || f.emin - f.M < -126 || f.max_exp > 126);
}

bool threshold_handles(const QuantPlan& p) {
  return p.has_scale && p.fs.code_bytes() == 1 && p.fe.is_signed && p.fe.code_bytes() == 1 && fp4x8_handles(p);
}

namespace {

constexpr uint16_t kAllModes = mode_bit(Round::rne) | mode_bit(Round::rna) | mode_bit(Round::rtz) |
                               mode_bit(Round::up) | mode_bit(Round::down) | mode_bit(Round::odd) |
                               mode_bit(Round::stochastic) | mode_bit(Round::stochastic_fast) |
                               mode_bit(Round::stochastic_fastest);
// The deterministic modes that treat x and -x alike: a magnitude code is
// then a count of thresholds |x| reaches.
constexpr uint16_t kSymmetricModes =
    mode_bit(Round::rne) | mode_bit(Round::rna) | mode_bit(Round::rtz) | mode_bit(Round::odd);
constexpr uint8_t kBothAriths = arith_bit(Arith::exact) | arith_bit(Arith::fp32);

}  // namespace

const LoopDecl kLoops[] = {
    {Loop::threshold_x16, "threshold-x16", Simd::avx512, kSymmetricModes, kBothAriths, 16, false, true, true, false,
     threshold_handles, Loop::fp4x8},
    {Loop::threshold_x8, "threshold-x8", Simd::avx2, kSymmetricModes, kBothAriths, 8, false, true, true, false,
     threshold_handles, Loop::fp4x8},
    {Loop::threshold_lanes_x16, "threshold-lanes-x16", Simd::avx512, kSymmetricModes, kBothAriths, 8, true, true,
     true, false, threshold_handles, Loop::fp4x8},
    {Loop::threshold_lanes_x8, "threshold-lanes-x8", Simd::avx2, kSymmetricModes, kBothAriths, 8, true, true, true, false,
     threshold_handles, Loop::fp4x8},
    {Loop::fp4x16, "fp4-x16", Simd::avx512, kAllModes, kBothAriths, 16, false, false, false, false, fp4x8_handles,
     Loop::scalar_core},
    {Loop::fp4x8, "fp4-x8", Simd::avx2, kAllModes, kBothAriths, 1, false, false, false, false, fp4x8_handles,
     Loop::scalar_core},
    {Loop::f64x4, "f64-x4", Simd::avx2, kAllModes, kBothAriths, 1, false, false, false, false, f64x4_handles,
     Loop::scalar_core},
};
const int kLoopCount = static_cast<int>(sizeof(kLoops) / sizeof(kLoops[0]));

namespace {
const LoopDecl kScalarCore{Loop::scalar_core, "scalar-core", Simd::scalar, 0xffff, 0xff, 1, false, false, false,
                           true, nullptr, Loop::scalar_core};
}  // namespace

const LoopDecl& loop_decl(Loop l) {
  for (int k = 0; k < kLoopCount; ++k)
    if (kLoops[k].loop == l) return kLoops[k];
  return kScalarCore;
}

bool loop_claims(const LoopDecl& d, const QuantPlan& p, int64_t n, Simd w) {
  if (d.loop == Loop::scalar_core) return true;
  if (d.needs > w || !(d.modes & mode_bit(p.round)) || !(d.ariths & arith_bit(p.arith))) return false;
  if (d.needs_scale && !p.has_scale) return false;
  if (d.needs_large && n < kThresholdMinElements) return false;
  // four over six and dithered scales (amax_sr): plans only the scalar core takes
  if ((p.four_six != FourSix::off || p.rule == ScaleRule::amax_sr) && !d.four_over_six) return false;
  // without a block scale a band is one run: no block width to declare
  if (p.has_scale && (p.bc % d.bc_multiple == 0) == d.bc_other) return false;
  return d.formats(p);
}

Loop choose_loop(const QuantPlan& p, int64_t n, Simd w) {
  for (int k = 0; k < kLoopCount; ++k)
    if (loop_claims(kLoops[k], p, n, w)) return kLoops[k].loop;
  return Loop::scalar_core;
}

namespace {
std::atomic<uint64_t> g_use[kLoopKinds];
}  // namespace

void loop_use_reset() {
  for (auto& u : g_use) u.store(0);
}
void loop_use_add(const uint64_t bands[kLoopKinds]) {
  for (int k = 0; k < kLoopKinds; ++k)
    if (bands[k]) g_use[k].fetch_add(bands[k], std::memory_order_relaxed);
}
void loop_use(uint64_t out[kLoopKinds]) {
  for (int k = 0; k < kLoopKinds; ++k) out[k] = g_use[k].load();
}

// ---------------------------------------------------------------------------
// Entry points: the form for the width in use
// ---------------------------------------------------------------------------
//
// The element loops are entered only where their declaration claims the plan
// (so only on a width that has them); their scalar forms serve callers that
// run them directly, as the tests do. The passes around them (block maxima,
// block scales) have a form for every width.

void stream_fence() {
#if defined(__x86_64__)
  _mm_sfence();
#endif
}

namespace {
bool have_avx2() { return simd_width() >= Simd::avx2; }
bool have_avx512() { return simd_width() >= Simd::avx512; }
}  // namespace

void f64x4_span(const QuantPlan& p, const BlockConsts& c, const F64Block& vb, const float* x, int64_t i0, int64_t n,
                uint8_t* codes, float* values, RandomBits& rng, SpanCounts& cnt) {
  if (have_avx2()) return avx2::f64x4_span(p, c, vb, x, i0, n, codes, values, rng, cnt);
  for (int64_t j = 0; j < n; ++j) core_element(p, c, x, i0 + j, j, codes, values, rng, cnt);
}

void fp4x8_row(const QuantPlan& p, const Fp4Row& row, uint8_t* codes, float* values, RandomBits& rng, SpanCounts& cnt) {
  if (have_avx2()) return avx2::fp4x8_row(p, row, codes, values, rng, cnt);
  for (int64_t b = 0; b < row.nblocks; ++b) {
    if (!row.use[row.key(b)]) continue;
    const int64_t n = std::min(row.bc, row.cols - b * row.bc);
    for (int64_t j = 0; j < n; ++j)
      core_element(p, row.consts[row.key(b)], row.x + b * row.bc, row.i0 + b * row.bc + j, j, codes, values, rng,
                   cnt);
  }
}

void fp4_blocks(const QuantPlan& p, const Fp4Magnitudes& m, const BlockConsts* c, int64_t n, Fp4Block* out) {
  if (have_avx2()) return avx2::fp4_blocks(p, m, c, n, out);
  for (int64_t j = 0; j < n; ++j)
    for (uint32_t q = 0; q < 8; ++q) out[j].table[q] = q <= p.fe.max_mag ? dequant(p, c[j], q) : 0.0f;
}

void threshold_row(const QuantPlan& p, const ThrRow& row, uint8_t* codes, float* values, SpanCounts& cnt) {
  if (have_avx512() && row.bc % 16 == 0) return avx512::threshold_row(p, row, codes, values, cnt);
  if (have_avx2()) return avx2::threshold_row(p, row, codes, values, cnt);
  RandomBits rng(p.seed, p.stream, 8);
  for (int64_t b = 0; b < row.nblocks; ++b) {
    if (!row.use[row.code[b]]) continue;
    const int64_t n = std::min(row.bc, row.cols - b * row.bc);
    for (int64_t j = 0; j < n; ++j)
      core_element(p, row.consts[row.code[b]], row.x + b * row.bc, row.i0 + b * row.bc + j, j, codes, values, rng,
                   cnt);
  }
}

void threshold_band_lanes(const QuantPlan& p, const ThrRow& band, uint8_t* codes, float* values, SpanCounts& cnt) {
  if (have_avx512()) return avx512::threshold_band_lanes(p, band, codes, values, cnt);
  if (have_avx2()) return avx2::threshold_band_lanes(p, band, codes, values, cnt);
  for (int64_t r = 0; r < band.rows; ++r) {
    ThrRow row = band;
    row.x = band.x + r * band.cols;
    row.i0 = band.i0 + r * band.cols;
    row.rows = 1;
    threshold_row(p, row, codes, values, cnt);
  }
}

bool block_scales_vec(const QuantPlan& p, const uint32_t* bmax_bits, int64_t n, BlockScale* out) {
  return have_avx2() && avx2::block_scales_vec(p, bmax_bits, n, out);
}

bool block_scale_codes(const QuantPlan& p, const ScaleThr* thr, const uint32_t* bmax_bits, int64_t n, uint8_t* codes,
                       ScaleCodeOut& out) {
  if (have_avx512()) return avx512::block_scale_codes(p, thr, bmax_bits, n, codes, out);
  return have_avx2() && avx2::block_scale_codes(p, thr, bmax_bits, n, codes, out);
}

bool band_block_max_bits(const float* x, int64_t rows, int64_t cols, int64_t bc, uint32_t* out, const float* next) {
  if (have_avx512()) return avx512::band_block_max_bits(x, rows, cols, bc, out, next);
  if (have_avx2()) return avx2::band_block_max_bits(x, rows, cols, bc, out, next);
  std::fill(out, out + (cols + bc - 1) / bc, 0u);
  for (int64_t i = 0; i < rows * cols; ++i) {
    const uint32_t b = bits_of(x[i]) & 0x7fffffffu;
    uint32_t& m = out[(i % cols) / bc];
    m = b > m ? b : m;
  }
  return false;
}

uint32_t abs_max_bits(const float* x, int64_t n) {
  if (have_avx512()) return avx512::abs_max_bits(x, n);
  if (have_avx2()) return avx2::abs_max_bits(x, n);
  uint32_t r = 0;
  for (int64_t j = 0; j < n; ++j) {
    const uint32_t b = bits_of(x[j]) & 0x7fffffffu;
    r = b > r ? b : r;
  }
  return r;
}

}  // namespace exmy::detail

// The fast CPU path of quantize(): a set of declared loops, each with the
// rounding modes, arithmetics, block shapes and element formats it handles,
// chosen at run time for the widest vector unit the CPU has (or the one
// EXMY_SIMD asks for). Internal to formats/quantize.cpp and its tests (and
// formats/cuda/quantize.cu, whose threshold path takes the plans
// threshold_handles takes); the layout and how to add a loop are in
// docs/architecture.md.
//
// How the multiply-and-convert loops stay bit-exact. In `exact` arithmetic
// the element value is v = |x| * t / s. The vector loop multiplies by a
// per-block r = RN(t / s) instead of dividing, so its v' is within 2^-51
// (relative) of v. Rounding decisions only change where v crosses a decision
// boundary of the format (a multiple of ulp / 2^(n+1)), and the saturation
// count only where it crosses max; a lane whose v' lies within 2^-48
// (relative) of such a point is marked uncertain and recomputed by the
// scalar core, which is exact. The dequantized value q * s / t is treated the
// same way: lanes whose double product lies near a float32 rounding boundary
// go to the scalar core. When r (or s / t) is exact, e.g. power-of-two
// scales, no lane is ever uncertain. In `fp32` arithmetic every operation is
// a float32 operation that the vector unit performs with the same IEEE
// rounding, so nothing is approximate. The threshold loops compare |x|
// against thresholds found with the scalar core itself, so they are exact by
// construction.
#pragma once

#include <cstdint>
#include <type_traits>

#include "formats/philox.hpp"
#include "formats/quant_core.hpp"
#include "formats/quant_sums.hpp"
#include "formats/thresholds.hpp"

namespace exmy {
struct RhtParams;  // formats/hadamard_segment.hpp
}  // namespace exmy

namespace exmy::detail {

// f(std::integral_constant<Round, R>{}) for R = r: the one switch from a
// call's rounding mode to a loop's template argument (the loops are
// instantiated per mode, so that each step's rounding is a constant).
template <class F>
void with_round(Round r, F&& f) {
  using R = Round;
  switch (r) {
    case R::rne: return f(std::integral_constant<R, R::rne>{});
    case R::rna: return f(std::integral_constant<R, R::rna>{});
    case R::rtz: return f(std::integral_constant<R, R::rtz>{});
    case R::up: return f(std::integral_constant<R, R::up>{});
    case R::down: return f(std::integral_constant<R, R::down>{});
    case R::odd: return f(std::integral_constant<R, R::odd>{});
    case R::stochastic: return f(std::integral_constant<R, R::stochastic>{});
    case R::stochastic_fast: return f(std::integral_constant<R, R::stochastic_fast>{});
    case R::stochastic_fastest: return f(std::integral_constant<R, R::stochastic_fastest>{});
  }
}

struct SpanCounts {
  uint64_t nonzero = 0, underflow = 0, saturated = 0, subnormal = 0;
};

// Per-block constants of the vector loop.
struct F64Block {
  double r = 1;        // exact: RN(t / s) (no scale: t)
  bool r_exact = true; // r is exactly t / s
  double u = 1;        // exact: RN(s / t) (no scale: RN(1 / t))
  bool u_exact = true;
  double s = 1;        // decoded scale
};

// The element formats and options the 4-double loop handles (its rounding
// modes and arithmetics are its row of kLoops): saturation on, an element
// format with zero, subnormals and -0 (or unsigned), at most 16 bits, and
// M + n <= 40.
bool f64x4_handles(const QuantPlan& p);

F64Block f64_block(const QuantPlan& p, const BlockConsts& c);

// Quantizes the n elements x[0..n) whose row-major flat indices are
// i0 .. i0+n-1, all in one block with constants (c, vb). Writes codes (at
// codes + i0 * code_bytes, when codes is not null) and values (at
// values + i0) and adds to the counts. Returns the flat index of the first
// element whose encoding was unrepresentable (never, with saturation on) or
// -1.
void f64x4_span(const QuantPlan& p, const BlockConsts& c, const F64Block& vb, const float* x, int64_t i0, int64_t n,
              uint8_t* codes, float* values, RandomBits& rng, SpanCounts& cnt);

// The 8-lane float32 loop for formats with at most 8 magnitudes (E + M <= 3:
// e2m1 and smaller), where the dequantized value of every code of a block
// is precomputed exactly into an 8-entry table. Same uncertainty rule as
// above, at float precision: v' = fl(|x| fl(t / s)) is within 2^-23 (1 +
// 2^-21) of v, relative, so a lane within 2^-22 (relative) of a decision
// boundary goes to the scalar core (docs/numerics.md, "How the fast CPU path
// stays exact").
struct Fp4Block {
  float r = 1;          // exact arithmetic: fl(t / s) (no scale: t)
  bool ok = true;       // r is a normal float32 (else the block takes the scalar loop)
  float table[8] = {};  // x-hat of magnitude codes 0..7
};

// ... and those of the 8-lane FP4 loop: what f64x4_handles takes with at
// most 8 magnitudes (E + M <= 3) and float32-range scale factors.
bool fp4x8_handles(const QuantPlan& p);
// The magnitudes of codes 0..7 of an FP4-class format, as odd integer parts
// times powers of two, computed once per call.
struct Fp4Magnitudes {
  int nodd = 0;          // distinct odd parts
  double odd[8] = {};    // the odd parts
  int idx[8] = {};       // code q: its odd part is odd[idx[q]] (-1: zero or past max)
  double pw[8] = {};     // code q: magnitude = odd[idx[q]] * pw[q]
  float mag[8] = {};     // code q: its magnitude as a float (0 past max)
};
Fp4Magnitudes fp4_magnitudes(const QuantPlan& p);
// The vector-loop constants of n blocks (4 at a time): r, ok and the
// dequantization table, equal to dequant() of every magnitude code.
void fp4_blocks(const QuantPlan& p, const Fp4Magnitudes& m, const BlockConsts* c, int64_t n, Fp4Block* out);

// One row of a band: `cols` elements starting at flat index i0, cut into
// blocks of bc columns (the last may be partial). Block b's constants are
// consts[k] and vb[k], and it is skipped (the caller encodes it) where
// use[k] is 0, with k = b, or, when `code` is set, k = code[b] (its scale
// code: the tables are then by code, and blocks cost one byte to look up).
// The block-per-lane form of the 8-lane loop (widths not a multiple of 8)
// takes per-block tables only.
struct Fp4Row {
  const float* x;
  int64_t i0, cols, bc, nblocks;
  const BlockConsts* consts;
  const Fp4Block* vb;
  const uint8_t* use;
  bool stats = true;  // count nonzero/underflow/saturated/subnormal
  const uint8_t* code = nullptr;
  // Non-temporal stores of the values and one-byte codes (outputs far larger
  // than the cache; values 16-byte aligned, rows a multiple of 4 long): the
  // 16-lane loop only. Other threads see them after stream_fence().
  bool stream = false;
  // The same row of the next band (or null): one cache line of it is
  // prefetched per 16 elements, as ThrRow::prefetch (per-block steps only).
  const float* prefetch = nullptr;
  bool prefetch_half = false;  // as ThrRow::prefetch_half
  int64_t key(int64_t b) const { return code ? code[b] : b; }  // index of block b's constants
};
void fp4x8_row(const QuantPlan& p, const Fp4Row& row, uint8_t* codes, float* values, RandomBits& rng, SpanCounts& cnt);

// The threshold form of the 8-lane loop, for deterministic modes that treat
// x and -x alike (rne, rna, rtz, odd). Within one block the magnitude code
// of an element never decreases as |x| grows, in either arithmetic, so it is
// the number of thresholds t_k (the least |x| whose code is >= k) that |x|
// reaches; comparing float32 bit patterns as integers orders them like the
// magnitudes. The thresholds are found with the scalar core itself (a
// search over float32 bit patterns around the point the format predicts),
// so the loop agrees with it for every finite input, in `exact` arithmetic
// too, without the uncertainty rule. They depend only on the block's scale
// code within a call, so they are made once per scale code.
struct ThrBlock {
  int32_t t[7] = {};  // (least |x| bits with magnitude code >= k+1) - 1; 0x7f7fffff if none is finite
  int32_t sat = 0;    // (least |x| bits the scalar core counts as saturated) - 1
  float table[8] = {};  // x-hat of magnitude codes 0..7
};
// ... and those of the threshold loops: fp4x8_handles, a block scale with
// one-byte codes, a signed element format with one-byte codes.
bool threshold_handles(const QuantPlan& p);
// Thresholds of a block with constants c, and its table (from vb).
void threshold_block(const QuantPlan& p, const BlockConsts& c, const Fp4Block& vb, ThrBlock& out);
// One row of a band for the threshold loop. Block b has scale code
// code[b]; the loop takes it when use[code[b]], with thresholds
// thr[code[b]] (consts[code[b]] for the scalar core's tails).
struct ThrRow {
  const float* x;
  int64_t i0, cols, bc, nblocks;
  const uint8_t* code;
  const BlockConsts* consts;  // by scale code
  const ThrBlock* thr;         // by scale code
  const uint8_t* use;         // by scale code
  bool stats = true;
  // Write values and codes with non-temporal stores (past the caches);
  // needs values + i0 16-byte aligned and bc a multiple of 4. Other threads
  // see them after stream_fence().
  bool stream = false;
  // Where this thread reads next, row-aligned with x (the same row of the
  // next band), or null: one cache line of it is prefetched per 16 elements
  // quantized, so the next band arrives while this one computes. (For
  // threshold_band_lanes: the first row of the next band, `rows` rows as
  // this one, which its 16-lane form prefetches in address order with its
  // codes.)
  const float* prefetch = nullptr;
  // The band's own block-max pass prefetched the first half of `prefetch`
  // (band_block_max_bits with next): the loop takes the second half, one line
  // per 32 elements (prefetch_next_line). threshold_row only.
  bool prefetch_half = false;
  // Rows of x (cols elements apart) that share the blocks: threshold_band_lanes
  // only; threshold_row takes one row.
  int64_t rows = 1;
};
void threshold_row(const QuantPlan& p, const ThrRow& row, uint8_t* codes, float* values, SpanCounts& cnt);
// The threshold loop for blocks whose width is not a multiple of 8 (Bx1
// columns, 1x4, 4x4, 1x12 ...), which the per-block loop would leave partly
// or wholly to the scalar core: every lane takes the thresholds and table of
// its own column's block, laid out column by column (a chunk of 256 columns
// at a time, which all `rows` rows of the band then run through), so the
// eight lanes of a step may belong to eight blocks; x-hat
// follows the nested compare masks up the table. Streaming needs values + i0
// 16-byte aligned and cols a multiple of 4. The last cols % 8 columns go to
// the scalar core.
void threshold_band_lanes(const QuantPlan& p, const ThrRow& band, uint8_t* codes, float* values, SpanCounts& cnt);

// Block decode scales of n blocks from their amax bits (as abs_max_bits
// gives them), 4 at a time, for the amax-* rules and scale formats with zero
// and subnormals; identical to block_scale(). NaN blocks are left to the
// caller. Returns false (and does nothing) when the plan is not covered.
bool block_scales_vec(const QuantPlan& p, const uint32_t* bmax_bits, int64_t n, BlockScale* out);

// Block scale codes by thresholds (ScaleThr, scale_code_thresholds): formats/thresholds.hpp.

// What block_scale_codes adds up besides the codes.
struct ScaleCodeOut {
  uint64_t saturated = 0, underflow = 0, subnormal = 0;  // scales, as docs/numerics.md §5 counts them
  uint32_t max_bits = 0;                                 // max of the block maxima
  uint32_t code_min = 0xff, code_max = 0;                // range of the codes written
  uint64_t by_threshold = 0;                             // blocks coded by the threshold form
};

// The common case of block_scales_vec for one-byte scale codes: the scale
// code of each block (after the zero-scale guard) into codes[0..n), with the
// counts, maximum and code range in `out` (accumulated). Blocks whose amax
// the thresholds thr cover (when given and ok) take them, eight at a time;
// the others take the vector arithmetic of block_scales_vec. Returns false
// (out then undefined) when the plan is not covered or a maximum is Inf or
// NaN.
bool block_scale_codes(const QuantPlan& p, const ScaleThr* thr, const uint32_t* bmax_bits, int64_t n, uint8_t* codes,
                       ScaleCodeOut& out);

// The block maxima of `rows` consecutive rows (a band of B x B blocks, or
// one row): out[j] = max over the band of |x| bits in block column j (what
// out held before is ignored). Row-major x, `cols` per row. With `next` (the
// next band's first row, which this thread quantizes next), a one-row pass
// may also prefetch the first half of that row, a line per 32 of its own
// elements, so that the memory traffic runs on through this pass as through
// the element loop after it; returns whether it did (the element loop then
// prefetches the second half: ThrRow::prefetch_half).
bool band_block_max_bits(const float* x, int64_t rows, int64_t cols, int64_t bc, uint32_t* out,
                         const float* next = nullptr);

// The next band's line an element loop prefetches at element offset j of its
// row (a multiple of 16): the line at pf + j, or with `half` (see
// ThrRow::prefetch_half), for every other step, the line at pf + j / 2 (pf
// then the row's second half).
inline void prefetch_next_line(const float* pf, bool half, int64_t j) {
  if (!half) __builtin_prefetch(pf + j, 0, 3);
  else if ((j & 16) == 0) __builtin_prefetch(pf + j / 2, 0, 3);
}
// ... for the n elements of a block at offset j0 in the row (the per-block loops).
inline void prefetch_next_lines(const float* pf, bool half, int64_t j0, int64_t n) {
  for (int64_t j = 0; j < n; j += 16) prefetch_next_line(pf, half, j0 + j);
}

// max|x| over x[0..n) as float32 bits, NaN bits (> 0x7f800000) if any NaN.
uint32_t abs_max_bits(const float* x, int64_t n);

// The partials of four segments of n terms each (lane k: x[k], xh[k]) at
// once, lane k exactly segment_partial(x[k], xh[k], n): with AVX each lane of
// a 4-double vector adds its own segment's terms one after another, so the
// four sequential chains run side by side.
void segment_partials4(const float* const x[4], const float* const xh[4], int64_t n, SumPartial out[4]);
// How many segments segment_partials takes at once on this width (4 or 8),
// and the partials of that many (lane k exactly segment_partial(x[k], xh[k], n)).
int segment_lanes();
void segment_partials(const float* const* x, const float* const* xh, int64_t n, SumPartial* out);

// ---------------------------------------------------------------------------
// Vector widths, chosen at run time
// ---------------------------------------------------------------------------

// The vector units the loops are written for, narrowest first. One binary
// carries every form (each file of a width is compiled for that width
// alone, with `#pragma GCC target`, or `#pragma clang attribute` under clang); the CPU decides at run time.
enum class Simd : uint8_t { scalar, avx2, avx512 };
const char* simd_name(Simd w);
// Orders the calling thread's non-temporal stores (the loops' `stream`
// rows) before its later stores, so that other threads that synchronize
// with it see them: a thread calls it once after its last streamed row,
// not per row (a fence per 16 KiB row cost held 1x16 about 10% on an
// Intel Xeon, family 6 model 207). The thread itself reads its own
// streamed values without it.
void stream_fence();

// The widest the CPU has: avx2 needs AVX2 and FMA, avx512 needs AVX-512
// F, BW, DQ and VL.
Simd simd_available();
// The width the loops use: simd_available(), or less where the environment
// variable EXMY_SIMD (scalar, avx2 or avx512) asks for less, read once (an
// unknown value is reported on stderr and ignored).
Simd simd_width();
// Sets the width for the rest of the process (clamped to what the CPU has;
// returns the width set). For tests and benchmarks that compare widths.
Simd set_simd_width(Simd w);

// ---------------------------------------------------------------------------
// The element loops and what each declares it handles
// ---------------------------------------------------------------------------

enum class Loop : uint8_t {
  scalar_core,         // formats/quant_core.hpp, element by element: everything
  f64x4,               // f64x4_span
  fp4x8,               // fp4x8_row
  threshold_x8,        // threshold_row, 8 lanes
  threshold_lanes_x8,  // threshold_band_lanes (a block per lane)
  threshold_x16,       // threshold_row, 16 lanes
  threshold_lanes_x16, // threshold_band_lanes, 16 lanes
  fp4x16,              // avx512::fp4x16_row
};
constexpr int kLoopKinds = 8;

constexpr uint16_t mode_bit(Round r) { return static_cast<uint16_t>(1u << static_cast<unsigned>(r)); }
constexpr uint8_t arith_bit(Arith a) { return static_cast<uint8_t>(1u << static_cast<unsigned>(a)); }

// One row per fast loop: the rounding modes, arithmetics and block widths
// it handles, the element formats and options (a predicate on the plan),
// the vector unit it needs, and whether it needs a block scale and a large
// enough call (the threshold loops' constants cost a search per scale
// code). A plan no row claims takes the scalar core; a mode, arithmetic or
// shape a row does not list never enters it.
struct LoopDecl {
  Loop loop;
  const char* name;
  Simd needs;
  uint16_t modes;   // mode_bit of every rounding mode handled
  uint8_t ariths;   // arith_bit of every arithmetic handled
  int bc_multiple;  // block widths (or rows, without a scale) that are multiples of this
  bool bc_other;    // true: only widths that are NOT multiples of bc_multiple
  bool needs_scale;
  bool needs_large;                   // at least kThresholdMinElements elements in the call
  // Whether it handles four over six (docs/numerics.md §3), whose scale
  // choice needs every element of a block under two scales first: no vector
  // loop does, so those plans take the scalar core.
  bool four_over_six;
  bool (*formats)(const QuantPlan&);  // element formats and options handled
  // Bands this loop declines at run time (Inf or NaN in the band, scale
  // codes outside its cover) go to this loop, whose declaration is implied.
  Loop band_fallback;
};
constexpr int64_t kThresholdMinElements = int64_t{1} << 15;

// The rows, in order of preference (widest first within a kind).
extern const LoopDecl kLoops[];
extern const int kLoopCount;

const LoopDecl& loop_decl(Loop l);
// Whether row d claims plan p for a call of n elements on width w.
bool loop_claims(const LoopDecl& d, const QuantPlan& p, int64_t n, Simd w);
// The loop a call of n elements takes: the first row that claims it, else
// the scalar core.
Loop choose_loop(const QuantPlan& p, int64_t n, Simd w = simd_width());

// Bands served by each loop since the last reset (bands of one call are
// added when the call ends): what the dispatch test reads.
void loop_use_reset();
void loop_use_add(const uint64_t bands[kLoopKinds]);
void loop_use(uint64_t out[kLoopKinds]);

// ---------------------------------------------------------------------------
// The forms of each width (called through the functions above, which pick
// by simd_width(); a width's files define its namespace)
// ---------------------------------------------------------------------------

namespace avx2 {
void f64x4_span(const QuantPlan& p, const BlockConsts& c, const F64Block& vb, const float* x, int64_t i0, int64_t n,
                uint8_t* codes, float* values, RandomBits& rng, SpanCounts& cnt);
void fp4x8_row(const QuantPlan& p, const Fp4Row& row, uint8_t* codes, float* values, RandomBits& rng, SpanCounts& cnt);
void fp4_blocks(const QuantPlan& p, const Fp4Magnitudes& m, const BlockConsts* c, int64_t n, Fp4Block* out);
void threshold_row(const QuantPlan& p, const ThrRow& row, uint8_t* codes, float* values, SpanCounts& cnt);
void threshold_band_lanes(const QuantPlan& p, const ThrRow& band, uint8_t* codes, float* values, SpanCounts& cnt);
bool block_scales_vec(const QuantPlan& p, const uint32_t* bmax_bits, int64_t n, BlockScale* out);
bool block_scale_codes(const QuantPlan& p, const ScaleThr* thr, const uint32_t* bmax_bits, int64_t n, uint8_t* codes,
                       ScaleCodeOut& out);
// Whether block_scale_codes takes plan p at all (else it returns false).
bool scale_codes_cover(const QuantPlan& p);
bool band_block_max_bits(const float* x, int64_t rows, int64_t cols, int64_t bc, uint32_t* out,
                         const float* next = nullptr);
uint32_t abs_max_bits(const float* x, int64_t n);
}  // namespace avx2

namespace avx512 {
// Blocks of a width that is a multiple of 16 (others: avx2::threshold_row).
void threshold_row(const QuantPlan& p, const ThrRow& row, uint8_t* codes, float* values, SpanCounts& cnt);
// A block per lane, 16 lanes (the last cols % 16 columns: the scalar core).
void threshold_band_lanes(const QuantPlan& p, const ThrRow& band, uint8_t* codes, float* values, SpanCounts& cnt);
// 16 lanes for 1xB bands with B a multiple of 16, and bands of several rows
// 16k columns wide (others: the avx2 form); `next` for 1xB rows, B a
// multiple of 16.
bool band_block_max_bits(const float* x, int64_t rows, int64_t cols, int64_t bc, uint32_t* out,
                         const float* next = nullptr);
uint32_t abs_max_bits(const float* x, int64_t n);
// The threshold form of block_scale_codes, 16 blocks a step (the AVX2 form
// for the steps and plans it does not cover).
bool block_scale_codes(const QuantPlan& p, const ScaleThr* thr, const uint32_t* bmax_bits, int64_t n, uint8_t* codes,
                       ScaleCodeOut& out);
// fp4x8_row's per-block form in 16 lanes, for blocks of a width that is a
// multiple of 16 (or no block scale); the row's last partial step and the
// uncertain lanes: the scalar core.
void fp4x16_row(const QuantPlan& p, const Fp4Row& row, uint8_t* codes, float* values, RandomBits& rng,
                SpanCounts& cnt);
// Philox words of `steps` x 16 counter blocks from block c on: out[64 s + 4 i + w]
// = word w of block c + 16 s + i (philox_words' AVX-512 form).
void philox_words64(uint64_t seed, uint64_t stream, uint64_t c, int64_t steps, uint32_t* out);
// Eight segment partials side by side (segment_partials4's eight-lane form).
void segment_partials8(const float* const x[8], const float* const xh[8], int64_t n, SumPartial out[8]);
// The p.size-point Hadamard transform of nseg consecutive segments in place
// (along rows): rht_transform_segment's bits (formats/fast/rht_x16.cpp).
void rht_rows(float* x, int64_t nseg, const RhtParams& p);
// ... and of the column segments s0 .. s1 - 1 of x [rows, cols] (axis 0;
// rht_segment's numbering), eight columns a step.
void rht_cols(float* x, int64_t cols, int64_t s0, int64_t s1, const RhtParams& p);
}  // namespace avx512

}  // namespace exmy::detail

// The vectorised element loop of the fast CPU path (AVX2 + FMA, 4 doubles per
// step). Internal to formats/quantize.cpp.
//
// How it stays bit-exact. In `exact` arithmetic the element value is
// v = |x| * t / s. The vector loop multiplies by a per-block r = RN(t / s)
// instead of dividing, so its v' is within 2^-51 (relative) of v. Rounding
// decisions only change where v crosses a decision boundary of the format
// (a multiple of ulp / 2^(n+1)), and the saturation count only where it
// crosses max; a lane whose v' lies within 2^-48 (relative) of such a point
// is marked uncertain and recomputed by the scalar core, which is exact.
// The dequantized value q * s / t is treated the same way: lanes whose
// double product lies near a float32 rounding boundary go to the scalar
// core. When r (or s / t) is exact, e.g. power-of-two scales, no lane is
// ever uncertain. In `fp32` arithmetic every operation is a float32
// operation that the vector unit performs with the same IEEE rounding, so
// nothing is approximate.
#pragma once

#include <cstdint>

#include "formats/philox.hpp"
#include "formats/quant_core.hpp"
#include "formats/quant_sums.hpp"

namespace exmy::detail {

struct SpanCounts {
  uint64_t nonzero = 0, underflow = 0, saturated = 0, subnormal = 0;
};

// Per-block constants of the vector loop.
struct VecBlock {
  double r = 1;        // exact: RN(t / s) (no scale: t)
  bool r_exact = true; // r is exactly t / s
  double u = 1;        // exact: RN(s / t) (no scale: RN(1 / t))
  bool u_exact = true;
  double s = 1;        // decoded scale
};

// True when the vector loop handles this plan (otherwise the scalar loop
// runs): AVX2 present at build time, saturation on, an element format with
// zero, subnormals and -0 (or unsigned), at most 16 bits, and
// M + n <= 40.
bool vec_supported(const QuantPlan& p);

VecBlock vec_block(const QuantPlan& p, const BlockConsts& c);

// Quantizes the n elements x[0..n) whose row-major flat indices are
// i0 .. i0+n-1, all in one block with constants (c, vb). Writes codes (at
// codes + i0 * code_bytes, when codes is not null) and values (at
// values + i0) and adds to the counts. Returns the flat index of the first
// element whose encoding was unrepresentable (never, with saturation on) or
// -1.
void vec_span(const QuantPlan& p, const BlockConsts& c, const VecBlock& vb, const float* x, int64_t i0, int64_t n,
              uint8_t* codes, float* values, RandomBits& rng, SpanCounts& cnt);

// The 8-lane float32 loop for formats with at most 8 magnitudes (E + M <= 3:
// e2m1 and smaller), where the dequantized value of every code of a block
// is precomputed exactly into an 8-entry table. Same uncertainty rule as
// above, at float precision: a lane within 2^-20 (relative) of a decision
// boundary goes to the scalar core.
struct Vec4Block {
  float r = 1;          // exact arithmetic: fl(t / s) (no scale: t)
  bool ok = true;       // r is a normal float32 (else the block takes the scalar loop)
  float table[8] = {};  // x-hat of magnitude codes 0..7
};

bool vec4_supported(const QuantPlan& p);
// The magnitudes of codes 0..7 of an FP4-class format, as odd integer parts
// times powers of two, computed once per call.
struct Vec4Mags {
  int nodd = 0;          // distinct odd parts
  double odd[8] = {};    // the odd parts
  int idx[8] = {};       // code q: its odd part is odd[idx[q]] (-1: zero or past max)
  double pw[8] = {};     // code q: magnitude = odd[idx[q]] * pw[q]
  float mag[8] = {};     // code q: its magnitude as a float (0 past max)
};
Vec4Mags vec4_magnitudes(const QuantPlan& p);
// The vector-loop constants of n blocks (4 at a time): r, ok and the
// dequantization table, equal to dequant() of every magnitude code.
void vec4_blocks(const QuantPlan& p, const Vec4Mags& m, const BlockConsts* c, int64_t n, Vec4Block* out);

// One row of a band: `cols` elements starting at flat index i0, cut into
// blocks of bc columns (the last may be partial). Blocks with use[b] false
// are skipped (the caller encodes them).
struct Row4 {
  const float* x;
  int64_t i0, cols, bc, nblocks;
  const BlockConsts* consts;
  const Vec4Block* vb;
  const uint8_t* use;
  bool stats = true;  // count nonzero/underflow/saturated/subnormal
};
void vec4_row(const QuantPlan& p, const Row4& row, uint8_t* codes, float* values, RandomBits& rng, SpanCounts& cnt);

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
struct Vec4Thr {
  int32_t t[7] = {};  // (least |x| bits with magnitude code >= k+1) - 1; 0x7f7fffff if none is finite
  int32_t sat = 0;    // (least |x| bits the scalar core counts as saturated) - 1
  float table[8] = {};  // x-hat of magnitude codes 0..7
};
bool vec4_thr_supported(const QuantPlan& p);
// Thresholds of a block with constants c, and its table (from vb).
void vec4_thresholds(const QuantPlan& p, const BlockConsts& c, const Vec4Block& vb, Vec4Thr& out);
// One row of a band for the threshold loop. Block b has scale code
// code[b]; the loop takes it when use[code[b]], with thresholds
// thr[code[b]] (consts[code[b]] for the scalar core's tails).
struct Row4T {
  const float* x;
  int64_t i0, cols, bc, nblocks;
  const uint8_t* code;
  const BlockConsts* consts;  // by scale code
  const Vec4Thr* thr;         // by scale code
  const uint8_t* use;         // by scale code
  bool stats = true;
  // Write values and codes with non-temporal stores (past the caches);
  // needs values + i0 16-byte aligned and bc a multiple of 4.
  bool stream = false;
  // Where this thread reads next, row-aligned with x (the same row of the
  // next band), or null: one cache line of it is prefetched per 16 elements
  // quantized, so the next band arrives while this one computes.
  const float* prefetch = nullptr;
  // Rows of x (cols elements apart) that share the blocks: vec4_band_thr_lanes
  // only; vec4_row_thr takes one row.
  int64_t rows = 1;
};
void vec4_row_thr(const QuantPlan& p, const Row4T& row, uint8_t* codes, float* values, SpanCounts& cnt);
// The threshold loop for blocks whose width is not a multiple of 8 (Bx1
// columns, 1x4, 4x4, 1x12 ...), which the per-block loop would leave partly
// or wholly to the scalar core: every lane takes the thresholds and table of
// its own column's block, laid out column by column (a chunk of 256 columns
// at a time, which all `rows` rows of the band then run through), so the
// eight lanes of a step may belong to eight blocks; x-hat
// follows the nested compare masks up the table. Streaming needs values + i0
// 16-byte aligned and cols a multiple of 4. The last cols % 8 columns go to
// the scalar core.
void vec4_band_thr_lanes(const QuantPlan& p, const Row4T& band, uint8_t* codes, float* values, SpanCounts& cnt);

// Block decode scales of n blocks from their amax bits (as abs_max_bits
// gives them), 4 at a time, for the amax-* rules and scale formats with zero
// and subnormals; identical to block_scale(). NaN blocks are left to the
// caller. Returns false (and does nothing) when the plan is not covered.
bool block_scales_vec(const QuantPlan& p, const uint32_t* bmax_bits, int64_t n, BlockScale* out);

// Block scale codes by thresholds. With the tensor scale fixed (one call),
// a block's scale code never decreases as its amax b grows, and doubling b
// adds P = 2^M (scale format Fs = eMm) to every normal, unsaturated code:
// each rule computes from b t (or fl(b G)) with operations that commute with
// powers of two while nothing leaves the normal ranges. So for b in
// [t0, t0 + span) (as float32 bits) the code is
//   c_lo + P n + #{j >= 1 : r >= D_j},   d = bits(b) - t0, n = d >> 23,
//   r = d & (2^23 - 1),
// where t0 = the least b whose code is c_lo = P + 1 (the first code whose
// lower neighbour is normal too: the step from the largest subnormal to the
// smallest normal is not repeated), D_j = (least b with code c_lo + j) - t0, and span ends where the code would
// reach Fs's largest magnitude. The thresholds come from the scalar
// block_scale() (searches on float32 bit patterns), so the codes are its own.
struct ScaleThr {
  bool ok = false;
  uint32_t t0 = 0, span = 0;
  uint32_t c_lo = 0, m = 0;  // P + 1, log2 P
  int32_t d1[7] = {};        // D_j - 1 for j = 1 .. P-1; INT32_MAX when j >= P
};
// Thresholds for plan p (its tensor scale set); ok false when Fs has more
// than 3 mantissa bits, codes wider than a byte, or ranges the derivation
// does not cover.
ScaleThr scale_code_thresholds(const QuantPlan& p);

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
// out held before is ignored). Row-major x, `cols` per row.
void band_block_max_bits(const float* x, int64_t rows, int64_t cols, int64_t bc, uint32_t* out);

// max|x| over x[0..n) as float32 bits, NaN bits (> 0x7f800000) if any NaN.
uint32_t abs_max_bits(const float* x, int64_t n);

// The partials of four segments of n terms each (lane k: x[k], xh[k]) at
// once, lane k exactly segment_partial(x[k], xh[k], n): with AVX each lane of
// a 4-double vector adds its own segment's terms one after another, so the
// four sequential chains run side by side.
void segment_partials4(const float* const x[4], const float* const xh[4], int64_t n, SumPartial out[4]);

}  // namespace exmy::detail

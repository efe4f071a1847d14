// Block-scaled quantization of docs/numerics.md §3, one block and one element at a
// time: the tensor scale, the block decode scale and the element encoding in
// `exact` and `fp32` arithmetic. Plain header code, shared by the scalar
// reference, the threaded CPU path and the CUDA kernel, so that all of them
// make the same decisions from the same code.
#pragma once

#include <cfloat>
#include <cmath>
#include <cstdint>

#include "formats/format.hpp"
#include "formats/philox.hpp"
#include "formats/round.hpp"

namespace exmy {

// amax_sr: the amax scale rounded into Fs stochastically ("dithered"
// scales), from the call's scale stream (scale_random_bits).
enum class ScaleRule : uint8_t { amax_rne, amax_up, amax_down, mx_floor, mx_ceil, mx_even, amax_sr };
enum class Arith : uint8_t { exact, fp32 };
enum class ZeroScale : uint8_t { zero, one };
enum class AmaxKind : uint8_t { none, current, given };
// Four over six (docs/numerics.md §3, "Four over six"): off (every block
// takes the usual scale), always_4 (every block the 4 scale), or the block
// error (sum of squared or of absolute errors) that picks each block's scale.
enum class FourSix : uint8_t { off, always_4, mse, mae };

// Everything a kernel needs, validated and precomputed on the host
// (QuantSpec::plan in formats/quantize.hpp). Trivially copyable.
struct QuantPlan {
  Format fe;               // element format
  Format fs;               // scale format (valid if has_scale)
  bool has_scale = false;
  int br = 1, bc = 16;     // block rows, block columns
  ScaleRule rule = ScaleRule::amax_rne;
  Round round = Round::rne;
  int sr_bits = 8;         // random bits per element for stochastic modes
  int scale_sr_bits = 0;   // random bits per block for amax_sr (0 otherwise)
  uint64_t seed = 0, stream = 0;
  Arith arith = Arith::exact;
  ZeroScale zero_scale = ZeroScale::zero;
  bool saturate = true;
  // The call's first row in its tensor (0 but for a band quantized on its
  // own, BandQuantizer): random bits and error messages take the tensor's
  // element indices.
  int64_t row0 = 0;
  FourSix four_six = FourSix::off;
  double four_max = 0;     // four over six: 2^floor(log2 Fe.max), the magnitude the 4 scale maps b to

  // Tensor level (set by set_tensor_amax).
  double amax = 0;         // reference amax A (NaN when none)
  float t = 1.0f;          // exact: encode scale t; fp32: G
  float ginv = 1.0f;       // fp32: fl(1/G)
  float g_over_emax = 0;   // fp32: fl(G * fl(1/Fe.max))
  float g_over_four = 0;   // fp32, four over six: fl(G * (1/four_max)) (a power of two: exact)
  double target = 1.0;     // scale target T (1 without a block scale)
  // Zero-scale guard: the scale 1.0 rounded into Fs.
  uint32_t one_code = 0;
  double one_value = 1.0;
};

// Outcome flags of one element or block, used for statistics and errors.
enum : uint8_t {
  kSaturated = 1,      // element: scaled magnitude exceeded Fe.max
  kUnrepresentable = 2 // overflow with saturation off and no Inf/NaN code
};

// Sets the tensor-level scale from the reference amax A (NaN = none).
// docs/numerics.md §3 step 1: t = fp32_rne(Fe.max * T / A), clamped to FLT_MAX, and
// t = 1 when A is none, 0 or not finite. The same single rounding gives G in
// `fp32` arithmetic. A result that underflows to 0 is also replaced by 1.
EXMY_HD void set_tensor_amax(QuantPlan& p, double A) {
  p.amax = A;
  float t = 1.0f;
  if (!is_nan(A) && A != 0.0 && !is_inf(A)) {
    t = fp32_rne_div(p.fe.max * p.target, A);
    if (is_inf(t) || t > FLT_MAX) t = FLT_MAX;
    if (t == 0.0f) t = 1.0f;
  }
  p.t = t;
  p.ginv = fp32_rne_div(1.0, t);
  const float inv_emax = fp32_rne_div(1.0, p.fe.max);
  p.g_over_emax = static_cast<float>(static_cast<double>(t) * inv_emax);
  if (p.four_max > 0) p.g_over_four = static_cast<float>(static_cast<double>(t) / p.four_max);
}

// The stream of a call's scale random bits (amax_sr): the element stream
// with its top bit flipped, apart from the bits the call's elements draw.
inline constexpr uint64_t kScaleStreamBit = uint64_t{1} << 63;

// The scale_sr_bits random bits of block `blk` (the call's row-major block
// index) of a call over `cols` columns: those of block blk + (row0 / br) *
// (blocks per row) of the tensor (a band quantized on its own draws its
// tensor's), by docs/numerics.md §4's formula with the block index for the
// element index, from stream ^ kScaleStreamBit. 0 for other rules.
EXMY_HD uint32_t scale_random_bits(const QuantPlan& p, int64_t blk, int64_t cols) {
  if (p.scale_sr_bits == 0) return 0;
  const int64_t per_row = (cols + p.bc - 1) / p.bc;
  const uint64_t k = static_cast<uint64_t>(blk + (p.row0 / p.br) * per_row);
  return random_bits(p.seed, p.stream ^ kScaleStreamBit, k, p.scale_sr_bits);
}

struct BlockScale {
  uint32_t code;     // scale code
  double s;          // decoded scale s_b (after the zero-scale guard)
  bool saturated;    // unrounded scale exceeded Fs.max
  bool underflow;    // b > 0 and the rounded scale was 0
  bool zero;         // elements encode to zero (s_b == 0 after the guard)
};

// Block decode scale from the block amax b = max|x| (finite or +inf; NaN
// blocks are handled by the caller). docs/numerics.md §3 steps 2-3. With
// `four` (four over six, amax-* rules only), the scale that maps b to
// four_max instead of Fe.max. `rbits`: the block's scale_random_bits
// (amax_sr only).
EXMY_HD BlockScale block_scale(const QuantPlan& p, float b, bool four = false, uint32_t rbits = 0) {
  const Format& fs = p.fs;
  Encoded enc{0u, false, false};
  const bool fp32 = p.arith == Arith::fp32;
  switch (p.rule) {
    case ScaleRule::amax_rne:
    case ScaleRule::amax_up:
    case ScaleRule::amax_down:
    case ScaleRule::amax_sr: {
      const Round mode = p.rule == ScaleRule::amax_rne  ? Round::rne
                         : p.rule == ScaleRule::amax_up ? Round::up
                         : p.rule == ScaleRule::amax_sr ? Round::stochastic
                                                        : Round::down;
      const int n = p.scale_sr_bits;  // 0 but for amax_sr
      const uint32_t r = rbits;
      if (fp32) {
        const float raw = b * (four ? p.g_over_four : p.g_over_emax);  // fl(b * fl(G * fl(1/Fe.max)))
        enc = encode_quotient(fs, false, static_cast<double>(raw), 1.0, mode, n, r, true);
      } else {
        enc = encode_quotient(fs, false, static_cast<double>(b) * p.t, four ? p.four_max : p.fe.max, mode, n, r, true);
      }
      break;
    }
    default: {
      // MX rules: a power of two from log2 of b * t (fp32: fl(b * G)).
      const double bt = fp32 ? static_cast<double>(b * p.t) : static_cast<double>(b) * p.t;
      if (bt == 0.0) {
        enc = encode_quotient(fs, false, 0.0, 1.0, Round::rne, 0, 0, true);
      } else if (is_inf(bt)) {
        enc = Encoded{fs.max_mag, true, false};
      } else {
        int e = ilog2(bt);
        if (p.rule == ScaleRule::mx_ceil) {
          if (bt != pow2(e)) e += 1;
        } else if (p.rule == ScaleRule::mx_even) {
          // round bt (rne) to M_e + 1 significant bits; a carry moves it up a binade
          uint64_t sig;
          int ex;
          detail::split(bt, sig, ex);
          const int drop = 52 - p.fe.M;
          const uint64_t keep = sig >> drop, rest = sig & ((uint64_t{1} << drop) - 1);
          const uint64_t half = uint64_t{1} << (drop - 1);
          const uint64_t rounded = keep + ((rest > half || (rest == half && (keep & 1))) ? 1 : 0);
          if (rounded >> (p.fe.M + 1)) e += 1;
        }
        const int k = e - p.fe.max_exp;
        enc = encode_quotient(fs, false, pow2(k), 1.0, Round::rne, 0, 0, true);
      }
      break;
    }
  }
  BlockScale out;
  out.code = enc.code;
  out.saturated = enc.above_max;
  out.s = fs.decode(enc.code);
  out.underflow = out.s == 0.0 && b > 0.0f;
  out.zero = false;
  if (out.s == 0.0) {
    if (p.zero_scale == ZeroScale::one) {
      out.code = p.one_code;
      out.s = p.one_value;
    } else {
      out.zero = true;
    }
  }
  return out;
}

// Per-block constants for the element loop.
struct BlockConsts {
  double s;     // decoded scale
  float mb;     // fp32: m_b = min(fl(1 / fl(s * Ginv)), FLT_MAX)
};

EXMY_HD BlockConsts block_consts(const QuantPlan& p, double s) {
  BlockConsts c{s, 0.0f};
  if (p.arith == Arith::fp32 && s > 0.0) {
    const float sg = static_cast<float>(s * static_cast<double>(p.ginv));
    float mb = 1.0f / sg;
    if (mb > FLT_MAX) mb = FLT_MAX;
    c.mb = mb;
  }
  return c;
}

struct ElemOut {
  uint32_t code;
  float xhat;
  uint8_t flags;
};

// Dequantized value of element code q under the block scale.
EXMY_HD float dequant(const QuantPlan& p, const BlockConsts& c, uint32_t code) {
  const Format& fe = p.fe;
  const CodeClass cls = fe.classify(code);
  const bool neg = fe.is_signed && (code & fe.sign_bit);
  if (cls == CodeClass::nan) return float_of(0x7fc00000u);
  if (cls == CodeClass::inf) return neg ? -float_of(0x7f800000u) : float_of(0x7f800000u);
  const double q = fe.mag_value(code & fe.mag_mask());
  float v;
  if (!p.has_scale) {
    v = fp32_rne_div(q, p.t);  // fl(q / t), exact in both arithmetics
  } else if (p.arith == Arith::exact) {
    v = q == 0.0 ? 0.0f : fp32_rne_div(q * c.s, p.t);
  } else {
    const float qs = static_cast<float>(q * c.s);  // fl(q * s_b)
    v = qs * p.ginv;
  }
  return neg ? -v : v;
}

// Encodes one finite or infinite element x (not NaN) with random bits r.
EXMY_HD ElemOut encode_element(const QuantPlan& p, const BlockConsts& c, float x, uint32_t r) {
  const bool neg = sign_bit(x);
  Encoded e;
  if (p.arith == Arith::exact) {
    const double num = ::fabs(static_cast<double>(x)) * p.t;
    const double den = p.has_scale ? c.s : 1.0;
    e = encode_quotient(p.fe, neg, num, den, p.round, p.sr_bits, r, p.saturate);
  } else {
    const float y = p.has_scale ? x * c.mb : x * p.t;
    e = encode_quotient(p.fe, neg, ::fabs(static_cast<double>(y)), 1.0, p.round, p.sr_bits, r, p.saturate);
  }
  ElemOut out;
  out.code = e.code;
  out.flags = static_cast<uint8_t>((e.above_max ? kSaturated : 0) | (e.unrepresentable ? kUnrepresentable : 0));
  out.xhat = dequant(p, c, e.code);
  return out;
}

// Code of a zero element keeping the sign of x (-0 where Fe has it).
EXMY_HD uint32_t zero_code(const Format& fe, float x) {
  if (fe.is_signed && fe.negzero && sign_bit(x)) return fe.sign_bit;
  return 0u;
}

// Where scale block `blk` of an R x C tensor lies: rows [r0, r0 + count /
// width), columns [c0, c0 + width); its k-th element in row-major order is
// flat(k).
struct BlockGeom {
  int64_t r0, c0, width, count, cols;
  EXMY_HD int64_t flat(int64_t k) const { return (r0 + k / width) * cols + c0 + k % width; }
};

EXMY_HD BlockGeom block_geom(const QuantPlan& p, int64_t rows, int64_t cols, int64_t blk) {
  const int64_t gc = (cols + p.bc - 1) / p.bc;
  const int64_t r0 = (blk / gc) * p.br, c0 = (blk % gc) * p.bc;
  const int64_t r1 = r0 + p.br < rows ? r0 + p.br : rows, c1 = c0 + p.bc < cols ? c0 + p.bc : cols;
  return BlockGeom{r0, c0, c1 - c0, (r1 - r0) * (c1 - c0), cols};
}

// Four over six (docs/numerics.md §3): the scale of a block with amax b (not
// NaN) whose usual scale is s6 = block_scale(p, b): the 4 scale
// block_scale(p, b, true) with always_4 or where the block's error under it
// is lower, else
// s6 (ties and NaN errors keep s6); `four` says which. The error of a
// candidate adds, in double and in the block's row-major element order
// from 0.0, the term (x-hat - x)^2 (mse) or |x-hat - x| (mae) of every
// element, x-hat being what the element loop stores under that scale (0 in
// a zero-scale block) with the element's own random bits.
EXMY_HD BlockScale four_over_six(const QuantPlan& p, const float* x, const BlockGeom& g, float b, const BlockScale& s6,
                                 bool& four) {
  four = p.four_six == FourSix::always_4;
  if (p.four_six == FourSix::off) return s6;
  const BlockScale s4 = block_scale(p, b, true);
  if (four) return s4;
  const BlockScale* cand[2] = {&s6, &s4};
  double err[2] = {0.0, 0.0};
  for (int k = 0; k < 2; ++k) {
    const BlockConsts c = block_consts(p, cand[k]->s);
    for (int64_t j = 0; j < g.count; ++j) {
      const int64_t i = g.flat(j);
      float xh = 0.0f;
      if (!cand[k]->zero) {
        // the element's bits in its tensor (a band quantized on its own: row0 > 0)
        const uint64_t k = static_cast<uint64_t>(i + p.row0 * g.cols);
        const uint32_t r = is_stochastic(p.round) ? random_bits(p.seed, p.stream, k, p.sr_bits) : 0u;
        xh = encode_element(p, c, x[i], r).xhat;
      }
      const double d = static_cast<double>(xh) - static_cast<double>(x[i]);
      err[k] += p.four_six == FourSix::mse ? d * d : ::fabs(d);
    }
  }
  four = err[1] < err[0];
  return four ? s4 : s6;
}

}  // namespace exmy

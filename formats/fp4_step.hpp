// The FP4 multiply-and-convert step of one element: the lane arithmetic of
// the CPU's FP4 loops (formats/fast/fp4x8_loop.cpp, fp4x16_loop.cpp) as
// plain scalar code, for the CUDA kernel's FP4 step path (the rounding
// modes the threshold path leaves: up, down and the three stochastic
// modes). Plans are those fp4x8_handles takes (at most 8 magnitudes,
// saturation, subnormals, -0 where signed, M + h + 2 <= 22).
//
// v is |x| times the block's multiplier: m_b in fp32 arithmetic (where v is
// then the core's scaled magnitude exactly, so every decision below is the
// core's), fl(t / s) in exact arithmetic (v within two roundings of the
// exact quotient: elements whose decision that error could move are
// "unsure" and the caller hands them to the scalar core, encode_element).
// With ee the biased exponent of v clamped to the format's lowest binade,
// Ws = v * 2^(h+1+M-ee) is exact; its integer part W holds the index of the
// lower neighbour inside the binade (W >> (h+1), the implicit bit included
// above the subnormals) and the h+1 bits of delta below it (F), its
// fraction the sticky bits. docs/numerics.md §2 then decides from (k, F,
// sticky, sign, r), and code = ((ee - emin_b) << M) + k + away, where a carry
// out of the binade moves the exponent field up by itself.
#pragma once

#include <cmath>
#include <cstdint>

#include "formats/quant_core.hpp"

namespace exmy::detail {

// What a plan fixes for the step (made once per call or per segment).
struct Fp4StepConsts {
  int32_t emin_b;    // the lowest binade's biased float32 exponent, emin + 127
  int32_t shift_b;   // h + 1 + M + 254: 2^(h+1+M-e) has exponent field shift_b - ee
  int32_t h;         // random bits drawn (0 in the deterministic modes)
  int32_t M;         // element mantissa bits
  uint32_t max_mag;  // magnitude code of the largest finite value
  uint32_t sign_bit;
  float vmax;  // Fe.max: the saturation count compares v with it
};

EXMY_HD Fp4StepConsts fp4_step_consts(const QuantPlan& p) {
  const Format& f = p.fe;
  const int h = is_stochastic(p.round) ? p.sr_bits : 0;
  return Fp4StepConsts{f.emin + 127, h + 1 + f.M + 254, h, f.M, f.max_mag, f.sign_bit, static_cast<float>(f.max)};
}

// One element's result: its code (sign included) and x-hat bits, and
// whether it counts as saturated.
struct Fp4StepOut {
  uint32_t code, value;
  bool saturated;
};

// The step for element bits xb of a block with multiplier `mul` (fp32: m_b;
// exact: fl(t / s), a normal float) and x-hat table `table` (x-hat of
// magnitude codes 0..7 under the block's scale), random bits r (stochastic
// modes). False: the element is unsure (exact arithmetic near a decision,
// a tiny product, or v not finite) and `out` is not set.
template <Round MODE, Arith ARITH>
EXMY_HD bool fp4_step(const Fp4StepConsts& k, float mul, const float* table, uint32_t xb, uint32_t r,
                      Fp4StepOut& out) {
  constexpr bool kExact = ARITH == Arith::exact;
  const float x = float_of(xb);
  const bool neg = (xb >> 31) != 0;
  const float v = kExact ? float_of(xb & 0x7fffffffu) * mul : float_of(bits_of(x * mul) & 0x7fffffffu);
  if (!(v < float_of(0x7f800000u))) return false;
  const int32_t vexp = static_cast<int32_t>(bits_of(v) >> 23);
  const int32_t ee = vexp > k.emin_b ? vexp : k.emin_b;
  const float p2 = float_of(static_cast<uint32_t>(k.shift_b - ee) << 23);
  const float Ws = v * p2;
  const int32_t W = static_cast<int32_t>(Ws);  // Ws >= 0 and below 2^22: truncation is floor
  const float frac = Ws - static_cast<float>(W);
  if (kExact && (xb & 0x7fffffffu) != 0) {
    // Within Ws * 2^-22 of an integer, v's error (two roundings, about 2^-23
    // of v) may move floor(Ws): |frac - 1/2| >= 1/2 - Ws * 2^-22 is unsure.
    // This also takes the tiny products (float-subnormal, or 0, of non-zero
    // x), which the CPU's loops test apart for their rne: with an FP4
    // format's emin >= -2, Ws is then below 2^-70, and 1/2 - Ws rounds to 1/2.
    const float off_half = ::fabsf(frac - 0.5f);
    if (off_half >= ::fmaf(-Ws, float_of(0x34800000u), 0.5f)) return false;  // 2^-22
  }
  const int h1 = k.h + 1;
  int32_t kk;  // the index of the result inside binade ee; may reach 2^(M+1)
  if constexpr (MODE == Round::stochastic_fast) {
    // away exactly when F + 2r + 1 carries into bit h+1
    kk = (W + 2 * static_cast<int32_t>(r) + 1) >> h1;
  } else if constexpr (MODE == Round::stochastic_fastest) {
    // away exactly when F/2 + r carries into bit h
    kk = ((W >> 1) + static_cast<int32_t>(r)) >> k.h;
  } else {
    const int32_t lo = W >> h1, F = W & ((1 << h1) - 1);
    const bool inexact = F != 0 || frac != 0.0f;
    bool away;
    if constexpr (MODE == Round::up) {
      away = !neg && inexact;
    } else if constexpr (MODE == Round::down) {
      away = neg && inexact;
    } else {
      static_assert(MODE == Round::stochastic, "the step path's modes: up, down and the stochastic ones");
      // round F/2 to nearest even (sticky: the fraction), then away when
      // that plus r reaches 2^h
      const int32_t j = F >> 1;
      const bool up_half = (F & 1) && (frac != 0.0f || (j & 1));
      away = j + (up_half ? 1 : 0) + static_cast<int32_t>(r) > (1 << k.h) - 1;
    }
    kk = lo + (away ? 1 : 0);
  }
  uint32_t code = (static_cast<uint32_t>(ee - k.emin_b) << k.M) + static_cast<uint32_t>(kk);
  code = code < k.max_mag ? code : k.max_mag;
  out.value = bits_of(table[code]) | (xb & 0x80000000u);
  out.code = code | (neg ? k.sign_bit : 0u);
  out.saturated = v > k.vmax;
  return true;
}

}  // namespace exmy::detail

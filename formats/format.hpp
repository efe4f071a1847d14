// The ExMy format descriptor (the gfloat model of docs/numerics.md §1) and exact
// decoding of codes. Plain header code: usable from host and CUDA device
// code, no exceptions, no global state. Parsing spec strings lives in
// formats/spec.hpp (host only).
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define EXMY_HD __host__ __device__ inline
#else
#define EXMY_HD inline
#endif

namespace exmy {

// Bit casts that work in host and device code.
EXMY_HD uint64_t bits_of(double x) {
#if defined(__CUDA_ARCH__)
  return static_cast<uint64_t>(__double_as_longlong(x));
#else
  uint64_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
#endif
}
EXMY_HD double double_of(uint64_t u) {
#if defined(__CUDA_ARCH__)
  return __longlong_as_double(static_cast<long long>(u));
#else
  double x;
  std::memcpy(&x, &u, sizeof x);
  return x;
#endif
}
EXMY_HD uint32_t bits_of(float x) {
#if defined(__CUDA_ARCH__)
  return static_cast<uint32_t>(__float_as_uint(x));
#else
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
#endif
}
EXMY_HD float float_of(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
#endif
}

// IEEE classification by bits (the same in host and device code).
EXMY_HD bool is_nan(double x) { return (bits_of(x) & 0x7fffffffffffffffull) > 0x7ff0000000000000ull; }
EXMY_HD bool is_inf(double x) { return (bits_of(x) & 0x7fffffffffffffffull) == 0x7ff0000000000000ull; }
EXMY_HD bool sign_bit(double x) { return (bits_of(x) >> 63) != 0; }
EXMY_HD bool is_nan(float x) { return (bits_of(x) & 0x7fffffffu) > 0x7f800000u; }
EXMY_HD bool is_inf(float x) { return (bits_of(x) & 0x7fffffffu) == 0x7f800000u; }
EXMY_HD bool sign_bit(float x) { return (bits_of(x) >> 31) != 0; }

// 2^e as a double, exact for -1022 <= e <= 1023.
EXMY_HD double pow2(int e) { return double_of(static_cast<uint64_t>(e + 1023) << 52); }

// floor(log2 |x|) of a finite, non-zero, normal double.
EXMY_HD int ilog2(double x) { return static_cast<int>((bits_of(x) >> 52) & 0x7ff) - 1023; }

// Classification of a code.
enum class CodeClass : uint8_t { zero, subnormal, normal, inf, nan };

// One number format. The first block of fields is what a spec string sets;
// the second block is derived by finalize() and must not be edited by hand.
struct Format {
  // --- fields of the model (docs/numerics.md §1) ---
  int E = 0;              // exponent bits
  int M = 0;              // trailing mantissa bits
  bool is_signed = true;  // sign bit present
  int bias = 0;           // exponent bias
  bool subnormals = true; // exponent field 0 encodes subnormals
  bool has_inf = false;   // the code below the NaN codes is Inf
  int nans = 0;           // number of highest magnitude codes that are NaN
  bool negzero = true;    // sign=1, magnitude 0 is -0 (else it is NaN)

  // --- derived constants ---
  int bits = 0;             // total width of a code
  uint32_t mag_count = 0;   // 2^(E+M) magnitude codes per sign
  uint32_t sign_bit = 0;    // 1 << (E+M) for signed formats, 0 otherwise
  uint32_t max_mag = 0;     // magnitude code of the largest finite value
  bool has_nan = false;     // some code decodes to NaN
  bool has_zero = true;     // magnitude code 0 is zero
  uint32_t nan_code = 0;    // canonical NaN code (valid if has_nan)
  int emin = 0;             // exponent of the lowest binade: 1-bias, or -bias without subnormals
  int max_exp = 0;          // floor(log2 max)
  double max = 0;           // largest finite value
  double min_pos = 0;       // smallest positive value
  double min_normal = 0;    // smallest normal value, 2^emin (2^(1-bias) with subnormals)

  // Magnitude code of +Inf (valid if has_inf).
  EXMY_HD uint32_t inf_mag() const { return mag_count - static_cast<uint32_t>(nans) - 1; }
  EXMY_HD uint32_t mag_mask() const { return mag_count - 1; }
  // Bytes per code in unpacked storage: 1 up to 8 bits, 2 up to 16, else 4.
  EXMY_HD int code_bytes() const { return bits <= 8 ? 1 : bits <= 16 ? 2 : 4; }

  // Value of a finite magnitude code (0 <= m <= max_mag), exact.
  EXMY_HD double mag_value(uint32_t c) const {
    const uint32_t e = c >> M, m = c & ((1u << M) - 1u);
    if (e == 0) {
      if (subnormals) return static_cast<double>(m) * pow2(1 - bias - M);
      if (m == 0) return M == 0 ? pow2(-bias) : 0.0;
      return static_cast<double>((1u << M) + m) * pow2(-bias - M);
    }
    return static_cast<double>((1u << M) + m) * pow2(static_cast<int>(e) - bias - M);
  }

  EXMY_HD CodeClass classify(uint32_t code) const {
    const uint32_t mag = code & mag_mask();
    const bool neg = is_signed && (code & sign_bit);
    if (mag >= mag_count - static_cast<uint32_t>(nans)) return CodeClass::nan;
    if (has_inf && mag == inf_mag()) return CodeClass::inf;
    if (mag == 0) {
      if (neg && !negzero) return CodeClass::nan;
      if (has_zero) return CodeClass::zero;
      return CodeClass::normal;  // no zero: code 0 is 2^-bias
    }
    if (subnormals && (mag >> M) == 0) return CodeClass::subnormal;
    return CodeClass::normal;
  }

  // Decoded value of any code: exact finite values, +-Inf, or NaN.
  EXMY_HD double decode(uint32_t code) const {
    const uint32_t mag = code & mag_mask();
    const bool neg = is_signed && (code & sign_bit);
    switch (classify(code)) {
      case CodeClass::nan: return double_of(0x7ff8000000000000ull);
      case CodeClass::inf: return neg ? -double_of(0x7ff0000000000000ull) : double_of(0x7ff0000000000000ull);
      default: {
        const double v = mag_value(mag);
        return neg ? -v : v;
      }
    }
  }

  // Computes the derived constants. Returns false when the fields do not
  // describe a usable format (the spec parser turns that into a message).
  EXMY_HD bool finalize() {
    if (E < 0 || E > 8 || M < 0 || M > 23 || E + M < 1) return false;
    if (nans < 0) return false;
    bits = (is_signed ? 1 : 0) + E + M;
    mag_count = 1u << (E + M);
    sign_bit = is_signed ? mag_count : 0u;
    has_zero = subnormals || M > 0;
    const uint32_t reserved = static_cast<uint32_t>(nans) + (has_inf ? 1u : 0u);
    // At least one positive finite value must remain.
    const uint32_t first_pos = has_zero ? 1u : 0u;
    if (reserved > mag_count - 1u - first_pos) return false;
    max_mag = mag_count - 1u - reserved;
    // Signed, without zero and without -0: the negative side needs code 1.
    if (is_signed && !negzero && !has_zero && max_mag < 1u) return false;
    has_nan = nans > 0 || (is_signed && !negzero);
    nan_code = nans > 0 ? mag_count - 1u : (is_signed && !negzero ? sign_bit : 0u);
    emin = subnormals ? 1 - bias : -bias;
    // Keep every value and every product the kernels form inside the exact
    // range of double: values within [2^-300, 2^300].
    if (emin - M < -300 || static_cast<int>(mag_count >> M) - bias > 300) return false;
    max = mag_value(max_mag);
    max_exp = ilog2(max);
    min_pos = mag_value(first_pos);
    min_normal = pow2(emin);
    return true;
  }
};

}  // namespace exmy

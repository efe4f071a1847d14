// libFuzzer target: format spec strings (the grammar of docs/numerics.md §1).
//
// Input: a spec string, optionally followed by a NUL byte and bytes that
// choose values to encode. For every input:
// - parse_format either throws exmy::Error or returns a usable format;
// - format_name() of a parsed format parses back to the same fields;
// - every code (all of them up to 12 bits, a sample otherwise) decodes to a
//   value that encodes back to the same code, and finite magnitudes grow
//   with the magnitude code;
// - values taken from the input encode, in every rounding mode, to a code
//   of the format whose value brackets the input the way the mode says.
// Any other exception, a failed check (abort) or a sanitizer report is a crash.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

#include "formats/error.hpp"
#include "formats/format.hpp"
#include "formats/round.hpp"
#include "formats/spec.hpp"

namespace {

using namespace exmy;

#define REQUIRE(cond)                                                                   \
  do {                                                                                  \
    if (!(cond)) {                                                                      \
      std::fprintf(stderr, "fuzz_spec: check failed: %s (%s:%d)\n", #cond, __FILE__, __LINE__); \
      std::abort();                                                                     \
    }                                                                                   \
  } while (0)

bool same_fields(const Format& a, const Format& b) {
  return a.E == b.E && a.M == b.M && a.is_signed == b.is_signed && a.bias == b.bias && a.subnormals == b.subnormals &&
         a.has_inf == b.has_inf && a.nans == b.nans && a.negzero == b.negzero;
}

bool same_derived(const Format& a, const Format& b) {
  return a.bits == b.bits && a.mag_count == b.mag_count && a.sign_bit == b.sign_bit && a.max_mag == b.max_mag &&
         a.has_nan == b.has_nan && a.has_zero == b.has_zero && a.nan_code == b.nan_code && a.emin == b.emin &&
         a.max_exp == b.max_exp && a.max == b.max && a.min_pos == b.min_pos && a.min_normal == b.min_normal;
}

void check_format(const Format& f) {
  REQUIRE(f.E >= 0 && f.E <= 8 && f.M >= 0 && f.M <= 23 && f.bits >= 1 && f.bits <= 32);
  REQUIRE(f.max_mag < f.mag_count);
  REQUIRE(std::isfinite(f.max) && f.max > 0 && f.min_pos > 0 && f.min_pos <= f.max);
  REQUIRE(f.mag_value(f.max_mag) == f.max);
  REQUIRE(f.has_nan == (f.classify(f.nan_code) == CodeClass::nan));
}

// A finite, non-NaN code: decode, then encode the value back (rne, saturating).
void check_code(const Format& f, uint32_t code) {
  const CodeClass cls = f.classify(code);
  const double v = f.decode(code);
  if (cls == CodeClass::nan) {
    REQUIRE(std::isnan(v));
    return;
  }
  if (cls == CodeClass::inf) {
    REQUIRE(std::isinf(v));
    return;
  }
  REQUIRE(std::isfinite(v) && std::fabs(v) <= f.max);
  const Encoded e = encode_exact(f, v, Round::rne, 0, 0, true);
  REQUIRE(!e.above_max && !e.unrepresentable);
  // The unsigned formats have one zero; -0 of a signed format keeps its sign.
  REQUIRE(e.code == code);
}

// Encodes v in every deterministic mode and checks the bracketing.
void check_value(const Format& f, double v, uint32_t r) {
  if (!std::isfinite(v)) return;
  const bool neg = std::signbit(v);
  const double a = std::fabs(v);
  if (neg && !f.is_signed) {
    const Encoded e = encode_exact(f, v, Round::rne, 0, 0, true);
    REQUIRE(e.code == 0u);
    return;
  }
  const Encoded lo = encode_exact(f, v, Round::rtz, 0, 0, true);
  REQUIRE(!lo.unrepresentable);
  const double vlo = std::fabs(f.decode(lo.code));
  // rtz never moves away from zero, except that a format without zero rounds
  // everything below its smallest value of that sign up to it. That value is
  // min_pos, but on the negative side of a format without -0 (whose
  // sign=1/magnitude-0 code is NaN) it is the value of magnitude code 1.
  const double smallest = neg && !f.negzero ? f.mag_value(1) : f.min_pos;
  REQUIRE(vlo <= a || (!f.has_zero && vlo == smallest));
  REQUIRE(vlo <= f.max);
  for (Round mode : {Round::rne, Round::rna, Round::up, Round::down, Round::odd, Round::stochastic,
                     Round::stochastic_fast, Round::stochastic_fastest}) {
    // n up to 32 also reaches the 128-bit path (M + n > 49).
    const int n = is_stochastic(mode) ? 1 + static_cast<int>(r % 32) : 0;
    const uint32_t rb = n == 0 ? 0u : n == 32 ? r : r & ((1u << n) - 1u);
    const Encoded e = encode_exact(f, v, mode, n, rb, true);
    REQUIRE(!e.unrepresentable);
    REQUIRE((e.code & ~(f.mag_mask() | f.sign_bit)) == 0u);
    const double d = std::fabs(f.decode(e.code));
    REQUIRE(std::isfinite(d) && d <= f.max);
    // The result is lo or the next code up.
    const uint32_t mlo = lo.code & f.mag_mask(), m = e.code & f.mag_mask();
    REQUIRE(m == mlo || m == mlo + 1);
    REQUIRE(e.above_max == lo.above_max);
  }
  // Without saturation: the same code below max, else Inf, NaN or an error.
  const Encoded ns = encode_exact(f, v, Round::rne, 0, 0, false);
  if (a < f.max) REQUIRE(!ns.unrepresentable);
  if (ns.unrepresentable) REQUIRE(!f.has_inf && !f.has_nan);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 512) return 0;
  const char* chars = reinterpret_cast<const char*>(data);
  const void* nul = std::memchr(data, 0, size);
  const size_t spec_len = nul ? static_cast<size_t>(static_cast<const uint8_t*>(nul) - data) : size;
  const std::string_view spec(chars, spec_len);

  Format f;
  try {
    f = parse_format(spec);
  } catch (const Error&) {
    return 0;  // the expected way to reject a spec
  }
  check_format(f);

  // Round trip through the canonical name.
  const std::string name = format_name(f);
  Format g;
  try {
    g = parse_format(name);
  } catch (const Error& e) {
    std::fprintf(stderr, "fuzz_spec: format_name '%s' of '%.*s' does not parse: %s\n", name.c_str(),
                 static_cast<int>(spec.size()), spec.data(), e.what());
    std::abort();
  }
  REQUIRE(same_fields(f, g));
  REQUIRE(same_derived(f, g));
  REQUIRE(format_name(g) == name);

  // Codes: all of them for narrow formats, a sample otherwise.
  const uint64_t ncodes = f.is_signed ? 2 * uint64_t{f.mag_count} : f.mag_count;
  if (f.bits <= 12) {
    double prev = -1;
    for (uint32_t m = 0; m <= f.max_mag; ++m) {
      const double v = f.mag_value(m);
      REQUIRE(v > prev);
      prev = v;
    }
    for (uint64_t c = 0; c < ncodes; ++c) check_code(f, static_cast<uint32_t>(c));
  } else {
    for (uint32_t c : {0u, 1u, f.max_mag, f.max_mag - 1, f.mag_count - 1, f.sign_bit, f.sign_bit | 1u, static_cast<uint32_t>(ncodes - 1)})
      if (c < ncodes) check_code(f, c);
  }

  // Values from the bytes after the NUL: doubles, floats and scaled extremes.
  const uint8_t* rest = nul ? static_cast<const uint8_t*>(nul) + 1 : data + size;
  size_t left = static_cast<size_t>(data + size - rest);
  for (double v : {0.0, -0.0, f.max, -f.max, f.min_pos, -f.min_pos, f.min_pos / 2, -f.min_pos / 2, f.max * 1.5,
                   f.min_pos * 0.75, -f.min_pos * 0.75, f.max + f.min_pos, 1.0, -1.0})
    check_value(f, v, 0x12345678u);
  while (left >= 8) {
    uint64_t bits;
    std::memcpy(&bits, rest, 8);
    rest += 8;
    left -= 8;
    double v = double_of(bits);
    // Keep the value near the format's range so that rounding is exercised.
    if (std::isfinite(v) && v != 0) {
      int e;
      v = std::ldexp(std::frexp(v, &e), static_cast<int>(bits % 64) - 40 + f.max_exp);
    }
    check_value(f, v, static_cast<uint32_t>(bits >> 20));
    check_code(f, static_cast<uint32_t>(bits % ncodes));
  }
  return 0;
}

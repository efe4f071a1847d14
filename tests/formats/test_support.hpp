// Small helpers shared by the formats tests: hex printing (CPFloat style: every
// failure names the bit patterns involved), the mapping from exmy::Round to
// the reference's modes, and a seeded random source.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "exact_ref.hpp"
#include "formats/error.hpp"
#include "formats/format.hpp"
#include "formats/round.hpp"

namespace exmy::test {

inline std::string hex(double v) {
  char b[64];
  std::snprintf(b, sizeof b, "0x%016llx (%.17g)", static_cast<unsigned long long>(bits_of(v)), v);
  return b;
}

inline std::string hex(float v) {
  char b[64];
  std::snprintf(b, sizeof b, "0x%08x (%.9g)", bits_of(v), static_cast<double>(v));
  return b;
}

inline std::string hexcode(uint32_t code) {
  char b[16];
  std::snprintf(b, sizeof b, "0x%x", code);
  return b;
}

inline ref::Mode to_ref(Round m) {
  switch (m) {
    case Round::rne: return ref::Mode::rne;
    case Round::rna: return ref::Mode::rna;
    case Round::rtz: return ref::Mode::rtz;
    case Round::up: return ref::Mode::up;
    case Round::down: return ref::Mode::down;
    case Round::odd: return ref::Mode::odd;
    case Round::stochastic: return ref::Mode::stochastic;
    case Round::stochastic_fast: return ref::Mode::stochastic_fast;
    case Round::stochastic_fastest: return ref::Mode::stochastic_fastest;
  }
  return ref::Mode::rne;
}

inline const char* mode_name(Round m) {
  switch (m) {
    case Round::rne: return "rne";
    case Round::rna: return "rna";
    case Round::rtz: return "rtz";
    case Round::up: return "up";
    case Round::down: return "down";
    case Round::odd: return "odd";
    case Round::stochastic: return "stochastic";
    case Round::stochastic_fast: return "stochastic-fast";
    case Round::stochastic_fastest: return "stochastic-fastest";
  }
  return "?";
}

constexpr Round kDeterministic[] = {Round::rne, Round::rna, Round::rtz, Round::up, Round::down, Round::odd};
constexpr Round kStochastic[] = {Round::stochastic, Round::stochastic_fast, Round::stochastic_fastest};
constexpr Round kAllModes[] = {Round::rne,        Round::rna,             Round::rtz,
                               Round::up,         Round::down,            Round::odd,
                               Round::stochastic, Round::stochastic_fast, Round::stochastic_fastest};

// A fixed-seed generator, so that every run of a test sees the same inputs.
class Rng {
 public:
  explicit Rng(uint64_t seed) : g_(seed) {}
  uint64_t u64() { return g_(); }
  uint32_t u32() { return static_cast<uint32_t>(g_() >> 32); }
  // Uniform integer in [lo, hi].
  int64_t range(int64_t lo, int64_t hi) { return lo + static_cast<int64_t>(g_() % static_cast<uint64_t>(hi - lo + 1)); }
  double uniform() { return static_cast<double>(g_() >> 11) * 0x1p-53; }  // [0, 1)
  bool coin(double p = 0.5) { return uniform() < p; }
  template <class T>
  const T& pick(const std::vector<T>& v) { return v[static_cast<size_t>(range(0, static_cast<int64_t>(v.size()) - 1))]; }
  // A float with a random 24-bit significand and exponent in [lo, hi].
  float float_in(int lo, int hi) {
    const double m = 1.0 + static_cast<double>(u32() >> 9) * 0x1p-23;
    return static_cast<float>(std::ldexp(m, static_cast<int>(range(lo, hi))));
  }

 private:
  std::mt19937_64 g_;
};

// The message of the exmy::Error that f() throws, or "" when it throws none.
template <class F>
std::string error_message(F f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return {};
}

}  // namespace exmy::test

// Parsing the integers of a quantization spec given as text (seed, stream,
// Hadamard signs, random bits): decimal or 0x-prefixed hexadecimal, the
// whole string, one-line errors naming the option.
#pragma once

#include <charconv>
#include <cstdint>
#include <string>
#include <string_view>

#include "formats/error.hpp"

namespace exmy {

inline uint64_t parse_u64(const std::string& what, const std::string& s) {
  uint64_t v = 0;
  int base = 10;
  std::string_view t = s;
  if (t.size() > 2 && t[0] == '0' && (t[1] == 'x' || t[1] == 'X')) {
    base = 16;
    t.remove_prefix(2);
  }
  auto [p, ec] = std::from_chars(t.data(), t.data() + t.size(), v, base);
  if (t.empty() || ec != std::errc() || p != t.data() + t.size())
    throw Error("bad " + what + " '" + s + "' (expected an unsigned 64-bit integer)");
  return v;
}

}  // namespace exmy

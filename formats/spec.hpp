// Parsing of format spec strings (the grammar of docs/numerics.md §1) and of the names of
// rounding modes and scale rules. Host only.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "formats/format.hpp"
#include "formats/round.hpp"

namespace exmy {

// Parses `NAME[:OPT,...]` where NAME is a preset, an ml_dtypes alias or
// `[u]e<E>m<M>`, and OPT is bias=<int>, nosub, inf, nans=<int>, nonegzero,
// or exmy's addition noinf (for e.g. E5M2 without Inf).
// Throws exmy::Error naming the bad token.
Format parse_format(std::string_view spec);

// Canonical spec string of a format: the shortest `[u]e<E>m<M>[:opts]` (or
// preset name) that parses back to the same fields.
std::string format_name(const Format& f);

// Names of the presets, in table order.
const std::vector<std::string>& preset_names();

Round parse_round(std::string_view name);
std::string_view round_name(Round mode);
const std::vector<std::string>& round_names();

}  // namespace exmy

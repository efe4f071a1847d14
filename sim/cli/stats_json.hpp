// QuantStats -> JSON: the counts and sums of the statistics table
// (formats/vocab.hpp, docs/numerics.md §5), under their names.
#pragma once

#include <nlohmann/json.hpp>

#include "formats/quantize.hpp"
#include "formats/vocab.hpp"

namespace exmy::cli {

inline nlohmann::ordered_json stats_to_json(const QuantStats& s) {
  nlohmann::ordered_json j;
  for (const QuantStat& st : quant_stats()) {
    if (st.kind == StatKind::count) j[st.name] = st.count(s);
    else if (st.kind == StatKind::sum) j[st.name] = st.value(s);
  }
  return j;
}

}  // namespace exmy::cli

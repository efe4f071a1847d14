// QuantStats <-> JSON with exactly the names of docs/numerics.md §5.
#pragma once

#include <nlohmann/json.hpp>

#include "formats/quantize.hpp"

namespace exmy::cli {

inline nlohmann::ordered_json stats_to_json(const QuantStats& s) {
  nlohmann::ordered_json j;
  j["elements"] = s.elements;
  j["nonzero"] = s.nonzero;
  j["underflow"] = s.underflow;
  j["saturated"] = s.saturated;
  j["subnormal"] = s.subnormal;
  j["blocks"] = s.blocks;
  j["scale_underflow"] = s.scale_underflow;
  j["scale_subnormal"] = s.scale_subnormal;
  j["scale_saturated"] = s.scale_saturated;
  j["sum_sq"] = s.sum_sq;
  j["sum_sq_err"] = s.sum_sq_err;
  j["sum_err"] = s.sum_err;
  j["sum_abs"] = s.sum_abs;
  return j;
}

}  // namespace exmy::cli

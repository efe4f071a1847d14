// Conventions in which other implementations' bytes differ from exmy's for
// the same quantization decisions (docs/numerics.md, "Conventions of other
// implementations"): the codes of zero-scale blocks and of -0, and the
// operation order of the FP32 dequantization.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "formats/quantize.hpp"

namespace exmy {

// True when `spec` asks for a convention other than exmy's own.
bool conventions_apply(const QuantSpec& spec);

// Outputs of a call made complete for apply_conventions (scratch codes and
// scale codes where the caller passed none); finish() applies them.
struct ConventionScratch {
  ConventionScratch(const QuantSpec& spec, int64_t rows, int64_t cols, const QuantOutput& given);
  void finish(const QuantSpec& spec, const QuantInfo& info, const float* x, int64_t rows, int64_t cols);
  QuantOutput out;
  std::vector<uint8_t> codes, scale_codes;
};

// Rewrites a finished call's outputs to spec.codes / spec.dequant: `x` is the
// tensor that was quantized (after the RHT), `p` the call's plan (tensor
// scale set), `out` the outputs (scale codes required when the spec has a
// block scale and asks for a convention; the callers in formats/ provide
// them). Statistics are not changed: they describe exmy's decisions, which
// the conventions do not alter. `row_t`: with row outer scales, each row's
// encode scale (p.t then unused).
void apply_conventions(const QuantSpec& spec, const QuantPlan& p, const float* x, int64_t rows, int64_t cols,
                       const QuantOutput& out, const float* row_t = nullptr);

// Runs `core(o)` (one backend's exmy-convention quantization of the call,
// writing outputs `o`) and rewrites the outputs to the spec's conventions.
// When a convention needs outputs the caller did not ask for (codes to
// recompute values, scale codes to find zero-scale blocks), they are made
// in scratch buffers.
template <class Core>
QuantInfo with_conventions(const QuantSpec& spec, const float* x, int64_t rows, int64_t cols, const QuantOutput& out,
                           Core&& core) {
  if (!conventions_apply(spec)) return core(out);
  ConventionScratch scratch(spec, rows, cols, out);
  const QuantInfo info = core(scratch.out);
  scratch.finish(spec, info, x, rows, cols);
  return info;
}

// Parsers and names of the two options (each parser throws exmy::Error
// naming the accepted values).
CodeConvention parse_code_convention(std::string_view s);
std::string_view code_convention_name(CodeConvention c);
DequantOrder parse_dequant_order(std::string_view s);
std::string_view dequant_order_name(DequantOrder d);

}  // namespace exmy

// Output conventions of other implementations, reproduced byte for byte on
// request (docs/numerics.md, "Conventions of other implementations"). Both
// are passes over a call's finished outputs, so every backend (the scalar
// reference, the threaded CPU path, the CUDA path) gets them from this one
// function and the loops that make exmy's own outputs stay as they are.
#include "formats/conventions.hpp"

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "formats/error.hpp"
#include "formats/pack.hpp"
#include "formats/quant_core.hpp"
#include "formats/vocab.hpp"

namespace exmy {

// The names live in the option tables of formats/vocab.cpp.
CodeConvention parse_code_convention(std::string_view s) { return code_convention_options().parse(s); }
std::string_view code_convention_name(CodeConvention c) { return code_convention_options().name(c); }
DequantOrder parse_dequant_order(std::string_view s) { return dequant_order_options().parse(s); }
std::string_view dequant_order_name(DequantOrder d) { return dequant_order_options().name(d); }

ConventionScratch::ConventionScratch(const QuantSpec& spec, int64_t rows, int64_t cols, const QuantOutput& given)
    : out(given) {
  if (!out.codes && out.values) {
    codes.resize(static_cast<size_t>(rows * cols * spec.elem.code_bytes()));
    out.codes = codes.data();
  }
  if (spec.scale && !out.scale_codes) {
    scale_codes.resize(static_cast<size_t>(block_count(spec, rows, cols) * spec.scale->code_bytes()));
    out.scale_codes = scale_codes.data();
  }
}

void ConventionScratch::finish(const QuantSpec& spec, const QuantInfo& info, const float* x, int64_t rows,
                               int64_t cols) {
  QuantPlan p = spec.plan();
  p.t = info.t;
  p.ginv = fp32_rne_div(1.0, info.t);
  std::vector<float> transformed;
  if (spec.rht) {  // the conventions look at the tensor that was quantized
    transformed.assign(x, x + rows * cols);
    apply_rht_ref(spec, transformed.data(), rows, cols);
    x = transformed.data();
  }
  apply_conventions(spec, p, x, rows, cols, out, info.row_t.empty() ? nullptr : info.row_t.data());
}

bool conventions_apply(const QuantSpec& spec) {
  return spec.codes == CodeConvention::te || spec.dequant == DequantOrder::scale_first;
}

void apply_conventions(const QuantSpec& spec, const QuantPlan& p, const float* x, int64_t rows, int64_t cols,
                       const QuantOutput& out, const float* row_t) {
  if (!conventions_apply(spec)) return;
  const int eb = p.fe.code_bytes();
  const int sb = p.has_scale ? p.fs.code_bytes() : 0;
  const int64_t grid_cols = p.has_scale ? (cols + p.bc - 1) / p.bc : 0;
  // The decoded scale of element (r, c)'s block, from the stored scale code.
  auto block_scale = [&](int64_t r, int64_t c) {
    const uint32_t code = load_code(out.scale_codes, sb, (r / p.br) * grid_cols + c / p.bc);
    return p.fs.mag_value(code & p.fs.mag_mask());
  };
  const uint32_t max_code = p.fe.max_mag;
  for (int64_t r = 0; r < rows; ++r) {
    const float ginv = row_t ? fp32_rne_div(1.0, row_t[r]) : p.ginv;
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t i = r * cols + c;
      const float xi = x[i];
      if (spec.codes == CodeConvention::te) {
        const bool minus_zero = std::signbit(xi) && xi == 0.0f;
        if (minus_zero) {
          store_code(out.codes, eb, i, 0u);
          if (out.values) out.values[i] = 0.0f;
        } else if (p.has_scale && out.codes && xi == xi && xi != 0.0f && block_scale(r, c) == 0.0) {
          // TE's multiplier for a zero scale is FLT_MAX: a non-zero element
          // saturates to +-Fe.max (its value stays +-0: the scale is 0).
          store_code(out.codes, eb, i, max_code | (std::signbit(xi) ? p.fe.sign_bit : 0u));
        }
      }
      if (spec.dequant == DequantOrder::scale_first && out.values && out.codes) {
        // x-hat = fl(q * fl(s * 1/G)) instead of fl(fl(q * s) * 1/G).
        const uint32_t code = load_code(out.codes, eb, i);
        const CodeClass cls = p.fe.classify(code);
        if (cls == CodeClass::nan || cls == CodeClass::inf) continue;
        const double s = block_scale(r, c);
        const float sg = static_cast<float>(s * static_cast<double>(ginv));
        const float q = static_cast<float>(p.fe.mag_value(code & p.fe.mag_mask()));
        const float v = q * sg;
        out.values[i] = (p.fe.is_signed && (code & p.fe.sign_bit)) ? -v : v;
      }
    }
  }
}

}  // namespace exmy

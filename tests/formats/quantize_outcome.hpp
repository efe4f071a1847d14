// One quantization call's whole result (values, codes, scale codes,
// statistics, info, or the error thrown), and the first difference between
// two of them: what the fast-path tests compare against quantize_ref.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "formats/error.hpp"
#include "formats/quantize.hpp"
#include "formats/spec.hpp"
#include "test_support.hpp"

namespace exmy::test {

// Everything one implementation produced for one call.
struct Outcome {
  bool threw = false;
  std::string error;
  std::vector<float> values;
  std::vector<uint8_t> codes, scodes;
  QuantStats stats;
  QuantInfo info;
};

// impl 0: quantize_ref; impl k > 0: quantize with k threads.
inline Outcome run(const QuantSpec& s, const std::vector<float>& x, int64_t rows, int64_t cols, int impl) {
  Outcome r;
  const int64_t n = rows * cols;
  r.values.assign(static_cast<size_t>(n), float_of(0xdeadbeefu));
  r.codes.assign(static_cast<size_t>(n * s.elem.code_bytes()), 0xa5);
  const int64_t nb = block_count(s, rows, cols);
  r.scodes.assign(static_cast<size_t>(nb * (s.scale ? s.scale->code_bytes() : 1)), 0xa5);
  const QuantOutput out{r.values.data(), r.codes.data(), r.scodes.data(), &r.stats};
  try {
    r.info = impl == 0 ? quantize_ref(s, x.data(), rows, cols, out) : quantize(s, x.data(), rows, cols, out, impl);
  } catch (const Error& e) {
    r.threw = true;
    r.error = e.what();
  }
  return r;
}

// The call through BandQuantizer, in bands of `band` rows (a multiple of
// its band_rows()), with `threads` threads: measured first where it needs
// the tensor amax. A band call decides nothing at tensor level, so info is
// left as it is.
inline Outcome run_bands(const QuantSpec& s, const std::vector<float>& x, int64_t rows, int64_t cols, int64_t band,
                         int threads) {
  Outcome r;
  const int64_t n = rows * cols;
  r.values.assign(static_cast<size_t>(n), float_of(0xdeadbeefu));
  r.codes.assign(static_cast<size_t>(n * s.elem.code_bytes()), 0xa5);
  const int64_t nb = block_count(s, rows, cols);
  const int sb = s.scale ? s.scale->code_bytes() : 1;
  r.scodes.assign(static_cast<size_t>(nb * sb), 0xa5);
  try {
    BandQuantizer q(s, rows, cols, true, threads);
    if (q.needs_amax())
      for (int64_t r0 = 0; r0 < rows; r0 += band) q.measure(x.data() + r0 * cols, std::min(band, rows - r0));
    int64_t blk = 0;
    for (int64_t r0 = 0; r0 < rows; r0 += band) {
      const int64_t br = std::min(band, rows - r0);
      q.quantize(x.data() + r0 * cols, br,
                 {r.values.data() + r0 * cols, r.codes.data() + r0 * cols * s.elem.code_bytes(),
                  r.scodes.data() + blk * sb, nullptr});
      blk += s.scale ? block_count(s, br, cols) : 0;
    }
    r.stats = q.stats();
  } catch (const Error& e) {
    r.threw = true;
    r.error = e.what();
  }
  return r;
}

// The first difference between a run and the reference run, or "" if they
// agree bit for bit.
inline std::string difference(const Outcome& ref, const Outcome& got, const std::vector<float>& x) {
  std::ostringstream d;
  if (ref.threw || got.threw) {
    if (got.threw != ref.threw || got.error != ref.error)
      d << "reference " << (ref.threw ? "threw '" + ref.error + "'" : std::string("did not throw")) << ", got "
        << (got.threw ? "'" + got.error + "'" : std::string("no error"));
    return d.str();
  }
  for (size_t i = 0; i < ref.values.size(); ++i) {
    if (bits_of(got.values[i]) != bits_of(ref.values[i])) {
      d << "element " << i << " input " << hex(x[i]) << ": value " << hex(got.values[i]) << ", reference "
        << hex(ref.values[i]);
      return d.str();
    }
  }
  for (size_t i = 0; i < ref.codes.size(); ++i) {
    if (got.codes[i] != ref.codes[i]) {
      d << "code byte " << i << " is " << test::hexcode(got.codes[i]) << ", reference " << test::hexcode(ref.codes[i]);
      return d.str();
    }
  }
  for (size_t i = 0; i < ref.scodes.size(); ++i) {
    if (got.scodes[i] != ref.scodes[i]) {
      d << "scale code byte " << i << " is " << test::hexcode(got.scodes[i]) << ", reference "
        << test::hexcode(ref.scodes[i]);
      return d.str();
    }
  }
  const QuantStats &a = ref.stats, &b = got.stats;
  const bool counts = a.elements == b.elements && a.nonzero == b.nonzero && a.underflow == b.underflow &&
                      a.saturated == b.saturated && a.subnormal == b.subnormal && a.blocks == b.blocks &&
                      a.scale_underflow == b.scale_underflow && a.scale_subnormal == b.scale_subnormal &&
                      a.scale_saturated == b.scale_saturated && a.scale_four == b.scale_four;
  // the sums by bits: NaN sums must be the same NaN, and -0 is not 0
  const bool sums = bits_of(a.sum_sq) == bits_of(b.sum_sq) && bits_of(a.sum_sq_err) == bits_of(b.sum_sq_err) &&
                    bits_of(a.sum_err) == bits_of(b.sum_err) && bits_of(a.sum_abs) == bits_of(b.sum_abs);
  if (!counts || !sums) {
    d << "statistics differ (got/reference): elements " << b.elements << "/" << a.elements << " nonzero "
      << b.nonzero << "/" << a.nonzero << " underflow " << b.underflow << "/" << a.underflow << " saturated "
      << b.saturated << "/" << a.saturated << " subnormal " << b.subnormal << "/" << a.subnormal << " blocks "
      << b.blocks << "/" << a.blocks << " scale_underflow " << b.scale_underflow << "/" << a.scale_underflow
      << " scale_subnormal " << b.scale_subnormal << "/" << a.scale_subnormal << " scale_saturated "
      << b.scale_saturated << "/" << a.scale_saturated << " scale_four " << b.scale_four << "/" << a.scale_four
      << " sum_sq " << hex(b.sum_sq) << "/" << hex(a.sum_sq)
      << " sum_sq_err " << hex(b.sum_sq_err) << "/" << hex(a.sum_sq_err) << " sum_err " << hex(b.sum_err) << "/"
      << hex(a.sum_err) << " sum_abs " << hex(b.sum_abs) << "/" << hex(a.sum_abs);
    return d.str();
  }
  // QuantStats::operator== agrees with the field comparison where no sum is NaN
  // (an infinite x-hat makes sum_sq_err and sum_err +Inf even where another sum is NaN)
  const bool no_nan = !std::isnan(a.sum_sq) && !std::isnan(a.sum_sq_err) && !std::isnan(a.sum_err) &&
                      !std::isnan(a.sum_abs);
  if (no_nan && !(a == b)) return "QuantStats::operator== is false";
  if (bits_of(ref.info.amax) != bits_of(got.info.amax) || bits_of(ref.info.t) != bits_of(got.info.t) ||
      ref.info.block_grid_rows != got.info.block_grid_rows || ref.info.block_grid_cols != got.info.block_grid_cols) {
    d << "QuantInfo differs: amax " << hex(got.info.amax) << "/" << hex(ref.info.amax) << " t " << hex(got.info.t)
      << "/" << hex(ref.info.t) << " grid " << got.info.block_grid_rows << "x" << got.info.block_grid_cols << "/"
      << ref.info.block_grid_rows << "x" << ref.info.block_grid_cols;
  }
  return d.str();
}

// A block-scaled spec: element and scale format by name, a br x bc block,
// the rounding mode and arithmetic, a current tensor amax.
inline QuantSpec block_spec(const char* elem, const char* scale, int br, int bc, Round mode, Arith arith) {
  QuantSpec s;
  s.elem = parse_format(elem);
  s.scale = parse_format(scale);
  s.block_rows = br;
  s.block_cols = bc;
  s.round = mode;
  s.arith = arith;
  s.amax_kind = AmaxKind::current;
  return s;
}

}  // namespace exmy::test

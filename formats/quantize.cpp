#include "formats/quantize.hpp"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>
#include <memory>
#include <vector>

#include "formats/conventions.hpp"
#include "formats/error.hpp"
#include "formats/pack.hpp"
#include "formats/philox.hpp"
#include "formats/fast/loops.hpp"
#include "formats/spec.hpp"
#include "formats/vocab.hpp"

namespace exmy {

double QuantStats::sqnr_db() const { return 10.0 * std::log10(sum_sq / sum_sq_err); }

// ---------------------------------------------------------------------------
// Option parsing
// ---------------------------------------------------------------------------

namespace {

bool parse_positive_int(std::string_view s, int& v) {
  if (s.empty()) return false;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  return ec == std::errc() && p == s.data() + s.size() && v > 0;
}

std::string fmt_float(double v) {
  std::ostringstream os;
  os.precision(9);
  os << v;
  return os.str();
}

}  // namespace

// The names live in the option tables of formats/vocab.cpp.
ScaleRule parse_scale_rule(std::string_view s) { return scale_rule_options().parse(s); }
std::string_view scale_rule_name(ScaleRule r) { return scale_rule_options().name(r); }
Arith parse_arith(std::string_view s) { return arith_options().parse(s); }
ZeroScale parse_zero_scale(std::string_view s) { return zero_scale_options().parse(s); }

void parse_block(std::string_view s, int& rows, int& cols) {
  const auto x = s.find('x');
  int r = 0, c = 0;
  if (x == std::string_view::npos || !parse_positive_int(s.substr(0, x), r) ||
      !parse_positive_int(s.substr(x + 1), c) || (r != 1 && c != 1 && r != c) || r > (1 << 20) || c > (1 << 20)) {
    throw Error("bad block shape '" + std::string(s) + "' (expected 1xB, Bx1 or BxB with B >= 1)");
  }
  rows = r;
  cols = c;
}

void parse_tensor_amax(std::string_view s, AmaxKind& kind, double& value) {
  for (const auto& r : tensor_amax_options().rows)
    if (s == r.name) {
      kind = r.value;
      return;
    }
  double v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  // References are float32 values: one that rounds to 0 or Inf in float32
  // is refused, so that the printed value reads back (formats/vocab.hpp).
  const float f = static_cast<float>(v);
  if (ec != std::errc() || p != s.data() + s.size() || !(f > 0) || !std::isfinite(f)) {
    throw Error("bad tensor amax '" + std::string(s) +
                "' (expected none, auto or a positive number that is finite and non-zero in float32)");
  }
  kind = AmaxKind::given;
  value = static_cast<double>(f);
}

// ---------------------------------------------------------------------------
// QuantSpec
// ---------------------------------------------------------------------------

void QuantSpec::validate() const {
  if (codes == CodeConvention::te && !elem.is_signed)
    throw Error("--convention te needs a signed element format (TE's codes are signed), got " + format_name(elem));
  if (dequant == DequantOrder::scale_first && (arith != Arith::fp32 || !scale))
    throw Error("--dequant scale-first is an order of fp32 arithmetic with a block scale (give --arith fp32 and --scale)");
  if ((is_stochastic(round) || rule == ScaleRule::amax_sr) && (sr_bits < 1 || sr_bits > 32))
    throw Error("--sr-bits " + std::to_string(sr_bits) + " is out of range (expected 1..32)");
  if (block_rows < 1 || block_cols < 1 || (block_rows != 1 && block_cols != 1 && block_rows != block_cols))
    throw Error("bad block shape " + std::to_string(block_rows) + "x" + std::to_string(block_cols) +
                " (expected 1xB, Bx1 or BxB)");
  if (scale_target && !(*scale_target > 0 && std::isfinite(*scale_target)))
    throw Error("scale target " + fmt_float(*scale_target) + " must be a positive finite number");
  if (four_over_six != FourSix::off) {
    if (!scale) throw Error("--four-over-six needs a block scale (give --scale)");
    if (rule != ScaleRule::amax_rne && rule != ScaleRule::amax_up && rule != ScaleRule::amax_down)
      throw Error(rule == ScaleRule::amax_sr
                      ? "--four-over-six compares two deterministic scales; it cannot be combined with --scale-rule amax-sr"
                      : "--four-over-six needs an amax-* scale rule (an MX rule gives 4 and Fe.max the same power of two)");
    if (elem.max == pow2(elem.max_exp))
      throw Error("--four-over-six needs an element format whose max is not a power of two, got " + format_name(elem));
    if (dequant == DequantOrder::scale_first)
      throw Error("--four-over-six compares product-first x-hat; it cannot be combined with --dequant scale-first");
  }
  if (outer == OuterScale::row) {
    if (block_rows != 1)
      throw Error("--outer-scale row needs blocks along rows (1xB), got " + std::to_string(block_rows) + "x" +
                  std::to_string(block_cols));
    if (amax_kind == AmaxKind::given && row_amax.empty())
      throw Error("--outer-scale row takes one reference amax per row: give --tensor-amax auto (each row's own) "
                  "or none");
  }
  if (rht) {
    Rht{rht_size, rht_kind, rht_signs}.validate();
    const bool rows16 = block_rows == 1 && block_cols == 16;
    const bool cols16 = block_cols == 1 && block_rows == 16;
    if (!rows16 && !cols16)
      throw Error("--rht needs a 1x16 or 16x1 block (the transform runs along the block axis), got " +
                  std::to_string(block_rows) + "x" + std::to_string(block_cols));
  }
}

QuantPlan QuantSpec::plan() const {
  validate();
  QuantPlan p;
  p.fe = elem;
  p.has_scale = scale.has_value();
  if (scale) p.fs = *scale;
  p.br = block_rows;
  p.bc = block_cols;
  p.rule = rule;
  p.round = round;
  p.sr_bits = is_stochastic(round) ? sr_bits : 0;
  p.scale_sr_bits = scale && rule == ScaleRule::amax_sr ? sr_bits : 0;
  p.seed = seed;
  p.stream = stream;
  p.arith = arith;
  p.zero_scale = zero_scale;
  p.saturate = saturate;
  p.four_six = four_over_six;
  p.four_max = four_over_six != FourSix::off ? pow2(elem.max_exp) : 0.0;
  if (p.has_scale) {
    // T: a float32 value (docs/numerics.md §3), default Fs.max.
    p.target = scale_target ? static_cast<double>(static_cast<float>(*scale_target)) : p.fs.max;
    const Encoded one = encode_exact(p.fs, 1.0, Round::rne, 0, 0, true);
    p.one_code = one.code;
    p.one_value = p.fs.decode(one.code);
  } else {
    p.target = 1.0;
  }
  set_tensor_amax(p, std::numeric_limits<double>::quiet_NaN());
  return p;
}

int64_t block_count(const QuantSpec& spec, int64_t rows, int64_t cols) {
  if (!spec.scale) return 0;
  return ((rows + spec.block_rows - 1) / spec.block_rows) * ((cols + spec.block_cols - 1) / spec.block_cols);
}

// ---------------------------------------------------------------------------
// Shared helpers
// ---------------------------------------------------------------------------

namespace {

// "element (r, c)" of element i of the call, in its tensor's rows.
std::string element_name(const QuantPlan& p, int64_t i, int64_t cols) {
  return "element (" + std::to_string(p.row0 + i / cols) + ", " + std::to_string(i % cols) + ")";
}

[[noreturn]] void throw_nan(const QuantPlan& p, int64_t i, int64_t cols) {
  throw Error(element_name(p, i, cols) + " is NaN and neither the element format " + format_name(p.fe) +
              (p.has_scale ? " nor the scale format " + format_name(p.fs) : std::string()) + " has a NaN code");
}

[[noreturn]] void throw_overflow(const QuantPlan& p, float xi, int64_t i, int64_t cols) {
  throw Error(element_name(p, i, cols) + " = " + fmt_float(xi) +
              " overflows " + format_name(p.fe) + " with saturation off, and " + format_name(p.fe) +
              " has no Inf or NaN code");
}

bool nan_representable(const QuantPlan& p) { return p.fe.has_nan || (p.has_scale && p.fs.has_nan); }

// max|x| over the tensor; NaN if any element is NaN.
double tensor_amax_ref(const float* x, int64_t n) {
  float m = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    if (std::isnan(x[i])) return std::numeric_limits<double>::quiet_NaN();
    m = std::max(m, std::fabs(x[i]));
  }
  return m;
}

// max |x| from its bits as abs_max_bits orders them (NaN bits above Inf).
double amax_of_bits(uint32_t m) {
  return m > 0x7f800000u ? std::numeric_limits<double>::quiet_NaN() : static_cast<double>(float_of(m));
}

double reference_amax(const QuantSpec& spec, const float* x, int64_t n, int threads) {
  switch (spec.amax_kind) {
    case AmaxKind::none: return std::numeric_limits<double>::quiet_NaN();
    case AmaxKind::given: return spec.amax_value;
    case AmaxKind::current: break;
  }
  if (threads < 0) return tensor_amax_ref(x, n);
  return tensor_abs_max(x, n, threads);
}

// Row outer scales: the given reference of tensor row `row` (NaN without
// a reference; `current` rows measure their own).
double given_row_reference(const QuantSpec& spec, int64_t row) {
  return spec.amax_kind == AmaxKind::given ? spec.row_amax[static_cast<size_t>(row)]
                                           : std::numeric_limits<double>::quiet_NaN();
}

}  // namespace

namespace {
// max |x| bits over x[0..n) (NaN bits above Inf) in chunks; max is
// associative, so neither the chunking nor the threads change the result
uint32_t tensor_abs_max_bits(const float* x, int64_t n, int threads) {
  uint32_t m = 0;
  const int64_t chunk = 1 << 16;
#pragma omp parallel for num_threads(threads > 0 ? threads : omp_get_max_threads()) reduction(max : m) schedule(static)
  for (int64_t c = 0; c < n; c += chunk) m = std::max(m, detail::abs_max_bits(x + c, std::min(chunk, n - c)));
  return m;
}
}  // namespace

double tensor_abs_max(const float* x, int64_t n, int threads) { return amax_of_bits(tensor_abs_max_bits(x, n, threads)); }

// ---------------------------------------------------------------------------
// The scalar reference
// ---------------------------------------------------------------------------

namespace {
// A band of a larger tensor (BandQuantizer): its first row, the tensor's
// amax (for a current tensor amax, measured beforehand), and where its
// segment partials go instead of into the sums.
struct BandCall {
  int64_t row0 = 0;
  double amax = 0;
  std::vector<SumPartial>* partials = nullptr;
};
QuantInfo quantize_ref_exmy(const QuantSpec& spec, const float* x_in, int64_t rows, int64_t cols, const QuantOutput& out);
QuantInfo quantize_exmy(const QuantSpec& spec, const float* x_in, int64_t rows, int64_t cols, const QuantOutput& out,
                        int threads, const BandCall* part = nullptr);
}  // namespace

QuantInfo quantize_ref(const QuantSpec& spec, const float* x, int64_t rows, int64_t cols, const QuantOutput& out) {
  return with_conventions(spec, x, rows, cols, out,
                          [&](const QuantOutput& o) { return quantize_ref_exmy(spec, x, rows, cols, o); });
}

QuantInfo quantize(const QuantSpec& spec, const float* x, int64_t rows, int64_t cols, const QuantOutput& out,
                   int threads) {
  return with_conventions(spec, x, rows, cols, out,
                          [&](const QuantOutput& o) { return quantize_exmy(spec, x, rows, cols, o, threads); });
}

namespace {

QuantInfo quantize_ref_exmy(const QuantSpec& spec, const float* x_in, int64_t rows, int64_t cols, const QuantOutput& out) {
  QuantPlan p = spec.plan();
  const int64_t n = rows * cols;
  std::vector<float> transformed;
  const float* x = x_in;
  if (spec.rht) {
    transformed.assign(x_in, x_in + n);
    apply_rht_ref(spec, transformed.data(), rows, cols);
    x = transformed.data();
  }
  const bool by_row = spec.outer == OuterScale::row;
  QuantInfo info;
  if (by_row) detail::start_rows(spec, 0, rows, info);
  else set_tensor_amax(p, reference_amax(spec, x, n, -1));
  // Row outer scales: row r's encode scale from its own reference.
  auto start_row = [&](int64_t r) {
    const double m = tensor_amax_ref(x + r * cols, cols);
    const double a = spec.amax_kind == AmaxKind::current ? m : given_row_reference(spec, r);
    set_tensor_amax(p, a);
    info.row_amax[static_cast<size_t>(r)] = p.amax;
    info.row_abs_max[static_cast<size_t>(r)] = m;
    info.row_t[static_cast<size_t>(r)] = p.t;
  };

  QuantStats st;
  st.elements = static_cast<uint64_t>(n);
  // x-hat of every element, for the sums after the walk
  std::vector<float> own_values;
  float* values = out.values;
  if (!values && out.stats) {
    own_values.resize(static_cast<size_t>(n));
    values = own_values.data();
  }
  const int cb = p.fe.code_bytes();
  const int sb = p.has_scale ? p.fs.code_bytes() : 1;

  // The first problem (lowest row-major index) is reported after the walk,
  // so the message does not depend on the block shape.
  int64_t bad = std::numeric_limits<int64_t>::max();
  auto element = [&](int64_t i, const BlockConsts& c) {
    uint32_t code;
    float xh;
    if (std::isnan(x[i])) {
      if (!nan_representable(p)) bad = std::min(bad, i);
      code = p.fe.has_nan ? p.fe.nan_code : zero_code(p.fe, x[i]);
      xh = std::numeric_limits<float>::quiet_NaN();
    } else {
      const uint32_t r = is_stochastic(p.round) ? random_bits(p.seed, p.stream, static_cast<uint64_t>(i), p.sr_bits) : 0;
      const ElemOut e = encode_element(p, c, x[i], r);
      if (e.flags & kUnrepresentable) bad = std::min(bad, i);
      code = e.code;
      xh = e.xhat;
      st.saturated += (e.flags & kSaturated) ? 1 : 0;
    }
    st.nonzero += x[i] != 0.0f;
    st.underflow += (x[i] != 0.0f && xh == 0.0f);
    st.subnormal += p.fe.classify(code) == CodeClass::subnormal;
    store_code(out.codes, cb, i, code);
    if (values) values[i] = xh;
  };

  info.amax = p.amax;
  info.t = p.t;
  if (!p.has_scale) {
    const BlockConsts c{1.0, 0.0f};
    for (int64_t i = 0; i < n; ++i) {
      if (by_row && i % cols == 0) start_row(i / cols);
      element(i, c);
    }
  } else {
    const int64_t gr = (rows + p.br - 1) / p.br, gc = (cols + p.bc - 1) / p.bc;
    info.block_grid_rows = gr;
    info.block_grid_cols = gc;
    for (int64_t bi = 0; bi < gr; ++bi) {
      if (by_row) start_row(bi);  // blocks of one row (1xB)
      for (int64_t bj = 0; bj < gc; ++bj) {
        const int64_t r0 = bi * p.br, r1 = std::min(rows, r0 + p.br);
        const int64_t c0 = bj * p.bc, c1 = std::min(cols, c0 + p.bc);
        float b = 0.0f;
        bool nan = false;
        for (int64_t r = r0; r < r1; ++r)
          for (int64_t c = c0; c < c1; ++c) {
            nan = nan || std::isnan(x[r * cols + c]);
            b = std::max(b, std::fabs(x[r * cols + c]));
          }
        ++st.blocks;
        const int64_t blk = bi * gc + bj;
        if (nan) {
          // A NaN makes the whole block NaN.
          if (!nan_representable(p)) {
            for (int64_t r = r0; r < r1; ++r)
              for (int64_t c = c0; c < c1; ++c)
                if (std::isnan(x[r * cols + c])) bad = std::min(bad, r * cols + c);
          }
          store_code(out.scale_codes, sb, blk, p.fs.has_nan ? p.fs.nan_code : 0u);
          for (int64_t r = r0; r < r1; ++r)
            for (int64_t c = c0; c < c1; ++c) {
              const int64_t i = r * cols + c;
              const uint32_t code = p.fe.has_nan ? p.fe.nan_code : zero_code(p.fe, x[i]);
              const float xh = std::numeric_limits<float>::quiet_NaN();
              st.nonzero += x[i] != 0.0f;
              st.subnormal += p.fe.classify(code) == CodeClass::subnormal;
              store_code(out.codes, cb, i, code);
              if (values) values[i] = xh;
            }
          continue;
        }
        bool four = false;
        const BlockScale bs = four_over_six(p, x, block_geom(p, rows, cols, blk), b,
                                            block_scale(p, b, false, scale_random_bits(p, blk, cols)), four);
        st.scale_four += four;
        st.scale_saturated += bs.saturated;
        st.scale_underflow += bs.underflow;
        st.scale_subnormal += p.fs.classify(bs.code) == CodeClass::subnormal;
        store_code(out.scale_codes, sb, blk, bs.code);
        const BlockConsts c = block_consts(p, bs.s);
        for (int64_t r = r0; r < r1; ++r)
          for (int64_t cc = c0; cc < c1; ++cc) {
            const int64_t i = r * cols + cc;
            if (bs.zero) {
              const uint32_t code = zero_code(p.fe, x[i]);
              const float xh = (code & p.fe.sign_bit) ? -0.0f : 0.0f;
              st.nonzero += x[i] != 0.0f;
              st.underflow += x[i] != 0.0f;
              store_code(out.codes, cb, i, code);
              if (values) values[i] = xh;
            } else {
              element(i, c);
            }
          }
      }
    }
  }
  if (by_row) detail::finish_rows(info);
  if (bad != std::numeric_limits<int64_t>::max()) {
    if (by_row) start_row(bad / cols);  // the message shows the row's own scale
    detail::throw_element_error(p, x, bad, cols);
  }
  if (out.stats) {
    // docs/numerics.md §5: row by row, segment by segment, then the tree
    detail::store_sums(tensor_sums(x, values, rows, cols), st);
    *out.stats = st;
  }
  return info;
}

}  // namespace
}  // namespace exmy

// ---------------------------------------------------------------------------
// The fast CPU path
// ---------------------------------------------------------------------------
//
// Work is split into bands of block rows (br rows each; without a block
// scale, bands of 64 rows). Inside a band the element loop runs row-major, so
// the input, the outputs and the Philox counter stream are all walked
// sequentially whatever the block shape. Threads take whole bands (runs of
// consecutive bands), so a band's result does not depend on which thread ran
// it; integer statistics are reduced at the end. With statistics, the thread
// that quantized some rows also makes their segment partials of the double
// sums (four segments side by side), each into the segment's own slot, right
// after quantizing them; the fixed tree over the slots (docs/numerics.md §5)
// then runs once on the calling thread.

namespace exmy {
namespace {

struct Counts {
  uint64_t nonzero = 0, underflow = 0, saturated = 0, subnormal = 0;
  uint64_t scale_underflow = 0, scale_subnormal = 0, scale_saturated = 0, scale_four = 0;
  uint64_t bands_by_loop[detail::kLoopKinds] = {};  // bands each loop served
  void add(const Counts& o) {
    for (int k = 0; k < detail::kLoopKinds; ++k) bands_by_loop[k] += o.bands_by_loop[k];
    nonzero += o.nonzero;
    underflow += o.underflow;
    saturated += o.saturated;
    subnormal += o.subnormal;
    scale_underflow += o.scale_underflow;
    scale_subnormal += o.scale_subnormal;
    scale_saturated += o.scale_saturated;
    scale_four += o.scale_four;
  }
};

// First problem found by any thread: the lowest flat index wins, so the
// message does not depend on the thread count.
struct FirstError {
  std::atomic<int64_t> index{std::numeric_limits<int64_t>::max()};
  void note(int64_t i) {
    int64_t cur = index.load();
    while (i < cur && !index.compare_exchange_weak(cur, i)) {
    }
  }
};

struct BandState {
  // The call's loop (kLoops' first row that claims the plan), and the loop
  // of bands it declines.
  detail::Loop loop = detail::Loop::scalar_core;
  detail::Loop fallback = detail::Loop::scalar_core;
  std::vector<uint32_t> bmax_bits;  // block amax as |x| bits (NaN bits above Inf)
  std::vector<BlockScale> scale;
  std::vector<BlockConsts> consts;
  std::vector<uint8_t> nan, use_vec;
  std::vector<int64_t> scalar;  // with the 8-lane loop: the blocks it leaves to the scalar core
  uint8_t fp4_known[256] = {};  // fp4_by_code[code] is made (for this call's plan)
  detail::Fp4Block fp4_by_code[256];
  // Constants by scale code, for bands whose scale codes are made by
  // thresholds (coded_scales), made for this call's plan the first time a
  // block has that code: known (the block constants, fp4_by_code, code_use),
  // whether blocks of the code are quantized at all (not zero-scale ones),
  // whether the FP4 loops take them, and the threshold loops' thresholds.
  uint8_t code_known[256] = {};
  uint8_t code_use[256] = {};
  uint8_t fp4_use[256] = {};
  uint8_t thr_known[256] = {};
  detail::ThrBlock thr_by_code[256];
  BlockConsts consts_by_code[256];
  std::vector<uint8_t> code_of;  // with coded scales: each block's scale code
  std::vector<detail::F64Block> f64;
  std::vector<detail::Fp4Block> fp4;
  detail::Fp4Magnitudes fp4_mags;
  bool fp4_mags_ready = false;
  // The outputs are large, aligned and rows a multiple of 4 long:
  // non-temporal stores (the per-block threshold loop also needs bc % 4 == 0).
  bool stream = false;
  const detail::ScaleThr* sthr = nullptr;  // the call's scale-code thresholds (threshold loop)
  detail::ScaleThr row_sthr;               // ... those of the row, with row outer scales
  // The band this thread quantizes next (its first row and row count), if
  // known: the element loop prefetches it.
  const float* next = nullptr;
  int64_t next_rows = 0;
  // The band's own block-max pass prefetched the first half of the next
  // band (one-row bands: band_block_max_bits with next); its element loop
  // then prefetches the second half, so the traffic runs on through both
  // passes (held 1x16, Intel Xeon family 6 model 207: docs/benchmarks.md).
  bool next_half = false;
};

// One element on the scalar path (the reference's per-element code).
inline void scalar_element(const QuantPlan& p, const BlockConsts& c, const float* x, int64_t i, bool nan_block,
                           bool zero_block, bool nan_ok, const QuantOutput& out, float* values, RandomBits& rng,
                           Counts& cnt, FirstError& err) {
  uint32_t code;
  float xh;
  if (nan_block || std::isnan(x[i])) {
    if (!nan_ok && std::isnan(x[i])) err.note(i);
    code = p.fe.has_nan ? p.fe.nan_code : zero_code(p.fe, x[i]);
    xh = std::numeric_limits<float>::quiet_NaN();
  } else if (zero_block) {
    code = zero_code(p.fe, x[i]);
    xh = (code & p.fe.sign_bit) ? -0.0f : 0.0f;
  } else {
    const uint32_t r = is_stochastic(p.round) ? rng(static_cast<uint64_t>(i)) : 0;
    const ElemOut e = encode_element(p, c, x[i], r);
    if (e.flags & kUnrepresentable) err.note(i);
    cnt.saturated += (e.flags & kSaturated) ? 1 : 0;
    code = e.code;
    xh = e.xhat;
  }
  cnt.nonzero += x[i] != 0.0f;
  cnt.underflow += (x[i] != 0.0f && xh == 0.0f);
  cnt.subnormal += p.fe.classify(code) == CodeClass::subnormal;
  store_code(out.codes, p.fe.code_bytes(), i, code);
  values[i] = xh;
}

// One band's geometry and the call's choices for it, shared by the passes
// of quantize_band.
struct Band {
  int64_t cols = 0, r0 = 0, r1 = 0, blk0 = 0;
  int64_t bc = 0, gc = 0;  // gc blocks of bc columns (without a scale: one block of the whole band)
  detail::Loop other = detail::Loop::scalar_core;  // the loop of bands the threshold loops decline, or the call's loop
  bool thr_loop = false, fp4_loop = false, f64_loop = false;
  bool coded = false;  // scale codes and constants by code (coded_scales)
};

// Pass 1: the blocks' amax bits (NaN detection too), unless the tensor-amax
// pass already measured them (bmax).
const uint32_t* band_block_maxima(const QuantPlan& p, const float* x, const Band& g, const uint32_t* bmax,
                                  BandState& bs) {
  bs.next_half = false;
  if (bmax) return bmax;
  bs.bmax_bits.resize(static_cast<size_t>(g.gc));
  const float* x0 = x + g.r0 * g.cols;
  const bool one_row = g.r1 - g.r0 == 1 && bs.next_rows == 1;
  if (p.has_scale)
    bs.next_half = detail::band_block_max_bits(x0, g.r1 - g.r0, g.cols, p.bc, bs.bmax_bits.data(),
                                               one_row ? bs.next : nullptr);
  else bs.bmax_bits[0] = detail::abs_max_bits(x0, (g.r1 - g.r0) * g.cols);
  return bs.bmax_bits.data();
}

// Pass 2 by scale code (the threshold loops; the FP4 loops with one-byte
// scale codes): every block's scale code from its amax bits
// (block_scale_codes, by amax thresholds where bs.sthr has them), and the
// constants of each code in the band's range, made once per code and call
// (with the thresholds of the threshold loops when `thresholds`). Returns
// false, doing nothing, where the band holds Inf or NaN or codes outside the
// thresholds' cover (the general pass then takes it); else sets band_max.
// Blocks the band's loop does not take (zero-scale ones; with the FP4 loops
// also those whose reciprocal scale is not a normal float) are listed in
// bs.scalar with their constants in bs.consts.
bool coded_scales(const QuantPlan& p, const uint32_t* bm, const Band& g, bool thresholds, const QuantOutput& out,
                  BandState& bs, Counts& cnt, uint32_t& band_max) {
  bs.code_of.resize(static_cast<size_t>(g.gc));
  detail::ScaleCodeOut so;
  if (!detail::block_scale_codes(p, bs.sthr, bm, g.gc, bs.code_of.data(), so)) return false;
  band_max = so.max_bits;
  const uint8_t* use = thresholds ? bs.code_use : bs.fp4_use;
  bool scalar_blocks = false;
  for (uint32_t code = so.code_min; code <= so.code_max; ++code) {
    if (!bs.code_known[code]) {
      const double s = p.fs.decode(code);
      bs.code_use[code] = s != 0.0;  // s = 0 only for zero-scale blocks (policy zero)
      bs.fp4_use[code] = 0;
      if (s != 0.0) {
        bs.consts_by_code[code] = block_consts(p, s);
        if (!bs.fp4_known[code]) {
          detail::fp4_blocks(p, bs.fp4_mags, &bs.consts_by_code[code], 1, &bs.fp4_by_code[code]);
          bs.fp4_known[code] = 1;
        }
        bs.fp4_use[code] = bs.fp4_by_code[code].ok;
      }
      bs.code_known[code] = 1;
    }
    if (thresholds && bs.code_use[code] && !bs.thr_known[code]) {
      detail::threshold_block(p, bs.consts_by_code[code], bs.fp4_by_code[code], bs.thr_by_code[code]);
      bs.thr_known[code] = 1;
    }
    scalar_blocks = scalar_blocks || !use[code];
  }
  bs.scalar.clear();
  if (scalar_blocks) {  // the scalar core encodes them
    bs.consts.resize(static_cast<size_t>(g.gc));
    for (int64_t j = 0; j < g.gc; ++j) {
      const uint8_t code = bs.code_of[static_cast<size_t>(j)];
      if (use[code]) continue;
      const bool zero = !bs.code_use[code];
      bs.scale[static_cast<size_t>(j)].zero = zero;
      bs.nan[static_cast<size_t>(j)] = 0;
      bs.consts[static_cast<size_t>(j)] = zero ? BlockConsts{0.0, 0.0f} : bs.consts_by_code[code];
      bs.scalar.push_back(j);
    }
  }
  if (out.scale_codes)
    std::memcpy(static_cast<uint8_t*>(out.scale_codes) + g.blk0, bs.code_of.data(), static_cast<size_t>(g.gc));
  cnt.scale_saturated += so.saturated;
  cnt.scale_underflow += so.underflow;
  cnt.scale_subnormal += so.subnormal;
  return true;
}

// Pass 2 in general: block by block, NaN blocks and zero scales included;
// scales_done when block_scales_vec made bs.scale already. Four over six
// (whose plans only the scalar core takes) chooses each block's scale here
// from the block's elements in x.
void general_scales(const QuantPlan& p, const float* x, const uint32_t* bm, const Band& g, bool scales_done,
                    const QuantOutput& out, BandState& bs, Counts& cnt) {
  const int sb = p.has_scale ? p.fs.code_bytes() : 1;
  for (int64_t j = 0; j < g.gc; ++j) {
    // A NaN poisons its block; without a block scale it stays an element
    // matter for the scalar loop (the band then skips the vector loops).
    const bool has_nan = bm[j] > 0x7f800000u;
    bs.nan[j] = p.has_scale && has_nan;
    bool zero = false;
    if (p.has_scale) {
      if (bs.nan[j]) {
        bs.scale[j] = BlockScale{p.fs.has_nan ? p.fs.nan_code : 0u, 0.0, false, false, false};
      } else {
        if (!scales_done) bs.scale[j] = block_scale(p, float_of(bm[j]), false, scale_random_bits(p, g.blk0 + j, g.cols));
        if (p.four_six != FourSix::off) {
          const int64_t c0 = j * g.bc, width = std::min(g.bc, g.cols - c0);
          bool four = false;
          bs.scale[j] = four_over_six(p, x, BlockGeom{g.r0, c0, width, (g.r1 - g.r0) * width, g.cols},
                                      float_of(bm[j]), bs.scale[j], four);
          cnt.scale_four += four;
        }
        cnt.scale_saturated += bs.scale[j].saturated;
        cnt.scale_underflow += bs.scale[j].underflow;
        cnt.scale_subnormal += p.fs.classify(bs.scale[j].code) == CodeClass::subnormal;
        bs.consts[j] = block_consts(p, bs.scale[j].s);
        zero = bs.scale[j].zero;
      }
      store_code(out.scale_codes, sb, g.blk0 + j, bs.scale[j].code);
    }
    if (has_nan || zero) continue;
    bs.use_vec[j] = g.fp4_loop || g.f64_loop;
    if (g.f64_loop) bs.f64[j] = detail::f64_block(p, bs.consts[j]);
  }
}

// Pass 3: the elements, row-major. The vector loops take the blocks marked
// in use_vec (the threshold loops: those whose code they use); the rest (NaN
// blocks, zero-scale blocks, formats the vector loops do not cover) go
// element by element through the scalar core.
void band_elements(const QuantPlan& p, const float* x, const Band& g, bool use_thr, const QuantOutput& out,
                   float* values, BandState& bs, Counts& cnt, FirstError& err) {
  using detail::Loop;
  RandomBits rng(p.seed, p.stream, p.sr_bits > 0 ? p.sr_bits : 8, static_cast<uint64_t>(p.row0 * g.cols));
  const bool nan_ok = nan_representable(p);
  auto* codes = static_cast<uint8_t*>(out.codes);
  detail::SpanCounts sc;
  const int64_t nrows = p.has_scale ? g.r1 - g.r0 : 1;
  const int64_t rcols = p.has_scale ? g.cols : (g.r1 - g.r0) * g.cols;
  // The threshold loop with a block per lane takes the whole band at once.
  const bool thr_lanes =
      use_thr && (bs.loop == Loop::threshold_lanes_x8 || bs.loop == Loop::threshold_lanes_x16);
  // What a row loop prefetches: the same row of the next band, its second
  // half where the block-max pass took the first (one row: rr = 0).
  auto set_prefetch = [&](auto& row, int64_t rr) {
    row.prefetch = rr < bs.next_rows ? bs.next + rr * g.cols : nullptr;
    if (bs.next_half) row.prefetch += g.cols / 2, row.prefetch_half = true;
  };
  ++cnt.bands_by_loop[static_cast<int>(use_thr ? bs.loop : g.other)];
  for (int64_t rr = 0; rr < nrows; ++rr) {
    const int64_t i0 = (g.r0 + rr) * g.cols;
    // (threshold_band_lanes takes the band's rows with its first)
    if (use_thr && (!thr_lanes || rr == 0)) {
      detail::ThrRow row{.x = x + i0,
                        .i0 = i0,
                        .cols = rcols,
                        .bc = g.bc,
                        .nblocks = g.gc,
                        .code = bs.code_of.data(),
                        .consts = bs.consts_by_code,
                        .thr = bs.thr_by_code,
                        .use = bs.code_use,
                        .stats = out.stats != nullptr,
                        .stream = bs.stream};
      if (thr_lanes) {
        row.rows = nrows;
        row.prefetch = bs.next_rows == nrows ? bs.next : nullptr;  // the next band, if as tall
        if (bs.loop == Loop::threshold_lanes_x16) detail::avx512::threshold_band_lanes(p, row, codes, values, sc);
        else detail::avx2::threshold_band_lanes(p, row, codes, values, sc);
      } else {
        row.stream = bs.stream && g.bc % 4 == 0;
        set_prefetch(row, rr);
        if (bs.loop == Loop::threshold_x16) detail::avx512::threshold_row(p, row, codes, values, sc);
        else detail::avx2::threshold_row(p, row, codes, values, sc);
      }
    } else if (g.fp4_loop && !use_thr) {
      // by scale code (coded_scales), or per block (general_scales)
      detail::Fp4Row row =
          g.coded ? detail::Fp4Row{x + i0, i0, rcols, g.bc, g.gc, bs.consts_by_code, bs.fp4_by_code, bs.fp4_use,
                                   out.stats != nullptr, bs.code_of.data(), bs.stream}
                  : detail::Fp4Row{x + i0, i0, rcols, g.bc, g.gc, bs.consts.data(), bs.fp4.data(), bs.use_vec.data(),
                                   out.stats != nullptr, nullptr, bs.stream};
      set_prefetch(row, rr);
      if (g.other == Loop::fp4x16) detail::avx512::fp4x16_row(p, row, codes, values, rng, sc);
      else detail::avx2::fp4x8_row(p, row, codes, values, rng, sc);
    }
    auto scalar_block = [&](int64_t j) {
      const int64_t c0 = j * g.bc, c1 = std::min(rcols, c0 + g.bc);
      const bool zero = p.has_scale && !bs.nan[j] && bs.scale[j].zero;
      for (int64_t c = c0; c < c1; ++c)
        scalar_element(p, bs.consts[j], x, i0 + c, bs.nan[j], zero, nan_ok, out, values, rng, cnt, err);
    };
    if (g.fp4_loop || use_thr) {  // fp4x8_row or threshold_row did the others
      for (const int64_t j : bs.scalar) scalar_block(j);
      continue;
    }
    for (int64_t j = 0; j < g.gc; ++j) {
      if (!bs.use_vec[j]) {
        scalar_block(j);
      } else if (g.f64_loop) {
        const int64_t c0 = j * g.bc, c1 = std::min(rcols, c0 + g.bc);
        detail::avx2::f64x4_span(p, bs.consts[j], bs.f64[j], x + i0 + c0, i0 + c0, c1 - c0, codes, values, rng, sc);
      }
    }
  }
  cnt.nonzero += sc.nonzero;
  cnt.underflow += sc.underflow;
  cnt.saturated += sc.saturated;
  cnt.subnormal += sc.subnormal;
}

// Quantizes rows [r0, r1) (one band) of x. `blk0` is the index of the band's
// first block; `bmax` its blocks' amax bits when already measured. Without a
// block scale the band is one block-free run. Returns max |x| of the band as
// bits (NaN above Inf).
uint32_t quantize_band(const QuantPlan& p, const float* x, int64_t cols, int64_t r0, int64_t r1, int64_t blk0,
                       const uint32_t* bmax, const QuantOutput& out, float* values, BandState& bs, Counts& cnt,
                       FirstError& err) {
  using detail::Loop;
  Band g{.cols = cols, .r0 = r0, .r1 = r1, .blk0 = blk0};
  g.thr_loop = bs.loop == Loop::threshold_x16 || bs.loop == Loop::threshold_x8 ||
               bs.loop == Loop::threshold_lanes_x8 || bs.loop == Loop::threshold_lanes_x16;
  g.other = g.thr_loop ? bs.fallback : bs.loop;
  g.fp4_loop = g.other == Loop::fp4x8 || g.other == Loop::fp4x16;
  g.f64_loop = g.other == Loop::f64x4;
  g.bc = p.has_scale ? p.bc : (r1 - r0) * cols;
  g.gc = p.has_scale ? (cols + p.bc - 1) / p.bc : 1;
  bs.scale.resize(static_cast<size_t>(g.gc));
  bs.nan.resize(static_cast<size_t>(g.gc));
  if (g.fp4_loop && !bs.fp4_mags_ready) {
    bs.fp4_mags = detail::fp4_magnitudes(p);
    bs.fp4_mags_ready = true;
  }
  const uint32_t* bm = band_block_maxima(p, x, g, bmax, bs);

  // Pass 2: block scales and the constants of each block's element loop.
  // The threshold loops, and the FP4 loops with one-byte scale codes, take
  // the codes by coded_scales and their constants by code; the rest (and
  // bands with Inf or NaN) go through general_scales.
  uint32_t band_max = 0;
  const bool one_byte = p.has_scale && p.fs.code_bytes() == 1;
  // (widths a multiple of 8: not the 8-lane loop's block-per-lane form; the
  // 16-lane loop claims multiples of 16 only)
  const bool fp4_coded = g.fp4_loop && !g.thr_loop && one_byte && p.bc % 8 == 0;
  g.coded = (g.thr_loop || fp4_coded) && coded_scales(p, bm, g, g.thr_loop, out, bs, cnt, band_max);
  const bool use_thr = g.thr_loop && g.coded;
  if (!g.coded) {
    for (int64_t j = 0; j < g.gc; ++j) band_max = std::max(band_max, bm[j]);
    bs.consts.assign(static_cast<size_t>(g.gc), BlockConsts{1.0, 0.0f});
    bs.nan.assign(static_cast<size_t>(g.gc), 0);
    bs.use_vec.assign(static_cast<size_t>(g.gc), 0);
    if (g.f64_loop) bs.f64.resize(static_cast<size_t>(g.gc));
    if (g.fp4_loop) bs.fp4.resize(static_cast<size_t>(g.gc));
    const bool scales_done = p.has_scale && detail::block_scales_vec(p, bm, g.gc, bs.scale.data());
    general_scales(p, x, bm, g, scales_done, out, bs, cnt);
    if (g.fp4_loop) {
      detail::fp4_blocks(p, bs.fp4_mags, bs.consts.data(), g.gc, bs.fp4.data());
      bs.scalar.clear();
      for (int64_t j = 0; j < g.gc; ++j) {
        bs.use_vec[j] = bs.use_vec[j] && bs.fp4[j].ok;
        if (!bs.use_vec[j]) bs.scalar.push_back(j);
      }
    }
  }
  band_elements(p, x, g, use_thr, out, values, bs, cnt, err);
  return band_max;
}

// The segment partials of rows [r0, r1) (docs/numerics.md §5) into part,
// indexed by row * (segments per row) + segment, segment_lanes() segments of
// the same length at a time: a row's full segments and its shorter last one
// go to separate batches; a batch left short at the end repeats its first
// segment in the unused lanes.
void row_partials(const float* x, const float* xh, int64_t r0, int64_t r1, int64_t cols, SumPartial* part) {
  constexpr int kMax = 8;
  const int lanes = detail::segment_lanes();
  struct Batch {
    const float *x[kMax], *xh[kMax];
    int64_t seg[kMax];
    int k = 0;
  } batch[2];
  auto flush = [&](Batch& b, int64_t len) {
    SumPartial got[kMax];
    for (int k = b.k; k < lanes; ++k) b.x[k] = b.x[0], b.xh[k] = b.xh[0];
    detail::segment_partials(b.x, b.xh, len, got);
    for (int k = 0; k < b.k; ++k) part[b.seg[k]] = got[k];
    b.k = 0;
  };
  const int64_t per = sum_segments_per_row(cols);
  if (per == 0) return;  // rows of no elements: no segments
  const int64_t last_len = sum_segment(cols, per - 1).len;
  for (int64_t i = r0 * per; i < r1 * per; ++i) {
    const SumSegment g = sum_segment(cols, i);
    Batch& b = batch[g.len == kSumSegment ? 0 : 1];
    b.x[b.k] = x + g.begin;
    b.xh[b.k] = xh + g.begin;
    b.seg[b.k] = i;
    if (++b.k == lanes) flush(b, g.len);
  }
  if (batch[0].k) flush(batch[0], kSumSegment);
  if (batch[1].k) flush(batch[1], last_len);
}

QuantInfo quantize_exmy(const QuantSpec& spec, const float* x_in, int64_t rows, int64_t cols, const QuantOutput& out,
                        int threads, const BandCall* part) {
  QuantPlan p = spec.plan();
  if (part) p.row0 = part->row0;
  const bool amax_given = part && spec.amax_kind == AmaxKind::current;  // the tensor's, not the band's
  const int nt = threads > 0 ? threads : omp_get_max_threads();
  const int64_t n = rows * cols;
  std::vector<float> transformed;
  const float* x = x_in;
  if (spec.rht) {
    transformed.resize(static_cast<size_t>(n));
    std::memcpy(transformed.data(), x_in, sizeof(float) * static_cast<size_t>(n));
    apply_rht(spec, transformed.data(), rows, cols, nt);
    x = transformed.data();
  }
  // Row outer scales: every band is one row, quantized with its own plan
  // (run_band), and the tensor amax is not needed.
  const bool by_row = spec.outer == OuterScale::row;
  QuantInfo info;
  if (by_row) detail::start_rows(spec, p.row0, rows, info);
  const int64_t band = by_row ? 1 : p.has_scale ? p.br : 64;
  const int64_t nbands = (rows + band - 1) / band;
  const int64_t gc = p.has_scale ? (cols + p.bc - 1) / p.bc : 0;
  // With a block scale and the current amax, one pass measures every
  // block's amax and the tensor amax is their maximum: the bands then do not
  // read their input a second time before quantizing it.
  std::unique_ptr<uint32_t[]> block_max;  // written whole by the pass below: not zeroed first
  const uint32_t* bmax = nullptr;
  if (p.has_scale && spec.amax_kind == AmaxKind::current) {
    block_max.reset(new uint32_t[static_cast<size_t>(nbands * gc)]);
    uint32_t m = 0;
#pragma omp parallel for num_threads(nt) reduction(max : m) schedule(static)
    for (int64_t b = 0; b < nbands; ++b) {
      uint32_t* acc = block_max.get() + b * gc;
      const int64_t r0 = b * band;
      detail::band_block_max_bits(x + r0 * cols, std::min(rows, r0 + band) - r0, cols, p.bc, acc);
      for (int64_t j = 0; j < gc; ++j) m = std::max(m, acc[j]);
    }
    set_tensor_amax(p, amax_given && !by_row ? part->amax : amax_of_bits(m));
    bmax = block_max.get();
  } else if (!by_row) {
    set_tensor_amax(p, amax_given ? part->amax : reference_amax(spec, x, n, nt));
  }

  std::vector<float> own_values;
  float* values = out.values;
  if (!values) {
    own_values.resize(static_cast<size_t>(n));
    values = own_values.data();
  }

  // Values much larger than the last-level cache go past it with
  // non-temporal stores, as memcpy does: they would only evict the input.
  // (The one-byte codes stay cached: formats/fast/thr_step_x16.hpp.)
  // (Not with statistics: the sums read the values right back.)
  constexpr int64_t kStreamBytes = int64_t{64} << 20;
  const bool stream =
      !out.stats && n * 5 >= kStreamBytes && reinterpret_cast<uintptr_t>(values) % 16 == 0 && cols % 4 == 0;
  // The element loop: the first of the declared loops (formats/fast/loops.hpp)
  // that claims the plan on this CPU, else the scalar core. (The threshold
  // loops' constants cost about ten times the others per scale code, a
  // search with the scalar core, which small tensors do not win back: they
  // claim only calls of kThresholdMinElements or more.)
  // (With row outer scales the constants are made per row: a row is the call.)
  const detail::Loop loop = detail::choose_loop(p, by_row ? cols : n);
  const detail::Loop fallback = detail::loop_decl(loop).band_fallback;
  // Scale codes by thresholds (block_scale_codes) for the loops that take
  // codes by thresholds, where the call is large enough to win back making
  // them (without them, block_scale_codes computes each code).
  const bool fp4_loop = loop == detail::Loop::fp4x8 || loop == detail::Loop::fp4x16;
  const bool want_sthr =
      detail::loop_decl(loop).needs_large || (fp4_loop && (by_row ? cols : n) >= detail::kThresholdMinElements);
  detail::ScaleThr sthr;
  if (want_sthr) sthr = detail::scale_code_thresholds(p);
  Counts total;
  FirstError err;
  uint32_t amax_bits = 0;  // max of the block maxima, |x| bits (NaN above Inf)
  // Band b on a thread's state, in a run of bands that ends before band
  // `end` (the thread takes b + 1 next, if it is in the run); returns the
  // band's max |x| bits.
  auto run_band = [&](int64_t b, int64_t end, BandState& bs, Counts& cnt) {
    bs.stream = stream;
    bs.loop = loop;
    bs.fallback = fallback;
    bs.sthr = &sthr;
    const int64_t r0 = b * band, r1 = std::min(rows, r0 + band);
    if (by_row) {  // row r0's own tensor scale, and the constants made for it
      const uint32_t m = bmax ? (gc ? *std::max_element(bmax + b * gc, bmax + (b + 1) * gc) : 0u)
                              : detail::abs_max_bits(x + r0 * cols, cols);
      QuantPlan pr = p;
      set_tensor_amax(pr, spec.amax_kind == AmaxKind::current ? amax_of_bits(m) : given_row_reference(spec, p.row0 + r0));
      info.row_amax[static_cast<size_t>(r0)] = pr.amax;
      info.row_abs_max[static_cast<size_t>(r0)] = amax_of_bits(m);
      info.row_t[static_cast<size_t>(r0)] = pr.t;
      std::memset(bs.fp4_known, 0, sizeof bs.fp4_known);
      std::memset(bs.thr_known, 0, sizeof bs.thr_known);
      std::memset(bs.code_known, 0, sizeof bs.code_known);
      if (want_sthr) {
        bs.row_sthr = detail::scale_code_thresholds(pr);
        bs.sthr = &bs.row_sthr;
      }
      bs.next = nullptr;
      bs.next_rows = 0;
      return quantize_band(pr, x, cols, r0, r1, b * gc, bmax ? bmax + b * gc : nullptr, out, values, bs, cnt, err);
    }
    // The next band is prefetched while b computes: where a band reads its
    // input twice (block maxima, then elements) so that the second read
    // hits the cache, and also where the maxima were measured beforehand
    // (current amax), since the hardware prefetcher alone leaves the loops'
    // arithmetic and the memory traffic in turn rather than at once
    // (docs/benchmarks.md).
    const bool prefetch = b + 1 < end;
    bs.next = prefetch ? x + r1 * cols : nullptr;
    bs.next_rows = prefetch ? std::min(rows, r1 + band) - r1 : 0;
    return quantize_band(p, x, cols, r0, r1, b * gc, bmax ? bmax + b * gc : nullptr, out, values, bs, cnt, err);
  };
  // With statistics, each segment's partial sums (docs/numerics.md §5) go
  // to their own slot, made by the thread that quantized the segment's rows;
  // the tree over the slots follows the parallel region, so the sums do not
  // depend on which thread made which partial.
  std::vector<SumPartial> partials(static_cast<size_t>(out.stats ? sum_segments(rows, cols) : 0));
  const int64_t segs_per_row = sum_segments_per_row(cols);
  // Threads take runs of consecutive bands (at most about 1 MiB of input,
  // and at least four runs per thread), so that within a run each band
  // knows the next and each thread reads one sequential stream.
  const int64_t per = std::max<int64_t>(
      1, std::min<int64_t>((int64_t{1} << 18) / std::max<int64_t>(1, band * cols), nbands / (4 * nt)));
  const int64_t nruns = (nbands + per - 1) / per;
#pragma omp parallel num_threads(nt) reduction(max : amax_bits)
  {
    Counts cnt;
    BandState bs;
#pragma omp for schedule(dynamic, 1)
    for (int64_t g = 0; g < nruns; ++g) {
      const int64_t b0 = g * per, b1 = std::min(nbands, b0 + per);
      int64_t sum_row = b0 * band;  // the first row of the run whose partials are still to make
      for (int64_t b = b0; b < b1; ++b) {
        amax_bits = std::max(amax_bits, run_band(b, b1, bs, cnt));
        // the partials of the rows just quantized, while their values are in
        // cache, once they fill four batches of four segments
        const int64_t r1 = std::min(rows, (b + 1) * band);
        if (out.stats && ((r1 - sum_row) * segs_per_row >= 16 || b + 1 == b1)) {
          row_partials(x, values, sum_row, r1, cols, partials.data());
          sum_row = r1;
        }
      }
    }
    if (stream) detail::stream_fence();  // before the region's barrier: the caller reads the values
#pragma omp critical
    total.add(cnt);
  }
  detail::loop_use_add(total.bands_by_loop);
  const int64_t bad = err.index.load();
  if (bad != std::numeric_limits<int64_t>::max()) {
    if (by_row) set_tensor_amax(p, info.row_amax[static_cast<size_t>(bad / cols)]);  // the row's own scale
    detail::throw_element_error(p, x, bad, cols);
  }

  info.amax = p.amax;
  info.t = p.t;
  info.abs_max = amax_of_bits(amax_bits);
  if (by_row) detail::finish_rows(info);
  if (p.has_scale) {
    info.block_grid_rows = nbands;
    info.block_grid_cols = gc;
  }
  if (out.stats) {
    QuantStats st;
    st.elements = static_cast<uint64_t>(n);
    st.blocks = static_cast<uint64_t>(block_count(spec, rows, cols));
    st.nonzero = total.nonzero;
    st.underflow = total.underflow;
    st.saturated = total.saturated;
    st.subnormal = total.subnormal;
    st.scale_underflow = total.scale_underflow;
    st.scale_subnormal = total.scale_subnormal;
    st.scale_saturated = total.scale_saturated;
    st.scale_four = total.scale_four;
    if (part) part->partials->insert(part->partials->end(), partials.begin(), partials.end());
    else detail::store_sums(tree_sum(partials.data(), static_cast<int64_t>(partials.size())), st);
    *out.stats = st;
  }
  return info;
}

}  // namespace

BandQuantizer::BandQuantizer(const QuantSpec& spec, int64_t rows, int64_t cols, bool stats, int threads)
    : spec_(spec), rows_(rows), cols_(cols), stats_(stats), threads_(threads) {
  spec_.validate();
  if (stats_) partials_.reserve(static_cast<size_t>(sum_segments(rows, cols)));
}

// A band must start where a block row does and end inside the tensor.
void BandQuantizer::check_band(int64_t at, int64_t rows) const {
  if (at % band_rows() != 0 || rows < 0 || rows > rows_ - at)
    throw Error("band of rows [" + std::to_string(at) + ", " + std::to_string(at + rows) + ") of a tensor of " +
                std::to_string(rows_) + " rows in bands of " + std::to_string(band_rows()));
}

void BandQuantizer::measure(const float* x, int64_t rows) {
  check_band(measured_rows_, rows);
  const int64_t n = rows * cols_;
  if (spec_.rht) {  // the amax of the tensor that is quantized
    scratch_.assign(x, x + n);
    apply_rht(spec_, scratch_.data(), rows, cols_, threads_);
    x = scratch_.data();
  }
  amax_bits_ = std::max(amax_bits_, tensor_abs_max_bits(x, n, threads_));
  measured_rows_ += rows;
}

void BandQuantizer::quantize(const float* x, int64_t rows, const QuantOutput& out) {
  check_band(next_row_, rows);
  if (needs_amax() && measured_rows_ != rows_) throw Error("BandQuantizer: the tensor amax is not measured yet");
  QuantStats band_stats;
  QuantOutput o = out;
  o.stats = stats_ ? &band_stats : nullptr;
  const BandCall call{next_row_, amax_of_bits(amax_bits_), &partials_};
  with_conventions(spec_, x, rows, cols_, o,
                   [&](const QuantOutput& oo) { return quantize_exmy(spec_, x, rows, cols_, oo, threads_, &call); });
  next_row_ += rows;
  counts_.add_counts(band_stats);  // the sums wait for the tree over every band's partials
}

QuantStats BandQuantizer::stats() const {
  if (next_row_ != rows_) throw Error("BandQuantizer: statistics before the last band");
  QuantStats st = counts_;
  detail::store_sums(tree_sum(partials_.data(), static_cast<int64_t>(partials_.size())), st);
  return st;
}

}  // namespace exmy

namespace exmy::detail {

void throw_element_error(const QuantPlan& p, const float* x, int64_t i, int64_t cols) {
  throw_element_error(p, x[i], i, cols);
}

void throw_element_error(const QuantPlan& p, float xi, int64_t i, int64_t cols) {
  if (std::isnan(xi)) throw_nan(p, i, cols);
  throw_overflow(p, xi, i, cols);
}

void store_sums(const SumPartial& sums, QuantStats& st) {
  const SumPartial s = final_sums(sums);
  st.sum_sq = s.sq;
  st.sum_sq_err = s.sq_err;
  st.sum_err = s.err;
  st.sum_abs = s.abs;
}

void start_rows(const QuantSpec& spec, int64_t row0, int64_t rows, QuantInfo& info) {
  if (spec.amax_kind == AmaxKind::given && static_cast<int64_t>(spec.row_amax.size()) < row0 + rows)
    throw Error("--outer-scale row: " + std::to_string(spec.row_amax.size()) + " row references for a tensor of " +
                std::to_string(row0 + rows) + " rows");
  info.row_amax.assign(static_cast<size_t>(rows), 0.0);
  info.row_abs_max.assign(static_cast<size_t>(rows), 0.0);
  info.row_t.assign(static_cast<size_t>(rows), 1.0f);
}

void finish_rows(QuantInfo& info) {
  double a = 0;
  float t = std::numeric_limits<float>::max();
  for (size_t r = 0; r < info.row_t.size(); ++r) {
    a = std::isnan(a) || std::isnan(info.row_amax[r]) ? std::numeric_limits<double>::quiet_NaN()
                                                      : std::max(a, info.row_amax[r]);
    t = std::min(t, info.row_t[r]);
  }
  info.amax = info.row_t.empty() ? std::numeric_limits<double>::quiet_NaN() : a;
  info.t = info.row_t.empty() ? 1.0f : t;
  double m = 0;
  for (const double v : info.row_abs_max) m = std::isnan(m) || std::isnan(v) ? v + m : std::max(m, v);
  info.abs_max = m;
}

}  // namespace exmy::detail

// Block-scaled quantization of a float32 tensor (docs/numerics.md §3, §5): the user
// facing description (QuantSpec), its statistics, and the two CPU
// implementations, the scalar reference and the threaded fast path, which
// must agree bit for bit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "formats/format.hpp"
#include "formats/hadamard_segment.hpp"
#include "formats/quant_core.hpp"
#include "formats/quant_sums.hpp"
#include "formats/round.hpp"

namespace exmy {

// Statistics of one quantization call (docs/numerics.md §5).
struct QuantStats {
  uint64_t elements = 0, nonzero = 0, underflow = 0, saturated = 0, subnormal = 0;
  uint64_t blocks = 0, scale_underflow = 0, scale_subnormal = 0, scale_saturated = 0;
  uint64_t scale_four = 0;  // blocks whose four-over-six choice was the 4 scale
  double sum_sq = 0, sum_sq_err = 0, sum_err = 0, sum_abs = 0;

  double relative_mse() const { return sum_sq_err / sum_sq; }
  double sqnr_db() const;
  double relative_bias() const { return sum_err / sum_abs; }
  double underflow_fraction() const { return static_cast<double>(underflow) / static_cast<double>(nonzero); }
  bool operator==(const QuantStats&) const = default;
  // Adds o's counts (every integer field; the double sums only the fixed
  // tree over segment partials forms, docs/numerics.md §5).
  void add_counts(const QuantStats& o) {
    elements += o.elements, nonzero += o.nonzero, underflow += o.underflow, saturated += o.saturated;
    subnormal += o.subnormal, blocks += o.blocks, scale_underflow += o.scale_underflow;
    scale_subnormal += o.scale_subnormal, scale_saturated += o.scale_saturated, scale_four += o.scale_four;
  }
};

// What to do, as a user states it (`exmy quantize` options, recipe roles).
// Conventions of other implementations (formats/conventions.hpp,
// docs/numerics.md "Conventions of other implementations"): they change
// output bytes only, never exmy's decisions or its statistics.
enum class CodeConvention : uint8_t {
  exmy,  // a zero-scale block's elements and -0 inputs encode as exmy decides (zero codes, -0 kept)
  te,    // Transformer Engine's bytes: a zero-scale block's non-zero elements encode +-Fe.max, -0 inputs +0
};
enum class DequantOrder : uint8_t {
  product_first,  // fp32 x-hat = fl(fl(q * s_b) * 1/G): the UE5M3 paper's Triton kernel
  scale_first,    // fp32 x-hat = fl(q * fl(s_b * 1/G)): the UE5M3 reference's portable Torch path
};

// The Hadamard transform's signs (docs/numerics.md §3): random (from the
// 16-bit mask and its documented expansion) or deterministic (every sign +1:
// the plain normalized Sylvester Hadamard matrix).
enum class RhtKind : uint8_t { random, deterministic };

// The outer (tensor-level) encode scale t of docs/numerics.md §3: one per
// call, or one per row of the tensor, each from its own row's reference amax
// ("row outer scales", docs/numerics.md §3; Transformer Engine's
// row-scaled activations). Rows are the tensor's rows as quantized, blocks
// along them (1xB).
enum class OuterScale : uint8_t { tensor, row };

struct QuantSpec {
  Format elem;
  std::optional<Format> scale;  // none: no block scale
  int block_rows = 1, block_cols = 16;
  ScaleRule rule = ScaleRule::amax_rne;
  AmaxKind amax_kind = AmaxKind::none;
  double amax_value = 0;                // for AmaxKind::given
  std::optional<double> scale_target;   // T; default Fs.max
  FourSix four_over_six = FourSix::off; // per-block choice of the scale to Fe.max or to 2^floor(log2 Fe.max)
  Round round = Round::rne;
  int sr_bits = 8;
  uint64_t seed = 0, stream = 0;
  Arith arith = Arith::exact;
  ZeroScale zero_scale = ZeroScale::zero;
  bool saturate = true;
  bool rht = false;
  uint16_t rht_signs = 0xD7E8;
  int rht_size = 16;                    // points of the transform: 16, 32, 64 or 128
  RhtKind rht_kind = RhtKind::random;
  CodeConvention codes = CodeConvention::exmy;
  DequantOrder dequant = DequantOrder::product_first;
  OuterScale outer = OuterScale::tensor;
  // outer = row with AmaxKind::given: the reference amax of every row of the
  // tensor (NaN or 0: no scale for that row), indexed by the tensor's row (a
  // band call reads its own rows' entries).
  std::vector<double> row_amax;

  // Checks the combination; throws exmy::Error naming the problem.
  void validate() const;
  // The kernel parameters (tensor amax not yet applied).
  QuantPlan plan() const;
};

// Parsers for the option values of `exmy quantize` (docs/numerics.md §7). Each throws exmy::Error.
ScaleRule parse_scale_rule(std::string_view s);
std::string_view scale_rule_name(ScaleRule r);
Arith parse_arith(std::string_view s);
ZeroScale parse_zero_scale(std::string_view s);
void parse_block(std::string_view s, int& rows, int& cols);
// `none`, `auto` or a positive float.
void parse_tensor_amax(std::string_view s, AmaxKind& kind, double& value);

// Outputs of a call; any pointer may be null.
struct QuantOutput {
  float* values = nullptr;       // [R*C] dequantized x-hat, row-major
  void* codes = nullptr;         // [R*C] element codes, elem.code_bytes() each, little-endian
  void* scale_codes = nullptr;   // [blocks] scale codes, scale.code_bytes() each, row-major block order
  QuantStats* stats = nullptr;
};

// What the call decided at tensor level.
struct QuantInfo {
  double amax = 0;   // reference amax A used (NaN: none)
  float t = 1;       // tensor encode scale t (G in fp32 arithmetic)
  int64_t block_grid_rows = 0, block_grid_cols = 0;
  // max |x| of the tensor that was quantized (after the RHT), NaN if it holds
  // a NaN, when the call measured it: the fast CPU path always does (its
  // block-amax pass sees every element), so callers that need the amax of a
  // tensor quantized against a given reference need not read it again.
  std::optional<double> abs_max;
  // outer = row: per row, the reference amax A_r used (NaN: none), the
  // encode scale t_r and max |x| (NaN if the row holds a NaN); `amax` is then
  // the largest A_r (NaN if any is NaN) and `t` the smallest t_r.
  std::vector<double> row_amax, row_abs_max;
  std::vector<float> row_t;
};

int64_t block_count(const QuantSpec& spec, int64_t rows, int64_t cols);

// The scalar reference: one block after another in row-major block order,
// one element after another; obviously right, slow.
QuantInfo quantize_ref(const QuantSpec& spec, const float* x, int64_t rows, int64_t cols, const QuantOutput& out);

// The fast CPU path: OpenMP over row bands of blocks, with `threads` threads
// (0: OpenMP's default). Same bits as quantize_ref for any thread count.
QuantInfo quantize(const QuantSpec& spec, const float* x, int64_t rows, int64_t cols, const QuantOutput& out,
                   int threads = 0);

// quantize() over a tensor that arrives in bands of rows, in row order
// (`exmy quantize` streams a file through it): each band's outputs and the
// statistics are those of the whole-tensor call, bit for bit, for any
// thread count. Every band but the last holds a multiple of band_rows()
// rows. With a current tensor amax (needs_amax()), every band first goes
// through measure(), in the same order, before quantize() takes the first.
class BandQuantizer {
 public:
  // `stats`: keep the statistics (counts, and the segment partials of the
  // sums: one per 4096 elements of a row, docs/numerics.md §5).
  BandQuantizer(const QuantSpec& spec, int64_t rows, int64_t cols, bool stats, int threads = 0);
  // A block row, or the transform's rows where it runs down the columns (Bx1).
  int64_t band_rows() const {
    return spec_.rht && spec_.block_rows != 1 ? std::max<int64_t>(spec_.block_rows, spec_.rht_size) : spec_.block_rows;
  }
  // (Row outer scales measure each row's amax with the row itself.)
  bool needs_amax() const { return spec_.amax_kind == AmaxKind::current && spec_.outer == OuterScale::tensor; }
  // Adds the next `rows` rows to the tensor amax.
  void measure(const float* x, int64_t rows);
  // Quantizes the next `rows` rows; `out` points at the band's outputs (its
  // first element and its first block); out.stats is not used.
  void quantize(const float* x, int64_t rows, const QuantOutput& out);
  // The call's statistics, after the last band (made with `stats`).
  QuantStats stats() const;

 private:
  void check_band(int64_t at, int64_t rows) const;
  QuantSpec spec_;
  int64_t rows_, cols_;
  bool stats_;
  int threads_;
  int64_t measured_rows_ = 0, next_row_ = 0;
  uint32_t amax_bits_ = 0;          // max |x| bits measured so far (NaN bits above Inf)
  std::vector<float> scratch_;      // measure()'s transformed band (RHT)
  QuantStats counts_;               // the bands' counts; sums 0
  std::vector<SumPartial> partials_;  // every band's segment partials, row-major
};

// max |x| over x[0..n), NaN if any element is NaN (the current tensor amax),
// on `threads` OpenMP threads (0: OpenMP's default); the same for any thread
// count.
double tensor_abs_max(const float* x, int64_t n, int threads = 0);

// An n-point Hadamard transform of docs/numerics.md §3 (kMaxRht and the
// per-segment work, shared with the CUDA kernel: formats/hadamard_segment.hpp).
struct Rht {
  int size = 16;  // 16, 32, 64 or 128
  RhtKind kind = RhtKind::random;
  uint16_t signs = 0xD7E8;
  void validate() const;  // throws exmy::Error for another size
  bool operator==(const Rht&) const = default;
};
// The transform's sign vector: neg[i] is true where s_i = -1 (size entries).
void rht_sign_vector(const Rht& t, bool* neg);
// The transform along rows (axis = 1: each run of t.size consecutive
// elements of a row) or columns (axis = 0), in place; the result is rounded
// once to bf16 (rne). The axis length must be a multiple of t.size.
void hadamard(float* x, int64_t rows, int64_t cols, int axis, const Rht& t, int threads = 0);
void hadamard_ref(float* x, int64_t rows, int64_t cols, int axis, const Rht& t);
// A spec's transform (rht_size, rht_kind, rht_signs) along its block axis
// (rows for a 1xB block, columns for Bx1).
Rht rht_of(const QuantSpec& spec);
int rht_axis(const QuantSpec& spec);
void apply_rht(const QuantSpec& spec, float* x, int64_t rows, int64_t cols, int threads = 0);
void apply_rht_ref(const QuantSpec& spec, float* x, int64_t rows, int64_t cols);
// The transform made ready for rht_segment / apply_rht_launches
// (formats/hadamard_segment.hpp) on a [rows, cols] tensor; throws the
// one-line exmy::Error of hadamard for a bad size or an axis length that is
// not a multiple of it.
RhtParams rht_params(const Rht& t, int64_t rows, int64_t cols, int axis);
RhtParams rht_params(const QuantSpec& spec, int64_t rows, int64_t cols);  // rht_of(spec) along rht_axis(spec)
// The 16-point random transform with the given mask.
void hadamard16(float* x, int64_t rows, int64_t cols, int axis, uint16_t signs, int threads = 0);
void hadamard16_ref(float* x, int64_t rows, int64_t cols, int axis, uint16_t signs);

// Pieces shared by the CPU paths and other backends (the CUDA path), so that
// every backend fails with the same message and sums in the same order.
namespace detail {
// Throws the error for element i of x: NaN without a NaN code, or overflow
// with saturation off and no Inf/NaN code.
[[noreturn]] void throw_element_error(const QuantPlan& p, const float* x, int64_t i, int64_t cols);
// The same, given the element's value (for tensors held elsewhere, e.g. on a device).
[[noreturn]] void throw_element_error(const QuantPlan& p, float xi, int64_t i, int64_t cols);
// Stores the four double sums of docs/numerics.md §5, combined by the
// segment tree of formats/quant_sums.hpp, into st: the Inf rule applied, a
// NaN sum as the canonical NaN.
void store_sums(const SumPartial& s, QuantStats& st);
// Row outer scales: checks that a given reference has an entry for every
// row of a call over tensor rows [row0, row0 + rows) (throws exmy::Error),
// and sizes the info's per-row vectors ...
void start_rows(const QuantSpec& spec, int64_t row0, int64_t rows, QuantInfo& info);
// ... and, once they are filled, the call's summary: `amax` the largest
// reference (NaN if any is), `t` the smallest scale, `abs_max` the largest
// max |x| (NaN if any is).
void finish_rows(QuantInfo& info);
}  // namespace detail

}  // namespace exmy

// Statistics of quantized training (what researchers run exmy for), and the
// capture hook.
//
// For every quantized operand of every layer and GEMM on a sampled step:
// docs/numerics.md §5's statistics of the quantization call plus the tensor amax,
// the reference used, the block-scale histogram and the blocks at the scale
// format's max/min (OperandStats). For every GEMM on a sampled step, the
// quantized GEMM's output ŷ against the unquantized GEMM y of the same
// high-precision operands (GemmStats). Both go to a StatsSink: the HDF5 run
// file implements it, MemoryStatsSink keeps them for tests.
//
// On a capture step, the exact operand tensors (high precision, before
// quantization, in the layout that was quantized) and the QuantSpec used go
// to a CaptureSink, so that `exmy quantize` (or exmy::quantize) on them
// recomputes every statistic bit for bit.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "formats/quantize.hpp"
#include "formats/vocab.hpp"
#include "sim/linear.hpp"
#include "sim/quant/recipe.hpp"
#include "sim/quant/stats_items.hpp"  // kRangeHistBins, the per-item decisions

namespace exmy::sim::quant {

// Block-scale histogram: bin k (0..127) counts blocks whose decoded scale s
// is finite and non-zero with floor(log2 s) = k - 64, clamped to [-64, 63]
// (so bin 0 also holds every smaller scale and bin 127 every larger one).
// Zero and NaN scales are counted apart.
inline constexpr int kScaleHistBins = 128;
inline constexpr int kScaleHistMinLog2 = -64;
// Block dynamic-range histogram: bin k (0..63, kRangeHistBins of
// sim/quant/stats_items.hpp) counts blocks whose elements are all finite and
// not all zero with floor(log2(amax / m)) = k, amax the block's max |x| and
// m its smallest non-zero |x| (bin 63 also holds every larger range).
// All-zero blocks and blocks holding a NaN or Inf are not counted. The range
// a block scale cannot help with: elements below amax · 2^-(range the
// payload covers) underflow whatever the scale.
// Scale-code histogram: blocks per scale code, for scale formats of at most
// 8 bits (zeros for wider ones).
inline constexpr int kScaleCodeBins = 256;

struct OperandStats {
  QuantStats q;              // docs/numerics.md §5
  double amax = 0;           // max|x| of the tensor quantized (after the RHT when on); NaN if it holds a NaN
  double reference = 0;      // reference amax A the call used (NaN: none)
  float tensor_scale = 1;    // t (G in fp32 arithmetic)
  uint64_t scale_zero = 0;   // blocks whose scale is 0
  uint64_t scale_nan = 0;    // blocks whose scale code is NaN
  uint64_t scale_at_max = 0; // blocks whose scale is the scale format's largest finite value
  uint64_t scale_at_min = 0; // blocks whose scale is the scale format's smallest positive value
  std::array<uint64_t, kScaleHistBins> scale_hist{};
  std::array<uint64_t, kRangeHistBins> range_hist{};   // blocks by dynamic range (add_block_ranges)
  std::array<uint64_t, kScaleCodeBins> scale_codes{};  // blocks by scale code (ScaleCodeTable::add)

  double sqnr_db() const { return q.sqnr_db(); }
  double fraction_at_max() const { return q.blocks ? static_cast<double>(scale_at_max) / q.blocks : 0.0; }
  double fraction_at_min() const { return q.blocks ? static_cast<double>(scale_at_min) / q.blocks : 0.0; }
  bool operator==(const OperandStats&) const = default;
};

// ŷ (quantized GEMM) against y (the GEMM of the unquantized operands),
// summed in double over the compared output elements in row-major order.
struct GemmStats {
  uint64_t count = 0;      // output elements compared
  uint64_t rows = 0;       // output rows compared (all, or a sample: see RuntimeOptions)
  double sum_y2 = 0, sum_yhat2 = 0, sum_y_yhat = 0, sum_err2 = 0, sum_abs_y = 0, sum_abs_yhat = 0;

  double relative_error() const;  // sqrt(Σ(ŷ-y)² / Σy²)
  double cosine() const;          // Σŷy / sqrt(Σŷ² Σy²)
  double gain() const;            // Σŷy / Σy²
  // gain − 1: the multiplicative bias, the component of ŷ along y beyond y
  // itself. Zero in expectation for unbiased (stochastic) rounding however
  // noisy; for wgrad, the recipe's gradient bias.
  double multiplicative_bias() const;
  // (mean|ŷ| − mean|y|) / mean|y|: grows with noise even when the rounding
  // is unbiased (|y + e| > |y| on average); not a bias measure.
  double magnitude_bias() const;
  bool operator==(const GemmStats&) const = default;
};

// Which call a record belongs to.
struct CallKey {
  std::string_view layer;  // LinearInfo::name
  int block = -1;          // LinearInfo::layer
  LinearKind kind = LinearKind::mlp_up;
  Gemm gemm = Gemm::fprop;
  Role role = Role::fprop_x;  // the operand (record_operand, capture); unused for record_gemm
  int64_t step = 0;           // 1-based optimizer step
  int64_t micro_batch = 0;
};

class StatsSink {
 public:
  virtual ~StatsSink() = default;
  virtual void record_operand(const CallKey& key, const OperandStats& stats) = 0;
  virtual void record_gemm(const CallKey& key, const GemmStats& stats) = 0;
};

// Keeps every record (tests, small tools).
class MemoryStatsSink final : public StatsSink {
 public:
  struct Operand {
    std::string layer;
    CallKey key;  // key.layer points into `layer`
    OperandStats stats;
  };
  struct GemmRecord {
    std::string layer;
    CallKey key;
    GemmStats stats;
  };
  void record_operand(const CallKey& key, const OperandStats& stats) override;
  void record_gemm(const CallKey& key, const GemmStats& stats) override;

  // The last record of (layer, role) or (layer, gemm); null when none.
  const Operand* find(std::string_view layer, Role role) const;
  const GemmRecord* find(std::string_view layer, Gemm gemm) const;

  // deques: records never move, so key.layer stays valid
  std::deque<Operand> operands;
  std::deque<GemmRecord> gemms;
};

class CaptureSink {
 public:
  virtual ~CaptureSink() = default;
  // x is the operand exactly as quantized with `spec` ((rows, cols),
  // row-major, K = cols); spec.rht says whether the RHT was applied first.
  virtual void capture(const CallKey& key, const QuantSpec& spec, const float* x, int64_t rows, int64_t cols) = 0;
};

class MemoryCaptureSink final : public CaptureSink {
 public:
  struct Item {
    std::string layer;
    CallKey key;
    QuantSpec spec;
    int64_t rows = 0, cols = 0;
    std::vector<float> x;
  };
  void capture(const CallKey& key, const QuantSpec& spec, const float* x, int64_t rows, int64_t cols) override;
  const Item* find(std::string_view layer, Role role) const;
  std::deque<Item> items;
};

// --- the statistics as rows of one table (HDF5 datasets, inspect, CSV) ------

// One scalar statistic: its name (the HDF5 dataset name; docs/numerics.md §5's names
// for the QuantStats part), whether it is a count (store as uint64) and its
// value. The block-scale histogram (kScaleHistBins counts) is apart.
struct OperandField {
  const char* name;
  bool integer;
  std::function<double(const OperandStats&)> get;
};
struct GemmField {
  const char* name;
  bool integer;
  double (*get)(const GemmStats&);
};
// The counts and sums of the per-call statistics table (formats/vocab.hpp:
// elements ... sum_abs), amax, reference, tensor_scale, scale_zero,
// scale_nan, scale_at_max, scale_at_min, the table's derived figures
// (sqnr_db ... underflow_fraction), fraction_at_max, fraction_at_min,
// stale_ratio, scale_saturated_fraction
const std::vector<OperandField>& operand_fields();
// count, rows, sum_y2, sum_yhat2, sum_y_yhat, sum_err2, sum_abs_y,
// sum_abs_yhat, relative_error, cosine, gain, multiplicative_bias,
// magnitude_bias
const std::vector<GemmField>& gemm_fields();

// The `exmy quantize` options that reproduce a captured call (docs/numerics.md §7):
// "--elem e2m1 --scale ue5m3 --block 1x16 ... --seed S --stream T", from the
// knob table of formats/vocab.hpp.
using exmy::quantize_options;

// --- helpers the quantized linear uses (public for tests) -------------------

// max|x| over n elements; NaN when one is NaN. Threaded, any thread count
// gives the same value.
double abs_max(const float* x, int64_t n);

// Adds the blocks of x (rows, cols; row-major) of block_rows x block_cols
// elements (edge blocks partial, as the quantizer tiles) to range_hist.
// Counts do not depend on the thread count.
void add_block_ranges(const float* x, int64_t rows, int64_t cols, int block_rows, int block_cols, OperandStats& st);
// The range bin of a block with max |x| = amax > 0 and smallest non-zero
// |x| = m (both finite), as add_block_ranges counts it.
int range_bin(float amax, float m);

// Scale-code facts of a scale format, precomputed for the histogram.
class ScaleCodeTable {
 public:
  ScaleCodeTable() = default;
  explicit ScaleCodeTable(const Format& fs);
  // Adds the blocks' scale codes (code_bytes() each, little-endian) to
  // stats: the log2 histogram, the zero/NaN/at-max/at-min counts, and (one-
  // byte codes) the per-code counts.
  void add(const void* codes, int64_t blocks, OperandStats& stats) const;
  // The same from the blocks' count per code: counts[c] blocks have code c,
  // for c < bins (a device counts them; codes of at most 16 bits, tabled()).
  void add_code_counts(const uint64_t* counts, int64_t bins, OperandStats& stats) const;
  bool tabled() const { return !info_.empty(); }
  int code_bytes() const { return fs_.code_bytes(); }

 private:
  Format fs_{};
  // Per code (formats up to 16 bits): bin (0..127), or 128 zero, 129 NaN;
  // plus 256 for at-max and 512 for at-min flags.
  std::vector<uint16_t> info_;
  uint16_t info_of(uint32_t code) const;
};

// Compares rows of ŷ (M, N) with y: `rows` lists the compared rows of ŷ
// (empty: all M), and y holds exactly those rows, compactly ((R, N),
// row-major). Sums in double in sim/quant/stats_items.hpp's order
// (GemmPartial: segments of each row, then the pairwise tree).
GemmStats compare_gemm(const float* yhat, const float* y, int64_t M, int64_t N, const std::vector<int64_t>& rows);
// The GemmStats of R compared rows of N outputs from their sums.
GemmStats gemm_stats_of(const GemmPartial& sums, int64_t R, int64_t N);

// R rows out of M, evenly spread: floor(i * M / R) for i < R (all rows when
// R <= 0 or R >= M: then the result is empty, meaning "all").
std::vector<int64_t> sample_rows(int64_t M, int64_t R);

}  // namespace exmy::sim::quant

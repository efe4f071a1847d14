#include "sim/quant/stats.hpp"

#include <omp.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <vector>

#include "formats/quantize.hpp"
#include "formats/spec.hpp"
#include "sim/parallel.hpp"

namespace exmy::sim::quant {

double GemmStats::relative_error() const { return std::sqrt(sum_err2 / sum_y2); }
double GemmStats::cosine() const { return sum_y_yhat / std::sqrt(sum_y2 * sum_yhat2); }
double GemmStats::gain() const { return sum_y_yhat / sum_y2; }
double GemmStats::multiplicative_bias() const { return gain() - 1.0; }
double GemmStats::magnitude_bias() const { return (sum_abs_yhat - sum_abs_y) / sum_abs_y; }

void MemoryStatsSink::record_operand(const CallKey& key, const OperandStats& stats) {
  operands.push_back(Operand{std::string(key.layer), key, stats});
  operands.back().key.layer = operands.back().layer;
}

void MemoryStatsSink::record_gemm(const CallKey& key, const GemmStats& stats) {
  gemms.push_back(GemmRecord{std::string(key.layer), key, stats});
  gemms.back().key.layer = gemms.back().layer;
}

const MemoryStatsSink::Operand* MemoryStatsSink::find(std::string_view layer, Role role) const {
  for (auto it = operands.rbegin(); it != operands.rend(); ++it)
    if (it->layer == layer && it->key.role == role) return &*it;
  return nullptr;
}

const MemoryStatsSink::GemmRecord* MemoryStatsSink::find(std::string_view layer, Gemm gemm) const {
  for (auto it = gemms.rbegin(); it != gemms.rend(); ++it)
    if (it->layer == layer && it->key.gemm == gemm) return &*it;
  return nullptr;
}

void MemoryCaptureSink::capture(const CallKey& key, const QuantSpec& spec, const float* x, int64_t rows,
                                int64_t cols) {
  Item it;
  it.layer = std::string(key.layer);
  it.key = key;
  it.spec = spec;
  it.rows = rows;
  it.cols = cols;
  it.x.assign(x, x + rows * cols);
  items.push_back(std::move(it));
  items.back().key.layer = items.back().layer;
}

const MemoryCaptureSink::Item* MemoryCaptureSink::find(std::string_view layer, Role role) const {
  for (auto it = items.rbegin(); it != items.rend(); ++it)
    if (it->layer == layer && it->key.role == role) return &*it;
  return nullptr;
}

const std::vector<OperandField>& operand_fields() {
  using S = OperandStats;
  // The statistics of the call itself come from the table of formats/vocab.hpp:
  // its counts and sums first, its derived figures after the operand's own.
  auto call_stats = [](bool derived) {
    std::vector<OperandField> v;
    for (const QuantStat& st : quant_stats())
      if ((st.kind == StatKind::derived) == derived)
        v.push_back({st.name, st.kind == StatKind::count, [get = st.value](const S& s) { return get(s.q); }});
    return v;
  };
  static const std::vector<OperandField> f = [&] {
    std::vector<OperandField> v = call_stats(false);
    const std::vector<OperandField> own = {
      {"amax", false, [](const S& s) { return s.amax; }},
      {"reference", false, [](const S& s) { return s.reference; }},
      {"tensor_scale", false, [](const S& s) { return static_cast<double>(s.tensor_scale); }},
      {"scale_zero", true, [](const S& s) { return static_cast<double>(s.scale_zero); }},
      {"scale_nan", true, [](const S& s) { return static_cast<double>(s.scale_nan); }},
      {"scale_at_max", true, [](const S& s) { return static_cast<double>(s.scale_at_max); }},
      {"scale_at_min", true, [](const S& s) { return static_cast<double>(s.scale_at_min); }},
    };
    v.insert(v.end(), own.begin(), own.end());
    const std::vector<OperandField> derived = call_stats(true);
    v.insert(v.end(), derived.begin(), derived.end());
    const std::vector<OperandField> after = {
      {"fraction_at_max", false, [](const S& s) { return s.fraction_at_max(); }},
      {"fraction_at_min", false, [](const S& s) { return s.fraction_at_min(); }},
      // Sample-and-hold safety (periodic and delayed references): the
      // operand's own amax over the held one (1 for `current` calls; above 1
      // the held reference is stale low), and the blocks whose scale
      // saturated: with T <= Fs.max a current reference saturates none (but
      // for t's float32 rounding at the amax's block), so under a held one
      // they are the staleness's.
      {"stale_ratio", false, [](const S& s) { return s.amax / s.reference; }},
      {"scale_saturated_fraction", false,
       [](const S& s) { return s.q.blocks ? static_cast<double>(s.q.scale_saturated) / static_cast<double>(s.q.blocks) : NAN; }},
    };
    v.insert(v.end(), after.begin(), after.end());
    return v;
  }();
  return f;
}

const std::vector<GemmField>& gemm_fields() {
  using S = GemmStats;
  static const std::vector<GemmField> f = {
      {"count", true, [](const S& s) { return static_cast<double>(s.count); }},
      {"rows", true, [](const S& s) { return static_cast<double>(s.rows); }},
      {"sum_y2", false, [](const S& s) { return s.sum_y2; }},
      {"sum_yhat2", false, [](const S& s) { return s.sum_yhat2; }},
      {"sum_y_yhat", false, [](const S& s) { return s.sum_y_yhat; }},
      {"sum_err2", false, [](const S& s) { return s.sum_err2; }},
      {"sum_abs_y", false, [](const S& s) { return s.sum_abs_y; }},
      {"sum_abs_yhat", false, [](const S& s) { return s.sum_abs_yhat; }},
      {"relative_error", false, [](const S& s) { return s.relative_error(); }},
      {"cosine", false, [](const S& s) { return s.cosine(); }},
      {"gain", false, [](const S& s) { return s.gain(); }},
      {"multiplicative_bias", false, [](const S& s) { return s.multiplicative_bias(); }},
      {"magnitude_bias", false, [](const S& s) { return s.magnitude_bias(); }},
  };
  return f;
}

double abs_max(const float* x, int64_t n) {
  // small tensors on the calling thread alone
  return tensor_abs_max(x, n, n >= parallel_min_work() ? 0 : 1);
}

int range_bin(float amax, float m) { return range_bin_hd(amax, m); }

void add_block_ranges(const float* x, int64_t rows, int64_t cols, int block_rows, int block_cols, OperandStats& st) {
  if (rows <= 0 || cols <= 0) return;
  const int64_t br = block_rows, bc = block_cols;
  const int64_t grid_r = (rows + br - 1) / br, grid_c = (cols + bc - 1) / bc;
  const int threads = rows * cols >= parallel_min_work() ? omp_get_max_threads() : 1;
  std::vector<std::array<uint64_t, kRangeHistBins>> part(static_cast<size_t>(threads));
  // Per thread, the block row's BlockRange of each column block
  // (sim/quant/stats_items.hpp), filled row after row.
  std::vector<BlockRange> range_buf(static_cast<size_t>(grid_c) * static_cast<size_t>(threads));
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t gr = 0; gr < grid_r; ++gr) {
    const size_t t = static_cast<size_t>(omp_get_thread_num());
    BlockRange* range = range_buf.data() + t * static_cast<size_t>(grid_c);
    std::fill(range, range + grid_c, BlockRange{});
    for (int64_t r = gr * br; r < std::min(rows, (gr + 1) * br); ++r) {
      const float* row = x + r * cols;
      for (int64_t b = 0; b < grid_c; ++b) {
        const int64_t c0 = b * bc, c1 = std::min(cols, c0 + bc);
        BlockRange s = range[b];  // in registers, so the loop vectorises
        for (int64_t c = c0; c < c1; ++c) s.add(row[c]);
        range[b] = s;
      }
    }
    for (int64_t b = 0; b < grid_c; ++b)
      if (const int k = range_bin_of(range[b].hi, range[b].lo); k >= 0) ++part[t][static_cast<size_t>(k)];
  }
  for (const auto& p : part)
    for (int k = 0; k < kRangeHistBins; ++k) st.range_hist[static_cast<size_t>(k)] += p[static_cast<size_t>(k)];
}

ScaleCodeTable::ScaleCodeTable(const Format& fs) : fs_(fs) {
  if (fs.bits > 16) return;
  info_.resize(size_t{1} << fs.bits);
  for (uint32_t c = 0; c < info_.size(); ++c) info_[c] = info_of(c);
}

uint16_t ScaleCodeTable::info_of(uint32_t code) const {
  const double s = fs_.decode(code);
  uint16_t v;
  if (std::isnan(s)) v = 129;
  else if (s == 0) v = 128;
  else if (std::isinf(s)) v = kScaleHistBins - 1;
  else {
    const int e = std::ilogb(std::fabs(s));
    v = static_cast<uint16_t>(std::clamp(e - kScaleHistMinLog2, 0, kScaleHistBins - 1));
  }
  const uint32_t mag = code & fs_.mag_mask();
  const bool neg = fs_.is_signed && (code & fs_.sign_bit);
  const uint32_t min_code = fs_.has_zero ? 1u : 0u;
  if (!neg && mag == fs_.max_mag) v |= 256;
  if (!neg && mag == min_code && fs_.classify(code) != CodeClass::nan) v |= 512;
  return v;
}

namespace {
// Adds `count` blocks whose code has the table entry v.
void tally(uint16_t v, uint64_t count, OperandStats& st) {
  const uint16_t bin = v & 255;
  if (bin == 128) st.scale_zero += count;
  else if (bin == 129) st.scale_nan += count;
  else st.scale_hist[bin] += count;
  st.scale_at_max += (v & 256) ? count : 0;
  st.scale_at_min += (v & 512) ? count : 0;
}
}  // namespace

void ScaleCodeTable::add(const void* codes, int64_t blocks, OperandStats& st) const {
  const auto* p = static_cast<const uint8_t*>(codes);
  const int cb = fs_.code_bytes();
  if (cb == 1 && !info_.empty()) {
    // One-byte codes: count each code first, in four tallies taking the
    // blocks in turn (so that a run of one code does not wait on its own
    // increments), then add each code's count to its bin and flags.
    uint64_t n[4][256] = {};
    int64_t b = 0;
    for (; b + 4 <= blocks; b += 4) {
      ++n[0][p[b]];
      ++n[1][p[b + 1]];
      ++n[2][p[b + 2]];
      ++n[3][p[b + 3]];
    }
    for (; b < blocks; ++b) ++n[0][p[b]];
    uint64_t count[256];
    for (size_t c = 0; c < 256; ++c) count[c] = n[0][c] + n[1][c] + n[2][c] + n[3][c];
    add_code_counts(count, 256, st);
    return;
  }
  for (int64_t b = 0; b < blocks; ++b) {
    uint32_t code = 0;
    for (int k = 0; k < cb; ++k) code |= static_cast<uint32_t>(p[b * cb + k]) << (8 * k);
    tally(info_.empty() ? info_of(code) : info_[code], 1, st);
  }
}

void ScaleCodeTable::add_code_counts(const uint64_t* counts, int64_t bins, OperandStats& st) const {
  // the per-code counts only for one-byte codes (kScaleCodeBins)
  const bool per_code = fs_.code_bytes() == 1;
  for (size_t c = 0; c < std::min(static_cast<size_t>(bins), info_.size()); ++c) {
    if (per_code) st.scale_codes[c] += counts[c];
    if (counts[c]) tally(info_[c], counts[c], st);
  }
}

std::vector<int64_t> sample_rows(int64_t M, int64_t R) {
  std::vector<int64_t> rows;
  if (R <= 0 || R >= M) return rows;
  rows.resize(static_cast<size_t>(R));
  for (int64_t i = 0; i < R; ++i) rows[static_cast<size_t>(i)] = sampled_row(i, M, R);
  return rows;
}

GemmStats gemm_stats_of(const GemmPartial& s, int64_t R, int64_t N) {
  GemmStats g;
  g.count = static_cast<uint64_t>(R * N);
  g.rows = static_cast<uint64_t>(R);
  g.sum_y2 = s.y2;
  g.sum_yhat2 = s.yhat2;
  g.sum_y_yhat = s.y_yhat;
  g.sum_err2 = s.err2;
  g.sum_abs_y = s.abs_y;
  g.sum_abs_yhat = s.abs_yhat;
  return g;
}

GemmStats compare_gemm(const float* yhat, const float* y, int64_t M, int64_t N, const std::vector<int64_t>& rows_idx) {
  const int64_t R = rows_idx.empty() ? M : static_cast<int64_t>(rows_idx.size());
  // The segments' partials in parallel, then the tree (stats_items.hpp's
  // order): the same sums for any thread count and on a device.
  const int64_t nseg = N > 0 ? R * gemm_segments_per_row(N) : 0;
  std::vector<GemmPartial> part(static_cast<size_t>(nseg));
  const GemmRows rows{yhat, y, rows_idx.empty() ? nullptr : rows_idx.data(), N};
#pragma omp parallel for schedule(static) if (R * N >= parallel_min_work())
  for (int64_t k = 0; k < nseg; ++k) part[static_cast<size_t>(k)] = gemm_segment_partial(rows, N, k);
  return gemm_stats_of(tree_sum_of(part.data(), nseg), R, N);
}

}  // namespace exmy::sim::quant

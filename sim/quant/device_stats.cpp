#include "sim/quant/device_stats.hpp"

#include <algorithm>
#include <cstring>
#include <limits>
#include <string>

#include "formats/cuda/quantize_cuda.hpp"  // QuantRecord
#include "formats/error.hpp"
#include "sim/quant/quant_ops.hpp"  // ensure

namespace exmy::sim::quant {

// --- the ledger ---------------------------------------------------------------

void* StatsLedger::reserve(size_t bytes, std::function<void(const void*)> done) {
  const size_t need = (std::max<size_t>(bytes, 1) + 15) / 16 * 16;
  if (chunks_.empty() || chunks_.back()->used + need > static_cast<size_t>(chunks_.back()->buf.size())) {
    auto c = std::make_unique<Chunk>();
    c->buf.place(mem_);
    c->buf.resize_zero(static_cast<int64_t>(std::max(need, chunk_bytes_)));
    chunks_.push_back(std::move(c));
  }
  Chunk& c = *chunks_.back();
  const size_t at = c.used;
  c.used += need;
  items_.push_back(Item{chunks_.size() - 1, at, std::move(done)});
  return c.buf.data() + at;
}

size_t StatsLedger::bytes() const {
  size_t n = 0;
  for (const auto& c : chunks_) n += c->used;
  return n;
}

void StatsLedger::collect() {
  if (items_.empty()) return;
  std::vector<Item> items = std::move(items_);
  items_.clear();
  const size_t total = bytes();
  for (auto& c : chunks_) {
    c->host.resize(c->used);
    mem_.to_host(c->host.data(), c->buf.data(), c->used);
  }
  // One chunk from now on, sized for what this round took.
  std::vector<std::vector<uint8_t>> hosts;
  for (auto& c : chunks_) hosts.push_back(std::move(c->host));
  if (chunks_.size() > 1) {
    chunk_bytes_ = std::max(chunk_bytes_, total + total / 4);
    chunks_.clear();
  } else {
    chunks_.front()->used = 0;
  }
  for (const Item& it : items) it.done(hosts[it.chunk].data() + it.offset);
}

// --- the statistics ------------------------------------------------------------

namespace {

// max|x| from the max of |x|'s bits: NaN's bits lie above Inf's
// (tensor_abs_max's convention).
double amax_of_bits(uint64_t m) {
  return m > 0x7f800000u ? std::numeric_limits<double>::quiet_NaN()
                         : static_cast<double>(float_of(static_cast<uint32_t>(m)));
}

}  // namespace

double DeviceStats::abs_max(const float* x, int64_t n) {
  double m = 0;
  abs_max_later(x, n, &m);
  collect();
  return m;
}

void DeviceStats::abs_max_later(const float* x, int64_t n, double* dst) {
  if (n <= 0) {
    *dst = 0;
    return;
  }
  // Two passes of max_abs_bits: n elements into p1 partials, those into p2
  // (at most 256), which the host takes the max of.
  const int64_t p1 = stats_parts(n, 1), p2 = stats_parts(p1, 1);
  uint32_t* part = ensure(part_, p1, mem_);
  k_.max_abs_bits(part, reinterpret_cast<const uint32_t*>(x), n, p1);
  auto* out = static_cast<uint32_t*>(ledger_.reserve(sizeof(uint32_t) * static_cast<size_t>(p2), [=](const void* p) {
    const auto* bits = static_cast<const uint32_t*>(p);
    *dst = amax_of_bits(*std::max_element(bits, bits + p2));
  }));
  k_.max_abs_bits(out, part, p1, p2);
}

template <class Count, class Finish>
void DeviceStats::counts(int64_t items, int64_t bins, Count count, Finish finish) {
  const int64_t parts = stats_parts(items, bins);
  // a partial counts in 32 bits
  if ((items + parts - 1) / parts > int64_t{0xffffffff})
    throw Error("statistics: " + std::to_string(items) + " blocks are too many for the device's partial counts");
  uint32_t* part = ensure(part_, parts * bins, mem_);
  count(part, parts);
  finish(part, parts);
}

void DeviceStats::add_block_ranges(const float* x, int64_t rows, int64_t cols, int block_rows, int block_cols,
                                   OperandStats& st) {
  operand_later(x, rows, cols, block_rows, block_cols, nullptr, nullptr, nullptr, st);
}

void DeviceStats::add_scale_codes(const ScaleCodeTable& table, const void* codes, int64_t blocks,
                                  OperandStats& st) {
  if (blocks <= 0) return;
  const int cb = table.code_bytes();
  if (!table.tabled() || cb > 2) {
    // Codes of more than 16 bits have no per-code table: counted on the host.
    table.add(host_view(mem_, static_cast<const uint8_t*>(codes), blocks * cb, host_codes_), blocks, st);
    return;
  }
  const int64_t bins = int64_t{1} << (8 * cb);
  auto* sums = static_cast<uint64_t*>(
      ledger_.reserve(sizeof(uint64_t) * static_cast<size_t>(bins), [&table, &st, bins](const void* p) {
        table.add_code_counts(static_cast<const uint64_t*>(p), bins, st);
      }));
  counts(
      blocks, bins,
      [&](uint32_t* part, int64_t parts) {
        k_.count_codes(part, static_cast<const uint8_t*>(codes), cb, blocks, parts);
      },
      [&](const uint32_t* part, int64_t parts) { k_.sum_parts(sums, part, parts, bins); });
}

void DeviceStats::operand_later(const float* x, int64_t rows, int64_t cols, int block_rows, int block_cols,
                                const ScaleCodeTable* table, const void* codes, double* amax_dst, OperandStats& st) {
  const int64_t br = block_rows, bc = block_cols;
  const int64_t blocks = rows > 0 && cols > 0 ? (rows + br - 1) / br * ((cols + bc - 1) / bc) : 0;
  if (blocks == 0) {
    if (amax_dst) *amax_dst = 0;
    return;
  }
  const auto* cp = table ? static_cast<const uint8_t*>(codes) : nullptr;
  const int cb = table ? table->code_bytes() : 1;
  const int64_t bins = block_stats_bins(cp, cb), code_bins = bins - kRangeHistBins - 1;
  auto* sums = static_cast<uint64_t*>(
      ledger_.reserve(sizeof(uint64_t) * static_cast<size_t>(bins), [=, &st](const void* p) {
        const auto* c = static_cast<const uint64_t*>(p);
        for (int k = 0; k < kRangeHistBins; ++k) st.range_hist[static_cast<size_t>(k)] += c[k];
        if (table) table->add_code_counts(c + kRangeHistBins, code_bins, st);
        if (amax_dst) *amax_dst = amax_of_bits(c[bins - 1]);
      }));
  counts(
      blocks, bins,
      [&](uint32_t* part, int64_t parts) { k_.count_blocks(part, x, rows, cols, br, bc, cp, cb, parts); },
      [&](const uint32_t* part, int64_t parts) { k_.finish_blocks(sums, part, parts, bins); });
}

void DeviceStats::compare_gemm_later(const float* got, const float* ref, int64_t R, int64_t N, GemmStats* dst) {
  const int64_t nseg = N > 0 ? R * gemm_segments_per_row(N) : 0;
  GemmPartial* a = ensure(gemm_a_, std::max<int64_t>(1, nseg), mem_);
  GemmPartial* b = ensure(gemm_b_, tree_scratch_items(nseg), mem_);
  TreeTail<GemmPartial>* tail = ensure(gemm_tail_, 1, mem_);
  auto* out = static_cast<GemmPartial*>(ledger_.reserve(sizeof(GemmPartial), [=](const void* p) {
    GemmPartial s;
    std::memcpy(&s, p, sizeof s);
    *dst = gemm_stats_of(s, R, N);
  }));
  k_.gemm_sums(out, got, ref, R, N, a, b, tail);
}

QuantRecord* DeviceStats::record_later(std::function<void(const QuantRecord&)> done) {
  return static_cast<QuantRecord*>(ledger_.reserve(sizeof(QuantRecord), [d = std::move(done)](const void* p) {
    QuantRecord r;
    std::memcpy(static_cast<void*>(&r), p, sizeof r);
    d(r);
  }));
}

}  // namespace exmy::sim::quant

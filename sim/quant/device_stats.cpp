#include "sim/quant/device_stats.hpp"

#include <algorithm>
#include <limits>
#include <string>

#include "formats/error.hpp"
#include "sim/quant/quant_ops.hpp"  // ensure

namespace exmy::sim::quant {

double DeviceStats::abs_max(const float* x, int64_t n) {
  if (n <= 0) return 0;
  // Two passes of max_abs_bits: n elements into p1 partials, those into p2
  // (at most 256), which the host takes the max of.
  const int64_t p1 = stats_parts(n, 1), p2 = stats_parts(p1, 1);
  uint32_t* part = ensure(part_, p1 + p2, mem_);
  k_.max_abs_bits(part, reinterpret_cast<const uint32_t*>(x), n, p1);
  k_.max_abs_bits(part + p1, part, p1, p2);
  host_bits_.resize(static_cast<size_t>(p2));
  mem_.to_host(host_bits_.data(), part + p1, sizeof(uint32_t) * static_cast<size_t>(p2));
  const uint32_t m = *std::max_element(host_bits_.begin(), host_bits_.end());
  // NaN's bits lie above Inf's (tensor_abs_max's convention)
  return m > 0x7f800000u ? std::numeric_limits<double>::quiet_NaN() : static_cast<double>(float_of(m));
}

template <class Count>
const std::vector<uint64_t>& DeviceStats::counts(int64_t items, int64_t bins, Count count) {
  const int64_t parts = stats_parts(items, bins);
  // a partial counts in 32 bits
  if ((items + parts - 1) / parts > int64_t{0xffffffff})
    throw Error("statistics: " + std::to_string(items) + " blocks are too many for the device's partial counts");
  uint32_t* part = ensure(part_, parts * bins, mem_);
  count(part, parts);
  uint64_t* sums = ensure(sums_, bins, mem_);
  k_.sum_parts(sums, part, parts, bins);
  host_counts_.resize(static_cast<size_t>(bins));
  mem_.to_host(host_counts_.data(), sums, sizeof(uint64_t) * static_cast<size_t>(bins));
  return host_counts_;
}

void DeviceStats::add_block_ranges(const float* x, int64_t rows, int64_t cols, int block_rows, int block_cols,
                                   OperandStats& st) {
  if (rows <= 0 || cols <= 0) return;
  const int64_t br = block_rows, bc = block_cols;
  const int64_t blocks = (rows + br - 1) / br * ((cols + bc - 1) / bc);
  const auto& c = counts(blocks, kRangeHistBins, [&](uint32_t* part, int64_t parts) {
    k_.count_ranges(part, x, rows, cols, br, bc, parts);
  });
  for (int k = 0; k < kRangeHistBins; ++k) st.range_hist[static_cast<size_t>(k)] += c[static_cast<size_t>(k)];
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
  const auto& c = counts(blocks, bins, [&](uint32_t* part, int64_t parts) {
    k_.count_codes(part, static_cast<const uint8_t*>(codes), cb, blocks, parts);
  });
  table.add_code_counts(c.data(), bins, st);
}

}  // namespace exmy::sim::quant

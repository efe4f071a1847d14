// The statistics of a quantized linear on a device (QuantOps' statistics
// operations, sim/quant/quant_ops.hpp): the reductions run there through
// one launcher's kernels (sim/quant/quant_launches.hpp, *_emulated or
// *_cuda) and only their results cross to the host: a few hundred bytes for
// the amax, 64 counts for the block ranges, 256 (or 65536 for two-byte
// codes) counts for the scale codes. Each result equals the CPU function's
// (abs_max, add_block_ranges, ScaleCodeTable::add) bit for bit: the
// reductions are integer max and integer counts.
#pragma once

#include <cstdint>
#include <vector>

#include "sim/memory.hpp"
#include "sim/quant/quant_launches.hpp"
#include "sim/quant/stats.hpp"

namespace exmy::sim::quant {

class DeviceStats {
 public:
  DeviceStats(Memory& memory, const StatsKernels& kernels) : mem_(memory), k_(kernels) {}
  double abs_max(const float* x, int64_t n);
  void add_block_ranges(const float* x, int64_t rows, int64_t cols, int block_rows, int block_cols,
                        OperandStats& st);
  void add_scale_codes(const ScaleCodeTable& table, const void* codes, int64_t blocks, OperandStats& st);
  void gather_rows(float* dst, const float* src, int64_t ld, int64_t M, int64_t R) {
    k_.gather_rows(dst, src, ld, M, R);
  }
  void gather_columns(float* dst, const float* src, int64_t rows, int64_t cols, int64_t R) {
    k_.gather_columns(dst, src, rows, cols, R);
  }

 private:
  // counts (bins) on the host of `items` items counted into `parts` partials by `count`
  template <class Count>
  const std::vector<uint64_t>& counts(int64_t items, int64_t bins, Count count);

  Memory& mem_;
  StatsKernels k_;
  MemBuf<uint32_t> part_;    // the first pass's partials (then the second's, for the amax)
  MemBuf<uint64_t> sums_;    // the combined counts
  std::vector<uint32_t> host_bits_;
  std::vector<uint64_t> host_counts_;
  std::vector<uint8_t> host_codes_;  // codes wider than 16 bits, counted on the host
};

}  // namespace exmy::sim::quant

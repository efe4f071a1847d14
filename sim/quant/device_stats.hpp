// The statistics of a quantized linear on a device (QuantOps' statistics
// operations, sim/quant/quant_ops.hpp): the reductions run there through
// one launcher's kernels (sim/quant/quant_launches.hpp, *_emulated or
// *_cuda) and only their results cross to the host: a few hundred bytes for
// the amax, 64 counts for the block ranges, 256 (or 65536 for two-byte
// codes) counts for the scale codes, a quantizer's record, the GEMM
// comparison's six sums. The amax, ranges and codes equal the CPU
// function's (abs_max, add_block_ranges, ScaleCodeTable::add) bit for bit:
// the reductions are integer max and integer counts; the sums are made in
// the CPU's order (formats/quant_sums.hpp's tree, sim/quant/stats_items.hpp).
//
// A training step's statistics do not wait for the device: each call
// leaves its results in a StatsLedger (device memory) and names where they
// go on the host; collect() brings the whole ledger over in one copy (one
// wait) and fills them in call order.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "formats/quant_sums.hpp"  // TreeTail
#include "sim/memory.hpp"
#include "sim/quant/quant_launches.hpp"
#include "sim/quant/stats.hpp"

namespace exmy {
struct QuantRecord;
}

namespace exmy::sim::quant {

// Results left in a memory until the host reads them all at once.
class StatsLedger {
 public:
  explicit StatsLedger(Memory& m) : mem_(m) {}
  // Room for `bytes` (16-byte aligned) in the memory, which the caller's
  // launches fill; at collect(), done(p) reads them, p their copy on the
  // host. Earlier rooms stay where they are (a full chunk starts another).
  void* reserve(size_t bytes, std::function<void(const void*)> done);
  // Every room to the host (one copy per chunk: one after a first collect
  // has sized the chunk), then each done() in reserve order. Nothing is
  // left pending when a done() throws.
  void collect();
  bool empty() const { return items_.empty(); }
  // Bytes reserved since the last collect.
  size_t bytes() const;
  // How many chunks the rooms reserved since the last collect take.
  size_t chunks() const { return chunks_.size(); }

 private:
  struct Chunk {
    MemBuf<uint8_t> buf;
    size_t used = 0;
    std::vector<uint8_t> host;
  };
  struct Item {
    size_t chunk, offset;
    std::function<void(const void*)> done;
  };
  Memory& mem_;
  std::vector<std::unique_ptr<Chunk>> chunks_;
  std::vector<Item> items_;
  size_t chunk_bytes_ = size_t{1} << 16;
};

class DeviceStats {
 public:
  DeviceStats(Memory& memory, const StatsKernels& kernels) : mem_(memory), k_(kernels), ledger_(memory) {}
  // At once (waits for the device).
  double abs_max(const float* x, int64_t n);
  // The rest fill their results at collect() (the host pointers and
  // references they take must stay valid until then).
  void abs_max_later(const float* x, int64_t n, double* dst);
  // (operand_later without codes or amax)
  void add_block_ranges(const float* x, int64_t rows, int64_t cols, int block_rows, int block_cols,
                        OperandStats& st);
  // (Codes wider than 16 bits are counted on the host at once, from a copy.)
  void add_scale_codes(const ScaleCodeTable& table, const void* codes, int64_t blocks, OperandStats& st);
  // An operand's block statistics in one pass and one room: the block
  // ranges, with a table the scale codes' counts (codes of at most 16
  // bits, table.tabled()), and with amax_dst its max|x| (QuantOps::
  // operand_stats; count_blocks_launches).
  void operand_later(const float* x, int64_t rows, int64_t cols, int block_rows, int block_cols,
                     const ScaleCodeTable* table, const void* codes, double* amax_dst, OperandStats& st);
  // got and ref: the (R, N) compared rows of the quantized and the
  // reference GEMM, in the memory; *dst = compare_gemm's GemmStats of them.
  void compare_gemm_later(const float* got, const float* ref, int64_t R, int64_t N, GemmStats* dst);
  // A room for a quantizer's record (CudaQuantizer::run's), read by done.
  QuantRecord* record_later(std::function<void(const QuantRecord&)> done);
  void collect() { ledger_.collect(); }
  StatsLedger& ledger() { return ledger_; }

  void gather_rows(float* dst, const float* src, int64_t ld, int64_t M, int64_t R) {
    k_.gather_rows(dst, src, ld, M, R);
  }
  void gather_columns(float* dst, const float* src, int64_t rows, int64_t cols, int64_t R) {
    k_.gather_columns(dst, src, rows, cols, R);
  }

 private:
  // `items` items counted into partials of `bins` entries by count(part,
  // parts), which finish(part, parts) combines.
  template <class Count, class Finish>
  void counts(int64_t items, int64_t bins, Count count, Finish finish);

  Memory& mem_;
  StatsKernels k_;
  StatsLedger ledger_;
  MemBuf<uint32_t> part_;    // the first pass's partials (then the second's, for the amax)
  MemBuf<GemmPartial> gemm_a_, gemm_b_;  // the GEMM comparison's segment partials and tree level
  MemBuf<TreeTail<GemmPartial>> gemm_tail_;
  std::vector<uint8_t> host_codes_;  // codes wider than 16 bits, counted on the host
};

}  // namespace exmy::sim::quant

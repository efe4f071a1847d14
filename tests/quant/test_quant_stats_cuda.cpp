// The statistics of a quantized linear on a device (sim/quant/device_stats.hpp
// over the kernels of sim/quant/quant_launches.hpp) against the CPU's
// functions (sim/quant/stats.hpp), bit for bit: the tensor amax (NaN
// anywhere, ±Inf, ties of +m and -m, subnormals, sizes around the partial
// counts and past their caps), the block dynamic ranges (1D and 2D blocks,
// partial edge blocks, all-zero blocks, blocks with NaN or Inf, ranges past
// the last bin), the scale-code histogram (one- and two-byte codes, codes
// wider than 16 bits, runs of one code, block counts not a multiple of four
// and past the partials' cap) and the GEMM statistics' row gathers.
//
// Also: the GEMM statistics' sums made where the rows are (compare_gemm's
// order: segments, then the tree's levels) and the ledger that holds every
// result until one collect() brings them over (results in call order across
// chunks, one chunk after the first collect, abs_max_later's NaN).
//
// Built twice (tests/quant/CMakeLists.txt):
// - test_quant_stats_cuda_emulated (label "unit"): the emulated device's
//   memory and the launches with their threads run on the host;
// - test_quant_stats_cuda (label "gpu", only with CUDA): a CUDA device's
//   memory and kernels; every test reports SKIPPED without a device.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "formats/spec.hpp"
#include "models/backend.hpp"
#include "sim/quant/device_stats.hpp"
#include "sim/quant/quant_ops.hpp"
#include "sim/quant/stats.hpp"
#include "tests/models/kernel_test.hpp"  // KERNEL, EXMY_REQUIRE_CUDA, randn

#if !defined(EXMY_TEST_EMULATED)
#include "models/cuda/backend_cuda.hpp"
#endif

namespace exmy::sim::quant {
namespace {

using Vec = std::vector<float>;

// The device under test: its backend's memory and the launcher's kernels.
struct Device {
  std::unique_ptr<models::Backend<float>> be;
  Device() {
#if defined(EXMY_TEST_EMULATED)
    be = models::make_emulated_device_backend();
#else
    be = models::make_cuda_backend(0);
#endif
  }
  Memory& mem() { return be->memory(); }
  DeviceStats stats() { return DeviceStats(mem(), KERNEL(stats_kernels)()); }
  // a copy of v in the device's memory
  template <class T>
  MemBuf<T> upload(const std::vector<T>& v) {
    MemBuf<T> b(mem(), std::max<int64_t>(1, static_cast<int64_t>(v.size())));
    if (!v.empty()) mem().from_host(b.data(), v.data(), v.size() * sizeof(T));
    return b;
  }
  template <class T>
  std::vector<T> download(const MemBuf<T>& b, size_t n) {
    std::vector<T> v(n);
    if (n) mem().to_host(v.data(), b.data(), n * sizeof(T));
    return v;
  }
};

uint64_t bits(double d) {
  uint64_t u;
  std::memcpy(&u, &d, 8);
  return u;
}

const float kNaN = std::numeric_limits<float>::quiet_NaN(), kInf = std::numeric_limits<float>::infinity();

// ---------------------------------------------------------------------------
// amax
// ---------------------------------------------------------------------------

void expect_abs_max(Device& dev, const Vec& x, const std::string& what) {
  const double want = abs_max(x.data(), static_cast<int64_t>(x.size()));
  MemBuf<float> d = dev.upload(x);
  DeviceStats s = dev.stats();
  const double got = s.abs_max(d.data(), static_cast<int64_t>(x.size()));
  EXPECT_EQ(bits(got), bits(want)) << what << ": device " << got << ", CPU " << want;
}

TEST(DeviceStats, AbsMaxEqualsTheCpus) {
  EXMY_REQUIRE_CUDA();
  Device dev;
  // sizes around the first pass's 256 elements a partial, its 2^16 partials
  // (n > 2^24) and the second pass's 256 elements a partial
  for (const int64_t n : {int64_t{0}, int64_t{1}, int64_t{255}, int64_t{256}, int64_t{257}, int64_t{65537},
                          int64_t{1} << 16 << 8, (int64_t{1} << 16 << 8) + 1000}) {
    Vec x = models::randn(static_cast<size_t>(n), 11 + static_cast<uint64_t>(n));
    expect_abs_max(dev, x, "normal n=" + std::to_string(n));
    if (n < 2) continue;
    // the largest magnitude as -m and +m (a tie), then at the last element alone
    x[static_cast<size_t>(n / 3)] = -1000.0f;
    x[static_cast<size_t>(n / 2)] = 1000.0f;
    expect_abs_max(dev, x, "tie n=" + std::to_string(n));
    EXPECT_EQ(abs_max(x.data(), n), 1000.0);  // the inputs reach what they test
    x.back() = -kInf;
    expect_abs_max(dev, x, "-Inf last n=" + std::to_string(n));
    // NaN anywhere (with and without its sign bit): NaN, whatever else
    for (const int64_t at : {int64_t{0}, n / 2, n - 1}) {
      Vec y = x;
      y[static_cast<size_t>(at)] = at % 2 ? -kNaN : kNaN;
      expect_abs_max(dev, y, "NaN at " + std::to_string(at) + " n=" + std::to_string(n));
      EXPECT_TRUE(std::isnan(abs_max(y.data(), n)));
    }
  }
  // subnormals and zeros only: the largest subnormal, not a zero
  Vec tiny(1000, -0.0f);
  tiny[7] = std::numeric_limits<float>::denorm_min();
  tiny[900] = -std::numeric_limits<float>::denorm_min() * 3;
  expect_abs_max(dev, tiny, "subnormals");
  EXPECT_GT(abs_max(tiny.data(), 1000), 0.0);
}

// ---------------------------------------------------------------------------
// block dynamic ranges
// ---------------------------------------------------------------------------

// Normal data whose rows' scales spread over 2^-60 .. 2^60, with zeros,
// subnormals, all-zero blocks and non-finite elements sprinkled in.
Vec awkward(int64_t rows, int64_t cols, uint64_t seed) {
  Vec x = models::randn(static_cast<size_t>(rows * cols), seed);
  std::mt19937_64 g(seed);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      float& v = x[static_cast<size_t>(r * cols + c)];
      v = std::ldexp(v, static_cast<int>(g() % 121) - 60);
      const uint64_t u = g() % 1000;
      if (u < 60) v = 0.0f;
      else if (u < 63) v = std::numeric_limits<float>::denorm_min() * static_cast<float>(1 + g() % 50);
      else if (u == 63) v = kNaN;
      else if (u == 64) v = -kInf;
    }
  // the first rows all zero (all-zero blocks whatever the block shape)
  for (int64_t i = 0; i < std::min<int64_t>(rows, 2) * cols; ++i) x[static_cast<size_t>(i)] = i % 2 ? -0.0f : 0.0f;
  return x;
}

TEST(DeviceStats, BlockRangesEqualTheCpus) {
  EXMY_REQUIRE_CUDA();
  Device dev;
  struct Shape {
    int64_t rows, cols;
    int br, bc;
  };
  // 1D and 2D blocks, edge blocks cut in either direction, one block, blocks
  // larger than the tensor, and enough blocks for several partials
  for (const Shape& s : {Shape{37, 100, 1, 16}, Shape{64, 64, 1, 32}, Shape{40, 50, 16, 16}, Shape{33, 17, 16, 16},
                         Shape{5, 7, 3, 5}, Shape{3, 3, 16, 16}, Shape{1, 1, 1, 16}, Shape{700, 300, 1, 16},
                         Shape{96, 130, 32, 1}, Shape{129, 257, 8, 8}}) {
    const std::string what = std::to_string(s.rows) + "x" + std::to_string(s.cols) + " blocks " +
                             std::to_string(s.br) + "x" + std::to_string(s.bc);
    const Vec x = awkward(s.rows, s.cols, static_cast<uint64_t>(s.rows * 1000 + s.cols));
    OperandStats want, got;
    add_block_ranges(x.data(), s.rows, s.cols, s.br, s.bc, want);
    MemBuf<float> d = dev.upload(x);
    DeviceStats st = dev.stats();
    st.add_block_ranges(d.data(), s.rows, s.cols, s.br, s.bc, got);
    st.collect();  // (the counts arrive at collect)
    EXPECT_EQ(got.range_hist, want.range_hist) << what;
    uint64_t counted = 0;
    for (const uint64_t c : want.range_hist) counted += c;
    if (s.rows * s.cols > 100) {
      EXPECT_GT(counted, 0u) << what;  // not only uncounted blocks
    }
  }
  // a block of 1 and 2^-149 (range 2^149: the last bin), a block of equal
  // magnitudes (bin 0) and one with a NaN (not counted)
  Vec x = {1.0f, std::numeric_limits<float>::denorm_min(), 3.0f, -3.0f, 2.0f, kNaN};
  OperandStats want, got;
  add_block_ranges(x.data(), 1, 6, 1, 2, want);
  EXPECT_EQ(want.range_hist[kRangeHistBins - 1], 1u);
  EXPECT_EQ(want.range_hist[0], 1u);
  MemBuf<float> d = dev.upload(x);
  DeviceStats st = dev.stats();
  st.add_block_ranges(d.data(), 1, 6, 1, 2, got);
  st.collect();
  EXPECT_EQ(got.range_hist, want.range_hist);
}

// ---------------------------------------------------------------------------
// scale codes
// ---------------------------------------------------------------------------

TEST(DeviceStats, ScaleCodesEqualTheCpus) {
  EXMY_REQUIRE_CUDA();
  Device dev;
  // one-byte codes (8 and fewer bits), two-byte codes, and four-byte codes
  // (no per-code table: counted on the host)
  for (const char* spec : {"ue8m0", "e4m3", "ue5m3", "e2m1", "e5m10", "e8m23"}) {
    const Format fs = parse_format(spec);
    const ScaleCodeTable table(fs);
    const int cb = fs.code_bytes();
    const uint32_t codes = fs.bits >= 32 ? 0xffffffffu : (1u << fs.bits) - 1;
    // block counts not a multiple of four, one block, and past the
    // partials' cap of 256-bin counts (4096 partials of 256 blocks)
    for (const int64_t blocks : {int64_t{1}, int64_t{7}, int64_t{1001}, int64_t{4096 * 256 + 3}}) {
      std::mt19937_64 g(static_cast<uint64_t>(blocks) * 31 + fs.bits);
      std::vector<uint8_t> p(static_cast<size_t>(blocks * cb));
      for (int64_t b = 0; b < blocks; ++b) {
        // every code somewhere, a run of the largest code, zeros
        uint32_t c = static_cast<uint32_t>(g()) & codes;
        if (b % 97 < 10) c = codes;
        if (b % 13 == 0) c = 0;
        for (int k = 0; k < cb; ++k) p[static_cast<size_t>(b * cb + k)] = static_cast<uint8_t>(c >> (8 * k));
      }
      OperandStats want, got;
      table.add(p.data(), blocks, want);
      MemBuf<uint8_t> d = dev.upload(p);
      DeviceStats st = dev.stats();
      st.add_scale_codes(table, d.data(), blocks, got);
      st.collect();
      EXPECT_EQ(got, want) << spec << ", " << blocks << " blocks";
      // the special codes occur
      EXPECT_GT(want.scale_zero + want.scale_nan + want.scale_at_max + want.scale_at_min, 0u) << spec;
    }
  }
}

// ---------------------------------------------------------------------------
// the GEMM statistics' gathers
// ---------------------------------------------------------------------------

TEST(DeviceStats, GathersMoveTheCpusFloats) {
  EXMY_REQUIRE_CUDA();
  Device dev;
  QuantOps& cpu = cpu_quant_ops();
  for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{1, 1}, {7, 5}, {100, 37}, {300, 130}}) {
    Vec x = models::randn(static_cast<size_t>(rows * cols), static_cast<uint64_t>(rows + cols));
    x[0] = -kNaN;  // moved, not computed: the sign and payload stay
    x.back() = -0.0f;
    MemBuf<float> d = dev.upload(x);
    DeviceStats st = dev.stats();
    // R of the rows, then R of the columns (rows of x^T): one, a third, all
    for (const bool columns : {false, true}) {
      const int64_t M = columns ? cols : rows, len = columns ? rows : cols;
      for (const int64_t R : {int64_t{1}, std::max<int64_t>(1, M / 3), M}) {
        Vec want(static_cast<size_t>(R * len));
        MemBuf<float> out(dev.mem(), R * len);
        if (columns) {
          cpu.gather_columns(want.data(), x.data(), rows, cols, R);
          st.gather_columns(out.data(), d.data(), rows, cols, R);
        } else {
          cpu.gather_rows(want.data(), x.data(), cols, rows, R);
          st.gather_rows(out.data(), d.data(), cols, rows, R);
        }
        models::expect_bits(dev.download(out, want.size()), want,
                            std::to_string(rows) + "x" + std::to_string(cols) + " R=" + std::to_string(R) +
                                (columns ? " columns" : " rows"));
      }
    }
  }
  // the CPU's gathers take the rows sample_rows names
  const Vec x = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
  Vec g(3);
  cpu.gather_rows(g.data(), x.data(), 1, 10, 3);
  const std::vector<int64_t> r = sample_rows(10, 3);
  EXPECT_EQ(g, (Vec{x[static_cast<size_t>(r[0])], x[static_cast<size_t>(r[1])], x[static_cast<size_t>(r[2])]}));
  EXPECT_EQ(r, (std::vector<int64_t>{0, 3, 6}));
}

// An operand's block statistics in one pass (operand_later: ranges, scale
// codes and amax from one launch and its finish) equal the CPU's three
// functions, with one- and two-byte codes, 1D and 2D blocks, partial edge
// blocks, and a NaN (the amax NaN, its block not counted).
TEST(DeviceStats, OperandStatsInOnePassEqualTheCpus) {
  EXMY_REQUIRE_CUDA();
  Device dev;
  struct Case {
    int64_t rows, cols;
    int br, bc;
    const char* scale;
    bool nan;
  };
  for (const Case c : {Case{37, 100, 1, 16, "ue4m3", false}, Case{40, 50, 16, 16, "ue5m3", true},
                       Case{700, 300, 1, 16, "ue8m0", false}, Case{96, 130, 32, 1, "e5m10", false},
                       Case{5, 7, 3, 5, "ue4m3", true}}) {
    const std::string what = std::to_string(c.rows) + "x" + std::to_string(c.cols) + " " + std::to_string(c.br) + "x" +
                             std::to_string(c.bc) + " " + c.scale + (c.nan ? " NaN" : "");
    Vec x = awkward(c.rows, c.cols, static_cast<uint64_t>(c.rows * 31 + c.cols));
    if (c.nan) x[static_cast<size_t>(c.cols + 3)] = kNaN;
    const Format fs = parse_format(c.scale);
    const ScaleCodeTable table(fs);
    const int cb = fs.code_bytes();
    const int64_t blocks = (c.rows + c.br - 1) / c.br * ((c.cols + c.bc - 1) / c.bc);
    std::mt19937_64 g(static_cast<uint64_t>(blocks));
    std::vector<uint8_t> codes(static_cast<size_t>(blocks * cb));
    for (auto& b : codes) b = static_cast<uint8_t>(g());
    OperandStats want, got;
    add_block_ranges(x.data(), c.rows, c.cols, c.br, c.bc, want);
    table.add(codes.data(), blocks, want);
    want.amax = abs_max(x.data(), c.rows * c.cols);
    got.amax = -1;
    MemBuf<float> dx = dev.upload(x);
    MemBuf<uint8_t> dc = dev.upload(codes);
    DeviceStats st = dev.stats();
    st.operand_later(dx.data(), c.rows, c.cols, c.br, c.bc, &table, dc.data(), &got.amax, got);
    EXPECT_EQ(got.amax, -1) << what << ": filled before collect";
    st.collect();
    EXPECT_EQ(bits(got.amax), bits(want.amax)) << what;
    got.amax = want.amax = 0;
    EXPECT_EQ(got, want) << what;
    uint64_t counted = 0;
    for (const uint64_t k : want.range_hist) counted += k;
    EXPECT_GT(counted, 0u) << what;
  }
}

// ---------------------------------------------------------------------------
// the GEMM statistics' sums and the ledger
// ---------------------------------------------------------------------------

TEST(DeviceStats, GemmSumsEqualTheCpus) {
  EXMY_REQUIRE_CUDA();
  Device dev;
  // rows shorter and longer than a segment, a multiple of it, and segment
  // counts that leave short groups at the tree's levels
  for (const auto& [R, N] : {std::pair<int64_t, int64_t>{1, 1}, {3, 255}, {5, 257}, {64, 1024}, {130, 700},
                             {33, 32 * 256}, {40, 9000}, {0, 10}, {4, 0}}) {
    const std::string what = std::to_string(R) + "x" + std::to_string(N);
    Vec got = models::randn(static_cast<size_t>(R * N), static_cast<uint64_t>(R * 7 + N));
    Vec ref = models::randn(static_cast<size_t>(R * N), static_cast<uint64_t>(R * 7 + N + 1));
    for (size_t i = 0; i < got.size(); i += 11) got[i] *= 1e6f;  // sums that depend on the order
    for (size_t i = 0; i < ref.size(); ++i) ref[i] = got[i] + 0.01f * ref[i];
    const GemmStats want = compare_gemm(got.data(), ref.data(), R, N, {});
    MemBuf<float> dg = dev.upload(got), dr = dev.upload(ref);
    DeviceStats st = dev.stats();
    GemmStats have;
    have.sum_y2 = 12345;  // (overwritten)
    st.compare_gemm_later(dg.data(), dr.data(), R, N, &have);
    EXPECT_EQ(have.sum_y2, 12345) << what << ": filled before collect";
    st.collect();
    EXPECT_EQ(have.count, want.count) << what;
    EXPECT_EQ(have.rows, want.rows) << what;
    for (const auto& [a, b, name] : {std::tuple{have.sum_y2, want.sum_y2, "sum_y2"},
                                     {have.sum_yhat2, want.sum_yhat2, "sum_yhat2"},
                                     {have.sum_y_yhat, want.sum_y_yhat, "sum_y_yhat"},
                                     {have.sum_err2, want.sum_err2, "sum_err2"},
                                     {have.sum_abs_y, want.sum_abs_y, "sum_abs_y"},
                                     {have.sum_abs_yhat, want.sum_abs_yhat, "sum_abs_yhat"}})
      EXPECT_EQ(bits(a), bits(b)) << what << " " << name << ": device " << a << ", CPU " << b;
  }
}

TEST(StatsLedger, FillsInCallOrderAcrossChunks) {
  EXMY_REQUIRE_CUDA();
  Device dev;
  StatsLedger ledger(dev.mem());
  for (int round = 0; round < 2; ++round) {
    // 3000 rooms of 8 to 800 bytes (some 1.2 MB): many chunks the first time
    std::vector<int> order;
    std::vector<int> sizes;
    for (int i = 0; i < 3000; ++i) {
      const int n = 8 + (i * 37) % 793;
      sizes.push_back(n);
      std::vector<uint8_t> v(static_cast<size_t>(n));
      for (int k = 0; k < n; ++k) v[static_cast<size_t>(k)] = static_cast<uint8_t>(i * 7 + k);
      void* at = ledger.reserve(static_cast<size_t>(n), [&order, i, n](const void* p) {
        const auto* b = static_cast<const uint8_t*>(p);
        for (int k = 0; k < n; ++k)
          if (b[k] != static_cast<uint8_t>(i * 7 + k)) {
            ADD_FAILURE() << "room " << i << " byte " << k;
            break;
          }
        order.push_back(i);
      });
      EXPECT_EQ(reinterpret_cast<uintptr_t>(at) % 16, 0u);
      dev.mem().from_host(at, v.data(), v.size());
    }
    if (round == 0) {
      EXPECT_GT(ledger.chunks(), 1u);
    } else {
      EXPECT_EQ(ledger.chunks(), 1u) << "the first collect sizes one chunk";
    }
    EXPECT_GE(ledger.bytes(), 3000u * 8);
    EXPECT_TRUE(order.empty());
    ledger.collect();
    ASSERT_EQ(order.size(), 3000u);
    for (int i = 0; i < 3000; ++i) EXPECT_EQ(order[static_cast<size_t>(i)], i);
    EXPECT_TRUE(ledger.empty());
  }
  // abs_max_later: the max and NaN, after collect
  Vec x = {1.0f, -7.5f, 3.0f};
  MemBuf<float> d = dev.upload(x);
  DeviceStats st = dev.stats();
  double a = -1, b = -1;
  st.abs_max_later(d.data(), 3, &a);
  x[2] = kNaN;
  MemBuf<float> e = dev.upload(x);
  st.abs_max_later(e.data(), 3, &b);
  EXPECT_EQ(a, -1);
  st.collect();
  EXPECT_EQ(a, 7.5);
  EXPECT_TRUE(std::isnan(b));
}

}  // namespace
}  // namespace exmy::sim::quant

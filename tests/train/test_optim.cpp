// AdamW against hand-computed steps and a double-precision reference, the
// global norm and clipping, and the LR schedules.
#include <gtest/gtest.h>
#include <omp.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <map>
#include <numbers>
#include <random>
#include <string>
#include <vector>

#include "formats/error.hpp"
#include "sim/bf16.hpp"
#include "sim/optim.hpp"
#include "sim/parallel.hpp"
#include "tests/train/test_support.hpp"

namespace exmy::sim {
namespace {

// Two views: "w" (decayed, 2 elements) and "norm.weight" (no decay, 1).
ArenaLayout two_views() {
  ArenaLayout L;
  L.add("w", {2}, true);
  L.add("norm.weight", {1}, false);
  return L;
}

TEST(AdamW, MatchesHandComputedSteps) {
  const ArenaLayout L = two_views();
  AdamWConfig c;
  c.beta1 = 0.9;
  c.beta2 = 0.999;
  c.eps = 1e-8;
  c.weight_decay = 0.1;
  AdamW opt(L, c);
  Buf<float> p(static_cast<size_t>(L.size()), 0.0f), g(p.size(), 0.0f);
  const int64_t w = L.get("w").offset, n = L.get("norm.weight").offset;
  p[w] = 1.0f, p[w + 1] = -1.0f, p[n] = 2.0f;
  g[w] = 0.5f, g[w + 1] = -2.0f, g[n] = 0.25f;
  // Step 1: decay p *= 1 - lr*wd = 0.99; m_hat = g and v_hat = g^2, so the
  // update is lr * sign(g) (up to eps): 0.99 - 0.1 = 0.89, -0.99 + 0.1 = -0.89;
  // the no-decay element moves 2 - 0.1 = 1.9.
  opt.step(p, g, 0.1, 1.0);
  EXPECT_NEAR(p[w], 0.89, 2e-7);
  EXPECT_NEAR(p[w + 1], -0.89, 2e-7);
  EXPECT_NEAR(p[n], 1.9, 2e-7);
  // Step 2 with the same gradient: m_hat = g and v_hat = g^2 again (the bias
  // corrections undo the moments exactly), so 0.89 * 0.99 - 0.1 = 0.7811.
  opt.step(p, g, 0.1, 1.0);
  EXPECT_NEAR(p[w], 0.7811, 3e-7);
  EXPECT_NEAR(p[w + 1], -0.7811, 3e-7);
  EXPECT_NEAR(p[n], 1.8, 3e-7);
  EXPECT_EQ(opt.steps(), 2);
  // Moments after two steps of g = 0.5: m = 0.095, v = 0.00049975.
  EXPECT_NEAR(opt.exp_avg()[static_cast<size_t>(w)], 0.095, 1e-8);
  EXPECT_NEAR(opt.exp_avg_sq()[static_cast<size_t>(w)], 0.00049975, 1e-10);
  // Padding between views stays exactly zero.
  for (int64_t i = w + 2; i < n; ++i) EXPECT_EQ(p[static_cast<size_t>(i)], 0.0f);
}

TEST(AdamW, MatchesDoubleReferenceWithGradScale) {
  ArenaLayout L;
  L.add("a", {7, 5}, true);
  L.add("b.bias", {9}, false);
  L.add("c", {33}, true);
  AdamWConfig c;  // defaults: 0.9, 0.95, 1e-8, 0.1
  AdamW opt(L, c);
  std::mt19937 gen(3);
  std::normal_distribution<double> nd;
  Buf<float> p(static_cast<size_t>(L.size()), 0.0f), g(p.size(), 0.0f);
  std::vector<double> rp(p.size()), rm(p.size(), 0.0), rv(p.size(), 0.0);
  for (const auto& v : L.views())
    for (int64_t i = v.offset; i < v.offset + v.numel; ++i) rp[static_cast<size_t>(i)] = p[static_cast<size_t>(i)] = static_cast<float>(nd(gen));
  const double lrs[3] = {1e-2, 3e-3, 5e-4}, scales[3] = {0.5, 1.0, 0.25};
  for (int t = 1; t <= 3; ++t) {
    for (const auto& v : L.views())
      for (int64_t i = v.offset; i < v.offset + v.numel; ++i) g[static_cast<size_t>(i)] = static_cast<float>(nd(gen));
    opt.step(p, g, lrs[t - 1], scales[t - 1]);
    const double lr = lrs[t - 1];
    const double bc1 = 1 - std::pow(c.beta1, t), bc2 = 1 - std::pow(c.beta2, t);
    for (const auto& v : L.views())
      for (int64_t i = v.offset; i < v.offset + v.numel; ++i) {
        const size_t k = static_cast<size_t>(i);
        const double gi = static_cast<double>(g[k]) * scales[t - 1];
        if (v.weight_decay) rp[k] *= 1 - lr * c.weight_decay;
        rm[k] = c.beta1 * rm[k] + (1 - c.beta1) * gi;
        rv[k] = c.beta2 * rv[k] + (1 - c.beta2) * gi * gi;
        rp[k] -= lr / bc1 * rm[k] / (std::sqrt(rv[k]) / std::sqrt(bc2) + c.eps);
      }
  }
  for (size_t k = 0; k < p.size(); ++k) EXPECT_NEAR(p[k], rp[k], 1e-6 * (1 + std::fabs(rp[k]))) << k;
}

// A layout of views of mixed sizes (one much larger than the rest, as an
// embedding is) for the sharded optimizer.
ArenaLayout mixed_views() {
  ArenaLayout L;
  L.add("embed", {61, 17}, true);
  for (int i = 0; i < 9; ++i) {
    L.add("layers." + std::to_string(i) + ".w", {3 + i, 5}, true);
    L.add("layers." + std::to_string(i) + ".norm.weight", {7 + i}, false);
  }
  L.add("head", {13, 11}, true);
  return L;
}

// Every element of L's views in x drawn from nd(gen) (the padding left as it is).
void fill_views(const ArenaLayout& L, Buf<float>& x, std::normal_distribution<float>& nd, std::mt19937& gen) {
  for (const auto& v : L.views())
    for (int64_t i = v.offset; i < v.offset + v.numel; ++i) x[static_cast<size_t>(i)] = nd(gen);
}

TEST(OptimizerShard, ShardsOfWholeViewsTileTheArenaInRankOrder) {
  const ArenaLayout L = mixed_views();
  const int nv = static_cast<int>(L.views().size());
  int64_t largest_view = 0;
  for (const auto& v : L.views()) largest_view = std::max(largest_view, v.numel);
  for (int n = 1; n <= 25; ++n) {
    int64_t at = 0;
    int view = 0;
    for (int r = 0; r < n; ++r) {
      const OptimizerShard s = optimizer_shard(L, r, n);
      EXPECT_EQ(s.begin, at) << r << " of " << n;
      EXPECT_EQ(s.first_view, view) << r << " of " << n;
      EXPECT_LE(s.begin, s.end);
      if (s.end_view > s.first_view) {
        EXPECT_EQ(s.begin, r == 0 ? 0 : L.views()[static_cast<size_t>(s.first_view)].offset);
        // Balanced up to one view (and its padding): the boundaries sit at the
        // first view at or after r/n of the arena.
        EXPECT_LE(s.size(), L.size() / n + largest_view + 64) << r << " of " << n;
      }
      at = s.end;
      view = s.end_view;
    }
    EXPECT_EQ(at, L.size()) << n;
    EXPECT_EQ(view, nv) << n;
    if (n == 1) {
      EXPECT_EQ(optimizer_shard(L, 0, 1).size(), whole_arena(L).size());
    }
  }
  EXPECT_THROW(optimizer_shard(L, 2, 2), Error);
}

// The ranks' shards stepped apart and put together are the whole-arena
// optimizer bit for bit: parameters and each view's moments.
TEST(OptimizerShard, ShardedStepsAreTheWholeStepsBits) {
  const ArenaLayout L = mixed_views();
  AdamWConfig c;
  std::mt19937 gen(11);
  std::normal_distribution<float> nd;
  Buf<float> p0(static_cast<size_t>(L.size()), 0.0f), g(p0.size(), 0.0f);
  fill_views(L, p0, nd, gen);
  for (const int n : {2, 3, 5}) {
    AdamW whole(L, c);
    Buf<float> pw = p0;
    std::vector<AdamW> shards;
    for (int r = 0; r < n; ++r) shards.emplace_back(L, c, optimizer_shard(L, r, n));
    Buf<float> ps = p0;
    std::mt19937 gg(5);
    for (int t = 0; t < 3; ++t) {
      fill_views(L, g, nd, gg);
      whole.step(pw, g, 1e-2, 0.5);
      // Each rank steps its own copy; the shards' elements are then gathered.
      Buf<float> gathered = ps;
      for (auto& o : shards) {
        Buf<float> mine = ps;
        o.step(mine, g, 1e-2, 0.5);
        for (int64_t i = o.shard().begin; i < o.shard().end; ++i)
          gathered[static_cast<size_t>(i)] = mine[static_cast<size_t>(i)];
      }
      ps = gathered;
    }
    for (size_t i = 0; i < pw.size(); ++i)
      ASSERT_EQ(std::bit_cast<uint32_t>(pw[i]), std::bit_cast<uint32_t>(ps[i])) << "element " << i << ", " << n << " shards";
    for (int vi = 0; vi < static_cast<int>(L.views().size()); ++vi) {
      int owners = 0;
      for (const auto& o : shards) {
        if (!o.owns(vi)) continue;
        ++owners;
        const int64_t k = L.view(vi).numel;
        for (int64_t i = 0; i < k; ++i) {
          ASSERT_EQ(std::bit_cast<uint32_t>(o.exp_avg_of(vi)[i]), std::bit_cast<uint32_t>(whole.exp_avg_of(vi)[i]));
          ASSERT_EQ(std::bit_cast<uint32_t>(o.exp_avg_sq_of(vi)[i]), std::bit_cast<uint32_t>(whole.exp_avg_sq_of(vi)[i]));
        }
      }
      EXPECT_EQ(owners, 1) << "view " << vi;
    }
  }
}

// A device memory for the offloaded optimizer's test: host storage that
// says it is not the host's (so AdamW must copy through to_host and
// from_host) and counts the bytes moved each way. Its asynchronous copies
// land only at wait(), as late as a device may finish them: until then the
// destination holds a poison (all bits set, a NaN), and wait() copies the
// source as it is then, counting the copies whose source was written while
// in flight. A step that reads a destination before waiting, writes a
// source still in flight or never waits leaves NaNs, a count or a copy
// pending.
class CopyCountingMemory final : public Memory {
 public:
  const char* name() const override { return "test device"; }
  bool on_host() const override { return false; }
  void* allocate(size_t bytes) override { return host_memory().allocate(bytes); }
  void deallocate(void* p) noexcept override { host_memory().deallocate(p); }
  void zero(void* p, size_t bytes) override { host_memory().zero(p, bytes); }
  void to_host(void* d, const void* s, size_t bytes) override { down += bytes, host_memory().copy(d, s, bytes); }
  void from_host(void* d, const void* s, size_t bytes) override { up += bytes, host_memory().copy(d, s, bytes); }
  void copy(void* d, const void* s, size_t bytes) override { host_memory().copy(d, s, bytes); }
  CopyToken to_host_async(void* d, const void* s, size_t bytes) override { return down += bytes, defer(d, s, bytes); }
  CopyToken from_host_async(void* d, const void* s, size_t bytes) override { return up += bytes, defer(d, s, bytes); }
  void wait(CopyToken& t) override {
    if (t.done()) return;
    const auto it = pending_.find(t.id);
    ASSERT_TRUE(it != pending_.end()) << "token " << t.id << " of no copy in flight";
    const Copy& c = it->second;
    if (std::memcmp(c.src, c.was.data(), c.was.size()) != 0) ++source_written;
    std::memmove(c.dst, c.src, c.was.size());
    pending_.erase(it);
    t = {};
  }
  size_t in_flight() const { return pending_.size(); }
  size_t down = 0, up = 0;
  size_t most_in_flight = 0;  // copies started and not yet waited for, at most
  int source_written = 0;

 private:
  struct Copy {
    void* dst;
    const void* src;
    std::vector<unsigned char> was;  // the source when the copy started
  };
  std::map<uint64_t, Copy> pending_;
  uint64_t next_ = 1;
  CopyToken defer(void* d, const void* s, size_t bytes) {
    if (!bytes) return {};
    const auto* b = static_cast<const unsigned char*>(s);
    pending_.emplace(next_, Copy{d, s, std::vector<unsigned char>(b, b + bytes)});
    std::memset(d, 0xff, bytes);
    most_in_flight = std::max(most_in_flight, pending_.size());
    return {next_++};
  }
};

// train.offload = optimizer: the master weights and moments on the host,
// the arena in a device's memory, the update made chunk by chunk. Whatever
// the chunk (cutting views, or one element at a time) and the shard, the
// weights and moments are the bits of the AdamW that keeps everything in
// one memory; each step moves the shard's gradients down and its weights up
// once; a master_from_params after the arena is written starts from the
// new weights. The copies are asynchronous (landing only when waited for):
// with small chunks many are in flight at once, and every one is waited for
// before its destination is read or its source written, and by the end of
// the step.
TEST(AdamW, OffloadedStateGivesTheSameBitsChunkByChunk) {
  const ArenaLayout L = mixed_views();
  AdamWConfig c;
  std::mt19937 gen(3);
  std::normal_distribution<float> nd;
  Buf<float> p0(static_cast<size_t>(L.size()), 0.0f), g(p0.size(), 0.0f);
  fill_views(L, p0, nd, gen);
  for (const int n : {1, 3}) {
    for (const int64_t chunk : {int64_t{1}, int64_t{37}, int64_t{1000}, kOffloadChunk}) {
      for (int r = 0; r < n; ++r) {
        const OptimizerShard sh = optimizer_shard(L, r, n);
        AdamW ref(L, c, sh);
        CopyCountingMemory dev;
        AdamW off(L, c, sh, dev, {}, &host_memory());
        off.set_offload_chunk(chunk);
        ASSERT_TRUE(off.offloaded());
        Buf<float> pr = p0, po = p0;
        std::mt19937 gg(9);
        for (int t = 0; t < 3; ++t) {
          fill_views(L, g, nd, gg);
          if (t == 2) {  // the arena rewritten between steps (a checkpoint loaded)
            for (size_t i = 0; i < pr.size(); ++i) pr[i] = po[i] = pr[i] * 0.5f;
            off.master_from_params();
          }
          dev.down = dev.up = 0;
          ref.step(pr, g, 1e-2, 0.75);
          off.step(po, g, 1e-2, 0.75);
          const size_t bytes = sizeof(float) * static_cast<size_t>(sh.size());
          EXPECT_EQ(dev.down, (t == 0 || t == 2 ? 2 : 1) * bytes) << "gradients (and, first, the master weights) down";
          EXPECT_EQ(dev.up, bytes) << "weights up";
          EXPECT_EQ(dev.in_flight(), 0u) << "copies not waited for";
          EXPECT_EQ(dev.source_written, 0) << "sources written in flight";
        }
        const int64_t chunks = (sh.size() + chunk - 1) / chunk;
        if (chunks >= 3) {
          EXPECT_GE(dev.most_in_flight, 3u) << "copies overlapping the update";
        }
        const std::string at = std::to_string(n) + " shards, rank " + std::to_string(r) + ", chunk " + std::to_string(chunk);
        for (size_t i = 0; i < pr.size(); ++i)
          ASSERT_EQ(std::bit_cast<uint32_t>(po[i]), std::bit_cast<uint32_t>(pr[i])) << "element " << i << ", " << at;
        ASSERT_EQ(off.exp_avg().size(), ref.exp_avg().size());
        for (size_t i = 0; i < ref.exp_avg().size(); ++i) {
          ASSERT_EQ(std::bit_cast<uint32_t>(off.exp_avg()[i]), std::bit_cast<uint32_t>(ref.exp_avg()[i])) << at;
          ASSERT_EQ(std::bit_cast<uint32_t>(off.exp_avg_sq()[i]), std::bit_cast<uint32_t>(ref.exp_avg_sq()[i])) << at;
        }
      }
    }
  }
}

// train.working_weights = bf16: the optimizer keeps the FP32 master weights
// and writes their BF16 rounding into the arena after each step. Against a
// reference that runs the plain AdamW on a master copy and rounds it
// explicitly (round_bf16_hd, sim/bf16.hpp): every element of the arena is
// bf16(master) bit for bit, the master and moments are the plain AdamW's
// — on the host, in a device's memory through the device kernels' host
// emulation, and offloaded chunk by chunk (chunks that cut views), whole or
// on each of 3 shards (elements outside a shard are left as they were).
TEST(AdamW, Bf16WorkingWeightsAreTheRoundedMaster) {
  const ArenaLayout L = mixed_views();
  AdamWConfig c;
  std::mt19937 gen(21);
  std::normal_distribution<float> nd;
  Buf<float> p0(static_cast<size_t>(L.size()), 0.0f), g(p0.size(), 0.0f);
  fill_views(L, p0, nd, gen);
  const OptimKernels emulated{adamw_update_emulated, global_norm_partials_emulated, adamw_bf16_update_emulated};
  for (const std::string where : {"host", "device", "offloaded"}) {
    for (const int n : {1, 3}) {
      for (int r = 0; r < n; ++r) {
        const std::string at = where + ", " + std::to_string(n) + " shards, rank " + std::to_string(r);
        const OptimizerShard sh = optimizer_shard(L, r, n);
        AdamW ref(L, c, sh);
        CopyCountingMemory dev;
        AdamW bf(L, c, sh, where == "host" ? host_memory() : dev, where == "device" ? emulated : OptimKernels{},
                 where == "offloaded" ? &host_memory() : nullptr, WorkingWeights::bf16);
        if (where == "offloaded") bf.set_offload_chunk(37);
        ASSERT_TRUE(bf.keeps_master());
        Buf<float> master = p0, po = p0;
        bf.take_master(po);
        for (float& x : po) x = round_bf16_hd(x);  // what the trainer does after take_master
        std::mt19937 gg(9);
        for (int t = 0; t < 3; ++t) {
          fill_views(L, g, nd, gg);
          ref.step(master, g, 1e-2, 0.75);
          bf.step(po, g, 1e-2, 0.75);
          ASSERT_EQ(dev.in_flight(), 0u) << at;
          ASSERT_EQ(dev.source_written, 0) << at;
        }
        if (where == "offloaded" && sh.size() > 3 * 37) {
          EXPECT_GE(dev.most_in_flight, 3u) << at;
        }
        size_t below_bf16 = 0;  // master elements with bits a BF16 drops: the test is not vacuous
        for (size_t i = 0; i < po.size(); ++i) {
          ASSERT_EQ(std::bit_cast<uint32_t>(po[i]), std::bit_cast<uint32_t>(round_bf16_hd(master[i])))
              << "element " << i << ", " << at;
          ASSERT_EQ(std::bit_cast<uint32_t>(po[i]) & 0xffffu, 0u) << "element " << i << ", " << at;
          below_bf16 += static_cast<int64_t>(i) >= sh.begin && static_cast<int64_t>(i) < sh.end && po[i] != master[i];
        }
        EXPECT_GT(below_bf16, 0u) << at;
        std::vector<float> staging;
        for (int vi = sh.first_view; vi < sh.end_view; ++vi) {
          const auto& v = L.view(vi);
          const float* mv = host_view(bf.memory(), bf.master_of(vi), v.numel, staging);
          for (int64_t i = 0; i < v.numel; ++i)
            ASSERT_EQ(std::bit_cast<uint32_t>(mv[i]), std::bit_cast<uint32_t>(master[static_cast<size_t>(v.offset + i)]))
                << "master of view " << vi << ", " << at;
        }
        for (size_t i = 0; i < ref.exp_avg().size(); ++i) {
          ASSERT_EQ(std::bit_cast<uint32_t>(bf.exp_avg()[i]), std::bit_cast<uint32_t>(ref.exp_avg()[i])) << at;
          ASSERT_EQ(std::bit_cast<uint32_t>(bf.exp_avg_sq()[i]), std::bit_cast<uint32_t>(ref.exp_avg_sq()[i])) << at;
        }
        // The FP32 export's path: the shard's master back into an arena.
        Buf<float> back(po.size(), -1.0f);
        bf.master_to(back);
        for (int64_t i = sh.begin; i < sh.end; ++i)
          ASSERT_EQ(std::bit_cast<uint32_t>(back[static_cast<size_t>(i)]), std::bit_cast<uint32_t>(master[static_cast<size_t>(i)])) << at;
      }
    }
  }
}

// A rank whose shard is empty (more ranks than large views) takes, keeps
// and exports no master, steps nothing and leaves the arena alone.
TEST(AdamW, Bf16WorkingWeightsOnAnEmptyShard) {
  const ArenaLayout L = two_views();
  int empty = -1;
  for (int r = 0; r < 5 && empty < 0; ++r)
    if (optimizer_shard(L, r, 5).size() == 0) empty = r;
  ASSERT_GE(empty, 0);
  AdamW bf(L, AdamWConfig{}, optimizer_shard(L, empty, 5), host_memory(), {}, nullptr, WorkingWeights::bf16);
  Buf<float> p(static_cast<size_t>(L.size()), 0.5f), g(p.size(), 0.25f);
  bf.take_master(p);
  bf.step(p, g, 1e-2, 1.0);
  bf.master_to(p);
  for (const float x : p) EXPECT_EQ(x, 0.5f);
}

// A step with BF16 working weights needs the master taken first: an
// update of the rounded arena would silently drop the master's low bits.
TEST(AdamW, Bf16WorkingWeightsWithoutAMasterAreRefused) {
  const ArenaLayout L = mixed_views();
  AdamW bf(L, AdamWConfig{}, whole_arena(L), host_memory(), {}, nullptr, WorkingWeights::bf16);
  Buf<float> p(static_cast<size_t>(L.size()), 0.5f), g(p.size(), 0.25f);
  test::expect_error([&] { bf.step(p, g, 1e-2, 1.0); }, "without master weights");
  CopyCountingMemory dev;
  test::expect_error([&] { AdamW(L, AdamWConfig{}, whole_arena(L), dev, {adamw_update_emulated, global_norm_partials_emulated},
                                 nullptr, WorkingWeights::bf16); },
                     "no BF16 working-weight update kernel");
  test::expect_error([&] { parse_working_weights("fp16"); }, "train.working_weights: bad value 'fp16' (expected fp32 or bf16)");
}

// Offloaded state must be in host memory.
TEST(AdamW, OffloadToADeviceMemoryIsRefused) {
  const ArenaLayout L = mixed_views();
  CopyCountingMemory dev;
  try {
    AdamW off(L, AdamWConfig{}, whole_arena(L), dev, {}, &dev);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("must be in host memory"), std::string::npos) << e.what();
  }
}

TEST(GlobalNorm, ValueScaleAndThreadIndependence) {
  std::vector<float> g = {3.0f, 4.0f};
  EXPECT_DOUBLE_EQ(global_norm(g), 5.0);
  EXPECT_DOUBLE_EQ(global_norm(g, 0.5), 2.5);
  std::vector<float> big(100003);
  std::mt19937 gen(5);
  std::normal_distribution<float> nd;
  for (auto& x : big) x = nd(gen);
  const int64_t saved = parallel_min_work();
  const int threads = omp_get_max_threads();
  parallel_min_work() = 0;
  omp_set_num_threads(1);
  const double a = global_norm(big);
  omp_set_num_threads(2);
  const double b = global_norm(big);
  omp_set_num_threads(threads);
  parallel_min_work() = saved;
  EXPECT_EQ(std::bit_cast<uint64_t>(a), std::bit_cast<uint64_t>(b));
  EXPECT_GT(a, 0);
}

TEST(GlobalNorm, ClipFactor) {
  EXPECT_DOUBLE_EQ(clip_factor(0.5, 1.0), 1.0);
  EXPECT_DOUBLE_EQ(clip_factor(2.0, 1.0), 1.0 / (2.0 + 1e-6));
  EXPECT_DOUBLE_EQ(clip_factor(100.0, 0.0), 1.0);  // off
}

TEST(LrSchedule, ConstantWithWarmup) {
  LrSchedule s;
  s.kind = LrKind::constant;
  s.peak = 1.0;
  s.warmup = 4;
  s.total = 10;
  EXPECT_DOUBLE_EQ(s.at(0), 0.25);
  EXPECT_DOUBLE_EQ(s.at(1), 0.5);
  EXPECT_DOUBLE_EQ(s.at(3), 1.0);
  EXPECT_DOUBLE_EQ(s.at(9), 1.0);
}

TEST(LrSchedule, Cosine) {
  LrSchedule s;
  s.kind = LrKind::cosine;
  s.peak = 1.0;
  s.total = 10;
  s.min_ratio = 0.1;
  EXPECT_DOUBLE_EQ(s.at(0), 1.0);
  EXPECT_NEAR(s.at(5), 0.55, 1e-15);
  EXPECT_NEAR(s.at(9), 0.1 + 0.9 * 0.5 * (1 + std::cos(0.9 * std::numbers::pi)), 1e-15);
  EXPECT_NEAR(s.at(10), 0.1, 1e-15);
  s.warmup = 2;  // the cosine starts after the warmup
  EXPECT_DOUBLE_EQ(s.at(0), 0.5);
  EXPECT_DOUBLE_EQ(s.at(2), 1.0);
  EXPECT_NEAR(s.at(6), 0.55, 1e-15);
}

TEST(LrSchedule, WarmupStableDecayAsInTheUe5m3Paper) {
  LrSchedule s;
  s.kind = LrKind::wsd;
  s.peak = 2.0;
  s.warmup = 10;
  s.total = 100;
  EXPECT_EQ(s.decay_steps(), 15);  // the last 15%
  EXPECT_DOUBLE_EQ(s.at(0), 0.2);
  EXPECT_DOUBLE_EQ(s.at(9), 2.0);
  EXPECT_DOUBLE_EQ(s.at(50), 2.0);
  EXPECT_DOUBLE_EQ(s.at(84), 2.0);
  EXPECT_NEAR(s.at(85), 2.0 * (1 - 0.99 / 15), 1e-15);
  EXPECT_NEAR(s.at(92), 2.0 * (1 - 0.99 * 8 / 15), 1e-15);
  EXPECT_NEAR(s.at(99), 0.02, 1e-15);  // 1% of the peak on the last step
  for (int64_t i = 85; i < 100; ++i) EXPECT_LT(s.at(i), s.at(i - 1));
}

TEST(LrSchedule, BadSchedulesAreRejected) {
  test::expect_error([] { parse_lr_kind("linear"); }, "expected constant, cosine or wsd");
  LrSchedule s;
  s.total = 10;
  s.warmup = -1;
  test::expect_error([&] { s.validate(); }, "optim.warmup_steps");
  s.warmup = 0;
  s.min_ratio = 1.5;
  test::expect_error([&] { s.validate(); }, "optim.min_lr_ratio");
  s.min_ratio = 0.1;
  s.total = 0;
  test::expect_error([&] { s.validate(); }, "train.steps");
}

TEST(LrSchedule, RunsShorterThanTheWarmup) {
  LrSchedule s;
  s.peak = 1.0;
  s.warmup = 10;
  s.total = 4;  // cosine: the run ends during the warmup
  EXPECT_DOUBLE_EQ(s.at(3), 0.4);
  s.kind = LrKind::wsd;  // wsd: the decay of the last step multiplies the ramp
  EXPECT_EQ(s.decay_steps(), 1);
  EXPECT_DOUBLE_EQ(s.at(2), 0.3);
  EXPECT_NEAR(s.at(3), 0.4 * 0.01, 1e-15);
}

}  // namespace
}  // namespace exmy::sim

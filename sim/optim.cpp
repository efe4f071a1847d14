#include "sim/optim.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "formats/error.hpp"
#include "sim/adamw_update.hpp"
#include "sim/parallel.hpp"

namespace exmy::sim {

double global_norm(std::span<const float> g, double scale) {
  const int64_t n = static_cast<int64_t>(g.size()), nb = norm_blocks(n);
  std::vector<double> part(static_cast<size_t>(nb), 0.0);
#pragma omp parallel for schedule(static) if (n >= parallel_min_work())
  for (int64_t b = 0; b < nb; ++b) part[static_cast<size_t>(b)] = norm_block_partial(g.data(), n, b);
  return global_norm_of_partials(part, scale);
}

double global_norm(Memory& memory, const OptimKernels& k, std::span<const float> g, double scale) {
  if (memory.on_host()) return global_norm(g, scale);
  if (!k.norm_partials) throw Error("global_norm: no kernel for an arena in " + std::string(memory.name()) + " memory");
  const int64_t n = static_cast<int64_t>(g.size()), nb = norm_blocks(n);
  MemBuf<double> dev(memory, nb);
  k.norm_partials(g.data(), n, dev.data());
  std::vector<double> part(static_cast<size_t>(nb));
  memory.to_host(part.data(), dev.data(), part.size() * sizeof(double));
  return global_norm_of_partials(part, scale);
}

double global_norm_of_partials(std::span<const double> part, double scale) {
  double total = 0;
  for (double s : part) total += s;
  return std::sqrt(total) * std::fabs(scale);
}

double clip_factor(double norm, double max_norm) {
  if (max_norm <= 0 || !(norm > max_norm)) return 1.0;
  return max_norm / (norm + 1e-6);
}

OptimizerShard whole_arena(const ArenaLayout& layout) {
  return {0, static_cast<int>(layout.views().size()), 0, layout.size()};
}

OptimizerShard optimizer_shard(const ArenaLayout& layout, int r, int n) {
  if (n < 1 || r < 0 || r >= n) throw Error("optimizer_shard: rank " + std::to_string(r) + " of " + std::to_string(n));
  const auto& views = layout.views();
  const int nv = static_cast<int>(views.size());
  // The first view that starts at or after rank k's fraction of the arena.
  const auto start = [&](int k) {
    if (k >= n) return nv;
    const int64_t at = static_cast<int64_t>((static_cast<__int128>(layout.size()) * k) / n);
    int i = 0;
    while (i < nv && views[static_cast<size_t>(i)].offset < at) ++i;
    return i;
  };
  const auto offset = [&](int i) { return i < nv ? views[static_cast<size_t>(i)].offset : layout.size(); };
  OptimizerShard s;
  s.first_view = r == 0 ? 0 : start(r);
  s.end_view = start(r + 1);
  s.begin = r == 0 ? 0 : offset(s.first_view);
  s.end = s.end_view >= nv ? layout.size() : offset(s.end_view);
  return s;
}

int64_t largest_shard(const ArenaLayout& layout, int n) {
  int64_t most = 0;
  for (int r = 0; r < n; ++r) most = std::max(most, optimizer_shard(layout, r, n).size());
  return most;
}

AdamW::AdamW(const ArenaLayout& layout, AdamWConfig cfg) : AdamW(layout, cfg, whole_arena(layout)) {}

WorkingWeights parse_working_weights(std::string_view name, std::string_view key) {
  if (name == "fp32") return WorkingWeights::fp32;
  if (name == "bf16") return WorkingWeights::bf16;
  throw Error(std::string(key) + ": bad value '" + std::string(name) + "' (expected fp32 or bf16)");
}

std::string_view working_weights_name(WorkingWeights w) { return w == WorkingWeights::bf16 ? "bf16" : "fp32"; }

AdamW::AdamW(const ArenaLayout& layout, AdamWConfig cfg, OptimizerShard shard, Memory& memory,
             OptimKernels kernels, Memory* offload, WorkingWeights working)
    : cfg_(cfg), shard_(shard), arena_size_(layout.size()), kernels_(kernels), m_(offload ? *offload : memory),
      v_(offload ? *offload : memory), offloaded_(offload != nullptr), arena_memory_(&memory), working_(working) {
  if (offload && !offload->on_host())
    throw Error("AdamW: offloaded optimizer state must be in host memory, not " + std::string(offload->name()));
  if (!offload && !memory.on_host() && !kernels.on_device())
    throw Error("AdamW: no update kernel for optimizer state in " + std::string(memory.name()) + " memory");
  if (!offload && !memory.on_host() && working == WorkingWeights::bf16 && !kernels.adamw_bf16)
    throw Error("AdamW: no BF16 working-weight update kernel for optimizer state in " + std::string(memory.name()) +
                " memory");
  const auto& views = layout.views();
  for (const auto& v : views) offsets_.push_back(v.offset);
  for (int i = shard.first_view; i < shard.end_view; ++i) {
    ranges_.emplace_back(views[static_cast<size_t>(i)].offset, views[static_cast<size_t>(i)].numel);
    decay_.push_back(views[static_cast<size_t>(i)].weight_decay);
  }
  m_.resize_zero(shard.size());
  v_.resize_zero(shard.size());
  if (keeps_master()) master_.place(offload ? *offload : memory), master_.resize_zero(shard.size());
  if (offloaded_) {
    for (int b = 0; b < offload_staging_chunks(working_); ++b)
      stage_[b].place(*offload), stage_[b].resize_zero(std::min(shard.size(), kOffloadChunk));
  }
}

void AdamW::take_master(std::span<const float> params) {
  if (static_cast<int64_t>(params.size()) != arena_size_)
    throw Error("AdamW::take_master: arena size does not match the optimizer state");
  if (!keeps_master()) return;
  const size_t bytes = sizeof(float) * static_cast<size_t>(shard_.size());
  const float* src = params.data() + shard_.begin;
  if (bytes == 0) {  // a rank without a shard
  } else if (master_.memory().on_host()) {
    arena_memory_->to_host(master_.data(), src, bytes);
  } else {
    arena_memory_->copy(master_.data(), src, bytes);
  }
  master_valid_ = true;
}

void AdamW::master_to(std::span<float> params) const {
  if (static_cast<int64_t>(params.size()) != arena_size_)
    throw Error("AdamW::master_to: arena size does not match the optimizer state");
  if (!keeps_master()) return;
  if (!master_valid_) throw Error("AdamW::master_to: the master weights were never taken (take_master)");
  const size_t bytes = sizeof(float) * static_cast<size_t>(shard_.size());
  if (bytes == 0) return;
  float* dst = params.data() + shard_.begin;
  if (master_.memory().on_host()) arena_memory_->from_host(dst, master_.data(), bytes);
  else arena_memory_->copy(dst, master_.data(), bytes);
}

AdamWScalars adamw_scalars(const AdamWConfig& cfg, int64_t t, double lr, double grad_scale) {
  const double bc1 = 1.0 - std::pow(cfg.beta1, static_cast<double>(t));
  const double bc2 = 1.0 - std::pow(cfg.beta2, static_cast<double>(t));
  return AdamWScalars{static_cast<float>(cfg.beta1),       static_cast<float>(cfg.beta2),
                      static_cast<float>(1.0 - cfg.beta1), static_cast<float>(1.0 - cfg.beta2),
                      static_cast<float>(lr / bc1),        static_cast<float>(std::sqrt(bc2)),
                      static_cast<float>(cfg.eps),         static_cast<float>(grad_scale),
                      static_cast<float>(1.0 - lr * cfg.weight_decay)};
}

void AdamW::step(std::span<float> params, std::span<const float> grads, double lr, double grad_scale) {
  if (static_cast<int64_t>(params.size()) != arena_size_ || grads.size() != params.size())
    throw Error("AdamW::step: arena size does not match the optimizer state");
  ++t_;
  const AdamWScalars s = adamw_scalars(cfg_, t_, lr, grad_scale);
  float* p = params.data();
  const float* g = grads.data();
  const bool bf16 = working_ == WorkingWeights::bf16;
  // The arena holds rounded weights: an update from them would lose the master's low bits.
  if (bf16 && !master_valid_ && shard_.size() > 0)
    throw Error("AdamW::step: BF16 working weights without master weights (take_master after writing the arena)");
  if (offloaded_) return step_offloaded(p, g, s);
  float* m = m_.data();  // shard-indexed: arena element i is m[i - shard_.begin]
  float* v = v_.data();
  float* master = master_.data();  // BF16 working weights: shard-indexed too
  if (!m_.memory().on_host()) {  // a device: one launch per view, the same update per element
    for (size_t k = 0; k < ranges_.size(); ++k) {
      const auto [off, n] = ranges_[k];
      const int64_t l = off - shard_.begin;
      const float dk = decay_[k] ? s.decay : 1.0f;
      if (bf16) kernels_.adamw_bf16(p + off, master + l, m + l, v + l, g + off, n, dk, s);
      else kernels_.adamw(p + off, m + l, v + l, g + off, n, dk, s);
    }
    return;
  }
  // Views are the unit of work: each one is a contiguous range with one
  // decay flag, so the inner loop is branch-free and vectorises.
  const int64_t nv = static_cast<int64_t>(ranges_.size());
#pragma omp parallel for schedule(dynamic, 1) if (shard_.size() >= parallel_min_work())
  for (int64_t k = 0; k < nv; ++k) {
    const auto [off, n] = ranges_[static_cast<size_t>(k)];
    const float dk = decay_[static_cast<size_t>(k)] ? s.decay : 1.0f;
    float* mk = m + (off - shard_.begin);
    float* vk = v + (off - shard_.begin);
    if (bf16) {
      float* wk = master + (off - shard_.begin);
      for (int64_t i = 0; i < n; ++i) adamw_update_bf16(p[off + i], wk[i], mk[i], vk[i], g[off + i], dk, s);
    } else {
      for (int64_t i = 0; i < n; ++i) adamw_update(p[off + i], mk[i], vk[i], g[off + i], dk, s);
    }
  }
}

void AdamW::set_offload_chunk(int64_t n) {
  if (n < 1) throw Error("AdamW::set_offload_chunk: " + std::to_string(n) + " elements");
  chunk_ = n;
  if (!offloaded_) return;
  for (int b = 0; b < offload_staging_chunks(working_); ++b)
    if (stage_[b].size() < std::min(shard_.size(), n)) stage_[b].resize_zero(std::min(shard_.size(), n));
}

// Chunk by chunk of the shard: its gradients to the host, the update of the
// views (or parts of views) in it on the master weights, the chunk's
// weights back to the arena (with BF16 working weights their rounding,
// formed in the staging buffer once the chunk's gradients are used). Each
// element's update is the one every other path makes, so neither the
// chunking nor the threads change a bit.
//
// The copies are asynchronous and run beside the host's update: while the
// host updates chunk i, the gradients of chunk i + 1 are on their way down
// into the next staging buffer and the weights of chunk i - 1 on their way
// up, so a step costs about the longest of the three rather than their sum.
// Chunk i's gradients use staging buffer i % S (offload_staging_chunks): two
// take turns when the weights go up from the master itself; with BF16 the
// rounded weights go up from the staging buffer, so a third keeps the
// buffer of chunk i - 1 untouched until its copy up has landed.
void AdamW::step_offloaded(float* params, const float* grads, const AdamWScalars& s) {
  const int64_t begin = shard_.begin, end = shard_.end;
  if (end <= begin) return;
  Memory& dev = *arena_memory_;
  float* master = master_.data();  // shard-indexed, as the moments
  if (!master_valid_) {
    dev.to_host(master, params + begin, sizeof(float) * static_cast<size_t>(end - begin));
    master_valid_ = true;
  }
  float* m = m_.data();
  float* v = v_.data();
  const bool bf16 = working_ == WorkingWeights::bf16;
  const int64_t S = offload_staging_chunks(working_);
  const int64_t chunks = (end - begin + chunk_ - 1) / chunk_;
  const auto bytes = [&](int64_t c0) { return sizeof(float) * static_cast<size_t>(std::min(end, c0 + chunk_) - c0); };
  std::vector<CopyToken> down(static_cast<size_t>(S)), up(static_cast<size_t>(chunks));
  // Starts chunk i's gradients down into its staging buffer, once the
  // weights that last went up from that buffer have left it.
  const auto fetch = [&](int64_t i) {
    const int64_t c0 = begin + i * chunk_;
    if (bf16 && i >= S) dev.wait(up[static_cast<size_t>(i - S)]);
    down[static_cast<size_t>(i % S)] = dev.to_host_async(stage_[i % S].data(), grads + c0, bytes(c0));
  };
  fetch(0);
  size_t k = 0;  // the first view that may overlap the chunk
  for (int64_t i = 0; i < chunks; ++i) {
    const int64_t c0 = begin + i * chunk_, c1 = std::min(end, c0 + chunk_);
    if (i + 1 < chunks) fetch(i + 1);
    dev.wait(down[static_cast<size_t>(i % S)]);
    float* g = stage_[i % S].data();  // the chunk's gradients: arena element j is g[j - c0]
    for (; k < ranges_.size(); ++k) {
      const auto [off, n] = ranges_[k];
      if (off >= c1) break;
      const int64_t a = std::max(off, c0), b = std::min(off + n, c1);
      const float dk = decay_[k] ? s.decay : 1.0f;
      const int64_t l = a - begin;  // shard index of a
#pragma omp parallel for schedule(static) if (b - a >= parallel_min_work())
      for (int64_t j = 0; j < b - a; ++j) adamw_update(master[l + j], m[l + j], v[l + j], g[a - c0 + j], dk, s);
      if (off + n > c1) break;  // the view goes on into the next chunk
    }
    const float* w = master + (c0 - begin);
    if (bf16) {
      const int64_t l = c0 - begin;
#pragma omp parallel for schedule(static) if (c1 - c0 >= parallel_min_work())
      for (int64_t j = 0; j < c1 - c0; ++j) g[j] = round_bf16_hd(master[l + j]);
      w = g;
    }
    up[static_cast<size_t>(i)] = dev.from_host_async(params + c0, w, bytes(c0));
  }
  // The next forward reads the weights, the next step the staging buffers.
  for (CopyToken& t : up) dev.wait(t);
}

LrKind parse_lr_kind(std::string_view name) {
  if (name == "constant") return LrKind::constant;
  if (name == "cosine") return LrKind::cosine;
  if (name == "wsd") return LrKind::wsd;
  throw Error("optim.schedule: unknown schedule '" + std::string(name) + "' (expected constant, cosine or wsd)");
}

std::string_view lr_kind_name(LrKind kind) {
  switch (kind) {
    case LrKind::constant: return "constant";
    case LrKind::cosine: return "cosine";
    case LrKind::wsd: return "wsd";
  }
  return "?";
}

int64_t LrSchedule::decay_steps() const {
  return static_cast<int64_t>(std::ceil(decay_fraction * static_cast<double>(total) - 1e-9));
}

void LrSchedule::validate() const {
  if (!(peak >= 0) || !std::isfinite(peak)) throw Error("optim.lr must be a finite number >= 0");
  if (total <= 0) throw Error("train.steps must be positive (got " + std::to_string(total) + ")");
  if (warmup < 0) throw Error("optim.warmup_steps = " + std::to_string(warmup) + " must be >= 0");
  if (!(min_ratio >= 0 && min_ratio <= 1)) throw Error("optim.min_lr_ratio must be in [0, 1]");
  if (!(decay_fraction >= 0 && decay_fraction <= 1)) throw Error("optim.decay_fraction must be in [0, 1]");
  if (!(final_ratio >= 0 && final_ratio <= 1)) throw Error("optim.final_lr_ratio must be in [0, 1]");
}

double LrSchedule::at(int64_t step) const {
  const bool warming = warmup > 0 && step < warmup;
  const double ramp = warming ? static_cast<double>(step + 1) / static_cast<double>(warmup) : 1.0;
  if (warming && kind != LrKind::wsd) return peak * ramp;
  switch (kind) {
    case LrKind::constant: return peak;
    case LrKind::cosine: {
      // Megatron's form: the ratio runs from 0 right after warmup towards 1
      // at `total`, so the last step sits just above the floor.
      const double span = static_cast<double>(std::max<int64_t>(1, total - warmup));
      const double r = std::clamp(static_cast<double>(step - warmup) / span, 0.0, 1.0);
      const double lo = min_ratio * peak;
      return lo + (peak - lo) * 0.5 * (1.0 + std::cos(std::numbers::pi * r));
    }
    case LrKind::wsd: {
      // A run too short for both phases (a smoke test with --steps) gets
      // the product of the warmup ramp and the decay.
      const int64_t d = decay_steps();
      const int64_t start = total - d;
      if (d <= 0 || step < start) return peak * ramp;
      const double frac = std::min(1.0, static_cast<double>(step - start + 1) / static_cast<double>(d));
      return peak * ramp * (1.0 - (1.0 - final_ratio) * frac);
    }
  }
  return peak;
}

}  // namespace exmy::sim

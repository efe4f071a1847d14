#include "models/nemotron_h.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <numbers>

#include "formats/error.hpp"
#include "models/layers.hpp"
#include "models/mixer.hpp"

namespace exmy::models {

using sim::Buf;

namespace {

// Elements a block keeps for backward for batch x seqlen tokens: the
// pre-norm's output and 1/rms, and what its mixer keeps. allocate() lays out
// the same sizes, so the memory estimate is what the model allocates.
int64_t block_kept(const NemotronHConfig& c, char letter, int64_t B, int64_t T_) {
  const int64_t N = B * T_;
  return N * c.hidden_size + N + mixer_kind(letter).ops.kept(c, B, T_);
}

// The widest backward scratch of the mixers present: elements per token of
// each shared buffer, and the most any one mixer's kernels allocate.
MixerScratch scratch_widths(const NemotronHConfig& c, int64_t B, int64_t T_) {
  MixerScratch w;
  for (const MixerKind& k : mixer_kinds()) {
    if (!c.count_layers(k.letter)) continue;
    const MixerScratch s = k.ops.scratch(c, B, T_);
    if (w.per_token.size() < s.per_token.size()) w.per_token.resize(s.per_token.size(), 0);
    for (size_t i = 0; i < s.per_token.size(); ++i) w.per_token[i] = std::max(w.per_token[i], s.per_token[i]);
    w.inside = std::max(w.inside, s.inside);
  }
  return w;
}

// splitmix64: a small, well-mixed generator whose output is the same on
// every platform (std::normal_distribution is not).
struct Rng {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1p-53; }  // [0, 1)
  double normal() {  // Box-Muller
    const double u1 = 1.0 - uniform(), u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
  }
};

}  // namespace

template <class T>
struct NemotronH<T>::Block {
  int norm = -1;  // arena index of the pre-norm's weight
  std::unique_ptr<Mixer<T>> mixer;
  // The pre-norm's output and 1/rms, kept for backward: the block's own, or
  // (block recompute) those of the first block of its letter, whose mixer
  // it also shares its kept tensors with.
  struct Norm {
    sim::MemBuf<T> ln, rstd;
  };
  Kept<Norm> a;
};

template <class T>
NemotronH<T>::NemotronH(const NemotronHConfig& cfg, const sim::LinearFactory<T>& factory, Backend<T>& be)
    : cfg_(cfg), be_(&be) {
  validate(cfg_);
  sim::ArenaLayout layout = make_layout(cfg_);
  const int64_t C = cfg_.hidden_size;
  auto idx = [&](const std::string& name) { return layout.find(name); };
  wte_ = idx("embeddings.weight");
  for (int64_t i = 0; i < cfg_.num_hidden_layers; ++i) {
    auto blk = std::make_unique<Block>();
    const std::string p = "layers." + std::to_string(i) + ".";
    blk->norm = idx(p + "norm.weight");
    const MixerBuilder<T> mb{cfg_,   layout, factory, linears_, be, cfg_.hybrid_override_pattern[static_cast<size_t>(i)],
                             static_cast<int>(i), p + "mixer."};
    blk->mixer = make_mixer(mb.letter, mb);
    blocks_.push_back(std::move(blk));
  }
  norm_f_ = idx("norm_f.weight");
  // The LM head is made as a mixer makes its linears, with no name prefix.
  const MixerBuilder<T> head{cfg_, layout, factory, linears_, be, 0, static_cast<int>(cfg_.num_hidden_layers), ""};
  const MixerLinear<T> lm = head.linear(sim::LinearKind::lm_head, "lm_head", C, cfg_.vocab_size);
  lm_head_ = lm.op;
  lm_head_w_ = lm.w;
  arena_ = sim::ParamArena<T>(std::move(layout), be.memory());
}

template <class T>
NemotronH<T>::~NemotronH() = default;

template <class T>
void NemotronH<T>::set_recompute(bool on) {
  if (on == recompute_) return;
  recompute_ = on;
  B_ = T_ = 0;  // the next forward lays the buffers out again
}

template <class T>
void NemotronH<T>::init_weights(uint64_t seed) {
  const auto& views = arena_.layout().views();
  const double std_ = cfg_.initializer_range;
  sim::Memory& mem = arena_.memory();
  Buf<T> staging;  // a parameter's values on the host, for an arena that is not
  for (size_t i = 0; i < views.size(); ++i) {
    const sim::ParamView& v = views[i];
    Rng rng{seed ^ (0x632be59bd9b4e019ull * (i + 1))};
    if (!mem.on_host()) staging.resize(static_cast<size_t>(v.numel));
    T* p = mem.on_host() ? arena_.param(static_cast<int>(i)) : staging.data();
    const auto init = static_cast<ParamInit>(v.init);  // declared with the parameter (make_layout, add_params)
    if (init == ParamInit::ones) {
      std::fill_n(p, v.numel, T(1));
    } else if (init == ParamInit::a_log) {
      for (int64_t h = 0; h < v.numel; ++h) p[h] = static_cast<T>(std::log(static_cast<double>(h + 1)));
    } else if (init == ParamInit::dt_bias) {
      const double lo = std::log(cfg_.time_step_min), hi = std::log(cfg_.time_step_max);
      for (int64_t h = 0; h < v.numel; ++h) {
        const double dt = std::max(std::exp(rng.uniform() * (hi - lo) + lo), cfg_.time_step_floor);
        p[h] = static_cast<T>(dt + std::log(-std::expm1(-dt)));  // softplus^-1
      }
    } else if (init == ParamInit::conv_uniform) {
      // PyTorch's Conv1d default: U(-1/sqrt(fan_in), 1/sqrt(fan_in)), fan_in = kernel (depthwise).
      const double bound = 1.0 / std::sqrt(static_cast<double>(cfg_.conv_kernel));
      for (int64_t j = 0; j < v.numel; ++j) p[j] = static_cast<T>((2 * rng.uniform() - 1) * bound);
    } else if (init == ParamInit::rescaled_out && cfg_.rescale_prenorm_residual) {
      // kaiming_uniform(a=sqrt(5)) is U(-1/sqrt(fan_in), 1/sqrt(fan_in)); HF then
      // divides by sqrt(num_hidden_layers).
      const double bound = 1.0 / std::sqrt(static_cast<double>(v.shape[1])) /
                           std::sqrt(static_cast<double>(cfg_.num_hidden_layers));
      for (int64_t j = 0; j < v.numel; ++j) p[j] = static_cast<T>((2 * rng.uniform() - 1) * bound);
    } else {
      for (int64_t j = 0; j < v.numel; ++j) p[j] = static_cast<T>(rng.normal() * std_);
    }
    if (!mem.on_host()) mem.from_host(arena_.param(static_cast<int>(i)), p, static_cast<size_t>(v.numel) * sizeof(T));
  }
}

template <class T>
void NemotronH<T>::allocate(int64_t B, int64_t seq) {
  if (B == B_ && seq == T_) return;
  B_ = B;
  T_ = seq;
  const int64_t N = B * seq, C = cfg_.hidden_size, L = cfg_.num_hidden_layers;
  sim::Memory& mem = be_->memory();
  auto sz = [&](sim::MemBuf<T>& b, int64_t n) { b.place(mem), b.resize_zero(n); };
  sz(resid_, (L + 1) * N * C);
  // Block recompute: the blocks of a letter share the first one's kept tensors.
  std::array<Block*, 256> first{};
  for (auto& bp : blocks_) {
    Block& b = *bp;
    Block*& owner = first[static_cast<unsigned char>(b.mixer->letter())];
    Block* share = recompute_ && owner ? owner : nullptr;
    if (!owner) owner = &b;
    if (b.a.share(share ? &share->a : nullptr)) sz(b.a->ln, N * C), sz(b.a->rstd, N);
    b.mixer->allocate(B, seq, share ? share->mixer.get() : nullptr);
  }
  sz(lnf_, N * C), sz(rstdf_, N), sz(logits_, N * cfg_.vocab_size);
  losses_.assign(static_cast<size_t>(N), 0.0);
  sz(mix_out_, N * C);
  sz(dresid_, N * C), sz(dln_, N * C), sz(dlnf_, N * C), sz(dlogits_, N * cfg_.vocab_size);
  const MixerScratch w = scratch_widths(cfg_, B, seq);
  scratch_.resize(w.per_token.size());
  for (size_t i = 0; i < w.per_token.size(); ++i) sz(scratch_[i], N * w.per_token[i]);
}

template <class T>
double NemotronH<T>::forward(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T_in) {
  if (B <= 0 || T_in <= 0) throw Error("forward: batch and sequence length must be positive");
  const int64_t N = B * T_in, C = cfg_.hidden_size, V = cfg_.vocab_size;
  for (int64_t n = 0; n < N; ++n) {
    if (tokens[n] < 0 || tokens[n] >= V)
      throw Error("token " + std::to_string(tokens[n]) + " at position " + std::to_string(n) +
                  " is outside the vocabulary [0, " + std::to_string(V) + ")");
    if (targets && targets[n] >= V)
      throw Error("target " + std::to_string(targets[n]) + " at position " + std::to_string(n) +
                  " is outside the vocabulary [0, " + std::to_string(V) + ")");
  }
  allocate(B, T_in);
  tokens_.assign(tokens, tokens + N);
  if (targets) targets_.assign(targets, targets + N);
  else targets_.assign(static_cast<size_t>(N), -1);
  const double eps = cfg_.layer_norm_epsilon;
  auto W = [&](int i) { return arena_.param(i); };
  // A tensor a BF16 trainer keeps in BF16 (see set_bf16_activations).
  auto act = [&](T* p, int64_t n) {
    if (bf16_act_) be_->round_bf16(p, n);
  };
  const bool bf16_resid = bf16_act_ && !cfg_.residual_in_fp32;

  be_->embedding_forward(resid(0), tokens_.data(), W(wte_), N, C);
  if (bf16_resid) be_->round_bf16(resid(0), N * C);
  for (int64_t l = 0; l < cfg_.num_hidden_layers; ++l) block_forward(l, false);
  be_->rmsnorm_forward(lnf_.data(), rstdf_.data(), resid(cfg_.num_hidden_layers), W(norm_f_), N, C, eps);
  act(lnf_.data(), N * C);
  lm_head_->forward(logits_.data(), lnf_.data(), W(lm_head_w_), N);
  act(logits_.data(), N * V);
  counted_ = 0;
  if (!targets) {
    std::fill(losses_.begin(), losses_.end(), 0.0);
    return 0.0;
  }
  return be_->cross_entropy_forward(losses_.data(), &counted_, logits_.data(), targets_.data(), N, V);
}

// Block l of the forward from resid(l): its kept tensors, then (unless
// `again`) its output added into resid(l + 1). With `again` (block
// recompute, from backward) the linears run through recompute_forward, and
// the block's output projection and residual add are skipped: backward
// needs only what the block keeps.
template <class T>
void NemotronH<T>::block_forward(int64_t l, bool again) {
  const int64_t N = B_ * T_, C = cfg_.hidden_size;
  const bool bf16_resid = bf16_act_ && !cfg_.residual_in_fp32;
  Block& b = *blocks_[static_cast<size_t>(l)];
  const MixerRun run = MixerRun{B_, T_, bf16_act_, again};
  const T* x = resid(l);
  be_->rmsnorm_forward(b.a->ln.data(), b.a->rstd.data(), x, arena_.param(b.norm), N, C, cfg_.layer_norm_epsilon);
  keep_bf16(*be_, run, b.a->ln.data(), N * C);
  b.mixer->forward(again ? nullptr : mix_out_.data(), b.a->ln.data(), arena_, run);
  if (again) return;
  keep_bf16(*be_, run, mix_out_.data(), N * C);
  be_->add_forward(resid(l + 1), x, mix_out_.data(), N * C);
  if (bf16_resid) be_->round_bf16(resid(l + 1), N * C);
}

template <class T>
void NemotronH<T>::backward() {
  if (B_ == 0) throw Error("backward called before forward");
  const int64_t N = B_ * T_, C = cfg_.hidden_size, V = cfg_.vocab_size;
  auto W = [&](int i) { return arena_.param(i); };
  auto G = [&](int i) { return arena_.grad(i); };
  auto zero = [&](sim::MemBuf<T>& b, int64_t n) { be_->zero(b.data(), n); };

  // Loss and head.
  zero(dlogits_, N * V);
  if (counted_ > 0)
    be_->cross_entropy_backward(dlogits_.data(), logits_.data(), targets_.data(), N, V, 1.0 / static_cast<double>(counted_));
  zero(dlnf_, N * C);
  lm_head_->backward(dlnf_.data(), G(lm_head_w_), dlogits_.data(), lnf_.data(), W(lm_head_w_), N);
  zero(dresid_, N * C);
  be_->rmsnorm_backward(dresid_.data(), G(norm_f_), dlnf_.data(), resid(cfg_.num_hidden_layers), W(norm_f_), rstdf_.data(),
                   N, C);

  // Blocks, last first. dresid_ holds the gradient of the residual stream
  // leaving the block, which is also the gradient of the mixer output; the
  // norm's backward then adds the mixer path into it in place.
  for (int64_t l = cfg_.num_hidden_layers - 1; l >= 0; --l) {
    Block& b = *blocks_[static_cast<size_t>(l)];
    if (recompute_) block_forward(l, true);  // the block's kept tensors, again
    const typename Block::Norm& a = *b.a;
    zero(dln_, N * C);
    b.mixer->backward(dln_.data(), arena_, dresid_.data(), a.ln.data(), scratch_, MixerRun{B_, T_, bf16_act_, false});
    be_->rmsnorm_backward(dresid_.data(), G(b.norm), dln_.data(), resid(l), W(b.norm), a.rstd.data(), N, C);
  }
  be_->embedding_backward(G(wte_), dresid_.data(), tokens_.data(), N, C);
}

ActivationBytes activation_bytes(const NemotronHConfig& cfg, int64_t B, int64_t T_, int64_t scalar_bytes,
                                 bool recompute) {
  const int64_t N = B * T_, C = cfg.hidden_size, V = cfg.vocab_size;
  double kept = static_cast<double>((cfg.num_hidden_layers + 1) * N * C);  // residual stream
  if (recompute) {  // one block of each type present
    for (const MixerKind& k : mixer_kinds())
      if (cfg.count_layers(k.letter)) kept += static_cast<double>(block_kept(cfg, k.letter, B, T_));
  } else {
    for (char t : cfg.hybrid_override_pattern) kept += static_cast<double>(block_kept(cfg, t, B, T_));
  }
  kept += static_cast<double>(N * C + N + N * V);  // final norm, logits
  const MixerScratch w = scratch_widths(cfg, B, T_);
  double scratch = static_cast<double>(N * C * 4 + N * V);  // mix_out, dresid, dln, dlnf, dlogits
  for (int64_t x : w.per_token) scratch += static_cast<double>(N * x);
  // What the mixers' kernels allocate on a CUDA device (the SSD thread kernels',
  // attention's row kernels'), one layer at a time.
  scratch += static_cast<double>(w.inside);
  ActivationBytes a;
  a.kept = kept * static_cast<double>(scalar_bytes) + static_cast<double>(N) * 8.0;  // + FP64 token losses
  a.scratch = scratch * static_cast<double>(scalar_bytes);
  return a;
}

std::vector<sim::LinearInfo> linear_infos(const NemotronHConfig& cfg) {
  std::vector<sim::LinearInfo> out;
  const std::string suffix = ".weight";
  const sim::ArenaLayout layout = make_layout(cfg);
  for (const sim::ParamView& v : layout.views()) {
    if (v.shape.size() != 2 || !v.name.ends_with(suffix)) continue;
    const std::string name = v.name.substr(0, v.name.size() - suffix.size());
    const std::string module = name.substr(name.rfind('.') + 1);
    for (int k = 0; k <= static_cast<int>(sim::LinearKind::lm_head); ++k) {
      const auto kind = static_cast<sim::LinearKind>(k);
      if (sim::linear_kind_name(kind) != module) continue;
      sim::LinearInfo info;
      info.name = name;
      info.kind = kind;
      info.layer = kind == sim::LinearKind::lm_head ? static_cast<int>(cfg.num_hidden_layers)
                                                    : std::stoi(name.substr(name.find('.') + 1));
      info.out_features = v.shape[0];
      info.in_features = v.shape[1];
      out.push_back(info);
    }
  }
  return out;
}

MemoryEstimate training_memory(const NemotronHConfig& cfg, int64_t batch, int64_t seq_len, bool recompute) {
  const sim::ArenaLayout layout = make_layout(cfg);
  const double arena = static_cast<double>(layout.size()) * 4.0;
  MemoryEstimate m;
  m.params = arena;         // FP32 master weights
  m.grads = arena;          // FP32 gradients
  m.optimizer = 2 * arena;  // AdamW first and second moments
  const ActivationBytes a = activation_bytes(cfg, batch, seq_len, 4, recompute);
  m.activations = a.kept;
  m.workspace = a.scratch;
  return m;
}

template class NemotronH<float>;
template class NemotronH<double>;

}  // namespace exmy::models

#include "models/nemotron_h.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "formats/error.hpp"
#include "models/attention.hpp"
#include "models/layers.hpp"
#include "models/ssd.hpp"

namespace exmy::models {

using sim::Buf;
using sim::LinearInfo;
using sim::LinearKind;

namespace {

// Sizes (elements) of what a block keeps for backward, for N = B*T tokens.
// allocate() and activation_bytes() both read this, so the memory estimate
// is what the model allocates.
struct BlockSizes {
  int64_t ln = 0, rstd = 0;
  int64_t zxbcdt = 0, xbc = 0, dt = 0, acs = 0, states = 0, y = 0, gn = 0, gn_rstd = 0;  // Mamba
  int64_t q = 0, k = 0, v = 0, o = 0, lse = 0;                                            // attention
  int64_t up = 0, act = 0;                                                                // MLP
  int64_t total() const { return ln + rstd + zxbcdt + xbc + dt + acs + states + y + gn + gn_rstd + q + k + v + o + lse + up + act; }
};

SsdDims ssd_dims(const NemotronHConfig& c, int64_t B, int64_t T_) {
  SsdDims d;
  d.batch = B;
  d.seqlen = T_;
  d.heads = c.mamba_num_heads;
  d.head_dim = c.mamba_head_dim;
  d.groups = c.n_groups;
  d.state = c.ssm_state_size;
  d.chunk = c.chunk_size;
  return d;
}

AttnDims attn_dims(const NemotronHConfig& c, int64_t B, int64_t T_) {
  AttnDims d;
  d.batch = B;
  d.seqlen = T_;
  d.q_heads = c.num_attention_heads;
  d.kv_heads = c.num_key_value_heads;
  d.head_dim = c.head_dim;
  return d;
}

BlockSizes block_sizes(const NemotronHConfig& c, char type, int64_t B, int64_t T_) {
  const int64_t N = B * T_;
  BlockSizes s;
  s.ln = N * c.hidden_size;
  s.rstd = N;
  if (type == 'M') {
    const SsdDims d = ssd_dims(c, B, T_);
    s.zxbcdt = N * c.mamba_in_proj_dim();
    s.xbc = N * c.mamba_conv_dim();
    s.dt = N * c.mamba_num_heads;
    s.acs = d.acs_size();
    s.states = d.states_size();
    s.y = N * c.mamba_d_inner();
    s.gn = N * c.mamba_d_inner();
    s.gn_rstd = N * c.n_groups;
  } else if (type == '*') {
    s.q = N * c.attn_q_dim();
    s.k = N * c.attn_kv_dim();
    s.v = N * c.attn_kv_dim();
    s.o = N * c.attn_q_dim();
    s.lse = N * c.num_attention_heads;
  } else {
    s.up = N * c.intermediate_size;
    s.act = N * c.intermediate_size;
  }
  return s;
}

// Backward scratch (elements per token) of the five shared buffers d_a..d_e:
//   Mamba:     d_a dgn (D_in), d_b dy (D_in), d_c dzxbcdt (in_proj), d_d dxBC (conv), d_e ddt (heads)
//   attention: d_a do (q),     d_b dq (q),    d_c dk (kv),           d_d dv (kv)
//   MLP:       d_a dact (I),   d_b dup (I)
std::array<int64_t, 5> scratch_widths(const NemotronHConfig& c) {
  std::array<int64_t, 5> w{};
  auto grow = [&](int i, int64_t v) { w[static_cast<size_t>(i)] = std::max(w[static_cast<size_t>(i)], v); };
  if (c.count_layers('M')) {
    grow(0, c.mamba_d_inner());
    grow(1, c.mamba_d_inner());
    grow(2, c.mamba_in_proj_dim());
    grow(3, c.mamba_conv_dim());
    grow(4, c.mamba_num_heads);
  }
  if (c.count_layers('*')) {
    grow(0, c.attn_q_dim());
    grow(1, c.attn_q_dim());
    grow(2, c.attn_kv_dim());
    grow(3, c.attn_kv_dim());
  }
  if (c.count_layers('-')) {
    grow(0, c.intermediate_size);
    grow(1, c.intermediate_size);
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

// The activations one block keeps for backward (sizes: block_sizes).
template <class T>
struct NemotronH<T>::Acts {
  Buf<T> ln, rstd;
  Buf<T> zxbcdt, xbc, dt, acs, states, y, gn, gn_rstd;  // Mamba
  Buf<T> q, k, v, o, lse;                               // attention
  Buf<T> up, act;                                       // MLP
};

template <class T>
struct NemotronH<T>::Block {
  char type = 'M';
  int norm = -1;
  // Mamba parameters (arena indices).
  int conv_w = -1, conv_b = -1, dt_bias = -1, A_log = -1, D = -1, gnorm = -1;
  // The block's linears, each with the arena index of its weight (the ones
  // of the block's mixer are set): Mamba in_proj and out_proj, attention
  // q/k/v/o, MLP up and down.
  struct Lin {
    sim::Linear<T>* op = nullptr;
    int w = -1;
  };
  Lin in_proj, out_proj;  // Mamba
  Lin q_proj, k_proj, v_proj, o_proj;  // attention
  Lin up_proj, down_proj;  // MLP
  // What the block keeps for backward: its own buffers, or (block
  // recompute) those its type shares with the other blocks of that type.
  Acts own;
  Acts* a = &own;
};

template <class T>
NemotronH<T>::NemotronH(const NemotronHConfig& cfg, const sim::LinearFactory<T>& factory) : cfg_(cfg) {
  validate(cfg_);
  sim::ArenaLayout layout = make_layout(cfg_);
  const int64_t C = cfg_.hidden_size;
  auto idx = [&](const std::string& name) { return layout.find(name); };
  auto add_linear = [&](typename Block::Lin& l, int layer, LinearKind kind, const std::string& name, int64_t in,
                        int64_t out) {
    LinearInfo info;
    info.name = name;
    info.layer = layer;
    info.kind = kind;
    info.in_features = in;
    info.out_features = out;
    linears_.push_back(factory.make(info));
    l.op = linears_.back().get();
    l.w = idx(name + ".weight");
  };
  wte_ = idx("embeddings.weight");
  for (int64_t i = 0; i < cfg_.num_hidden_layers; ++i) {
    auto blk = std::make_unique<Block>();
    const std::string p = "layers." + std::to_string(i) + ".";
    const int layer = static_cast<int>(i);
    blk->type = cfg_.hybrid_override_pattern[static_cast<size_t>(i)];
    blk->norm = idx(p + "norm.weight");
    if (blk->type == 'M') {
      add_linear(blk->in_proj, layer, LinearKind::mamba_in_proj, p + "mixer.in_proj", C, cfg_.mamba_in_proj_dim());
      add_linear(blk->out_proj, layer, LinearKind::mamba_out_proj, p + "mixer.out_proj", cfg_.mamba_d_inner(), C);
      blk->conv_w = idx(p + "mixer.conv1d.weight");
      blk->conv_b = idx(p + "mixer.conv1d.bias");  // -1 without use_conv_bias
      blk->dt_bias = idx(p + "mixer.dt_bias");
      blk->A_log = idx(p + "mixer.A_log");
      blk->D = idx(p + "mixer.D");
      blk->gnorm = idx(p + "mixer.norm.weight");
    } else if (blk->type == '*') {
      add_linear(blk->q_proj, layer, LinearKind::attn_q, p + "mixer.q_proj", C, cfg_.attn_q_dim());
      add_linear(blk->k_proj, layer, LinearKind::attn_k, p + "mixer.k_proj", C, cfg_.attn_kv_dim());
      add_linear(blk->v_proj, layer, LinearKind::attn_v, p + "mixer.v_proj", C, cfg_.attn_kv_dim());
      add_linear(blk->o_proj, layer, LinearKind::attn_o, p + "mixer.o_proj", cfg_.attn_q_dim(), C);
    } else {
      add_linear(blk->up_proj, layer, LinearKind::mlp_up, p + "mixer.up_proj", C, cfg_.intermediate_size);
      add_linear(blk->down_proj, layer, LinearKind::mlp_down, p + "mixer.down_proj", cfg_.intermediate_size, C);
    }
    blocks_.push_back(std::move(blk));
  }
  norm_f_ = idx("norm_f.weight");
  {
    LinearInfo info;
    info.name = "lm_head";
    info.layer = static_cast<int>(cfg_.num_hidden_layers);
    info.kind = LinearKind::lm_head;
    info.in_features = C;
    info.out_features = cfg_.vocab_size;
    linears_.push_back(factory.make(info));
    lm_head_ = linears_.back().get();
    lm_head_w_ = idx("lm_head.weight");
  }
  arena_ = sim::ParamArena<T>(std::move(layout));
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
  for (size_t i = 0; i < views.size(); ++i) {
    const sim::ParamView& v = views[i];
    Rng rng{seed ^ (0x632be59bd9b4e019ull * (i + 1))};
    T* p = arena_.param(static_cast<int>(i));
    const auto ends = [&](const char* suffix) { return v.name.ends_with(suffix); };
    if (ends("norm.weight") || ends("norm_f.weight") || ends("mixer.D")) {
      std::fill_n(p, v.numel, T(1));
    } else if (ends("mixer.A_log")) {
      for (int64_t h = 0; h < v.numel; ++h) p[h] = static_cast<T>(std::log(static_cast<double>(h + 1)));
    } else if (ends("mixer.dt_bias")) {
      const double lo = std::log(cfg_.time_step_min), hi = std::log(cfg_.time_step_max);
      for (int64_t h = 0; h < v.numel; ++h) {
        const double dt = std::max(std::exp(rng.uniform() * (hi - lo) + lo), cfg_.time_step_floor);
        p[h] = static_cast<T>(dt + std::log(-std::expm1(-dt)));  // softplus^-1
      }
    } else if (ends("conv1d.weight") || ends("conv1d.bias")) {
      // PyTorch's Conv1d default: U(-1/sqrt(fan_in), 1/sqrt(fan_in)), fan_in = kernel (depthwise).
      const double bound = 1.0 / std::sqrt(static_cast<double>(cfg_.conv_kernel));
      for (int64_t j = 0; j < v.numel; ++j) p[j] = static_cast<T>((2 * rng.uniform() - 1) * bound);
    } else if (ends("mixer.out_proj.weight") && cfg_.rescale_prenorm_residual) {
      // kaiming_uniform(a=sqrt(5)) is U(-1/sqrt(fan_in), 1/sqrt(fan_in)); HF then
      // divides by sqrt(num_hidden_layers).
      const double bound = 1.0 / std::sqrt(static_cast<double>(v.shape[1])) /
                           std::sqrt(static_cast<double>(cfg_.num_hidden_layers));
      for (int64_t j = 0; j < v.numel; ++j) p[j] = static_cast<T>((2 * rng.uniform() - 1) * bound);
    } else {
      for (int64_t j = 0; j < v.numel; ++j) p[j] = static_cast<T>(rng.normal() * std_);
    }
  }
}

template <class T>
void NemotronH<T>::allocate(int64_t B, int64_t seq) {
  if (B == B_ && seq == T_) return;
  B_ = B;
  T_ = seq;
  const int64_t N = B * seq, C = cfg_.hidden_size, L = cfg_.num_hidden_layers;
  auto sz = [](Buf<T>& b, int64_t n) { b.assign(static_cast<size_t>(n), T(0)); };
  sz(resid_, (L + 1) * N * C);
  auto size_acts = [&](Acts& a, char type) {
    const BlockSizes s = block_sizes(cfg_, type, B, seq);
    sz(a.ln, s.ln), sz(a.rstd, s.rstd);
    sz(a.zxbcdt, s.zxbcdt), sz(a.xbc, s.xbc), sz(a.dt, s.dt), sz(a.acs, s.acs), sz(a.states, s.states);
    sz(a.y, s.y), sz(a.gn, s.gn), sz(a.gn_rstd, s.gn_rstd);
    sz(a.q, s.q), sz(a.k, s.k), sz(a.v, s.v), sz(a.o, s.o), sz(a.lse, s.lse);
    sz(a.up, s.up), sz(a.act, s.act);
  };
  // Block recompute: one set of buffers per block type (M, *, -), shared.
  shared_.clear();
  for (auto& bp : blocks_) {
    Block& b = *bp;
    if (!recompute_) {
      b.a = &b.own;
      size_acts(b.own, b.type);
      continue;
    }
    b.own = Acts{};
    const int t = b.type == 'M' ? 0 : b.type == '*' ? 1 : 2;
    if (shared_.size() < 3) shared_.resize(3);
    if (!shared_[static_cast<size_t>(t)]) {
      shared_[static_cast<size_t>(t)] = std::make_unique<Acts>();
      size_acts(*shared_[static_cast<size_t>(t)], b.type);
    }
    b.a = shared_[static_cast<size_t>(t)].get();
  }
  sz(lnf_, N * C), sz(rstdf_, N), sz(logits_, N * cfg_.vocab_size);
  losses_.assign(static_cast<size_t>(N), 0.0);
  sz(mix_out_, N * C);
  sz(dresid_, N * C), sz(dln_, N * C), sz(dlnf_, N * C), sz(dlogits_, N * cfg_.vocab_size);
  const auto w = scratch_widths(cfg_);
  sz(d_a_, N * w[0]), sz(d_b_, N * w[1]), sz(d_c_, N * w[2]), sz(d_d_, N * w[3]), sz(d_e_, N * w[4]);
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
    if (bf16_act_) sim::round_bf16(p, p, n);
  };
  const bool bf16_resid = bf16_act_ && !cfg_.residual_in_fp32;

  embedding_forward(resid(0), tokens_.data(), W(wte_), N, C);
  if (bf16_resid) sim::round_bf16(resid(0), resid(0), N * C);
  for (int64_t l = 0; l < cfg_.num_hidden_layers; ++l) block_forward(l, false);
  rmsnorm_forward(lnf_.data(), rstdf_.data(), resid(cfg_.num_hidden_layers), W(norm_f_), N, C, eps);
  act(lnf_.data(), N * C);
  lm_head_->forward(logits_.data(), lnf_.data(), W(lm_head_w_), N);
  act(logits_.data(), N * V);
  counted_ = 0;
  if (!targets) {
    std::fill(losses_.begin(), losses_.end(), 0.0);
    return 0.0;
  }
  return cross_entropy_forward(losses_.data(), &counted_, logits_.data(), targets_.data(), N, V);
}

// Block l of the forward from resid(l): its kept tensors, then (unless
// `again`) its output added into resid(l + 1). With `again` (block
// recompute, from backward) the linears run through recompute_forward, and
// the block's output projection and residual add are skipped: backward
// needs only what the block keeps.
template <class T>
void NemotronH<T>::block_forward(int64_t l, bool again) {
  const int64_t B = B_, T_in = T_, N = B_ * T_, C = cfg_.hidden_size;
  const double eps = cfg_.layer_norm_epsilon;
  auto W = [&](int i) { return arena_.param(i); };
  auto act = [&](T* p, int64_t n) {
    if (bf16_act_) sim::round_bf16(p, p, n);
  };
  const bool bf16_resid = bf16_act_ && !cfg_.residual_in_fp32;
  auto fwd = [&](sim::Linear<T>* lin, T* Y, const T* X, const T* Wt) {
    if (again) lin->recompute_forward(Y, X, Wt, N);
    else lin->forward(Y, X, Wt, N);
  };
  Block& b = *blocks_[static_cast<size_t>(l)];
  Acts& a = *b.a;
  const T* x = resid(l);
  rmsnorm_forward(a.ln.data(), a.rstd.data(), x, W(b.norm), N, C, eps);
  act(a.ln.data(), N * C);
  if (b.type == 'M') {
    // in_proj output rows: [ z (D_in) | x B C (conv_dim) | dt (heads) ]
    const int64_t Din = cfg_.mamba_d_inner(), conv = cfg_.mamba_conv_dim(), ld = cfg_.mamba_in_proj_dim();
    const int64_t GN = cfg_.n_groups * cfg_.ssm_state_size;
    fwd(b.in_proj.op, a.zxbcdt.data(), a.ln.data(), W(b.in_proj.w));
    act(a.zxbcdt.data(), N * ld);
    const T* z = a.zxbcdt.data();
    const T* xbc_raw = z + Din;
    const T* dt_raw = z + Din + conv;
    conv1d_silu_forward(a.xbc.data(), xbc_raw, ld, W(b.conv_w), b.conv_b >= 0 ? W(b.conv_b) : nullptr, B, T_in,
                        conv, cfg_.conv_kernel);
    act(a.xbc.data(), N * conv);
    mamba_dt_forward(a.dt.data(), dt_raw, ld, W(b.dt_bias), N, cfg_.mamba_num_heads, cfg_.time_step_limit[0],
                     cfg_.time_step_limit[1]);
    const T* xs = a.xbc.data();
    ssd_chunk_scan_forward(a.y.data(), a.acs.data(), a.states.data(), xs, conv, xs + Din, xs + Din + GN, conv,
                           a.dt.data(), W(b.A_log), W(b.D), ssd_dims(cfg_, B, T_in));
    act(a.y.data(), N * Din);
    gated_rmsnorm_forward(a.gn.data(), a.gn_rstd.data(), a.y.data(), Din, z, ld, W(b.gnorm), N, Din,
                          cfg_.n_groups, eps);
    act(a.gn.data(), N * Din);
    if (again) return;
    b.out_proj.op->forward(mix_out_.data(), a.gn.data(), W(b.out_proj.w), N);
  } else if (b.type == '*') {
    fwd(b.q_proj.op, a.q.data(), a.ln.data(), W(b.q_proj.w));
    fwd(b.k_proj.op, a.k.data(), a.ln.data(), W(b.k_proj.w));
    fwd(b.v_proj.op, a.v.data(), a.ln.data(), W(b.v_proj.w));
    act(a.q.data(), N * cfg_.attn_q_dim());
    act(a.k.data(), N * cfg_.attn_kv_dim());
    act(a.v.data(), N * cfg_.attn_kv_dim());
    attention_forward(a.o.data(), a.lse.data(), a.q.data(), a.k.data(), a.v.data(), attn_dims(cfg_, B, T_in));
    act(a.o.data(), N * cfg_.attn_q_dim());
    if (again) return;
    b.o_proj.op->forward(mix_out_.data(), a.o.data(), W(b.o_proj.w), N);
  } else {
    fwd(b.up_proj.op, a.up.data(), a.ln.data(), W(b.up_proj.w));
    act(a.up.data(), N * cfg_.intermediate_size);
    relu2_forward(a.act.data(), a.up.data(), N * cfg_.intermediate_size);
    act(a.act.data(), N * cfg_.intermediate_size);
    if (again) return;
    b.down_proj.op->forward(mix_out_.data(), a.act.data(), W(b.down_proj.w), N);
  }
  act(mix_out_.data(), N * C);
  add_forward(resid(l + 1), x, mix_out_.data(), N * C);
  if (bf16_resid) sim::round_bf16(resid(l + 1), resid(l + 1), N * C);
}

template <class T>
void NemotronH<T>::backward() {
  if (B_ == 0) throw Error("backward called before forward");
  const int64_t B = B_, N = B_ * T_, C = cfg_.hidden_size, V = cfg_.vocab_size;
  auto W = [&](int i) { return arena_.param(i); };
  auto G = [&](int i) { return arena_.grad(i); };
  auto zero = [](Buf<T>& b, int64_t n) { sim::zero(b.data(), n); };

  // Loss and head.
  zero(dlogits_, N * V);
  if (counted_ > 0)
    cross_entropy_backward(dlogits_.data(), logits_.data(), targets_.data(), N, V, 1.0 / static_cast<double>(counted_));
  zero(dlnf_, N * C);
  lm_head_->backward(dlnf_.data(), G(lm_head_w_), dlogits_.data(), lnf_.data(), W(lm_head_w_), N);
  zero(dresid_, N * C);
  rmsnorm_backward(dresid_.data(), G(norm_f_), dlnf_.data(), resid(cfg_.num_hidden_layers), W(norm_f_), rstdf_.data(),
                   N, C);

  // Blocks, last first. dresid_ holds the gradient of the residual stream
  // leaving the block, which is also the gradient of the mixer output; the
  // norm's backward then adds the mixer path into it in place.
  for (int64_t l = cfg_.num_hidden_layers - 1; l >= 0; --l) {
    Block& b = *blocks_[static_cast<size_t>(l)];
    if (recompute_) block_forward(l, true);  // the block's kept tensors, again
    const Acts& a = *b.a;
    const T* dout = dresid_.data();
    zero(dln_, N * C);
    if (b.type == 'M') {
      const int64_t Din = cfg_.mamba_d_inner(), conv = cfg_.mamba_conv_dim(), ld = cfg_.mamba_in_proj_dim();
      const int64_t GN = cfg_.n_groups * cfg_.ssm_state_size, H = cfg_.mamba_num_heads;
      T* dgn = d_a_.data();
      T* dy = d_b_.data();
      T* dz = d_c_.data();  // (N, in_proj) : [dz | dxBC_raw | ddt_raw]
      T* dxbc = d_d_.data();
      T* ddt = d_e_.data();
      zero(d_a_, N * Din), zero(d_b_, N * Din), zero(d_c_, N * ld), zero(d_d_, N * conv), zero(d_e_, N * H);
      b.out_proj.op->backward(dgn, G(b.out_proj.w), dout, a.gn.data(), W(b.out_proj.w), N);
      const T* z = a.zxbcdt.data();
      gated_rmsnorm_backward(dy, Din, dz, ld, G(b.gnorm), dgn, a.y.data(), Din, z, ld, W(b.gnorm), a.gn_rstd.data(), N,
                             Din, cfg_.n_groups);
      const T* xs = a.xbc.data();
      ssd_chunk_scan_backward(dxbc, dxbc + Din, dxbc + Din + GN, ddt, G(b.A_log), G(b.D), dy, xs, conv, xs + Din,
                              xs + Din + GN, conv, a.dt.data(), W(b.A_log), W(b.D), a.acs.data(), a.states.data(),
                              ssd_dims(cfg_, B, T_));
      mamba_dt_backward(dz + Din + conv, ld, G(b.dt_bias), ddt, z + Din + conv, W(b.dt_bias), N, H,
                        cfg_.time_step_limit[0], cfg_.time_step_limit[1]);
      conv1d_silu_backward(dz + Din, ld, G(b.conv_w), b.conv_b >= 0 ? G(b.conv_b) : nullptr, dxbc, z + Din, ld,
                           W(b.conv_w), b.conv_b >= 0 ? W(b.conv_b) : nullptr, B, T_, conv, cfg_.conv_kernel);
      b.in_proj.op->backward(dln_.data(), G(b.in_proj.w), dz, a.ln.data(), W(b.in_proj.w), N);
    } else if (b.type == '*') {
      const int64_t qd = cfg_.attn_q_dim(), kvd = cfg_.attn_kv_dim();
      T* dO = d_a_.data();
      T* dq = d_b_.data();
      T* dk = d_c_.data();
      T* dv = d_d_.data();
      zero(d_a_, N * qd), zero(d_b_, N * qd), zero(d_c_, N * kvd), zero(d_d_, N * kvd);
      b.o_proj.op->backward(dO, G(b.o_proj.w), dout, a.o.data(), W(b.o_proj.w), N);
      attention_backward(dq, dk, dv, dO, a.o.data(), a.lse.data(), a.q.data(), a.k.data(), a.v.data(),
                         attn_dims(cfg_, B, T_));
      b.q_proj.op->backward(dln_.data(), G(b.q_proj.w), dq, a.ln.data(), W(b.q_proj.w), N);
      b.k_proj.op->backward(dln_.data(), G(b.k_proj.w), dk, a.ln.data(), W(b.k_proj.w), N);
      b.v_proj.op->backward(dln_.data(), G(b.v_proj.w), dv, a.ln.data(), W(b.v_proj.w), N);
    } else {
      const int64_t I = cfg_.intermediate_size;
      T* dact = d_a_.data();
      T* dup = d_b_.data();
      zero(d_a_, N * I), zero(d_b_, N * I);
      b.down_proj.op->backward(dact, G(b.down_proj.w), dout, a.act.data(), W(b.down_proj.w), N);
      relu2_backward(dup, dact, a.up.data(), N * I);
      b.up_proj.op->backward(dln_.data(), G(b.up_proj.w), dup, a.ln.data(), W(b.up_proj.w), N);
    }
    rmsnorm_backward(dresid_.data(), G(b.norm), dln_.data(), resid(l), W(b.norm), a.rstd.data(), N, C);
  }
  embedding_backward(G(wte_), dresid_.data(), tokens_.data(), N, C);
}

ActivationBytes activation_bytes(const NemotronHConfig& cfg, int64_t B, int64_t T_, int64_t scalar_bytes,
                                 bool recompute) {
  const int64_t N = B * T_, C = cfg.hidden_size, V = cfg.vocab_size;
  double kept = static_cast<double>((cfg.num_hidden_layers + 1) * N * C);  // residual stream
  if (recompute) {  // one block of each type present
    for (char t : {'M', '*', '-'})
      if (cfg.count_layers(t)) kept += static_cast<double>(block_sizes(cfg, t, B, T_).total());
  } else {
    for (char t : cfg.hybrid_override_pattern) kept += static_cast<double>(block_sizes(cfg, t, B, T_).total());
  }
  kept += static_cast<double>(N * C + N + N * V);  // final norm, logits
  const auto w = scratch_widths(cfg);
  double scratch = static_cast<double>(N * C * 4 + N * V);  // mix_out, dresid, dln, dlnf, dlogits
  for (int64_t x : w) scratch += static_cast<double>(N * x);
  // The SSD backward's state gradients, one Mamba layer at a time.
  if (cfg.count_layers('M')) scratch += static_cast<double>(ssd_dims(cfg, B, T_).states_size());
  ActivationBytes a;
  a.kept = kept * static_cast<double>(scalar_bytes) + static_cast<double>(N) * 8.0;  // + FP64 token losses
  a.scratch = scratch * static_cast<double>(scalar_bytes);
  return a;
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

// A block's mixer: what runs between the block's pre-norm and its residual
// add. Nemotron-H has three, one file each: Mamba-2 (models/mamba2.*),
// causal GQA attention (models/attention.*) and the squared-ReLU MLP
// (models/mlp.*). A mixer owns the arena indices of its parameters, its
// linear layers, the tensors it keeps for backward, its forward and
// backward, and its memory figures; NemotronH keeps the block structure
// (pre-norm, residual, block recompute), the embedding and the loss.
//
// mixer_kind() maps a pattern letter to its row of the mixer table
// (models/mixer.cpp): the one place a letter of hybrid_override_pattern is
// read. The layout, FLOP count, parameter breakdown, memory estimate and the
// model all go through the row.
//
// forward and backward keep the llm.c shape: outputs first, then inputs,
// then sizes. Backward accumulates (+=) into the input gradient and into
// the parameter gradients in the arena.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "formats/error.hpp"
#include "models/backend.hpp"
#include "models/config.hpp"
#include "sim/arena.hpp"
#include "sim/linear.hpp"
#include "sim/memory.hpp"
#include "sim/tensor.hpp"

namespace exmy::models {

// A linear layer of a mixer and the arena index of its weight.
template <class T>
struct MixerLinear {
  sim::Linear<T>* op = nullptr;
  int w = -1;
  // Y (N,out) = X (N,in) W^T; `again` (block recompute) runs it through
  // Linear::recompute_forward, which repeats no side effect.
  void forward(T* Y, const T* X, const sim::ParamArena<T>& arena, int64_t N, bool again) const {
    if (again) op->recompute_forward(Y, X, arena.param(w), N);
    else op->forward(Y, X, arena.param(w), N);
  }
  // dX (N,in) +=, dW +=; dY (N,out), X (N,in) as in forward
  void backward(T* dX, sim::ParamArena<T>& arena, const T* dY, const T* X, int64_t N) const {
    op->backward(dX, arena.grad(w), dY, X, arena.param(w), N);
  }
};

// What a mixer is built from. Its linears are made by the model's factory
// and appended to `linears` (the model's list, in forward order).
template <class T>
struct MixerBuilder {
  const NemotronHConfig& cfg;  // the model's; outlives the mixer
  const sim::ArenaLayout& layout;
  const sim::LinearFactory<T>& factory;
  std::vector<std::unique_ptr<sim::Linear<T>>>& linears;
  Backend<T>& be;  // the model's: the mixer's kernels and the memory of its tensors
  char letter = 0;     // the block's pattern letter
  int layer = 0;
  std::string prefix;  // "layers.3.mixer."

  // Arena index of prefix + name, or -1 when the layout has no such view.
  int param(const std::string& name) const { return layout.find(prefix + name); }
  // The linear prefix + name (weight prefix + name + ".weight"), in -> out features.
  MixerLinear<T> linear(sim::LinearKind kind, const std::string& name, int64_t in, int64_t out) const {
    sim::LinearInfo info;
    info.name = prefix + name;
    info.layer = layer;
    info.kind = kind;
    info.in_features = in;
    info.out_features = out;
    linears.push_back(factory.make(info));
    return {linears.back().get(), layout.find(info.name + ".weight")};
  }
};

// One forward or backward call of a mixer.
struct MixerRun {
  int64_t batch = 0, seqlen = 0;
  bool bf16_act = false;  // round kept tensors to bfloat16 (NemotronH::set_bf16_activations)
  bool again = false;     // block recompute: the kept tensors only, no output projection
  int64_t tokens() const { return batch * seqlen; }
};

// A tensor a BF16 trainer keeps in BF16 (NemotronH::set_bf16_activations).
template <class T>
void keep_bf16(Backend<T>& be, const MixerRun& run, T* p, int64_t n) {
  if (run.bf16_act) be.round_bf16(p, n);
}

template <class T>
class Mixer {
 public:
  virtual ~Mixer() = default;
  char letter() const { return letter_; }

  // Lays out the kept tensors for batch x seqlen tokens (sizes: the row's
  // kept()). With `share` (block recompute), a mixer of the same letter, it
  // uses the tensors of `share` instead of its own.
  virtual void allocate(int64_t batch, int64_t seqlen, Mixer* share) = 0;

  // out (N,C) = mixer(x), x (N,C) the normed block input, keeping what
  // backward needs. With run.again only the kept tensors are made again
  // (out is not written and may be null).
  virtual void forward(T* out, const T* x, const sim::ParamArena<T>& arena, const MixerRun& run) = 0;

  // dx (N,C) +=, parameter gradients in `arena` +=; dout (N,C), x as in
  // the last forward. `scratch` holds the model's shared backward buffers,
  // at least as wide per token as the row's scratch().per_token; the mixer
  // zeroes what it uses.
  virtual void backward(T* dx, sim::ParamArena<T>& arena, const T* dout, const T* x,
                        std::span<sim::MemBuf<T>> scratch, const MixerRun& run) = 0;

 protected:
  explicit Mixer(char letter) : letter_(letter) {}
  Mixer(const Mixer&) = delete;
  Mixer& operator=(const Mixer&) = delete;

 private:
  char letter_;
};

// The tensors a mixer keeps for backward (a struct S of buffers): its own,
// or (block recompute) those of another mixer of the same letter.
template <class S>
class Kept {
 public:
  S& operator*() { return *use_; }
  S* operator->() { return use_; }
  // Uses other's own tensors when `other` is not null (its own are
  // released), else its own. Returns true when they are its own: the caller
  // then sizes them.
  bool share(Kept* other) {
    if (!other) {
      use_ = &own_;
      return true;
    }
    own_ = S{};
    use_ = &other->own_;
    return false;
  }

 private:
  S own_;
  S* use_ = &own_;
};

// Sizes (elements) the kept tensors in `memory`, given in the order of a
// mixer's sizes() table, which its row's kept() sums: so the memory
// estimate is what the mixer allocates.
template <class T, size_t n>
void resize_kept(const std::array<sim::MemBuf<T>*, n>& bufs, const std::array<int64_t, n>& sizes,
                 sim::Memory& memory) {
  for (size_t i = 0; i < n; ++i) bufs[i]->place(memory), bufs[i]->resize_zero(sizes[i]);
}
template <size_t n>
int64_t sum_sizes(const std::array<int64_t, n>& sizes) {
  int64_t s = 0;
  for (int64_t x : sizes) s += x;
  return s;
}

// `share` as the mixer type M (allocate()'s argument); checks the letter.
template <class M, class T>
M* shared_as(const M& self, Mixer<T>* share) {
  if (!share) return nullptr;
  if (share->letter() != self.letter())
    throw Error(std::string("mixer '") + self.letter() + "' cannot share the kept tensors of mixer '" +
                share->letter() + "'");
  return static_cast<M*>(share);
}

// The base of a mixer whose kept tensors are a struct S of buffers, with
// all() listing them in the order of sizes(cfg, batch, seqlen), the table
// of their sizes that the mixer's row kept() sums.
template <class T, class S, auto sizes>
class MixerKeeping : public Mixer<T> {
 public:
  void allocate(int64_t batch, int64_t seqlen, Mixer<T>* share) final {
    MixerKeeping* other = shared_as(*this, share);
    if (kept_.share(other ? &other->kept_ : nullptr))
      resize_kept(kept_->all(), sizes(cfg_, batch, seqlen), be_.memory());
  }

 protected:
  explicit MixerKeeping(const MixerBuilder<T>& b) : Mixer<T>(b.letter), cfg_(b.cfg), be_(b.be) {}
  const NemotronHConfig& cfg_;  // the model's
  Backend<T>& be_;              // the model's
  Kept<S> kept_;
};

// Backward scratch of a mixer: elements per token of each of the model's
// shared backward buffers (buffer i is as wide as the widest i-th entry of
// the mixers present), and elements its kernels allocate themselves.
struct MixerScratch {
  std::vector<int64_t> per_token;
  int64_t inside = 0;
};

// For the checks of config fields (validate() and the mixers' validate;
// models/config.cpp): throws "model.NAME must be positive (got V)" for the
// first (name, value) with value <= 0.
void require_positive(std::initializer_list<std::pair<const char*, int64_t>> fields);
// A config number as describe() writes it (the shortest text that reads back).
std::string config_double(double x);

// What a mixer's file gives the mixer table (models/<mixer>.cpp).
struct MixerOps {
  // Throws exmy::Error for the first bad config field the mixer reads
  // (validate() calls it when the pattern has the mixer's letter).
  void (*validate)(const NemotronHConfig& cfg);
  // Registers the mixer's parameters under prefix ("layers.3.mixer."), in arena order.
  void (*add_params)(sim::ArenaLayout& layout, const NemotronHConfig& cfg, const std::string& prefix);
  // Adds one such block's FLOPs per token for sequences of seq_len.
  void (*add_flops)(FlopCount& f, const NemotronHConfig& cfg, int64_t seq_len);
  // Elements kept for backward for batch x seqlen tokens (what allocate() lays out).
  int64_t (*kept)(const NemotronHConfig& cfg, int64_t batch, int64_t seqlen);
  MixerScratch (*scratch)(const NemotronHConfig& cfg, int64_t batch, int64_t seqlen);
  std::unique_ptr<Mixer<float>> (*make_float)(const MixerBuilder<float>& b);
  std::unique_ptr<Mixer<double>> (*make_double)(const MixerBuilder<double>& b);
};

// One row of the mixer table.
struct MixerKind {
  char letter;        // in hybrid_override_pattern
  const char* block;  // "mamba", "attention", "mlp" (model-info's rows)
  MixerOps ops;
};

// Every mixer, in model-info's order (mamba, attention, mlp).
std::span<const MixerKind> mixer_kinds();
// The row of a pattern letter, or null.
const MixerKind* find_mixer_kind(char letter);
// The row of a pattern letter; throws exmy::Error for an unknown letter.
const MixerKind& mixer_kind(char letter);

template <class T>
std::unique_ptr<Mixer<T>> make_mixer(char letter, const MixerBuilder<T>& b) {
  if constexpr (std::is_same_v<T, float>) return mixer_kind(letter).ops.make_float(b);
  else return mixer_kind(letter).ops.make_double(b);
}

// MixerOps of a mixer class template M and its row functions.
template <template <class> class M>
MixerOps mixer_ops(decltype(MixerOps::validate) validate, decltype(MixerOps::add_params) add_params,
                   decltype(MixerOps::add_flops) add_flops, decltype(MixerOps::kept) kept,
                   decltype(MixerOps::scratch) scratch) {
  return {validate, add_params, add_flops, kept, scratch,
          [](const MixerBuilder<float>& b) -> std::unique_ptr<Mixer<float>> { return std::make_unique<M<float>>(b); },
          [](const MixerBuilder<double>& b) -> std::unique_ptr<Mixer<double>> {
            return std::make_unique<M<double>>(b);
          }};
}

}  // namespace exmy::models

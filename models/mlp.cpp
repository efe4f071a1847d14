#include "models/mlp.hpp"

#include "models/layers.hpp"

namespace exmy::models {

using sim::Buf;

namespace {

void mlp_add_params(sim::ArenaLayout& L, const NemotronHConfig& c, const std::string& p) {
  const int64_t H = c.hidden_size;
  L.add(p + "up_proj.weight", {c.intermediate_size, H}, true);
  L.add(p + "down_proj.weight", {H, c.intermediate_size}, true);
}

void mlp_add_flops(FlopCount& f, const NemotronHConfig& c, int64_t) {
  const double H = static_cast<double>(c.hidden_size);
  f.linear += 2 * H * 2 * static_cast<double>(c.intermediate_size);
}

// up and act, N x intermediate_size each (allocate() reads this too).
int64_t mlp_kept(const NemotronHConfig& c, int64_t B, int64_t T_) { return 2 * B * T_ * c.intermediate_size; }

// Per token: dact (I), dup (I).
MixerScratch mlp_scratch(const NemotronHConfig& c, int64_t, int64_t) {
  return {{c.intermediate_size, c.intermediate_size}, 0};
}

template <class T>
class MlpMixer final : public Mixer<T> {
 public:
  explicit MlpMixer(const MixerBuilder<T>& b);
  void allocate(int64_t batch, int64_t seqlen, Mixer<T>* share) override;
  void forward(T* out, const T* x, const sim::ParamArena<T>& arena, const MixerRun& run) override;
  void backward(T* dx, sim::ParamArena<T>& arena, const T* dout, const T* x, std::span<sim::Buf<T>> scratch,
                const MixerRun& run) override;

 private:
  // Kept for backward: the up_proj output and the squared ReLU's.
  struct Saved {
    sim::Buf<T> up, act;
  };
  const NemotronHConfig& cfg_;
  MixerLinear<T> up_proj_, down_proj_;
  Kept<Saved> kept_;
};

template <class T>
MlpMixer<T>::MlpMixer(const MixerBuilder<T>& b) : Mixer<T>(b.letter), cfg_(b.cfg) {
  const int64_t C = cfg_.hidden_size;
  up_proj_ = b.linear(sim::LinearKind::mlp_up, "up_proj", C, cfg_.intermediate_size);
  down_proj_ = b.linear(sim::LinearKind::mlp_down, "down_proj", cfg_.intermediate_size, C);
}

template <class T>
void MlpMixer<T>::allocate(int64_t B, int64_t T_, Mixer<T>* share) {
  MlpMixer* other = shared_as(*this, share);
  if (!kept_.share(other ? &other->kept_ : nullptr)) return;
  const int64_t each = mlp_kept(cfg_, B, T_) / 2;
  sim::resize_zero(kept_->up, each), sim::resize_zero(kept_->act, each);
}

template <class T>
void MlpMixer<T>::forward(T* out, const T* x, const sim::ParamArena<T>& arena, const MixerRun& run) {
  const int64_t N = run.tokens(), I = cfg_.intermediate_size;
  Saved& k = *kept_;
  up_proj_.forward(k.up.data(), x, arena, N, run.again);
  keep_bf16(run, k.up.data(), N * I);
  relu2_forward(k.act.data(), k.up.data(), N * I);
  keep_bf16(run, k.act.data(), N * I);
  if (run.again) return;
  down_proj_.forward(out, k.act.data(), arena, N, false);
}

template <class T>
void MlpMixer<T>::backward(T* dx, sim::ParamArena<T>& arena, const T* dout, const T* x, std::span<Buf<T>> scratch,
                           const MixerRun& run) {
  const int64_t N = run.tokens(), I = cfg_.intermediate_size;
  Saved& k = *kept_;
  T* dact = scratch[0].data();
  T* dup = scratch[1].data();
  sim::zero(dact, N * I), sim::zero(dup, N * I);
  down_proj_.backward(dact, arena, dout, k.act.data(), N);
  relu2_backward(dup, dact, k.up.data(), N * I);
  up_proj_.backward(dx, arena, dup, x, N);
}

}  // namespace

const MixerOps& mlp_mixer() {
  static const MixerOps ops = mixer_ops<MlpMixer>(mlp_add_params, mlp_add_flops, mlp_kept, mlp_scratch);
  return ops;
}

}  // namespace exmy::models

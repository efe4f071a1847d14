#include "models/mlp.hpp"

#include <array>

#include "models/layers.hpp"

namespace exmy::models {

using sim::Buf;

namespace {

void mlp_validate(const NemotronHConfig& c) { require_positive({{"intermediate_size", c.intermediate_size}}); }

void mlp_add_params(sim::ArenaLayout& L, const NemotronHConfig& c, const std::string& p) {
  const int64_t H = c.hidden_size;
  L.add(p + "up_proj.weight", {c.intermediate_size, H}, true);
  L.add(p + "down_proj.weight", {H, c.intermediate_size}, true);
}

void mlp_add_flops(FlopCount& f, const NemotronHConfig& c, int64_t) {
  const double H = static_cast<double>(c.hidden_size);
  f.linear += 2 * H * 2 * static_cast<double>(c.intermediate_size);
}

// Elements of the kept tensors, in the order of Saved::all().
std::array<int64_t, 2> sizes(const NemotronHConfig& c, int64_t B, int64_t T_) {
  return {B * T_ * c.intermediate_size, B * T_ * c.intermediate_size};
}

int64_t mlp_kept(const NemotronHConfig& c, int64_t B, int64_t T_) { return sum_sizes(sizes(c, B, T_)); }

// Per token: dact (I), dup (I).
MixerScratch mlp_scratch(const NemotronHConfig& c, int64_t, int64_t) {
  return {{c.intermediate_size, c.intermediate_size}, 0};
}

// Kept for backward: the up_proj output and the squared ReLU's.
template <class T>
struct MlpSaved {
  sim::MemBuf<T> up, act;
  std::array<sim::MemBuf<T>*, 2> all() { return {&up, &act}; }
};

template <class T>
class MlpMixer final : public MixerKeeping<T, MlpSaved<T>, sizes> {
  using Base = MixerKeeping<T, MlpSaved<T>, sizes>;
  using Base::cfg_;
  using Base::kept_;
  using Base::be_;
  using Saved = MlpSaved<T>;

 public:
  explicit MlpMixer(const MixerBuilder<T>& b) : Base(b) {
    const int64_t C = cfg_.hidden_size;
    up_proj_ = b.linear(sim::LinearKind::mlp_up, "up_proj", C, cfg_.intermediate_size);
    down_proj_ = b.linear(sim::LinearKind::mlp_down, "down_proj", cfg_.intermediate_size, C);
  }

  void forward(T* out, const T* x, const sim::ParamArena<T>& arena, const MixerRun& run) override;
  void backward(T* dx, sim::ParamArena<T>& arena, const T* dout, const T* x, std::span<sim::MemBuf<T>> scratch,
                const MixerRun& run) override;

 private:
  MixerLinear<T> up_proj_, down_proj_;
};

template <class T>
void MlpMixer<T>::forward(T* out, const T* x, const sim::ParamArena<T>& arena, const MixerRun& run) {
  const int64_t N = run.tokens(), I = cfg_.intermediate_size;
  Saved& k = *kept_;
  up_proj_.forward(k.up.data(), x, arena, N, run.again);
  keep_bf16(be_, run, k.up.data(), N * I);
  be_.relu2_forward(k.act.data(), k.up.data(), N * I);
  keep_bf16(be_, run, k.act.data(), N * I);
  if (run.again) return;
  down_proj_.forward(out, k.act.data(), arena, N, false);
}

template <class T>
void MlpMixer<T>::backward(T* dx, sim::ParamArena<T>& arena, const T* dout, const T* x, std::span<sim::MemBuf<T>> scratch,
                           const MixerRun& run) {
  const int64_t N = run.tokens(), I = cfg_.intermediate_size;
  Saved& k = *kept_;
  T* dact = scratch[0].data();
  T* dup = scratch[1].data();
  be_.zero(dact, N * I), be_.zero(dup, N * I);
  down_proj_.backward(dact, arena, dout, k.act.data(), N);
  be_.relu2_backward(dup, dact, k.up.data(), N * I);
  up_proj_.backward(dx, arena, dup, x, N);
}

}  // namespace

const MixerOps& mlp_mixer() {
  static const MixerOps ops =
      mixer_ops<MlpMixer>(mlp_validate, mlp_add_params, mlp_add_flops, mlp_kept, mlp_scratch);
  return ops;
}

}  // namespace exmy::models

#include "models/mamba2.hpp"

#include <algorithm>
#include <array>

#include "models/layers.hpp"
#include "models/cuda/ssd_cuda.hpp"  // ssd_device_scratch

namespace exmy::models {

using sim::Buf;

SsdDims ssd_dims(const NemotronHConfig& c, int64_t B, int64_t T_, bool xbc_bf16) {
  return {.batch = B, .seqlen = T_, .heads = c.mamba_num_heads, .head_dim = c.mamba_head_dim, .groups = c.n_groups,
          .state = c.ssm_state_size, .chunk = c.chunk_size, .xbc_bf16 = xbc_bf16};
}

namespace {

// Elements of the kept tensors, in the order of Saved::all().
std::array<int64_t, 8> sizes(const NemotronHConfig& c, int64_t B, int64_t T_) {
  const int64_t N = B * T_;
  const SsdDims d = ssd_dims(c, B, T_);
  return {N * c.mamba_in_proj_dim(), N * c.mamba_conv_dim(), N * c.mamba_num_heads, d.acs_size(),
          d.states_size(),           N * c.mamba_d_inner(),  N * c.mamba_d_inner(),   N * c.n_groups};
}

void mamba2_validate(const NemotronHConfig& c) {
  require_positive({{"mamba_num_heads", c.mamba_num_heads},
                    {"mamba_head_dim", c.mamba_head_dim},
                    {"ssm_state_size", c.ssm_state_size},
                    {"n_groups", c.n_groups},
                    {"conv_kernel", c.conv_kernel},
                    {"chunk_size", c.chunk_size}});
  if (c.mamba_num_heads % c.n_groups != 0)
    throw Error("model.mamba_num_heads = " + std::to_string(c.mamba_num_heads) +
                " is not a multiple of n_groups = " + std::to_string(c.n_groups));
  if (c.mamba_d_inner() % c.n_groups != 0)
    throw Error("model.n_groups = " + std::to_string(c.n_groups) + " does not divide the mixer width " +
                std::to_string(c.mamba_d_inner()) + " (gated norm groups)");
  if (c.chunk_size > 4096)
    throw Error("model.chunk_size = " + std::to_string(c.chunk_size) + " is too large (expected 1..4096)");
  if (!(c.time_step_limit[0] >= 0 && c.time_step_limit[0] < c.time_step_limit[1]))
    throw Error("model.time_step_limit = " + config_double(c.time_step_limit[0]) + "," +
                config_double(c.time_step_limit[1]) + " (expected 0 <= lo < hi)");
  if (!(c.time_step_min > 0 && c.time_step_min <= c.time_step_max))
    throw Error("model.time_step_min/max = " + config_double(c.time_step_min) + "/" +
                config_double(c.time_step_max) + " (expected 0 < min <= max)");
}

void mamba2_add_params(sim::ArenaLayout& L, const NemotronHConfig& c, const std::string& p) {
  const int64_t H = c.hidden_size;
  L.add(p + "in_proj.weight", {c.mamba_in_proj_dim(), H}, true);
  // HF stores the depthwise conv as (channels, 1, kernel).
  add_param(L, p + "conv1d.weight", {c.mamba_conv_dim(), 1, c.conv_kernel}, true, ParamInit::conv_uniform);
  if (c.use_conv_bias) add_param(L, p + "conv1d.bias", {c.mamba_conv_dim()}, false, ParamInit::conv_uniform);
  add_param(L, p + "dt_bias", {c.mamba_num_heads}, false, ParamInit::dt_bias);
  add_param(L, p + "A_log", {c.mamba_num_heads}, false, ParamInit::a_log);
  add_param(L, p + "D", {c.mamba_num_heads}, false, ParamInit::ones);
  add_param(L, p + "norm.weight", {c.mamba_d_inner()}, false, ParamInit::ones);
  add_param(L, p + "out_proj.weight", {H, c.mamba_d_inner()}, true, ParamInit::rescaled_out);
}

void mamba2_add_flops(FlopCount& f, const NemotronHConfig& c, int64_t seq_len) {
  const double H = static_cast<double>(c.hidden_size);
  f.linear += 2 * H * static_cast<double>(c.mamba_in_proj_dim() + c.mamba_d_inner());
  // Chunked SSD per head and token, chunk length L (the last chunk of a
  // sequence may be shorter; counted as full): C·B^T shared by the
  // heads of a group (2·L·N / heads-per-group), the masked intra-chunk
  // product (2·L·P), the chunk state (2·P·N) and the state output (2·P·N).
  const double L = static_cast<double>(std::min<int64_t>(c.chunk_size, seq_len));
  const double P = static_cast<double>(c.mamba_head_dim), N = static_cast<double>(c.ssm_state_size);
  const double hpg = static_cast<double>(c.mamba_num_heads / std::max<int64_t>(c.n_groups, 1));
  f.ssd += static_cast<double>(c.mamba_num_heads) * (2 * L * N / hpg + 2 * L * P + 4 * P * N);
}

int64_t mamba2_kept(const NemotronHConfig& c, int64_t B, int64_t T_) { return sum_sizes(sizes(c, B, T_)); }

// Per token: dgn (D_in), dy (D_in), dzxbcdt (in_proj), dxBC (conv), ddt
// (heads); inside, what the CUDA backend's SSD kernels allocate: the
// larger scratch of the forward and the backward of the family it runs
// (ssd_device_scratch; the block launches' holds the chunks' copies of C, B
// and the state gradients, and a slab of at most 256 MiB of per-chunk
// arrays, models/ssd_blocks.hpp). The CPU's scan allocates its own (per
// thread); the emulated backend asks for the CUDA backend's.
MixerScratch mamba2_scratch(const NemotronHConfig& c, int64_t B, int64_t T_) {
  const SsdDims d = ssd_dims(c, B, T_);
  return {{c.mamba_d_inner(), c.mamba_d_inner(), c.mamba_in_proj_dim(), c.mamba_conv_dim(), c.mamba_num_heads},
          ssd_device_scratch(d)};
}

// Kept for backward: the in_proj output, the conv1d+SiLU output, dt, the
// SSD's within-chunk cumulative sums of dt A and chunk-entry states, the
// SSD output, and the gated norm's output and 1/rms.
template <class T>
struct Mamba2Saved {
  sim::MemBuf<T> zxbcdt, xbc, dt, acs, states, y, gn, gn_rstd;
  std::array<sim::MemBuf<T>*, 8> all() { return {&zxbcdt, &xbc, &dt, &acs, &states, &y, &gn, &gn_rstd}; }
};

template <class T>
class Mamba2Mixer final : public MixerKeeping<T, Mamba2Saved<T>, sizes> {
  using Base = MixerKeeping<T, Mamba2Saved<T>, sizes>;
  using Base::cfg_;
  using Base::kept_;
  using Base::be_;
  using Saved = Mamba2Saved<T>;

 public:
  explicit Mamba2Mixer(const MixerBuilder<T>& b) : Base(b) {
    const int64_t C = cfg_.hidden_size;
    in_proj_ = b.linear(sim::LinearKind::mamba_in_proj, "in_proj", C, cfg_.mamba_in_proj_dim());
    out_proj_ = b.linear(sim::LinearKind::mamba_out_proj, "out_proj", cfg_.mamba_d_inner(), C);
    conv_w_ = b.param("conv1d.weight");
    conv_b_ = b.param("conv1d.bias");  // -1 without use_conv_bias
    dt_bias_ = b.param("dt_bias");
    A_log_ = b.param("A_log");
    D_ = b.param("D");
    norm_ = b.param("norm.weight");
  }

  void forward(T* out, const T* x, const sim::ParamArena<T>& arena, const MixerRun& run) override;
  void backward(T* dx, sim::ParamArena<T>& arena, const T* dout, const T* x, std::span<sim::MemBuf<T>> scratch,
                const MixerRun& run) override;

 private:
  MixerLinear<T> in_proj_, out_proj_;
  int conv_w_ = -1, conv_b_ = -1, dt_bias_ = -1, A_log_ = -1, D_ = -1, norm_ = -1;  // arena indices
};

template <class T>
void Mamba2Mixer<T>::forward(T* out, const T* x, const sim::ParamArena<T>& arena, const MixerRun& run) {
  const int64_t B = run.batch, T_ = run.seqlen, N = run.tokens();
  const int64_t Din = cfg_.mamba_d_inner(), conv = cfg_.mamba_conv_dim(), ld = cfg_.mamba_in_proj_dim();
  const int64_t GN = cfg_.n_groups * cfg_.ssm_state_size;
  auto W = [&](int i) { return arena.param(i); };
  Saved& k = *kept_;
  // in_proj output rows: [ z (D_in) | x B C (conv_dim) | dt (heads) ]
  in_proj_.forward(k.zxbcdt.data(), x, arena, N, run.again);
  keep_bf16(be_, run, k.zxbcdt.data(), N * ld);
  const T* z = k.zxbcdt.data();
  const T* xbc_raw = z + Din;
  const T* dt_raw = z + Din + conv;
  be_.conv1d_silu_forward(k.xbc.data(), xbc_raw, ld, W(conv_w_), conv_b_ >= 0 ? W(conv_b_) : nullptr, B, T_, conv,
                      cfg_.conv_kernel);
  keep_bf16(be_, run, k.xbc.data(), N * conv);
  be_.mamba_dt_forward(k.dt.data(), dt_raw, ld, W(dt_bias_), N, cfg_.mamba_num_heads, cfg_.time_step_limit[0],
                   cfg_.time_step_limit[1]);
  const T* xs = k.xbc.data();
  be_.ssd_chunk_scan_forward(k.y.data(), k.acs.data(), k.states.data(), xs, conv, xs + Din, xs + Din + GN, conv,
                         k.dt.data(), W(A_log_), W(D_), ssd_dims(cfg_, B, T_, run.bf16_act));
  keep_bf16(be_, run, k.y.data(), N * Din);
  be_.gated_rmsnorm_forward(k.gn.data(), k.gn_rstd.data(), k.y.data(), Din, z, ld, W(norm_), N, Din, cfg_.n_groups,
                        cfg_.layer_norm_epsilon);
  keep_bf16(be_, run, k.gn.data(), N * Din);
  if (run.again) return;
  out_proj_.forward(out, k.gn.data(), arena, N, false);
}

template <class T>
void Mamba2Mixer<T>::backward(T* dx, sim::ParamArena<T>& arena, const T* dout, const T* x,
                              std::span<sim::MemBuf<T>> scratch, const MixerRun& run) {
  const int64_t B = run.batch, T_ = run.seqlen, N = run.tokens();
  const int64_t Din = cfg_.mamba_d_inner(), conv = cfg_.mamba_conv_dim(), ld = cfg_.mamba_in_proj_dim();
  const int64_t GN = cfg_.n_groups * cfg_.ssm_state_size, H = cfg_.mamba_num_heads;
  auto W = [&](int i) { return arena.param(i); };
  auto G = [&](int i) { return arena.grad(i); };
  Saved& k = *kept_;
  T* dgn = scratch[0].data();
  T* dy = scratch[1].data();
  T* dz = scratch[2].data();  // (N, in_proj) : [dz | dxBC_raw | ddt_raw]
  T* dxbc = scratch[3].data();
  T* ddt = scratch[4].data();
  be_.zero(dgn, N * Din), be_.zero(dy, N * Din), be_.zero(dz, N * ld), be_.zero(dxbc, N * conv);
  be_.zero(ddt, N * H);
  out_proj_.backward(dgn, arena, dout, k.gn.data(), N);
  const T* z = k.zxbcdt.data();
  be_.gated_rmsnorm_backward(dy, Din, dz, ld, G(norm_), dgn, k.y.data(), Din, z, ld, W(norm_), k.gn_rstd.data(), N, Din,
                         cfg_.n_groups);
  const T* xs = k.xbc.data();
  be_.ssd_chunk_scan_backward(dxbc, dxbc + Din, dxbc + Din + GN, ddt, G(A_log_), G(D_), dy, xs, conv, xs + Din,
                          xs + Din + GN, conv, k.dt.data(), W(A_log_), W(D_), k.acs.data(), k.states.data(),
                          ssd_dims(cfg_, B, T_));
  be_.mamba_dt_backward(dz + Din + conv, ld, G(dt_bias_), ddt, z + Din + conv, W(dt_bias_), N, H, cfg_.time_step_limit[0],
                    cfg_.time_step_limit[1]);
  be_.conv1d_silu_backward(dz + Din, ld, G(conv_w_), conv_b_ >= 0 ? G(conv_b_) : nullptr, dxbc, z + Din, ld, W(conv_w_),
                       conv_b_ >= 0 ? W(conv_b_) : nullptr, B, T_, conv, cfg_.conv_kernel);
  in_proj_.backward(dx, arena, dz, x, N);
}

}  // namespace

const MixerOps& mamba2_mixer() {
  static const MixerOps ops =
      mixer_ops<Mamba2Mixer>(mamba2_validate, mamba2_add_params, mamba2_add_flops, mamba2_kept, mamba2_scratch);
  return ops;
}

}  // namespace exmy::models

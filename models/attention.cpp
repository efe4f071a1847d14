#include "models/attention.hpp"

#include <algorithm>
#include <array>

#include "models/attention_fused.hpp"  // attention_fused_backward_scratch
#include "models/attention_items.hpp"
#include "models/cuda/attention_cuda.hpp"  // attention_device_scratch (defined here: plan arithmetic)
#include "sim/parallel.hpp"
#include "sim/tensor.hpp"

namespace exmy::models {

using sim::Buf;

// The work items of models/attention_items.hpp, one per (batch, head) in the
// forward and per (batch, kv head) in the backward, each with its own block
// scratch (min(S, kQueryBlock) x S).

template <class T>
void attention_forward(T* out, T* lse, const T* q, const T* k, const T* v, const AttnDims& d) {
  const int64_t S = d.seqlen, Hq = d.q_heads;
  const SerialGemm gemm;
#pragma omp parallel for schedule(dynamic, 1) if (d.batch * Hq * S * S * d.head_dim >= sim::parallel_min_work())
  for (int64_t u = 0; u < d.batch * Hq; ++u) {
    Buf<T> P(static_cast<size_t>(attn_block_size(d)));
    attn_fwd_head(gemm, out, lse, q, k, v, d, u / Hq, u % Hq, P.data());
  }
}

template <class T>
void attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* out, const T* lse, const T* q, const T* k,
                        const T* v, const AttnDims& d) {
  const int64_t S = d.seqlen, Hq = d.q_heads, Hkv = d.kv_heads;
  const SerialGemm gemm;
  // One unit per (batch, kv head): the query heads that share a key/value
  // head add their dk, dv in head order, and within a head in query-block
  // order.
#pragma omp parallel for schedule(dynamic, 1) if (d.batch * Hq * S * S * d.head_dim >= sim::parallel_min_work())
  for (int64_t u = 0; u < d.batch * Hkv; ++u) {
    const size_t pn = static_cast<size_t>(attn_block_size(d));
    Buf<T> P(pn), dP(pn);
    attn_bwd_kv_head(gemm, dq, dk, dv, dout, out, lse, q, k, v, d, u / Hkv, u % Hkv, P.data(), dP.data());
  }
}

AttnDims attn_dims(const NemotronHConfig& c, int64_t B, int64_t T_) {
  return {.batch = B, .seqlen = T_, .q_heads = c.num_attention_heads, .kv_heads = c.num_key_value_heads,
          .head_dim = c.head_dim};
}

namespace {

// Elements of the kept tensors, in the order of Saved::all().
std::array<int64_t, 5> sizes(const NemotronHConfig& c, int64_t B, int64_t T_) {
  const int64_t N = B * T_;
  return {N * c.attn_q_dim(), N * c.attn_kv_dim(), N * c.attn_kv_dim(), N * c.attn_q_dim(),
          N * c.num_attention_heads};
}

void attention_validate(const NemotronHConfig& c) {
  require_positive({{"num_attention_heads", c.num_attention_heads},
                    {"num_key_value_heads", c.num_key_value_heads},
                    {"head_dim", c.head_dim}});
  if (c.num_attention_heads % c.num_key_value_heads != 0)
    throw Error("model.num_attention_heads = " + std::to_string(c.num_attention_heads) +
                " is not a multiple of num_key_value_heads = " + std::to_string(c.num_key_value_heads));
}

void attention_add_params(sim::ArenaLayout& L, const NemotronHConfig& c, const std::string& p) {
  const int64_t H = c.hidden_size;
  L.add(p + "q_proj.weight", {c.attn_q_dim(), H}, true);
  L.add(p + "k_proj.weight", {c.attn_kv_dim(), H}, true);
  L.add(p + "v_proj.weight", {c.attn_kv_dim(), H}, true);
  L.add(p + "o_proj.weight", {H, c.attn_q_dim()}, true);
}

void attention_add_flops(FlopCount& f, const NemotronHConfig& c, int64_t seq_len) {
  const double H = static_cast<double>(c.hidden_size);
  const double T = static_cast<double>(seq_len);
  f.linear += 2 * H * static_cast<double>(2 * c.attn_q_dim() + 2 * c.attn_kv_dim());
  // QK^T and PV over the (T+1)/2 keys a causal query sees on average.
  f.attention += 2 * 2 * static_cast<double>(c.attn_q_dim()) * (T + 1) / 2;
}

int64_t attention_kept(const NemotronHConfig& c, int64_t B, int64_t T_) { return sum_sizes(sizes(c, B, T_)); }

}  // namespace

// (models/cuda/attention_cuda.hpp; here, with the plan it serves, so that
// the plan needs none of the kernels)
int64_t attention_device_scratch(const AttnDims& d) {
  int64_t most = std::max(attention_rows_backward_scratch(d), attention_fused_backward_scratch(d));
  for (const AttnBlocking& k : {attn_cpu_blocking(), attn_device_blocking(d)})
    most = std::max({most, attention_blocks_forward_scratch(d, k), attention_blocks_backward_scratch(d, k)});
  return most;
}

namespace {

// Per token: do (q), dq (q), dk (kv), dv (kv); inside, what the CUDA
// backend's attention kernels allocate: the largest scratch of its two
// families (attention_device_scratch: the block launches' P and dP of
// attn_device_block_rows query rows per kv head, or the row kernels' D and
// per-head parts of dK, dV), and of the emulated backend's block launches
// with the CPU's blocking.
// The CPU's query-block scratch (2 x 64 x S floats per thread) is not in the
// plan: it is small.
MixerScratch attention_scratch(const NemotronHConfig& c, int64_t B, int64_t T_) {
  return {{c.attn_q_dim(), c.attn_q_dim(), c.attn_kv_dim(), c.attn_kv_dim()},
          attention_device_scratch(attn_dims(c, B, T_))};
}

// Kept for backward: q, k, v, the attention output and the log-sum-exp of
// each softmax row (backward recomputes the probabilities).
template <class T>
struct AttentionSaved {
  sim::MemBuf<T> q, k, v, o, lse;
  std::array<sim::MemBuf<T>*, 5> all() { return {&q, &k, &v, &o, &lse}; }
};

template <class T>
class AttentionMixer final : public MixerKeeping<T, AttentionSaved<T>, sizes> {
  using Base = MixerKeeping<T, AttentionSaved<T>, sizes>;
  using Base::cfg_;
  using Base::kept_;
  using Base::be_;
  using Saved = AttentionSaved<T>;

 public:
  explicit AttentionMixer(const MixerBuilder<T>& b) : Base(b) {
    const int64_t C = cfg_.hidden_size;
    q_proj_ = b.linear(sim::LinearKind::attn_q, "q_proj", C, cfg_.attn_q_dim());
    k_proj_ = b.linear(sim::LinearKind::attn_k, "k_proj", C, cfg_.attn_kv_dim());
    v_proj_ = b.linear(sim::LinearKind::attn_v, "v_proj", C, cfg_.attn_kv_dim());
    o_proj_ = b.linear(sim::LinearKind::attn_o, "o_proj", cfg_.attn_q_dim(), C);
  }

  void forward(T* out, const T* x, const sim::ParamArena<T>& arena, const MixerRun& run) override;
  void backward(T* dx, sim::ParamArena<T>& arena, const T* dout, const T* x, std::span<sim::MemBuf<T>> scratch,
                const MixerRun& run) override;

 private:
  // The kernel's shape; q, k and v hold bfloat16 values where the run keeps
  // them so (keep_bf16 below).
  AttnDims qkv_dims(const MixerRun& run) const {
    AttnDims d = attn_dims(cfg_, run.batch, run.seqlen);
    d.qkv_bf16 = run.bf16_act;
    return d;
  }
  MixerLinear<T> q_proj_, k_proj_, v_proj_, o_proj_;
};

template <class T>
void AttentionMixer<T>::forward(T* out, const T* x, const sim::ParamArena<T>& arena, const MixerRun& run) {
  const int64_t N = run.tokens();
  Saved& k = *kept_;
  q_proj_.forward(k.q.data(), x, arena, N, run.again);
  k_proj_.forward(k.k.data(), x, arena, N, run.again);
  v_proj_.forward(k.v.data(), x, arena, N, run.again);
  keep_bf16(be_, run, k.q.data(), N * cfg_.attn_q_dim());
  keep_bf16(be_, run, k.k.data(), N * cfg_.attn_kv_dim());
  keep_bf16(be_, run, k.v.data(), N * cfg_.attn_kv_dim());
  be_.attention_forward(k.o.data(), k.lse.data(), k.q.data(), k.k.data(), k.v.data(), qkv_dims(run));
  keep_bf16(be_, run, k.o.data(), N * cfg_.attn_q_dim());
  if (run.again) return;
  o_proj_.forward(out, k.o.data(), arena, N, false);
}

template <class T>
void AttentionMixer<T>::backward(T* dx, sim::ParamArena<T>& arena, const T* dout, const T* x,
                                 std::span<sim::MemBuf<T>> scratch, const MixerRun& run) {
  const int64_t N = run.tokens(), qd = cfg_.attn_q_dim(), kvd = cfg_.attn_kv_dim();
  Saved& k = *kept_;
  T* dO = scratch[0].data();
  T* dq = scratch[1].data();
  T* dk = scratch[2].data();
  T* dv = scratch[3].data();
  be_.zero(dO, N * qd), be_.zero(dq, N * qd), be_.zero(dk, N * kvd), be_.zero(dv, N * kvd);
  o_proj_.backward(dO, arena, dout, k.o.data(), N);
  be_.attention_backward(dq, dk, dv, dO, k.o.data(), k.lse.data(), k.q.data(), k.k.data(), k.v.data(),
                         qkv_dims(run));
  q_proj_.backward(dx, arena, dq, x, N);
  k_proj_.backward(dx, arena, dk, x, N);
  v_proj_.backward(dx, arena, dv, x, N);
}

}  // namespace

const MixerOps& attention_mixer() {
  static const MixerOps ops =
      mixer_ops<AttentionMixer>(attention_validate, attention_add_params, attention_add_flops, attention_kept,
                                attention_scratch);
  return ops;
}

template void attention_forward<float>(float*, float*, const float*, const float*, const float*, const AttnDims&);
template void attention_forward<double>(double*, double*, const double*, const double*, const double*,
                                        const AttnDims&);
template void attention_backward<float>(float*, float*, float*, const float*, const float*, const float*, const float*,
                                        const float*, const float*, const AttnDims&);
template void attention_backward<double>(double*, double*, double*, const double*, const double*, const double*,
                                         const double*, const double*, const double*, const AttnDims&);

}  // namespace exmy::models

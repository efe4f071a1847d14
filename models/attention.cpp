#include "models/attention.hpp"

#include <algorithm>
#include <array>
#include <cmath>

#include "sim/gemm.hpp"
#include "sim/parallel.hpp"
#include "sim/tensor.hpp"

namespace exmy::models {

using sim::Buf;
using sim::gemm_serial;
using sim::Op;

// Queries are processed in blocks of kQueryBlock rows. Block [i0, i1) needs
// only the keys [0, i1), so scores, probabilities and both products cover
// the causal triangle plus at most one block of masked entries per block
// row: about half of the full T x T work for long sequences.
constexpr int64_t kQueryBlock = 64;

template <class T>
void attention_forward(T* out, T* lse, const T* q, const T* k, const T* v, const AttnDims& d) {
  const int64_t S = d.seqlen, Dh = d.head_dim, Hq = d.q_heads, Hkv = d.kv_heads, rep = Hq / Hkv;
  const int64_t ldq = Hq * Dh, ldkv = Hkv * Dh;
  const T scale = T(1) / std::sqrt(static_cast<T>(Dh));
#pragma omp parallel for schedule(dynamic, 1) if (d.batch * Hq * S * S * Dh >= sim::parallel_min_work())
  for (int64_t u = 0; u < d.batch * Hq; ++u) {
    const int64_t b = u / Hq, h = u % Hq, kvh = h / rep;
    const T* qh = q + b * S * ldq + h * Dh;
    const T* kh = k + b * S * ldkv + kvh * Dh;
    const T* vh = v + b * S * ldkv + kvh * Dh;
    Buf<T> P(static_cast<size_t>(std::min(S, kQueryBlock) * S));
    for (int64_t i0 = 0; i0 < S; i0 += kQueryBlock) {
      const int64_t i1 = std::min(S, i0 + kQueryBlock), rows = i1 - i0, keys = i1;
      // P (rows, keys) = Q[i0:i1] K[0:i1]^T
      gemm_serial(P.data(), keys, qh + i0 * ldq, ldq, Op::N, kh, ldkv, Op::T, rows, keys, Dh, false);
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t i = i0 + r;
        T* row = P.data() + r * keys;
        T mx = -INFINITY;
        for (int64_t j = 0; j <= i; ++j) {
          row[j] *= scale;
          mx = std::max(mx, row[j]);
        }
        T sum = 0;
        for (int64_t j = 0; j <= i; ++j) {
          row[j] = std::exp(row[j] - mx);
          sum += row[j];
        }
        const T inv = T(1) / sum;
        for (int64_t j = 0; j <= i; ++j) row[j] *= inv;
        for (int64_t j = i + 1; j < keys; ++j) row[j] = 0;
        lse[(b * Hq + h) * S + i] = mx + std::log(sum);
      }
      gemm_serial(out + (b * S + i0) * ldq + h * Dh, ldq, P.data(), keys, Op::N, vh, ldkv, Op::N, rows, Dh, keys,
                  false);
    }
  }
}

template <class T>
void attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* out, const T* lse, const T* q, const T* k,
                        const T* v, const AttnDims& d) {
  const int64_t S = d.seqlen, Dh = d.head_dim, Hq = d.q_heads, Hkv = d.kv_heads, rep = Hq / Hkv;
  const int64_t ldq = Hq * Dh, ldkv = Hkv * Dh;
  const T scale = T(1) / std::sqrt(static_cast<T>(Dh));
  // One unit per (batch, kv head): the query heads that share a key/value
  // head add their dk, dv in head order, and within a head in query-block
  // order.
#pragma omp parallel for schedule(dynamic, 1) if (d.batch * Hq * S * S * Dh >= sim::parallel_min_work())
  for (int64_t u = 0; u < d.batch * Hkv; ++u) {
    const int64_t b = u / Hkv, kvh = u % Hkv;
    const T* kh = k + b * S * ldkv + kvh * Dh;
    const T* vh = v + b * S * ldkv + kvh * Dh;
    T* dkh = dk + b * S * ldkv + kvh * Dh;
    T* dvh = dv + b * S * ldkv + kvh * Dh;
    const size_t pn = static_cast<size_t>(std::min(S, kQueryBlock) * S);
    Buf<T> P(pn), dP(pn);
    for (int64_t h = kvh * rep; h < (kvh + 1) * rep; ++h) {
      const T* qh = q + b * S * ldq + h * Dh;
      const T* oh = out + b * S * ldq + h * Dh;
      const T* doh = dout + b * S * ldq + h * Dh;
      T* dqh = dq + b * S * ldq + h * Dh;
      const T* l = lse + (b * Hq + h) * S;
      for (int64_t i0 = 0; i0 < S; i0 += kQueryBlock) {
        const int64_t i1 = std::min(S, i0 + kQueryBlock), rows = i1 - i0, keys = i1;
        // Recompute the probabilities from the saved log-sum-exp.
        gemm_serial(P.data(), keys, qh + i0 * ldq, ldq, Op::N, kh, ldkv, Op::T, rows, keys, Dh, false);
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t i = i0 + r;
          T* row = P.data() + r * keys;
          for (int64_t j = 0; j <= i; ++j) row[j] = std::exp(row[j] * scale - l[i]);
          for (int64_t j = i + 1; j < keys; ++j) row[j] = 0;
        }
        // dV[0:i1] += P^T dO[i0:i1];  dP = dO[i0:i1] V[0:i1]^T
        gemm_serial(dvh, ldkv, P.data(), keys, Op::T, doh + i0 * ldq, ldq, Op::N, keys, Dh, rows, true);
        gemm_serial(dP.data(), keys, doh + i0 * ldq, ldq, Op::N, vh, ldkv, Op::T, rows, keys, Dh, false);
        // Softmax backward: dS = P ∘ (dP - rowsum(dO ∘ O)), times the scale
        // that multiplied the scores.
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t i = i0 + r;
          T di = 0;
          for (int64_t e = 0; e < Dh; ++e) di += doh[i * ldq + e] * oh[i * ldq + e];
          T* row = dP.data() + r * keys;
          const T* prow = P.data() + r * keys;
          for (int64_t j = 0; j <= i; ++j) row[j] = prow[j] * (row[j] - di) * scale;
          for (int64_t j = i + 1; j < keys; ++j) row[j] = 0;
        }
        // dQ[i0:i1] += dS K[0:i1];  dK[0:i1] += dS^T Q[i0:i1]
        gemm_serial(dqh + i0 * ldq, ldq, dP.data(), keys, Op::N, kh, ldkv, Op::N, rows, Dh, keys, true);
        gemm_serial(dkh, ldkv, dP.data(), keys, Op::T, qh + i0 * ldq, ldq, Op::N, keys, Dh, rows, true);
      }
    }
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

// Per token: do (q), dq (q), dk (kv), dv (kv).
MixerScratch attention_scratch(const NemotronHConfig& c, int64_t, int64_t) {
  return {{c.attn_q_dim(), c.attn_q_dim(), c.attn_kv_dim(), c.attn_kv_dim()}, 0};
}

// Kept for backward: q, k, v, the attention output and the log-sum-exp of
// each softmax row (backward recomputes the probabilities).
template <class T>
struct AttentionSaved {
  Buf<T> q, k, v, o, lse;
  std::array<Buf<T>*, 5> all() { return {&q, &k, &v, &o, &lse}; }
};

template <class T>
class AttentionMixer final : public MixerKeeping<T, AttentionSaved<T>, sizes> {
  using Base = MixerKeeping<T, AttentionSaved<T>, sizes>;
  using Base::cfg_;
  using Base::kept_;
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
  void backward(T* dx, sim::ParamArena<T>& arena, const T* dout, const T* x, std::span<Buf<T>> scratch,
                const MixerRun& run) override;

 private:
  MixerLinear<T> q_proj_, k_proj_, v_proj_, o_proj_;
};

template <class T>
void AttentionMixer<T>::forward(T* out, const T* x, const sim::ParamArena<T>& arena, const MixerRun& run) {
  const int64_t N = run.tokens();
  Saved& k = *kept_;
  q_proj_.forward(k.q.data(), x, arena, N, run.again);
  k_proj_.forward(k.k.data(), x, arena, N, run.again);
  v_proj_.forward(k.v.data(), x, arena, N, run.again);
  keep_bf16(run, k.q.data(), N * cfg_.attn_q_dim());
  keep_bf16(run, k.k.data(), N * cfg_.attn_kv_dim());
  keep_bf16(run, k.v.data(), N * cfg_.attn_kv_dim());
  attention_forward(k.o.data(), k.lse.data(), k.q.data(), k.k.data(), k.v.data(),
                    attn_dims(cfg_, run.batch, run.seqlen));
  keep_bf16(run, k.o.data(), N * cfg_.attn_q_dim());
  if (run.again) return;
  o_proj_.forward(out, k.o.data(), arena, N, false);
}

template <class T>
void AttentionMixer<T>::backward(T* dx, sim::ParamArena<T>& arena, const T* dout, const T* x,
                                 std::span<Buf<T>> scratch, const MixerRun& run) {
  const int64_t N = run.tokens(), qd = cfg_.attn_q_dim(), kvd = cfg_.attn_kv_dim();
  Saved& k = *kept_;
  T* dO = scratch[0].data();
  T* dq = scratch[1].data();
  T* dk = scratch[2].data();
  T* dv = scratch[3].data();
  sim::zero(dO, N * qd), sim::zero(dq, N * qd), sim::zero(dk, N * kvd), sim::zero(dv, N * kvd);
  o_proj_.backward(dO, arena, dout, k.o.data(), N);
  attention_backward(dq, dk, dv, dO, k.o.data(), k.lse.data(), k.q.data(), k.k.data(), k.v.data(),
                     attn_dims(cfg_, run.batch, run.seqlen));
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

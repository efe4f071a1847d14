#include "models/attention.hpp"

#include <algorithm>
#include <cmath>

#include "sim/gemm.hpp"
#include "sim/parallel.hpp"
#include "sim/tensor.hpp"

namespace exmy::models {

using sim::Buf;
using sim::gemm_serial;
using sim::Op;

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
    Buf<T> P(static_cast<size_t>(S * S));
    gemm_serial(P.data(), S, qh, ldq, Op::N, kh, ldkv, Op::T, S, S, Dh, false);
    for (int64_t i = 0; i < S; ++i) {
      T* row = P.data() + i * S;
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
      for (int64_t j = i + 1; j < S; ++j) row[j] = 0;
      lse[(b * Hq + h) * S + i] = mx + std::log(sum);
    }
    gemm_serial(out + b * S * ldq + h * Dh, ldq, P.data(), S, Op::N, vh, ldkv, Op::N, S, Dh, S, false);
  }
}

template <class T>
void attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* out, const T* lse, const T* q, const T* k,
                        const T* v, const AttnDims& d) {
  const int64_t S = d.seqlen, Dh = d.head_dim, Hq = d.q_heads, Hkv = d.kv_heads, rep = Hq / Hkv;
  const int64_t ldq = Hq * Dh, ldkv = Hkv * Dh;
  const T scale = T(1) / std::sqrt(static_cast<T>(Dh));
  // One unit per (batch, kv head): the query heads that share a key/value
  // head add their dk, dv in head order.
#pragma omp parallel for schedule(dynamic, 1) if (d.batch * Hq * S * S * Dh >= sim::parallel_min_work())
  for (int64_t u = 0; u < d.batch * Hkv; ++u) {
    const int64_t b = u / Hkv, kvh = u % Hkv;
    const T* kh = k + b * S * ldkv + kvh * Dh;
    const T* vh = v + b * S * ldkv + kvh * Dh;
    T* dkh = dk + b * S * ldkv + kvh * Dh;
    T* dvh = dv + b * S * ldkv + kvh * Dh;
    Buf<T> P(static_cast<size_t>(S * S)), dP(static_cast<size_t>(S * S));
    for (int64_t h = kvh * rep; h < (kvh + 1) * rep; ++h) {
      const T* qh = q + b * S * ldq + h * Dh;
      const T* oh = out + b * S * ldq + h * Dh;
      const T* doh = dout + b * S * ldq + h * Dh;
      T* dqh = dq + b * S * ldq + h * Dh;
      const T* l = lse + (b * Hq + h) * S;
      // Recompute the probabilities from the saved log-sum-exp.
      gemm_serial(P.data(), S, qh, ldq, Op::N, kh, ldkv, Op::T, S, S, Dh, false);
      for (int64_t i = 0; i < S; ++i) {
        T* row = P.data() + i * S;
        for (int64_t j = 0; j <= i; ++j) row[j] = std::exp(row[j] * scale - l[i]);
        for (int64_t j = i + 1; j < S; ++j) row[j] = 0;
      }
      gemm_serial(dvh, ldkv, P.data(), S, Op::T, doh, ldq, Op::N, S, Dh, S, true);
      gemm_serial(dP.data(), S, doh, ldq, Op::N, vh, ldkv, Op::T, S, S, Dh, false);
      // Softmax backward: dS = P ∘ (dP - rowsum(dO ∘ O)), times the scale
      // that multiplied the scores.
      for (int64_t i = 0; i < S; ++i) {
        T di = 0;
        for (int64_t e = 0; e < Dh; ++e) di += doh[i * ldq + e] * oh[i * ldq + e];
        T* row = dP.data() + i * S;
        const T* prow = P.data() + i * S;
        for (int64_t j = 0; j <= i; ++j) row[j] = prow[j] * (row[j] - di) * scale;
        for (int64_t j = i + 1; j < S; ++j) row[j] = 0;
      }
      gemm_serial(dqh, ldq, dP.data(), S, Op::N, kh, ldkv, Op::N, S, Dh, S, true);
      gemm_serial(dkh, ldkv, dP.data(), S, Op::T, qh, ldq, Op::N, S, Dh, S, true);
    }
  }
}

template void attention_forward<float>(float*, float*, const float*, const float*, const float*, const AttnDims&);
template void attention_forward<double>(double*, double*, const double*, const double*, const double*,
                                        const AttnDims&);
template void attention_backward<float>(float*, float*, float*, const float*, const float*, const float*, const float*,
                                        const float*, const float*, const AttnDims&);
template void attention_backward<double>(double*, double*, double*, const double*, const double*, const double*,
                                         const double*, const double*, const double*, const AttnDims&);

}  // namespace exmy::models

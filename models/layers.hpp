// Nemotron-H layers other than the SSD scan and attention, as llm.c-style
// pairs of free functions: outputs first, then inputs, then sizes, the shape
// of every pointer in a comment. All buffers are row-major; N counts tokens
// (batch x sequence).
//
// Every backward function ACCUMULATES (+=) into every gradient it produces,
// parameter gradients and input gradients alike; the caller zeroes them.
//
// Templated on the scalar type: float for training, double for gradient
// checks. Threading is over rows or channel blocks fixed by the shapes, and
// every reduction across rows runs in a fixed order (per-block partial sums
// added in block order), so results do not depend on the thread count.
#pragma once

#include <cmath>
#include <cstdint>

namespace exmy::models {

// out (N,C) = wte[tokens[n]]; tokens (N) in [0,V); wte (V,C)
template <class T>
void embedding_forward(T* out, const int32_t* tokens, const T* wte, int64_t N, int64_t C);
// dwte (V,C) += scatter of dout (N,C) by tokens (N)
template <class T>
void embedding_backward(T* dwte, const T* dout, const int32_t* tokens, int64_t N, int64_t C);

// out (N,C) = w * (x * rstd), rstd (N) = 1/sqrt(mean(x^2) + eps); x (N,C), w (C)
template <class T>
void rmsnorm_forward(T* out, T* rstd, const T* x, const T* w, int64_t N, int64_t C, double eps);
// dx (N,C) +=, dw (C) +=; dout (N,C), x (N,C), w (C), rstd (N) from forward
template <class T>
void rmsnorm_backward(T* dx, T* dw, const T* dout, const T* x, const T* w, const T* rstd, int64_t N, int64_t C);

// Gated grouped RMSNorm of the Mamba-2 mixer (HF MambaRMSNormGated with
// norm_before_gate=False): g = y * silu(z), normalised over each of the G
// groups of D/G channels, times w.
// out (N,D), rstd (N,G); y (N,D) row stride ldy; z (N,D) row stride ldz; w (D)
template <class T>
void gated_rmsnorm_forward(T* out, T* rstd, const T* y, int64_t ldy, const T* z, int64_t ldz, const T* w, int64_t N,
                           int64_t D, int64_t G, double eps);
// dy (N,D) row stride ldy +=, dz (N,D) row stride lddz +=, dw (D) +=
template <class T>
void gated_rmsnorm_backward(T* dy, int64_t lddy, T* dz, int64_t lddz, T* dw, const T* dout, const T* y, int64_t ldy,
                            const T* z, int64_t ldz, const T* w, const T* rstd, int64_t N, int64_t D, int64_t G);

// Causal depthwise conv1d over time with bias, then SiLU:
// out[b,t,c] = silu(bias[c] + sum_k w[c,k] * x[b, t+k-(K-1), c]) (zero before t=0).
// out (B,T,Cc) contiguous; x (B,T,Cc) row stride ldx; w (Cc,K); bias (Cc) or null
template <class T>
void conv1d_silu_forward(T* out, const T* x, int64_t ldx, const T* w, const T* bias, int64_t B, int64_t T_, int64_t Cc,
                         int64_t K);
// dx (B,T,Cc) row stride lddx +=, dw (Cc,K) +=, dbias (Cc) += (when bias is not null);
// dout (B,T,Cc) contiguous. The pre-activation is recomputed.
template <class T>
void conv1d_silu_backward(T* dx, int64_t lddx, T* dw, T* dbias, const T* dout, const T* x, int64_t ldx, const T* w,
                          const T* bias, int64_t B, int64_t T_, int64_t Cc, int64_t K);

// Squared ReLU of the MLP: out (n) = relu(in)^2
template <class T>
void relu2_forward(T* out, const T* in, int64_t n);
// din (n) += dout * 2 relu(in)
template <class T>
void relu2_backward(T* din, const T* dout, const T* in, int64_t n);

// out (n) = a + b (the residual add)
template <class T>
void add_forward(T* out, const T* a, const T* b, int64_t n);

// Cross-entropy of logits (N,V) against targets (N); a target < 0 is
// ignored. losses (N) gets -log softmax(logits)[target] (0 for ignored rows),
// each row's sum of exponentials taken in double. Returns the mean over
// counted rows, summed in double in row order (the reported loss), and sets
// *counted.
template <class T>
double cross_entropy_forward(double* losses, int64_t* counted, const T* logits, const int32_t* targets, int64_t N,
                             int64_t V);
// dlogits (N,V) += scale * (softmax(logits) - onehot(target)) on counted
// rows; scale is dloss / counted for the mean loss.
template <class T>
void cross_entropy_backward(T* dlogits, const T* logits, const int32_t* targets, int64_t N, int64_t V, double scale);

// Scalar helpers shared with the SSD and the tests.
template <class T>
inline T sigmoid(T x) {
  return T(1) / (T(1) + std::exp(-x));
}
template <class T>
inline T silu(T x) {
  return x * sigmoid(x);
}
// torch.nn.functional.softplus (beta 1, threshold 20).
template <class T>
inline T softplus(T x) {
  return x > T(20) ? x : std::log1p(std::exp(x));
}

}  // namespace exmy::models

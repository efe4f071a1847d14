#include "sim/linear.hpp"

#include <algorithm>
#include <cmath>

#include "formats/error.hpp"
#include "formats/launch_profile.hpp"
#include "formats/round.hpp"
#include "formats/spec.hpp"
#include "sim/bf16.hpp"
#include "sim/gemm.hpp"
#include "sim/parallel.hpp"

namespace exmy::sim {

std::string_view linear_kind_name(LinearKind kind) {
  switch (kind) {
    case LinearKind::mamba_in_proj: return "in_proj";
    case LinearKind::mamba_out_proj: return "out_proj";
    case LinearKind::attn_q: return "q_proj";
    case LinearKind::attn_k: return "k_proj";
    case LinearKind::attn_v: return "v_proj";
    case LinearKind::attn_o: return "o_proj";
    case LinearKind::mlp_up: return "up_proj";
    case LinearKind::mlp_down: return "down_proj";
    case LinearKind::lm_head: return "lm_head";
  }
  return "?";
}

const std::vector<std::string>& linear_policy_names() {
  static const std::vector<std::string> names = {"fp32", "bf16"};
  return names;
}

LinearPolicy parse_linear_policy(std::string_view policy) {
  if (policy == "fp32") return LinearPolicy::fp32;
  if (policy == "bf16") return LinearPolicy::bf16;
  throw Error("unknown precision policy '" + std::string(policy) + "' (expected fp32 or bf16)");
}

// The bit trick of sim/bf16.hpp, shared with the device; tested against
// exmy::encode_exact.
float round_bf16(float x) { return round_bf16_hd(x); }

// Doubles only occur in gradient checks, so the exact rounding core does the
// work (a double has more bits than the float bit trick can see).
double round_bf16(double x) {
  static const Format bf16 = parse_format("bf16");
  if (std::isnan(x)) return x;
  return bf16.decode(encode_exact(bf16, x, Round::rne, 0, 0, false).code);
}

template <class T>
void round_bf16(T* out, const T* in, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= parallel_min_work())
  for (int64_t i = 0; i < n; ++i) out[i] = round_bf16(in[i]);
}
template void round_bf16<float>(float*, const float*, int64_t);
template void round_bf16<double>(double*, const double*, int64_t);

namespace {

// The three GEMMs of a linear layer on the operands as given, each timed
// while a launch profile is on (exmy bench train --profile).
template <class T>
void fprop(T* Y, const T* X, const T* W, int64_t tokens, int64_t in, int64_t out) {
  launch_profile_host("gemm fprop (sim::gemm)", gemm_flops(tokens, in, out),
                      [&] { gemm(Y, out, X, in, Op::N, W, in, Op::T, tokens, out, in, false); });
}
template <class T>
void dgrad(T* dX, const T* dY, const T* W, int64_t tokens, int64_t in, int64_t out) {
  launch_profile_host("gemm dgrad (sim::gemm)", gemm_flops(tokens, in, out),
                      [&] { gemm(dX, in, dY, out, Op::N, W, in, Op::N, tokens, in, out, true); });
}
template <class T>
void wgrad(T* dW, const T* dY, const T* X, int64_t tokens, int64_t in, int64_t out) {
  launch_profile_host("gemm wgrad (sim::gemm)", gemm_flops(tokens, in, out),
                      [&] { gemm(dW, in, dY, out, Op::T, X, in, Op::N, out, in, tokens, true); });
}

template <class T>
class PlainLinear final : public Linear<T> {
 public:
  using Linear<T>::Linear;
  void forward(T* Y, const T* X, const T* W, int64_t tokens) override {
    fprop(Y, X, W, tokens, this->info_.in_features, this->info_.out_features);
  }
  void backward(T* dX, T* dW, const T* dY, const T* X, const T* W, int64_t tokens) override {
    const int64_t in = this->info_.in_features, out = this->info_.out_features;
    if (dX) dgrad(dX, dY, W, tokens, in, out);
    wgrad(dW, dY, X, tokens, in, out);
  }
};

// Rounds each operand into scratch buffers owned by the layer, then runs the
// plain GEMM: products of bf16 values are exact in float, so this is a BF16
// tensor-core GEMM with FP32 accumulation up to the order of the sum.
template <class T>
class Bf16Linear final : public Linear<T> {
 public:
  using Linear<T>::Linear;
  void forward(T* Y, const T* X, const T* W, int64_t tokens) override {
    const int64_t in = this->info_.in_features, out = this->info_.out_features;
    const T* xq = rounded(x_, X, tokens * in);
    const T* wq = rounded(w_, W, out * in);
    fprop(Y, xq, wq, tokens, in, out);
  }
  void backward(T* dX, T* dW, const T* dY, const T* X, const T* W, int64_t tokens) override {
    const int64_t in = this->info_.in_features, out = this->info_.out_features;
    const T* dyq = rounded(dy_, dY, tokens * out);
    if (dX) dgrad(dX, dyq, rounded(w_, W, out * in), tokens, in, out);
    wgrad(dW, dyq, rounded(x_, X, tokens * in), tokens, in, out);
  }

 private:
  static const T* rounded(Buf<T>& buf, const T* src, int64_t n) {
    if (static_cast<int64_t>(buf.size()) < n) buf.resize(static_cast<size_t>(n));
    round_bf16(buf.data(), src, n);
    return buf.data();
  }
  Buf<T> x_, w_, dy_;
};

template <class T>
class PlainFactory final : public LinearFactory<T> {
 public:
  std::string policy() const override { return "fp32"; }
  std::unique_ptr<Linear<T>> make(const LinearInfo& info) const override {
    return std::make_unique<PlainLinear<T>>(info);
  }
};

template <class T>
class Bf16Factory final : public LinearFactory<T> {
 public:
  std::string policy() const override { return "bf16"; }
  std::unique_ptr<Linear<T>> make(const LinearInfo& info) const override {
    return std::make_unique<Bf16Linear<T>>(info);
  }
};

}  // namespace

template <class T>
std::unique_ptr<LinearFactory<T>> make_linear_factory(std::string_view policy) {
  switch (parse_linear_policy(policy)) {
    case LinearPolicy::fp32: return std::make_unique<PlainFactory<T>>();
    case LinearPolicy::bf16: return std::make_unique<Bf16Factory<T>>();
  }
  return nullptr;  // not reached
}
template std::unique_ptr<LinearFactory<float>> make_linear_factory<float>(std::string_view);
template std::unique_ptr<LinearFactory<double>> make_linear_factory<double>(std::string_view);

double cuda_bf16_linear_scratch_bytes(const std::vector<LinearInfo>& linears, int64_t tokens) {
  int64_t x = 0, w = 0, dy = 0;
  for (const LinearInfo& l : linears) {
    x = std::max(x, tokens * l.in_features);
    w = std::max(w, l.out_features * l.in_features);
    dy = std::max(dy, tokens * l.out_features);
  }
  return 2.0 * static_cast<double>(x + w + dy);
}

}  // namespace exmy::sim

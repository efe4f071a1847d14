// The one interface every linear layer of a model goes through.
//
// A Linear is created once per layer by a LinearFactory (the run's precision
// policy: `fp32`, `bf16`, later the quantized recipes) and is called with the
// high-precision tensors the layer owns: the input X, the weight W straight
// from the parameter arena and, in backward, the output gradient dY. The
// implementation decides what happens to each GEMM operand, so the six operand
// roles of a quantized recipe map onto these calls as
//
//   forward  (fprop):  Y  = X · W^T        fprop-x  = X,  fprop-w  = W
//   backward (dgrad):  dX += dY · W        dgrad-dy = dY, dgrad-w  = W
//   backward (wgrad):  dW += dY^T · X      wgrad-dy = dY, wgrad-x  = X
//
// and every operand arrives unquantized, so each role can be quantized from
// the high-precision tensor (never from another role's quantized copy).
//
// Layout: row-major; X is (tokens, in), W is (out, in) as in HF checkpoints,
// Y and dY are (tokens, out). backward ACCUMULATES into dX and dW (callers
// zero them), like every layer backward in models/.
//
// The layers of models/ never know which policy is active: they hold a
// Linear per weight and call it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "sim/tensor.hpp"

namespace exmy::sim {

enum class LinearKind : uint8_t {
  mamba_in_proj,
  mamba_out_proj,
  attn_q,
  attn_k,
  attn_v,
  attn_o,
  mlp_up,
  mlp_down,
  lm_head,
};

// The HF module name of a kind: in_proj, out_proj, q_proj, k_proj, v_proj,
// o_proj, up_proj, down_proj, lm_head.
std::string_view linear_kind_name(LinearKind kind);

struct LinearInfo {
  std::string name;          // stable name: "layers.3.mixer.in_proj", "lm_head" (its weight is name + ".weight")
  int layer = -1;            // block index; num_hidden_layers for the LM head
  LinearKind kind = LinearKind::mlp_up;
  int64_t in_features = 0;   // K of the forward GEMM
  int64_t out_features = 0;  // N of the forward GEMM
};

template <class T>
class Linear {
 public:
  explicit Linear(LinearInfo info) : info_(std::move(info)) {}
  virtual ~Linear() = default;
  Linear(const Linear&) = delete;
  Linear& operator=(const Linear&) = delete;

  const LinearInfo& info() const { return info_; }

  // Y (tokens, out) = X (tokens, in) · W^T, W (out, in). Overwrites Y.
  virtual void forward(T* Y, const T* X, const T* W, int64_t tokens) = 0;

  // The same forward again, for activation recompute (NemotronH::
  // set_recompute): Y must come out with the same bits as the forward of
  // this micro-batch did, and nothing the forward records (statistics,
  // captures, tensor-reference samples) may be recorded twice. A Linear
  // that wraps another passes it on to the inner one.
  virtual void recompute_forward(T* Y, const T* X, const T* W, int64_t tokens) { forward(Y, X, W, tokens); }

  // dX (tokens, in) += dY (tokens, out) · W and dW (out, in) += dY^T · X.
  // dX may be null when the input needs no gradient.
  virtual void backward(T* dX, T* dW, const T* dY, const T* X, const T* W, int64_t tokens) = 0;

 protected:
  LinearInfo info_;
};

// A precision policy: makes the Linear of each layer. A recipe's factory
// can keep per-layer state (scale references, RNG streams) in the objects it
// makes, keyed by LinearInfo::name.
template <class T>
class LinearFactory {
 public:
  virtual ~LinearFactory() = default;
  virtual std::string policy() const = 0;  // the name a run configuration gives it
  virtual std::unique_ptr<Linear<T>> make(const LinearInfo& info) const = 0;
};

// `fp32`: plain GEMMs in T (float for training, double for gradient checks).
// `bf16`: every GEMM operand rounded to bfloat16 (round to nearest even), the
// product accumulated in T. Throws exmy::Error for any other name.
template <class T>
std::unique_ptr<LinearFactory<T>> make_linear_factory(std::string_view policy);

const std::vector<std::string>& linear_policy_names();

// The plain policies by name, for every backend that implements them (the
// CPU's make_linear_factory, the device's make_cuda_linear_factory in
// sim/cuda/linear_cuda.hpp): "fp32" or "bf16"; any other name throws
// exmy::Error "unknown precision policy 'NAME' (expected fp32 or bf16)".
enum class LinearPolicy : uint8_t { fp32, bf16 };
LinearPolicy parse_linear_policy(std::string_view policy);

// The bytes of a CUDA device's `bf16` Linears' shared operand scratch
// (sim/cuda/linear_cuda.cpp: one BF16 buffer each for X, W and dY, each
// grown to the largest call, two bytes an element) once `linears` have run
// forward and backward on `tokens` tokens. For the memory plan of a device
// run (sim/train: RankPlan::linear_scratch).
double cuda_bf16_linear_scratch_bytes(const std::vector<LinearInfo>& linears, int64_t tokens);

// Round to the nearest bfloat16, ties to even, as a value of the same type.
// NaN stays NaN, overflow gives +-Inf (IEEE behaviour, no saturation). The
// float one is sim::bf16_bits (sim/bf16.hpp), which the device's `bf16`
// policy rounds with too.
float round_bf16(float x);
double round_bf16(double x);
template <class T>
void round_bf16(T* out, const T* in, int64_t n);

}  // namespace exmy::sim

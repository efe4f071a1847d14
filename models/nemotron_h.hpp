// The Nemotron-H language model assembled from its pattern string: token
// embedding, then one block per pattern letter (pre-RMSNorm, mixer,
// residual add), final RMSNorm and an untied LM head, with the cross-entropy
// loss. Mixers: M = Mamba-2, * = causal GQA attention, - = squared-ReLU MLP,
// one file each behind models/mixer.hpp; this class keeps the block
// structure (pre-norm, residual, block recompute), the embedding, the head
// and the loss.
//
// Parameters live in one ParamArena (names as in HF checkpoints without the
// "backbone."/"model." prefix). The model runs on a Backend
// (models/backend.hpp): the arena, the activations and every kernel are the
// backend's, so on a device backend the pointers the model hands out
// (arena(), logits()) are device pointers. Every linear layer is a sim::Linear made by
// the precision policy's factory, so the model never knows which policy runs.
//
// forward() keeps what backward() needs; backward() accumulates the
// gradient of the mean loss into arena().grads() (zero them first with
// arena().zero_grad(), llm.c style: the training loop reads forward, zero
// grad, backward, update). Results are bit-identical for any thread count.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "models/backend.hpp"
#include "models/config.hpp"
#include "sim/arena.hpp"
#include "sim/linear.hpp"
#include "sim/memory.hpp"
#include "sim/tensor.hpp"

namespace exmy::models {

// The model's linears as its mixers make them (name, block, kind, in and
// out features), read from its layout's linear weights in layout order (the
// LM head, when it has its own weight, last): what a memory plan needs to
// know of the linears a recipe quantizes.
std::vector<sim::LinearInfo> linear_infos(const NemotronHConfig& cfg);


template <class T>
class NemotronH {
 public:
  // Validates the config (exmy::Error on a bad one) and builds the arena
  // (zero parameters: call init_weights or load weights) in the backend's
  // memory. The backend (and the factory's linears, which must work on its
  // memory) outlive the model.
  NemotronH(const NemotronHConfig& cfg, const sim::LinearFactory<T>& factory, Backend<T>& be = cpu_backend<T>());
  ~NemotronH();

  const NemotronHConfig& config() const { return cfg_; }
  Backend<T>& backend() const { return *be_; }
  sim::ParamArena<T>& arena() { return arena_; }
  const sim::ParamArena<T>& arena() const { return arena_; }
  // One per linear layer, in forward order (blocks, then the LM head).
  const std::vector<std::unique_ptr<sim::Linear<T>>>& linears() const { return linears_; }

  // BF16 activations (the `bf16` precision policy): the tensors a BF16
  // trainer holds in BF16 are rounded to bfloat16 (round to nearest even)
  // where they are produced: the embedding output, every norm output, every
  // linear output (in_proj, q/k/v, up, out_proj/o_proj/down_proj, logits),
  // the conv1d+SiLU output, the SSD output, the gated-norm output, the
  // attention output, the squared-ReLU output, and the residual stream
  // unless config().residual_in_fp32. Statistics (1/rms, log-sum-exp), dt,
  // the SSD's cumulative decays and chunk states, softmax probabilities and
  // the loss stay FP32; gradients stay FP32 except where a linear layer's
  // policy rounds them as GEMM operands. Off by default (FP32 everywhere).
  void set_bf16_activations(bool on) { bf16_act_ = on; }
  bool bf16_activations() const { return bf16_act_; }

  // Activation recompute per block (train.recompute = blocks): forward keeps
  // only the residual stream entering each block (and one set of a block's
  // tensors per block type, shared); backward runs each block's forward
  // again, from its input, just before the block's backward. The results
  // are bit-identical to keeping everything: every kernel is
  // deterministic, and the linears run again through
  // Linear::recompute_forward, which repeats no side effect (statistics,
  // captures, tensor-reference updates). Off by default.
  void set_recompute(bool on);
  bool recompute() const { return recompute_; }

  // HF-style initialization from a seed: normal(0, initializer_range) for
  // embeddings and linear weights; Mamba out_proj kaiming-uniform divided by
  // sqrt(num_hidden_layers) (rescale_prenorm_residual); conv1d PyTorch's
  // default uniform; A_log = log(1..heads), D = 1, dt_bias = softplus^-1 of a
  // log-uniform dt in [time_step_min, time_step_max]; norm weights 1. Each
  // parameter draws from its own stream (seed, parameter index), so the
  // values do not depend on the thread count or on other parameters.
  void init_weights(uint64_t seed);

  // tokens and targets are (B,T); a target < 0 is ignored. Returns the mean
  // cross-entropy over counted targets (summed in double), or 0 when targets
  // is null. Throws exmy::Error for a token outside the vocabulary.
  double forward(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T_);
  // Gradient of the last forward's mean loss, added into arena().grads().
  void backward();

  // Of the last forward: logits (B,T,vocab), in the backend's memory, and
  // per-token losses (B,T), on the host.
  const T* logits() const { return logits_.data(); }
  std::span<const double> token_losses() const { return {losses_.data(), losses_.size()}; }
  int64_t counted_targets() const { return counted_; }

 private:
  struct Block;
  NemotronHConfig cfg_;
  Backend<T>* be_;
  sim::ParamArena<T> arena_;
  std::vector<std::unique_ptr<sim::Linear<T>>> linears_;
  std::vector<std::unique_ptr<Block>> blocks_;
  sim::Linear<T>* lm_head_ = nullptr;
  int wte_ = -1, norm_f_ = -1, lm_head_w_ = -1;
  bool bf16_act_ = false;
  bool recompute_ = false;

  // Activations of the last forward.
  int64_t B_ = 0, T_ = 0;
  std::vector<int32_t> tokens_, targets_;
  sim::MemBuf<T> resid_;  // (L+1, N, C): the residual stream entering each block, and the final one
  sim::MemBuf<T> lnf_, rstdf_, logits_;
  std::vector<double> losses_;
  int64_t counted_ = 0;
  sim::MemBuf<T> mix_out_;  // (N, C) scratch: a mixer's output before the residual add
  // Backward scratch, shared by the blocks.
  sim::MemBuf<T> dresid_, dln_, dlnf_, dlogits_;
  std::vector<sim::MemBuf<T>> scratch_;  // the mixers' backward buffers (MixerScratch::per_token)

  void allocate(int64_t B, int64_t seq);
  void block_forward(int64_t l, bool again);
  T* resid(int64_t l) { return resid_.data() + l * B_ * T_ * cfg_.hidden_size; }
};

// Bytes of activations kept for backward per (B x T) batch, and the largest
// backward scratch, as allocated by NemotronH (training_memory uses these).
struct ActivationBytes {
  double kept = 0, scratch = 0;
};
ActivationBytes activation_bytes(const NemotronHConfig& cfg, int64_t B, int64_t T_, int64_t scalar_bytes,
                                 bool recompute = false);

}  // namespace exmy::models

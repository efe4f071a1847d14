// Nemotron-H configuration: the fields of HF's NemotronHConfig that shape the
// model, the published presets and the proxies, `--set model.FIELD=VALUE`
// overrides, validation, parameter counts, FLOPs per token and a training
// memory estimate.
//
// Every field is a row of one table (config.cpp: kFields) that drives JSON
// reading and writing, overrides and printing, so adding a field is one line.
#pragma once

#include <array>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "sim/arena.hpp"

namespace exmy::models {

struct NemotronHConfig {
  std::string name = "custom";  // preset name or file the config came from (not an HF field)

  int64_t vocab_size = 131072;
  int64_t hidden_size = 4096;
  int64_t intermediate_size = 21504;  // MLP width
  int64_t num_hidden_layers = 52;     // must equal the pattern length
  // One letter per block: M = Mamba-2, * = attention, - = MLP.
  std::string hybrid_override_pattern = "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-";

  int64_t num_attention_heads = 32;
  int64_t num_key_value_heads = 8;
  int64_t head_dim = 128;  // HF: head_dim or attention_head_dim

  int64_t mamba_num_heads = 128;
  int64_t mamba_head_dim = 64;
  int64_t ssm_state_size = 128;
  int64_t n_groups = 8;
  int64_t conv_kernel = 4;
  int64_t chunk_size = 128;
  int64_t expand = 2;  // informational: HF sizes the mixer as mamba_num_heads * mamba_head_dim

  double layer_norm_epsilon = 1e-5;
  // dt = clamp(softplus(dt + dt_bias), lo, hi): mamba_ssm's dt_limit, which
  // HF passes to the fused kernels (the default (0, inf) is no clamp).
  std::array<double, 2> time_step_limit = {0.0, std::numeric_limits<double>::infinity()};
  // Initialization of dt_bias: dt log-uniform in [min, max], floored.
  double time_step_min = 0.001;
  double time_step_max = 0.1;
  double time_step_floor = 1e-4;
  double initializer_range = 0.02;
  bool rescale_prenorm_residual = true;  // Mamba out_proj init divided by sqrt(num_hidden_layers) (ParamInit::rescaled_out)

  bool use_bias = false;         // linear biases of the mixer (unsupported: Nemotron-H has none)
  bool use_conv_bias = true;
  bool mamba_proj_bias = false;  // unsupported when true
  bool mlp_bias = false;         // unsupported when true
  bool attention_bias = false;   // unsupported when true
  bool residual_in_fp32 = false; // with BF16 activations: keep the residual stream in FP32 (else it is rounded to BF16)
  bool tie_word_embeddings = false;  // unsupported when true
  std::string mlp_hidden_act = "relu2";
  std::string mamba_hidden_act = "silu";
  int64_t max_position_embeddings = 8192;  // informational: no positional encoding

  // Derived sizes.
  int64_t mamba_d_inner() const { return mamba_num_heads * mamba_head_dim; }
  int64_t mamba_conv_dim() const { return mamba_d_inner() + 2 * n_groups * ssm_state_size; }
  int64_t mamba_in_proj_dim() const { return mamba_d_inner() + mamba_conv_dim() + mamba_num_heads; }
  int64_t attn_q_dim() const { return num_attention_heads * head_dim; }
  int64_t attn_kv_dim() const { return num_key_value_heads * head_dim; }
  int64_t count_layers(char type) const;
};

// A preset by name: nemotron-h-4b, nemotron-h-8b, nemotron-h-47b,
// nemotron-h-56b, proxy-tiny, proxy-1m, proxy-10m, proxy-50m, and the GPU
// proxies in the 8B's layer style proxy-125m, proxy-350m, proxy-1b.
// Throws exmy::Error listing the names for an unknown one.
NemotronHConfig preset_config(std::string_view name);
const std::vector<std::string>& preset_names();
// The preset names for help texts, families shortened:
// "nemotron-h-4b/8b/47b/56b, proxy-tiny/1m/10m/50m/125m/350m/1b".
std::string preset_list();

// An HF config.json (as saved by transformers or shipped with NVIDIA's
// checkpoints). Unknown keys are ignored (HF configs carry many that do not
// shape the model); the legacy aliases (attention_head_dim, mamba_n_groups,
// mamba_d_conv, mamba_chunk_size, rms_norm_eps, mamba_dt_*, layers_block_type
// ...) are understood. Not validated: call validate().
NemotronHConfig config_from_json_text(std::string_view text, std::string_view origin);
NemotronHConfig load_config_json(const std::string& path);
// `spec` is a preset name or a path to a config.json.
NemotronHConfig resolve_config(const std::string& spec);
// An HF config.json of `cfg`, strict JSON: a non-finite float is written as
// transformers 5 writes it ({"__float__": "Infinity"}), never as a bare
// token. `torch_dtype` ("float32", "bfloat16"; empty: omitted) fills both
// `torch_dtype` (transformers 4) and `dtype` (transformers 5).
std::string config_to_json(const NemotronHConfig& cfg, const std::string& torch_dtype = "");

// `key` is a field name (an optional "model." prefix is stripped); `value`
// is parsed for the field's type. Setting hybrid_override_pattern also sets
// num_hidden_layers. Throws exmy::Error naming an unknown field or bad value.
void apply_override(NemotronHConfig& cfg, std::string_view key, std::string_view value);
// "key=value" form, as given to --set.
void apply_override(NemotronHConfig& cfg, std::string_view assignment);

// Throws exmy::Error with a one-line message for the first problem found.
void validate(const NemotronHConfig& cfg);

// name = value lines, one per field.
std::string describe(const NemotronHConfig& cfg);
std::vector<std::string> field_names();

// The parameter arena of the model (names, shapes, weight-decay flags).
// Parameter counts are read from it, so model-info and the model agree by
// construction.
sim::ArenaLayout make_layout(const NemotronHConfig& cfg);

// How NemotronH::init_weights fills a parameter, declared where the
// parameter is added to the layout (make_layout, a mixer's add_params) and
// kept in its view (sim::ParamView::init).
enum class ParamInit : uint8_t {
  normal = 0,    // N(0, initializer_range)
  ones,          // norm weights, Mamba's D
  a_log,         // A_log[h] = log(h + 1)
  dt_bias,       // softplus^-1(dt), dt = max(exp(U(log time_step_min, log time_step_max)), time_step_floor)
  conv_uniform,  // U(-1/sqrt(conv_kernel), 1/sqrt(conv_kernel)): PyTorch's depthwise Conv1d default
  // With rescale_prenorm_residual U(-b, b), b = 1/sqrt(fan_in)/sqrt(num_hidden_layers)
  // (kaiming_uniform(a=sqrt(5)), then HF's rescale); else normal.
  rescaled_out,
};
// layout.add with the parameter's initialisation.
inline int add_param(sim::ArenaLayout& layout, std::string name, std::vector<int64_t> shape, bool weight_decay,
                     ParamInit init) {
  return layout.add(std::move(name), std::move(shape), weight_decay, static_cast<uint8_t>(init));
}

// Parameter counts per component, read from make_layout(). Rows come in
// order: "embeddings"; then for each block type present ("mamba",
// "attention", "mlp") one row per component (in_proj, conv1d, ..., norm
// = the block's pre-norm) with the per-layer count and the number of such
// layers; then "final" norm_f and lm_head.
struct ComponentCount {
  std::string block;      // embeddings, mamba, attention, mlp, final
  std::string component;  // e.g. in_proj, conv1d, A_log, norm
  int64_t per_layer = 0;
  int64_t layers = 1;
  int64_t total() const { return per_layer * layers; }
};
std::vector<ComponentCount> parameter_breakdown(const NemotronHConfig& cfg);
int64_t parameter_count(const NemotronHConfig& cfg);

// FLOPs of one token, counted as 2 per multiply-add; seq_len sets the
// attention and SSD terms. Causal attention counts the (t+1)/2 average keys.
struct FlopCount {
  double linear = 0;     // every linear layer incl. the LM head
  double attention = 0;  // QK^T and PV
  double ssd = 0;        // chunked SSD scan: CB^T, intra-chunk, chunk states, state-to-output
  double forward() const { return linear + attention + ssd; }
  double training() const { return 3 * forward(); }  // forward + dgrad + wgrad
};
FlopCount flops_per_token(const NemotronHConfig& cfg, int64_t seq_len);

// Bytes of a training step with FP32 master weights, gradients and AdamW
// moments, plus the activations this implementation keeps for backward.
struct MemoryEstimate {
  double params = 0, grads = 0, optimizer = 0;
  // FP32 master weights kept apart from the working weights in the memory
  // the model trains in (BF16 working weights, optimizer not offloaded).
  double master = 0;
  double activations = 0;  // kept for backward, for batch x seq_len tokens
  double workspace = 0;    // largest temporary (backward buffers, logits)
  // Gradient accumulation: the step's running sum of the micro-batches'
  // gradients and the ones a rank holds until the lower ranks' sum arrives.
  double grad_sums = 0;
  // The quantized linears' shared scratch (sim::quant::quant_scratch_bytes:
  // the recipe's operands, encodings and backward results at their largest).
  double quant_scratch = 0;
  // A CUDA device's `bf16` plain Linears' BF16 operand copies
  // (sim::cuda_bf16_linear_scratch_bytes).
  double linear_scratch = 0;
  // Bytes in host memory while the rest is on a device (train.offload =
  // optimizer: FP32 master weights, AdamW moments, a staged chunk of
  // gradients, optimizer then 0; ranks that reach each other through host
  // copies: their gradient sums and staging). Not part of total().
  double host_state = 0;
  // The bytes in the memory the model trains in (a device's, or the host's).
  double total() const {
    return params + grads + optimizer + master + activations + workspace + grad_sums + quant_scratch + linear_scratch;
  }
};
// With `recompute` (block recompute, NemotronH::set_recompute) one block's
// kept tensors per block type instead of every block's.
MemoryEstimate training_memory(const NemotronHConfig& cfg, int64_t batch, int64_t seq_len, bool recompute = false);

}  // namespace exmy::models

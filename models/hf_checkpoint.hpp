// HF-format checkpoints of Nemotron-H: config.json plus safetensors weights.
// Tensor names may carry the "backbone." prefix of NVIDIA's checkpoints or
// the "model." prefix of transformers 5; the arena's names have neither.
#pragma once

#include <string>

#include "models/nemotron_h.hpp"

namespace exmy::models {

// Loads every parameter of the model from `path`: a .safetensors file, or a
// directory holding model.safetensors or the shards named by
// model.safetensors.index.json. Shapes must match the model's config. A
// missing parameter, a shape mismatch or an unexpected weight is an
// exmy::Error naming it (multi-token-prediction "mtp.*" tensors are skipped).
template <class T>
void load_hf_weights(NemotronH<T>& model, const std::string& path);

// Writes DIR/config.json and DIR/model.safetensors with names prefixed
// "backbone." (NVIDIA's layout, which transformers renames on load); dtype
// is "F32" or "BF16" (round to nearest even). transformers then computes the
// same logits up to FP32 noise, except that it clamps dt at time_step_min
// where exmy applies time_step_limit (docs/models.md).
template <class T>
void save_hf_checkpoint(const NemotronH<T>& model, const std::string& dir, const std::string& dtype);

}  // namespace exmy::models

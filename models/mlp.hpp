// The MLP mixer (pattern letter -): down_proj(relu(up_proj(x))^2), no biases.
// The squared ReLU is in models/layers.*; this file wires it with the
// mixer's linears and kept tensors (models/mixer.hpp).
#pragma once

#include "models/mixer.hpp"

namespace exmy::models {

// The mixer's row functions (models/mixer.cpp's table).
const MixerOps& mlp_mixer();

}  // namespace exmy::models

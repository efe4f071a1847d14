// The Mamba-2 mixer (pattern letter M, HF NemotronHMamba2Mixer):
//   in_proj -> [ z (D_in) | x B C (conv_dim) | dt (heads) ]
//   xBC = silu(causal depthwise conv1d(xBC) + bias)
//   dt  = clamp(softplus(dt + dt_bias), time_step_limit)
//   y   = chunked SSD scan of x with B, C, dt, A = -exp(A_log), plus D x
//   out = out_proj(gated grouped RMSNorm(y * silu(z)))
// The kernels are in models/ssd.* and models/layers.*; this file wires them
// with the mixer's parameters, linears and kept tensors (models/mixer.hpp).
#pragma once

#include "models/mixer.hpp"
#include "models/ssd.hpp"

namespace exmy::models {

SsdDims ssd_dims(const NemotronHConfig& cfg, int64_t batch, int64_t seqlen, bool xbc_bf16 = false);

// The mixer's row functions (models/mixer.cpp's table).
const MixerOps& mamba2_mixer();

}  // namespace exmy::models

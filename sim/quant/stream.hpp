// The Philox stream of each quantization call in training (docs/recipes.md §4;
// docs/numerics.md §4 maps a stream to random bits): one stream per
// (optimizer step, micro-batch, layer, GEMM, operand), as a bit-packed 64-bit
// number so that any stream can be read back by eye:
//
//   stream = step << 32 | micro_batch << 20 | block << 8 | kind << 4 | role
//
//   step         1-based optimizer step           32 bits  (< 2^32)
//   micro_batch  0-based gradient-accumulation    12 bits  (< 4096)
//   block        LinearInfo::layer (the LM head:  12 bits  (< 4096)
//                num_hidden_layers)
//   kind         LinearKind (in_proj 0 ... lm_head 8)   4 bits
//   role         Role (fprop-x 0, fprop-w 1, dgrad-dy 2, dgrad-w 3,
//                wgrad-dy 4, wgrad-x 5): the GEMM and the operand   4 bits
//
// (block, kind) names a linear uniquely, so distinct calls never share a
// stream; the seed is the run's seed. The formula is part of exmy's
// reproducibility promise: tests pin values of it, never change it.
#pragma once

#include <cstdint>
#include <string>

#include "formats/error.hpp"
#include "sim/linear.hpp"
#include "sim/quant/recipe.hpp"

namespace exmy::sim::quant {

inline uint64_t quant_stream(int64_t step, int64_t micro_batch, int64_t block, LinearKind kind, Role role) {
  if (step < 0 || step >= (int64_t{1} << 32) || micro_batch < 0 || micro_batch >= 4096 || block < 0 || block >= 4096)
    throw Error("stochastic-rounding stream out of range: step " + std::to_string(step) + ", micro-batch " +
                std::to_string(micro_batch) + ", block " + std::to_string(block) +
                " (limits: step < 2^32, micro-batch < 4096, block < 4096)");
  return static_cast<uint64_t>(step) << 32 | static_cast<uint64_t>(micro_batch) << 20 |
         static_cast<uint64_t>(block) << 8 | static_cast<uint64_t>(kind) << 4 | static_cast<uint64_t>(role);
}

}  // namespace exmy::sim::quant

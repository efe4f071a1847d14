#include "models/mixer.hpp"

#include <array>

#include "models/attention.hpp"
#include "models/mamba2.hpp"
#include "models/mlp.hpp"

namespace exmy::models {

namespace {

// The mixer table: the one place a pattern letter is mapped to a mixer.
const std::array<MixerKind, 3>& mixers() {
  static const std::array<MixerKind, 3> kinds = {{
      {'M', "mamba", mamba2_mixer()},
      {'*', "attention", attention_mixer()},
      {'-', "mlp", mlp_mixer()},
  }};
  return kinds;
}

}  // namespace

std::span<const MixerKind> mixer_kinds() { return mixers(); }

const MixerKind* find_mixer_kind(char letter) {
  for (const MixerKind& k : mixers())
    if (k.letter == letter) return &k;
  return nullptr;
}

const MixerKind& mixer_kind(char letter) {
  const MixerKind* k = find_mixer_kind(letter);
  if (!k) throw Error("model.hybrid_override_pattern: unknown layer letter (call validate() first)");
  return *k;
}

}  // namespace exmy::models

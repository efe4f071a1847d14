// Random bits for stochastic rounding (docs/numerics.md §4): counter-based
// Philox4x32-10 from Random123, mapped to elements so that any thread count,
// block shape or launch shape draws the same bits for the same element.
#pragma once

#include <cstdint>

#include <Random123/philox.h>

#include "formats/format.hpp"

namespace exmy {

// The four 32-bit words of Philox4x32-10 for counter block `c`:
// words 4c .. 4c+3 of the (seed, stream) sequence. This equals cuRAND's
// curand_init(seed, stream, 4c) followed by four curand() calls.
struct PhiloxBlock {
  uint32_t w[4];
};

EXMY_HD PhiloxBlock philox_block(uint64_t seed, uint64_t stream, uint64_t c) {
  r123::Philox4x32 rng;
  r123::Philox4x32::ctr_type ctr = {{static_cast<uint32_t>(c), static_cast<uint32_t>(c >> 32),
                                      static_cast<uint32_t>(stream), static_cast<uint32_t>(stream >> 32)}};
  r123::Philox4x32::key_type key = {{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)}};
  const auto out = rng(ctr, key);
  return PhiloxBlock{{out[0], out[1], out[2], out[3]}};
}

// 32-bit word j of the (seed, stream) sequence.
EXMY_HD uint32_t philox_word(uint64_t seed, uint64_t stream, uint64_t j) {
  return philox_block(seed, stream, j >> 2).w[j & 3];
}

// Which word holds element i's bits, and where: n <= 8 uses byte (i & 3) of
// word i >> 2, n <= 16 half (i & 1) of word i >> 1, else word i; the element
// takes the top n bits of its byte, half or word.
EXMY_HD uint64_t random_word_index(uint64_t i, int n) { return n <= 8 ? i >> 2 : n <= 16 ? i >> 1 : i; }

EXMY_HD uint32_t random_bits_from_word(uint32_t word, uint64_t i, int n) {
  if (n <= 8) return ((word >> (8 * (i & 3))) & 0xffu) >> (8 - n);
  if (n <= 16) return ((word >> (16 * (i & 1))) & 0xffffu) >> (16 - n);
  return word >> (32 - n);
}

// The n random bits (1 <= n <= 32) of element i (row-major flat index).
EXMY_HD uint32_t random_bits(uint64_t seed, uint64_t stream, uint64_t i, int n) {
  return random_bits_from_word(philox_word(seed, stream, random_word_index(i, n)), i, n);
}

// Sequential access helper: caches the last Philox block, so a row-major walk
// over elements costs one Philox evaluation per 4 words. `first` is the flat
// index of element 0 of the call in its tensor (a band quantized on its own):
// element i draws the bits of element first + i.
class RandomBits {
 public:
  EXMY_HD RandomBits(uint64_t seed, uint64_t stream, int n, uint64_t first = 0)
      : seed_(seed), stream_(stream), first_(first), n_(n) {}
  EXMY_HD uint32_t operator()(uint64_t i) {
    i += first_;
    return random_bits_from_word(word(random_word_index(i, n_)), i, n_);
  }
  EXMY_HD uint64_t first() const { return first_; }

  // Word j of the sequence.
  EXMY_HD uint32_t word(uint64_t j) {
    if ((j >> 2) != cached_ || !valid_) {
      cached_ = j >> 2;
      valid_ = true;
      block_ = philox_block(seed_, stream_, cached_);
    }
    return block_.w[j & 3];
  }
  EXMY_HD int bits() const { return n_; }

 private:
  uint64_t seed_, stream_, first_;
  int n_;
  bool valid_ = false;
  uint64_t cached_ = 0;
  PhiloxBlock block_{};
};

}  // namespace exmy

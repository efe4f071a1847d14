// Many consecutive Philox4x32-10 words at once on the CPU (16 counter blocks
// per AVX-512 step, 8 per AVX2 step, by the vector width in use),
// bit-identical to philox_block() of formats/philox.hpp.
#pragma once

#include <cstdint>

namespace exmy {

// out[k] = word (j0 + k) of the (seed, stream) sequence, k < count;
// j0 must be a multiple of 4.
void philox_words(uint64_t seed, uint64_t stream, uint64_t j0, int64_t count, uint32_t* out);

}  // namespace exmy

// Packed storage of quantized tensors: FP4-class payloads (codes of at most
// 4 bits) two per byte, element 2k in the low nibble and 2k+1 in the high
// nibble; wider codes one byte (<= 8 bits), two little-endian bytes (<= 16)
// or four (> 16) each. Scale codes are stored the same way, one per block.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "formats/quantize.hpp"

namespace exmy {

// Bytes needed for n codes of format f in packed form.
int64_t packed_bytes(const Format& f, int64_t n);

// `codes` holds n codes in unpacked form (f.code_bytes() each, as written by
// quantize); returns them packed.
std::vector<uint8_t> pack_codes(const Format& f, const void* codes, int64_t n);
// Inverse of pack_codes: writes n unpacked codes (f.code_bytes() each).
void unpack_codes(const Format& f, const uint8_t* packed, int64_t n, void* codes);

// Reads code i of an unpacked code array (little-endian, `bytes` each).
uint32_t load_code(const void* codes, int bytes, int64_t i);
// Writes code i of an unpacked code array; a null array is skipped.
void store_code(void* codes, int bytes, int64_t i, uint32_t code);

// A quantized tensor in its storage form, with what is needed to decode it.
struct PackedTensor {
  QuantPlan plan;            // formats, block shape, arithmetic, tensor scale t
  int64_t rows = 0, cols = 0;
  std::vector<uint8_t> payload;  // packed element codes
  std::vector<uint8_t> scales;   // packed scale codes, row-major block order

  // The dequantized tensor, bit-identical to quantize()'s `values`.
  std::vector<float> dequantize() const;
};

// Quantizes x and returns it packed.
PackedTensor quantize_packed(const QuantSpec& spec, const float* x, int64_t rows, int64_t cols, int threads = 0);

}  // namespace exmy

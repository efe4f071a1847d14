// Pre-tokenized token files: exmy's flat format and the Megatron-LM indexed
// dataset (.bin/.idx). Both are read through one interface, a TokenStream:
// the file's documents concatenated in file order, read by token offset.
//
// Flat format (`.tok`), little-endian, a 32-byte header then the tokens:
//
//   offset  size  field
//   0       8     magic "EXMYTOKS"
//   8       4     version, uint32 = 1
//   12      4     bytes per token, uint32: 2 (uint16) or 4 (uint32)
//   16      8     vocabulary size, uint64 (every token is below it)
//   24      8     number of tokens, uint64
//   32      ...   the tokens
//
// The file size must be exactly 32 + count * width.
//
// Megatron-LM indexed dataset (megatron/core/datasets/indexed_dataset.py),
// PREFIX.idx:
//
//   "MMIDIDX\0\0" (9 bytes), version uint64 = 1, dtype code uint8
//   (1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 8 uint16; 6/7 are floats and
//   rejected), sequence count S uint64, document count D uint64, then
//   int32 sequence_lengths[S], int64 sequence_pointers[S] (byte offsets into
//   .bin), int64 document_indices[D] (sequence index where each document
//   starts, then S), and, for multimodal sets only, int8 modes[S];
//
// PREFIX.bin: the tokens of every sequence back to back. exmy reads sets
// whose sequences are contiguous in index order (what Megatron's builder
// writes) and treats the concatenation as the stream.
//
// Opening checks every size and offset against the file and scans every
// token once, so a truncated or corrupt file is one clear exmy::Error at
// start, never a crash or a bad token in the middle of a run.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace exmy::data {

class TokenStream {
 public:
  virtual ~TokenStream() = default;
  virtual int64_t size() const = 0;  // tokens
  // tokens [offset, offset + n) as int32; throws exmy::Error past the end.
  virtual void read(int64_t offset, int64_t n, int32_t* out) const = 0;
  // One more than the largest token the source can hold: the flat header's
  // vocabulary, the largest token seen + 1 for Megatron files.
  virtual int64_t vocab_size() const = 0;
  virtual std::string describe() const = 0;  // "flat file X (N tokens, vocab V)"
};

// Tokens held in memory (synthetic data, tests).
class MemoryTokens final : public TokenStream {
 public:
  MemoryTokens(std::vector<int32_t> tokens, int64_t vocab, std::string what);
  int64_t size() const override { return static_cast<int64_t>(tokens_.size()); }
  void read(int64_t offset, int64_t n, int32_t* out) const override;
  int64_t vocab_size() const override { return vocab_; }
  std::string describe() const override { return what_; }
  const std::vector<int32_t>& tokens() const { return tokens_; }

 private:
  std::vector<int32_t> tokens_;
  int64_t vocab_;
  std::string what_;
};

// Opens a token file. `format` is auto, flat or megatron. `path` is a flat
// file, a Megatron prefix (with or without .bin/.idx), or a directory made by
// `exmy prepare-data` (tokens.tok, else tokens.bin/.idx). Throws exmy::Error
// with one line naming the file and the problem.
std::unique_ptr<TokenStream> open_tokens(const std::string& path, const std::string& format = "auto");

// Writers (prepare-data and test fixtures). The flat writer picks 2-byte
// tokens when vocab <= 65536. The Megatron writer stores one sequence per
// document, uint16 when vocab < 65500 (Megatron's own choice) else int32.
// Both write a temporary next to the destination and rename it into place.
void write_flat_tokens(const std::string& path, std::span<const int32_t> tokens, int64_t vocab);
void write_megatron_tokens(const std::string& prefix, std::span<const int32_t> tokens,
                           std::span<const int64_t> doc_lengths, int64_t vocab);

}  // namespace exmy::data

// Tokenizers of `exmy prepare-data`.
//
// byte: token = byte value, vocabulary 256 (what the proxies use).
//
// bpe: byte-level BPE trained on the corpus. Text is first cut into chunks
// (an optional single leading space plus a run of letters/digits/non-ASCII
// bytes, or of other punctuation, or a run of whitespace; GPT-2's idea
// without its regular expression); merges never cross a chunk. Training
// repeats "merge the most frequent adjacent pair" until the vocabulary is
// full, ties broken by the smaller pair of ids, so the result is a function
// of the text alone. Token 256 + i is merge i. Encoding applies the merges
// by rank (lowest first) within each chunk; decode(encode(text)) == text for
// any bytes.
//
// Saved as JSON: {"type": "byte"|"bpe", "vocab_size": N, "merges": [[a, b], ...]}.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace exmy::data {

class Tokenizer {
 public:
  static Tokenizer bytes();
  // vocab_size > 256; stops early when no pair occurs twice.
  static Tokenizer train_bpe(std::string_view text, int64_t vocab_size);
  static Tokenizer load(const std::string& path);  // throws exmy::Error
  static Tokenizer from_json(std::string_view json, const std::string& origin);
  std::string to_json() const;
  void save(const std::string& path) const;

  std::string kind() const { return merges_.empty() ? "byte" : "bpe"; }
  int64_t vocab_size() const { return 256 + static_cast<int64_t>(merges_.size()); }
  const std::vector<std::pair<int32_t, int32_t>>& merges() const { return merges_; }

  std::vector<int32_t> encode(std::string_view text) const;
  void encode_append(std::string_view text, std::vector<int32_t>& out) const;
  std::string decode(std::span<const int32_t> tokens) const;

 private:
  void build_tables();
  void encode_chunk(std::string_view chunk, std::vector<int32_t>& out) const;
  std::vector<std::pair<int32_t, int32_t>> merges_;
  std::vector<std::string> pieces_;                // bytes of each token
  std::unordered_map<uint64_t, int32_t> rank_;     // pair -> merge index
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;  // chunk -> tokens
};

// The chunks of the pre-tokenization above, as views into `text`.
std::vector<std::string_view> bpe_chunks(std::string_view text);

}  // namespace exmy::data

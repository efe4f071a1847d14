// Fixed-length training sequences from a token stream, in a deterministic
// order given by a seed, and the train/validation split.
//
// The split: the last `val_fraction` of the stream (whole tokens, at least
// seq_len + 1 of them) is the validation region, the rest the training
// region; a contiguous cut keeps text from leaking across the two.
//
// Training windows: the training region is cut into W = (tokens - 1) /
// seq_len windows of seq_len + 1 tokens starting at multiples of seq_len
// (inputs are the first seq_len tokens, targets the last seq_len). Epoch e
// visits every window once, in a permutation drawn from (seed, e). The
// sampler's whole state is one integer, `position` (windows handed out so
// far), so a checkpoint stores it and a resumed run continues the same
// sequence of batches.
//
// Validation windows: the first windows of the validation region, in order,
// the same set at every evaluation.
#pragma once

#include <cstdint>
#include <vector>

#include "sim/data/token_file.hpp"

namespace exmy::data {

struct Split {
  int64_t train_begin = 0, train_end = 0, val_begin = 0, val_end = 0;
};
// Throws exmy::Error when either region cannot hold one window.
Split split_stream(int64_t tokens, double val_fraction, int64_t seq_len);

class SequenceSampler {
 public:
  SequenceSampler(const TokenStream& stream, int64_t begin, int64_t end, int64_t seq_len, uint64_t seed);

  int64_t windows() const { return windows_; }
  int64_t seq_len() const { return seq_len_; }
  // Fills tokens and targets, (batch, seq_len) each, with the next `batch`
  // windows and advances the position.
  void next(int32_t* tokens, int32_t* targets, int64_t batch);
  int64_t position() const { return position_; }
  void set_position(int64_t p);
  // The window index (0-based, in stream order) handed out at `position`.
  int64_t window_at(int64_t position);

 private:
  const TokenStream& stream_;
  int64_t begin_, seq_len_, windows_;
  uint64_t seed_;
  int64_t position_ = 0;
  int64_t perm_epoch_ = -1;
  std::vector<int64_t> perm_;
  std::vector<int32_t> buf_;
};

// The first `count` windows (seq_len + 1 tokens, stride seq_len) of
// [begin, end), as (count, seq_len) tokens and targets.
void fixed_windows(const TokenStream& stream, int64_t begin, int64_t end, int64_t seq_len, int64_t count,
                   std::vector<int32_t>& tokens, std::vector<int32_t>& targets);
inline int64_t window_count(int64_t begin, int64_t end, int64_t seq_len) {
  return end - begin > seq_len ? (end - begin - 1) / seq_len : 0;
}

// splitmix64: the generator behind every seeded choice in data/, the same
// on every platform (std:: distributions are not).
struct SplitMix64 {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1p-53; }  // [0, 1)
  // Uniform in [0, n) without modulo bias (Lemire's method with rejection).
  uint64_t below(uint64_t n);
};

}  // namespace exmy::data

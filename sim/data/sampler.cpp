#include "sim/data/sampler.hpp"

#include <algorithm>
#include <cmath>

#include "formats/error.hpp"

namespace exmy::data {

uint64_t SplitMix64::below(uint64_t n) {
  if (n <= 1) return 0;
  // Rejection from the top of the 64-bit range keeps every value equally likely.
  const uint64_t limit = UINT64_MAX - UINT64_MAX % n;
  uint64_t x;
  do x = next();
  while (x >= limit);
  return x % n;
}

Split split_stream(int64_t tokens, double val_fraction, int64_t seq_len) {
  if (seq_len <= 0) throw Error("train.seq_len must be positive");
  if (!(val_fraction > 0 && val_fraction < 1))
    throw Error("data.val_fraction must be in (0, 1) (got " + std::to_string(val_fraction) + ")");
  int64_t nval = static_cast<int64_t>(std::floor(static_cast<double>(tokens) * val_fraction));
  nval = std::max(nval, seq_len + 1);
  Split s;
  s.train_begin = 0;
  s.train_end = tokens - nval;
  s.val_begin = s.train_end;
  s.val_end = tokens;
  if (s.train_end - s.train_begin < seq_len + 1)
    throw Error("the data has " + std::to_string(tokens) + " tokens: too few for a training window of train.seq_len + 1 = " +
                std::to_string(seq_len + 1) + " tokens next to a validation region of " + std::to_string(nval));
  return s;
}

SequenceSampler::SequenceSampler(const TokenStream& stream, int64_t begin, int64_t end, int64_t seq_len, uint64_t seed)
    : stream_(stream), begin_(begin), seq_len_(seq_len), windows_(window_count(begin, end, seq_len)), seed_(seed) {
  if (windows_ <= 0)
    throw Error("the training region holds " + std::to_string(end - begin) + " tokens, fewer than one window of " +
                std::to_string(seq_len + 1));
  buf_.resize(static_cast<size_t>(seq_len + 1));
}

void SequenceSampler::set_position(int64_t p) {
  if (p < 0) throw Error("negative data position " + std::to_string(p));
  position_ = p;
}

int64_t SequenceSampler::window_at(int64_t position) {
  const int64_t epoch = position / windows_;
  if (epoch != perm_epoch_) {
    // Fisher-Yates with a generator seeded from (seed, epoch): each epoch is
    // a fresh permutation, reproducible from the position alone.
    perm_.resize(static_cast<size_t>(windows_));
    for (int64_t i = 0; i < windows_; ++i) perm_[static_cast<size_t>(i)] = i;
    SplitMix64 g{seed_ * 0x9e3779b97f4a7c15ull ^ (static_cast<uint64_t>(epoch) + 1) * 0xd1b54a32d192ed03ull};
    for (int64_t i = windows_ - 1; i > 0; --i) {
      const int64_t j = static_cast<int64_t>(g.below(static_cast<uint64_t>(i + 1)));
      std::swap(perm_[static_cast<size_t>(i)], perm_[static_cast<size_t>(j)]);
    }
    perm_epoch_ = epoch;
  }
  return perm_[static_cast<size_t>(position % windows_)];
}

void SequenceSampler::next(int32_t* tokens, int32_t* targets, int64_t batch) {
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t w = window_at(position_++);
    stream_.read(begin_ + w * seq_len_, seq_len_ + 1, buf_.data());
    std::copy_n(buf_.data(), seq_len_, tokens + b * seq_len_);
    std::copy_n(buf_.data() + 1, seq_len_, targets + b * seq_len_);
  }
}

void fixed_windows(const TokenStream& stream, int64_t begin, int64_t end, int64_t seq_len, int64_t count,
                   std::vector<int32_t>& tokens, std::vector<int32_t>& targets) {
  if (count > window_count(begin, end, seq_len))
    throw Error("asked for " + std::to_string(count) + " windows of " + std::to_string(seq_len + 1) +
                " tokens from a region of " + std::to_string(end - begin));
  tokens.resize(static_cast<size_t>(count * seq_len));
  targets.resize(static_cast<size_t>(count * seq_len));
  std::vector<int32_t> buf(static_cast<size_t>(seq_len + 1));
  for (int64_t w = 0; w < count; ++w) {
    stream.read(begin + w * seq_len, seq_len + 1, buf.data());
    std::copy_n(buf.data(), seq_len, tokens.data() + w * seq_len);
    std::copy_n(buf.data() + 1, seq_len, targets.data() + w * seq_len);
  }
}

}  // namespace exmy::data

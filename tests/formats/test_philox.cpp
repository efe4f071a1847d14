// Random bits of docs/numerics.md §4: philox_block against Random123's published
// known-answer vectors for philox4x32_10 and against an independent
// implementation of the algorithm written here; the element-to-bits mapping
// (bytes, halves, words; top n bits) against an independent computation; and
// the RandomBits cache against random_bits in sequential and random order;
// philox_words (the vector forms) against philox_block on every width.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "formats/fast/loops.hpp"
#include "formats/philox.hpp"
#include "formats/philox_cpu.hpp"
#include "test_support.hpp"

namespace exmy {
namespace {

// Philox4x32-10 from the published algorithm (Salmon et al., SC'11, and
// Random123's philox.h): ten rounds of two 32x32->64 multiplications with a
// Weyl-sequence key schedule bumped between rounds.
struct Words {
  uint32_t w[4];
};
Words philox_ref(const uint32_t ctr_in[4], const uint32_t key_in[2]) {
  uint32_t c[4] = {ctr_in[0], ctr_in[1], ctr_in[2], ctr_in[3]};
  uint32_t k[2] = {key_in[0], key_in[1]};
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      k[0] += 0x9E3779B9u;
      k[1] += 0xBB67AE85u;
    }
    const uint64_t p0 = uint64_t{0xD2511F53u} * c[0];
    const uint64_t p1 = uint64_t{0xCD9E8D57u} * c[2];
    const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    const uint32_t n0 = hi1 ^ c[1] ^ k[0], n1 = lo1, n2 = hi0 ^ c[3] ^ k[1], n3 = lo0;
    c[0] = n0;
    c[1] = n1;
    c[2] = n2;
    c[3] = n3;
  }
  return Words{{c[0], c[1], c[2], c[3]}};
}

// The three philox4x32 10-round lines of Random123's kat_vectors file:
// counter (4 words), key (2 words), expected output (4 words).
struct Kat {
  uint32_t ctr[4], key[2], out[4];
};
const Kat kKats[] = {
    {{0x00000000, 0x00000000, 0x00000000, 0x00000000}, {0x00000000, 0x00000000},
     {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
    {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff},
     {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
    {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0},
     {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
};

// philox_block(seed, stream, c) puts the counter block c in counter words 0-1
// and the stream in words 2-3, the seed in the key (docs/numerics.md §4).
PhiloxBlock block_for(const uint32_t ctr[4], const uint32_t key[2]) {
  const uint64_t c = uint64_t{ctr[0]} | (uint64_t{ctr[1]} << 32);
  const uint64_t stream = uint64_t{ctr[2]} | (uint64_t{ctr[3]} << 32);
  const uint64_t seed = uint64_t{key[0]} | (uint64_t{key[1]} << 32);
  return philox_block(seed, stream, c);
}

TEST(Philox, KnownAnswers) {
  for (const Kat& k : kKats) {
    const PhiloxBlock b = block_for(k.ctr, k.key);
    const Words r = philox_ref(k.ctr, k.key);
    for (int i = 0; i < 4; ++i) {
      EXPECT_EQ(b.w[i], k.out[i]) << "philox_block word " << i << " ctr " << test::hexcode(k.ctr[0]);
      EXPECT_EQ(r.w[i], k.out[i]) << "independent philox word " << i << " ctr " << test::hexcode(k.ctr[0]);
    }
  }
}

TEST(Philox, MatchesIndependentImplementation) {
  test::Rng rng(42);
  for (int t = 0; t < 20000; ++t) {
    const uint64_t seed = rng.u64(), stream = rng.coin() ? rng.u64() : rng.u64() & 0xff, c = rng.u64() >> rng.range(0, 63);
    const uint32_t ctr[4] = {static_cast<uint32_t>(c), static_cast<uint32_t>(c >> 32), static_cast<uint32_t>(stream),
                             static_cast<uint32_t>(stream >> 32)};
    const uint32_t key[2] = {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)};
    const PhiloxBlock b = philox_block(seed, stream, c);
    const Words r = philox_ref(ctr, key);
    for (int i = 0; i < 4; ++i) ASSERT_EQ(b.w[i], r.w[i]) << "seed " << seed << " stream " << stream << " block " << c;
    // word j of the sequence is word j & 3 of block j >> 2
    const uint64_t j = (c << 2) | static_cast<uint64_t>(t & 3);
    if ((j >> 2) == c) {
      ASSERT_EQ(philox_word(seed, stream, j), r.w[t & 3]);
    }
  }
}

// The mapping of docs/numerics.md §4, computed independently: the element's source word,
// then its byte / half / whole word, then the top n bits of that.
uint32_t bits_ref(uint64_t seed, uint64_t stream, uint64_t i, int n) {
  uint64_t j;
  uint32_t field;
  int width;
  if (n <= 8) {
    j = i / 4;
    width = 8;
  } else if (n <= 16) {
    j = i / 2;
    width = 16;
  } else {
    j = i;
    width = 32;
  }
  const uint32_t ctr[4] = {static_cast<uint32_t>(j / 4), static_cast<uint32_t>((j / 4) >> 32),
                           static_cast<uint32_t>(stream), static_cast<uint32_t>(stream >> 32)};
  const uint32_t key[2] = {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)};
  const uint32_t word = philox_ref(ctr, key).w[j % 4];
  if (width == 8) field = (word >> (8 * (i % 4))) & 0xffu;          // byte 0 = lowest
  else if (width == 16) field = (word >> (16 * (i % 2))) & 0xffffu;  // half 0 = lowest
  else field = word;
  return static_cast<uint32_t>(field >> (width - n));  // top n bits of the field
}

TEST(Philox, ElementBitMapping) {
  test::Rng rng(9);
  size_t nonzero = 0, checked = 0;
  for (int n = 1; n <= 32; ++n) {
    const uint64_t seed = rng.u64(), stream = rng.u64();
    for (int k = 0; k < 600; ++k) {
      // sequential indices, then large ones (counter high word in use)
      const uint64_t i = k < 300 ? static_cast<uint64_t>(k) : rng.u64() >> rng.range(0, 40);
      const uint32_t got = random_bits(seed, stream, i, n), want = bits_ref(seed, stream, i, n);
      ASSERT_EQ(got, want) << "n=" << n << " i=" << i;
      ASSERT_LT(uint64_t{got}, uint64_t{1} << n);
      nonzero += got != 0;
      ++checked;
    }
  }
  EXPECT_GT(nonzero, checked * 9 / 10);
  // The documented equalities: n = 8 uses whole bytes, n = 16 halves, n = 32 words.
  const uint64_t seed = 123, stream = 456;
  const uint32_t w0 = philox_word(seed, stream, 0), w1 = philox_word(seed, stream, 1);
  EXPECT_EQ(random_bits(seed, stream, 0, 8), w0 & 0xffu);
  EXPECT_EQ(random_bits(seed, stream, 3, 8), w0 >> 24);
  EXPECT_EQ(random_bits(seed, stream, 4, 8), w1 & 0xffu);
  EXPECT_EQ(random_bits(seed, stream, 1, 16), w0 >> 16);
  EXPECT_EQ(random_bits(seed, stream, 2, 16), w1 & 0xffffu);
  EXPECT_EQ(random_bits(seed, stream, 1, 32), w1);
  EXPECT_EQ(random_bits(seed, stream, 1, 1), (w0 >> 15) & 1u);
}

TEST(Philox, RandomBitsCacheMatches) {
  test::Rng rng(11);
  size_t checked = 0;
  for (int n : {1, 3, 8, 9, 16, 17, 24, 32}) {
    const uint64_t seed = rng.u64(), stream = rng.u64();
    RandomBits seq(seed, stream, n);
    for (uint64_t i = 0; i < 5000; ++i) {
      ASSERT_EQ(seq(i), random_bits(seed, stream, i, n)) << "sequential n=" << n << " i=" << i;
      ++checked;
    }
    // random order, with repeats and neighbours, so the cache is hit and missed
    RandomBits any(seed, stream, n);
    std::vector<uint64_t> idx;
    for (int k = 0; k < 3000; ++k) {
      const uint64_t i = rng.coin(0.2) ? rng.u64() >> 8 : static_cast<uint64_t>(rng.range(0, 400));
      idx.push_back(i);
      if (rng.coin(0.3)) idx.push_back(i + 1);
      if (rng.coin(0.1)) idx.push_back(i);
    }
    for (uint64_t i : idx) {
      ASSERT_EQ(any(i), random_bits(seed, stream, i, n)) << "random access n=" << n << " i=" << i;
      ++checked;
    }
  }
  EXPECT_GT(checked, 60000u);
}

// Different streams and seeds give different sequences (a wiring slip that
// dropped the stream or half of the seed would pass the tests above for
// zero streams).
TEST(Philox, StreamAndSeedMatter) {
  const uint64_t hi = uint64_t{1} << 32;
  const uint32_t base = philox_word(1, 1, 0);
  EXPECT_NE(base, philox_word(1, 1 + hi, 0));
  EXPECT_NE(base, philox_word(1 + hi, 1, 0));
  EXPECT_NE(base, philox_word(1, 2, 0));
  EXPECT_NE(base, philox_word(2, 1, 0));
  EXPECT_NE(philox_word(1, 1, 4), philox_word(1, 1, 4 + (hi << 2)));  // counter high word
}

// philox_words on every vector width the CPU has equals philox_block word
// by word: counts around the 16- and 8-block steps (and their tails), and
// first blocks just below 2^32 so that the counter's low word carries into
// its high word inside a vector step.
TEST(Philox, WordsEqualBlocksOnEveryWidth) {
  const detail::Simd saved = detail::simd_width();
  int widths = 0;
  for (const detail::Simd w : {detail::Simd::scalar, detail::Simd::avx2, detail::Simd::avx512}) {
    if (detail::simd_available() < w) continue;
    ++widths;
    detail::set_simd_width(w);
    for (const uint64_t block0 : {uint64_t{0}, uint64_t{5}, (uint64_t{1} << 32) - 7, (uint64_t{3} << 32) - 16}) {
      for (const int64_t count : {int64_t{1}, int64_t{31}, int64_t{32}, int64_t{63}, int64_t{64}, int64_t{65},
                                  int64_t{100}, int64_t{128}, int64_t{200}, int64_t{1000}}) {
        const uint64_t seed = 0x1234567890abcdefull + block0, stream = 0xfeedface00000000ull | uint64_t(count);
        std::vector<uint32_t> got(static_cast<size_t>(count));
        philox_words(seed, stream, block0 * 4, count, got.data());
        for (int64_t k = 0; k < count; ++k) {
          const PhiloxBlock b = philox_block(seed, stream, block0 + static_cast<uint64_t>(k / 4));
          ASSERT_EQ(got[static_cast<size_t>(k)], b.w[k % 4])
              << detail::simd_name(w) << " block0 " << block0 << " count " << count << " word " << k;
        }
      }
    }
  }
  detail::set_simd_width(saved);
  EXPECT_GE(widths, 1);
}

}  // namespace
}  // namespace exmy

// Token files (flat and Megatron .bin/.idx), the sampler and split, the
// synthetic Markov source, the tokenizers and prepare-data.
#include <gtest/gtest.h>
#include <zlib.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "sim/data/prepare.hpp"
#include "sim/data/sampler.hpp"
#include "sim/data/synthetic.hpp"
#include "sim/data/token_file.hpp"
#include "sim/data/tokenizer.hpp"
#include "tests/train/test_support.hpp"

namespace exmy::data {
namespace {

using test::expect_error;
using test::TempDir;

void write_bytes(const std::string& path, const std::vector<uint8_t>& b) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

template <class T>
void put(std::vector<uint8_t>& b, T v) {
  const size_t o = b.size();
  b.resize(o + sizeof v);
  std::memcpy(b.data() + o, &v, sizeof v);
}

std::vector<int32_t> read_all(const TokenStream& s) {
  std::vector<int32_t> v(static_cast<size_t>(s.size()));
  s.read(0, s.size(), v.data());
  return v;
}

TEST(FlatTokens, RoundTripAndHeader) {
  TempDir d;
  const std::vector<int32_t> t = {0, 5, 255, 7, 7, 1};
  write_flat_tokens(d / "a.tok", t, 256);
  const auto bytes = read_bytes(d / "a.tok");
  ASSERT_EQ(bytes.size(), 32u + 2 * t.size());
  EXPECT_EQ(std::memcmp(bytes.data(), "EXMYTOKS", 8), 0);
  EXPECT_EQ(bytes[8], 1);   // version
  EXPECT_EQ(bytes[12], 2);  // bytes per token
  auto s = open_tokens(d / "a.tok");
  EXPECT_EQ(read_all(*s), t);
  EXPECT_EQ(s->vocab_size(), 256);
  std::vector<int32_t> mid(3);
  s->read(2, 3, mid.data());
  EXPECT_EQ(mid, (std::vector<int32_t>{255, 7, 7}));
  // Vocabularies above 65536 take 4-byte tokens.
  write_flat_tokens(d / "b.tok", std::vector<int32_t>{70000, 3}, 100000);
  EXPECT_EQ(read_all(*open_tokens(d / "b.tok")), (std::vector<int32_t>{70000, 3}));
}

TEST(FlatTokens, CorruptFilesAreOneLineErrors) {
  TempDir d;
  write_flat_tokens(d / "a.tok", std::vector<int32_t>{1, 2, 3, 4}, 16);
  auto b = read_bytes(d / "a.tok");
  write_bytes(d / "trunc.tok", std::vector<uint8_t>(b.begin(), b.end() - 1));
  expect_error([&] { open_tokens(d / "trunc.tok"); }, "truncated or corrupt");
  auto bad = b;
  bad[0] = 'X';
  write_bytes(d / "magic.tok", bad);
  expect_error([&] { open_tokens(d / "magic.tok"); }, "not an exmy flat token file");
  auto big = b;
  big[32] = 99;  // token 99 with vocabulary 16
  write_bytes(d / "vocab.tok", big);
  expect_error([&] { open_tokens(d / "vocab.tok"); }, "vocabulary size 16");
  expect_error([&] { open_tokens(d / "missing.tok"); }, "does not exist");
  expect_error([&] { open_tokens(d.path()); }, "no tokens.tok or tokens.bin");
  expect_error([&] { write_flat_tokens(d / "x.tok", std::vector<int32_t>{16}, 16); }, "outside the vocabulary");
}

// A Megatron-LM index written byte by byte from the layout in
// megatron/core/datasets/indexed_dataset.py (_IndexWriter), independent of
// exmy's writer: int32 tokens (dtype code 4), three sequences in two
// documents.
TEST(MegatronTokens, ReadsAHandWrittenIndexedDataset) {
  TempDir d;
  const std::vector<int32_t> lens = {3, 2, 4};
  std::vector<uint8_t> idx = {'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0};
  put<uint64_t>(idx, 1);  // version
  put<uint8_t>(idx, 4);   // int32
  put<uint64_t>(idx, 3);  // sequences
  put<uint64_t>(idx, 3);  // document indices: 0, 2, 3
  for (int32_t l : lens) put<int32_t>(idx, l);
  for (int64_t p : {0, 12, 20}) put<int64_t>(idx, p);
  for (int64_t di : {0, 2, 3}) put<int64_t>(idx, di);
  std::vector<uint8_t> bin;
  for (int32_t t = 1; t <= 9; ++t) put<int32_t>(bin, t * 1000);
  write_bytes(d / "set.idx", idx);
  write_bytes(d / "set.bin", bin);
  for (const std::string& p : {d / "set", d / "set.bin", d / "set.idx"}) {
    auto s = open_tokens(p);
    EXPECT_EQ(s->size(), 9);
    EXPECT_EQ(s->vocab_size(), 9001);
    EXPECT_EQ(read_all(*s)[8], 9000);
  }
  // Corruptions: a .bin shorter than the index says, a gap between
  // sequences, a float dtype, a bad header, a missing half.
  write_bytes(d / "short.idx", idx);
  write_bytes(d / "short.bin", std::vector<uint8_t>(bin.begin(), bin.end() - 4));
  expect_error([&] { open_tokens(d / "short"); }, "truncated");
  auto gap = idx;
  const int64_t bad_ptr = 16;
  std::memcpy(gap.data() + 34 + 12 + 8, &bad_ptr, 8);
  write_bytes(d / "gap.idx", gap);
  write_bytes(d / "gap.bin", bin);
  expect_error([&] { open_tokens(d / "gap"); }, "contiguous");
  auto flt = idx;
  flt[17] = 7;
  write_bytes(d / "flt.idx", flt);
  write_bytes(d / "flt.bin", bin);
  expect_error([&] { open_tokens(d / "flt"); }, "float type");
  auto hdr = idx;
  hdr[0] = 'X';
  write_bytes(d / "hdr.idx", hdr);
  write_bytes(d / "hdr.bin", bin);
  expect_error([&] { open_tokens(d / "hdr"); }, "MMIDIDX");
  write_bytes(d / "half.idx", idx);
  expect_error([&] { open_tokens(d / "half", "megatron"); }, "needs both");
  write_bytes(d / "cut.idx", std::vector<uint8_t>(idx.begin(), idx.begin() + 40));
  write_bytes(d / "cut.bin", bin);
  expect_error([&] { open_tokens(d / "cut"); }, "do not fit");
}

TEST(MegatronTokens, WriterRoundTripAndLayout) {
  TempDir d;
  const std::vector<int32_t> t = {5, 6, 7, 8, 9, 10};
  const std::vector<int64_t> docs = {2, 0, 4};
  write_megatron_tokens(d / "m", t, docs, 256);
  const auto idx = read_bytes(d / "m.idx");
  ASSERT_EQ(idx.size(), 34u + 3 * 4 + 3 * 8 + 4 * 8);
  EXPECT_EQ(std::memcmp(idx.data(), "MMIDIDX\0\0", 9), 0);
  EXPECT_EQ(idx[17], 8);  // uint16, Megatron's choice below 65500
  EXPECT_EQ(read_bytes(d / "m.bin").size(), 12u);
  EXPECT_EQ(read_all(*open_tokens(d / "m")), t);
  write_megatron_tokens(d / "w", std::vector<int32_t>{70000, 1}, std::vector<int64_t>{2}, 70001);
  EXPECT_EQ(read_bytes(d / "w.idx")[17], 4);  // int32
  EXPECT_EQ(read_all(*open_tokens(d / "w.bin")), (std::vector<int32_t>{70000, 1}));
  expect_error([&] { write_megatron_tokens(d / "x", t, std::vector<int64_t>{1}, 256); }, "document lengths");
}

TEST(Sampler, EpochsVisitEveryWindowOnceAndResumeFromAPosition) {
  std::vector<int32_t> t(1001);
  for (size_t i = 0; i < t.size(); ++i) t[i] = static_cast<int32_t>(i % 97);
  MemoryTokens s(t, 97, "test");
  const Split sp = split_stream(s.size(), 0.1, 10);
  EXPECT_EQ(sp.train_end, 901);
  EXPECT_EQ(sp.val_begin, 901);
  SequenceSampler a(s, sp.train_begin, sp.train_end, 10, 42);
  EXPECT_EQ(a.windows(), 90);
  std::set<int64_t> seen;
  for (int64_t p = 0; p < 90; ++p) seen.insert(a.window_at(p));
  EXPECT_EQ(seen.size(), 90u);
  std::vector<int32_t> x(30), y(30), x2(30), y2(30);
  a.next(x.data(), y.data(), 3);
  for (int b = 0; b < 3; ++b)
    for (int i = 0; i + 1 < 10; ++i) EXPECT_EQ(y[static_cast<size_t>(b * 10 + i)], x[static_cast<size_t>(b * 10 + i + 1)]);
  // The position is the whole state: a second sampler set to a later
  // position (in the second epoch) continues identically.
  for (int k = 0; k < 40; ++k) a.next(x.data(), y.data(), 3);
  SequenceSampler b(s, sp.train_begin, sp.train_end, 10, 42);
  b.set_position(a.position());
  a.next(x.data(), y.data(), 3);
  b.next(x2.data(), y2.data(), 3);
  EXPECT_EQ(x, x2);
  EXPECT_EQ(y, y2);
  SequenceSampler c(s, sp.train_begin, sp.train_end, 10, 43);  // another seed, another order
  int same = 0;
  for (int64_t p = 0; p < 90; ++p) same += c.window_at(p) == a.window_at(p);
  EXPECT_LT(same, 10);
  expect_error([&] { split_stream(20, 0.1, 10); }, "too few");
}

TEST(Markov, EntropyRateMatchesTheEmpiricalLogLoss) {
  const auto m = MarkovSource::random(16, 3, 9);
  for (int64_t i = 0; i < 16; ++i) {
    double row = 0;
    for (int64_t j = 0; j < 16; ++j) row += m.prob(i, j);
    EXPECT_NEAR(row, 1.0, 1e-12);
  }
  // pi P = pi
  for (int64_t j = 0; j < 16; ++j) {
    double s = 0;
    for (int64_t i = 0; i < 16; ++i) s += m.stationary[static_cast<size_t>(i)] * m.prob(i, j);
    EXPECT_NEAR(s, m.stationary[static_cast<size_t>(j)], 1e-12);
  }
  const double H = m.entropy_rate();
  EXPECT_GT(H, 0.1);
  EXPECT_LT(H, std::log(3.0) + 1e-12);
  const auto x = m.generate(200000, 5);
  double nll = 0;
  for (size_t t = 1; t < x.size(); ++t) nll -= std::log(m.prob(x[t - 1], x[t]));
  EXPECT_NEAR(nll / static_cast<double>(x.size() - 1), H, 0.01);
  EXPECT_EQ(m.generate(100, 5), m.generate(100, 5));
  expect_error([] { MarkovSource::random(8, 9, 1); }, "synthetic_branching");
}

// Nemotron's vocabulary: a dense transition matrix would need 128 GiB; the
// source keeps each state's successors only.
TEST(Markov, NemotronVocabularyFitsInBoundedMemory) {
  const auto m = MarkovSource::random(131072, 4, 3);
  EXPECT_EQ(m.next_state.size(), size_t{131072} * 4);
  double total = 0;
  for (double p : m.stationary) total += p;
  EXPECT_NEAR(total, 1.0, 1e-9);
  EXPECT_GT(m.entropy_rate(), 0.1);
  EXPECT_LT(m.entropy_rate(), std::log(4.0) + 1e-12);
  const auto x = m.generate(10000, 1);
  for (size_t t = 1; t < x.size(); ++t) ASSERT_GT(m.prob(x[t - 1], x[t]), 0.0) << t;
}

const char* kText =
    "The quick brown fox jumps over the lazy dog. The dog sleeps; the fox runs.\n"
    "  Indented line with  two spaces, tabs\tand UTF-8: caf\xc3\xa9 na\xc3\xafve \xe2\x82\xac 42!\n";

TEST(Tokenizer, ChunksKeepTheLeadingSpace) {
  const auto c = bpe_chunks("hello world  x\n y,z");
  const std::vector<std::string> want = {"hello", " world", " ", " x", "\n", " y", ",", "z"};
  ASSERT_EQ(c.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(std::string(c[i]), want[i]);
}

TEST(Tokenizer, ByteAndBpeRoundTrip) {
  const Tokenizer b = Tokenizer::bytes();
  std::string all;
  for (int c = 0; c < 256; ++c) all += static_cast<char>(c);
  EXPECT_EQ(b.vocab_size(), 256);
  EXPECT_EQ(b.decode(b.encode(all)), all);
  EXPECT_EQ(b.encode("A")[0], 65);

  std::string corpus;
  for (int i = 0; i < 20; ++i) corpus += kText;
  const Tokenizer t = Tokenizer::train_bpe(corpus, 320);
  EXPECT_EQ(t.kind(), "bpe");
  EXPECT_GT(t.vocab_size(), 256);
  EXPECT_LE(t.vocab_size(), 320);
  const auto enc = t.encode(corpus);
  EXPECT_LT(enc.size(), corpus.size() / 2);  // merges pay off on repeated text
  EXPECT_EQ(t.decode(enc), corpus);
  EXPECT_EQ(t.decode(t.encode(all)), all);  // any bytes, unseen ones included
  // Deterministic, and the saved tokenizer encodes the same.
  EXPECT_EQ(Tokenizer::train_bpe(corpus, 320).merges(), t.merges());
  const Tokenizer u = Tokenizer::from_json(t.to_json(), "test");
  EXPECT_EQ(u.encode(corpus), enc);
  expect_error([&] { t.decode(std::vector<int32_t>{static_cast<int32_t>(t.vocab_size())}); }, "outside the tokenizer");
  expect_error([] { Tokenizer::from_json("{\"type\":\"bpe\",\"merges\":[[300,1]]}", "x"); }, "does not exist yet");
  expect_error([] { Tokenizer::train_bpe("abc", 100); }, "above 256");
}

void write_gzip(const std::string& path, const std::string& text) {
  gzFile f = gzopen(path.c_str(), "wb");
  gzwrite(f, text.data(), static_cast<unsigned>(text.size()));
  gzclose(f);
}

TEST(PrepareData, TextFilesToFlatAndMegatronTokens) {
  TempDir d;
  std::filesystem::create_directories(d / "in/sub");
  const std::string a = "First document.\n", b = "Second, in a subfolder.\n", c = "Third, gzipped \xe2\x82\xac.\n";
  std::ofstream(d / "in/a.txt") << a;
  std::ofstream(d / "in/sub/b.md") << b;
  write_gzip(d / "in/c.txt.gz", c);
  std::ofstream(d / "in/skip.html") << "<html>not text</html>";
  PrepareOptions o;
  o.inputs = {d / "in"};
  o.out_dir = d / "out";
  o.format = "both";
  const auto r = prepare_data(o);
  EXPECT_EQ(r.files, 3);
  EXPECT_EQ(r.tokens, static_cast<int64_t>(a.size() + b.size() + c.size()));
  // Sorted path order: a.txt, c.txt.gz, sub/b.md.
  const std::string want = a + c + b;
  const Tokenizer tok = Tokenizer::load(d / "out/tokenizer.json");
  EXPECT_EQ(tok.decode(read_all(*open_tokens(d / "out/tokens.tok"))), want);
  EXPECT_EQ(tok.decode(read_all(*open_tokens(d / "out/tokens", "megatron"))), want);
  EXPECT_EQ(tok.decode(read_all(*open_tokens(d / "out"))), want);  // the directory itself
  std::ifstream mf(d / "out/manifest.json");
  const auto m = nlohmann::json::parse(mf);
  EXPECT_EQ(m["files"], 3);
  EXPECT_EQ(m["documents"][1]["bytes"], c.size());
  expect_error([&] { prepare_data(o); }, "already exists");
  o.overwrite = true;
  o.tokenizer = "bpe";
  o.vocab_size = 270;
  o.format = "flat";
  const auto r2 = prepare_data(o);
  EXPECT_LT(r2.tokens, r.tokens);
  EXPECT_EQ(Tokenizer::load(d / "out/tokenizer.json").decode(read_all(*open_tokens(d / "out"))), want);
  EXPECT_FALSE(std::filesystem::exists(d / "out/tokens.idx"));  // replaced whole
  o.inputs = {d / "nothing-here"};
  expect_error([&] { prepare_data(o); }, "does not exist");
  std::filesystem::create_directories(d / "empty");
  o.inputs = {d / "empty"};
  expect_error([&] { prepare_data(o); }, "holds no text files");
}

}  // namespace
}  // namespace exmy::data

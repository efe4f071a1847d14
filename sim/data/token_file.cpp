#include "sim/data/token_file.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "formats/error.hpp"
#include "sim/io/atomic_file.hpp"

namespace exmy::data {
namespace fs = std::filesystem;

namespace {

constexpr char kFlatMagic[8] = {'E', 'X', 'M', 'Y', 'T', 'O', 'K', 'S'};
constexpr size_t kFlatHeader = 32;
constexpr char kIdxMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};

// A read-only memory map of a whole file (empty files map to nothing).
class MappedFile {
 public:
  explicit MappedFile(const std::string& path) : path_(path) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) throw Error("cannot open '" + path + "': " + std::strerror(errno));
    struct stat st{};
    if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
      ::close(fd_);
      throw Error("'" + path + "' is not a regular file");
    }
    size_ = static_cast<size_t>(st.st_size);
    if (size_ > 0) {
      void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd_, 0);
      if (p == MAP_FAILED) {
        ::close(fd_);
        throw Error("cannot map '" + path + "': " + std::strerror(errno));
      }
      data_ = static_cast<const uint8_t*>(p);
    }
  }
  ~MappedFile() {
    if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
    if (fd_ >= 0) ::close(fd_);
  }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

template <class T>
T load_le(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof v);  // x86-64 and every target exmy builds for are little-endian
  return v;
}

// Token element types of both formats.
enum class Elem : uint8_t { u8, i8, i16, i32, i64, u16, u32 };

int elem_size(Elem e) {
  switch (e) {
    case Elem::u8: case Elem::i8: return 1;
    case Elem::i16: case Elem::u16: return 2;
    case Elem::i32: case Elem::u32: return 4;
    case Elem::i64: return 8;
  }
  return 1;
}

int64_t elem_at(const uint8_t* base, Elem e, int64_t i) {
  const uint8_t* p = base + i * elem_size(e);
  switch (e) {
    case Elem::u8: return *p;
    case Elem::i8: return static_cast<int8_t>(*p);
    case Elem::i16: return load_le<int16_t>(p);
    case Elem::u16: return load_le<uint16_t>(p);
    case Elem::i32: return load_le<int32_t>(p);
    case Elem::u32: return load_le<uint32_t>(p);
    case Elem::i64: return load_le<int64_t>(p);
  }
  return 0;
}

// A mapped array of tokens; scans it once for the range of its values.
class MappedTokens final : public TokenStream {
 public:
  MappedTokens(std::unique_ptr<MappedFile> file, size_t offset, int64_t count, Elem elem, int64_t header_vocab,
               std::string kind)
      : file_(std::move(file)), base_(file_->data() + offset), count_(count), elem_(elem), kind_(std::move(kind)) {
    int64_t mx = -1;
    for (int64_t i = 0; i < count_; ++i) {
      const int64_t t = elem_at(base_, elem_, i);
      if (t < 0 || t > INT32_MAX)
        throw Error(kind_ + " '" + file_->path() + "': token " + std::to_string(t) + " at position " +
                    std::to_string(i) + " is not a valid token id");
      mx = std::max(mx, t);
    }
    if (header_vocab > 0) {
      if (mx >= header_vocab)
        throw Error(kind_ + " '" + file_->path() + "': token " + std::to_string(mx) +
                    " is not below the header's vocabulary size " + std::to_string(header_vocab) + " (corrupt file?)");
      vocab_ = header_vocab;
    } else {
      vocab_ = mx + 1;
    }
  }
  int64_t size() const override { return count_; }
  int64_t vocab_size() const override { return vocab_; }
  void read(int64_t offset, int64_t n, int32_t* out) const override {
    if (offset < 0 || n < 0 || offset + n > count_)
      throw Error("read of tokens [" + std::to_string(offset) + ", " + std::to_string(offset + n) + ") past the end of '" +
                  file_->path() + "' (" + std::to_string(count_) + " tokens)");
    if (elem_ == Elem::u16) {
      const uint8_t* p = base_ + offset * 2;
      for (int64_t i = 0; i < n; ++i) out[i] = load_le<uint16_t>(p + 2 * i);
    } else {
      for (int64_t i = 0; i < n; ++i) out[i] = static_cast<int32_t>(elem_at(base_, elem_, offset + i));
    }
  }
  std::string describe() const override {
    return kind_ + " '" + file_->path() + "' (" + std::to_string(count_) + " tokens, vocabulary " +
           std::to_string(vocab_) + ")";
  }

 private:
  std::unique_ptr<MappedFile> file_;
  const uint8_t* base_;
  int64_t count_;
  Elem elem_;
  int64_t vocab_ = 0;
  std::string kind_;
};

std::unique_ptr<TokenStream> open_flat(const std::string& path) {
  auto f = std::make_unique<MappedFile>(path);
  const std::string what = "token file '" + path + "'";
  if (f->size() < kFlatHeader || std::memcmp(f->data(), kFlatMagic, 8) != 0)
    throw Error(what + " is not an exmy flat token file (no EXMYTOKS header)");
  const uint32_t version = load_le<uint32_t>(f->data() + 8);
  const uint32_t width = load_le<uint32_t>(f->data() + 12);
  const uint64_t vocab = load_le<uint64_t>(f->data() + 16);
  const uint64_t count = load_le<uint64_t>(f->data() + 24);
  if (version != 1) throw Error(what + ": unsupported version " + std::to_string(version) + " (expected 1)");
  if (width != 2 && width != 4) throw Error(what + ": bad token width " + std::to_string(width) + " (expected 2 or 4)");
  if (vocab == 0 || vocab > (uint64_t{1} << 31)) throw Error(what + ": bad vocabulary size " + std::to_string(vocab));
  if (count > (f->size() - kFlatHeader) / width || kFlatHeader + count * width != f->size())
    throw Error(what + ": header says " + std::to_string(count) + " tokens of " + std::to_string(width) +
                " bytes but the file has " + std::to_string(f->size()) + " bytes (truncated or corrupt)");
  return std::make_unique<MappedTokens>(std::move(f), kFlatHeader, static_cast<int64_t>(count),
                                        width == 2 ? Elem::u16 : Elem::u32, static_cast<int64_t>(vocab), "flat token file");
}

std::unique_ptr<TokenStream> open_megatron(const std::string& prefix) {
  const std::string idx_path = prefix + ".idx", bin_path = prefix + ".bin";
  MappedFile idx(idx_path);
  const std::string what = "Megatron index '" + idx_path + "'";
  const uint8_t* p = idx.data();
  if (idx.size() < 34 || std::memcmp(p, kIdxMagic, 9) != 0) throw Error(what + " has no MMIDIDX header");
  const uint64_t version = load_le<uint64_t>(p + 9);
  if (version != 1) throw Error(what + ": unsupported version " + std::to_string(version) + " (expected 1)");
  const uint8_t code = p[17];
  Elem elem;
  switch (code) {
    case 1: elem = Elem::u8; break;
    case 2: elem = Elem::i8; break;
    case 3: elem = Elem::i16; break;
    case 4: elem = Elem::i32; break;
    case 5: elem = Elem::i64; break;
    case 8: elem = Elem::u16; break;
    case 6: case 7: throw Error(what + ": dtype code " + std::to_string(code) + " is a float type, not tokens");
    default: throw Error(what + ": unknown dtype code " + std::to_string(code));
  }
  const uint64_t S = load_le<uint64_t>(p + 18), D = load_le<uint64_t>(p + 26);
  const uint64_t avail = idx.size() - 34;
  // 20 bytes per sequence (length + pointer) and 8 per document index.
  if (S > avail / 12 || D > avail / 8 || 12 * S + 8 * D > avail)
    throw Error(what + ": " + std::to_string(S) + " sequences and " + std::to_string(D) +
                " document indices do not fit in " + std::to_string(idx.size()) + " bytes (truncated or corrupt)");
  const uint64_t rest = avail - 12 * S - 8 * D;
  if (rest != 0 && rest != S)
    throw Error(what + ": " + std::to_string(rest) + " unexpected trailing bytes (corrupt file?)");
  const uint8_t* lens = p + 34;
  const uint8_t* ptrs = lens + 4 * S;
  const uint8_t* docs = ptrs + 8 * S;
  auto bin = std::make_unique<MappedFile>(bin_path);
  const int64_t es = elem_size(elem);
  int64_t total = 0;
  for (uint64_t i = 0; i < S; ++i) {
    const int32_t len = load_le<int32_t>(lens + 4 * i);
    const int64_t ptr = load_le<int64_t>(ptrs + 8 * i);
    if (len < 0) throw Error(what + ": sequence " + std::to_string(i) + " has negative length");
    if (ptr != total * es)
      throw Error(what + ": sequence " + std::to_string(i) + " starts at byte " + std::to_string(ptr) +
                  ", not right after the previous one (exmy reads contiguous sets only)");
    total += len;
  }
  for (uint64_t d = 0; d < D; ++d) {
    const int64_t di = load_le<int64_t>(docs + 8 * d);
    if (di < 0 || static_cast<uint64_t>(di) > S || (d > 0 && di < load_le<int64_t>(docs + 8 * (d - 1))))
      throw Error(what + ": document index " + std::to_string(d) + " = " + std::to_string(di) + " is out of order");
  }
  if (static_cast<uint64_t>(total * es) > bin->size())
    throw Error("Megatron data '" + bin_path + "' has " + std::to_string(bin->size()) + " bytes but the index needs " +
                std::to_string(total * es) + " (truncated?)");
  return std::make_unique<MappedTokens>(std::move(bin), 0, total, elem, 0, "Megatron dataset");
}

bool exists(const std::string& p) {
  std::error_code ec;
  return fs::exists(p, ec);
}

std::string strip_suffix(const std::string& p) {
  for (const char* s : {".bin", ".idx"})
    if (p.ends_with(s)) return p.substr(0, p.size() - 4);
  return p;
}

template <class T>
void put(std::vector<uint8_t>& b, T v) {
  const size_t o = b.size();
  b.resize(o + sizeof v);
  std::memcpy(b.data() + o, &v, sizeof v);
}

void check_tokens(std::span<const int32_t> tokens, int64_t vocab) {
  for (size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] < 0 || tokens[i] >= vocab)
      throw Error("token " + std::to_string(tokens[i]) + " at position " + std::to_string(i) +
                  " is outside the vocabulary [0, " + std::to_string(vocab) + ")");
}

}  // namespace

MemoryTokens::MemoryTokens(std::vector<int32_t> tokens, int64_t vocab, std::string what)
    : tokens_(std::move(tokens)), vocab_(vocab), what_(std::move(what)) {
  check_tokens(tokens_, vocab_);
}

void MemoryTokens::read(int64_t offset, int64_t n, int32_t* out) const {
  if (offset < 0 || n < 0 || offset + n > size())
    throw Error("read of tokens [" + std::to_string(offset) + ", " + std::to_string(offset + n) + ") past the end of " +
                what_);
  std::copy_n(tokens_.data() + offset, n, out);
}

std::unique_ptr<TokenStream> open_tokens(const std::string& path, const std::string& format) {
  if (format != "auto" && format != "flat" && format != "megatron")
    throw Error("data.format: unknown format '" + format + "' (expected auto, flat or megatron)");
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    const std::string flat = (fs::path(path) / "tokens.tok").string();
    const std::string meg = (fs::path(path) / "tokens").string();
    if (format != "megatron" && exists(flat)) return open_flat(flat);
    if (format != "flat" && exists(meg + ".idx")) return open_megatron(meg);
    throw Error("data directory '" + path + "' has no tokens.tok or tokens.bin/.idx (make one with exmy prepare-data)");
  }
  const bool megatron_name = path.ends_with(".bin") || path.ends_with(".idx") || (!exists(path) && exists(path + ".idx"));
  if (format == "megatron" || (format == "auto" && megatron_name)) {
    const std::string prefix = strip_suffix(path);
    if (!exists(prefix + ".idx") || !exists(prefix + ".bin"))
      throw Error("Megatron dataset '" + prefix + "': needs both " + prefix + ".bin and " + prefix + ".idx");
    return open_megatron(prefix);
  }
  if (!exists(path)) throw Error("data file '" + path + "' does not exist");
  return open_flat(path);
}

void write_flat_tokens(const std::string& path, std::span<const int32_t> tokens, int64_t vocab) {
  if (vocab <= 0 || vocab > (int64_t{1} << 31)) throw Error("bad vocabulary size " + std::to_string(vocab));
  check_tokens(tokens, vocab);
  const uint32_t width = vocab <= 65536 ? 2 : 4;
  std::vector<uint8_t> b;
  b.reserve(kFlatHeader + tokens.size() * width);
  b.insert(b.end(), kFlatMagic, kFlatMagic + 8);
  put<uint32_t>(b, 1);
  put<uint32_t>(b, width);
  put<uint64_t>(b, static_cast<uint64_t>(vocab));
  put<uint64_t>(b, tokens.size());
  for (int32_t t : tokens) {
    if (width == 2) put<uint16_t>(b, static_cast<uint16_t>(t));
    else put<uint32_t>(b, static_cast<uint32_t>(t));
  }
  io::write_bytes_atomic(path, b.data(), b.size());
}

void write_megatron_tokens(const std::string& prefix, std::span<const int32_t> tokens,
                           std::span<const int64_t> doc_lengths, int64_t vocab) {
  check_tokens(tokens, vocab);
  int64_t sum = 0;
  for (int64_t l : doc_lengths) {
    if (l < 0 || l > INT32_MAX) throw Error("bad document length " + std::to_string(l));
    sum += l;
  }
  if (sum != static_cast<int64_t>(tokens.size()))
    throw Error("document lengths add up to " + std::to_string(sum) + ", not the " + std::to_string(tokens.size()) +
                " tokens");
  const bool small = vocab < 65500;  // Megatron's DType.optimal_dtype
  const int es = small ? 2 : 4;
  std::vector<uint8_t> bin;
  bin.reserve(tokens.size() * static_cast<size_t>(es));
  for (int32_t t : tokens) {
    if (small) put<uint16_t>(bin, static_cast<uint16_t>(t));
    else put<int32_t>(bin, t);
  }
  std::vector<uint8_t> idx(kIdxMagic, kIdxMagic + 9);
  put<uint64_t>(idx, 1);
  put<uint8_t>(idx, small ? 8 : 4);
  const uint64_t S = doc_lengths.size();
  put<uint64_t>(idx, S);
  put<uint64_t>(idx, S + 1);  // document_indices: 0, 1, ..., S (one sequence per document)
  for (int64_t l : doc_lengths) put<int32_t>(idx, static_cast<int32_t>(l));
  int64_t ptr = 0;
  for (int64_t l : doc_lengths) {
    put<int64_t>(idx, ptr);
    ptr += l * es;
  }
  for (uint64_t d = 0; d <= S; ++d) put<int64_t>(idx, static_cast<int64_t>(d));
  io::write_bytes_atomic(prefix + ".bin", bin.data(), bin.size());
  io::write_bytes_atomic(prefix + ".idx", idx.data(), idx.size());
}

}  // namespace exmy::data

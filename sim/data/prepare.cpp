#include "sim/data/prepare.hpp"

#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "formats/error.hpp"
#include "sim/data/token_file.hpp"
#include "sim/data/tokenizer.hpp"

namespace exmy::data {
namespace fs = std::filesystem;

namespace {

bool wanted(const fs::path& p, const std::vector<std::string>& exts) {
  std::string name = p.filename().string();
  if (name.ends_with(".gz")) name.resize(name.size() - 3);
  for (const auto& e : exts)
    if (name.ends_with(e)) return true;
  return false;
}

}  // namespace

std::vector<std::string> collect_text_files(const std::vector<std::string>& inputs,
                                            const std::vector<std::string>& extensions) {
  if (inputs.empty()) throw Error("prepare-data: no --input given");
  std::vector<std::string> files;
  for (const auto& in : inputs) {
    std::error_code ec;
    if (fs::is_directory(in, ec)) {
      std::vector<std::string> found;
      for (auto it = fs::recursive_directory_iterator(in, fs::directory_options::skip_permission_denied, ec);
           !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
        if (it->is_regular_file(ec) && wanted(it->path(), extensions)) found.push_back(it->path().string());
      }
      if (ec) throw Error("cannot list '" + in + "': " + ec.message());
      std::sort(found.begin(), found.end());
      if (found.empty()) {
        std::string e;
        for (const auto& x : extensions) e += (e.empty() ? "" : " ") + x;
        throw Error("'" + in + "' holds no text files (looked for " + e + ", optionally .gz)");
      }
      files.insert(files.end(), found.begin(), found.end());
    } else if (fs::is_regular_file(in, ec)) {
      files.push_back(in);
    } else {
      throw Error("input '" + in + "' does not exist");
    }
  }
  return files;
}

std::string read_text_file(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f) throw Error("cannot open '" + path + "'");
  std::string s;
  char buf[1 << 16];
  for (;;) {
    const int n = gzread(f, buf, sizeof buf);
    if (n < 0) {
      gzclose(f);
      throw Error("cannot read '" + path + "' (corrupt gzip?)");
    }
    if (n == 0) break;
    s.append(buf, static_cast<size_t>(n));
  }
  gzclose(f);
  return s;
}

PrepareResult prepare_data(const PrepareOptions& opt) {
  if (opt.out_dir.empty()) throw Error("prepare-data: --out is required");
  if (opt.tokenizer != "byte" && opt.tokenizer != "bpe")
    throw Error("prepare-data: unknown tokenizer '" + opt.tokenizer + "' (expected byte or bpe)");
  if (opt.format != "flat" && opt.format != "megatron" && opt.format != "both")
    throw Error("prepare-data: unknown format '" + opt.format + "' (expected flat, megatron or both)");
  std::error_code ec;
  if (fs::exists(opt.out_dir, ec) && !opt.overwrite)
    throw Error("prepare-data: '" + opt.out_dir + "' already exists (use --force to replace it)");

  const auto files = collect_text_files(opt.inputs, opt.extensions);
  std::vector<std::string> texts;
  PrepareResult r;
  for (const auto& f : files) {
    texts.push_back(read_text_file(f));
    r.bytes += static_cast<int64_t>(texts.back().size());
  }
  r.files = static_cast<int64_t>(files.size());

  Tokenizer tok = Tokenizer::bytes();
  if (opt.tokenizer == "bpe") {
    // BPE statistics come from all documents together; a document boundary
    // is a chunk boundary anyway.
    std::string all;
    all.reserve(static_cast<size_t>(r.bytes));
    for (const auto& t : texts) all += t;
    tok = Tokenizer::train_bpe(all, opt.vocab_size);
  }
  std::vector<int32_t> tokens;
  std::vector<int64_t> lengths;
  for (const auto& t : texts) {
    const size_t before = tokens.size();
    tok.encode_append(t, tokens);
    lengths.push_back(static_cast<int64_t>(tokens.size() - before));
  }
  r.tokens = static_cast<int64_t>(tokens.size());
  r.vocab_size = tok.vocab_size();
  if (r.tokens == 0) throw Error("prepare-data: the inputs hold no text");

  // Everything goes to a fresh temporary directory next to out_dir, renamed
  // into place only when complete.
  const fs::path out(opt.out_dir);
  if (out.has_parent_path()) fs::create_directories(out.parent_path(), ec);
  const fs::path tmp = out.string() + ".partial-" + std::to_string(::getpid());
  fs::remove_all(tmp, ec);
  if (!fs::create_directories(tmp, ec)) throw Error("cannot create '" + tmp.string() + "': " + ec.message());
  try {
    if (opt.format != "megatron") write_flat_tokens((tmp / "tokens.tok").string(), tokens, r.vocab_size);
    if (opt.format != "flat") write_megatron_tokens((tmp / "tokens").string(), tokens, lengths, r.vocab_size);
    tok.save((tmp / "tokenizer.json").string());
    nlohmann::ordered_json m;
    m["exmy_version"] = opt.version;
    m["tokenizer"] = tok.kind();
    m["vocab_size"] = r.vocab_size;
    m["format"] = opt.format;
    m["files"] = r.files;
    m["bytes"] = r.bytes;
    m["tokens"] = r.tokens;
    nlohmann::ordered_json docs = nlohmann::ordered_json::array();
    for (size_t i = 0; i < files.size(); ++i)
      docs.push_back({{"path", files[i]}, {"bytes", texts[i].size()}, {"tokens", lengths[i]}});
    m["documents"] = docs;
    std::ofstream mf(tmp / "manifest.json");
    mf << m.dump(2) << "\n";
    if (!mf) throw Error("cannot write '" + (tmp / "manifest.json").string() + "'");
    mf.close();
    if (fs::exists(out, ec)) fs::remove_all(out, ec);
    fs::rename(tmp, out, ec);
    if (ec) throw Error("cannot move '" + tmp.string() + "' to '" + out.string() + "': " + ec.message());
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
  return r;
}

}  // namespace exmy::data

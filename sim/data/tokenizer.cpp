#include "sim/data/tokenizer.hpp"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <queue>
#include <sstream>

#include "formats/error.hpp"

namespace exmy::data {
namespace {

// 0 whitespace, 1 word (ASCII letters and digits, and every non-ASCII byte
// so UTF-8 sequences stay together), 2 anything else.
int char_class(unsigned char c) {
  if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f') return 0;
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c >= 0x80) return 1;
  return 2;
}

uint64_t pair_key(int32_t a, int32_t b) { return (static_cast<uint64_t>(a) << 32) | static_cast<uint32_t>(b); }

}  // namespace

std::vector<std::string_view> bpe_chunks(std::string_view t) {
  std::vector<std::string_view> out;
  const size_t n = t.size();
  size_t i = 0;
  while (i < n) {
    const size_t start = i;
    auto cls = [&](size_t k) { return char_class(static_cast<unsigned char>(t[k])); };
    if (t[i] == ' ' && i + 1 < n && cls(i + 1) != 0) ++i;  // a single leading space joins the chunk
    const int c = cls(i);
    if (c == 0) {
      size_t j = i;
      while (j < n && cls(j) == 0) ++j;
      // The space right before a word belongs to that word's chunk.
      if (j < n && j - i >= 2 && t[j - 1] == ' ') --j;
      i = j;
    } else {
      while (i < n && cls(i) == c) ++i;
    }
    out.push_back(t.substr(start, i - start));
  }
  return out;
}

Tokenizer Tokenizer::bytes() {
  Tokenizer t;
  t.build_tables();
  return t;
}

Tokenizer Tokenizer::train_bpe(std::string_view text, int64_t vocab_size) {
  if (vocab_size <= 256 || vocab_size > (int64_t{1} << 31))
    throw Error("BPE vocabulary size must be above 256 (got " + std::to_string(vocab_size) + ")");
  // Unique chunks in sorted order, so word ids (and with them every tie) do
  // not depend on hash-table iteration order.
  std::unordered_map<std::string_view, int64_t> counts;
  for (auto c : bpe_chunks(text)) ++counts[c];
  std::vector<std::pair<std::string_view, int64_t>> words(counts.begin(), counts.end());
  std::sort(words.begin(), words.end());
  std::vector<std::vector<int32_t>> syms(words.size());
  std::vector<int64_t> freq(words.size());
  std::unordered_map<uint64_t, int64_t> pc;               // pair -> occurrences weighted by word frequency
  std::unordered_map<uint64_t, std::vector<int32_t>> where;  // pair -> words that contain (or contained) it
  for (size_t w = 0; w < words.size(); ++w) {
    freq[w] = words[w].second;
    for (unsigned char ch : words[w].first) syms[w].push_back(ch);
    for (size_t i = 0; i + 1 < syms[w].size(); ++i) {
      const uint64_t k = pair_key(syms[w][i], syms[w][i + 1]);
      pc[k] += freq[w];
      where[k].push_back(static_cast<int32_t>(w));
    }
  }
  // Max-heap on (count, ~key): the most frequent pair, ties to the smaller
  // key. Entries go stale when counts change; a popped entry is used only if
  // it still matches the current count.
  std::priority_queue<std::pair<int64_t, uint64_t>> heap;
  for (const auto& [k, c] : pc) heap.emplace(c, ~k);

  Tokenizer tok;
  std::vector<uint64_t> changed;
  std::vector<int32_t> merged;
  while (tok.vocab_size() < vocab_size) {
    uint64_t key = 0;
    bool found = false;
    while (!heap.empty()) {
      const auto [c, nk] = heap.top();
      heap.pop();
      const auto it = pc.find(~nk);
      if (it != pc.end() && it->second == c) {
        if (c >= 2) {
          key = ~nk;
          found = true;
        }
        break;
      }
    }
    if (!found) break;  // no pair occurs twice: the corpus is exhausted
    const int32_t a = static_cast<int32_t>(key >> 32), b = static_cast<int32_t>(key & 0xffffffffu);
    const int32_t z = static_cast<int32_t>(tok.vocab_size());
    tok.merges_.emplace_back(a, b);
    std::vector<int32_t> ws = std::move(where[key]);
    where.erase(key);
    std::sort(ws.begin(), ws.end());
    ws.erase(std::unique(ws.begin(), ws.end()), ws.end());
    changed.clear();
    for (int32_t w : ws) {
      auto& s = syms[static_cast<size_t>(w)];
      bool has = false;
      for (size_t i = 0; i + 1 < s.size() && !has; ++i) has = s[i] == a && s[i + 1] == b;
      if (!has) continue;
      const int64_t f = freq[static_cast<size_t>(w)];
      for (size_t i = 0; i + 1 < s.size(); ++i) {
        const uint64_t k = pair_key(s[i], s[i + 1]);
        pc[k] -= f;
        changed.push_back(k);
      }
      merged.clear();
      for (size_t i = 0; i < s.size(); ++i) {
        if (i + 1 < s.size() && s[i] == a && s[i + 1] == b) {
          merged.push_back(z);
          ++i;
        } else {
          merged.push_back(s[i]);
        }
      }
      s = merged;
      for (size_t i = 0; i + 1 < s.size(); ++i) {
        const uint64_t k = pair_key(s[i], s[i + 1]);
        pc[k] += f;
        changed.push_back(k);
        if (s[i] == z || s[i + 1] == z) where[k].push_back(w);
      }
    }
    pc.erase(key);
    std::sort(changed.begin(), changed.end());
    changed.erase(std::unique(changed.begin(), changed.end()), changed.end());
    for (uint64_t k : changed) {
      if (k == key) continue;
      const auto it = pc.find(k);
      if (it == pc.end()) continue;
      if (it->second <= 0) pc.erase(it);
      else heap.emplace(it->second, ~k);
    }
  }
  tok.build_tables();
  return tok;
}

void Tokenizer::build_tables() {
  pieces_.clear();
  for (int c = 0; c < 256; ++c) pieces_.emplace_back(1, static_cast<char>(c));
  rank_.clear();
  for (size_t i = 0; i < merges_.size(); ++i) {
    const auto [a, b] = merges_[i];
    pieces_.push_back(pieces_[static_cast<size_t>(a)] + pieces_[static_cast<size_t>(b)]);
    rank_.emplace(pair_key(a, b), static_cast<int32_t>(i));
  }
  cache_.clear();
}

void Tokenizer::encode_chunk(std::string_view chunk, std::vector<int32_t>& out) const {
  if (merges_.empty()) {
    for (unsigned char c : chunk) out.push_back(c);
    return;
  }
  const auto hit = cache_.find(std::string(chunk));
  if (hit != cache_.end()) {
    out.insert(out.end(), hit->second.begin(), hit->second.end());
    return;
  }
  std::vector<int32_t> s(chunk.begin(), chunk.end());
  for (auto& x : s) x = static_cast<unsigned char>(x);
  for (;;) {
    int32_t best = INT32_MAX;
    for (size_t i = 0; i + 1 < s.size(); ++i) {
      const auto it = rank_.find(pair_key(s[i], s[i + 1]));
      if (it != rank_.end()) best = std::min(best, it->second);
    }
    if (best == INT32_MAX) break;
    const auto [a, b] = merges_[static_cast<size_t>(best)];
    std::vector<int32_t> t;
    t.reserve(s.size());
    for (size_t i = 0; i < s.size(); ++i) {
      if (i + 1 < s.size() && s[i] == a && s[i + 1] == b) {
        t.push_back(256 + best);
        ++i;
      } else {
        t.push_back(s[i]);
      }
    }
    s.swap(t);
  }
  out.insert(out.end(), s.begin(), s.end());
  cache_.emplace(std::string(chunk), std::move(s));
}

void Tokenizer::encode_append(std::string_view text, std::vector<int32_t>& out) const {
  if (merges_.empty()) {
    for (unsigned char c : text) out.push_back(c);
    return;
  }
  for (auto c : bpe_chunks(text)) encode_chunk(c, out);
}

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
  std::vector<int32_t> out;
  encode_append(text, out);
  return out;
}

std::string Tokenizer::decode(std::span<const int32_t> tokens) const {
  std::string s;
  for (int32_t t : tokens) {
    if (t < 0 || t >= vocab_size())
      throw Error("token " + std::to_string(t) + " is outside the tokenizer's vocabulary of " +
                  std::to_string(vocab_size()));
    s += pieces_[static_cast<size_t>(t)];
  }
  return s;
}

std::string Tokenizer::to_json() const {
  nlohmann::ordered_json j;
  j["type"] = kind();
  j["vocab_size"] = vocab_size();
  nlohmann::json m = nlohmann::json::array();
  for (const auto& [a, b] : merges_) m.push_back({a, b});
  j["merges"] = m;
  return j.dump() + "\n";
}

Tokenizer Tokenizer::from_json(std::string_view text, const std::string& origin) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception&) {
    throw Error("tokenizer '" + origin + "' is not valid JSON");
  }
  Tokenizer t;
  try {
    const std::string type = j.at("type").get<std::string>();
    if (type != "byte" && type != "bpe") throw Error("tokenizer '" + origin + "': unknown type '" + type + "'");
    if (type == "bpe") {
      for (const auto& m : j.at("merges")) {
        const int64_t a = m.at(0).get<int64_t>(), b = m.at(1).get<int64_t>();
        const int64_t next = 256 + static_cast<int64_t>(t.merges_.size());
        if (a < 0 || b < 0 || a >= next || b >= next)
          throw Error("tokenizer '" + origin + "': merge " + std::to_string(t.merges_.size()) +
                      " refers to a token that does not exist yet");
        t.merges_.emplace_back(static_cast<int32_t>(a), static_cast<int32_t>(b));
      }
    }
    if (j.contains("vocab_size") && j["vocab_size"].get<int64_t>() != t.vocab_size())
      throw Error("tokenizer '" + origin + "': vocab_size does not match its merges");
  } catch (const nlohmann::json::exception&) {
    throw Error("tokenizer '" + origin + "' is malformed (expected type, vocab_size and merges)");
  }
  t.build_tables();
  return t;
}

Tokenizer Tokenizer::load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot open tokenizer '" + path + "'");
  std::stringstream ss;
  ss << in.rdbuf();
  return from_json(ss.str(), path);
}

void Tokenizer::save(const std::string& path) const {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << to_json();
  if (!out) throw Error("cannot write tokenizer '" + path + "'");
}

}  // namespace exmy::data

// libFuzzer target: the text and token-file parsers a user feeds exmy train
// and exmy sweep — recipe files, run configurations and their --set
// overrides, sweep files, the small value grammars, and token files (flat
// and Megatron .bin/.idx).
//
// Input layout: byte 0 picks the parser (modulo their number, in the order
// of Parser below); the rest is the text, or for token files the file bytes
// (byte 1 then picks the format and, for Megatron sets, bytes 2-3 where the
// .idx ends and the .bin begins).
//
// A parser must either return or throw exmy::Error (one clear line); any
// other exception (std::out_of_range from a number conversion, a JSON
// library error, ...) escapes and libFuzzer reports it, as it does a
// sanitizer report. Beyond not failing, what is parsed must hold together:
// a recipe and a run configuration read back from the text exmy writes for
// them give the same text again, a sweep expands into exactly run_count()
// runs, and a token stream reads back size() tokens, each below its
// vocabulary size.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "formats/error.hpp"
#include "formats/vocab.hpp"
#include "sim/data/token_file.hpp"
#include "sim/quant/ini.hpp"
#include "sim/quant/recipe.hpp"
#include "sim/sweep/sweep.hpp"
#include "sim/train/run_config.hpp"
#include "tests/fuzz/fuzz_support.hpp"

namespace {

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "fuzz_configs: %s\n", what.c_str());
  std::abort();
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  size_t b = 0;
  while (b <= text.size()) {
    const size_t e = std::min(text.find('\n', b), text.size());
    out.push_back(text.substr(b, e - b));
    b = e + 1;
  }
  return out;
}

enum Parser { kIni, kRecipe, kRunConfig, kOverrides, kSweep, kGrammars, kTokens, kParsers };

void recipe(const std::string& text) {
  namespace q = exmy::sim::quant;
  const q::Recipe r = q::parse_recipe(text, "fuzz", "fuzz input");
  const std::string ini = q::recipe_to_ini(r);
  std::string again;
  try {
    again = q::recipe_to_ini(q::parse_recipe(ini, "fuzz", "fuzz input"));
  } catch (const exmy::Error& e) {
    fail(std::string("recipe_to_ini wrote text parse_recipe rejects: ") + e.what() + "\n" + ini);
  }
  if (again != ini) fail("recipe text does not round-trip:\n" + ini + "\n---\n" + again);
}

void run_config(const std::string& text, const std::vector<std::string>& overrides) {
  const exmy::train::RunConfig c = exmy::train::parse_run_config(text, "fuzz input", overrides);
  const std::string resolved = c.text();
  std::string again;
  try {
    again = exmy::train::parse_run_config(resolved, "fuzz input", {}).text();
  } catch (const exmy::Error& e) {
    fail(std::string("RunConfig::text wrote text parse_run_config rejects: ") + e.what() + "\n" + resolved);
  }
  if (again != resolved) fail("run configuration does not round-trip:\n" + resolved + "\n---\n" + again);
}

void sweep(const std::string& text) {
  const exmy::sweep::SweepSpec s = exmy::sweep::parse_sweep(text, "fuzz input");
  const int64_t n = s.run_count();
  if (n < 1 || n > 1000000) fail("parse_sweep accepted a sweep of " + std::to_string(n) + " runs");
  if (n > 4096) return;  // expanding is linear in the runs; bounded for speed
  const auto runs = exmy::sweep::expand(s);
  if (static_cast<int64_t>(runs.size()) != n)
    fail("expand gave " + std::to_string(runs.size()) + " runs of " + std::to_string(n));
}

// The one-line grammars, each on every line of the text.
void grammars(const std::string& text) {
  namespace q = exmy::sim::quant;
  for (const std::string& line : lines_of(text)) {
    const auto attempt = [&](auto&& f) {
      try {
        f();
      } catch (const exmy::Error&) {
      }
    };
    attempt([&] { (void)q::ref_policy_name(q::parse_ref_policy(line)); });
    attempt([&] { (void)q::block_selector_name(q::parse_block_selector(line)); });
    attempt([&] { (void)q::parse_role(line); });
    attempt([&] { (void)exmy::sweep::split_values(line, "fuzz"); });
    // Every QuantSpec knob (formats/vocab.hpp): a value it takes prints as
    // text that it reads back to the same print.
    for (const exmy::QuantKnob& k : exmy::quant_knobs()) {
      exmy::QuantSpec spec;
      try {
        k.parse(spec, line);
      } catch (const exmy::Error&) {
        continue;
      }
      const std::string printed = k.print(spec);
      exmy::QuantSpec back;
      try {
        k.parse(back, printed);
      } catch (const exmy::Error& e) {
        fail(std::string(k.name) + " prints '" + printed + "', which it rejects: " + e.what());
      }
      if (k.print(back) != printed) fail(std::string(k.name) + " '" + printed + "' reads back as '" + k.print(back) + "'");
    }
    attempt([&] {
      q::Recipe r = q::parse_recipe("", "fuzz", "empty");
      q::apply_recipe_override(r, line);
      q::validate_recipe(r);
    });
  }
}

void tokens(const uint8_t* data, size_t size) {
  if (size < 3) return;
  const int format = data[0] % 3;
  const std::string& dir = exmy::fuzz::work_dir("exmy_fuzz_configs");
  // each input starts from an empty directory, also after one that threw
  for (const char* f : {"/in.tok", "/in.idx", "/in.bin"}) std::filesystem::remove(dir + f);
  std::string path;
  const char* fmt = "auto";
  if (format == 0) {  // a flat file
    path = dir + "/in.tok";
    exmy::fuzz::write_file(path, data + 3, size - 3);
    fmt = data[1] & 1 ? "flat" : "auto";
  } else {  // a Megatron set: .idx then .bin
    const size_t body = size - 3;
    const size_t split = std::min<size_t>(body, static_cast<size_t>(data[1]) | static_cast<size_t>(data[2]) << 8);
    path = dir + "/in";
    exmy::fuzz::write_file(path + ".idx", data + 3, split);
    exmy::fuzz::write_file(path + ".bin", data + 3 + split, body - split);
    fmt = format == 1 ? "megatron" : "auto";
    if (format == 2) path += ".bin";
  }
  const auto stream = exmy::data::open_tokens(path, fmt);
  const int64_t n = stream->size(), vocab = stream->vocab_size();
  if (n < 0 || vocab < 0 || (n > 0 && vocab < 1))
    fail("token stream of size " + std::to_string(n) + ", vocabulary " + std::to_string(vocab));
  std::vector<int32_t> buf(256);
  for (int64_t off = 0; off < n; off += 256) {
    const int64_t k = std::min<int64_t>(256, n - off);
    stream->read(off, k, buf.data());
    for (int64_t i = 0; i < k; ++i)
      if (buf[static_cast<size_t>(i)] < 0 || buf[static_cast<size_t>(i)] >= vocab)
        fail("token " + std::to_string(buf[static_cast<size_t>(i)]) + " outside [0, " + std::to_string(vocab) + ")");
  }
  // reading past the end is an error, not a crash
  try {
    stream->read(n, 1, buf.data());
    fail("reading past the end of the token stream did not throw");
  } catch (const exmy::Error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const auto parser = static_cast<Parser>(data[0] % kParsers);
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  try {
    switch (parser) {
      case kIni: (void)exmy::sim::quant::parse_ini(text, "fuzz input"); break;
      case kRecipe: recipe(text); break;
      case kRunConfig: run_config(text, {}); break;
      case kOverrides: run_config("", lines_of(text)); break;
      case kSweep: sweep(text); break;
      case kGrammars: grammars(text); break;
      case kTokens: tokens(data + 1, size - 1); break;
      case kParsers: break;
    }
  } catch (const exmy::Error&) {
    // The expected way to reject an input.
  }
  return 0;
}

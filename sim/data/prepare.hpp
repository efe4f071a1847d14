// `exmy prepare-data`: text files -> token files.
//
// Inputs are files or directories; directories are walked recursively and
// their files with one of `extensions` (".txt", ".txt.gz", ... ; gzip is read
// transparently) are taken in sorted path order, so the same inputs always
// give the same token files. Each file is one document.
//
// The output directory gets
//   tokens.tok                 flat token file (format "flat" or "both")
//   tokens.bin, tokens.idx     Megatron indexed dataset, one document per file ("megatron" or "both")
//   tokenizer.json             the tokenizer (byte, or the BPE trained on these files)
//   manifest.json              inputs, byte and token counts, tokenizer, exmy version
// written into a temporary directory that is renamed into place at the end,
// so an interrupted preparation never leaves a half-written data set.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace exmy::data {

struct PrepareOptions {
  std::vector<std::string> inputs;
  std::string out_dir;
  std::string tokenizer = "byte";  // byte | bpe
  int64_t vocab_size = 4096;       // bpe only
  std::string format = "flat";     // flat | megatron | both
  std::vector<std::string> extensions = {".txt", ".text", ".md", ".rst"};
  bool overwrite = false;          // replace an existing out_dir
  std::string version;             // exmy version for the manifest
};

struct PrepareResult {
  int64_t files = 0, bytes = 0, tokens = 0, vocab_size = 0;
};

PrepareResult prepare_data(const PrepareOptions& opt);

// The files prepare_data would read, in order (for messages and tests).
std::vector<std::string> collect_text_files(const std::vector<std::string>& inputs,
                                            const std::vector<std::string>& extensions);

// A whole file, gunzipped when it is gzip (zlib reads plain files as they are).
std::string read_text_file(const std::string& path);

}  // namespace exmy::data

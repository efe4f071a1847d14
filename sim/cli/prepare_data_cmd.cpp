// `exmy prepare-data`: text files -> token files (sim/data/prepare.hpp).
#include <boost/program_options.hpp>
#include <cstdio>
#include <iostream>
#include <sstream>

#include "formats/error.hpp"
#include "sim/cli/cli_support.hpp"
#include "sim/cli/commands.hpp"
#include "sim/data/prepare.hpp"

#ifndef EXMY_VERSION
#define EXMY_VERSION "unknown"
#endif

namespace po = boost::program_options;

namespace exmy::cli {

int cmd_prepare_data(const Args& args) {
  po::options_description desc(
      "exmy prepare-data: turn text files into token files for exmy train\n\n"
      "usage: exmy prepare-data --out DIR [--tokenizer byte|bpe] [--vocab-size N] [--format flat|megatron|both] PATH...\n"
      "PATH: text files, or directories searched recursively for --ext files (gzip read transparently).\n"
      "DIR gets tokens.tok and/or tokens.bin/.idx, tokenizer.json and manifest.json.\n\noptions");
  // clang-format off
  desc.add_options()
    ("help,h", "show this help")
    ("input", po::value<std::vector<std::string>>()->composing(), "text file or directory (also positional)")
    ("out", po::value<std::string>(), "output directory")
    ("tokenizer", po::value<std::string>()->default_value("byte"), "byte (vocabulary 256) or bpe (trained on the inputs)")
    ("vocab-size", po::value<int64_t>()->default_value(4096), "BPE vocabulary size (> 256)")
    ("format", po::value<std::string>()->default_value("flat"), "flat (tokens.tok), megatron (tokens.bin/.idx) or both")
    ("ext", po::value<std::string>()->default_value(".txt,.text,.md,.rst"), "file endings taken from directories")
    ("force", "replace an existing output directory");
  // clang-format on
  po::positional_options_description pos;
  pos.add("input", -1);
  po::variables_map vm;
  if (parse_or_help(args, desc, pos, vm)) return 0;
  if (!vm.count("input")) throw Error("prepare-data: give at least one input file or directory");
  if (!vm.count("out")) throw Error("prepare-data: --out DIR is required");
  data::PrepareOptions o;
  o.inputs = vm["input"].as<std::vector<std::string>>();
  o.out_dir = vm["out"].as<std::string>();
  o.tokenizer = vm["tokenizer"].as<std::string>();
  o.vocab_size = vm["vocab-size"].as<int64_t>();
  o.format = vm["format"].as<std::string>();
  o.overwrite = vm.count("force") > 0;
  o.version = EXMY_VERSION;
  o.extensions.clear();
  std::stringstream ss(vm["ext"].as<std::string>());
  for (std::string e; std::getline(ss, e, ',');)
    if (!e.empty()) o.extensions.push_back(e[0] == '.' ? e : "." + e);
  const auto r = data::prepare_data(o);
  std::printf("prepare-data: %lld files, %lld bytes -> %lld tokens (%s tokenizer, vocabulary %lld) in %s\n",
              static_cast<long long>(r.files), static_cast<long long>(r.bytes), static_cast<long long>(r.tokens),
              o.tokenizer.c_str(), static_cast<long long>(r.vocab_size), o.out_dir.c_str());
  return 0;
}

}  // namespace exmy::cli

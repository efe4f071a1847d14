// `exmy quantize`: the command-line contract of docs/numerics.md §7.
#include <boost/program_options.hpp>
#include <charconv>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "formats/parse_number.hpp"
#include "formats/conventions.hpp"
#include "formats/error.hpp"
#include "formats/quantize.hpp"
#include "formats/spec.hpp"
#include "sim/cli/cli_support.hpp"
#include "sim/parallel.hpp"
#include "sim/cli/commands.hpp"
#include "sim/cli/stats_json.hpp"
#include "sim/io/tensor_io.hpp"

namespace po = boost::program_options;

namespace exmy::cli {
namespace {

void parse_shape(const std::string& s, int64_t& rows, int64_t& cols) {
  const auto comma = s.find(',');
  auto num = [&](std::string_view t, int64_t& v) {
    auto [p, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
    return ec == std::errc() && p == t.data() + t.size() && v > 0;
  };
  if (comma == std::string::npos || !num(std::string_view(s).substr(0, comma), rows) ||
      !num(std::string_view(s).substr(comma + 1), cols) || rows > (int64_t{1} << 40) / cols)
    throw Error("bad --shape '" + s + "' (expected R,C with positive integers, e.g. 128,4096)");
}

}  // namespace

int cmd_quantize(const Args& args) {
  po::options_description desc(
      "exmy quantize: block-scaled quantization of a float32 tensor (docs/numerics.md §7)\n\n"
      "usage: exmy quantize --input X [--shape R,C] --elem FMT [options] --output Y\n\n"
      "Files: raw little-endian float32 (any name), .npy (float32), or file.h5:/dataset.\n"
      "A format is a preset (e2m1 e2m3 e3m2 e4m3 e5m2 ue4m3 ue5m3 ue8m0 bf16 fp16 fp32),\n"
      "an ml_dtypes name, or [u]e<E>m<M>[:bias=<int>,nosub,inf,noinf,nans=<int>,nonegzero].\n\noptions");
  // clang-format off
  desc.add_options()
    ("help,h", "show this help")
    ("input", po::value<std::string>(), "input tensor X")
    ("shape", po::value<std::string>(), "R,C: rows and columns of X (optional for .npy/HDF5 inputs)")
    ("elem", po::value<std::string>(), "element format Fe")
    ("scale", po::value<std::string>()->default_value("none"), "block scale format Fs, or none")
    ("block", po::value<std::string>()->default_value("1x16"), "block shape: 1xB, Bx1 or BxB")
    ("scale-rule", po::value<std::string>()->default_value("amax-rne"),
        "amax-rne | amax-up | amax-down | mx-floor | mx-ceil | mx-even")
    ("tensor-amax", po::value<std::string>()->default_value("none"), "tensor reference amax: none | auto | <float>")
    ("scale-target", po::value<double>(), "scale target T (a float32 value; default Fs.max)")
    ("round", po::value<std::string>()->default_value("rne"),
        "rne | rna | rtz | up | down | odd | stochastic | stochastic-fast | stochastic-fastest")
    ("sr-bits", po::value<int>()->default_value(8), "random bits per element for stochastic modes (1..32)")
    ("seed", po::value<std::string>()->default_value("0"), "Philox key (64-bit)")
    ("stream", po::value<std::string>()->default_value("0"), "Philox stream (64-bit)")
    ("arith", po::value<std::string>()->default_value("exact"), "exact | fp32 (Transformer Engine's FP32 operation order)")
    ("zero-scale", po::value<std::string>()->default_value("zero"), "zero | one: scale stored for blocks whose scale is 0")
    ("convention", po::value<std::string>()->default_value("exmy"), "exmy | te: te writes Transformer Engine's bytes (a zero-scale block's non-zero elements as +-Fe.max codes, -0 inputs as +0); values and statistics unchanged but for the sign of those zeros")
    ("dequant", po::value<std::string>()->default_value("product-first"), "product-first | scale-first: fp32 arithmetic's x-hat as fl(fl(q*s)*1/G) (the UE5M3 paper's Triton kernel) or fl(q*fl(s*1/G)) (its portable Torch path)")
    ("no-saturate", "overflow to Inf/NaN instead of saturating to max")
    ("rht", "apply the 16-point random Hadamard transform along the block axis first")
    ("rht-signs", po::value<std::string>()->default_value("0xD7E8"), "16-bit sign mask of the transform")
    ("output", po::value<std::string>(), "dequantized tensor Y")
    ("codes", po::value<std::string>(), "element codes: one byte each (two little-endian bytes above 8 bits, four above 16)")
    ("scales", po::value<std::string>(), "block scale codes, row-major block order, same width rule")
    ("stats", po::value<std::string>(), "statistics as JSON (docs/numerics.md §5)")
    ("threads", po::value<int>()->default_value(0), "threads (0: all cores); results do not depend on it")
    ("reference", "use the scalar reference implementation");
  // clang-format on
  po::variables_map vm;
  if (parse_or_help(args, desc, {}, vm)) return 0;
  for (const char* req : {"input", "elem", "output"})
    if (!vm.count(req)) throw Error(std::string("missing --") + req + " (see exmy quantize --help)");

  QuantSpec spec;
  spec.elem = parse_format(vm["elem"].as<std::string>());
  const std::string scale = vm["scale"].as<std::string>();
  if (scale != "none") spec.scale = parse_format(scale);
  parse_block(vm["block"].as<std::string>(), spec.block_rows, spec.block_cols);
  spec.rule = parse_scale_rule(vm["scale-rule"].as<std::string>());
  parse_tensor_amax(vm["tensor-amax"].as<std::string>(), spec.amax_kind, spec.amax_value);
  if (vm.count("scale-target")) spec.scale_target = vm["scale-target"].as<double>();
  spec.round = parse_round(vm["round"].as<std::string>());
  spec.sr_bits = vm["sr-bits"].as<int>();
  spec.seed = parse_u64("--seed", vm["seed"].as<std::string>());
  spec.stream = parse_u64("--stream", vm["stream"].as<std::string>());
  spec.arith = parse_arith(vm["arith"].as<std::string>());
  spec.zero_scale = parse_zero_scale(vm["zero-scale"].as<std::string>());
  spec.codes = parse_code_convention(vm["convention"].as<std::string>());
  spec.dequant = parse_dequant_order(vm["dequant"].as<std::string>());
  spec.saturate = !vm.count("no-saturate");
  spec.rht = vm.count("rht") > 0;
  const uint64_t signs = parse_u64("--rht-signs", vm["rht-signs"].as<std::string>());
  if (signs > 0xffff) throw Error("--rht-signs must be a 16-bit mask, got " + vm["rht-signs"].as<std::string>());
  spec.rht_signs = static_cast<uint16_t>(signs);
  spec.validate();
  const int threads = sim::checked_threads(vm["threads"].as<int>(), "--threads");
  // Every output path is checked before any work (sim/io/atomic_file.hpp).
  for (const char* o : {"output", "codes", "scales", "stats"})
    if (vm.count(o)) io::check_output_path(vm[o].as<std::string>());

  int64_t rows = 0, cols = 0;
  if (vm.count("shape")) parse_shape(vm["shape"].as<std::string>(), rows, cols);
  const io::Tensor x = io::read_tensor(vm["input"].as<std::string>(), rows, cols);

  const int64_t n = x.rows * x.cols;
  std::vector<float> values(static_cast<size_t>(n));
  std::vector<uint8_t> codes(static_cast<size_t>(n * spec.elem.code_bytes()));
  const int64_t nb = block_count(spec, x.rows, x.cols);
  std::vector<uint8_t> scodes(static_cast<size_t>(nb * (spec.scale ? spec.scale->code_bytes() : 1)));
  QuantStats stats;
  QuantOutput out{values.data(), codes.data(), scodes.data(), &stats};
  if (vm.count("reference")) quantize_ref(spec, x.data.data(), x.rows, x.cols, out);
  else quantize(spec, x.data.data(), x.rows, x.cols, out, threads);

  io::OutputSet outputs;
  outputs.add_tensor(vm["output"].as<std::string>(), values.data(), x.rows, x.cols);
  if (vm.count("codes")) outputs.add_bytes(vm["codes"].as<std::string>(), codes.data(), codes.size());
  if (vm.count("scales")) outputs.add_bytes(vm["scales"].as<std::string>(), scodes.data(), nb > 0 ? scodes.size() : 0);
  if (vm.count("stats")) outputs.add_text(vm["stats"].as<std::string>(), stats_to_json(stats).dump(2) + "\n");
  outputs.commit();
  return 0;
}

}  // namespace exmy::cli

// `exmy quantize`: the command-line contract of docs/numerics.md §7.
#include <boost/program_options.hpp>
#include <charconv>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "formats/error.hpp"
#include "formats/quantize.hpp"
#include "formats/spec.hpp"
#include "formats/vocab.hpp"
#include "sim/cli/cli_support.hpp"
#include "sim/parallel.hpp"
#include "sim/cli/commands.hpp"
#include "sim/cli/stats_json.hpp"
#include "sim/device/device.hpp"
#include "sim/io/quantize_stream.hpp"
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

// One option per QuantSpec knob (formats/vocab.hpp): --FLAG VALUE with the
// default spec's value as default, or a bare switch.
void add_knob_options(po::options_description& desc) {
  const QuantSpec defaults;
  for (const QuantKnob& k : quant_knobs()) {
    const std::string help = std::string(k.help) + (k.options_help ? k.options_help() : std::string());
    if (k.switch_value) desc.add_options()(k.flag, help.c_str());
    else if (std::string_view(k.name) == "elem")
      desc.add_options()(k.flag, po::value<std::string>()->value_name(k.syntax), help.c_str());
    else
      desc.add_options()(k.flag, po::value<std::string>()->default_value(k.print(defaults))->value_name(k.syntax),
                         help.c_str());
  }
}

// The spec the knob options give; an error names the option.
QuantSpec knob_options_spec(const po::variables_map& vm) {
  QuantSpec spec;
  for (const QuantKnob& k : quant_knobs()) {
    if (!vm.count(k.flag)) continue;
    const std::string v = k.switch_value ? k.switch_value : vm[k.flag].as<std::string>();
    try {
      k.parse(spec, v);
    } catch (const Error& e) {
      throw Error("--" + std::string(k.flag) + ": " + e.what());
    }
  }
  return spec;
}

}  // namespace

int cmd_quantize(const Args& args) {
  po::options_description desc(
      "exmy quantize: block-scaled quantization of a float32 tensor (docs/numerics.md §7)\n\n"
      "usage: exmy quantize --input X [--shape R,C] --elem FMT [options] --output Y\n\n"
      "Files: raw little-endian float32 (any name), .npy (float32), or file.h5:/dataset.\n"
      "A format is a preset (e2m1 e2m3 e3m2 e4m3 e5m2 ue4m3 ue5m3 ue8m0 bf16 fp16 fp32),\n"
      "an ml_dtypes name, or [u]e<E>m<M>[:bias=<int>,nosub,inf,noinf,nans=<int>,nonegzero].\n"
      "Integers are decimal or 0x-prefixed hex.\n\noptions",
      120, 60);
  // clang-format off
  desc.add_options()
    ("help,h", "show this help")
    ("input", po::value<std::string>(), "input tensor X")
    ("shape", po::value<std::string>(), "R,C: rows and columns of X (optional for .npy/HDF5 inputs)");
  add_knob_options(desc);
  desc.add_options()
    ("output", po::value<std::string>(), "dequantized tensor Y")
    ("codes", po::value<std::string>(), "element codes: one byte each (two little-endian bytes above 8 bits, four above 16)")
    ("scales", po::value<std::string>(), "block scale codes, row-major block order, same width rule")
    ("stats", po::value<std::string>(), "statistics as JSON (docs/numerics.md §5)")
    ("threads", po::value<int>()->default_value(0), "threads (0: all cores); results do not depend on it")
    ("device", po::value<std::string>()->default_value("cpu"), "cpu, cuda or cuda:N: where to quantize (the same bits)")
    ("reference", "use the scalar reference implementation (CPU, on the whole tensor at once; without it the CPU streams the input in bands)");
  // clang-format on
  po::variables_map vm;
  if (parse_or_help(args, desc, {}, vm)) return 0;
  for (const char* req : {"input", "elem", "output"})
    if (!vm.count(req)) throw Error(std::string("missing --") + req + " (see exmy quantize --help)");

  const QuantSpec spec = knob_options_spec(vm);
  spec.validate();
  const int threads = sim::checked_threads(vm["threads"].as<int>(), "--threads");
  const sim::Device device = sim::parse_device(vm["device"].as<std::string>(), "--device");
  if (device.is_cuda() && vm.count("reference"))
    throw Error("--reference is the CPU's scalar reference; it does not go with --device " + sim::device_name(device));
  sim::require_device(device, "--device");
  // Every output path is checked before any work (sim/io/atomic_file.hpp).
  for (const char* o : {"output", "codes", "scales", "stats"})
    if (vm.count(o)) io::check_output_path(vm[o].as<std::string>());

  int64_t rows = 0, cols = 0;
  if (vm.count("shape")) parse_shape(vm["shape"].as<std::string>(), rows, cols);
  auto path = [&](const char* o) { return vm.count(o) ? vm[o].as<std::string>() : std::string(); };
  io::OutputSet outputs;
  QuantStats stats;
  if (device.is_cuda()) {
    // The device quantizes the whole tensor in one call (the CPU streams it).
    const io::Tensor x = io::read_tensor(path("input"), rows, cols);
    const int64_t n = x.rows * x.cols;
    std::vector<float> values(static_cast<size_t>(n));
    std::vector<uint8_t> codes(static_cast<size_t>(n * spec.elem.code_bytes()));
    const int64_t nb = block_count(spec, x.rows, x.cols);
    std::vector<uint8_t> scodes(static_cast<size_t>(nb * (spec.scale ? spec.scale->code_bytes() : 1)));
    sim::quantize_on(device, spec, x.data.data(), x.rows, x.cols, QuantOutput{values.data(), codes.data(), scodes.data(), &stats},
                     threads);
    outputs.add_tensor(path("output"), values.data(), x.rows, x.cols);
    if (vm.count("codes")) outputs.add_bytes(path("codes"), codes.data(), codes.size());
    if (vm.count("scales")) outputs.add_bytes(path("scales"), scodes.data(), nb > 0 ? scodes.size() : 0);
  } else {
    io::TensorReader in(path("input"), rows, cols);  // checks the file before any output exists
    const io::QuantizeFiles files{path("output"), path("codes"), path("scales"), vm.count("stats") > 0};
    stats = io::quantize_stream(spec, in, files, outputs, threads, vm.count("reference") > 0);
  }
  if (vm.count("stats")) outputs.add_text(path("stats"), stats_to_json(stats).dump(2) + "\n");
  outputs.commit();
  return 0;
}

}  // namespace exmy::cli

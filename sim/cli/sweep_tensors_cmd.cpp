// `exmy sweep-tensors`: the statistics (docs/numerics.md §5) of captured tensors under a
// grid of quantization settings, without training (sim/sweep/tensor_sweep.hpp).
//
//   exmy sweep-tensors runs/x/run.h5 --formats e2m1/e4m3/1x16,e2m1/ue5m3/1x16 --tensor-amax auto
//       --round rne,stochastic --csv t.csv --h5 t.h5
//   exmy sweep-tensors a.npy b.npy --grid experiments/sweeps/tensors-fp4.ini --csv t.csv
#include <boost/program_options.hpp>

#include <cstdio>
#include <iostream>

#include "formats/error.hpp"
#include "formats/vocab.hpp"
#include "sim/cli/cli_support.hpp"
#include "sim/parallel.hpp"
#include "sim/cli/commands.hpp"
#include "sim/sweep/sweep.hpp"
#include "sim/sweep/tensor_sweep.hpp"

namespace po = boost::program_options;

namespace exmy::cli {

int cmd_sweep_tensors(const Args& args) {
  using sweep::grid_knob_names;
  po::options_description desc(
      "exmy sweep-tensors: statistics of tensors under a grid of quantization settings (docs/sweeps.md)\n\n"
      "usage: exmy sweep-tensors INPUT... (--formats LIST | --elem LIST | --grid FILE) [grid options] "
      "--csv FILE [--h5 FILE]\n\n"
      "INPUT: an HDF5 file (every 2-D float32 dataset under --group; a run file with a capture step),\n"
      "file.h5:/dataset, or a .npy file. Grid options take comma-separated lists; the command line's\n"
      "lists form one family (their full grid), each section of --grid another.\n\noptions");
  // clang-format off
  desc.add_options()
    ("help,h", "show this help")
    ("input", po::value<std::vector<std::string>>(), "input files")
    ("group", po::value<std::string>()->default_value("/capture"), "HDF5 group searched in whole-file inputs")
    ("grid", po::value<std::string>(), "INI file of families: [NAME] sections of knob = list")
    ("formats", po::value<std::string>(), "ELEM[/SCALE[/BLOCK]] list, e.g. e2m1/e4m3/1x16,e2m1/ue5m3/1x16");
  // One list option per QuantSpec knob (formats/vocab.hpp), by its grid name.
  const std::vector<std::string> knobs = grid_knob_names();
  for (const std::string& k : knobs) {
    if (const QuantKnob* q = find_quant_knob(k)) {
      const std::string help = "list of: " + std::string(q->help) + (q->options_help ? q->options_help() : std::string());
      desc.add_options()(k.c_str(), po::value<std::string>(), help.c_str());
    }
  }
  desc.add_options()
    ("recorded", "also replay each captured tensor's own recorded settings (combination 'recorded')")
    ("list", "list the tensors and combinations, and exit")
    ("csv", po::value<std::string>(), "CSV output: one row per tensor and combination")
    ("h5", po::value<std::string>(), "HDF5 output: /tensors, /combos, /results columns")
    ("threads", po::value<int>()->default_value(0), "threads of each quantization (0: one per 64k elements, at most the cores)");
  // clang-format on
  po::positional_options_description pos;
  pos.add("input", -1);
  po::variables_map vm;
  if (parse_or_help(args, desc, pos, vm)) return 0;
  if (!vm.count("input")) throw Error("no input tensors (see exmy sweep-tensors --help)");

  std::vector<std::pair<std::string, sweep::Family>> families;
  if (vm.count("grid")) families = sweep::load_tensor_grid(vm["grid"].as<std::string>());
  sweep::Family cli;
  for (const std::string& name : knobs) {
    const std::string opt = name == "format" ? "formats" : name;
    if (!vm.count(opt)) continue;
    cli.emplace_back(name, sweep::split_values(vm[opt].as<std::string>(), "--" + opt));
  }
  if (vm.count("formats") && vm.count("elem")) throw Error("give --formats or --elem, not both");
  if (!cli.empty()) {
    if (!vm.count("formats") && !vm.count("elem"))
      throw Error("the command line's grid needs --formats or --elem (or put everything in --grid)");
    families.emplace_back("cli", cli);
  }
  if (families.empty() && !vm.count("recorded"))
    throw Error("nothing to sweep: give --formats, --elem or --grid (or --recorded)");
  const auto combos = sweep::expand_families(families);
  const auto tensors = sweep::list_tensors(vm["input"].as<std::vector<std::string>>(), vm["group"].as<std::string>());

  if (vm.count("list")) {
    std::printf("%zu tensors:\n", tensors.size());
    for (const auto& t : tensors) std::printf("  %s\n", t.name.c_str());
    std::printf("%zu combinations%s:\n", combos.size(), vm.count("recorded") ? " (and each tensor's recorded one)" : "");
    for (const auto& c : combos) std::printf("  %s\n", c.name.c_str());
    return 0;
  }
  if (!vm.count("csv") && !vm.count("h5")) throw Error("no output: give --csv FILE and/or --h5 FILE");
  const auto s = sweep::run_tensor_sweep(tensors, combos, vm.count("recorded") > 0, sim::checked_threads(vm["threads"].as<int>(), "--threads"));
  sweep::write_tensor_sweep(s, vm.count("csv") ? vm["csv"].as<std::string>() : "",
                            vm.count("h5") ? vm["h5"].as<std::string>() : "");
  size_t errors = 0;
  for (const auto& r : s.results) errors += !r.error.empty();
  std::printf("%zu tensors x %zu combinations%s: %zu results (%zu not applicable: see the error column)\n",
              tensors.size(), combos.size(), vm.count("recorded") ? " (+ recorded)" : "", s.results.size(), errors);
  return 0;
}

}  // namespace exmy::cli

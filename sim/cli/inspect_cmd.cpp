// `exmy inspect`: a run file's configuration, loss summary and per-layer
// tables of the worst quantization statistics (sim/eval/inspect.hpp).
//
//   exmy inspect RUN.h5|RUN_DIR [--csv FILE] [--top N] [--no-config]
#include <boost/program_options.hpp>

#include <cstdio>
#include <iostream>

#include "formats/error.hpp"
#include "sim/cli/cli_support.hpp"
#include "sim/cli/commands.hpp"
#include "sim/eval/inspect.hpp"
#include "sim/io/tensor_io.hpp"

namespace po = boost::program_options;

namespace exmy::cli {

int cmd_inspect(const Args& args) {
  po::options_description desc(
      "exmy inspect: configuration, loss summary and worst per-layer statistics of a run file\n\n"
      "usage: exmy inspect RUN.h5|RUN_DIR [--csv FILE] [--top N] [--no-config]\n\noptions");
  // clang-format off
  desc.add_options()
    ("help,h", "show this help")
    ("run", po::value<std::string>(), "run file (or a run directory: its run.h5)")
    ("csv", po::value<std::string>(), "also write the tables to FILE: table,layer,gemm,operand,statistic,worst,step,last,rows")
    ("top", po::value<int64_t>()->default_value(0), "print only the N worst rows of each table (0: all)")
    ("no-config", "leave out the configuration and recipe texts");
  // clang-format on
  po::positional_options_description pos;
  pos.add("run", 1);
  po::variables_map vm;
  if (parse_or_help(args, desc, pos, vm)) return 0;
  if (!vm.count("run")) throw Error("exmy inspect needs a run file (exmy inspect --help)");
  if (vm["top"].as<int64_t>() < 0) throw Error("--top must be 0 or positive");
  const eval::RunSummary s = eval::read_run_summary(vm["run"].as<std::string>());
  eval::InspectOptions opt;
  opt.config = !vm.count("no-config");
  opt.top = vm["top"].as<int64_t>();
  print_run_summary(stdout, s, opt);
  if (vm.count("csv")) {
    io::OutputSet outs;
    outs.add_text(vm["csv"].as<std::string>(), eval::summary_csv(s));
    outs.commit();
    std::printf("\ntables written to %s (%zu operand and %zu GEMM rows)\n", vm["csv"].as<std::string>().c_str(),
                s.operands.size(), s.gemms.size());
  }
  return 0;
}

}  // namespace exmy::cli

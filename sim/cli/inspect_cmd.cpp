// `exmy inspect`: a run file's configuration, loss summary and per-layer
// tables of the worst quantization statistics (sim/eval/inspect.hpp).
//
//   exmy inspect RUN.h5|RUN_DIR [--csv FILE] [--top N] [--no-config]
#include <boost/program_options.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "formats/error.hpp"
#include "sim/cli/cli_support.hpp"
#include "sim/cli/commands.hpp"
#include "sim/eval/inspect.hpp"
#include "sim/io/h5.hpp"
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
  eval::InspectOptions opt;
  opt.config = !vm.count("no-config");
  opt.top = vm["top"].as<int64_t>();
  const std::string run = vm["run"].as<std::string>();
  const std::string csv_path = vm.count("csv") ? vm["csv"].as<std::string>() : std::string();
  // The file is read, and the tables made, in a child process: libhdf5
  // crashes or loops forever on some corrupt files, which then become a
  // one-line error (io::h5::run_isolated; every dataset or attribute read
  // is progress, and 30 s without any ends the child). The answer: the printed text,
  // then (with --csv) the CSV and the line saying where it went.
  const std::string answer = io::h5::run_isolated(
      run,
      [&] {
        const eval::RunSummary s = eval::read_run_summary(run);
        char* buf = nullptr;
        size_t len = 0;
        std::FILE* mem = ::open_memstream(&buf, &len);
        if (!mem) throw Error("exmy inspect: out of memory");
        print_run_summary(mem, s, opt);
        std::fclose(mem);
        std::string out(buf, len);
        std::free(buf);
        if (!csv_path.empty()) {
          out.push_back('\0');
          out += eval::summary_csv(s);
          out.push_back('\0');
          out += "\ntables written to " + csv_path + " (" + std::to_string(s.operands.size()) + " operand and " +
                 std::to_string(s.gemms.size()) + " GEMM rows)\n";
        }
        return out;
      });
  const size_t text_end = answer.find('\0');
  std::fwrite(answer.data(), 1, std::min(text_end, answer.size()), stdout);
  if (!csv_path.empty() && text_end != std::string::npos) {
    const size_t csv_end = answer.find('\0', text_end + 1);
    io::OutputSet outs;
    outs.add_text(csv_path, answer.substr(text_end + 1, csv_end - text_end - 1));
    outs.commit();
    std::fputs(answer.c_str() + csv_end + 1, stdout);
  }
  return 0;
}

}  // namespace exmy::cli

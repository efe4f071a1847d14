// exmy: bit-exact emulation of ExMy number formats for low-precision
// training research. This file dispatches to the subcommands.
#include <boost/program_options/errors.hpp>
#include <cstdio>
#include <cstdlib>
#include <unistd.h>
#include <exception>
#include <string>

#include "formats/error.hpp"
#include "sim/cli/commands.hpp"
#include "sim/dist/comm.hpp"

namespace {

const char* kUsage =
    "exmy: bit-exact emulation of ExMy number formats for low-precision training research\n"
    "\n"
    "usage: exmy <command> [options]      (exmy <command> --help for its options)\n"
    "\n"
    "commands:\n"
    "  train      train a Nemotron-H model on the CPU (no arguments: the default job)\n"
    "  prepare-data  turn text files into token files for train\n"
    "  eval       validation loss of a checkpoint with the forward pass quantized by a recipe\n"
    "  inspect    configuration, loss summary and worst per-layer statistics of a run file\n"
    "  demo       quantize a built-in tensor with the UE5M3 recipe and compare formats\n"
    "  quantize   block-scaled quantization of a float32 tensor file (docs/numerics.md §7)\n"
    "  formats    table of format presets, or of the given format specs\n"
    "  bench      throughput benchmarks (bench quantize, bench train)\n"
    "  model-info parameters, FLOPs per token and training memory of a Nemotron-H model\n"
    "  sweep      run a grid of training runs (batch jobs) and summarize them\n"
    "  sweep-tensors  statistics of captured tensors under a grid of formats, without training\n";

// Ends the process after a failure that main reported: stdio flushed, then
// _Exit. Every object of the command has been destroyed by then (the error
// unwound to main), so what remains of the exit handlers is libhdf5's:
// after a failed write (a full disk) closing a file again at exit crashes
// inside libhdf5 1.10 (exit 139 instead of the error's status).
[[noreturn]] void exit_after_error(int status) {
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(status);
}

// The error line of a failed command, and the end of the process. In a job
// of several ranks (sim/dist/comm.hpp) the line names the rank and an error
// of one rank ends them all at once (the others would wait for it in their
// next collective); an error every rank raises together
// (dist::CollectiveError) is printed by rank 0 alone.
[[noreturn]] void fail(const std::string& prefix, const char* what, int status, bool collective = false) {
  if (!exmy::dist::in_multi_rank_job()) {
    std::fprintf(stderr, "%s%s\n", prefix.c_str(), what);
    exit_after_error(status);
  }
  exmy::dist::Comm& w = exmy::dist::world();
  if (collective) {
    if (w.rank() == 0) std::fprintf(stderr, "%s%s\n", prefix.c_str(), what);
    exit_after_error(status);
  }
  std::fprintf(stderr, "%srank %d: %s\n", prefix.c_str(), w.rank(), what);
  w.abort(status);  // ends every rank (a virtual [[noreturn]] is not one to the compiler)
  exit_after_error(status);
}

// Idle OpenMP threads sleep unless the user asked otherwise: libgomp's
// default lets a thread spin for a while after each parallel region, which
// on a shared or oversubscribed machine starves the threads doing the work
// (200 proxy-tiny steps took 32 s instead of 1.3 s). libgomp reads
// OMP_WAIT_POLICY once, when it is loaded, so exmy sets it and executes
// itself again; a value the user set is kept.
void default_to_passive_waiting(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY")) return;
  if (::setenv("OMP_WAIT_POLICY", "passive", 0) != 0) return;
  ::execv("/proc/self/exe", argv);  // returns only on failure: run on as we are
}

}  // namespace

int main(int argc, char** argv) {
  default_to_passive_waiting(argv);
  if (argc < 2) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  const std::string cmd = argv[1];
  exmy::cli::Args args(argv + 2, argv + argc);
  try {
    if (cmd == "--help" || cmd == "-h" || cmd == "help") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (cmd == "quantize") return exmy::cli::cmd_quantize(args);
    if (cmd == "formats") return exmy::cli::cmd_formats(args);
    if (cmd == "bench" && !args.empty() && args[0] == "train")
      return exmy::cli::cmd_bench_train(exmy::cli::Args(args.begin() + 1, args.end()));
    if (cmd == "bench") return exmy::cli::cmd_bench(args);
    if (cmd == "train") return exmy::cli::cmd_train(args);
    if (cmd == "prepare-data") return exmy::cli::cmd_prepare_data(args);
    if (cmd == "demo") return exmy::cli::cmd_demo(args);
    if (cmd == "model-info") return exmy::cli::cmd_model_info(args);
    if (cmd == "sweep") return exmy::cli::cmd_sweep(args);
    if (cmd == "sweep-tensors") return exmy::cli::cmd_sweep_tensors(args);
    if (cmd == "eval") return exmy::cli::cmd_eval(args);
    if (cmd == "inspect") return exmy::cli::cmd_inspect(args);
    std::fprintf(stderr, "exmy: error: unknown command '%s' (expected train, prepare-data, eval, inspect, demo, quantize, formats, bench, model-info, sweep or sweep-tensors; see exmy --help)\n",
                 cmd.c_str());
    return 2;
  } catch (const exmy::dist::CollectiveError& e) {
    fail("exmy: error: ", e.what(), 1, /*collective=*/true);
  } catch (const exmy::Error& e) {
    fail("exmy: error: ", e.what(), 1);
  } catch (const boost::program_options::error& e) {
    fail("exmy " + cmd + ": error: ", e.what(), 2);
  } catch (const std::bad_alloc&) {
    fail("exmy: error: ", "out of memory", 1);
  } catch (const std::exception& e) {
    fail("exmy: error: ", e.what(), 1);
  }
}

// A stand-alone `exmy bench quantize`, for measuring on another machine:
// tools/gpu-check.sh --build links it statically (formats library, Boost
// program_options, libgomp), for x86-64-v3 (AVX2+FMA), so that it runs on a
// host with none of exmy's shared libraries installed.
#include <boost/program_options.hpp>
#include <cstdio>
#include <exception>

#include "formats/error.hpp"
#include "sim/cli/commands.hpp"

int main(int argc, char** argv) {
  try {
    exmy::cli::Args args(argv + 1, argv + argc);
    return exmy::cli::cmd_bench(args);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "exmy-bench: %s\n", e.what());
    return 1;
  }
}

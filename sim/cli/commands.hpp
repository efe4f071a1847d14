// The `exmy` subcommands. Each takes the arguments after its name and returns
// the process exit status; user errors are thrown as exmy::Error and printed
// by main() as one line.
#pragma once

#include <string>
#include <vector>

namespace exmy::cli {

using Args = std::vector<std::string>;

int cmd_quantize(const Args& args);
int cmd_formats(const Args& args);
int cmd_bench(const Args& args);
int cmd_demo(const Args& args);
int cmd_model_info(const Args& args);
int cmd_train(const Args& args);
int cmd_prepare_data(const Args& args);
int cmd_bench_train(const Args& args);
int cmd_sweep(const Args& args);
int cmd_sweep_tensors(const Args& args);
int cmd_eval(const Args& args);
int cmd_inspect(const Args& args);

}  // namespace exmy::cli

// `exmy train`: train a Nemotron-H model (sim/train/trainer.hpp) on the CPU
// or, for the fp32 and bf16 policies, on a CUDA device (train.device).
//
//   exmy train                                   the default job: experiments/proxy-default.ini
//   exmy train --config FILE --out DIR [--steps N] [--set key=value ...]
//   exmy train --resume DIR [--steps N] [--set key=value ...]
//   exmy train ... --recipe NAME|FILE [--set recipe.SECTION.KNOB=VALUE] [--capture-step N]
//   exmy train --keys                            every configuration key with its default
//   exmy train --recipes                         the shipped recipes
//
// SIGINT/SIGTERM: the step in progress finishes, a checkpoint is written and
// exmy exits with 128 + the signal number; a second signal kills at once.
#include <boost/program_options.hpp>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <iostream>

#include "formats/error.hpp"
#include "models/config.hpp"
#include "sim/cli/cli_support.hpp"
#include "sim/cli/commands.hpp"
#include "sim/dist/comm.hpp"
#include "sim/eval/quant_eval.hpp"
#include "sim/quant/recipe.hpp"
#include "sim/train/run_config.hpp"
#include "sim/train/trainer.hpp"

#ifndef EXMY_VERSION
#define EXMY_VERSION "unknown"
#endif
namespace exmy {
const char* build_git_commit();  // generated at build time (cmake/git_commit.cmake)
}  // namespace exmy
namespace po = boost::program_options;
namespace fs = std::filesystem;

namespace exmy::cli {
namespace {

// The default job's configuration: found from the working directory (the
// README runs exmy from the repository root), else from the source tree
// this binary was built from.
std::string default_config() {
  const std::string rel = "experiments/proxy-default.ini";
  const std::string path = find_in_checkout(rel);
  if (path.empty()) throw Error("cannot find " + rel + " (run exmy from the repository root, or give --config)");
  return path;
}

std::string recipe_search_text() {
  std::string s;
  for (const auto& d : sim::quant::recipe_dirs()) s += (s.empty() ? "" : ", then ") + d;
  return s;
}

}  // namespace

int cmd_train(const Args& args) {
  po::options_description desc(
      "exmy train: train a Nemotron-H model on the CPU\n\n"
      "usage: exmy train [--config FILE] [--out DIR] [--steps N] [--recipe NAME|FILE] [--set section.key=value ...]\n"
      "       exmy train --resume DIR [--steps N] [--set section.key=value ...]\n"
      "With no arguments: the default job, experiments/proxy-default.ini into runs/proxy-default.\n"
      "Recipe knobs: --set recipe.SECTION.KNOB=VALUE (docs/recipes.md), e.g. recipe.keep_last_bf16=2.\n"
      "Recipe names (--recipe NAME) are looked up as NAME.ini in $EXMY_RECIPE_DIR (when set), then the working\n"
      "directory's experiments/recipes, then the source tree's; the first found wins. Here: " +
      recipe_search_text() + ".\n\noptions");
  // clang-format off
  desc.add_options()
    ("help,h", "show this help")
    ("config", po::value<std::string>(), "run configuration (INI); default experiments/proxy-default.ini")
    ("out", po::value<std::string>(), "run directory (run.h5, config.ini, checkpoints/); default runs/<config name>")
    ("resume", po::value<std::string>(), "continue the run in this directory from its newest checkpoint")
    ("steps", po::value<int64_t>(), "total optimizer steps of the run (overrides train.steps)")
    ("model", po::value<std::string>(), "model preset or HF config.json (sets model.name; exmy model-info lists them)")
    ("recipe", po::value<std::string>(), "quantization recipe, a name or an .ini file (sets train.recipe; default fp32)")
    ("device", po::value<std::string>(), kTrainingDeviceHelp)
    ("capture-step", po::value<int64_t>(), "write the exact operands of step N to the run file's /capture (sets train.capture_step)")
    ("set", po::value<std::vector<std::string>>()->composing(), "override a key: section.key=value (repeatable)")
    ("force", "replace a run already in --out")
    ("allow-changes", "with --resume: accept --set changes of keys that change what the run computes (model, data, optim, recipe, ...)")
    ("keys", "list every configuration key with its default and exit")
    ("recipes", "list the recipes of the recipe folders (see above) and exit");
  // clang-format on
  po::variables_map vm;
  if (parse_or_help(args, desc, {}, vm)) return 0;
  if (vm.count("keys")) {
    for (const auto& k : train::config_keys())
      std::printf("%-26s %-12s %s\n", k.name.c_str(), k.default_value.empty() ? "(empty)" : k.default_value.c_str(),
                  k.help.c_str());
    std::printf("%-26s %-12s %s\n", "model.FIELD", "(preset)", "any Nemotron-H field (exmy model-info --fields)");
    std::printf("%-26s %-12s %s\n", "recipe.SECTION.KNOB", "(recipe)", "any recipe knob (docs/recipes.md), applied in order");
    return 0;
  }
  if (vm.count("recipes")) {
    for (const auto& name : sim::quant::recipe_names())
      std::printf("%-20s %s\n", name.c_str(), sim::quant::load_recipe(name).description.c_str());
    return 0;
  }
  // --recipe and --capture-step are train.* keys; they come before --set,
  // so a --set of the same key wins.
  std::vector<std::string> sets;
  if (vm.count("model")) sets.push_back("model.name=" + vm["model"].as<std::string>());
  if (vm.count("recipe")) sets.push_back("train.recipe=" + vm["recipe"].as<std::string>());
  if (const std::string d = training_device_option(vm, "train", true); !d.empty()) sets.push_back("train.device=" + d);
  if (vm.count("capture-step")) {
    if (vm["capture-step"].as<int64_t>() <= 0) throw Error("--capture-step must be positive");
    sets.push_back("train.capture_step=" + std::to_string(vm["capture-step"].as<int64_t>()));
  }
  if (vm.count("set"))
    for (const auto& s : vm["set"].as<std::vector<std::string>>()) sets.push_back(s);
  std::optional<int64_t> steps;
  if (vm.count("steps")) {
    steps = vm["steps"].as<int64_t>();
    if (*steps <= 0) throw Error("--steps must be positive");
  }

  train::TrainHooks hooks;
  hooks.stop = &install_stop_signals();
  // The ranks of the job: this process alone, or every rank mpirun/srun
  // started (sim/dist/comm.hpp); only rank 0 prints progress.
  hooks.comm = &dist::world();
  g_unblock_output_on_stop = hooks.comm->size() > 1;
  const train::BuildInfo build{EXMY_VERSION, build_git_commit()};

  train::TrainResult r;
  if (vm.count("allow-changes") && !vm.count("resume")) throw Error("--allow-changes goes with --resume");
  if (vm.count("resume")) {
    if (vm.count("config") || vm.count("out")) throw Error("--resume takes the configuration and directory of the run; drop --config/--out");
    // The in-training quantized evaluation (eval.*) comes from the run's
    // configuration with the overrides, as train_resume resolves it.
    const std::string dir = vm["resume"].as<std::string>();
    const train::RunConfig cfg =
        train::resume_config(dir, steps, sets, vm.count("allow-changes") > 0, hooks.comm->rank() == 0);
    sim::require_training_device(cfg.device, "train.device");
    if (auto spec = eval::training_eval_from_config(cfg))
      hooks.after_step = eval::make_training_eval_hook(cfg, std::move(*spec), hooks.after_step);
    r = train::train_resume(dir, cfg, hooks, build);
  } else {
    // The bare command is the README's default job, which may be rerun.
    const bool default_job = args.empty();
    const std::string config = vm.count("config") ? vm["config"].as<std::string>() : default_config();
    const std::string out =
        vm.count("out") ? vm["out"].as<std::string>() : "runs/" + fs::path(config).stem().string();
    std::vector<std::string> all = sets;
    if (steps) all.push_back("train.steps=" + std::to_string(*steps));
    const train::RunConfig cfg = train::load_run_config(config, all);
    sim::require_training_device(cfg.device, "train.device");
    if (auto spec = eval::training_eval_from_config(cfg))
      hooks.after_step = eval::make_training_eval_hook(cfg, std::move(*spec), hooks.after_step);
    r = train::train_new(cfg, out, hooks, build, default_job || vm.count("force") > 0);
  }
  switch (r.status) {
    case train::TrainStatus::completed: return 0;
    case train::TrainStatus::interrupted: return 128 + g_stop_signal.load();
    case train::TrainStatus::diverged: throw dist::CollectiveError(r.message);  // every rank stops at the same step
  }
  return 1;
}

}  // namespace exmy::cli

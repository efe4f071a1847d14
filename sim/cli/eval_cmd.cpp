// `exmy eval`: quantized-inference evaluation of a run's checkpoint
// (sim/eval/quant_eval.hpp, docs/eval.md).
//
//   exmy eval CHECKPOINT|RUN_DIR --recipe R --policy P [--policy P2 ...] [--batches N]
//             [--set key=value ...] [--name NAME] [--no-write] [--device cpu|cuda[:N]|cuda-emulated]
//
// The validation loss with the forward pass quantized by recipe R under the
// activation-scale policy P (current | replay:D | calibrated:N | checkpoint), one line per
// policy, and one row per policy appended to the run file's
// /eval/NAME/POLICY group (NAME: the recipe's name unless --name).
// The model runs on --device (default the CPU, whatever device the run
// trained on: the checkpoint is the same file, and the machine evaluating
// may have no GPU); on cuda-emulated the results are the CPU's bit for bit.
#include <boost/program_options.hpp>
#include <omp.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>

#include "formats/error.hpp"
#include "sim/cli/cli_support.hpp"
#include "sim/cli/commands.hpp"
#include "sim/eval/quant_eval.hpp"
#include "sim/io/h5.hpp"
#include "sim/io/run_file.hpp"
#include "sim/io/run_lock.hpp"
#include "sim/io/tensor_io.hpp"
#include "sim/quant/ini.hpp"
#include "sim/quant/recipe.hpp"
#include "sim/train/checkpoint.hpp"
#include "sim/train/run_config.hpp"

namespace po = boost::program_options;
namespace fs = std::filesystem;

namespace exmy::cli {
namespace {

struct Target {
  std::string checkpoint;
  std::string run_file;  // empty: none found
  std::string hf;         // an HF checkpoint instead: its directory or .safetensors file
  std::string hf_config;  // and the config.json beside it
};

// A run directory (its newest checkpoint and run.h5), a checkpoint file
// (and the run.h5 of the run directory it sits in, if any), or an HF
// checkpoint: a directory holding config.json and model.safetensors, or a
// .safetensors file with config.json beside it.
Target resolve_target(const std::string& path) {
  Target t;
  std::error_code ec;
  if (!fs::exists(path, ec))
    throw Error("'" + path + "' does not exist (expected a checkpoint, a run directory or an HF checkpoint)");
  const fs::path hf_dir = fs::is_directory(path, ec) ? fs::path(path) : fs::path(path).parent_path();
  const bool hf_file = path.ends_with(".safetensors");
  if (hf_file || (fs::is_directory(path, ec) && !fs::exists(fs::path(path) / "checkpoints", ec) &&
                  fs::exists(hf_dir / "config.json", ec))) {
    if (!fs::exists(hf_dir / "config.json", ec))
      throw Error("HF checkpoint '" + path + "' has no config.json beside it");
    if (!hf_file && !fs::exists(hf_dir / "model.safetensors", ec))
      throw Error("HF checkpoint directory '" + path + "' has no model.safetensors");
    t.hf = path;
    t.hf_config = (hf_dir / "config.json").string();
    return t;
  }
  fs::path run_dir;
  if (fs::is_directory(path, ec)) {
    const auto ckpts = train::list_checkpoints((fs::path(path) / "checkpoints").string());
    if (ckpts.empty()) throw Error("run directory '" + path + "' has no checkpoint (checkpoints/ is empty or absent)");
    t.checkpoint = ckpts.back();
    run_dir = path;
  } else {
    t.checkpoint = path;
    const fs::path parent = fs::path(path).parent_path();
    if (parent.filename() == "checkpoints") run_dir = parent.parent_path();
  }
  if (!run_dir.empty() && fs::exists(run_dir / "run.h5", ec)) t.run_file = (run_dir / "run.h5").string();
  return t;
}

// The trainer's validation loss at `step`, from the run file (NaN: none).
double trainer_val_loss(const std::string& run_file, int64_t step) {
  if (run_file.empty()) return NAN;
  try {
    const auto steps = io::read_run_column(run_file, "/eval/step");
    const auto loss = io::read_run_column(run_file, "/eval/loss");
    for (size_t i = 0; i < steps.size() && i < loss.size(); ++i)
      if (static_cast<int64_t>(steps[i]) == step) return loss[i];
  } catch (const Error&) {
  }
  return NAN;
}

po::options_description eval_options() {
  po::options_description desc(
      "exmy eval: validation loss of a checkpoint with the forward pass quantized by a recipe\n\n"
      "usage: exmy eval CHECKPOINT|RUN_DIR|HF_DIR --recipe R --policy P [--policy P2 ...] [--batches N]\n"
      "                 [--set key=value ...] [--name NAME] [--no-write] [--dump-logits FILE]\n\n"
      "An HF checkpoint (config.json + model.safetensors) brings the model; data, batch shape and\n"
      "seed are the run configuration's defaults and --set (e.g. --set data.path=...).\n\n"
      "Policies (the activation tensor scale of every quantized linear; weight amaxes are\n"
      "measured once at load and frozen):\n"
      "  current        each call's own amax\n"
      "  replay:D       sampled on evaluation batch 1, D+1, 2D+1, ... and held (cold start)\n"
      "  calibrated:N   the largest amax over the first N training windows of the run's sampler,\n"
      "                 run unquantized, then frozen\n"
      "  checkpoint     the training run's own held references (periodic, delayed) as the\n"
      "                 checkpoint holds them, weights' too, frozen; current roles measure\n"
      "Rows go to the run file's /eval/NAME/POLICY group (docs/eval.md).\n\noptions");
  // clang-format off
  desc.add_options()
    ("help,h", "show this help")
    ("target", po::value<std::string>(), "checkpoint file, run directory (its newest checkpoint), or HF checkpoint (directory with config.json and model.safetensors)")
    ("recipe", po::value<std::string>(), "recipe name (experiments/recipes/NAME.ini) or file")
    ("config", po::value<std::string>(), "with an HF checkpoint: run configuration giving data, batch shape and seed (its [model] is ignored)")
    ("policy", po::value<std::vector<std::string>>()->composing(), "activation-scale policy (repeatable); default current")
    ("batches", po::value<int64_t>()->default_value(0), "validation batches of train.batch_size sequences (0: the run's train.eval_batches)")
    ("set", po::value<std::vector<std::string>>()->composing(),
     "override: recipe.SECTION.KNOB=VALUE for the recipe, section.key=value for the run configuration (repeatable)")
    ("device", po::value<std::string>(), "cpu, cuda, cuda:N or cuda-emulated: where the model runs (default cpu, also for a run trained on a device)")
    ("name", po::value<std::string>(), "name of the /eval subgroup (default: the recipe's name)")
    ("no-write", "print only; append nothing to the run file")
    ("dump-logits", po::value<std::string>(), "write the logits of the evaluated batches to this file (.npy, file.h5:/dset or raw float32; rows = batches x batch_size x seq_len, columns = vocabulary; one --policy)");
  // clang-format on
  return desc;
}

// The run configuration to evaluate under: the checkpoint's, or for an HF
// checkpoint the defaults (or --config's sections but [model]) with its
// config.json as the model; then --set. The recipe.* keys of --set go to
// `recipe_sets`.
// `device`: --device as training_device_option checked it (empty: absent).
train::RunConfig eval_config(const po::variables_map& vm, const Target& target, const std::string& device,
                             std::vector<std::string>& recipe_sets) {
  std::vector<std::string> run_sets;
  if (vm.count("set"))
    for (const auto& s : vm["set"].as<std::vector<std::string>>()) (s.starts_with("recipe.") ? recipe_sets : run_sets).push_back(s);
  if (!device.empty()) run_sets.push_back("train.device=" + device);
  // An HF checkpoint brings its architecture, not a run: the run keys
  // (data, batch shape, seed) are the defaults and --set.
  // --config gives them from a run configuration (its [model] section is
  // ignored: the model is the checkpoint's).
  std::string run_text, run_origin = target.hf;
  if (!target.hf.empty()) {
    run_sets.insert(run_sets.begin(), "model.name=" + target.hf_config);
    if (vm.count("config")) {
      run_origin = vm["config"].as<std::string>();
      const auto ini = sim::quant::read_ini(run_origin);
      std::string section;
      for (const auto& e : ini.entries) {
        if (e.section == "model") continue;
        if (e.section != section) run_text += "[" + (section = e.section) + "]\n";
        run_text += e.key + " = " + e.value + "\n";
      }
    }
  } else if (vm.count("config")) {
    throw Error("--config goes with an HF checkpoint (a run's checkpoint holds its configuration)");
  }
  train::RunConfig cfg = target.hf.empty()
                            ? train::parse_run_config(train::checkpoint_config(target.checkpoint), target.checkpoint, run_sets)
                            : train::parse_run_config(run_text, run_origin, run_sets);
  // The model runs on --device; without it on the CPU, also for a run
  // trained on a device (its checkpoint is the same file, and the machine
  // evaluating may have no GPU). train.device from --set is the run's
  // record, not a choice: --device chooses.
  if (device.empty()) cfg.device = sim::Device{};
  return cfg;
}

// What every policy of one `exmy eval` shares.
struct EvalJob {
  const train::RunConfig& cfg;
  const sim::quant::Recipe& recipe;
  const Target& target;
  const std::string& name;   // the /eval subgroup
  const std::string& shown;  // the checkpoint as the header names it
  const std::string& dump;   // --dump-logits, or empty
  const eval::EvalData& data;
  const eval::EvalBatches& vb;
};

// Loads the model, calibrates it under calibrated:N (`calibration`: its
// windows), evaluates under policy p and prints its line (the header line
// too when `first`).
eval::EvalResult run_policy(const EvalJob& e, const eval::ActPolicy& p, const std::vector<int32_t>& calibration,
                            bool first) {
  eval::QuantEvalModel m(e.cfg, e.recipe, p);
  eval::EvalResult r;
  if (e.target.hf.empty()) {
    r.step = m.load_checkpoint(e.target.checkpoint);
  } else {
    m.load_hf(e.target.hf);
    r.step = 0;
  }
  r.name = e.name;
  r.policy = p;
  if (first) {
    std::printf("exmy eval: %s (step %lld), model %s, recipe %s (%lld linears quantized), %lld batches x %lld x %lld "
                "tokens, %d threads, %s\n",
                e.shown.c_str(), static_cast<long long>(r.step), e.cfg.model_name.c_str(), e.recipe.name.c_str(),
                static_cast<long long>(m.quantized_linears()), static_cast<long long>(e.vb.batches),
                static_cast<long long>(e.cfg.batch_size), static_cast<long long>(e.cfg.seq_len), omp_get_max_threads(),
                sim::device_name(e.cfg.device).c_str());
    if (m.scaled_activations() < m.quantized_linears())
      std::printf("  the policy acts on %lld of them (the others' activations have no tensor scale in this recipe)\n",
                  static_cast<long long>(m.scaled_activations()));
  }
  if (p.kind == eval::ActPolicy::Kind::calibrated) {
    m.calibrate(calibration, e.cfg.seq_len, e.cfg.batch_size);
    r.calibration_sequences = p.n;
  }
  std::vector<float> logits;
  const auto res = m.evaluate(e.vb, e.dump.empty() ? nullptr : &logits);
  if (!e.dump.empty()) {
    io::OutputSet out;
    const int64_t V = e.cfg.model.vocab_size;
    out.add_tensor(e.dump, logits.data(), static_cast<int64_t>(logits.size()) / V, V);
    out.commit();
  }
  r.loss = res.loss;
  r.batches = e.vb.batches;
  r.tokens = res.tokens;
  std::printf("  %-16s val loss %.6f nats/token (%.4f bits/token)", eval::act_policy_name(p).c_str(), r.loss,
              r.loss / std::log(2.0));
  const double base = trainer_val_loss(e.target.run_file, r.step);
  if (std::isfinite(base) && e.vb.batches == std::min(e.cfg.eval_batches, e.data.val_windows / e.cfg.batch_size))
    std::printf(" | training's validation loss %.6f (%+.6f)", base, r.loss - base);
  std::printf("\n");
  return r;
}

}  // namespace

int cmd_eval(const Args& args) {
  po::options_description desc = eval_options();
  po::positional_options_description pos;
  pos.add("target", 1);
  po::variables_map vm;
  if (parse_or_help(args, desc, pos, vm)) return 0;
  const std::string device = training_device_option(vm, "eval", true);  // one line before any work
  if (!vm.count("target")) throw Error("exmy eval needs a checkpoint or a run directory (exmy eval --help)");
  if (!vm.count("recipe")) throw Error("exmy eval needs --recipe NAME|FILE (the fp32 recipe gives the unquantized loss)");
  Target target = resolve_target(vm["target"].as<std::string>());
  // It appends to the run file: one writer per run directory (a live
  // training run holds the lock), taken before the checkpoint is read (a
  // live run rotates its checkpoints). --no-write only reads a checkpoint,
  // which is written atomically, and takes no lock.
  const bool write = !vm.count("no-write") && !target.run_file.empty() && target.hf.empty();
  io::RunLock lock;
  if (write) {
    lock = io::RunLock(fs::path(target.run_file).parent_path(), "exmy eval");
    target = resolve_target(vm["target"].as<std::string>());
  }

  std::vector<std::string> recipe_sets;
  const train::RunConfig cfg = eval_config(vm, target, device, recipe_sets);
  const std::string shown = target.hf.empty() ? target.checkpoint : target.hf;
  sim::quant::Recipe recipe = sim::quant::load_recipe(vm["recipe"].as<std::string>());
  for (const auto& s : recipe_sets) sim::quant::apply_recipe_override(recipe, s);
  recipe = eval::run_recipe(cfg, std::move(recipe));
  std::vector<eval::ActPolicy> policies;
  if (vm.count("policy"))
    for (const auto& p : vm["policy"].as<std::vector<std::string>>()) policies.push_back(eval::parse_act_policy(p));
  if (policies.empty()) policies.push_back(eval::ActPolicy{});
  const std::string dump = vm.count("dump-logits") ? vm["dump-logits"].as<std::string>() : "";
  if (!dump.empty()) {
    if (policies.size() != 1) throw Error("--dump-logits takes one --policy (got " + std::to_string(policies.size()) + ")");
    io::check_output_path(dump);  // a bad path fails before the evaluation
  }
  const std::string name = vm.count("name") ? vm["name"].as<std::string>() : recipe.name;
  for (const auto& p : policies) eval::eval_group(name, p);  // checks the name
  const std::string recipe_text = sim::quant::recipe_to_ini(recipe);

  // Rows of another recipe under the same name would be mixed up: refuse.
  if (write) {
    const auto prev = io::read_run_attribute(target.run_file, eval::eval_recipe_attribute(name));
    if (prev && *prev != recipe_text)
      throw Error("run file '" + target.run_file + "' already holds /eval/" + name +
                  " rows of a different recipe text (give --name to file these apart)");
  }

  if (cfg.threads > 0) omp_set_num_threads(cfg.threads);
  const eval::EvalData data = eval::open_eval_data(cfg);
  const eval::EvalBatches vb = eval::validation_batches(cfg, data, vm["batches"].as<int64_t>());

  // Everything that can fail on the user's input fails here, before the
  // first line is printed (one-line errors): the calibration windows of each
  // calibrated:N; the recipe against the model and the checkpoint (the
  // first model below, before its header line).
  std::vector<std::vector<int32_t>> calibration(policies.size());
  for (size_t i = 0; i < policies.size(); ++i)
    if (policies[i].kind == eval::ActPolicy::Kind::calibrated)
      calibration[i] = eval::calibration_sequences(cfg, data, policies[i].n);

  // The run file is opened before evaluating: a file a live run holds
  // fails here, not after the results are printed.
  std::unique_ptr<io::RunFile> run;
  if (write) {
    try {
      run = io::RunFile::open_append(target.run_file);
    } catch (const Error& e) {
      throw Error(std::string(e.what()) + " (is a training run writing it?)");
    }
  }

  const EvalJob job{cfg, recipe, target, name, shown, dump, data, vb};
  std::vector<eval::EvalResult> results;
  for (size_t i = 0; i < policies.size(); ++i)
    results.push_back(run_policy(job, policies[i], calibration[i], results.empty()));

  if (!dump.empty())
    std::printf("logits of %lld batches x %lld x %lld tokens (vocabulary %lld, float32) written to %s\n",
                static_cast<long long>(vb.batches), static_cast<long long>(cfg.batch_size),
                static_cast<long long>(cfg.seq_len), static_cast<long long>(cfg.model.vocab_size), dump.c_str());
  if (!write) {
    std::printf(!target.hf.empty()           ? "an HF checkpoint has no run file: nothing written\n"
                : target.run_file.empty() ? "no run file next to the checkpoint: nothing written\n"
                                          : "--no-write: nothing written\n");
    return 0;
  }
  run->set_attribute(eval::eval_recipe_attribute(name), recipe_text);
  for (const auto& r : results) eval::append_eval_row(*run, r);
  run->close();
  std::printf("appended %zu row%s to %s:/eval/%s/\n", results.size(), results.size() == 1 ? "" : "s",
              target.run_file.c_str(), name.c_str());
  return 0;
}

}  // namespace exmy::cli

#include "sim/train/run_config.hpp"

#include <charconv>
#include <cmath>
#include <fstream>
#include <set>
#include <sstream>

#include "formats/error.hpp"
#include "formats/vocab.hpp"
#include "sim/dist/comm.hpp"
#include "sim/parallel.hpp"
#include "sim/linear.hpp"
#include "sim/quant/ini.hpp"
#include "sim/quant/fp32_gemm.hpp"


namespace exmy::train {
namespace {

// train.comm's help: its choices' rows.
std::string comm_help() {
  std::string h = "multi-rank jobs on devices: how the ranks exchange gradients, weight shards and moments:";
  for (const auto& r : dist::comm_choices()) h += std::string(" ") + r.name + " (" + r.help + ");";
  h.back() = '.';
  return h;
}

// The one table of keys. Order is the order of text().
const std::vector<ConfigKey> kKeys = {
    {"model.name", "proxy-tiny", "model preset (" + models::preset_list() + ") or a config.json"},
    {"train.steps", "200", "optimizer steps of the run (the LR schedule's length)"},
    {"train.batch_size", "8", "sequences per micro-batch"},
    {"train.seq_len", "128", "tokens per sequence"},
    {"train.grad_accum", "1", "micro-batches accumulated per optimizer step"},
    {"train.precision", "fp32", "fp32 or bf16: bf16 rounds activations and every linear the recipe leaves unquantized to BF16"},
    {"train.working_weights", "fp32", "fp32 or bf16: the weights the model reads (bf16: the FP32 master weights, kept by the optimizer with the AdamW moments, rounded to BF16 after every update; every layer and recipe reads the rounded weights; checkpoints hold the master)"},
    {"train.recipe", "fp32", "quantization recipe: a name (exmy train --recipes lists them) or an .ini file; recipe.SECTION.KNOB=VALUE overrides a knob"},
    {"train.seed", "1", "seed of the weight initialization and of the data order"},
    {"train.threads", "0", "OpenMP threads (0: OpenMP's default); results do not depend on it"},
    {"train.device", "cpu", "cpu, cuda, cuda:N or cuda-emulated: where the model trains (on a device the whole step runs there, quantized recipes included; cuda-emulated runs the device's code on the host, slowly, for checks)"},
    {"train.log_interval", "10", "steps between progress lines and /train rows"},
    {"train.eval_interval", "100", "steps between validation losses (0: only at the end)"},
    {"train.eval_batches", "4", "validation micro-batches per evaluation"},
    {"train.checkpoint_interval", "0", "steps between checkpoints (0: only at the end and on interruption)"},
    {"train.keep_checkpoints", "2", "checkpoints kept in DIR/checkpoints (the newest); 0 writes none (a measuring run that will not be resumed)"},
    {"train.stats_interval", "1", "steps between statistics of quantized operands and GEMMs (/quant, /gemm, /hist; step 1 and the last too; 0: never)"},
    {"train.capture_step", "0", "step whose quantized operands are written exactly to /capture (0: none)"},
    {"train.gemm_stats_rows", "128", "GEMM statistics compare min(this, ceil(M/gemm_stats_sample)) output rows with the unquantized GEMM (0: all)"},
    {"train.gemm_stats_sample", "64", "GEMM statistics compare one output row in this many (at most gemm_stats_rows)"},
    {"train.fp32_gemm", "auto", "how a recipe's fp32 GEMM output model runs: sgemm (FP32 GEMMs of the decoded operands: the CPU's bits), bf16 (where bfloat16 holds every payload x block scale of both operands' formats, as E2M1 or E4M3 with UE4M3 or UE5M3 scales do: a BF16 GEMM of those with FP32 accumulation and the tensor scales applied to its result, as tensor cores run it; within a stated budget of sgemm, docs/recipes.md section 6) or auto (bf16 on a CUDA device, sgemm on the CPU and cuda-emulated)"},
    {"train.recompute", "none", "activation recompute: none, or blocks (each block's forward runs again in backward: the same bits, about a block's activations kept instead of every block's)"},
    {"train.offload", "none", "none, or optimizer (on a device: the FP32 master weights and AdamW moments in pinned host memory, updated there, the device keeping the working weights and gradients; the same bits)"},
    {"train.shard_optimizer", "on", "multi-rank jobs: each rank keeps the AdamW moments of its share of the parameters and the ranks gather the updated weights (ZeRO-1; off: every rank keeps them all); the same bits either way"},
    {"train.comm", "auto", comm_help()},
    {"train.cold_restart_references", "false", "on --resume, start tensor references empty instead of restoring them (the reference implementation)"},
    {"train.init_from", "", "HF checkpoint (directory or .safetensors) whose weights start a new run"},
    {"train.export_hf", "none", "at the end, write DIR/hf/ as an HF checkpoint: none, fp32 or bf16"},
    {"optim.lr", "3e-3", "peak learning rate"},
    {"optim.schedule", "cosine", "LR schedule: constant, cosine or wsd (warmup-stable-decay)"},
    {"optim.warmup_steps", "0", "linear warmup steps"},
    {"optim.min_lr_ratio", "0.1", "cosine: final LR as a fraction of the peak"},
    {"optim.decay_fraction", "0.15", "wsd: fraction of the steps spent in the linear decay"},
    {"optim.final_lr_ratio", "0.01", "wsd: LR at the last step as a fraction of the peak"},
    {"optim.beta1", "0.9", "AdamW beta1"},
    {"optim.beta2", "0.95", "AdamW beta2"},
    {"optim.eps", "1e-8", "AdamW epsilon"},
    {"optim.weight_decay", "0.1", "AdamW decoupled weight decay (not on norms, biases, A_log, D, dt_bias)"},
    {"optim.grad_clip", "1.0", "global gradient-norm clip (0: off)"},
    {"data.path", "synthetic", "token file, Megatron prefix, prepare-data directory, or 'synthetic'"},
    {"data.format", "auto", "auto, flat or megatron"},
    {"data.prepare_from", "", "text file or directory turned into data.path (byte tokenizer) when it does not exist"},
    {"data.val_fraction", "0.05", "fraction of the tokens (at the end) held out for validation"},
    {"data.synthetic_tokens", "262144", "synthetic: tokens generated"},
    {"data.synthetic_branching", "4", "synthetic: successors per state of the Markov chain"},
    {"data.synthetic_seed", "7", "synthetic: seed of the chain and of its sample"},
    {"eval.recipes", "", "recipes whose quantized forward is evaluated at every validation step, comma-separated names or files (empty: none; rows in /eval/RECIPE/POLICY, docs/eval.md)"},
    {"eval.policies", "current", "activation-scale policies of eval.recipes, comma-separated: current, replay:D, calibrated:N (checkpoint: exmy eval only)"},
    {"eval.batches", "0", "validation batches of each quantized evaluation (0: train.eval_batches)"},
};

const std::string kModelPrefix = "model.";
const std::string kRecipePrefix = "recipe.";

bool is_model_field(const std::string& key) {
  if (!key.starts_with(kModelPrefix)) return false;
  const std::string f = key.substr(kModelPrefix.size());
  for (const auto& n : models::field_names())
    if (n == f) return true;
  return false;
}

bool is_known(const std::string& key) {
  for (const auto& k : kKeys)
    if (k.name == key) return true;
  return is_model_field(key);
}

std::string known_in_section(const std::string& key) {
  const std::string section = key.substr(0, key.find('.') + 1);
  std::string s;
  for (const auto& k : kKeys)
    if (k.name.starts_with(section)) s += (s.empty() ? "" : ", ") + k.name;
  if (section == kModelPrefix) s += ", model.FIELD for any field of exmy model-info --fields";
  if (s.empty()) {
    std::set<std::string> sections = {"recipe"};
    for (const auto& k : kKeys) sections.insert(k.name.substr(0, k.name.find('.')));
    for (const auto& x : sections) s += (s.empty() ? "sections: " : ", ") + x;
  }
  return s;
}

[[noreturn]] void unknown_key(const std::string& where, const std::string& key) {
  throw Error(where + "unknown configuration key '" + key + "' (known: " + known_in_section(key) + ")");
}

[[noreturn]] void bad(const std::string& key, const std::string& v, const char* expected) {
  throw Error(key + ": bad value '" + v + "' (expected " + expected + ")");
}

int64_t as_int(const std::map<std::string, std::string>& m, const std::string& key, int64_t lo) {
  const std::string& v = m.at(key);
  int64_t x = 0;
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
  if (ec != std::errc() || p != v.data() + v.size()) bad(key, v, "an integer");
  if (x < lo) throw Error(key + " = " + v + " must be at least " + std::to_string(lo));
  return x;
}

uint64_t as_uint(const std::map<std::string, std::string>& m, const std::string& key) {
  const std::string& v = m.at(key);
  uint64_t x = 0;
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
  if (ec != std::errc() || p != v.data() + v.size()) bad(key, v, "a non-negative integer");
  return x;
}

bool as_bool(const std::map<std::string, std::string>& m, const std::string& key) {
  // The one boolean spelling of formats/vocab.hpp (true/false, on/off).
  const std::string& v = m.at(key);
  try {
    return parse_bool_word(v);
  } catch (const Error&) {
    bad(key, v, "true or false");
  }
}

double as_double(const std::map<std::string, std::string>& m, const std::string& key) {
  const std::string& v = m.at(key);
  char* end = nullptr;
  const double x = std::strtod(v.c_str(), &end);
  if (v.empty() || end != v.c_str() + v.size() || !std::isfinite(x)) bad(key, v, "a finite number");
  return x;
}

std::string trim(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t\r\n"), b = s.find_last_not_of(" \t\r\n");
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

}  // namespace

const std::vector<ConfigKey>& config_keys() { return kKeys; }

namespace {

// The keys of a configuration after the file and --set: the run keys
// (defaults filled in), the model fields and the recipe overrides, each in
// the order given.
struct Settings {
  std::map<std::string, std::string> v;
  std::vector<std::pair<std::string, std::string>> model_fields;
  std::vector<std::pair<std::string, std::string>> recipe_sets;  // file, then --set
};

Settings gather_settings(const std::string& ini_text, const std::string& origin,
                         const std::vector<std::string>& overrides) {
  Settings st;
  auto& v = st.v;
  auto& model_fields = st.model_fields;
  auto& recipe_sets = st.recipe_sets;
  for (const auto& k : kKeys) v[k.name] = k.default_value;
  auto set = [&](const std::string& key, const std::string& value) {
    if (key.starts_with(kRecipePrefix)) {
      recipe_sets.emplace_back(key, value);
    } else if (is_model_field(key)) {
      std::erase_if(model_fields, [&](const auto& kv) { return kv.first == key; });
      model_fields.emplace_back(key, value);
    } else {
      v[key] = value;
    }
  };

  // The INI file in exmy's one dialect (sim/quant/ini.hpp): every key must
  // be known, none may be given twice, except in the [recipe] section,
  // whose overrides apply in order.
  const sim::quant::IniFile ini = sim::quant::parse_ini(ini_text, origin, "recipe");
  for (const auto& e : ini.entries) {
    const std::string where = origin + ":" + std::to_string(e.line) + ": ";
    if (e.section.empty()) throw Error(where + "key '" + e.key + "' before the first [section]");
    const std::string key = e.section + "." + e.key;
    if (!is_known(key) && !key.starts_with(kRecipePrefix)) unknown_key(where, key);
    set(key, e.value);
  }

  for (const auto& s : overrides) {
    const size_t eq = s.find('=');
    if (eq == std::string::npos) throw Error("--set '" + s + "': expected section.key=value");
    const std::string key = trim(s.substr(0, eq));
    if (!is_known(key) && !key.starts_with(kRecipePrefix)) unknown_key("--set: ", key);
    set(key, trim(s.substr(eq + 1)));
  }
  return st;
}

// [model]: the preset or config.json, then the fields given.
void read_model(RunConfig& c, std::map<std::string, std::string>& v,
                const std::vector<std::pair<std::string, std::string>>& model_fields) {
  c.model_name = v["model.name"];
  // A resolved configuration (text()) lists every field; it then does not
  // need the preset or config.json it came from (which may have moved).
  if (model_fields.size() == models::field_names().size()) {
    c.model = models::NemotronHConfig{};
    c.model.name = c.model_name;
  } else {
    c.model = models::resolve_config(c.model_name);
  }
  // The pattern first: it also sets num_hidden_layers, which an explicit
  // value may then contradict (and validate() reports).
  for (int pass = 0; pass < 2; ++pass)
    for (const auto& [key, value] : model_fields) {
      const bool pattern = key == "model.hybrid_override_pattern";
      if ((pass == 0) == pattern) models::apply_override(c.model, key, value);
    }
  models::validate(c.model);
}

// [train], with the recipe and its overrides.
void read_train(RunConfig& c, std::map<std::string, std::string>& v,
                const std::vector<std::pair<std::string, std::string>>& recipe_sets) {
  c.steps = as_int(v, "train.steps", 1);
  c.batch_size = as_int(v, "train.batch_size", 1);
  c.seq_len = as_int(v, "train.seq_len", 1);
  c.grad_accum = as_int(v, "train.grad_accum", 1);
  c.precision = v["train.precision"];
  if (c.precision != "fp32" && c.precision != "bf16") bad("train.precision", c.precision, "fp32 or bf16");
  c.working_weights = sim::parse_working_weights(v["train.working_weights"]);
  // The recipe: loaded, its overrides applied in order, validated; each
  // step names the key at fault.
  c.recipe_name = v["train.recipe"];
  if (c.recipe_name.empty()) bad("train.recipe", "", "a recipe name or an .ini file");
  try {
    c.recipe = sim::quant::load_recipe(c.recipe_name);
  } catch (const Error& e) {
    throw Error(std::string("train.recipe: ") + e.what());
  }
  for (const auto& [key, value] : recipe_sets) sim::quant::apply_recipe_override(c.recipe, key, value);
  c.recipe_sets = recipe_sets;
  if (c.precision == "bf16" && c.recipe.unquantized != "bf16")
    sim::quant::apply_recipe_override(c.recipe, "recipe.unquantized", "bf16");
  c.seed = as_uint(v, "train.seed");
  c.threads = sim::checked_threads(as_int(v, "train.threads", 0), "train.threads");
  c.device = sim::parse_device(v["train.device"], "train.device");
  c.log_interval = as_int(v, "train.log_interval", 1);
  c.eval_interval = as_int(v, "train.eval_interval", 0);
  c.eval_batches = as_int(v, "train.eval_batches", 1);
  c.checkpoint_interval = as_int(v, "train.checkpoint_interval", 0);
  c.keep_checkpoints = as_int(v, "train.keep_checkpoints", 0);
  c.stats_interval = as_int(v, "train.stats_interval", 0);
  c.capture_step = as_int(v, "train.capture_step", 0);
  c.gemm_stats_rows = as_int(v, "train.gemm_stats_rows", 0);
  c.gemm_stats_sample = as_int(v, "train.gemm_stats_sample", 1);
  c.fp32_gemm = v["train.fp32_gemm"];
  sim::quant::parse_fp32_gemm(c.fp32_gemm, false);  // (validates; the device resolves auto)
  c.cold_restart_references = as_bool(v, "train.cold_restart_references");
  c.shard_optimizer = as_bool(v, "train.shard_optimizer");
  c.comm = dist::parse_comm_choice(v["train.comm"], "train.comm");
  if (c.comm == dist::CommChoice::nccl && c.device.is_cpu())
    throw Error("train.comm = nccl moves device buffers, but train.device = cpu (NCCL needs train.device = cuda, "
                "cuda:N or cuda-emulated; CPU ranks use train.comm = auto or mpi)");
  c.init_from = v["train.init_from"];
  c.recompute = v["train.recompute"];
  if (c.recompute != "none" && c.recompute != "blocks") bad("train.recompute", c.recompute, "none or blocks");
  c.offload = v["train.offload"];
  if (c.offload != "none" && c.offload != "optimizer") bad("train.offload", c.offload, "none or optimizer");
  if (c.offload == "optimizer" && c.device.is_cpu())
    throw Error("train.offload = optimizer moves the optimizer state from a device's memory to the host's; with "
                "train.device = cpu it is there already (set train.offload = none or a device)");
  c.export_hf = v["train.export_hf"];
  if (c.export_hf != "none" && c.export_hf != "fp32" && c.export_hf != "bf16")
    bad("train.export_hf", c.export_hf, "none, fp32 or bf16");
}

// [optim]: the schedule and AdamW.
void read_optim(RunConfig& c, std::map<std::string, std::string>& v) {
  c.schedule.kind = sim::parse_lr_kind(v["optim.schedule"]);
  c.schedule.peak = as_double(v, "optim.lr");
  c.schedule.warmup = as_int(v, "optim.warmup_steps", 0);
  c.schedule.total = c.steps;
  c.schedule.min_ratio = as_double(v, "optim.min_lr_ratio");
  c.schedule.decay_fraction = as_double(v, "optim.decay_fraction");
  c.schedule.final_ratio = as_double(v, "optim.final_lr_ratio");
  c.schedule.validate();
  c.adamw.beta1 = as_double(v, "optim.beta1");
  c.adamw.beta2 = as_double(v, "optim.beta2");
  c.adamw.eps = as_double(v, "optim.eps");
  c.adamw.weight_decay = as_double(v, "optim.weight_decay");
  for (const char* k : {"optim.beta1", "optim.beta2"})
    if (!(as_double(v, k) >= 0 && as_double(v, k) < 1)) throw Error(std::string(k) + " must be in [0, 1)");
  if (!(c.adamw.eps > 0)) throw Error("optim.eps must be positive");
  if (!(c.adamw.weight_decay >= 0)) throw Error("optim.weight_decay must be >= 0");
  c.grad_clip = as_double(v, "optim.grad_clip");
  if (!(c.grad_clip >= 0)) throw Error("optim.grad_clip must be >= 0 (0 switches clipping off)");
}

// [data].
void read_data(RunConfig& c, std::map<std::string, std::string>& v) {
  c.data_path = v["data.path"];
  c.data_format = v["data.format"];
  if (c.data_format != "auto" && c.data_format != "flat" && c.data_format != "megatron")
    bad("data.format", c.data_format, "auto, flat or megatron");
  if (c.data_path.empty()) throw Error("data.path is empty (a token file, a prepare-data directory or 'synthetic')");
  c.prepare_from = v["data.prepare_from"];
  c.val_fraction = as_double(v, "data.val_fraction");
  if (!(c.val_fraction > 0 && c.val_fraction < 1)) throw Error("data.val_fraction must be in (0, 1)");
  c.synthetic_tokens = as_int(v, "data.synthetic_tokens", 2);
  c.synthetic_branching = as_int(v, "data.synthetic_branching", 1);
  c.synthetic_seed = as_uint(v, "data.synthetic_seed");
}

}  // namespace

RunConfig parse_run_config(const std::string& ini_text, const std::string& origin,
                           const std::vector<std::string>& overrides) {
  Settings st = gather_settings(ini_text, origin, overrides);
  RunConfig c;
  read_model(c, st.v, st.model_fields);
  read_train(c, st.v, st.recipe_sets);
  read_optim(c, st.v);
  read_data(c, st.v);
  c.values = st.v;
  return c;
}

RunConfig load_run_config(const std::string& path, const std::vector<std::string>& overrides) {
  if (path.empty()) return parse_run_config("", "defaults", overrides);
  return parse_run_config(sim::quant::read_config_text(path, "configuration"), path, overrides);
}

std::string RunConfig::text() const {
  std::string s = "# exmy run configuration, fully resolved (every key, defaults included)\n";
  std::string section;
  for (const auto& k : kKeys) {
    const std::string sec = k.name.substr(0, k.name.find('.'));
    if (sec != section) {
      s += "\n[" + sec + "]\n";
      section = sec;
    }
    s += k.name.substr(sec.size() + 1) + " = " + values.at(k.name) + "\n";
    if (k.name == "model.name") s += models::describe(model);
  }
  // The recipe overrides, in the order they apply (train.recipe names the
  // recipe; the run file holds the resolved recipe too).
  if (!recipe_sets.empty()) {
    s += "\n[recipe]\n";
    for (const auto& [key, value] : recipe_sets) s += key.substr(kRecipePrefix.size()) + " = " + value + "\n";
  }
  return s;
}

}  // namespace exmy::train

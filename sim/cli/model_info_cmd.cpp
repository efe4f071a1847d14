// `exmy model-info --model NAME|config.json [--set model.FIELD=VALUE ...]`:
// parameter counts per component and in total, FLOPs per token and a
// training-memory estimate of a Nemotron-H configuration.
#include <boost/program_options.hpp>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "formats/error.hpp"
#include "models/config.hpp"
#include "sim/cli/cli_support.hpp"
#include "sim/cli/commands.hpp"
#include "sim/quant/quantized_linear.hpp"
#include "sim/quant/recipe.hpp"
#include "sim/train/trainer.hpp"
#include "sim/sysmem.hpp"
#include "sim/train/training_device.hpp"

namespace po = boost::program_options;

namespace exmy::cli {
namespace {

// 8100852736 -> "8,100,852,736"
std::string grouped(int64_t v) {
  std::string s = std::to_string(v), out;
  const int n = static_cast<int>(s.size());
  for (int i = 0; i < n; ++i) {
    out += s[static_cast<size_t>(i)];
    if ((n - i - 1) % 3 == 0 && i != n - 1) out += ',';
  }
  return out;
}

std::string human(double v, const char* unit) {
  const char* prefixes[] = {"", "K", "M", "G", "T", "P"};
  int i = 0;
  while (v >= 1000 && i < 5) v /= 1000, ++i;
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.3g %s%s", v, prefixes[i], unit);
  return buf;
}

}  // namespace

int cmd_model_info(const Args& args) {
  po::options_description desc(
      "exmy model-info: parameters, FLOPs per token and training memory of a Nemotron-H model\n\n"
      "usage: exmy model-info --model NAME|config.json [--set model.FIELD=VALUE ...]\n\noptions");
  desc.add_options()("help,h", "show this help")                                                  //
      ("model", po::value<std::string>()->default_value("nemotron-h-8b"),
       ("a preset (" + models::preset_list() + ") or an HF config.json").c_str())  //
      ("set", po::value<std::vector<std::string>>()->composing(), "override a field: model.FIELD=VALUE")  //
      ("seq-len", po::value<int64_t>()->default_value(4096), "sequence length for FLOPs and memory")  //
      ("batch", po::value<int64_t>()->default_value(1), "micro-batch (sequences) for the memory estimate")  //
      ("recompute", po::value<std::string>()->default_value("none"), "activation recompute for the memory estimate: none | blocks (train.recompute)")  //
      ("offload", po::value<std::string>()->default_value("none"), "none | optimizer: FP32 master weights and AdamW moments in host memory while the model trains on --device (train.offload)")  //
      ("working-weights", po::value<std::string>()->default_value("fp32"), "fp32 | bf16: the weights the model reads; bf16 adds the optimizer's FP32 master weights where the optimizer state lives (train.working_weights)")  //
      ("host-memory", po::value<double>(), "GiB of host memory for the offloaded state (default: what this machine has free now)")  //
      ("memory", po::value<double>(), "GiB available for the plan (default: what this machine, or --device, has free now)")  //
      ("device", po::value<std::string>()->default_value("cpu"), "where the plan trains: cpu, cuda[:N] (train.device)")  //
      ("ranks", po::value<int>()->default_value(1), "data-parallel ranks: the plan of one rank, AdamW moments sharded (train.shard_optimizer)")  //
      ("grad-accum", po::value<int64_t>()->default_value(0), "micro-batches per optimizer step, all ranks together (train.grad_accum; default: one per rank): their gradient sums")  //
      ("recipe", po::value<std::string>()->default_value("fp32"), "the recipe whose quantized linears' scratch the plan holds (train.recipe: a name or an .ini file)")  //
      ("fp32-gemm", po::value<std::string>()->default_value("auto"), "auto | sgemm | bf16: how the recipe's fp32 GEMM model runs (train.fp32_gemm)")  //
      ("fields", "also print every configuration field");
  po::variables_map vm;
  if (parse_or_help(args, desc, {}, vm)) return 0;
  models::NemotronHConfig cfg = models::resolve_config(vm["model"].as<std::string>());
  if (vm.count("set"))
    for (const auto& s : vm["set"].as<std::vector<std::string>>()) models::apply_override(cfg, s);
  models::validate(cfg);
  const int64_t seq = vm["seq-len"].as<int64_t>(), batch = vm["batch"].as<int64_t>();
  if (seq <= 0 || batch <= 0) throw Error("--seq-len and --batch must be positive");
  const sim::Device device = sim::parse_device(vm["device"].as<std::string>(), "--device");
  const std::string offload = vm["offload"].as<std::string>();
  if (offload != "none" && offload != "optimizer") throw Error("--offload '" + offload + "' (expected none or optimizer)");
  if (offload == "optimizer" && device.is_cpu())
    throw Error("--offload optimizer plans a device run (give --device cuda): on the CPU the optimizer state is in host memory already");
  const bool offloaded = offload == "optimizer";
  const bool bf16_weights =
      sim::parse_working_weights(vm["working-weights"].as<std::string>(), "--working-weights") == sim::WorkingWeights::bf16;
  const int ranks = vm["ranks"].as<int>();
  if (ranks < 1) throw Error("--ranks must be at least 1");
  const int64_t accum = vm["grad-accum"].as<int64_t>() == 0 ? ranks : vm["grad-accum"].as<int64_t>();
  if (accum < 1 || accum % ranks != 0)
    throw Error("--grad-accum " + std::to_string(accum) + ": a positive multiple of --ranks (" + std::to_string(ranks) + ")");
  const std::string recipe_name = vm["recipe"].as<std::string>();
  const sim::quant::Recipe recipe = sim::quant::load_recipe(recipe_name);
  sim::quant::RuntimeOptions rt_opt;
  rt_opt.fp32_gemm = sim::quant::parse_fp32_gemm(vm["fp32-gemm"].as<std::string>(), device.is_cuda(), "--fp32-gemm");
  for (const char* option : {"memory", "host-memory"})  // (checked before the plan is printed)
    if (vm.count(option) && !(vm[option].as<double>() > 0))
      throw Error(std::string("--") + option + " must be a positive number of GiB");

  std::printf("model %s: %lld layers (%lld Mamba-2, %lld attention, %lld MLP), hidden %lld, vocab %lld\n",
              cfg.name.c_str(), static_cast<long long>(cfg.num_hidden_layers),
              static_cast<long long>(cfg.count_layers('M')), static_cast<long long>(cfg.count_layers('*')),
              static_cast<long long>(cfg.count_layers('-')), static_cast<long long>(cfg.hidden_size),
              static_cast<long long>(cfg.vocab_size));
  std::printf("pattern %s\n", cfg.hybrid_override_pattern.c_str());
  if (vm.count("fields")) std::printf("\n%s", models::describe(cfg).c_str());

  std::printf("\n%-12s %-14s %16s %7s %18s\n", "parameters", "component", "per layer", "layers", "total");
  const auto rows = models::parameter_breakdown(cfg);
  std::string last;
  int64_t total = 0;
  for (const auto& r : rows) {
    const bool per_block = r.block == "mamba" || r.block == "attention" || r.block == "mlp";
    std::printf("%-12s %-14s %16s %7s %18s\n", r.block == last ? "" : r.block.c_str(), r.component.c_str(),
                per_block ? grouped(r.per_layer).c_str() : "", per_block ? std::to_string(r.layers).c_str() : "",
                grouped(r.total()).c_str());
    last = r.block;
    total += r.total();
  }
  for (const char* block : {"mamba", "attention", "mlp"}) {
    int64_t per = 0, layers = 0;
    for (const auto& r : rows)
      if (r.block == block) per += r.per_layer, layers = r.layers;
    if (layers)
      std::printf("%-12s %-14s %16s %7lld %18s\n", block, "(block)", grouped(per).c_str(),
                  static_cast<long long>(layers), grouped(per * layers).c_str());
  }
  std::printf("%-12s %-14s %16s %7s %18s  (%.3g %s)\n", "total", "", "", "", grouped(total).c_str(),
              total >= 1e9 ? total / 1e9 : total >= 1e6 ? total / 1e6 : total / 1e3,
              total >= 1e9 ? "billion" : total >= 1e6 ? "million" : "thousand");

  const models::FlopCount f = models::flops_per_token(cfg, seq);
  std::printf("\nFLOPs per token at sequence length %lld (2 per multiply-add):\n", static_cast<long long>(seq));
  std::printf("  forward    %s  (linear %s, attention %s, SSD scan %s)\n", human(f.forward(), "FLOP").c_str(),
              human(f.linear, "FLOP").c_str(), human(f.attention, "FLOP").c_str(), human(f.ssd, "FLOP").c_str());
  std::printf("  training   %s  (forward + dgrad + wgrad = 3 x forward; 6N = %s)\n",
              human(f.training(), "FLOP").c_str(), human(6.0 * static_cast<double>(total), "FLOP").c_str());

  const std::string recompute = vm["recompute"].as<std::string>();
  if (recompute != "none" && recompute != "blocks") throw Error("--recompute '" + recompute + "' (expected none or blocks)");
  train::RankPlan plan;
  plan.ranks = ranks;
  plan.offload = offloaded;
  plan.bf16_weights = bf16_weights;
  plan.grad_accum = accum;
  plan.on_device = !device.is_cpu();
  plan.device_sums = true;  // one rank alone, or ranks on NCCL (train.comm = auto picks it on CUDA devices)
  plan.quant_scratch = sim::quant::quant_scratch_bytes(recipe, cfg.num_hidden_layers, models::linear_infos(cfg),
                                                       batch * seq, rt_opt, /*stats=*/true);
  plan.linear_scratch = train::plain_linear_scratch(cfg, recipe, device, batch * seq);
  const models::MemoryEstimate m = train::rank_training_memory(cfg, batch, seq, recompute == "blocks", plan);
  // On a device the training step keeps the same FP32 tensors in the
  // device's memory, or (offloaded) all but the optimizer's.
  const std::string where = device.is_cpu()  ? "on the CPU"
                            : offloaded      ? "on " + sim::device_name(device) + ", optimizer state in host memory"
                                             : "on " + sim::device_name(device) + ", all in device memory";
  std::printf("\ntraining memory %s, %s, micro-batch %lld x %lld tokens, recompute %s%s:\n", where.c_str(),
              bf16_weights ? "BF16 working weights in FP32 storage with FP32 master weights" : "FP32",
              static_cast<long long>(batch), static_cast<long long>(seq), recompute.c_str(),
              ranks > 1 ? (", per rank of " + std::to_string(ranks) + (offloaded ? " (AdamW state sharded)" : " (AdamW moments sharded)")).c_str() : "");
  if (offloaded)
    std::printf("  weights %s, gradients %s (the master weights and AdamW moments are on the host)\n",
                sim::gib_text(m.params).c_str(), sim::gib_text(m.grads).c_str());
  else if (m.master > 0)
    std::printf("  weights %s, gradients %s, AdamW moments %s, FP32 master weights %s\n",
                sim::gib_text(m.params).c_str(), sim::gib_text(m.grads).c_str(), sim::gib_text(m.optimizer).c_str(),
                sim::gib_text(m.master).c_str());
  else
    std::printf("  weights %s, gradients %s, AdamW moments %s\n", sim::gib_text(m.params).c_str(),
                sim::gib_text(m.grads).c_str(), sim::gib_text(m.optimizer).c_str());
  std::printf("  activations kept for backward %s, backward workspace %s\n", sim::gib_text(m.activations).c_str(),
              sim::gib_text(m.workspace).c_str());
  if (m.quant_scratch > 0)
    std::printf("  quantized linears' scratch (%s, fp32 GEMM model %s, statistics on) %s\n", recipe_name.c_str(),
                sim::quant::fp32_gemm_name(rt_opt.fp32_gemm), sim::gib_text(m.quant_scratch).c_str());
  if (m.linear_scratch > 0)
    std::printf("  BF16 operand copies of the bf16 linears %s\n", sim::gib_text(m.linear_scratch).c_str());
  if (m.grad_sums > 0)
    std::printf("  gradient sums of %lld micro-batches %s (%s)\n", static_cast<long long>(accum),
                sim::gib_text(m.grad_sums).c_str(),
                ranks == 1 ? "the step's running sum" : "the sum the ranks' chain passes on and the gradients a rank holds for it");
  std::printf("  total %s (%.0f bytes; exmy train checks it before allocating)\n", sim::gib_text(m.total()).c_str(), m.total());
  // --memory / --host-memory: GiB the user gives instead of what is free now.
  auto given = [&](const char* option, sim::AvailableMemory& a) {
    if (!vm.count(option)) return false;
    a.bytes = vm[option].as<double>() * 1024.0 * 1024.0 * 1024.0;
    a.source = std::string("--") + option;
    return true;
  };
  sim::AvailableMemory avail;
  if (given("memory", avail)) {
    // as given
  } else if (device.is_cuda()) {
    size_t free_b = 0, total_b = 0;
    sim::Device d = device;
    if (!sim::device_problem(d, sim::device_inventory(), "--device").empty() ||
        !train::cuda_device_memory(d, &free_b, &total_b)) {
      std::printf("  (no such CUDA device here: give --memory GiB, e.g. --memory 139 for an H200)\n");
      return 0;
    }
    avail.bytes = static_cast<double>(free_b);
    avail.source = sim::device_name(d) + " free of " + sim::gib_text(static_cast<double>(total_b));
  } else {
    avail = sim::available_memory();
  }
  std::printf("  %s in %s (%s)\n", m.total() <= avail.bytes ? "fits" : "does not fit", sim::gib_text(avail.bytes).c_str(),
              avail.source.c_str());
  if (offloaded) {
    sim::AvailableMemory host;
    if (!given("host-memory", host)) host = sim::available_memory();
    std::printf("  host memory %s: FP32 master weights and AdamW moments, staging chunks of gradients; %s in %s (%s)\n",
                sim::gib_text(m.host_state).c_str(), m.host_state <= host.bytes ? "fits" : "does not fit",
                sim::gib_text(host.bytes).c_str(), host.source.c_str());
  }
  return 0;
}

}  // namespace exmy::cli

#include "sim/train/trainer.hpp"

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>

#include "formats/error.hpp"
#include "models/hf_checkpoint.hpp"
#include "sim/dist/nccl_comm.hpp"
#include "sim/train/training_device.hpp"
#include "sim/io/atomic_file.hpp"
#include "sim/data/prepare.hpp"
#include "sim/data/sampler.hpp"
#include "sim/data/synthetic.hpp"
#include "sim/data/token_file.hpp"
#include "sim/io/run_file.hpp"
#include "sim/io/run_lock.hpp"
#include "sim/linear.hpp"
#include "sim/optim.hpp"
#include "sim/quant/quantized_linear.hpp"
#include "sim/sysmem.hpp"
#include "sim/train/checkpoint.hpp"
#include "sim/train/loss_window.hpp"
#include "sim/train/quant_io.hpp"

namespace exmy::train {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int64_t kRunSchemaVersion = 2;  // 2: recipes, statistics, captures, per-parameter norms

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string host_name() {
  char buf[256] = {0};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "unknown";
  return buf;
}

std::string fmt_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const long long t = std::llround(s);
  char buf[32];
  if (t >= 3600) std::snprintf(buf, sizeof buf, "%lldh%02lldm", t / 3600, (t / 60) % 60);
  else if (t >= 60) std::snprintf(buf, sizeof buf, "%lldm%02llds", t / 60, t % 60);
  else std::snprintf(buf, sizeof buf, "%llds", t);
  return buf;
}

std::string fmt_count(double n) {
  char buf[32];
  if (n >= 1e9) std::snprintf(buf, sizeof buf, "%.2fG", n / 1e9);
  else if (n >= 1e6) std::snprintf(buf, sizeof buf, "%.2fM", n / 1e6);
  else if (n >= 1e4) std::snprintf(buf, sizeof buf, "%.1fk", n / 1e3);
  else std::snprintf(buf, sizeof buf, "%.0f", n);
  return buf;
}

using io::write_text_atomic;

// The temporaries a killed writer left in a run directory (NAME.tmp-PID,
// run.h5.resume-PID; checkpoints/step_N.h5.tmp-PID): the caller holds the
// directory's lock, so no live exmy writes them.
void remove_leftovers(const fs::path& dir) {
  io::remove_stale_temporaries(dir);
  std::error_code ec;
  if (fs::is_directory(dir / "checkpoints", ec)) io::remove_stale_temporaries(dir / "checkpoints");
}

}  // namespace

double plain_linear_scratch(const models::NemotronHConfig& model, const sim::quant::Recipe& recipe,
                            const sim::Device& device, int64_t tokens) {
  if (!device.is_cuda() || sim::parse_linear_policy(recipe.unquantized) != sim::LinearPolicy::bf16) return 0;
  std::vector<sim::LinearInfo> plain;
  for (const sim::LinearInfo& info : models::linear_infos(model))
    if (!recipe.quantizes(info, model.num_hidden_layers)) plain.push_back(info);
  return sim::cuda_bf16_linear_scratch_bytes(plain, tokens);
}

RankPlan rank_plan(const RunConfig& cfg, int ranks) {
  RankPlan p;
  p.linear_scratch = plain_linear_scratch(cfg.model, cfg.recipe, cfg.device, cfg.batch_size * cfg.seq_len);
  p.quant_scratch = sim::quant::quant_scratch_bytes(
      cfg.recipe, cfg.model.num_hidden_layers, models::linear_infos(cfg.model), cfg.batch_size * cfg.seq_len,
      sim::quant::RuntimeOptions{cfg.seed, cfg.gemm_stats_rows, cfg.gemm_stats_sample,
                                 sim::quant::parse_fp32_gemm(cfg.fp32_gemm, cfg.device.is_cuda())},
      cfg.stats_interval > 0);
  p.ranks = ranks;
  p.shard_optimizer = cfg.shard_optimizer;
  p.offload = cfg.offloaded();
  p.bf16_weights = cfg.bf16_weights();
  p.grad_accum = cfg.grad_accum;
  p.on_device = !cfg.device.is_cpu();
  // as make_buffer_comm decides (auto: NCCL on CUDA devices when it loads)
  p.device_sums = ranks == 1 || cfg.comm == dist::CommChoice::nccl ||
                  (cfg.comm == dist::CommChoice::automatic && cfg.device.is_cuda());
  return p;
}

models::MemoryEstimate rank_training_memory(const models::NemotronHConfig& model, int64_t batch, int64_t seq_len,
                                            bool recompute, const RankPlan& plan) {
  models::MemoryEstimate m = models::training_memory(model, batch, seq_len, recompute);
  m.quant_scratch = plan.quant_scratch;
  m.linear_scratch = plan.linear_scratch;
  const double arena = m.params / 4.0;  // elements of the arena (padding included)
  const int shards = plan.shard_optimizer ? plan.ranks : 1;
  const double shard = shards > 1 ? static_cast<double>(sim::largest_shard(models::make_layout(model), shards)) : arena;
  if (shards > 1) m.optimizer = 8.0 * shard;
  if (plan.bf16_weights) m.master = 4.0 * shard;  // sim::AdamW's master beside the moments
  if (plan.offload) {  // sim::AdamW's offload: master weights and moments on the host, its staging chunks
    const int staged = sim::offload_staging_chunks(plan.bf16_weights ? sim::WorkingWeights::bf16 : sim::WorkingWeights::fp32);
    m.host_state = 12.0 * shard + 4.0 * staged * std::min(shard, static_cast<double>(sim::kOffloadChunk));
    m.optimizer = 0;
    m.master = 0;  // counted in host_state, with or without BF16 working weights
  }
  if (plan.grad_accum > 1) {  // Trainer::forward_backward's sums, on the rank that keeps the most
    const int64_t k = (plan.grad_accum + plan.ranks - 1) / plan.ranks;  // a rank's micro-batches
    // The running sum; a rank after the first holds k - 1 gradients (its
    // last stays in the arena or its staged copy) and receives the lower
    // ranks' sum.
    const double sums = 4.0 * arena * static_cast<double>(plan.ranks == 1 ? 1 : std::max<int64_t>(1, k));
    if (!plan.on_device || plan.device_sums) m.grad_sums = sums;
    else m.host_state += sums + 4.0 * arena;  // through the host, with the staging copy
  }
  return m;
}

void require_training_memory(const RunConfig& cfg, int ranks) {
  const int shards = cfg.shard_optimizer ? ranks : 1;
  const models::MemoryEstimate m =
      rank_training_memory(cfg.model, cfg.batch_size, cfg.seq_len, cfg.recompute == "blocks", rank_plan(cfg, ranks));
  const std::string shard = shards > 1 ? " (this rank's shard of " + std::to_string(shards) + ")" : "";
  // On a CUDA device the model lives in the device's memory.
  sim::AvailableMemory device;
  const bool on_cuda = cuda_available_memory(cfg.device, &device);
  sim::require_memory(m.total(),
                      "training model " + cfg.model_name + " (micro-batch " + std::to_string(cfg.batch_size) + " x " +
                          std::to_string(cfg.seq_len) + " tokens: weights, gradients" +
                          (cfg.offloaded() ? " (AdamW state offloaded)"
                                           : " and AdamW moments" + std::string(m.master > 0 ? " and FP32 master weights" : "") +
                                                 shard) +
                          " " + sim::gib_text(m.params + m.grads + m.optimizer + m.master) + ", activations and workspace " +
                          sim::gib_text(m.activations + m.workspace) +
                          (m.grad_sums > 0 ? ", gradient sums " + sim::gib_text(m.grad_sums) : std::string()) +
                          (m.quant_scratch > 0 ? ", quantized linears' scratch " + sim::gib_text(m.quant_scratch)
                                               : std::string()) +
                          (m.linear_scratch > 0 ? ", BF16 operand copies " + sim::gib_text(m.linear_scratch)
                                                : std::string()) +
                          "; exmy model-info --model " + cfg.model_name + ")",
                      "lower train.batch_size or train.seq_len (train.grad_accum keeps the tokens per step), or "
                      "choose a smaller model",
                      on_cuda ? &device : nullptr);
  if (m.host_state > 0) {  // what the device run keeps in the host's memory
    std::string what = cfg.offloaded() ? "FP32 master weights and AdamW moments" + shard : std::string();
    if (m.grad_sums == 0 && cfg.grad_accum > 1)
      what += (what.empty() ? "" : ", ") + std::string("gradient sums staged for the ranks");
    sim::require_memory(m.host_state,
                        "the host's part of training " + cfg.model_name + " on " + sim::device_name(cfg.device) + " (" +
                            what + ")",
                        cfg.offloaded() ? "shard it over more ranks (train.shard_optimizer) or train.offload = none"
                                        : "train.comm = nccl keeps the gradient sums on the devices");
  }
}

RunData open_run_data(const RunConfig& cfg, const BuildInfo& build, std::FILE* out) {
  RunData d;
  const int64_t V = cfg.model.vocab_size;
  if (cfg.data_path == "synthetic") {
    const auto src = data::MarkovSource::random(V, cfg.synthetic_branching, cfg.synthetic_seed);
    d.entropy_rate = src.entropy_rate();
    char what[160];
    std::snprintf(what, sizeof what, "synthetic Markov source (vocabulary %lld, branching %lld, entropy rate %.4f nats/token)",
                  static_cast<long long>(V), static_cast<long long>(cfg.synthetic_branching), d.entropy_rate);
    d.stream = std::make_unique<data::MemoryTokens>(src.generate(cfg.synthetic_tokens, cfg.synthetic_seed + 1), V, what);
  } else {
    std::error_code ec;
    const bool missing = !fs::exists(cfg.data_path, ec) && !fs::exists(cfg.data_path + ".idx", ec);
    if (missing && !cfg.prepare_from.empty()) {
      if (!fs::exists(cfg.prepare_from, ec))
        throw Error("data.prepare_from '" + cfg.prepare_from + "' does not exist (tools/setup.sh installs the corpus)");
      if (out) std::fprintf(out, "preparing %s from %s (byte tokenizer) ...\n", cfg.data_path.c_str(), cfg.prepare_from.c_str());
      data::PrepareOptions p;
      p.inputs = {cfg.prepare_from};
      p.out_dir = cfg.data_path;
      p.version = build.version;
      const auto r = data::prepare_data(p);
      if (out)
        std::fprintf(out, "prepared %lld files, %s tokens\n", static_cast<long long>(r.files),
                     fmt_count(static_cast<double>(r.tokens)).c_str());
    }
    d.stream = data::open_tokens(cfg.data_path, cfg.data_format);
    if (d.stream->vocab_size() > V)
      throw Error(d.stream->describe() + " needs a vocabulary of " + std::to_string(d.stream->vocab_size()) +
                  " but model.vocab_size is " + std::to_string(V) + " (set --set model.vocab_size=" +
                  std::to_string(d.stream->vocab_size()) + ")");
  }
  d.split = data::split_stream(d.stream->size(), cfg.val_fraction, cfg.seq_len);
  return d;
}

namespace {

// "section.key" -> value of a configuration's text() (model fields and the
// [recipe] overrides included).
std::map<std::string, std::string> config_entries(const std::string& text) {
  std::map<std::string, std::string> m;
  std::istringstream in(text);
  std::string section;
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    if (line.front() == '[' && line.back() == ']') {
      section = line.substr(1, line.size() - 2);
      continue;
    }
    const size_t eq = line.find(" = ");
    if (eq == std::string::npos) continue;
    m[section + "." + line.substr(0, eq)] = line.substr(eq + 3);
  }
  return m;
}

// "key old -> new" for every key whose value differs between two texts.
std::vector<std::pair<std::string, std::string>> changed_keys(const std::string& before, const std::string& after) {
  const auto a = config_entries(before), b = config_entries(after);
  std::vector<std::pair<std::string, std::string>> out;
  auto value = [](const std::map<std::string, std::string>& m, const std::string& k) {
    const auto it = m.find(k);
    return it == m.end() ? std::string("(unset)") : it->second;
  };
  std::set<std::string> keys;
  for (const auto& [k, v] : a) keys.insert(k);
  for (const auto& [k, v] : b) keys.insert(k);
  // The same number spelled two ways (1e-2, 0.01) is no change.
  auto same = [](const std::string& x, const std::string& y) {
    if (x == y) return true;
    char *ex = nullptr, *ey = nullptr;
    const double dx = std::strtod(x.c_str(), &ex), dy = std::strtod(y.c_str(), &ey);
    return !x.empty() && !y.empty() && *ex == '\0' && *ey == '\0' && dx == dy;
  };
  for (const auto& k : keys)
    if (!same(value(a, k), value(b, k))) out.emplace_back(k, value(a, k) + " -> " + value(b, k));
  return out;
}

class Trainer {
 public:
  Trainer(RunConfig cfg, std::string dir, const TrainHooks& hooks, BuildInfo build)
      : cfg_(std::move(cfg)), dir_(std::move(dir)), hooks_(hooks), build_(std::move(build)),
        timed_(hooks.comm ? *hooks.comm : single_), comm_(timed_) {
    if (comm_.rank() != 0) hooks_.out = nullptr;  // only rank 0 prints (errors go to stderr)
    check_ranks();
    if (cfg_.threads > 0) omp_set_num_threads(cfg_.threads);
    // Rank 0 first: it prepares a data directory that does not exist yet.
    if (comm_.rank() != 0) comm_.barrier();
    data_ = open_run_data(cfg_, build_, hooks_.out);
    if (comm_.rank() == 0 && comm_.size() > 1) comm_.barrier();
    sampler_ = std::make_unique<data::SequenceSampler>(*data_.stream, data_.split.train_begin, data_.split.train_end,
                                                       cfg_.seq_len, cfg_.seed);
    const int64_t val_windows = data::window_count(data_.split.val_begin, data_.split.val_end, cfg_.seq_len);
    eval_batches_ = std::min(cfg_.eval_batches, val_windows / cfg_.batch_size);
    if (eval_batches_ <= 0)
      throw Error("the validation region holds " + std::to_string(val_windows) + " windows of " +
                  std::to_string(cfg_.seq_len + 1) + " tokens, fewer than one batch of train.batch_size = " +
                  std::to_string(cfg_.batch_size) + " (raise data.val_fraction or lower train.batch_size)");
    data::fixed_windows(*data_.stream, data_.split.val_begin, data_.split.val_end, cfg_.seq_len,
                        eval_batches_ * cfg_.batch_size, val_tokens_, val_targets_);
    // Every linear through the recipe (fp32 and bf16 are recipes too); the
    // runtime carries the step context, the tensor references and the sinks.
    quant_ = std::make_shared<sim::quant::QuantRuntime>(
        sim::quant::RuntimeOptions{cfg_.seed, cfg_.gemm_stats_rows, cfg_.gemm_stats_sample,
                                   sim::quant::parse_fp32_gemm(cfg_.fp32_gemm, cfg_.device.is_cuda())});
    if (comm_.rank() != 0) {  // statistics rows go to rank 0 after each step
      rank_stats_ = std::make_unique<SerializedStatsSink>();
      quant_->set_stats_sink(rank_stats_.get());
    }
    // On a device the same recipe decides every linear; its quantized
    // linears run through the device's ops, the others are the device's
    // plain linears; the model's layers and memory are the device backend's.
    device_ = std::make_unique<TrainingDevice>(cfg_.device);
    make_buffer_comm();
    device_->memory().reset_peak();  // the run's peak, from what is allocated now
    device_base_ = device_->memory().live_bytes();
    quant_->set_ops(device_->quant_ops());
    factory_ = std::make_unique<TrainingLinearFactory>(
        cfg_.recipe, cfg_.model.num_hidden_layers, quant_, cfg_.cold_restart_references,
        device_->on_device() ? device_->plain_linears(cfg_.recipe.unquantized) : nullptr);
    model_ = std::make_unique<models::NemotronH<float>>(cfg_.model, *factory_, device_->backend());
    check_rht_lengths();
    model_->set_bf16_activations(cfg_.precision == "bf16");
    model_->set_recompute(cfg_.recompute == "blocks");
    make_optimizer();
    const size_t n = static_cast<size_t>(cfg_.batch_size * cfg_.seq_len);
    tokens_.resize(n);
    targets_.resize(n);
    state_.data_seed = cfg_.seed;
  }

  // The optimizer of this rank: the whole arena's state, or (a sharded
  // multi-rank job) its shard's, with every rank's shard known for the
  // gather of the weights and of the checkpoint's moments.
  void make_optimizer() {
    const auto& layout = model_->arena().layout();
    const int n = comm_.size();
    if (n > 1 && cfg_.shard_optimizer)
      for (int r = 0; r < n; ++r) shards_.push_back(sim::optimizer_shard(layout, r, n));
    opt_ = std::make_unique<sim::AdamW>(
        layout, cfg_.adamw, shards_.empty() ? sim::whole_arena(layout) : shards_[static_cast<size_t>(comm_.rank())],
        device_->memory(), device_->optim(), cfg_.offloaded() ? device_->offload_memory() : nullptr,
        cfg_.working_weights);
    // EXMY_OFFLOAD_CHUNK=N: N elements a staged copy instead of
    // sim::kOffloadChunk, so that a small model's step is many chunks whose
    // copies overlap the update (tools/gpu-train-check.sh; the same bits).
    if (const char* e = std::getenv("EXMY_OFFLOAD_CHUNK"); e && *e && opt_->offloaded()) {
      char* endp = nullptr;
      const long long n = std::strtoll(e, &endp, 10);
      if (*endp != '\0' || n < 1)
        throw Error("EXMY_OFFLOAD_CHUNK='" + std::string(e) + "': expected a positive number of elements");
      opt_->set_offload_chunk(n);
    }
  }

  // The arena holds FP32 weights just written (the seed's initialization,
  // HF weights, a checkpoint's master weights): the optimizer takes its
  // shard's master copy of them, and with BF16 working weights the model
  // then reads their rounding. Every rank rounds the whole arena (each
  // holds all the weights; rounding is elementwise), so the ranks' working
  // weights are the same bits, as after each step's gather.
  void start_from_params() {
    const auto params = model_->arena().params();
    opt_->take_master(params);
    if (cfg_.bf16_weights()) model_->backend().round_bf16(params.data(), static_cast<int64_t>(params.size()));
  }

  // The Comm that moves the model's buffers (train.comm, docs/training.md
  // "Data-parallel runs"): NCCL on CUDA devices, its host emulation on
  // cuda-emulated, else the job's Comm with device buffers staged through
  // the host. Every rank decides alike: auto takes NCCL only when it loads
  // on every rank. The device Comm wraps the job's untimed Comm and is
  // timed on its own (the emulation's transfers are the job's).
  void make_buffer_comm() {
    const bool nccl = cfg_.comm == dist::CommChoice::nccl;
    if (!nccl && !(cfg_.comm == dist::CommChoice::automatic && cfg_.device.is_cuda() && comm_.size() > 1)) return;
    dist::Comm& job = hooks_.comm ? *hooks_.comm : single_;
    if (cfg_.device.is_emulated()) {
      device_comm_ = std::make_unique<dist::EmulatedDeviceComm>(job);
    } else {
      const dist::RankFinding f = dist::first_finding(comm_, dist::nccl_problem());
      if (f.any && !nccl) return;  // auto: MPI through the host
      if (f.any)
        throw dist::CollectiveError(comm_.rank() == 0 ? "train.comm = nccl: rank " + std::to_string(f.rank) + ": " + f.text
                                                      : "train.comm = nccl: NCCL cannot be used on every rank");
      device_comm_ = dist::make_nccl_comm(job);
    }
    timed_buffers_ = std::make_unique<dist::TimedComm>(*device_comm_);
    buffers_ = timed_buffers_.get();
  }
  // Seconds in the job's communication so far (waits included).
  double comm_seconds() const { return timed_.seconds() + (timed_buffers_ ? timed_buffers_->seconds() : 0.0); }
  // Whether the model's buffers go through host copies to reach buffers_.
  bool staged() const { return !device_->memory().on_host() && !buffers_->device_buffers(); }

  // After a sharded update: every rank's shard of the weights to every rank
  // (a broadcast per rank, in rank order).
  void gather_weights() {
    auto& arena = model_->arena();
    float* p = arena.params().data();
    const size_t n = arena.params().size();
    if (staged()) {
      grad_stage_.resize(n);
      arena.memory().to_host(grad_stage_.data(), p, n * sizeof(float));
    }
    float* h = staged() ? grad_stage_.data() : p;
    for (size_t r = 0; r < shards_.size(); ++r)
      if (shards_[r].size() > 0)
        buffers_->broadcast(h + shards_[r].begin, static_cast<size_t>(shards_[r].size()) * sizeof(float),
                            static_cast<int>(r));
    if (h != p) arena.memory().from_host(p, h, n * sizeof(float));
  }
  // The rank whose shard holds view i.
  int owner_of(int view) const {
    for (size_t r = 0; r < shards_.size(); ++r)
      if (view >= shards_[r].first_view && view < shards_[r].end_view) return static_cast<int>(r);
    return 0;
  }

  // Every rank must run the same configuration with a rank count that
  // divides the step's micro-batches: one line naming the first mismatch
  // (rank 0 prints it; every rank exits).
  void check_ranks() {
    const int n = comm_.size();
    if (n == 1) return;
    if (cfg_.grad_accum % n != 0)
      throw dist::CollectiveError("train.grad_accum = " + std::to_string(cfg_.grad_accum) +
                                  " micro-batches do not divide among " + std::to_string(n) +
                                  " ranks (choose a rank count that divides it, or change train.grad_accum)");
    std::string root = cfg_.text();
    dist::broadcast_string(comm_, root, 0);
    std::string mismatch;
    if (root != cfg_.text()) {
      for (const auto& [key, change] : changed_keys(root, cfg_.text()))
        mismatch += (mismatch.empty() ? "" : ", ") + key + " " + change;
      if (mismatch.empty()) mismatch = "the configuration text";
    }
    const dist::RankFinding f = dist::first_finding(comm_, mismatch);
    if (f.any)
      throw dist::CollectiveError(comm_.rank() == 0 ? "rank " + std::to_string(f.rank) +
                                                          " runs a different configuration than rank 0: " + f.text
                                                    : "configuration differs across ranks");
  }

  // The RHT runs along K in runs of 16: a recipe that turns it on for a GEMM
  // whose K is not a multiple of 16 is refused here, before the run starts,
  // not at its first call. K is in_features (fprop), out_features (dgrad)
  // or the tokens of a micro-batch (wgrad).
  void check_rht_lengths() const {
    for (const auto& e : factory_->recipe_factory().plan()) {
      if (!e.quantized) continue;
      for (const sim::quant::Role r : sim::quant::kRoles) {
        if (!e.specs[static_cast<size_t>(r)].q.rht) continue;
        const sim::quant::Gemm g = sim::quant::role_gemm(r);
        const int64_t K = g == sim::quant::Gemm::fprop   ? e.info.in_features
                          : g == sim::quant::Gemm::dgrad ? e.info.out_features
                                                         : cfg_.batch_size * cfg_.seq_len;
        const int n = e.specs[static_cast<size_t>(r)].q.rht_size;
        if (K % n == 0) continue;
        const std::string what =
            g == sim::quant::Gemm::wgrad
                ? "train.batch_size x train.seq_len = " + std::to_string(K) + " tokens per micro-batch"
                : std::string(g == sim::quant::Gemm::fprop ? "its input features" : "its output features") + ", " +
                      std::to_string(K);
        throw Error("recipe '" + cfg_.recipe.name + "': " + e.info.name + " " +
                    std::string(sim::quant::role_name(r)) + " has rht = true, which needs K a multiple of " + std::to_string(n) + ", but K is " +
                    what + " (set recipe." + std::string(sim::quant::role_name(r)) +
                    ".rht=false for both operands of the GEMM, or change the shape)");
      }
    }
  }

  std::string checkpoint_dir() const { return (fs::path(dir_) / "checkpoints").string(); }
  std::string run_path() const { return (fs::path(dir_) / "run.h5").string(); }

  // A new run starts from the seed's initialization, or from the weights
  // of an HF checkpoint (the optimizer state starts fresh either way).
  bool finished() const { return state_.step >= cfg_.steps; }

  // On a resume that changes the run's length: what that does to the
  // learning-rate schedule, whose length is train.steps.
  void note_schedule_change(const RunConfig& before) {
    if (before.steps == cfg_.steps) return;
    const int64_t s = state_.step;  // the next step is s + 1
    if (cfg_.schedule.kind == sim::LrKind::constant && cfg_.schedule.warmup <= s) {
      say("the run's length changes from %lld to %lld steps; the constant LR schedule does not depend on it\n",
          static_cast<long long>(before.steps), static_cast<long long>(cfg_.steps));
      return;
    }
    say("the run's length changes from %lld to %lld steps: the %s LR schedule is recomputed over %lld steps, so "
        "step %lld gets lr %.4e (%.4e under the old length)\n",
        static_cast<long long>(before.steps), static_cast<long long>(cfg_.steps),
        std::string(sim::lr_kind_name(cfg_.schedule.kind)).c_str(), static_cast<long long>(cfg_.steps),
        static_cast<long long>(s + 1), cfg_.schedule.at(s), before.schedule.at(s));
  }

  void init_fresh() {
    if (cfg_.init_from.empty()) {
      model_->init_weights(cfg_.seed);
    } else {
      models::load_hf_weights(*model_, cfg_.init_from);
      say("initialized from HF checkpoint %s\n", cfg_.init_from.c_str());
    }
    start_from_params();
  }

  void init_from_checkpoint(const std::string& path) {
    load_checkpoint(path, *model_, *opt_, state_);
    start_from_params();
    if (state_.data_seed != cfg_.seed)
      throw Error("checkpoint '" + path + "' was written with train.seed = " + std::to_string(state_.data_seed) +
                  ", the configuration says " + std::to_string(cfg_.seed));
    sampler_->set_position(state_.data_position);
    last_checkpoint_ = path;
  }

  // A new run file, or (resume) the old one cut at the checkpoint's step.
  void open_run_file(bool resume, const std::string& changes = "") {
    const std::string path = run_path();
    std::error_code ec;
    if (resume && fs::exists(path, ec)) {
      // The old file's rows up to the checkpoint's step, copied to a new
      // file that replaces it; rows logged after the checkpoint are dropped
      // (this run writes them again).
      const std::string tmp = path + ".resume-" + std::to_string(::getpid());
      io::RunFile::continue_from(path, tmp, state_.step)->close();
      fs::rename(tmp, path, ec);
      if (ec) throw Error("cannot replace '" + path + "': " + ec.message());
      run_ = io::RunFile::open_append(path);
      const auto prev = run_->string_attribute("resumed_at_steps");
      run_->set_attribute("resumed_at_steps",
                          (prev && !prev->empty() ? *prev + "," : std::string()) + std::to_string(state_.step));
      if (!changes.empty()) {
        // One line per resume that changed keys: "step S: key old -> new; ...".
        const auto log = run_->string_attribute("resume_changes");
        run_->set_attribute("resume_changes", (log && !log->empty() ? *log + "\n" : std::string()) + "step " +
                                                  std::to_string(state_.step) + ": " + changes);
      }
    } else {
      run_ = std::make_unique<io::RunFile>(path);
      run_->set_attribute("start_time", utc_now());
    }
    run_->set_attribute("schema_version", kRunSchemaVersion);
    run_->set_attribute("exmy_version", build_.version);
    run_->set_attribute("git_commit", build_.git_commit);
    if (!resume) run_->set_attribute("config", cfg_.text());  // the configuration the run started with
    run_->set_attribute("seed", static_cast<int64_t>(cfg_.seed));
    run_->set_attribute("host", host_name());
    run_->set_attribute("threads", static_cast<int64_t>(omp_get_max_threads()));
    run_->set_attribute("ranks", static_cast<int64_t>(comm_.size()));
    run_->set_attribute("model", cfg_.model_name);
    run_->set_attribute("precision", cfg_.precision);
    run_->set_attribute("recipe_name", cfg_.recipe.name);
    run_->set_attribute("recipe", sim::quant::recipe_to_ini(cfg_.recipe));
    run_->set_attribute("plan", factory_->recipe_factory().plan_text());
    run_->set_attribute("scale_hist_bins", static_cast<int64_t>(sim::quant::kScaleHistBins));
    run_->set_attribute("scale_hist_min_log2", static_cast<int64_t>(sim::quant::kScaleHistMinLog2));
    run_->set_attribute("range_hist_bins", static_cast<int64_t>(sim::quant::kRangeHistBins));
    run_->set_attribute("parameters", model_->arena().layout().num_params());
    run_->set_attribute("tokens_per_step", cfg_.tokens_per_step());
    run_->set_attribute("data", data_.stream->describe());
    if (data_.entropy_rate >= 0) run_->set_attribute("data_entropy_rate", data_.entropy_rate);
    using io::ElemType;
    for (const char* d : {"/train/step", "/train/tokens", "/eval/step", "/step_loss/step"}) run_->declare(d, ElemType::i64);
    run_->declare("/step_loss/loss", ElemType::f64);
    for (const char* d : {"/train/loss", "/train/lr", "/train/grad_norm", "/train/tokens_per_s", "/train/elapsed_s",
                          "/eval/loss"})
      run_->declare(d, ElemType::f64);
    // Per-parameter norms: one column per arena view, named by `columns`.
    std::vector<std::string> names;
    for (const auto& v : model_->arena().layout().views()) names.push_back(v.name);
    for (const char* d : {"/train/param_norm", "/train/param_grad_norm"}) {
      run_->declare(d, ElemType::f64, static_cast<int64_t>(names.size()));
      run_->set_attribute(d, "columns", names);
    }
    // The statistics datasets of every quantized linear, created now: later
    // each would cost a reopen of the file.
    stats_ = std::make_unique<RunFileStatsSink>(*run_);
    if (cfg_.stats_interval > 0) stats_->declare(factory_->recipe_factory().plan());
    capture_ = std::make_unique<RunFileCaptureSink>(*run_);
    quant_->set_stats_sink(stats_.get());
    quant_->set_capture_sink(capture_.get());
    run_->start_swmr();
  }

  TrainResult run();

  // One optimizer step s (0-based): forward and backward over this rank's
  // micro-batches with the sums chained through the ranks, the global norm,
  // and, when the loss and the norm are finite, the update (the training
  // state moves on). With a non-finite one the weights are left alone.
  struct Step {
    double loss = 0, grad_norm = 0, lr = 0, inv_accum = 1;
    bool finite() const { return std::isfinite(loss) && std::isfinite(grad_norm); }
  };
  Step train_step(int64_t s, bool first_of_session) {
    Step st;
    st.loss = forward_backward(s, first_of_session);
    st.inv_accum = 1.0 / static_cast<double>(cfg_.grad_accum);
    st.grad_norm = sim::global_norm(device_->memory(), device_->optim(), model_->arena().grads(), st.inv_accum);
    if (st.finite()) st.lr = update(s, st.grad_norm, st.inv_accum);
    return st;
  }
  int64_t steps_done() const { return state_.step; }

 private:
  // What the loop of one session keeps between steps.
  struct Session {
    Clock::time_point start = Clock::now();
    int64_t first = 0;          // the step the session started at
    double train_s = 0;         // step time this session
    double window_s = 0;        // step time since the last log line
    int64_t window_tokens = 0;  // tokens since the last log line
    double comm_s = 0;          // of train_s, in the job's collectives (waits included)
  };
  void say_plan(int64_t first);
  TrainResult nothing_to_do(TrainResult& res);
  void fill_result(TrainResult& res) const;
  double forward_backward(int64_t s, bool first_of_session);
  // grad_sum_ = g (first micro-batch) or grad_sum_ += g, element by element.
  void add_gradient(std::span<const float> g, bool first) {
    grad_sum_.resize(g.size());
    if (first) std::copy(g.begin(), g.end(), grad_sum_.begin());
    else add_to(grad_sum_, g);
  }
  // Micro-batch k (of `count`) of this rank's step on a device, whose
  // gradient g (n floats) is in the arena: rank 0 adds it to the step's sum
  // there as add_gradient does on the host (the device's add: the same FP32
  // additions); the other ranks keep a copy until the lower ranks' sum
  // arrives in device_grad_sum_, all but the last, which stays in the arena
  // (so a rank holds count - 1 copies).
  void keep_device_gradient(const float* g, int64_t n, int64_t k, int64_t count) {
    sim::Memory& mem = device_->memory();
    const size_t bytes = static_cast<size_t>(n) * sizeof(float);
    if (k == 0) device_grad_sum_.place(mem), device_grad_sum_.resize_zero(n);
    if (comm_.rank() == 0) {
      if (k == 0) mem.copy(device_grad_sum_.data(), g, bytes);
      else device_->backend().add_forward(device_grad_sum_.data(), device_grad_sum_.data(), g, n);
      return;
    }
    if (k == count - 1) return;  // the last micro-batch's gradient: the arena's
    held_device_grads_.resize(static_cast<size_t>(count - 1));
    sim::MemBuf<float>& h = held_device_grads_[static_cast<size_t>(k)];
    h.place(mem), h.resize_zero(n);
    mem.copy(h.data(), g, bytes);
  }
  static void add_to(std::span<float> sum, std::span<const float> g) {
    const int64_t n = static_cast<int64_t>(g.size());
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) sum[static_cast<size_t>(i)] += g[static_cast<size_t>(i)];
  }
  // Whether a periodic tensor reference may sample at (1-based) step: a
  // sampling step of its period, or the session's first step (a reference
  // that holds nothing yet samples on its first call).
  bool references_may_sample(int64_t step, bool first_of_session) const {
    for (const auto& e : factory_->recipe_factory().plan()) {
      if (!e.quantized) continue;
      for (const auto& spec : e.specs)
        if (spec.reference.kind == sim::quant::RefPolicy::Kind::periodic &&
            (first_of_session || (step - 1) % spec.reference.n == 0))
          return true;
    }
    return false;
  }
  // After the micro-batches of a step on N ranks: every delayed reference
  // takes the max of the step's amax over the ranks (what 1 rank recorded
  // over all micro-batches), and rank 0 writes the other ranks' statistics
  // rows after its own, in rank order (= micro-batch order).
  void combine_references(bool stats) {
    auto& refs = quant_->references();
    // (a per-row reference's rows follow the tensor amaxes, in key order)
    std::vector<double> amax;
    for (const auto& [key, st] : refs.states()) amax.push_back(st.has_step_amax() ? st.step_amax() : 0);
    for (const auto& [key, st] : refs.states())
      if (st.has_step_amax()) amax.insert(amax.end(), st.step_row_amax().begin(), st.step_row_amax().end());
    if (!amax.empty()) comm_.max(amax);
    size_t i = 0, at = refs.states().size();
    for (const auto& [key, st] : refs.states()) {
      if (st.has_step_amax()) {
        const size_t nr = st.step_row_amax().size();
        auto& own = refs.get(key);
        own.set_step_amax(amax[i]);
        if (nr) own.set_step_row_amax(std::vector<double>(amax.begin() + static_cast<std::ptrdiff_t>(at),
                                                          amax.begin() + static_cast<std::ptrdiff_t>(at + nr)));
        at += nr;
      }
      ++i;
    }
    if (!stats) return;
    const auto rows = comm_.gather(rank_stats_ ? rank_stats_->take() : std::string());
    for (size_t r = 1; r < rows.size(); ++r) replay_stats(rows[r], *stats_);
  }
  std::string stop_diverged(int64_t s, double loss, double grad_norm);
  double update(int64_t s, double grad_norm, double inv_accum);
  void record_step(double loss, double step_s, Session& ss, TrainResult& res);
  void log_step(int64_t step, double loss, double lr, double grad_norm, double inv_accum, Session& ss);
  void evaluate_and_log(int64_t step, TrainResult& res);
  void finish(TrainResult& res, const Session& ss);
  // Whether a stop was asked for (SIGINT); every rank stops at the same step
  // (a signal may reach them apart).
  bool stop_requested() {
    double stop = hooks_.stop ? hooks_.stop->load() : 0;
    if (comm_.size() > 1) comm_.max(std::span<double>(&stop, 1));
    return stop != 0;
  }
  // A checkpoint inside session ss, with the session's time so far counted
  // in its elapsed time.
  void checkpoint_in(const Session& ss) {
    state_.elapsed_s += seconds_since(ss.start);
    write_checkpoint();
    state_.elapsed_s -= seconds_since(ss.start);
  }

  // The validation forward runs the recipe with the tensor references as
  // they stand after the step, and leaves them so: the training run must not
  // depend on when it is evaluated. A validation batch's forward does not
  // depend on the batches before it (references do not sample after a step
  // and a delayed reference's running max does not enter its value), so the
  // ranks split the batches and chain the sum.
  double evaluate() {
    const sim::quant::FlatReferenceState refs = quant_->references().save();
    quant_->begin({std::max<int64_t>(state_.step, 1), 0, /*stats=*/false, /*capture=*/false});
    const int64_t n = cfg_.batch_size * cfg_.seq_len;
    const dist::Share mine = dist::share_of(eval_batches_, comm_.rank(), comm_.size());
    std::vector<double> losses;
    for (int64_t b = mine.begin; b < mine.end; ++b)
      losses.push_back(
          model_->forward(val_tokens_.data() + b * n, val_targets_.data() + b * n, cfg_.batch_size, cfg_.seq_len));
    quant_->finish();
    quant_->references().load(refs);
    double sum = 0;
    dist::ordered_sum<double>(comm_, std::span<double>(&sum, 1), [&](std::span<double> acc, bool prefix) {
      if (!prefix) acc[0] = 0;
      for (const double l : losses) acc[0] += l;
    });
    return sum / static_cast<double>(eval_batches_);
  }

  // Rank 0 writes the checkpoint (atomically: save_checkpoint renames a
  // finished temporary) once every rank has reached the same step; the
  // others wait for it, so none runs ahead of a checkpoint that failed.
  std::string write_checkpoint() {
    if (cfg_.keep_checkpoints == 0) return "(none: train.keep_checkpoints = 0)";  // a measuring run
    const std::string path = (fs::path(checkpoint_dir()) / checkpoint_name(state_.step)).string();
    if (comm_.size() > 1) {
      double v[2] = {static_cast<double>(state_.step), -static_cast<double>(state_.step)};
      comm_.max(std::span<double>(v, 2));
      if (v[0] != -v[1])
        throw Error("rank " + std::to_string(comm_.rank()) + " is at step " + std::to_string(state_.step) +
                    " but another rank is at step " + std::to_string(static_cast<int64_t>(v[0] == state_.step ? -v[1] : v[0])) +
                    ": no checkpoint written");
    }
    if (comm_.rank() != 0) {
      send_shard_state();
    } else {
      fs::create_directories(checkpoint_dir());
      save_checkpoint(path, *model_, *opt_, state_, {cfg_.text(), build_.version, build_.git_commit},
                      receive_shard_state());
      auto all = list_checkpoints(checkpoint_dir());
      std::error_code ec;  // a checkpoint that cannot be removed is only clutter
      for (size_t i = 0; i + static_cast<size_t>(cfg_.keep_checkpoints) < all.size(); ++i)
        if (all[i] != path) fs::remove(all[i], ec);
    }
    comm_.barrier();
    last_checkpoint_ = path;
    return path;
  }

  // A sharded optimizer's checkpoint: the ranks other than 0 send the
  // moments of their views in view order (with BF16 working weights the
  // views' FP32 master weights after them), rank 0 receives each view it
  // does not own as save_checkpoint writes it (one view's buffers at a
  // time). Moments in a device's memory leave from there when buffers_
  // takes its pointers, else from host copies; offloaded moments (host
  // memory) go through the job's host Comm.
  dist::Comm& moment_comm() { return opt_->memory().on_host() ? comm_ : *buffers_; }
  bool moments_staged() const { return !opt_->memory().on_host() && staged(); }
  bool master_in_checkpoint() const { return opt_->working_weights() == sim::WorkingWeights::bf16; }
  void send_shard_state() {
    if (shards_.empty()) return;
    const auto& views = model_->arena().layout().views();
    auto outgoing = [&](const float* p, int64_t n) {
      return moments_staged() ? sim::host_view(opt_->memory(), p, n, moment_buf_) : p;
    };
    for (int i = opt_->shard().first_view; i < opt_->shard().end_view; ++i) {
      const size_t bytes = static_cast<size_t>(views[static_cast<size_t>(i)].numel) * sizeof(float);
      const int64_t n = views[static_cast<size_t>(i)].numel;
      moment_comm().send(outgoing(opt_->exp_avg_of(i), n), bytes, 0);
      moment_comm().send(outgoing(opt_->exp_avg_sq_of(i), n), bytes, 0);
      if (master_in_checkpoint()) moment_comm().send(outgoing(opt_->master_of(i), n), bytes, 0);
    }
  }
  // Rank 0 receives into host memory, or (device buffers) into a device
  // buffer that lives as long as the checkpoint's writing and is copied to
  // the host view by view.
  ShardStateOf receive_shard_state() {
    if (shards_.empty()) return {};
    auto landing = std::make_shared<sim::MemBuf<float>>(device_->memory());
    return [this, landing](int view) {
      const auto& v = model_->arena().layout().views()[static_cast<size_t>(view)];
      const int64_t parts = master_in_checkpoint() ? 3 : 2;
      moment_buf_.resize(static_cast<size_t>(parts * v.numel));
      const size_t bytes = static_cast<size_t>(v.numel) * sizeof(float);
      const int owner = owner_of(view);
      float* into = moment_buf_.data();
      if (!opt_->memory().on_host() && !staged()) {
        if (landing->size() < parts * v.numel) landing->resize_zero(parts * v.numel);
        into = landing->data();
      }
      for (int64_t k = 0; k < parts; ++k) moment_comm().recv(into + k * v.numel, bytes, owner);
      if (into != moment_buf_.data())
        device_->memory().to_host(moment_buf_.data(), into, static_cast<size_t>(parts) * bytes);
      const float* b = moment_buf_.data();
      return ViewState{b, b + v.numel, parts == 3 ? b + 2 * v.numel : nullptr};
    };
  }

  // /train/param_norm and /train/param_grad_norm: the norm of each
  // parameter after the update and of its gradient (the micro-batch mean,
  // before clipping), in double, each view summed in order.
  void append_param_norms(double grad_scale) {
    const auto& views = model_->arena().layout().views();
    const int64_t n = static_cast<int64_t>(views.size());
    std::vector<double> w(views.size()), g(views.size());
    auto& arena = model_->arena();
    // On a device, the whole arena's parameters and gradients copied over.
    std::vector<float> sp, sg;
    const int64_t size = static_cast<int64_t>(arena.params().size());
    const float* params = sim::host_view(arena.memory(), arena.params().data(), size, sp);
    const float* grads = sim::host_view(arena.memory(), arena.grads().data(), size, sg);
#pragma omp parallel for schedule(dynamic)
    for (int64_t i = 0; i < n; ++i) {
      const float* p = params + views[static_cast<size_t>(i)].offset;
      const float* d = grads + views[static_cast<size_t>(i)].offset;
      double sw = 0, sg = 0;
      for (int64_t k = 0; k < views[static_cast<size_t>(i)].numel; ++k) {
        sw += static_cast<double>(p[k]) * p[k];
        sg += static_cast<double>(d[k]) * d[k];
      }
      w[static_cast<size_t>(i)] = std::sqrt(sw);
      g[static_cast<size_t>(i)] = std::sqrt(sg) * grad_scale;
    }
    run_->append("/train/param_norm", std::span<const double>(w));
    run_->append("/train/param_grad_norm", std::span<const double>(g));
  }

  // DIR/hf/ from rank 0. With BF16 working weights an FP32 export holds
  // the FP32 master weights (the state the run continues from: init_from
  // of it gives the same working weights and master), gathered into the
  // arena for the export (every rank takes part) and rounded back after
  // it; a BF16 export is the working weights themselves (the master's
  // rounding, the same bits).
  void export_hf() {
    const bool master = cfg_.bf16_weights() && cfg_.export_hf == "fp32";
    const auto params = model_->arena().params();
    if (master) {
      opt_->master_to(params);
      if (!shards_.empty()) gather_weights();
    }
    if (comm_.rank() == 0) {
      const std::string hf = (fs::path(dir_) / "hf").string();
      models::save_hf_checkpoint(*model_, hf, cfg_.export_hf == "bf16" ? "BF16" : "F32");
      say("  HF checkpoint (%s%s) %s\n", cfg_.export_hf.c_str(), master ? ", the FP32 master weights" : "",
          hf.c_str());
    }
    if (master) model_->backend().round_bf16(params.data(), static_cast<int64_t>(params.size()));
  }

  void say(const char* fmt, auto... args) {
    if (!hooks_.out) return;
    std::fprintf(hooks_.out, fmt, args...);
    std::fflush(hooks_.out);
  }

  RunConfig cfg_;
  std::string dir_;
  TrainHooks hooks_;
  BuildInfo build_;
  dist::SingleComm single_;
  dist::TimedComm timed_;  // the job's Comm, timed (its buffers are host memory)
  dist::Comm& comm_;
  std::unique_ptr<dist::Comm> device_comm_;         // NCCL or its emulation, when train.comm takes it
  std::unique_ptr<dist::TimedComm> timed_buffers_;  // device_comm_, timed
  // The Comm of the model's buffers (gradient sums, weight shards, moments):
  // comm_, or device_comm_ (timed) whose transfers take device pointers.
  dist::Comm* buffers_ = &comm_;
  RunData data_;
  std::unique_ptr<data::SequenceSampler> sampler_;
  int64_t eval_batches_ = 0;
  std::vector<int32_t> val_tokens_, val_targets_, tokens_, targets_;
  std::shared_ptr<sim::quant::QuantRuntime> quant_;
  std::unique_ptr<TrainingDevice> device_;  // what the model runs on (train.device)
  std::unique_ptr<TrainingLinearFactory> factory_;
  sim::MemBuf<float> device_grad_sum_;      // on a device: the step's gradient sum (grad_accum > 1)
  // On a device with device buffers, ranks other than 0: their
  // micro-batches' gradients until the lower ranks' sum arrives.
  std::vector<sim::MemBuf<float>> held_device_grads_;
  std::unique_ptr<models::NemotronH<float>> model_;
  std::unique_ptr<sim::AdamW> opt_;
  std::vector<sim::OptimizerShard> shards_;  // every rank's, when the optimizer is sharded
  std::vector<float> moment_buf_;            // rank 0: a view's moments (and master) received for a checkpoint
  std::unique_ptr<io::RunFile> run_;
  std::unique_ptr<RunFileStatsSink> stats_;
  std::unique_ptr<RunFileCaptureSink> capture_;
  TrainState state_;
  std::string last_checkpoint_;
  // The step's gradient sum (grad_accum > 1), and on ranks other than 0
  // their micro-batches' gradients but the last until the lower ranks' sum
  // arrives (held_grads_).
  std::vector<float> grad_sum_;
  std::vector<float> grad_stage_;  // on a device: the gradients (or weights) copied to the host for the ranks
  int64_t device_base_ = -1;       // on a device: the bytes allocated there before the run's
  std::vector<std::vector<float>> held_grads_;
  std::unique_ptr<SerializedStatsSink> rank_stats_;  // ranks other than 0
};

// The loop of a session, as a training step reads: forward and backward over
// the micro-batches, stop on a non-finite loss or gradient, update, then log,
// evaluate and checkpoint at their intervals. The helpers below do each part.
TrainResult Trainer::run() {
  TrainResult res;
  const int64_t total = cfg_.steps;
  Session ss;
  ss.first = state_.step;
  say_plan(ss.first);
  if (ss.first >= total) return nothing_to_do(res);
  for (int64_t s = ss.first; s < total; ++s) {
    if (stop_requested()) {
      res.status = TrainStatus::interrupted;
      break;
    }
    if (hooks_.before_step) hooks_.before_step(s, *model_);
    const auto t0 = Clock::now();
    const double comm0 = comm_seconds();
    const Step st = train_step(s, s == ss.first);
    // A non-finite loss or gradient stops the run before it touches the
    // weights: the checkpoint is the last good step.
    if (!st.finite()) {
      res.status = TrainStatus::diverged;
      res.message = stop_diverged(s, st.loss, st.grad_norm);
      break;
    }
    ss.comm_s += comm_seconds() - comm0;
    record_step(st.loss, seconds_since(t0), ss, res);
    const int64_t step = state_.step;
    if (hooks_.after_step && run_) hooks_.after_step(step, *model_, *run_);
    if (step % cfg_.log_interval == 0 || step == total || step == 1)
      log_step(step, st.loss, st.lr, st.grad_norm, st.inv_accum, ss);
    if ((cfg_.eval_interval > 0 && step % cfg_.eval_interval == 0) || step == total) evaluate_and_log(step, res);
    if ((cfg_.checkpoint_interval > 0 && step % cfg_.checkpoint_interval == 0) || step == total) checkpoint_in(ss);
  }
  finish(res, ss);
  return res;
}

void Trainer::say_plan(int64_t first) {
  const auto& mc = cfg_.model;
  say("exmy train: model %s (%s parameters, %lld layers %s), precision %s, %d threads%s\n", cfg_.model_name.c_str(),
      fmt_count(static_cast<double>(model_->arena().layout().num_params())).c_str(),
      static_cast<long long>(mc.num_hidden_layers), mc.hybrid_override_pattern.c_str(), cfg_.precision.c_str(),
      omp_get_max_threads(),
      comm_.size() > 1 ? (" per rank, " + std::to_string(comm_.size()) + " ranks (" + buffers_->name() + ", " +
                          std::to_string(cfg_.grad_accum / comm_.size()) + " micro-batches each, AdamW state " +
                          (shards_.empty() ? std::string("on every rank") : "sharded") + ")")
                             .c_str()
                       : "");
  {
    const auto& plan = factory_->recipe_factory().plan();
    const auto quantized = std::count_if(plan.begin(), plan.end(), [](const auto& e) { return e.quantized; });
    std::string extra;
    if (quantized > 0) {
      extra = ", statistics " + (cfg_.stats_interval > 0 ? "every " + std::to_string(cfg_.stats_interval) + " steps"
                                                          : std::string("off"));
      if (cfg_.capture_step > 0) extra += ", capture at step " + std::to_string(cfg_.capture_step);
    }
    say("recipe %s: %lld of %zu linears quantized (others %s)%s\n", cfg_.recipe.name.c_str(),
        static_cast<long long>(quantized), plan.size(), cfg_.recipe.unquantized.c_str(), extra.c_str());
  }
  say("data: %s; %s train / %s validation tokens\n", data_.stream->describe().c_str(),
      fmt_count(static_cast<double>(data_.split.train_end - data_.split.train_begin)).c_str(),
      fmt_count(static_cast<double>(data_.split.val_end - data_.split.val_begin)).c_str());
  say("steps %lld x %lld tokens (%lld x %lld x %lld accumulated), AdamW lr %.3g %s warmup %lld, run dir %s\n",
      static_cast<long long>(cfg_.steps), static_cast<long long>(cfg_.tokens_per_step()),
      static_cast<long long>(cfg_.batch_size), static_cast<long long>(cfg_.seq_len),
      static_cast<long long>(cfg_.grad_accum), cfg_.schedule.peak,
      std::string(sim::lr_kind_name(cfg_.schedule.kind)).c_str(), static_cast<long long>(cfg_.schedule.warmup),
      dir_.c_str());
  if (cfg_.bf16_weights())
    say("working weights BF16: the model reads the FP32 master weights rounded to BF16 after every update; the "
        "master (%s) is kept by the optimizer in %s memory (train.working_weights)\n",
        sim::gib_text(4.0 * static_cast<double>(opt_->shard().size())).c_str(), opt_->memory().name());
  if (opt_->offloaded())
    say("AdamW state offloaded: master weights and moments (%s) in %s memory, updated there in chunks of %lld "
        "elements (train.offload)\n",
        sim::gib_text(12.0 * static_cast<double>(opt_->shard().size())).c_str(), opt_->memory().name(),
        static_cast<long long>(opt_->offload_chunk()));
  if (first > 0) say("resuming at step %lld from %s\n", static_cast<long long>(first), last_checkpoint_.c_str());
}

TrainResult Trainer::nothing_to_do(TrainResult& res) {
  const int64_t first = state_.step;
  say("nothing to do: the run is at step %lld of %lld (give --steps N to extend it)\n", static_cast<long long>(first),
      static_cast<long long>(cfg_.steps));
  fill_result(res);
  return res;
}

// Where the run stands, into a session's result.
void Trainer::fill_result(TrainResult& res) const {
  if (device_base_ >= 0) res.device_peak_bytes = device_->memory().peak_bytes() - device_base_;
  res.step = state_.step;
  res.final_window_loss = final_window_loss(state_.losses);
  res.final_window_steps = state_.step > 0 ? final_window_steps(state_.step) : 0;
  res.checkpoint = last_checkpoint_;
}

// Forward and backward over this rank's micro-batches of step s (0-based),
// each micro-batch's gradient formed alone and added to the step's sum in
// micro-batch order, the sum chained through the ranks; the arena's
// gradients hold the sum on every rank. The quantized linears learn the step
// and the global micro-batch (random streams, tensor references) and whether
// to record statistics or capture. Returns the mean of the micro-batch
// losses.
double Trainer::forward_backward(int64_t s, bool first_of_session) {
  const bool stats = cfg_.stats_step(s + 1), capture = cfg_.capture_step == s + 1;
  const int64_t G = cfg_.grad_accum, B = cfg_.batch_size;
  const dist::Share mine = dist::share_of(G, comm_.rank(), comm_.size());
  const int64_t start = sampler_->position();  // the step's first window, the same on every rank
  if (capture && run_) run_->leave_swmr();  // many new tensors: out of SWMR mode for this step
  auto& arena = model_->arena();
  auto micro_batch = [&](int64_t m, bool record) {
    quant_->begin({s + 1, m, record && stats, record && capture && m == 0});
    sampler_->set_position(start + m * B);
    sampler_->next(tokens_.data(), targets_.data(), B);
    arena.zero_grad();
    const double loss = model_->forward(tokens_.data(), targets_.data(), B, cfg_.seq_len);
    model_->backward();
    quant_->finish();  // (a device's quantizer calls that did not wait report here)
    return loss;
  };
  // A periodic reference samples on the first call of a sampling step, in
  // micro-batch 0: ranks that do not run it replay it (forward and backward,
  // nothing kept) so that their references hold what micro-batch 0 sampled.
  if (mine.begin > 0 && references_may_sample(s + 1, first_of_session)) micro_batch(0, false);
  std::vector<double> losses;
  const auto grads = arena.grads();
  const int64_t n = static_cast<int64_t>(grads.size());
  // On a device the sum stays there when one rank runs alone or buffers_
  // takes device pointers; otherwise it is formed on the host.
  const bool sum_on_device = device_->on_device() && (comm_.size() == 1 || !staged());
  const float* last_host_grad = nullptr;  // the host path: where the rank's last gradient is
  for (int64_t m = mine.begin; m < mine.end; ++m) {
    losses.push_back(micro_batch(m, true));
    if (G == 1) break;  // the arena holds the step's gradient
    if (sum_on_device) {
      keep_device_gradient(grads.data(), n, m - mine.begin, mine.end - mine.begin);
      continue;
    }
    // Ranks on devices with MPI send their gradients through the host. A
    // rank after the first keeps copies of all but its last gradient, which
    // stays where the host sees it (the arena, or its staged copy).
    const float* g = sim::host_view(arena.memory(), grads.data(), n, grad_stage_);
    if (comm_.rank() == 0) {
      add_gradient(std::span<const float>(g, grads.size()), m == 0);
    } else if (m + 1 < mine.end) {
      held_grads_.resize(static_cast<size_t>(mine.end - mine.begin - 1));
      held_grads_[static_cast<size_t>(m - mine.begin)].assign(g, g + grads.size());
    }
    last_host_grad = g;
  }
  sampler_->set_position(start + G * B);
  if (G > 1 && sum_on_device) {
    // The chain on device buffers: each rank adds its held gradients with
    // the device's add, in micro-batch order, to the lower ranks' sum.
    dist::ordered_sum<float>(*buffers_, std::span<float>(device_grad_sum_.data(), static_cast<size_t>(n)),
                             [&](std::span<float> sum, bool prefix) {
                               if (!prefix) return;  // rank 0 summed into device_grad_sum_ as it went
                               for (auto& g : held_device_grads_)
                                 device_->backend().add_forward(sum.data(), sum.data(), g.data(), n);
                               device_->backend().add_forward(sum.data(), sum.data(), grads.data(), n);  // the last
                             });
    device_->memory().copy(grads.data(), device_grad_sum_.data(), grads.size() * sizeof(float));
  } else if (G > 1) {
    grad_sum_.resize(grads.size());
    dist::ordered_sum<float>(*buffers_, grad_sum_, [&](std::span<float> sum, bool prefix) {
      if (!prefix) return;  // rank 0 summed into grad_sum_ as it went
      for (const auto& g : held_grads_) add_to(sum, g);
      add_to(sum, std::span<const float>(last_host_grad, grads.size()));  // the last
    });
    arena.memory().from_host(grads.data(), grad_sum_.data(), grads.size() * sizeof(float));
  }
  double loss = 0;
  dist::ordered_sum<double>(comm_, std::span<double>(&loss, 1), [&](std::span<double> sum, bool prefix) {
    if (!prefix) sum[0] = 0;
    for (const double l : losses) sum[0] += l;
  });
  if (comm_.size() > 1) combine_references(stats);
  if (capture && run_) {
    run_->start_swmr();
    say("captured %lld operands of step %lld into %s:/capture/step_%lld\n", static_cast<long long>(capture_->tensors()),
        static_cast<long long>(s + 1), run_path().c_str(), static_cast<long long>(s + 1));
  }
  return loss / static_cast<double>(G);
}

// The checkpoint of the last good step and the message of a run stopped at
// step s + 1 by a non-finite loss or gradient norm.
std::string Trainer::stop_diverged(int64_t s, double loss, double grad_norm) {
  const std::string ckpt = write_checkpoint();
  char msg[512];
  std::snprintf(msg, sizeof msg, "%s is %s at step %lld: stopped before the update; checkpoint of step %lld in %s",
                std::isfinite(loss) ? "gradient norm" : "loss",
                std::isnan(std::isfinite(loss) ? grad_norm : loss) ? "NaN" : "infinite", static_cast<long long>(s + 1),
                static_cast<long long>(state_.step), ckpt.c_str());
  return msg;
}

// AdamW at the schedule's LR of step s, gradients clipped to the global
// norm and averaged over the micro-batches; the training state moves on.
double Trainer::update(int64_t s, double grad_norm, double inv_accum) {
  const double lr = cfg_.schedule.at(s);
  const double clip = sim::clip_factor(grad_norm, cfg_.grad_clip);
  opt_->step(model_->arena().params(), model_->arena().grads(), lr, clip * inv_accum);
  if (!shards_.empty()) gather_weights();
  state_.step = s + 1;
  state_.data_position = sampler_->position();
  state_.tokens_seen += cfg_.tokens_per_step();
  return lr;
}

// Every step's loss (the final window's source) and the session's timing.
void Trainer::record_step(double loss, double step_s, Session& ss, TrainResult& res) {
  res.losses.push_back(loss);
  state_.losses.push_back(loss);
  ss.train_s += step_s;
  ss.window_s += step_s;
  ss.window_tokens += cfg_.tokens_per_step();
  if (!run_) return;
  run_->append("/step_loss/step", state_.step);
  run_->append("/step_loss/loss", loss);
}

// The progress line and the /train rows of a logging step, flushed.
void Trainer::log_step(int64_t step, double loss, double lr, double grad_norm, double inv_accum, Session& ss) {
  const int64_t total = cfg_.steps;
  const int width = static_cast<int>(std::to_string(total).size());
  const double tps = ss.window_s > 0 ? static_cast<double>(ss.window_tokens) / ss.window_s : 0;
  const double eta = ss.train_s / static_cast<double>(step - ss.first) * static_cast<double>(total - step);
  say("step %*lld/%lld | loss %.4f | lr %.3e | grad norm %.3f | %s tok/s | ETA %s\n", width,
      static_cast<long long>(step), static_cast<long long>(total), loss, lr, grad_norm, fmt_count(tps).c_str(),
      fmt_duration(eta).c_str());
  ss.window_s = 0;
  ss.window_tokens = 0;
  if (!run_) return;
  run_->append("/train/step", step);
  run_->append("/train/loss", loss);
  run_->append("/train/lr", lr);
  run_->append("/train/grad_norm", grad_norm);
  run_->append("/train/tokens_per_s", tps);
  run_->append("/train/tokens", state_.tokens_seen);
  run_->append("/train/elapsed_s", state_.elapsed_s + seconds_since(ss.start));
  append_param_norms(inv_accum);
  run_->flush();
}

// The validation loss of an evaluation step: the best so far, the line and
// the /eval rows, flushed.
void Trainer::evaluate_and_log(int64_t step, TrainResult& res) {
  const double val = evaluate();
  res.val_losses.push_back(val);
  res.last_val_loss = val;
  if (val < state_.best_val_loss) {
    state_.best_val_loss = val;
    state_.best_val_step = step;
  }
  if (data_.entropy_rate >= 0)
    say("eval step %lld | val loss %.4f | entropy rate %.4f\n", static_cast<long long>(step), val, data_.entropy_rate);
  else
    say("eval step %lld | val loss %.4f | %.3f bits/token\n", static_cast<long long>(step), val, val / std::log(2.0));
  if (!run_) return;
  run_->append("/eval/step", step);
  run_->append("/eval/loss", val);
  run_->flush();
}

// The end of a session: the checkpoint of an interrupted run, or the summary
// (and the HF export) of a completed one; the run file closed.
void Trainer::finish(TrainResult& res, const Session& ss) {
  const double session_s = seconds_since(ss.start);
  if (res.status == TrainStatus::interrupted) {
    state_.elapsed_s += session_s;
    const std::string ckpt = write_checkpoint();
    // The run file is whole before the last line, which may not get out
    // (a launcher that stops reading the ranks' output on Ctrl-C).
    if (run_) {
      run_->close();
      run_.reset();
    }
    say("interrupted at step %lld: checkpoint %s; continue with: exmy train --resume %s\n",
        static_cast<long long>(state_.step), ckpt.c_str(), dir_.c_str());
  } else if (res.status == TrainStatus::completed) {
    const int64_t run_steps = state_.step - ss.first;
    const double window_loss = final_window_loss(state_.losses);
    say("done: %lld steps, %s tokens in %s (%s tok/s)\n", static_cast<long long>(run_steps),
        fmt_count(static_cast<double>(run_steps * cfg_.tokens_per_step())).c_str(), fmt_duration(session_s).c_str(),
        fmt_count(ss.train_s > 0 ? static_cast<double>(run_steps * cfg_.tokens_per_step()) / ss.train_s : 0).c_str());
    say("  %s %.4f | val loss %.4f (%.3f bits/token; best %.4f at step %lld)\n",
        final_window_label(state_.step).c_str(), window_loss, res.last_val_loss, res.last_val_loss / std::log(2.0),
        state_.best_val_loss, static_cast<long long>(state_.best_val_step));
    if (comm_.size() > 1)
      say("  %d ranks: %.1f%% of rank 0's step time in communication (%.2f s; waits for slower ranks included)\n",
          comm_.size(), ss.train_s > 0 ? 100.0 * ss.comm_s / ss.train_s : 0.0, ss.comm_s);
    if (device_base_ >= 0) {
      RankPlan plan = rank_plan(cfg_, comm_.size());
      plan.device_sums = comm_.size() == 1 || !staged();  // as the run decided
      const models::MemoryEstimate m =
          rank_training_memory(cfg_.model, cfg_.batch_size, cfg_.seq_len, cfg_.recompute == "blocks", plan);
      const double peak = static_cast<double>(device_->memory().peak_bytes() - device_base_);
      say("  %s memory: peak %s allocated by the run (plan %s, %+.1f%%)\n", sim::device_name(cfg_.device).c_str(),
          sim::gib_text(peak).c_str(), sim::gib_text(m.total()).c_str(), 100.0 * (peak - m.total()) / m.total());
    }
    say("  run file %s | checkpoint %s\n", run_path().c_str(), last_checkpoint_.c_str());
    if (cfg_.export_hf != "none") export_hf();
  }
  if (run_) run_->close();
  fill_result(res);
  if (hooks_.keep_params) {
    const auto params = model_->arena().params();
    std::vector<float> staging;
    const float* p = sim::host_view(model_->arena().memory(), params.data(), static_cast<int64_t>(params.size()),
                                    staging);
    res.params.assign(p, p + params.size());
  }
}

}  // namespace

struct TimedSteps::Impl {
  Trainer trainer;
  Impl(const RunConfig& cfg, const TrainHooks& hooks) : trainer(cfg, "", hooks, BuildInfo{}) {}
};

TimedSteps::TimedSteps(const RunConfig& cfg, dist::Comm* comm) {
  if (cfg.stats_interval != 0 || cfg.capture_step != 0)
    throw Error("TimedSteps: statistics and captures need a run file (train.stats_interval and train.capture_step "
                "must be 0)");
  TrainHooks hooks;
  hooks.out = nullptr;
  hooks.comm = comm;
  impl_ = std::make_unique<Impl>(cfg, hooks);
  impl_->trainer.init_fresh();
}

TimedSteps::~TimedSteps() = default;

TimedSteps::Timing TimedSteps::step() {
  Trainer& t = impl_->trainer;
  const int64_t s = t.steps_done();
  if (t.finished()) throw Error("TimedSteps: all " + std::to_string(s) + " steps of train.steps are done");
  const auto t0 = Clock::now();
  const double comm0 = t.comm_seconds();
  const Trainer::Step st = t.train_step(s, s == 0);
  const Timing timing{seconds_since(t0), t.comm_seconds() - comm0};
  // Every rank holds the same loss and norm (chained sums), so every rank throws.
  if (!st.finite())
    throw dist::CollectiveError("step " + std::to_string(s + 1) + ": the " +
                                (std::isfinite(st.loss) ? "gradient norm" : "loss") + " is not finite");
  return timing;
}

TrainResult train_new(const RunConfig& cfg, const std::string& out_dir, const TrainHooks& hooks,
                      const BuildInfo& build, bool overwrite) {
  if (out_dir.empty()) throw Error("--out DIR is required");
  require_training_memory(cfg, hooks.comm ? hooks.comm->size() : 1);  // before anything in the directory is touched
  const fs::path dir(out_dir);
  const bool root = !hooks.comm || hooks.comm->rank() == 0;  // rank 0 alone touches the directory
  std::optional<io::RunLock> lock;
  if (root) {
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) throw Error("cannot create '" + out_dir + "': " + ec.message());
    // One writer per run directory, before anything in it is touched.
    lock.emplace(dir, "exmy train");
    if (fs::exists(dir / "run.h5", ec) || fs::exists(dir / "checkpoints", ec)) {
      if (!overwrite)
        throw Error("'" + out_dir + "' already holds a run (continue it with --resume " + out_dir +
                    ", or choose another --out)");
      fs::remove(dir / "run.h5", ec);
      fs::remove_all(dir / "checkpoints", ec);
    }
    remove_leftovers(dir);
  }
  Trainer t(cfg, out_dir, hooks, build);
  if (root) write_text_atomic((dir / "config.ini").string(), cfg.text());
  t.init_fresh();
  if (root) t.open_run_file(false);
  return t.run();
}

bool resumable_key(const std::string& key) {
  static const char* const kResumable[] = {
      "train.steps",          "train.threads",           "train.device",           "train.log_interval",
      "train.eval_interval",  "train.eval_batches",   "train.checkpoint_interval", "train.keep_checkpoints", "train.stats_interval",
      "train.capture_step",   "train.gemm_stats_rows",   "train.gemm_stats_sample", "train.cold_restart_references",
      "train.fp32_gemm",
      "train.recompute",      "train.offload",           "train.shard_optimizer",   "train.export_hf",
      "train.comm"};
  if (key.starts_with("eval.")) return true;
  for (const char* k : kResumable)
    if (key == k) return true;
  return false;
}

namespace {

// The configuration text the newest checkpoint of `dir` was written with.
std::string newest_checkpoint_config(const fs::path& dir) {
  const auto ckpts = list_checkpoints((dir / "checkpoints").string());
  if (ckpts.empty()) throw Error("'" + dir.string() + "' has no checkpoint to resume from (checkpoints/ is empty)");
  return checkpoint_config(ckpts.back());
}

}  // namespace

RunConfig resume_config(const std::string& out_dir, std::optional<int64_t> steps,
                        const std::vector<std::string>& overrides, bool allow_changes, bool probe_lock) {
  const fs::path dir(out_dir);
  std::error_code ec;
  if (!fs::exists(dir / "config.ini", ec)) throw Error("'" + out_dir + "' holds no run to resume (no config.ini)");
  if (probe_lock) { const io::RunLock probe(dir, "exmy train --resume"); }  // a live run: say so before reading its checkpoints
  const std::string base = newest_checkpoint_config(dir);
  std::vector<std::string> sets = overrides;
  if (steps) sets.push_back("train.steps=" + std::to_string(*steps));
  RunConfig cfg = parse_run_config(base, (dir / "checkpoints").string(), sets);
  if (!allow_changes) {
    std::string refused;
    for (const auto& [key, change] : changed_keys(parse_run_config(base, "", {}).text(), cfg.text()))
      if (!resumable_key(key)) refused += (refused.empty() ? "" : ", ") + key + " " + change;
    if (!refused.empty())
      throw Error("--resume " + out_dir + " would change what the run computes: " + refused +
                  " (--allow-changes resumes with them anyway; the run then no longer matches an uninterrupted one)");
  }
  return cfg;
}

TrainResult train_resume(const std::string& out_dir, std::optional<int64_t> steps,
                         const std::vector<std::string>& overrides, const TrainHooks& hooks, const BuildInfo& build,
                         bool allow_changes) {
  return train_resume(out_dir,
                      resume_config(out_dir, steps, overrides, allow_changes, !hooks.comm || hooks.comm->rank() == 0),
                      hooks, build);
}

TrainResult train_resume(const std::string& out_dir, const RunConfig& cfg, const TrainHooks& hooks,
                         const BuildInfo& build) {
  const fs::path dir(out_dir);
  require_training_memory(cfg, hooks.comm ? hooks.comm->size() : 1);
  // Every rank has read the run's configuration (resume_config probes the
  // lock) before rank 0 takes the lock; rank 0 alone writes.
  const bool root = !hooks.comm || hooks.comm->rank() == 0;
  if (hooks.comm) hooks.comm->barrier();
  std::optional<io::RunLock> lock;
  if (root) {
    lock.emplace(dir, "exmy train --resume");
    remove_leftovers(dir);
  }
  const auto ckpts = list_checkpoints((dir / "checkpoints").string());
  if (ckpts.empty()) throw Error("'" + out_dir + "' has no checkpoint to resume from (checkpoints/ is empty)");
  const RunConfig before = parse_run_config(checkpoint_config(ckpts.back()), ckpts.back(), {});
  Trainer t(cfg, out_dir, hooks, build);
  t.init_from_checkpoint(ckpts.back());
  // A finished run is left as it is (run() says so); otherwise the run file
  // cut at the checkpoint replaces the old one and records what changed.
  // config.ini stays the configuration the run started with.
  if (!t.finished()) {
    std::string changes;
    for (const auto& [key, change] : changed_keys(before.text(), cfg.text()))
      changes += (changes.empty() ? "" : "; ") + key + " " + change;
    t.note_schedule_change(before);
    if (root) t.open_run_file(true, changes);
  }
  return t.run();
}

}  // namespace exmy::train

#include "sim/train/quant_io.hpp"

#include <cmath>
#include <cstring>
#include <type_traits>
#include <cstdio>
#include <limits>
#include <variant>

#include "formats/error.hpp"
#include "formats/spec.hpp"
#include "formats/vocab.hpp"
#include "sim/io/h5.hpp"

namespace exmy::train {

using io::ElemType;
using sim::quant::CallKey;
using sim::quant::Gemm;
using sim::quant::Role;

// ---------------------------------------------------------------------------
// Statistics
// ---------------------------------------------------------------------------

RunFileStatsSink::LayerPaths& RunFileStatsSink::paths(std::string_view layer) {
  auto it = layers_.find(layer);
  if (it != layers_.end()) return it->second;
  LayerPaths p;
  const std::string name(layer);
  for (Role r : sim::quant::kRoles) {
    const std::string tail = name + "/" + std::string(sim::quant::gemm_name(sim::quant::role_gemm(r))) + "/" +
                             std::string(sim::quant::role_name(r));
    Group& q = p.operand[static_cast<size_t>(r)];
    q.step = "/quant/" + tail + "/step";
    q.micro_batch = "/quant/" + tail + "/micro_batch";
    for (const auto& f : sim::quant::operand_fields()) q.fields.push_back("/quant/" + tail + "/" + f.name);
    Group& h = p.hist[static_cast<size_t>(r)];
    h.step = "/hist/" + tail + "/step";
    h.micro_batch = "/hist/" + tail + "/micro_batch";
    h.fields = {"/hist/" + tail + "/counts", "/hist/" + tail + "/range_counts", "/hist/" + tail + "/scale_codes"};
  }
  for (Gemm g : {Gemm::fprop, Gemm::dgrad, Gemm::wgrad}) {
    const std::string tail = name + "/" + std::string(sim::quant::gemm_name(g));
    Group& m = p.gemm[static_cast<size_t>(g)];
    m.step = "/gemm/" + tail + "/step";
    m.micro_batch = "/gemm/" + tail + "/micro_batch";
    for (const auto& f : sim::quant::gemm_fields()) m.fields.push_back("/gemm/" + tail + "/" + f.name);
    p.gain_mean[static_cast<size_t>(g)].path = "/gemm/" + tail + "/gain_mean";
  }
  return layers_.emplace(name, std::move(p)).first->second;
}

void RunFileStatsSink::declare_layer(const LayerPaths& p) {
  auto group = [&](const Group& g) {
    run_.declare(g.step, ElemType::i64, 0, kStatsChunkRows);
    run_.declare(g.micro_batch, ElemType::i64, 0, kStatsChunkRows);
  };
  for (size_t r = 0; r < p.operand.size(); ++r) {
    group(p.operand[r]);
    const auto& fields = sim::quant::operand_fields();
    for (size_t i = 0; i < fields.size(); ++i)
      run_.declare(p.operand[r].fields[i], fields[i].integer ? ElemType::u64 : ElemType::f64, 0, kStatsChunkRows);
    group(p.hist[r]);
    run_.declare(p.hist[r].fields[0], ElemType::u64, sim::quant::kScaleHistBins, kHistChunkRows);
    run_.declare(p.hist[r].fields[1], ElemType::u64, sim::quant::kRangeHistBins, kHistChunkRows);
    run_.declare(p.hist[r].fields[2], ElemType::u64, sim::quant::kScaleCodeBins, kHistChunkRows);
  }
  for (size_t k = 0; k < p.gemm.size(); ++k) {
    const Group& g = p.gemm[k];
    group(g);
    const auto& fields = sim::quant::gemm_fields();
    for (size_t i = 0; i < fields.size(); ++i)
      run_.declare(g.fields[i], fields[i].integer ? ElemType::u64 : ElemType::f64, 0, kStatsChunkRows);
    run_.declare(p.gain_mean[k].path, ElemType::f64, 0, kStatsChunkRows);
  }
}

void RunFileStatsSink::declare(const std::vector<sim::quant::RecipeLinearFactory::PlanEntry>& plan) {
  for (const auto& e : plan)
    if (e.quantized) declare_layer(paths(e.info.name));
}

void RunFileStatsSink::record_operand(const CallKey& key, const sim::quant::OperandStats& s) {
  LayerPaths& p = paths(key.layer);
  const size_t r = static_cast<size_t>(key.role);
  const Group& q = p.operand[r];
  const auto& fields = sim::quant::operand_fields();
  for (size_t i = 0; i < fields.size(); ++i) {
    const double v = fields[i].get(s);
    if (fields[i].integer) run_.append(q.fields[i], static_cast<uint64_t>(v));
    else run_.append(q.fields[i], v);
  }
  run_.append(q.micro_batch, key.micro_batch);
  run_.append(q.step, key.step);
  const Group& h = p.hist[r];
  run_.append(h.fields[0], std::span<const uint64_t>(s.scale_hist.data(), s.scale_hist.size()));
  run_.append(h.fields[1], std::span<const uint64_t>(s.range_hist.data(), s.range_hist.size()));
  run_.append(h.fields[2], std::span<const uint64_t>(s.scale_codes.data(), s.scale_codes.size()));
  run_.append(h.micro_batch, key.micro_batch);
  run_.append(h.step, key.step);
}

void RunFileStatsSink::record_gemm(const CallKey& key, const sim::quant::GemmStats& s) {
  LayerPaths& p = paths(key.layer);
  const Group& g = p.gemm[static_cast<size_t>(key.gemm)];
  RunningMean& rm = p.gain_mean[static_cast<size_t>(key.gemm)];
  if (!rm.started) {  // a resumed run goes on from the rows before its checkpoint, in row order
    rm.started = true;
    const std::string gain = g.step.substr(0, g.step.size() - 4) + "gain";
    for (double v : run_.f64_column(gain))
      if (std::isfinite(v)) rm.sum += v, ++rm.n;
  }
  if (std::isfinite(s.gain())) rm.sum += s.gain(), ++rm.n;
  run_.append(rm.path, rm.n > 0 ? rm.sum / static_cast<double>(rm.n) : NAN);
  const auto& fields = sim::quant::gemm_fields();
  for (size_t i = 0; i < fields.size(); ++i) {
    const double v = fields[i].get(s);
    if (fields[i].integer) run_.append(g.fields[i], static_cast<uint64_t>(v));
    else run_.append(g.fields[i], v);
  }
  run_.append(g.micro_batch, key.micro_batch);
  run_.append(g.step, key.step);
}

// ---------------------------------------------------------------------------
// Capture
// ---------------------------------------------------------------------------

std::string capture_path(const CallKey& key) {
  return "/capture/step_" + std::to_string(key.step) + "/" + std::string(key.layer) + "/" +
         std::string(sim::quant::gemm_name(key.gemm)) + "/" + std::string(sim::quant::role_name(key.role));
}

std::vector<io::RunFile::Attribute> capture_attributes(const CallKey& key, const QuantSpec& q) {
  using A = io::RunFile::Attribute;
  std::vector<A> a = {
      A{"step", key.step},
      A{"micro_batch", key.micro_batch},
      A{"layer", std::string(key.layer)},
      A{"block_index", static_cast<int64_t>(key.block)},
      A{"kind", std::string(sim::linear_kind_name(key.kind))},
      A{"gemm", std::string(sim::quant::gemm_name(key.gemm))},
      A{"operand", std::string(sim::quant::role_name(key.role))},
  };
  // One attribute per QuantSpec knob (formats/vocab.hpp), typed by its kind;
  // the tensor amax as its policy (none, auto, given) and the given value.
  for (const QuantKnob& k : quant_knobs()) {
    if (std::string_view(k.name) == "tensor_amax") {
      const bool given = q.amax_kind == AmaxKind::given;
      a.push_back(A{k.name, given ? std::string("given") : k.print(q)});
      a.push_back(A{"tensor_amax_value", given ? q.amax_value : std::numeric_limits<double>::quiet_NaN()});
    } else {
      std::visit([&](const auto& v) { a.push_back(A{k.name, v}); }, typed_value(k, q));
    }
  }
  a.push_back(A{"quantize_options", quantize_options(q)});
  return a;
}

void RunFileCaptureSink::capture(const CallKey& key, const QuantSpec& spec, const float* x, int64_t rows,
                                 int64_t cols) {
  if (key.micro_batch != 0) return;
  run_.write_tensor(capture_path(key), x, rows, cols, capture_attributes(key, spec));
  ++tensors_;
}

// ---------------------------------------------------------------------------
// Tensor references in checkpoints
// ---------------------------------------------------------------------------

ReferenceStateLinear::ReferenceStateLinear(std::unique_ptr<sim::Linear<float>> inner,
                                           std::shared_ptr<sim::quant::QuantRuntime> rt, bool cold_restart)
    : sim::Linear<float>(inner->info()), inner_(std::move(inner)), rt_(std::move(rt)), cold_restart_(cold_restart) {}

std::vector<std::pair<std::string, std::string>> ReferenceStateLinear::slots() const {
  std::vector<std::pair<std::string, std::string>> v;
  const std::string prefix = info_.name + "/";
  const auto& states = rt_->references().states();
  for (auto it = states.lower_bound(prefix); it != states.end() && it->first.starts_with(prefix); ++it)
    v.emplace_back(it->first.substr(prefix.size()), it->first);
  return v;
}

void ReferenceStateLinear::save_state(hid_t group) const {
  for (const auto& [slot, key] : slots()) {
    const std::vector<double> v = rt_->references().get(key).save();
    io::h5::write_array(group, slot, v.data(), {static_cast<int64_t>(v.size())});
  }
}

void ReferenceStateLinear::load_state(hid_t group) {
  for (const auto& [slot, key] : slots()) {
    sim::quant::ReferenceState& st = rt_->references().get(key);
    if (cold_restart_) {
      st = sim::quant::ReferenceState{};
      continue;
    }
    const std::vector<double> v = io::h5::read_f64_array(group, slot, "layer state of '" + info_.name + "'");
    try {
      st.load(v);
    } catch (const Error& e) {
      throw Error("tensor reference '" + key + "': " + e.what());
    }
  }
}

TrainingLinearFactory::TrainingLinearFactory(const sim::quant::Recipe& recipe, int64_t num_blocks,
                                             std::shared_ptr<sim::quant::QuantRuntime> rt, bool cold_restart,
                                             std::unique_ptr<sim::LinearFactory<float>> unquantized)
    : recipe_(recipe, num_blocks, rt, std::move(unquantized)), rt_(std::move(rt)), cold_restart_(cold_restart) {}

std::unique_ptr<sim::Linear<float>> TrainingLinearFactory::make(const sim::LinearInfo& info) const {
  auto lin = recipe_.make(info);
  if (!recipe_.plan().back().quantized) return lin;
  return std::make_unique<ReferenceStateLinear>(std::move(lin), rt_, cold_restart_);
}

namespace {

// One record: kind byte (0 operand, 1 GEMM), the key's fields, the layer
// name, then the stats struct as it lies in memory (same binary on every
// rank of a job).
struct KeyFields {
  int32_t block;
  int32_t kind, gemm, role;
  int64_t step, micro_batch;
  uint64_t layer_bytes;
};
static_assert(std::is_trivially_copyable_v<sim::quant::OperandStats>);
static_assert(std::is_trivially_copyable_v<sim::quant::GemmStats>);

template <class Stats>
void append_record(std::string& out, char tag, const sim::quant::CallKey& key, const Stats& stats) {
  const KeyFields k{key.block, static_cast<int32_t>(key.kind), static_cast<int32_t>(key.gemm),
                    static_cast<int32_t>(key.role), key.step, key.micro_batch, key.layer.size()};
  out += tag;
  out.append(reinterpret_cast<const char*>(&k), sizeof k);
  out.append(key.layer);
  out.append(reinterpret_cast<const char*>(&stats), sizeof stats);
}

}  // namespace

void SerializedStatsSink::record_operand(const CallKey& key, const sim::quant::OperandStats& stats) {
  append_record(bytes_, 0, key, stats);
}
void SerializedStatsSink::record_gemm(const CallKey& key, const sim::quant::GemmStats& stats) {
  append_record(bytes_, 1, key, stats);
}

void replay_stats(const std::string& bytes, sim::quant::StatsSink& sink) {
  size_t at = 0;
  auto take = [&](void* dst, size_t n) {
    if (at + n > bytes.size()) throw Error("malformed statistics records from another rank");
    std::memcpy(dst, bytes.data() + at, n);
    at += n;
  };
  while (at < bytes.size()) {
    char tag = 0;
    KeyFields k{};
    take(&tag, 1);
    take(&k, sizeof k);
    std::string layer(k.layer_bytes, '\0');
    take(layer.data(), layer.size());
    CallKey key;
    key.layer = layer;
    key.block = k.block;
    key.kind = static_cast<sim::LinearKind>(k.kind);
    key.gemm = static_cast<sim::quant::Gemm>(k.gemm);
    key.role = static_cast<sim::quant::Role>(k.role);
    key.step = k.step;
    key.micro_batch = k.micro_batch;
    if (tag == 0) {
      sim::quant::OperandStats st;
      take(&st, sizeof st);
      sink.record_operand(key, st);
    } else if (tag == 1) {
      sim::quant::GemmStats st;
      take(&st, sizeof st);
      sink.record_gemm(key, st);
    } else {
      throw Error("malformed statistics records from another rank");
    }
  }
}

}  // namespace exmy::train

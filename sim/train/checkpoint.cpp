#include "sim/train/checkpoint.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "formats/error.hpp"
#include "sim/io/atomic_file.hpp"
#include "sim/io/h5.hpp"

namespace exmy::train {
namespace fs = std::filesystem;
using io::h5::Handle;

namespace {

constexpr int64_t kSchemaVersion = 1;

Handle open_checkpoint(const std::string& path) {
  io::h5::silence_errors();
  std::error_code ec;
  if (!fs::exists(path, ec)) throw Error("checkpoint '" + path + "' does not exist");
  Handle f = io::h5::open_file(path, false);
  if (!f.valid()) throw Error("checkpoint '" + path + "' is not a readable HDF5 file (corrupt or truncated?)");
  Handle root = io::h5::open_root(f.get());
  const auto fmt = io::h5::read_string_attribute(root.get(), "format");
  if (!fmt || *fmt != "exmy-checkpoint") throw Error("'" + path + "' is not an exmy checkpoint");
  return f;
}

int64_t need_int(hid_t obj, const std::string& name, const std::string& path) {
  const auto v = io::h5::read_int_attribute(obj, name);
  if (!v) throw Error("checkpoint '" + path + "' lacks attribute '" + name + "' (corrupt?)");
  return *v;
}

}  // namespace

std::string checkpoint_name(int64_t step) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "step_%08lld.h5", static_cast<long long>(step));
  return buf;
}

void save_checkpoint(const std::string& path, const models::NemotronH<float>& model, const sim::AdamW& opt,
                     const TrainState& state, const CheckpointInfo& info, const ShardStateOf& others) {
  io::h5::silence_errors();
  try {
    io::write_file_atomic(path, [&](const std::string& tmp) {
      // The latest file format checksums the metadata (object headers, the
      // attributes in them); write_array checksums the data.
      Handle f = io::h5::create_file(tmp);
      if (!f.valid()) throw Error("cannot create checkpoint '" + tmp + "'");
      Handle root = io::h5::open_root(f.get());
      using io::h5::write_attribute;
      write_attribute(root.get(), "format", std::string("exmy-checkpoint"));
      write_attribute(root.get(), "schema_version", kSchemaVersion);
      write_attribute(root.get(), "step", state.step);
      write_attribute(root.get(), "data_position", state.data_position);
      write_attribute(root.get(), "data_seed", static_cast<int64_t>(state.data_seed));
      write_attribute(root.get(), "tokens_seen", state.tokens_seen);
      write_attribute(root.get(), "adam_step", opt.steps());
      write_attribute(root.get(), "best_val_loss", state.best_val_loss);
      write_attribute(root.get(), "best_val_step", state.best_val_step);
      write_attribute(root.get(), "elapsed_s", state.elapsed_s);
      write_attribute(root.get(), "config", info.config_text);
      write_attribute(root.get(), "exmy_version", info.exmy_version);
      write_attribute(root.get(), "git_commit", info.git_commit);
      const auto& arena = model.arena();
      const auto& views = arena.layout().views();
      // BF16 working weights: the arena holds the master's rounding, the
      // optimizer (or the rank owning the view) the master itself.
      const bool master = opt.working_weights() == sim::WorkingWeights::bf16;
      std::vector<float> sp, sm, sv;  // a view's tensors on their way from a device
      for (size_t i = 0; i < views.size(); ++i) {
        const auto& v = views[i];
        const int vi = static_cast<int>(i);
        ViewState st;
        if (opt.owns(vi))
          st = {sim::host_view(opt.memory(), opt.exp_avg_of(vi), v.numel, sm),
                sim::host_view(opt.memory(), opt.exp_avg_sq_of(vi), v.numel, sv),
                master ? sim::host_view(opt.memory(), opt.master_of(vi), v.numel, sp) : nullptr};
        else if (others) st = others(vi);
        else throw Error("save_checkpoint: the optimizer state of " + v.name + " is on another rank");
        if (master && !st.master) throw Error("save_checkpoint: no master weights of " + v.name);
        io::h5::write_array(f.get(), "/params/" + v.name,
                            master ? st.master : sim::host_view(arena.memory(), arena.param(vi), v.numel, sp), v.shape);
        io::h5::write_array(f.get(), "/optimizer/exp_avg/" + v.name, st.exp_avg, v.shape);
        io::h5::write_array(f.get(), "/optimizer/exp_avg_sq/" + v.name, st.exp_avg_sq, v.shape);
      }
      const uint64_t rng[2] = {state.data_seed, static_cast<uint64_t>(state.data_position)};
      io::h5::write_array(f.get(), "/rng", rng, {2});
      if (!state.losses.empty())
        io::h5::write_array(f.get(), "/train_losses", state.losses.data(), {static_cast<int64_t>(state.losses.size())});
      Handle ls = io::h5::open_or_create_group(f.get(), "/layer_state");
      for (const auto& lin : model.linears()) {
        if (const auto* st = dynamic_cast<const LayerState*>(lin.get())) {
          Handle g = io::h5::open_or_create_group(ls.get(), lin->info().name);
          st->save_state(g.get());
        }
      }
      if (!io::h5::flush_file(f.get())) throw Error("cannot write checkpoint '" + tmp + "'");
    });
  } catch (const Error& e) {
    // The temporary is gone; the previous checkpoint is as it was.
    const std::string full = io::disk_full_note(path);
    if (full.empty()) throw;
    throw Error("cannot write checkpoint '" + path + "': " + full);
  }
}

void load_checkpoint(const std::string& path, models::NemotronH<float>& model, sim::AdamW& opt, TrainState& state) {
  Handle f = open_checkpoint(path);
  Handle root = io::h5::open_root(f.get());
  const int64_t schema = need_int(root.get(), "schema_version", path);
  if (schema != kSchemaVersion)
    throw Error("checkpoint '" + path + "' has schema version " + std::to_string(schema) + " (this exmy reads " +
                std::to_string(kSchemaVersion) + ")");
  const std::string what = "checkpoint '" + path + "'";
  auto& arena = model.arena();
  const auto& views = arena.layout().views();
  std::vector<float> staging;  // a view's tensor on its way to a device
  auto read = [&](const std::string& name, sim::Memory& mem, float* dst, const sim::ParamView& v) {
    sim::write_through_host(mem, dst, v.numel, staging,
                            [&](float* q) { io::h5::read_array(f.get(), name, q, v.shape, what); });
  };
  for (size_t i = 0; i < views.size(); ++i) {
    const auto& v = views[i];
    const int vi = static_cast<int>(i);
    read("/params/" + v.name, arena.memory(), arena.param(vi), v);
    if (!opt.owns(vi)) continue;
    read("/optimizer/exp_avg/" + v.name, opt.memory(), opt.exp_avg_of(vi), v);
    read("/optimizer/exp_avg_sq/" + v.name, opt.memory(), opt.exp_avg_sq_of(vi), v);
  }
  state.step = need_int(root.get(), "step", path);
  state.data_position = need_int(root.get(), "data_position", path);
  state.data_seed = static_cast<uint64_t>(need_int(root.get(), "data_seed", path));
  state.tokens_seen = need_int(root.get(), "tokens_seen", path);
  state.best_val_step = need_int(root.get(), "best_val_step", path);
  state.best_val_loss = io::h5::read_double_attribute(root.get(), "best_val_loss").value_or(INFINITY);
  state.elapsed_s = io::h5::read_double_attribute(root.get(), "elapsed_s").value_or(0.0);
  opt.set_steps(need_int(root.get(), "adam_step", path));
  opt.master_from_params();  // an offloaded optimizer's master weights are the loaded params
  const auto rng = io::h5::read_u64_array(f.get(), "/rng", what);
  if (rng.size() != 2 || rng[0] != state.data_seed || rng[1] != static_cast<uint64_t>(state.data_position))
    throw Error(what + ": /rng does not match the data position attributes (corrupt?)");
  if (state.step < 0 || state.data_position < 0) throw Error(what + ": negative step or data position (corrupt?)");
  state.losses.clear();
  if (io::h5::path_exists(f.get(), "/train_losses")) {
    state.losses = io::h5::read_f64_array(f.get(), "/train_losses", what);
    if (static_cast<int64_t>(state.losses.size()) != state.step)
      throw Error(what + ": /train_losses holds " + std::to_string(state.losses.size()) + " losses for " +
                  std::to_string(state.step) + " steps (corrupt?)");
  } else {
    state.losses.assign(static_cast<size_t>(state.step), NAN);  // written before losses were kept
  }
  for (const auto& lin : model.linears()) {
    if (auto* st = dynamic_cast<LayerState*>(lin.get())) {
      const std::string g = "/layer_state/" + lin->info().name;
      if (!io::h5::path_exists(f.get(), g)) throw Error(what + " has no state for layer '" + lin->info().name + "'");
      Handle gh = io::h5::open_group(f.get(), g);
      st->load_state(gh.get());
    }
  }
}

std::string checkpoint_config(const std::string& path) {
  Handle f = open_checkpoint(path);
  Handle root = io::h5::open_root(f.get());
  const auto c = io::h5::read_string_attribute(root.get(), "config");
  if (!c) throw Error("checkpoint '" + path + "' holds no configuration (corrupt?)");
  return *c;
}

std::vector<std::string> list_checkpoints(const std::string& dir) {
  std::vector<std::string> v;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return v;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if (n.starts_with("step_") && n.ends_with(".h5") && n.size() == checkpoint_name(0).size())
      v.push_back(e.path().string());
  }
  std::sort(v.begin(), v.end());  // zero-padded step numbers sort by step
  return v;
}

}  // namespace exmy::train

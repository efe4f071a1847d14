#include "models/hf_checkpoint.hpp"

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "formats/error.hpp"
#include "models/safetensors.hpp"
#include "sim/io/atomic_file.hpp"

namespace exmy::models {
namespace fs = std::filesystem;

namespace {

std::string strip_prefix(const std::string& name) {
  for (const char* p : {"backbone.", "model."})
    if (name.starts_with(p)) return name.substr(std::strlen(p));
  return name;
}

std::vector<std::string> weight_files(const std::string& path) {
  if (!fs::is_directory(path)) return {path};
  const fs::path dir(path);
  if (fs::exists(dir / "model.safetensors")) return {(dir / "model.safetensors").string()};
  const fs::path index = dir / "model.safetensors.index.json";
  if (!fs::exists(index))
    throw Error("no model.safetensors or model.safetensors.index.json in '" + path + "'");
  std::ifstream in(index);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception&) {
    throw Error(index.string() + ": not valid JSON");
  }
  std::set<std::string> files;
  if (!j.contains("weight_map") || !j["weight_map"].is_object()) throw Error(index.string() + ": no weight_map");
  for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) files.insert(it->get<std::string>());
  std::vector<std::string> out;
  for (const auto& f : files) out.push_back((dir / f).string());
  return out;
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::string r = "(";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) r += ',';
    r += std::to_string(s[i]);
  }
  return r + ")";
}

int64_t numel(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

}  // namespace

template <class T>
void load_hf_weights(NemotronH<T>& model, const std::string& path) {
  auto& arena = model.arena();
  const auto& layout = arena.layout();
  std::vector<bool> seen(layout.views().size(), false);
  std::vector<T> staging;  // a tensor on its way to a device arena
  for (const auto& file : weight_files(path)) {
    SafetensorsReader st(file);
    for (const auto& t : st.tensors()) {
      if (t.name.starts_with("mtp.")) continue;
      const std::string name = strip_prefix(t.name);
      const int i = layout.find(name);
      if (i < 0) throw Error(file + ": unexpected tensor '" + t.name + "' (not a parameter of this model config)");
      const sim::ParamView& v = layout.view(i);
      // HF's conv1d weight is (C,1,K); accept (C,K) too.
      if (numel(t.shape) != v.numel || (t.shape != v.shape && !name.ends_with("conv1d.weight")))
        throw Error(file + ": tensor '" + t.name + "' has shape " + shape_str(t.shape) + " but the config needs " +
                    shape_str(v.shape));
      sim::write_through_host(arena.memory(), arena.param(i), v.numel, staging, [&](T* q) { st.read(t, q); });
      seen[static_cast<size_t>(i)] = true;
    }
  }
  for (size_t i = 0; i < seen.size(); ++i)
    if (!seen[i]) throw Error("checkpoint '" + path + "' has no tensor for parameter '" + layout.views()[i].name + "'");
}

template <class T>
void save_hf_checkpoint(const NemotronH<T>& model, const std::string& dir, const std::string& dtype) {
  if (dtype != "F32" && dtype != "BF16") throw Error("checkpoint dtype '" + dtype + "' (expected F32 or BF16)");
  fs::create_directories(dir);
  const auto& arena = model.arena();
  std::vector<StSource> src;
  // A device arena's parameters, copied to the host (one copy for all).
  std::vector<T> staging;
  const T* host = sim::host_view(arena.memory(), arena.params().data(), static_cast<int64_t>(arena.params().size()),
                                 staging);
  for (size_t i = 0; i < arena.layout().views().size(); ++i) {
    const sim::ParamView& v = arena.layout().views()[i];
    StSource s;
    s.name = (v.name == "lm_head.weight" ? "" : "backbone.") + v.name;
    s.shape = v.shape;
    s.dtype = dtype;
    if constexpr (std::is_same_v<T, float>) s.f32 = host + v.offset;
    else s.f64 = host + v.offset;
    src.push_back(std::move(s));
  }
  write_safetensors((fs::path(dir) / "model.safetensors").string(), src, {{"format", "pt"}});
  const std::string cfg_path = (fs::path(dir) / "config.json").string();
  io::write_text_atomic(cfg_path, config_to_json(model.config(), dtype == "BF16" ? "bfloat16" : "float32"));
}

template void load_hf_weights<float>(NemotronH<float>&, const std::string&);
template void load_hf_weights<double>(NemotronH<double>&, const std::string&);
template void save_hf_checkpoint<float>(const NemotronH<float>&, const std::string&, const std::string&);
template void save_hf_checkpoint<double>(const NemotronH<double>&, const std::string&, const std::string&);

}  // namespace exmy::models

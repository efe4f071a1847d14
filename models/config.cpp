#include "models/config.hpp"

#include <charconv>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <fstream>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <variant>

#include "formats/error.hpp"
#include "formats/vocab.hpp"
#include "models/mixer.hpp"

namespace exmy::models {
namespace {

using Cfg = NemotronHConfig;
using Member = std::variant<int64_t Cfg::*, double Cfg::*, bool Cfg::*, std::string Cfg::*, std::array<double, 2> Cfg::*>;

struct Field {
  const char* name;
  Member member;
};

// The one list of fields. Order is the order of describe() and of the
// written config.json.
const std::vector<Field>& fields() {
  static const std::vector<Field> f = {
      {"vocab_size", &Cfg::vocab_size},
      {"hidden_size", &Cfg::hidden_size},
      {"intermediate_size", &Cfg::intermediate_size},
      {"num_hidden_layers", &Cfg::num_hidden_layers},
      {"hybrid_override_pattern", &Cfg::hybrid_override_pattern},
      {"num_attention_heads", &Cfg::num_attention_heads},
      {"num_key_value_heads", &Cfg::num_key_value_heads},
      {"head_dim", &Cfg::head_dim},
      {"mamba_num_heads", &Cfg::mamba_num_heads},
      {"mamba_head_dim", &Cfg::mamba_head_dim},
      {"ssm_state_size", &Cfg::ssm_state_size},
      {"n_groups", &Cfg::n_groups},
      {"conv_kernel", &Cfg::conv_kernel},
      {"chunk_size", &Cfg::chunk_size},
      {"expand", &Cfg::expand},
      {"layer_norm_epsilon", &Cfg::layer_norm_epsilon},
      {"time_step_limit", &Cfg::time_step_limit},
      {"time_step_min", &Cfg::time_step_min},
      {"time_step_max", &Cfg::time_step_max},
      {"time_step_floor", &Cfg::time_step_floor},
      {"initializer_range", &Cfg::initializer_range},
      {"rescale_prenorm_residual", &Cfg::rescale_prenorm_residual},
      {"use_bias", &Cfg::use_bias},
      {"use_conv_bias", &Cfg::use_conv_bias},
      {"mamba_proj_bias", &Cfg::mamba_proj_bias},
      {"mlp_bias", &Cfg::mlp_bias},
      {"attention_bias", &Cfg::attention_bias},
      {"residual_in_fp32", &Cfg::residual_in_fp32},
      {"tie_word_embeddings", &Cfg::tie_word_embeddings},
      {"mlp_hidden_act", &Cfg::mlp_hidden_act},
      {"mamba_hidden_act", &Cfg::mamba_hidden_act},
      {"max_position_embeddings", &Cfg::max_position_embeddings},
  };
  return f;
}

// Older and newer HF spellings of the same fields.
const std::vector<std::pair<const char*, const char*>>& aliases() {
  static const std::vector<std::pair<const char*, const char*>> a = {
      {"attention_head_dim", "head_dim"},     {"mamba_n_groups", "n_groups"},
      {"mamba_d_conv", "conv_kernel"},        {"mamba_chunk_size", "chunk_size"},
      {"mamba_expand", "expand"},             {"mamba_dt_min", "time_step_min"},
      {"mamba_dt_max", "time_step_max"},      {"mamba_dt_limit", "time_step_limit"},
      {"mamba_dt_init_floor", "time_step_floor"}, {"mamba_conv_bias", "use_conv_bias"},
      {"rms_norm_eps", "layer_norm_epsilon"},
  };
  return a;
}

const Field* find_field(std::string_view name) {
  for (const auto& f : fields())
    if (name == f.name) return &f;
  for (const auto& [alias, real] : aliases())
    if (name == alias) return find_field(real);
  return nullptr;
}

std::string known_fields() {
  std::string s;
  for (const auto& f : fields()) s += (s.empty() ? "" : ", ") + std::string(f.name);
  return s;
}

[[noreturn]] void bad_value(std::string_view key, std::string_view value, const char* expected) {
  throw Error("model." + std::string(key) + ": bad value '" + std::string(value) + "' (expected " + expected + ")");
}

int64_t parse_int(std::string_view key, std::string_view v) {
  int64_t x = 0;
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
  if (ec != std::errc() || p != v.data() + v.size()) bad_value(key, v, "an integer");
  return x;
}

double parse_double(std::string_view key, std::string_view v) {
  const std::string s(v);
  if (s == "inf" || s == "Infinity" || s == "+inf") return std::numeric_limits<double>::infinity();
  if (s == "-inf" || s == "-Infinity") return -std::numeric_limits<double>::infinity();
  char* end = nullptr;
  const double x = std::strtod(s.c_str(), &end);
  if (s.empty() || end != s.c_str() + s.size() || std::isnan(x)) bad_value(key, v, "a number");
  return x;
}

// The one boolean spelling of formats/vocab.hpp (true/false, on/off), as
// recipes and run configurations read it.
bool parse_bool(std::string_view key, std::string_view v) {
  try {
    return parse_bool_word(v);
  } catch (const Error&) {
    bad_value(key, v, "true or false");
  }
}

std::string fmt_double(double x) {
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", x);
  // Shortest form that reads back the same.
  for (int prec = 1; prec <= 17; ++prec) {
    char t[64];
    std::snprintf(t, sizeof t, "%.*g", prec, x);
    if (std::strtod(t, nullptr) == x) return t;
  }
  return buf;
}

void set_field(Cfg& cfg, const Field& f, std::string_view value) {
  const std::string_view key = f.name;
  std::visit(
      [&](auto m) {
        using V = std::remove_reference_t<decltype(cfg.*m)>;
        if constexpr (std::is_same_v<V, int64_t>) cfg.*m = parse_int(key, value);
        else if constexpr (std::is_same_v<V, double>) cfg.*m = parse_double(key, value);
        else if constexpr (std::is_same_v<V, bool>) cfg.*m = parse_bool(key, value);
        else if constexpr (std::is_same_v<V, std::string>) cfg.*m = std::string(value);
        else {
          // "lo,hi" (brackets allowed)
          std::string s(value);
          std::erase_if(s, [](char c) { return c == '[' || c == ']' || c == '(' || c == ')' || c == ' '; });
          const size_t comma = s.find(',');
          if (comma == std::string::npos) bad_value(key, value, "two numbers 'lo,hi'");
          cfg.*m = {parse_double(key, s.substr(0, comma)), parse_double(key, s.substr(comma + 1))};
        }
      },
      f.member);
  if (key == "hybrid_override_pattern") cfg.num_hidden_layers = static_cast<int64_t>(cfg.hybrid_override_pattern.size());
}

std::string field_value(const Cfg& cfg, const Field& f) {
  return std::visit(
      [&](auto m) -> std::string {
        using V = std::remove_cvref_t<decltype(cfg.*m)>;
        if constexpr (std::is_same_v<V, int64_t>) return std::to_string(cfg.*m);
        else if constexpr (std::is_same_v<V, double>) return fmt_double(cfg.*m);
        else if constexpr (std::is_same_v<V, bool>) return cfg.*m ? "true" : "false";
        else if constexpr (std::is_same_v<V, std::string>) return cfg.*m;
        else return fmt_double((cfg.*m)[0]) + "," + fmt_double((cfg.*m)[1]);
      },
      f.member);
}

// Python's json module writes Infinity, -Infinity and NaN, which strict JSON
// parsers reject; HF configs contain them (time_step_limit). Outside strings
// they become the strings "Infinity", "-Infinity", "NaN", which the field
// parser reads back as numbers.
std::string quote_nonfinite(std::string_view text) {
  std::string out;
  out.reserve(text.size() + 16);
  bool in_str = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_str) {
      out += c;
      if (c == '\\' && i + 1 < text.size()) out += text[++i];
      else if (c == '"') in_str = false;
      continue;
    }
    if (c == '"') {
      in_str = true;
      out += c;
      continue;
    }
    bool matched = false;
    for (std::string_view tok : {"-Infinity", "Infinity", "NaN"}) {
      if (text.substr(i, tok.size()) == tok) {
        out += '"';
        out += tok;
        out += '"';
        i += tok.size() - 1;
        matched = true;
        break;
      }
    }
    if (!matched) out += c;
  }
  return out;
}

std::string json_scalar_text(const nlohmann::json& v) {
  if (v.is_string()) return v.get<std::string>();
  // transformers 5 writes non-finite floats as {"__float__": "Infinity"}.
  if (v.is_object() && v.contains("__float__") && v["__float__"].is_string()) return v["__float__"].get<std::string>();
  if (v.is_boolean()) return v.get<bool>() ? "true" : "false";
  if (v.is_number_integer()) return std::to_string(v.get<int64_t>());
  if (v.is_number()) return fmt_double(v.get<double>());
  return v.dump();
}

}  // namespace

int64_t NemotronHConfig::count_layers(char type) const {
  return static_cast<int64_t>(std::count(hybrid_override_pattern.begin(), hybrid_override_pattern.end(), type));
}

std::vector<std::string> field_names() {
  std::vector<std::string> n;
  for (const auto& f : fields()) n.emplace_back(f.name);
  return n;
}

void apply_override(NemotronHConfig& cfg, std::string_view key, std::string_view value) {
  if (key.starts_with("model.")) key.remove_prefix(6);
  const Field* f = find_field(key);
  if (!f) throw Error("unknown model field '" + std::string(key) + "' (known: " + known_fields() + ")");
  set_field(cfg, *f, value);
}

void apply_override(NemotronHConfig& cfg, std::string_view assignment) {
  const size_t eq = assignment.find('=');
  if (eq == std::string_view::npos)
    throw Error("bad override '" + std::string(assignment) + "' (expected model.FIELD=VALUE)");
  apply_override(cfg, assignment.substr(0, eq), assignment.substr(eq + 1));
}

std::string describe(const NemotronHConfig& cfg) {
  std::string s;
  for (const auto& f : fields()) s += std::string(f.name) + " = " + field_value(cfg, f) + "\n";
  return s;
}

NemotronHConfig config_from_json_text(std::string_view text, std::string_view origin) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(quote_nonfinite(text));
  } catch (const nlohmann::json::exception& e) {
    std::string msg = e.what();
    std::replace(msg.begin(), msg.end(), '\n', ' ');
    throw Error(std::string(origin) + ": not valid JSON (" + msg + ")");
  }
  if (!j.is_object()) throw Error(std::string(origin) + ": expected a JSON object");
  if (j.contains("model_type") && j["model_type"].is_string() && j["model_type"] != "nemotron_h")
    throw Error(std::string(origin) + ": model_type is '" + j["model_type"].get<std::string>() +
                "' (expected nemotron_h)");
  NemotronHConfig cfg;
  cfg.name = std::string(origin);
  bool have_layers = false;
  int64_t layers = 0;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& key = it.key();
    const nlohmann::json& v = it.value();
    if (v.is_null()) continue;
    if (key == "layers_block_type" || key == "layer_types") {
      // transformers 5: one name per block instead of the pattern string.
      if (!v.is_array()) throw Error(std::string(origin) + ": " + key + " must be a list");
      std::string pattern;
      for (const auto& t : v) {
        const std::string s = t.is_string() ? t.get<std::string>() : t.dump();
        if (s == "mamba" || s == "linear_attention") pattern += 'M';
        else if (s == "attention" || s == "full_attention") pattern += '*';
        else if (s == "mlp") pattern += '-';
        else if (s == "moe") pattern += 'E';
        else throw Error(std::string(origin) + ": unknown block type '" + s + "' in " + key +
                         " (expected mamba, attention, mlp)");
      }
      cfg.hybrid_override_pattern = pattern;
      if (!have_layers) cfg.num_hidden_layers = static_cast<int64_t>(pattern.size());
      continue;
    }
    const Field* f = find_field(key);
    if (!f) continue;
    if (key == "num_hidden_layers") {
      have_layers = true;
      layers = v.get<int64_t>();
    }
    if (v.is_array()) {
      std::string s;
      for (const auto& e : v) s += (s.empty() ? "" : ",") + json_scalar_text(e);
      set_field(cfg, *f, s);
    } else {
      set_field(cfg, *f, json_scalar_text(v));
    }
  }
  // The pattern setter derives num_hidden_layers; an explicit value wins so
  // that validate() can report a mismatch.
  if (have_layers) cfg.num_hidden_layers = layers;
  return cfg;
}

NemotronHConfig load_config_json(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot open model config '" + path + "'");
  std::stringstream ss;
  ss << in.rdbuf();
  return config_from_json_text(ss.str(), path);
}

NemotronHConfig resolve_config(const std::string& spec) {
  for (const auto& n : preset_names())
    if (spec == n) return preset_config(spec);
  if (spec.ends_with(".json")) return load_config_json(spec);
  std::ifstream probe(spec + "/config.json");
  if (probe) return load_config_json(spec + "/config.json");
  std::string names;
  for (const auto& n : preset_names()) names += (names.empty() ? "" : ", ") + n;
  throw Error("unknown model '" + spec + "' (expected a preset: " + names + "; or a config.json path)");
}

std::string config_to_json(const NemotronHConfig& cfg, const std::string& torch_dtype) {
  nlohmann::ordered_json j;
  j["architectures"] = {"NemotronHForCausalLM"};
  j["model_type"] = "nemotron_h";
  if (!torch_dtype.empty()) {
    j["torch_dtype"] = torch_dtype;
    j["dtype"] = torch_dtype;
  }
  for (const auto& f : fields()) {
    std::visit(
        [&](auto m) {
          using V = std::remove_cvref_t<decltype(cfg.*m)>;
          if constexpr (std::is_same_v<V, std::array<double, 2>>) {
            nlohmann::ordered_json a = nlohmann::ordered_json::array();
            for (double x : cfg.*m) {
              if (std::isfinite(x)) a.push_back(x);
              else a.push_back({{"__float__", std::isnan(x) ? "NaN" : x > 0 ? "Infinity" : "-Infinity"}});
            }
            j[f.name] = a;
          } else {
            j[f.name] = cfg.*m;
          }
        },
        f.member);
  }
  return j.dump(2) + "\n";
}

void require_positive(std::initializer_list<std::pair<const char*, int64_t>> fields) {
  for (const auto& [name, v] : fields)
    if (v <= 0) throw Error(std::string("model.") + name + " must be positive (got " + std::to_string(v) + ")");
}

std::string config_double(double x) { return fmt_double(x); }

void validate(const NemotronHConfig& c) {
  const std::string& p = c.hybrid_override_pattern;
  if (p.empty()) throw Error("model.hybrid_override_pattern is empty (expected letters M, * and -)");
  for (size_t i = 0; i < p.size(); ++i) {
    const char ch = p[i];
    if (ch == 'E')
      throw Error("model.hybrid_override_pattern: MoE blocks ('E' at position " + std::to_string(i) +
                  ") are not supported (expected M, * or -)");
    if (!find_mixer_kind(ch))
      throw Error("model.hybrid_override_pattern: unknown layer letter '" + std::string(1, ch) + "' at position " +
                  std::to_string(i) + " (expected M = Mamba-2, * = attention, - = MLP)");
  }
  if (c.num_hidden_layers != static_cast<int64_t>(p.size()))
    throw Error("model.num_hidden_layers = " + std::to_string(c.num_hidden_layers) +
                " does not match the pattern's " + std::to_string(p.size()) + " layers");
  require_positive({{"vocab_size", c.vocab_size}, {"hidden_size", c.hidden_size}});
  // Each mixer in the pattern checks the fields it reads.
  for (const MixerKind& k : mixer_kinds())
    if (c.count_layers(k.letter)) k.ops.validate(c);
  if (!(c.layer_norm_epsilon >= 0) || !std::isfinite(c.layer_norm_epsilon))
    throw Error("model.layer_norm_epsilon = " + fmt_double(c.layer_norm_epsilon) + " (expected a number >= 0)");
  if (!(c.initializer_range >= 0))
    throw Error("model.initializer_range = " + fmt_double(c.initializer_range) + " (expected >= 0)");
  for (auto [name, on] : {std::pair{"use_bias", c.use_bias}, std::pair{"mamba_proj_bias", c.mamba_proj_bias},
                          std::pair{"mlp_bias", c.mlp_bias}, std::pair{"attention_bias", c.attention_bias}})
    if (on) throw Error(std::string("model.") + name + " = true is not supported (Nemotron-H has no linear biases)");
  if (c.tie_word_embeddings)
    throw Error("model.tie_word_embeddings = true is not supported (Nemotron-H has an untied LM head)");
  if (c.mlp_hidden_act != "relu2")
    throw Error("model.mlp_hidden_act = '" + c.mlp_hidden_act + "' is not supported (expected relu2)");
  if (c.mamba_hidden_act != "silu" && c.mamba_hidden_act != "swish")
    throw Error("model.mamba_hidden_act = '" + c.mamba_hidden_act + "' is not supported (expected silu)");
}

// ---------------------------------------------------------------------------
// Presets
// ---------------------------------------------------------------------------

namespace {

// The 8B's (and the 4B's) block pattern: 24 Mamba-2/MLP pairs, an
// attention block inside pairs 4, 9, 14 and 19 (between the pair's Mamba-2
// and MLP blocks).
constexpr const char* k8bPattern = "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-";

// The 8B's pattern cut after its first `pairs` Mamba-2/MLP pairs (at an MLP
// block): 11 pairs "M-M-M-M*-M-M-M-M-M*-M-M-", 24 the whole pattern.
std::string pattern_8b_prefix(int64_t pairs) {
  const std::string p = k8bPattern;
  size_t end = 0;
  for (int64_t i = 0; i < pairs; ++i) {
    end = p.find('-', end);
    if (end == std::string::npos) throw Error("the 8B's pattern has fewer than " + std::to_string(pairs) + " pairs");
    ++end;
  }
  return p.substr(0, end);
}

// Published configurations (NVIDIA's config.json files for the -Base-8K
// checkpoints; Megatron-Bridge's NemotronH providers give the same numbers).
Cfg nemotron_h(const char* name, int64_t hidden, int64_t inter, const std::string& pattern, int64_t heads,
               int64_t mamba_heads, int64_t state) {
  Cfg c;
  c.name = name;
  c.vocab_size = 131072;
  c.hidden_size = hidden;
  c.intermediate_size = inter;
  c.hybrid_override_pattern = pattern;
  c.num_hidden_layers = static_cast<int64_t>(c.hybrid_override_pattern.size());
  c.num_attention_heads = heads;
  c.num_key_value_heads = 8;
  c.head_dim = 128;
  c.mamba_num_heads = mamba_heads;
  c.mamba_head_dim = 64;
  c.ssm_state_size = state;
  c.n_groups = 8;
  c.conv_kernel = 4;
  c.chunk_size = 128;
  c.max_position_embeddings = 8192;
  return c;
}

// Proxies keep the 8B's shape: Mamba-2 and MLP blocks alternating, an
// attention block every ~5th pair, GQA, 64-wide heads where the width allows,
// and a byte-level vocabulary (256) so the LM head does not dominate;
// --set model.vocab_size=... for other tokenizers.
Cfg proxy(const char* name, int64_t hidden, int64_t inter, const char* pattern, int64_t heads, int64_t kv,
          int64_t hd, int64_t mheads, int64_t mhd, int64_t state, int64_t groups, int64_t chunk, int64_t vocab) {
  Cfg c;
  c.name = name;
  c.vocab_size = vocab;
  c.hidden_size = hidden;
  c.intermediate_size = inter;
  c.hybrid_override_pattern = pattern;
  c.num_hidden_layers = static_cast<int64_t>(c.hybrid_override_pattern.size());
  c.num_attention_heads = heads;
  c.num_key_value_heads = kv;
  c.head_dim = hd;
  c.mamba_num_heads = mheads;
  c.mamba_head_dim = mhd;
  c.ssm_state_size = state;
  c.n_groups = groups;
  c.conv_kernel = 4;
  c.chunk_size = chunk;
  c.max_position_embeddings = 8192;
  return c;
}

// GPU proxies: the 8B's blocks at a smaller width and depth. Every size the
// 8B fixes is the 8B's: head_dim 128 with heads x head_dim = hidden, Mamba
// head dim 64 with expand 2 (mamba heads = hidden / 32), ssm_state 128,
// 8 groups, conv kernel 4, chunk 128, the squared-ReLU MLP at the 8B's
// 21504 / 4096 = 5.25 x hidden; the pattern is the 8B's own, cut after
// `pairs` Mamba-2/MLP pairs; `kv` KV heads (the 8B's 4 query heads per KV
// head where the head count allows). Byte vocabulary (256) as the other
// proxies: the 8B's 131,072 would be 2 x 131072 x hidden parameters of
// embedding and LM head (201M at hidden 768, more than the whole 125M), see
// docs/models.md.
Cfg gpu_proxy(const char* name, int64_t hidden, int64_t kv, int64_t pairs) {
  Cfg c = nemotron_h(name, hidden, hidden * 21504 / 4096, pattern_8b_prefix(pairs), hidden / 128, hidden / 32, 128);
  c.num_key_value_heads = kv;
  c.vocab_size = 256;
  return c;
}

const std::vector<std::pair<std::string, std::function<Cfg()>>>& presets() {
  static const std::vector<std::pair<std::string, std::function<Cfg()>>> p = {
      {"nemotron-h-4b",
       [] {
         return nemotron_h("nemotron-h-4b", 3072, 12288, k8bPattern, 32,
                           112, 128);
       }},
      {"nemotron-h-8b",
       [] {
         return nemotron_h("nemotron-h-8b", 4096, 21504, k8bPattern, 32,
                           128, 128);
       }},
      {"nemotron-h-47b",
       [] {
         return nemotron_h("nemotron-h-47b", 8192, 30720,
                           "M-M-M-M-M-M-M-M-M*-M-M-M-M-M-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-M-M---MM---M-M*-M-"
                           "M-M-M-M-",
                           64, 256, 256);
       }},
      {"nemotron-h-56b",
       [] {
         return nemotron_h("nemotron-h-56b", 8192, 32768,
                           "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-"
                           "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-",
                           64, 256, 256);
       }},
      // Tests: every block type, several chunks in a 20-token sequence, GQA,
      // two SSM groups; a forward+backward takes milliseconds.
      {"proxy-tiny", [] { return proxy("proxy-tiny", 32, 64, "M-*M-", 4, 2, 8, 4, 8, 8, 2, 8, 64); }},
      {"proxy-1m", [] { return proxy("proxy-1m", 128, 512, "M-M-M*-M-", 4, 2, 32, 8, 32, 32, 1, 64, 256); }},
      {"proxy-10m",
       [] { return proxy("proxy-10m", 256, 1024, "M-M-M-M*-M-M-M-M-M*-M-", 4, 2, 64, 8, 64, 64, 2, 128, 256); }},
      {"proxy-50m",
       [] {
         return proxy("proxy-50m", 512, 2048, "M-M-M-M*-M-M-M-M-M*-M-M-M-M-", 8, 2, 64, 16, 64, 64, 2, 128, 256);
       }},
      // GPU proxies (gpu_proxy above): hidden 768, 1024, 1536; 11, 18 and
      // all 24 of the 8B's pairs; 6, 8 and 12 attention heads over 2, 2 and
      // 3 KV heads.
      {"proxy-125m", [] { return gpu_proxy("proxy-125m", 768, 2, 11); }},
      {"proxy-350m", [] { return gpu_proxy("proxy-350m", 1024, 2, 18); }},
      {"proxy-1b", [] { return gpu_proxy("proxy-1b", 1536, 3, 24); }},
  };
  return p;
}

}  // namespace

const std::vector<std::string>& preset_names() {
  static const std::vector<std::string> n = [] {
    std::vector<std::string> v;
    for (const auto& [name, make] : presets()) v.push_back(name);
    return v;
  }();
  return n;
}

std::string preset_list() {
  std::string s, family;
  for (const auto& n : preset_names()) {
    const size_t dash = n.rfind('-');
    const std::string f = n.substr(0, dash + 1);
    if (!s.empty() && f == family) {
      s += "/" + n.substr(dash + 1);
    } else {
      s += (s.empty() ? "" : ", ") + n;
      family = f;
    }
  }
  return s;
}

NemotronHConfig preset_config(std::string_view name) {
  for (const auto& [n, make] : presets())
    if (n == name) return make();
  std::string names;
  for (const auto& n : preset_names()) names += (names.empty() ? "" : ", ") + n;
  throw Error("unknown model preset '" + std::string(name) + "' (expected " + names + ")");
}

// ---------------------------------------------------------------------------
// Layout, FLOPs
// ---------------------------------------------------------------------------

sim::ArenaLayout make_layout(const NemotronHConfig& c) {
  sim::ArenaLayout L;
  const int64_t H = c.hidden_size;
  L.add("embeddings.weight", {c.vocab_size, H}, true);
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = "layers." + std::to_string(i) + ".";
    add_param(L, p + "norm.weight", {H}, false, ParamInit::ones);
    mixer_kind(c.hybrid_override_pattern[static_cast<size_t>(i)]).ops.add_params(L, c, p + "mixer.");
  }
  add_param(L, "norm_f.weight", {H}, false, ParamInit::ones);
  L.add("lm_head.weight", {c.vocab_size, H}, true);
  return L;
}

std::vector<ComponentCount> parameter_breakdown(const NemotronHConfig& c) {
  const sim::ArenaLayout L = make_layout(c);
  std::vector<ComponentCount> rows;
  auto add = [&](const std::string& block, const std::string& comp, int64_t n, int64_t layers) {
    for (auto& r : rows)
      if (r.block == block && r.component == comp) {
        r.per_layer += n;
        return;
      }
    ComponentCount r;
    r.block = block;
    r.component = comp;
    r.per_layer = n;
    r.layers = layers;
    rows.push_back(r);
  };
  auto component = [](std::string name) {
    // "layers.3.mixer.conv1d.bias" -> "conv1d"; "layers.3.norm.weight" -> "pre_norm"
    name = name.substr(name.find('.', name.find('.') + 1) + 1);
    if (name == "norm.weight") return std::string("pre_norm");
    if (name == "mixer.norm.weight") return std::string("gated_norm");
    if (name.starts_with("mixer.")) name = name.substr(6);
    for (const char* suffix : {".weight", ".bias"})
      if (name.ends_with(suffix)) name.resize(name.size() - std::strlen(suffix));
    return name;
  };
  add("embeddings", "embeddings", L.get("embeddings.weight").numel, 1);
  // Every block of a type has the same shapes, so layer 0 of each type gives
  // the per-layer counts.
  for (const MixerKind& k : mixer_kinds()) {
    const size_t first = c.hybrid_override_pattern.find(k.letter);
    if (first == std::string::npos) continue;
    const std::string prefix = "layers." + std::to_string(first) + ".";
    for (const auto& v : L.views())
      if (v.name.starts_with(prefix)) add(k.block, component(v.name), v.numel, c.count_layers(k.letter));
  }
  add("final", "norm_f", L.get("norm_f.weight").numel, 1);
  add("final", "lm_head", L.get("lm_head.weight").numel, 1);
  return rows;
}

int64_t parameter_count(const NemotronHConfig& c) { return make_layout(c).num_params(); }

FlopCount flops_per_token(const NemotronHConfig& c, int64_t seq_len) {
  FlopCount f;
  const double H = static_cast<double>(c.hidden_size);
  for (char t : c.hybrid_override_pattern) mixer_kind(t).ops.add_flops(f, c, seq_len);
  f.linear += 2 * H * static_cast<double>(c.vocab_size);
  return f;
}

}  // namespace exmy::models

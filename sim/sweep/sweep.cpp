#include "sim/sweep/sweep.hpp"

#include <charconv>
#include <cstdio>
#include <filesystem>
#include <set>

#include "formats/error.hpp"
#include "sim/quant/ini.hpp"

namespace exmy::sweep {
namespace fs = std::filesystem;

namespace {

std::string trim(const std::string& s) {
  size_t a = 0, b = s.size();
  while (a < b && (s[a] == ' ' || s[a] == '\t')) ++a;
  while (b > a && (s[b - 1] == ' ' || s[b - 1] == '\t')) --b;
  return s.substr(a, b - a);
}

// section.key with a non-empty section and key.
bool valid_key(const std::string& k) {
  const size_t dot = k.find('.');
  if (dot == std::string::npos || dot == 0 || k.back() == '.') return false;
  for (char c : k)
    if (c == ' ' || c == '\t' || c == '=' || c == ',' || c == '"') return false;
  return true;
}

double parse_double(const std::string& v, const std::string& what) {
  try {
    size_t used = 0;
    const double x = std::stod(v, &used);
    if (used == v.size()) return x;
  } catch (const std::exception&) {
  }
  throw Error(what + ": expected a number, got '" + v + "'");
}

// "key=value, key=value"
std::vector<Assignment> parse_assignments(const std::string& list, const std::string& what) {
  std::vector<Assignment> out;
  for (const auto& item : split_values(list, what)) {
    const size_t eq = item.find('=');
    if (eq == std::string::npos || eq == 0)
      throw Error(what + ": expected key=value, got '" + item + "'");
    out.emplace_back(trim(item.substr(0, eq)), trim(item.substr(eq + 1)));
  }
  return out;
}

// The line of the header [section] in `text` (0 when not found).
int header_line(const std::string& text, const std::string& section) {
  int line = 1;
  size_t a = 0;
  while (a <= text.size()) {
    size_t b = text.find('\n', a);
    if (b == std::string::npos) b = text.size();
    if (trim(text.substr(a, b - a)).starts_with("[" + section + "]")) return line;
    a = b + 1;
    ++line;
  }
  return 0;
}

}  // namespace

std::string canonical_key(const std::string& key) { return key == "recipe" ? "train.recipe" : key; }

std::vector<std::string> split_values(const std::string& list, const std::string& what) {
  std::vector<std::string> out;
  std::string cur;
  bool quoted = false, was_quoted = false;
  auto finish = [&] {
    std::string v = was_quoted ? cur : trim(cur);
    if (v.empty() && !was_quoted) throw Error(what + ": empty value in '" + list + "'");
    out.push_back(v);
    cur.clear();
    was_quoted = false;
  };
  for (size_t i = 0; i < list.size(); ++i) {
    const char c = list[i];
    if (c == '"') {
      if (!quoted && !trim(cur).empty()) throw Error(what + ": a quote in the middle of a value in '" + list + "'");
      if (quoted) {
        // After the closing quote only blanks may come before the comma.
        size_t j = i + 1;
        while (j < list.size() && (list[j] == ' ' || list[j] == '\t')) ++j;
        if (j < list.size() && list[j] != ',') throw Error(what + ": text after a closing quote in '" + list + "'");
      } else {
        cur.clear();
      }
      quoted = !quoted;
      was_quoted = true;
      continue;
    }
    if (c == ',' && !quoted) {
      finish();
      continue;
    }
    if (was_quoted && !quoted) continue;  // blanks after the closing quote
    cur += c;
  }
  if (quoted) throw Error(what + ": unterminated quote in '" + list + "'");
  finish();
  return out;
}

int64_t SweepSpec::run_count() const {
  int64_t n = 1;
  for (const auto& a : axes) n *= a.size();
  return n;
}

std::vector<std::string> SweepSpec::axis_keys() const {
  std::vector<std::string> k;
  for (const auto& a : axes) k.insert(k.end(), a.keys.begin(), a.keys.end());
  return k;
}

namespace {

// A zipped key may repeat a value (keep_last_bf16 = 0, 2, 0), but two
// positions of a zip axis must differ somewhere.
void check_zip_positions(const std::vector<Axis>& axes, const std::string& origin) {
  for (const auto& a : axes) {
    std::set<std::vector<std::string>> seen;
    for (int64_t i = 0; i < a.size(); ++i) {
      std::vector<std::string> tuple;
      for (const auto& v : a.values) tuple.push_back(v[static_cast<size_t>(i)]);
      if (!seen.insert(tuple).second)
        throw Error(origin + ": [zip." + a.name + "] position " + std::to_string(i + 1) + " repeats an earlier one");
    }
  }
}

}  // namespace

SweepSpec parse_sweep(const std::string& text, const std::string& origin) {
  const sim::quant::IniFile ini = sim::quant::parse_ini(text, origin);
  SweepSpec s;
  s.path = origin;
  auto where = [&](const sim::quant::IniEntry& e) { return origin + ":" + std::to_string(e.line); };
  std::set<std::string> axis_keys;
  std::map<std::string, size_t> zip_axis;  // zip section -> axis index
  std::string reference_text, reference_where, group_where;
  for (const auto& section : ini.sections)
    if (section != "sweep" && section != "set" && section != "grid" && !section.starts_with("zip."))
      throw Error(origin + ":" + std::to_string(header_line(text, section)) + ": unknown section [" + section +
                  "] (expected [sweep], [set], [grid] or [zip.NAME])");
  std::map<std::string, int> set_line;  // [set] key -> its line
  for (const auto& e : ini.entries) {
    const std::string at = where(e);
    if (e.section.empty()) throw Error(at + ": key '" + e.key + "' before the first section");
    if (e.section == "sweep") {
      if (e.key == "name") s.name = e.value;
      else if (e.key == "base") s.base = e.value;
      else if (e.key == "reference") {
        reference_text = e.value;
        reference_where = at;
      } else if (e.key == "final_window") {
        throw Error(at + ": final_window is no longer a sweep key: the final-window train loss is defined once, over "
                         "the last max(1, round(steps/10)) steps of every run (docs/training.md); remove the line");
      } else if (e.key == "diverge_above") s.diverge_above = parse_double(e.value, at + ": diverge_above");
      else if (e.key == "group_over") {
        s.group_over = e.value;
        group_where = at;
      } else
        throw Error(at + ": unknown key '" + e.key +
                    "' in [sweep] (expected name, base, reference, diverge_above, group_over)");
      continue;
    }
    const std::string key = canonical_key(e.key);
    if (!valid_key(key))
      throw Error(at + ": '" + e.key + "' is not a run key (expected recipe or section.key, e.g. train.seed)");
    if (e.section == "set") {
      if (e.value.empty()) throw Error(at + ": empty value for " + e.key);
      if (set_line.count(key)) throw Error(at + ": '" + key + "' is set twice in [set]");
      set_line[key] = e.line;
      s.fixed.emplace_back(key, e.value);
      continue;
    }
    if (!axis_keys.insert(key).second) throw Error(at + ": key '" + key + "' is already an axis");
    if (set_line.count(key))
      throw Error(at + ": '" + key + "' is both an axis and in [set] (line " + std::to_string(set_line[key]) + ")");
    auto values = split_values(e.value, at + ": " + e.key);
    if (e.section == "grid") {
      std::set<std::string> seen;
      for (const auto& v : values)
        if (!seen.insert(v).second) throw Error(at + ": " + e.key + " lists '" + v + "' twice");
      s.axes.push_back(Axis{key, {key}, {std::move(values)}});
      continue;
    }
    // [zip.NAME]
    auto it = zip_axis.find(e.section);
    if (it == zip_axis.end()) {
      const std::string name = e.section.substr(4);
      if (name.empty()) throw Error(at + ": a zip section needs a name: [zip.NAME]");
      zip_axis[e.section] = s.axes.size();
      s.axes.push_back(Axis{name, {key}, {std::move(values)}});
    } else {
      Axis& a = s.axes[it->second];
      if (static_cast<int64_t>(values.size()) != a.size())
        throw Error(at + ": [" + e.section + "] zips lists of equal length, but " + e.key + " has " +
                    std::to_string(values.size()) + " values and " + a.keys[0] + " " + std::to_string(a.size()));
      a.keys.push_back(key);
      a.values.push_back(std::move(values));
    }
  }
  check_zip_positions(s.axes, origin);
  if (s.name.empty()) s.name = fs::path(origin).stem().string();
  if (s.base.empty()) throw Error(origin + ": [sweep] needs base = <run configuration> (e.g. experiments/proxy-tiny.ini)");
  if (s.axes.empty()) throw Error(origin + ": the sweep has no axis (add a [grid] or [zip.NAME] section)");
  // A [set] after the axes.
  for (const auto& e : ini.entries)
    if (e.section == "set" && axis_keys.count(canonical_key(e.key)))
      throw Error(where(e) + ": '" + canonical_key(e.key) + "' is both in [set] and an axis");
  if (!reference_text.empty()) {
    s.reference = parse_assignments(reference_text, reference_where + ": reference");
    for (auto& [k, v] : s.reference) {
      k = canonical_key(k);
      if (!axis_keys.count(k)) throw Error(reference_where + ": reference names '" + k + "', which is not an axis");
    }
  }
  if (!s.group_over.empty()) s.group_over = canonical_key(s.group_over);
  if (!s.group_over.empty() && !axis_keys.count(s.group_over))
    throw Error(group_where + ": group_over names '" + s.group_over + "', which is not an axis");
  if (s.run_count() > 1000000) throw Error(origin + ": the sweep has more than a million runs");
  return s;
}

SweepSpec load_sweep(const std::string& path) {
  return parse_sweep(sim::quant::read_config_text(path, "sweep file"), path);
}

std::string sanitize_value(const std::string& value) {
  std::string out;
  for (char c : value) {
    const bool keep = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
                      c == '+' || c == '-';
    const char d = keep ? c : '-';
    if (d == '-' && !out.empty() && out.back() == '-') continue;  // one dash for a run of others
    out += d;
  }
  // No leading dots or dashes (hidden names, options), except a minus sign.
  const bool minus = value.size() > 1 && value[0] == '-' && value[1] >= '0' && value[1] <= '9';
  size_t lead = minus ? 1 : 0;
  while (lead < out.size() && (out[lead] == '.' || out[lead] == '-')) ++lead;
  out.erase(minus ? 1 : 0, lead - (minus ? 1 : 0));
  while (out.size() > 1 && out.back() == '-') out.pop_back();
  if (out.size() > 40) out.resize(40);
  if (out.empty()) out = "x";
  return out;
}

std::map<std::string, std::string> short_names(const std::vector<std::string>& keys) {
  auto parts_of = [](const std::string& k) {
    std::vector<std::string> p;
    size_t a = 0;
    for (;;) {
      const size_t d = k.find('.', a);
      p.push_back(k.substr(a, d == std::string::npos ? std::string::npos : d - a));
      if (d == std::string::npos) break;
      a = d + 1;
    }
    return p;
  };
  auto suffix = [&](const std::string& k, size_t n) {
    const auto p = parts_of(k);
    std::string s;
    for (size_t i = p.size() - std::min(n, p.size()); i < p.size(); ++i) s += (s.empty() ? "" : ".") + p[i];
    return s;
  };
  std::map<std::string, std::string> out;
  for (const auto& k : keys) {
    // The shortest suffix no other key shares.
    const size_t parts = parts_of(k).size();
    size_t n = 1;
    for (; n < parts; ++n) {
      bool clash = false;
      for (const auto& o : keys)
        if (o != k && suffix(o, n) == suffix(k, n)) clash = true;
      if (!clash) break;
    }
    out[k] = sanitize_value(suffix(k, n));
  }
  return out;
}

std::vector<RunSpec> expand(const SweepSpec& spec) {
  const int64_t n = spec.run_count();
  const auto shorts = short_names(spec.axis_keys());
  const int width = std::max<int>(3, static_cast<int>(std::to_string(std::max<int64_t>(n - 1, 0)).size()));
  std::vector<RunSpec> runs(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    RunSpec& r = runs[static_cast<size_t>(i)];
    r.index = i;
    r.position.resize(spec.axes.size());
    int64_t rest = i;
    for (size_t a = spec.axes.size(); a-- > 0;) {
      r.position[a] = rest % spec.axes[a].size();
      rest /= spec.axes[a].size();
    }
    std::string idx = std::to_string(i);
    r.name = std::string(static_cast<size_t>(std::max<int>(0, width - static_cast<int>(idx.size()))), '0') + idx;
    for (size_t a = 0; a < spec.axes.size(); ++a) {
      const Axis& ax = spec.axes[a];
      for (size_t k = 0; k < ax.keys.size(); ++k) {
        const std::string& v = ax.values[k][static_cast<size_t>(r.position[a])];
        r.values.emplace_back(ax.keys[k], v);
        r.name += "_" + shorts.at(ax.keys[k]) + "=" + sanitize_value(v);
      }
    }
    if (r.name.size() > 160) r.name.resize(160);

    // Arguments: the base configuration, then [set], then the axes (exmy
    // train applies --set in order).
    std::vector<Assignment> all = spec.fixed;
    all.insert(all.end(), r.values.begin(), r.values.end());
    r.args = {"--config", spec.base};
    for (const auto& [k, v] : all) {
      r.args.push_back("--set");
      r.args.push_back(k + "=" + v);
    }
  }

  // References: the run whose positions equal this run's except on the axes
  // the reference names, where every named key has the named value.
  if (!spec.reference.empty()) {
    std::vector<std::optional<int64_t>> target(spec.axes.size());
    for (size_t a = 0; a < spec.axes.size(); ++a) {
      const Axis& ax = spec.axes[a];
      bool named = false;
      for (const auto& [k, v] : spec.reference)
        for (const auto& ak : ax.keys) named = named || ak == k;
      if (!named) continue;
      std::vector<int64_t> matches;
      for (int64_t p = 0; p < ax.size(); ++p) {
        bool ok = true;
        for (const auto& [k, v] : spec.reference)
          for (size_t ki = 0; ki < ax.keys.size(); ++ki)
            if (ax.keys[ki] == k && ax.values[ki][static_cast<size_t>(p)] != v) ok = false;
        if (ok) matches.push_back(p);
      }
      if (matches.size() != 1)
        throw Error(spec.path + ": the reference matches " + std::to_string(matches.size()) +
                    " values of axis '" + ax.name + "' (it must name exactly one)");
      target[a] = matches[0];
    }
    for (auto& r : runs) {
      int64_t idx = 0;
      for (size_t a = 0; a < spec.axes.size(); ++a)
        idx = idx * spec.axes[a].size() + (target[a] ? *target[a] : r.position[a]);
      r.reference = idx;
    }
  }
  return runs;
}

}  // namespace exmy::sweep

#include "sim/quant/ini.hpp"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "formats/error.hpp"

namespace exmy::sim::quant {
namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\r')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

// Drops a comment: '#' or ';' at the start or after a blank.
std::string_view strip_comment(std::string_view s) {
  for (size_t i = 0; i < s.size(); ++i) {
    if ((s[i] == '#' || s[i] == ';') && (i == 0 || s[i - 1] == ' ' || s[i - 1] == '\t')) return s.substr(0, i);
  }
  return s;
}

}  // namespace

IniFile parse_ini(std::string_view text, std::string_view origin, std::string_view repeatable) {
  IniFile f;
  f.origin = std::string(origin);
  std::string section;
  int line_no = 0;
  size_t pos = 0;
  auto fail = [&](const std::string& what) {
    throw Error(f.origin + ":" + std::to_string(line_no) + ": " + what);
  };
  while (pos <= text.size()) {
    const size_t nl = text.find('\n', pos);
    std::string_view raw = text.substr(pos, nl == std::string_view::npos ? std::string_view::npos : nl - pos);
    pos = nl == std::string_view::npos ? text.size() + 1 : nl + 1;
    ++line_no;
    const std::string_view line = trim(strip_comment(raw));
    if (line.empty()) continue;
    if (line.front() == '[') {
      if (line.back() != ']') fail("malformed section header '" + std::string(line) + "'");
      section = std::string(trim(line.substr(1, line.size() - 2)));
      if (section.empty()) fail("empty section name");
      bool seen = false;
      for (const auto& s : f.sections) seen = seen || s == section;
      if (seen) fail("section [" + section + "] appears twice");
      f.sections.push_back(section);
      continue;
    }
    const size_t eq = line.find('=');
    if (eq == std::string_view::npos) fail("expected 'key = value', got '" + std::string(line) + "'");
    IniEntry e;
    e.section = section;
    e.key = std::string(trim(line.substr(0, eq)));
    e.value = std::string(trim(line.substr(eq + 1)));
    e.line = line_no;
    if (e.key.empty()) fail("empty key");
    for (const auto& o : f.entries)
      if (o.section == e.section && o.key == e.key && (repeatable.empty() || e.section != repeatable))
        fail("key '" + (e.section.empty() ? "" : e.section + ".") + e.key + "' given twice (first on line " +
             std::to_string(o.line) + ")");
    f.entries.push_back(std::move(e));
  }
  return f;
}

std::string read_config_text(const std::string& path, const std::string& what) {
  std::error_code ec;
  const auto st = std::filesystem::status(path, ec);
  if (ec || !std::filesystem::exists(st)) throw Error("cannot open " + what + " '" + path + "' (no such file)");
  if (std::filesystem::is_directory(st)) throw Error(what + " '" + path + "' is a directory, not a file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot open " + what + " '" + path + "'");
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) throw Error("cannot read " + what + " '" + path + "'");
  return ss.str();
}

IniFile read_ini(const std::string& path) { return parse_ini(read_config_text(path, "file"), path); }

}  // namespace exmy::sim::quant

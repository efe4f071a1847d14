// The one INI dialect of exmy (run configurations, recipes, sweep files,
// tensor-sweep files): `[section]` headers, `key = value` lines, comments
// starting with `#` or `;` at the start of a line or after whitespace (so
// `lr = 1e-3  # peak` is 1e-3, and `path = a#b` keeps its '#'), blank
// lines; a key given twice is an error. Nothing is interpreted here: the
// caller validates every section and key and reports problems with the line
// number this reader keeps.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace exmy::sim::quant {

struct IniEntry {
  std::string section;  // "" for keys before the first header
  std::string key;
  std::string value;
  int line = 0;
};

struct IniFile {
  std::string origin;  // file name or a description, for messages
  std::vector<std::string> sections;  // headers in file order (each once)
  std::vector<IniEntry> entries;      // in file order
};

// Parses `text`. Throws exmy::Error "ORIGIN:LINE: ..." for a line that is
// neither a header, a key = value pair, a comment nor blank, for an empty
// key, for a section header given twice, and for a key given twice in one
// section (except in section `repeatable`, whose entries are a list: a run
// configuration's [recipe] overrides apply in order).
IniFile parse_ini(std::string_view text, std::string_view origin, std::string_view repeatable = {});

// Reads and parses a file; throws exmy::Error when it cannot be read or is
// not a regular file (a directory, say).
IniFile read_ini(const std::string& path);

// The text of a configuration file `path` (run configuration, recipe,
// sweep), or an exmy::Error naming it as `what` when it is missing, a
// directory or unreadable.
std::string read_config_text(const std::string& path, const std::string& what);

}  // namespace exmy::sim::quant

// A small strict INI reader for recipe files: `[section]` headers,
// `key = value` lines, comments starting with `#` or `;` (at the start of a
// line or after whitespace), blank lines. Nothing is interpreted here: the
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
// key, and for a key given twice in one section.
IniFile parse_ini(std::string_view text, std::string_view origin);

// Reads and parses a file; throws exmy::Error when it cannot be read.
IniFile read_ini(const std::string& path);

}  // namespace exmy::sim::quant

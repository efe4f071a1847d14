// Small text files written whole: to a temporary name, then renamed, so a
// reader (or a concurrent writer of the same file) never sees half of one.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "formats/error.hpp"

namespace exmy::io {

inline void write_text_atomic(const std::filesystem::path& path, const std::string& text) {
  const std::string p = path.string();
  const std::string tmp = p + ".tmp-" + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    if (!out) throw Error("cannot write '" + tmp + "'");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) throw Error("cannot rename '" + tmp + "' to '" + p + "': " + ec.message());
}

}  // namespace exmy::io

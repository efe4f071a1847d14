// Files written whole: to a temporary name next to the target, then renamed
// into place, so a reader (or a concurrent writer of the same file) never
// sees half of one, and a failed write leaves the previous file as it was.
#pragma once

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "formats/error.hpp"

namespace exmy::io {

// Calls write(tmp) to fill the temporary file `tmp`, then renames it to
// `path`. The temporary is removed when `write` throws or the rename fails.
template <class Write>
void write_file_atomic(const std::filesystem::path& path, Write&& write) {
  const std::string p = path.string();
  const std::string tmp = p + ".tmp-" + std::to_string(::getpid());
  try {
    write(tmp);
    std::error_code ec;
    std::filesystem::rename(tmp, path, ec);
    if (ec) throw Error("cannot rename '" + tmp + "' to '" + p + "': " + ec.message());
  } catch (...) {
    std::remove(tmp.c_str());
    throw;
  }
}

// `n` bytes written atomically.
inline void write_bytes_atomic(const std::filesystem::path& path, const void* data, size_t n) {
  write_file_atomic(path, [&](const std::string& tmp) {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw Error("cannot write '" + tmp + "'");
    out.write(static_cast<const char*>(data), static_cast<std::streamsize>(n));
    out.close();
    if (!out) throw Error("cannot write '" + tmp + "' (disk full?)");
  });
}

inline void write_text_atomic(const std::filesystem::path& path, const std::string& text) {
  write_bytes_atomic(path, text.data(), text.size());
}

}  // namespace exmy::io

// What the libFuzzer targets share: a private directory for the input files a
// target writes for the readers under test, and writing one.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

namespace exmy::fuzz {

// A private directory under $TMPDIR (tools/ci-fuzz.sh points it into the
// build directory), made on first use and removed at exit. `name` starts its
// name, e.g. "exmy_fuzz_readers". (Never destroyed, so that the exit handler
// can still read it.)
inline const std::string& work_dir(const char* name) {
  static const std::string* dir = [name] {
    auto* d = new std::string((std::filesystem::temp_directory_path() / (std::string(name) + "_XXXXXX")).string());
    if (!mkdtemp(d->data())) {
      std::perror("fuzz: mkdtemp");
      std::abort();
    }
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(*dir, ec);
    });
    return d;
  }();
  return *dir;
}

// Writes size bytes to path (replacing it); aborts when it cannot.
inline void write_file(const std::string& path, const uint8_t* data, size_t size) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f || (size > 0 && std::fwrite(data, 1, size, f) != size) || std::fclose(f) != 0) {
    std::perror(("fuzz: cannot write " + path).c_str());
    std::abort();
  }
}

}  // namespace exmy::fuzz

// Outputs never replace what stands at their path. What is there decides how
// a file is written (docs/training.md, "Safety of what is on disk"):
//   - nothing, or a regular file: written to a temporary next to it and
//     renamed into place, so a reader (or a concurrent writer of the same
//     file) never sees half of one, and a failed write leaves the previous
//     file as it was;
//   - a symbolic link: the same, at the file the link points to (followed to
//     its end); the link stays;
//   - a FIFO, a character device, `-` or /dev/stdout: written straight
//     through once the whole output exists (not atomic: a reader may see
//     part of it if the write fails half-way);
//   - anything else (a directory, a socket, a block device): an error.
#pragma once

#include <signal.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "formats/error.hpp"

namespace exmy::io {

// Where the bytes meant for a path go.
struct OutputTarget {
  std::filesystem::path file;  // the regular file to replace, or the stream to write through
  bool stream = false;         // FIFO, character device or standard output
};

// What stands at `path` (symbolic links followed), as the header says.
// Throws exmy::Error naming the path for what exmy does not write to.
inline OutputTarget output_target(const std::filesystem::path& path) {
  namespace fs = std::filesystem;
  const std::string shown = path.string();
  if (shown == "-") return {"/dev/stdout", true};
  fs::path p = path;
  for (int hops = 0;; ++hops) {
    if (hops > 40) throw Error("cannot write '" + shown + "': too many levels of symbolic links");
    struct stat st;
    if (::lstat(p.c_str(), &st) != 0) {
      if (errno != ENOENT)
        throw Error("cannot write '" + shown + "': " + std::strerror(errno));
      const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
      std::error_code ec;
      if (!fs::is_directory(dir, ec))
        throw Error("cannot write '" + shown + "': directory '" + dir.string() + "' does not exist");
      return {p, false};
    }
    if (S_ISLNK(st.st_mode)) {
      std::error_code ec;
      const fs::path to = fs::read_symlink(p, ec);
      if (ec) throw Error("cannot write '" + shown + "': " + ec.message());
      p = to.is_absolute() ? to : (p.has_parent_path() ? p.parent_path() / to : to);
      continue;
    }
    if (S_ISREG(st.st_mode)) return {p, false};
    if (S_ISFIFO(st.st_mode) || S_ISCHR(st.st_mode)) return {p, true};
    const char* what = S_ISDIR(st.st_mode) ? "a directory" : S_ISBLK(st.st_mode) ? "a block device"
                       : S_ISSOCK(st.st_mode) ? "a socket" : "not a regular file";
    throw Error("cannot write '" + shown + "': it is " + std::string(what) +
                " (outputs go to regular files, symbolic links to them, FIFOs, character devices or '-')");
  }
}

// A temporary for target `t` tagged `tag` (the writer's PID by default): next
// to the file, on the same filesystem so that the rename is atomic, or in
// the system's temporary directory for a stream. Leftovers of a killed
// process are named NAME.tmp-PID (remove_stale_temporaries finds them).
inline std::string temporary_for(const OutputTarget& t, const std::string& tag = std::to_string(::getpid())) {
  if (!t.stream) return t.file.string() + ".tmp-" + tag;
  return (std::filesystem::temp_directory_path() / ("exmy-out-" + t.file.filename().string() + ".tmp-" + tag)).string();
}

// Moves the finished temporary `tmp` to target `t`: renamed over a file,
// copied into a stream (and removed). Throws exmy::Error naming `shown`.
inline void place_output(const std::string& tmp, const OutputTarget& t, const std::string& shown) {
  if (!t.stream) {
    std::error_code ec;
    std::filesystem::rename(tmp, t.file, ec);
    if (ec) throw Error("cannot move '" + tmp + "' to '" + shown + "': " + ec.message());
    return;
  }
  std::FILE* in = std::fopen(tmp.c_str(), "rb");
  if (!in) throw Error("cannot read back '" + tmp + "': " + std::strerror(errno));
  std::FILE* out = std::fopen(t.file.c_str(), "wb");
  if (!out) {
    const int e = errno;
    std::fclose(in);
    throw Error("cannot write '" + shown + "': " + std::strerror(e));
  }
  char buf[1 << 16];
  bool ok = true;
  int err = 0;
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, in)) > 0;)
    if (std::fwrite(buf, 1, n, out) != n) { ok = false; err = errno; break; }
  if (ok && std::ferror(in)) { ok = false; err = EIO; }
  if (std::fclose(out) != 0 && ok) { ok = false; err = errno; }
  std::fclose(in);
  std::remove(tmp.c_str());
  if (!ok) throw Error("cannot write '" + shown + "': " + std::strerror(err));
}

// Calls write(tmp) to fill a temporary file, then places it at `path` as
// the header says. The temporary is removed when `write` throws or placing
// it fails.
template <class Write>
void write_file_atomic(const std::filesystem::path& path, Write&& write) {
  const OutputTarget t = output_target(path);
  const std::string tmp = temporary_for(t);
  try {
    write(tmp);
    place_output(tmp, t, path.string());
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

// For the message of a failed write at `path`: "the disk is full (N KiB
// free)" when the filesystem holding it has less than 1 MiB left for
// unprivileged writers, else empty (the cause is something else, or
// unknown: libhdf5 does not pass errno on).
inline std::string disk_full_note(const std::filesystem::path& path) {
  std::filesystem::path dir = path.has_parent_path() ? path.parent_path() : std::filesystem::path(".");
  struct statvfs v;
  if (::statvfs(dir.c_str(), &v) != 0) return {};
  const unsigned long long free_bytes = static_cast<unsigned long long>(v.f_bavail) * v.f_frsize;
  if (free_bytes >= (1ull << 20)) return {};
  return "the disk is full (" + std::to_string(free_bytes >> 10) + " KiB free)";
}

// Removes, in directory `dir` (not below it), the temporaries that a killed
// exmy process left: names ending in `.tmp-PID` or `.resume-PID` whose
// process no longer runs. Returns how many were removed.
inline int remove_stale_temporaries(const std::filesystem::path& dir) {
  namespace fs = std::filesystem;
  int removed = 0;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    for (const char* mark : {".tmp-", ".resume-"}) {
      const size_t at = name.rfind(mark);
      if (at == std::string::npos) continue;
      const std::string digits = name.substr(at + std::strlen(mark));
      if (digits.empty() || digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos) continue;
      const pid_t pid = static_cast<pid_t>(std::stol(digits));
      if (pid != ::getpid() && (::kill(pid, 0) == 0 || errno != ESRCH)) continue;  // its writer still runs
      std::error_code rm;
      if (fs::remove_all(it->path(), rm) > 0) ++removed;
    }
  }
  return removed;
}

}  // namespace exmy::io

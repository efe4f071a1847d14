// One writer per run directory. `exmy train` (new, --force or --resume) and
// `exmy eval` (which appends to the run file) hold an exclusive flock(2) on
// DIR/exmy.lock for as long as they write; the file holds the writer's PID
// and command. The kernel drops the lock when its process ends, however it
// ends, so the lock of a killed process never blocks the next run or resume.
#pragma once

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>

#include "formats/error.hpp"

namespace exmy::io {

class RunLock {
 public:
  RunLock() = default;
  // Takes the lock of run directory `dir` (which must exist) for `command`
  // (e.g. "exmy train"), or throws exmy::Error naming the process that
  // holds it.
  RunLock(const std::filesystem::path& dir, const std::string& command) {
    const std::string path = (dir / "exmy.lock").string();
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) throw Error("cannot open lock file '" + path + "': " + std::strerror(errno));
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      const int e = errno;
      const std::string holder = read_holder();
      ::close(fd_);
      fd_ = -1;
      if (e == EWOULDBLOCK)
        throw Error("run directory '" + dir.string() + "' is in use by " +
                    (holder.empty() ? std::string("another process") : holder) +
                    " (one writer per run directory; wait for it or stop it)");
      throw Error("cannot lock '" + path + "': " + std::strerror(e));
    }
    const std::string me = "PID " + std::to_string(::getpid()) + " (" + command + ")\n";
    if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, me.data(), me.size(), 0) != static_cast<ssize_t>(me.size())) {
      // The lock holds without the note; only the message of a second
      // writer loses the PID.
    }
  }
  RunLock(RunLock&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  RunLock& operator=(RunLock&& o) noexcept {
    if (this != &o) {
      release();
      fd_ = o.fd_;
      o.fd_ = -1;
    }
    return *this;
  }
  RunLock(const RunLock&) = delete;
  RunLock& operator=(const RunLock&) = delete;
  ~RunLock() { release(); }

  bool held() const { return fd_ >= 0; }

 private:
  void release() {
    if (fd_ < 0) return;
    ::close(fd_);  // drops the lock; the file stays (removing it would race a new writer)
    fd_ = -1;
  }
  // "PID N (command)" as the holder wrote it, or empty.
  std::string read_holder() const {
    char buf[256];
    const ssize_t n = ::pread(fd_, buf, sizeof buf - 1, 0);
    if (n <= 0) return {};
    std::string s(buf, static_cast<size_t>(n));
    while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
    return s.rfind("PID ", 0) == 0 ? s : std::string();
  }
  int fd_ = -1;
};

}  // namespace exmy::io

// Running the built `exmy` binary from a test: the command's exit status and
// its stdout and stderr together.
#pragma once

#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <stdexcept>
#include <map>
#include <string>
#include <vector>

extern char** environ;

namespace exmy::test {

struct CliResult {
  int status = -1;  // exit status; 128 + signal when killed
  std::string out;  // stdout and stderr, interleaved
};

// argv as one word for /bin/sh.
inline std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

inline CliResult run_cli(const std::vector<std::string>& argv) {
  std::string cmd;
  for (const auto& a : argv) cmd += shell_quote(a) + " ";
  cmd += "2>&1";
  CliResult r;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int st = ::pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  return r;
}

// A child process with stdout and stderr on one pipe, read while it runs
// (for signals sent mid-run).
class Child {
 public:
  // `env` of NAME=VALUE strings; empty: this process's environment.
  explicit Child(const std::vector<std::string>& argv, const std::vector<std::string>& env = {}) {
    int fds[2];
    if (::pipe(fds) != 0) throw std::runtime_error("pipe");
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
    posix_spawn_file_actions_adddup2(&fa, fds[1], 2);
    posix_spawn_file_actions_addclose(&fa, fds[0]);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    std::vector<char*> envp;
    for (const auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
    envp.push_back(nullptr);
    const int rc = posix_spawn(&pid_, args[0], &fa, nullptr, args.data(), env.empty() ? environ : envp.data());
    posix_spawn_file_actions_destroy(&fa);
    ::close(fds[1]);
    fd_ = fds[0];
    if (rc != 0) throw std::runtime_error("cannot start " + argv[0]);
  }
  ~Child() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    if (fd_ >= 0) ::close(fd_);
  }
  // Reads output until `count` lines containing `needle` have arrived (or
  // EOF, or the timeout); returns whether they did.
  bool wait_for(const std::string& needle, int count, int timeout_s = 60) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
    for (;;) {
      int seen = 0;
      for (size_t p = out_.find(needle); p != std::string::npos; p = out_.find(needle, p + 1)) ++seen;
      if (seen >= count) return true;
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - std::chrono::steady_clock::now());
      if (left.count() <= 0 || !read_some(static_cast<int>(left.count()))) return false;
    }
  }
  void signal(int sig) { ::kill(pid_, sig); }
  pid_t pid() const { return pid_; }
  CliResult finish(int timeout_s = 60) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
    // Until EOF (a quiet second is not the end: the child may be busy).
    while (std::chrono::steady_clock::now() < end && !eof_) read_some(1000);
    int st = 0;
    ::waitpid(pid_, &st, 0);
    pid_ = -1;
    CliResult r;
    r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    r.out = out_;
    return r;
  }
  const std::string& output() const { return out_; }

 private:
  // false at EOF or timeout
  bool read_some(int timeout_ms) {
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, timeout_ms) <= 0) return false;
    char buf[4096];
    const ssize_t n = ::read(fd_, buf, sizeof buf);
    if (n <= 0) {
      eof_ = true;
      return false;
    }
    out_.append(buf, static_cast<size_t>(n));
    return true;
  }
  pid_t pid_ = -1;
  int fd_ = -1;
  bool eof_ = false;
  std::string out_;
};

// A CSV file as rows of header -> field (RFC 4180 quoting).
inline std::vector<std::map<std::string, std::string>> read_csv(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  auto split = [](const std::string& l) {
    std::vector<std::string> f;
    std::string cur;
    bool q = false;
    for (size_t i = 0; i < l.size(); ++i) {
      const char c = l[i];
      if (c == '"') {
        if (q && i + 1 < l.size() && l[i + 1] == '"') {
          cur += '"';
          ++i;
        } else {
          q = !q;
        }
      } else if (c == ',' && !q) {
        f.push_back(cur);
        cur.clear();
      } else {
        cur += c;
      }
    }
    f.push_back(cur);
    return f;
  };
  std::vector<std::map<std::string, std::string>> rows;
  if (!std::getline(in, line)) return rows;
  const auto header = split(line);
  while (std::getline(in, line)) {
    const auto f = split(line);
    std::map<std::string, std::string> row;
    for (size_t i = 0; i < header.size() && i < f.size(); ++i) row[header[i]] = f[i];
    rows.push_back(row);
  }
  return rows;
}

}  // namespace exmy::test

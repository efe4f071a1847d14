// Running the built `exmy` binary from a test: the command's exit status and
// its stdout and stderr together.
#pragma once

#include <stdio.h>
#include <sys/wait.h>

#include <string>
#include <vector>

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

}  // namespace exmy::test

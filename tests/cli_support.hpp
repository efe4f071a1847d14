// Running the built `exmy` binary from a test: the command's exit status and
// its stdout and stderr together.
#pragma once

#include <stdio.h>
#include <sys/wait.h>

#include <fstream>
#include <map>
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

// Helpers shared by the training tests: temporary directories, quiet hooks,
// bit patterns and checks on one-line error messages.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <functional>
#include <bit>
#include <cstdint>
#include <string>

#include "formats/error.hpp"
#include "sim/train/trainer.hpp"

namespace exmy::test {

// The bit pattern of a double, for bit-for-bit comparisons.
inline uint64_t bits(double x) { return std::bit_cast<uint64_t>(x); }

// Training hooks for tests: no progress lines, final parameters kept.
inline train::TrainHooks quiet() {
  train::TrainHooks h;
  h.out = nullptr;
  h.keep_params = true;
  return h;
}

// A fresh directory under TMPDIR (or /tmp), removed with everything in it.
class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base && *base ? base : "/tmp") + "/exmy-train-test-XXXXXX";
    if (!::mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// Expects fn to throw exmy::Error whose one-line message contains `needle`.
inline void expect_error(const std::function<void()>& fn, const std::string& needle) {
  try {
    fn();
    ADD_FAILURE() << "no exmy::Error thrown (expected one mentioning '" << needle << "')";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(needle), std::string::npos) << "message: " << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "not one line: " << msg;
  }
}

}  // namespace exmy::test

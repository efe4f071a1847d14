// The public reference vectors (tests/reference/quantize.jsonl, which follow
// docs/numerics.md): loader and the bit-for-bit comparison of one
// implementation's outputs with a case's expected outputs. Included by
// every test that checks an implementation against the vectors (CPU paths in
// test_vectors.cpp, the CUDA path in test_cuda.cpp). The including target
// defines EXMY_VECTORS, the path of the .jsonl file; the environment variable
// EXMY_VECTORS_FILE overrides it (a binary run from another checkout, as
// tools/gpu-check.sh does on a lent device machine).
#pragma once

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "formats/pack.hpp"
#include "formats/quantize.hpp"
#include "formats/spec.hpp"
#include "formats/vocab.hpp"

#ifndef EXMY_VECTORS
#error "define EXMY_VECTORS, the path of tests/reference/quantize.jsonl"
#endif

namespace exmy::vectors {

struct Case {
  int id;
  int64_t rows, cols;
  QuantSpec spec;
  std::vector<float> input;
  std::vector<uint32_t> values;  // float bits
  std::vector<uint32_t> codes, scales;
  nlohmann::json stats;
};

inline uint32_t hexbits(const std::string& s) { return static_cast<uint32_t>(std::stoul(s, nullptr, 16)); }

inline std::string vectors_file() {
  const char* e = std::getenv("EXMY_VECTORS_FILE");
  return e && *e ? std::string(e) : std::string(EXMY_VECTORS);
}

inline std::vector<Case> load_cases() {
  const std::string path = vectors_file();
  std::ifstream f(path);
  EXPECT_TRUE(f.good()) << "cannot open " << path;
  std::vector<Case> cases;
  std::string line;
  while (std::getline(f, line)) {
    if (line.empty()) continue;
    const auto j = nlohmann::json::parse(line);
    Case c;
    c.id = j["id"];
    c.rows = j["shape"][0];
    c.cols = j["shape"][1];
    const auto& a = j["args"];
    // The args are QuantSpec knobs (formats/vocab.hpp); numbers as their JSON text.
    for (const auto& [k, v] : a.items()) set_knob(c.spec, k, v.is_string() ? v.get<std::string>() : v.dump());
    for (const auto& h : j["input"]) {
      const uint32_t b = hexbits(h);
      c.input.push_back(float_of(b));
    }
    for (const auto& h : j["values"]) c.values.push_back(hexbits(h));
    for (const auto& v : j["codes"]) c.codes.push_back(v);
    for (const auto& v : j["scales"]) c.scales.push_back(v);
    c.stats = j["stats"];
    cases.push_back(std::move(c));
  }
  return cases;
}

inline const std::vector<Case>& cases() {
  static const std::vector<Case> c = load_cases();
  return c;
}

inline std::string hex(uint32_t v) {
  char b[16];
  std::snprintf(b, sizeof b, "%08x", v);
  return b;
}

// Runs one implementation and compares everything with the expected outputs.
template <class Run>
void check_case(const Case& c, Run run, const char* what) {
  const int64_t n = c.rows * c.cols;
  const int cb = c.spec.elem.code_bytes();
  std::vector<float> values(static_cast<size_t>(n));
  std::vector<uint8_t> codes(static_cast<size_t>(n * cb));
  const int64_t nb = block_count(c.spec, c.rows, c.cols);
  const int sb = c.spec.scale ? c.spec.scale->code_bytes() : 1;
  std::vector<uint8_t> scodes(static_cast<size_t>(nb * sb));
  QuantStats st;
  run(QuantOutput{values.data(), codes.data(), scodes.data(), &st});

  ASSERT_EQ(c.values.size(), static_cast<size_t>(n));
  int bad = 0;
  for (int64_t i = 0; i < n && bad < 5; ++i) {
    if (bits_of(values[i]) != c.values[i]) {
      ADD_FAILURE() << what << " case " << c.id << " element " << i << " input " << hex(bits_of(c.input[i]))
                    << ": value " << hex(bits_of(values[i])) << ", expected " << hex(c.values[i]);
      ++bad;
    }
    if (load_code(codes.data(), cb, i) != c.codes[i]) {
      ADD_FAILURE() << what << " case " << c.id << " element " << i << ": code " << load_code(codes.data(), cb, i)
                    << ", expected " << c.codes[i];
      ++bad;
    }
  }
  ASSERT_EQ(static_cast<size_t>(nb), c.scales.size()) << what << " case " << c.id;
  for (int64_t b = 0; b < nb && bad < 5; ++b) {
    if (load_code(scodes.data(), sb, b) != c.scales[b]) {
      ADD_FAILURE() << what << " case " << c.id << " block " << b << ": scale code " << load_code(scodes.data(), sb, b)
                    << ", expected " << c.scales[b];
      ++bad;
    }
  }
  const auto& e = c.stats;
  EXPECT_EQ(st.elements, e["elements"].get<uint64_t>()) << what << " case " << c.id;
  EXPECT_EQ(st.nonzero, e["nonzero"].get<uint64_t>()) << what << " case " << c.id;
  EXPECT_EQ(st.underflow, e["underflow"].get<uint64_t>()) << what << " case " << c.id;
  EXPECT_EQ(st.saturated, e["saturated"].get<uint64_t>()) << what << " case " << c.id;
  EXPECT_EQ(st.subnormal, e["subnormal"].get<uint64_t>()) << what << " case " << c.id;
  EXPECT_EQ(st.blocks, e["blocks"].get<uint64_t>()) << what << " case " << c.id;
  EXPECT_EQ(st.scale_underflow, e["scale_underflow"].get<uint64_t>()) << what << " case " << c.id;
  EXPECT_EQ(st.scale_subnormal, e["scale_subnormal"].get<uint64_t>()) << what << " case " << c.id;
  EXPECT_EQ(st.scale_saturated, e["scale_saturated"].get<uint64_t>()) << what << " case " << c.id;
  // The sums are compared as exact doubles.
  EXPECT_EQ(bits_of(st.sum_sq), bits_of(e["sum_sq"].get<double>())) << what << " case " << c.id;
  EXPECT_EQ(bits_of(st.sum_sq_err), bits_of(e["sum_sq_err"].get<double>())) << what << " case " << c.id;
  EXPECT_EQ(bits_of(st.sum_err), bits_of(e["sum_err"].get<double>())) << what << " case " << c.id;
  EXPECT_EQ(bits_of(st.sum_abs), bits_of(e["sum_abs"].get<double>())) << what << " case " << c.id;
}

}  // namespace exmy::vectors

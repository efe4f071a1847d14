// io::quantize_stream (`exmy quantize` on a file) against exmy::quantize on
// the whole tensor: raw, .npy and HDF5 inputs, bands of a few rows (rows that
// are not a multiple of the band), 1x16, 16x1, 16x16 and mx 1x32 blocks,
// current, held and no tensor amax, rne and stochastic rounding, the RHT,
// statistics, 1 and 2 threads: values, codes, scale codes and statistics
// bit for bit. A NaN that the formats cannot hold names the element the
// whole-tensor call names, and leaves no output behind.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "formats/error.hpp"
#include "formats/spec.hpp"
#include "sim/io/quantize_stream.hpp"

namespace exmy::io {
namespace {

namespace fs = std::filesystem;

std::vector<uint8_t> slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

template <class T>
std::vector<uint8_t> bytes_of(const std::vector<T>& v) {
  std::vector<uint8_t> b(v.size() * sizeof(T));
  if (!b.empty()) std::memcpy(b.data(), v.data(), b.size());
  return b;
}

class QuantizeStream : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("exmy_test_quantize_stream_" + std::to_string(getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

QuantSpec make_spec(const char* elem, const char* scale, int br, int bc, AmaxKind amax, Round round, bool rht) {
  QuantSpec s;
  s.elem = parse_format(elem);
  if (std::string(scale) != "none") s.scale = parse_format(scale);
  s.block_rows = br;
  s.block_cols = bc;
  if (std::string(scale) == "ue8m0") s.rule = ScaleRule::mx_floor;
  s.amax_kind = amax;
  s.amax_value = 3.0;
  s.round = round;
  s.seed = 1234;
  s.stream = 7;
  s.rht = rht;
  return s;
}

TEST_F(QuantizeStream, EqualsTheWholeTensorCall) {
  const int64_t rows = 16 * 7 + 3, cols = 4096 + 96;  // rows of two sum segments; 115 rows
  std::mt19937 gen(99);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> x(static_cast<size_t>(rows * cols));
  for (float& v : x) v = normal(gen);
  const int64_t rows16 = 16 * 7;  // 16x1 blocks with the RHT need whole 16-row groups
  {
    OutputSet in;
    in.add_bytes(path("x.f32"), x.data(), x.size() * 4);
    in.add_tensor(path("x.npy"), x.data(), rows, cols);
    in.add_tensor(path("x.h5") + ":/t/x", x.data(), rows, cols);
    in.add_tensor(path("x16.npy"), x.data(), rows16, cols);
    in.commit();
  }
  struct Case {
    QuantSpec spec;
    const char* what;
  };
  const Case cases[] = {
      {make_spec("e2m1", "ue5m3", 1, 16, AmaxKind::current, Round::rne, false), "1x16 current rne"},
      {make_spec("e2m1", "ue5m3", 1, 16, AmaxKind::given, Round::stochastic, false), "1x16 held stochastic"},
      {make_spec("e2m1", "ue5m3", 1, 16, AmaxKind::current, Round::stochastic_fast, true), "1x16 current sr rht"},
      {make_spec("e2m1", "ue4m3", 16, 1, AmaxKind::current, Round::rne, true), "16x1 current rht"},
      {make_spec("e4m3", "ue8m0", 16, 16, AmaxKind::none, Round::stochastic, false), "16x16 none stochastic"},
      {make_spec("e2m1", "ue8m0", 1, 32, AmaxKind::none, Round::rne, false), "mx 1x32"},
      {make_spec("e5m2", "none", 1, 16, AmaxKind::current, Round::stochastic_fast, false), "no scale"},
  };
  int compared = 0;
  for (const Case& c : cases) {
    const bool groups = c.spec.rht && c.spec.block_rows == 16;
    const int64_t r = groups ? rows16 : rows;
    const QuantSpec& s = c.spec;
    const int64_t n = r * cols, nb = block_count(s, r, cols);
    std::vector<float> want(static_cast<size_t>(n));
    std::vector<uint8_t> want_codes(static_cast<size_t>(n * s.elem.code_bytes()));
    std::vector<uint8_t> want_sc(static_cast<size_t>(nb * (s.scale ? s.scale->code_bytes() : 1)));
    QuantStats want_st;
    quantize(s, x.data(), r, cols, {want.data(), want_codes.data(), want_sc.data(), &want_st}, 2);
    const std::vector<std::string> inputs =
        groups ? std::vector<std::string>{path("x16.npy")}
               : std::vector<std::string>{path("x.f32"), path("x.npy"), path("x.h5") + ":/t/x"};
    for (const std::string& input : inputs) {
      for (const int64_t band_bytes : {int64_t{1}, int64_t{16} * 4 * cols * 2 + 1, int64_t{4} << 20}) {
        for (int threads : {1, 2}) {
          const std::string what = std::string(c.what) + ", " + input + ", band bytes " + std::to_string(band_bytes) +
                                   ", " + std::to_string(threads) + " thread(s)";
          TensorReader in(input, input.ends_with(".f32") ? r : 0, input.ends_with(".f32") ? cols : 0);
          OutputSet out;
          const QuantizeFiles files{path("y.f32"), path("c.bin"), path("s.bin"), true};
          const QuantStats st = quantize_stream(s, in, files, out, threads, false, band_bytes);
          out.commit();
          EXPECT_EQ(slurp(path("y.f32")), bytes_of(want)) << what;
          EXPECT_EQ(slurp(path("c.bin")), want_codes) << what;
          EXPECT_EQ(slurp(path("s.bin")), s.scale ? want_sc : std::vector<uint8_t>()) << what;
          EXPECT_TRUE(st == want_st) << what << ": sum_sq " << st.sum_sq << " / " << want_st.sum_sq;
          ++compared;
        }
      }
    }
  }
  EXPECT_EQ(compared, 6 * 3 * 3 * 2 + 1 * 3 * 2);
}

// An .npy or HDF5 output is written band by band; it reads back as the
// whole-tensor call's values.
TEST_F(QuantizeStream, NpyAndHdf5OutputsInBands) {
  const int64_t rows = 37, cols = 48;
  std::vector<float> x(static_cast<size_t>(rows * cols));
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(static_cast<float>(i)) * 3.0f;
  const QuantSpec s = make_spec("e2m1", "ue5m3", 1, 16, AmaxKind::current, Round::rne, false);
  std::vector<float> want(x.size());
  quantize(s, x.data(), rows, cols, {want.data(), nullptr, nullptr, nullptr}, 1);
  {
    OutputSet in;
    in.add_bytes(path("x.f32"), x.data(), x.size() * 4);
    in.commit();
  }
  for (const std::string out_path : {path("y.npy"), path("y.h5") + ":/g/y"}) {
    TensorReader in(path("x.f32"), rows, cols);
    OutputSet out;
    quantize_stream(s, in, {out_path, "", "", false}, out, 1, false, 4 * cols * 5);
    out.commit();
    const Tensor back = read_tensor(out_path, 0, 0);
    EXPECT_EQ(back.rows, rows) << out_path;
    EXPECT_EQ(back.cols, cols) << out_path;
    EXPECT_EQ(bytes_of(back.data), bytes_of(want)) << out_path;
  }
}

// A NaN without a NaN code in a late band: the error names the element the
// whole-tensor call names, and no output or temporary is left.
TEST_F(QuantizeStream, NaNInALateBandNamesTheElement) {
  const int64_t rows = 40, cols = 32;
  std::vector<float> x(static_cast<size_t>(rows * cols), 1.0f);
  x[static_cast<size_t>(33 * cols + 5)] = std::nanf("");
  x[static_cast<size_t>(35 * cols + 1)] = std::nanf("");
  {
    OutputSet in;
    in.add_bytes(path("x.f32"), x.data(), x.size() * 4);
    in.commit();
  }
  const QuantSpec s = make_spec("e2m1", "ue8m0:nans=0", 1, 16, AmaxKind::none, Round::rne, false);
  std::vector<float> v(x.size());
  std::string want;
  try {
    quantize(s, x.data(), rows, cols, {v.data(), nullptr, nullptr, nullptr}, 1);
  } catch (const Error& e) {
    want = e.what();
  }
  ASSERT_NE(want.find("(33, 5)"), std::string::npos) << want;
  std::string got;
  {
    TensorReader in(path("x.f32"), rows, cols);
    OutputSet out;
    try {
      quantize_stream(s, in, {path("y.f32"), path("c.bin"), "", true}, out, 1, false, 4 * cols * 4);
    } catch (const Error& e) {
      got = e.what();
    }
  }
  EXPECT_EQ(got, want);
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 1);  // x.f32 alone
}

}  // namespace
}  // namespace exmy::io

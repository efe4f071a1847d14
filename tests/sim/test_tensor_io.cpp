// The tensor readers of sim/io/tensor_io.cpp: round trips through each file
// kind, and the malformed files the fuzzer (tests/fuzz/fuzz_readers) found or
// aims at, which must fail with exmy::Error and not allocate what a header
// claims; and io::quantize_stream, the band loop of `exmy quantize`.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "formats/error.hpp"
#include "formats/spec.hpp"
#include "sim/io/h5.hpp"
#include "sim/io/quantize_stream.hpp"
#include "sim/io/tensor_io.hpp"

namespace exmy::io {
namespace {

namespace fs = std::filesystem;

class TensorIo : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("exmy_test_tensor_io_" + std::to_string(getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  void write(const std::string& name, const std::vector<uint8_t>& bytes) const {
    std::ofstream f(path(name), std::ios::binary);
    f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  }
  // An .npy file with the given header dictionary and `values` float32 values.
  void write_npy(const std::string& name, const std::string& dict, size_t values) const {
    std::string h = dict;
    while ((10 + h.size() + 1) % 64 != 0) h += ' ';
    h += '\n';
    std::vector<uint8_t> b = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, static_cast<uint8_t>(h.size() & 0xff),
                              static_cast<uint8_t>(h.size() >> 8)};
    b.insert(b.end(), h.begin(), h.end());
    b.resize(b.size() + 4 * values, 0);
    write(name, b);
  }
  fs::path dir_;
};

std::vector<float> iota_values(size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>(i) * 0.5f - 3.0f;
  return v;
}

TEST_F(TensorIo, NpyRoundTrip) {
  const std::vector<float> x = iota_values(6);
  write("a.npy", npy_bytes(x.data(), 2, 3));
  const Tensor t = read_tensor(path("a.npy"), 0, 0);
  EXPECT_EQ(t.rows, 2);
  EXPECT_EQ(t.cols, 3);
  EXPECT_TRUE(t.shape_known);
  EXPECT_EQ(t.data, x);
  EXPECT_EQ(read_tensor(path("a.npy"), 3, 2).data, x);
  EXPECT_THROW(read_tensor(path("a.npy"), 4, 2), Error);
}

TEST_F(TensorIo, NpyShapeOverflowIsAnError) {
  // Found by fuzz_readers: 2^40 x 2^40 overflowed int64_t (UBSan).
  write_npy("big.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (1099511627776, 1099511627776), }", 2);
  EXPECT_THROW(read_tensor(path("big.npy"), 0, 0), Error);
  write_npy("huge.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (1099511627776, 2), }", 2);
  EXPECT_THROW(read_tensor(path("huge.npy"), 0, 0), Error);
}

TEST_F(TensorIo, NpyMalformedShapeIsAnError) {
  write_npy("s.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': 3, }", 3);
  EXPECT_THROW(read_tensor(path("s.npy"), 0, 0), Error);
  write_npy("t.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 2, 3), }", 6);
  EXPECT_THROW(read_tensor(path("t.npy"), 0, 0), Error);
}

TEST_F(TensorIo, RawNeedsMatchingShape) {
  const std::vector<float> x = iota_values(12);
  const auto* p = reinterpret_cast<const uint8_t*>(x.data());
  write("a.f32", std::vector<uint8_t>(p, p + 48));
  EXPECT_EQ(read_tensor(path("a.f32"), 3, 4).data, x);
  EXPECT_THROW(read_tensor(path("a.f32"), 0, 0), Error);
  EXPECT_THROW(read_tensor(path("a.f32"), 5, 4), Error);
  EXPECT_THROW(read_tensor(path("a.f32"), -3, -4), Error);
  EXPECT_THROW(read_tensor(path("a.f32"), int64_t{1} << 40, int64_t{1} << 40), Error);
}

TEST_F(TensorIo, Hdf5RoundTripInPieces) {
  // More than one read piece (2^20 elements), along rows and within a row.
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{3, 700001}, {1, 2500000}, {5, 3}}) {
    const std::vector<float> x = iota_values(static_cast<size_t>(rows * cols));
    const std::string spec = path("t.h5") + ":/g/x";
    {
      OutputSet out;
      out.add_tensor(spec, x.data(), rows, cols);
      out.commit();
    }
    const Tensor t = read_tensor(spec, 0, 0);
    EXPECT_EQ(t.rows, rows);
    EXPECT_EQ(t.cols, cols);
    EXPECT_TRUE(t.data == x) << rows << "x" << cols;
    fs::remove(path("t.h5"));
  }
}

// Writes `huge.h5` with /unwritten (never written) and /chunks (one of many
// chunks written), both claiming 2^36 elements.
void write_sparse_h5(const std::string& file) {
  hid_t f = H5Fcreate(file.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  hsize_t dims[2] = {hsize_t{1} << 18, hsize_t{1} << 18}, chunk[2] = {4, 4}, start[2] = {0, 0};
  hid_t s = H5Screate_simple(2, dims, nullptr);
  H5Dclose(H5Dcreate2(f, "/unwritten", H5T_IEEE_F32LE, s, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
  hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  H5Pset_chunk(dcpl, 2, chunk);
  hid_t d = H5Dcreate2(f, "/chunks", H5T_IEEE_F32LE, s, H5P_DEFAULT, dcpl, H5P_DEFAULT);
  const float a[16] = {1.0f};
  hid_t mem = H5Screate_simple(2, chunk, nullptr);
  H5Sselect_hyperslab(s, H5S_SELECT_SET, start, nullptr, chunk, nullptr);
  H5Dwrite(d, H5T_NATIVE_FLOAT, mem, s, H5P_DEFAULT, a);
  H5Sclose(mem);
  H5Dclose(d);
  H5Pclose(dcpl);
  H5Sclose(s);
  H5Fclose(f);
}

TEST_F(TensorIo, Hdf5DatasetsWithoutStoredDataAreErrors) {
  // A 4 KB file claiming 2^36 float32 values must not make the reader
  // allocate 256 GiB: the values it would return are only fill values.
  write_sparse_h5(path("huge.h5"));
  EXPECT_THROW(read_tensor(path("huge.h5") + ":/unwritten", 0, 0), Error);
  EXPECT_THROW(read_tensor(path("huge.h5") + ":/chunks", 0, 0), Error);
  EXPECT_THROW(read_tensor(path("huge.h5") + ":/missing", 0, 0), Error);
  EXPECT_EQ(H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_ALL), 0);
}

TEST_F(TensorIo, NotHdf5IsAnError) {
  write("junk.h5", std::vector<uint8_t>(100, 0x42));
  EXPECT_THROW(read_tensor(path("junk.h5") + ":/x", 0, 0), Error);
  EXPECT_THROW(read_tensor(path("absent.h5") + ":/x", 0, 0), Error);
}

}  // namespace
}  // namespace exmy::io

namespace exmy::io {
namespace {

// The inputs of tests/fuzz/upstream crash libhdf5 itself (a SEGV inside
// the library, on a malformed file). read_tensor reads HDF5 in a child
// process, so each must come back as a one-line exmy::Error naming the
// file, and the process must go on. Each file is a fuzz input: byte 0 the
// reader (bit 7: shape from the file), bytes 1-2 the shape, byte 3 the
// dataset, then the file itself (see tests/fuzz/fuzz_readers.cpp).
TEST_F(TensorIo, CrashOfTheHdf5LibraryIsAnError) {
  const char* const datasets[] = {"/x", "/data", "/a/b", "x", "/", "/missing"};
  int files = 0;
  for (const auto& e : fs::directory_iterator(EXMY_UPSTREAM_DIR)) {
    if (e.path().extension() == ".md") continue;
    std::ifstream f(e.path(), std::ios::binary);
    const std::vector<uint8_t> in((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    ASSERT_GE(in.size(), 4u) << e.path();
    write("bad.h5", std::vector<uint8_t>(in.begin() + 4, in.end()));
    const bool from_file = (in[0] & 0x80) != 0;
    const int64_t rows = from_file ? 0 : static_cast<int8_t>(in[1]), cols = from_file ? 0 : static_cast<int8_t>(in[2]);
    const std::string spec = path("bad.h5") + ":" + datasets[in[3] % 6];
    try {
      (void)read_tensor(spec, rows, cols);
      ADD_FAILURE() << e.path() << ": read without an error";
    } catch (const Error& err) {
      const std::string m = err.what();
      EXPECT_NE(m.find(path("bad.h5")), std::string::npos) << m;
      EXPECT_EQ(m.find('\n'), std::string::npos) << m;
    }
    ++files;
  }
  EXPECT_GE(files, 1);
  // errors found by the reader itself come through the child unchanged
  try {
    (void)read_tensor(path("absent.h5") + ":/x", 0, 0);
    ADD_FAILURE() << "absent file read";
  } catch (const Error& err) {
    EXPECT_EQ(std::string(err.what()), "cannot read '" + path("absent.h5") + "': no such file");
  }
}

}  // namespace
}  // namespace exmy::io

namespace exmy::io {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// run_isolated's idle limit: a child that stops making progress (libhdf5
// looping on a corrupt file) is killed and named in one error; one that
// keeps calling heartbeat() may take longer than the limit.
TEST(RunIsolated, ChildWithoutProgressIsKilledAfterTheIdleLimit) {
  const auto t0 = std::chrono::steady_clock::now();
  try {
    (void)h5::run_isolated(
        "stuck.h5",
        [] {
          for (;;) std::this_thread::sleep_for(std::chrono::milliseconds(20));
          return std::string();
        },
        0.5);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "cannot read 'stuck.h5': the HDF5 library made no progress on it for 0.5 s (corrupt file?)");
  }
  const double took = seconds_since(t0);
  EXPECT_GE(took, 0.5);
  EXPECT_LT(took, 10.0);
}

TEST(RunIsolated, HeartbeatsKeepASlowChildAlive) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::string r = h5::run_isolated(
      "slow.h5",
      [] {
        for (int i = 0; i < 30; ++i) {  // 1.5 s in all, three times the limit
          h5::heartbeat();
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
        return std::string("done");
      },
      0.5);
  EXPECT_EQ(r, "done");
  EXPECT_GE(seconds_since(t0), 1.5);
  h5::heartbeat();  // outside a child: nothing happens
}

TEST(RunIsolated, WithoutALimitTheChildMayTakeItsTime) {
  const std::string r = h5::run_isolated(
      "quiet.h5",
      [] {
        std::this_thread::sleep_for(std::chrono::milliseconds(700));
        return std::string("late");
      },
      0.0);
  EXPECT_EQ(r, "late");
}

TEST(RunIsolated, CrashAndErrorInTheChild) {
  try {
    (void)h5::run_isolated(
        "crash.h5",
        []() -> std::string {
          std::raise(SIGKILL);  // (a sanitizer would catch SIGSEGV and exit instead)
          return "";
        },
        5.0);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot read 'crash.h5': the HDF5 library crashed on it"), std::string::npos)
        << e.what();
  }
  try {
    (void)h5::run_isolated("bad.h5", []() -> std::string { throw Error("bad.h5: no such dataset"); }, 5.0);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "bad.h5: no such dataset");
  }
}

// io::quantize_stream (`exmy quantize` on a file) against exmy::quantize on
// the whole tensor: raw, .npy and HDF5 inputs, bands of a few rows (rows that
// are not a multiple of the band), 1x16, 16x1, 16x16 and mx 1x32 blocks,
// current, held and no tensor amax, rne and stochastic rounding, the RHT,
// statistics, 1 and 2 threads: values, codes, scale codes and statistics
// bit for bit. A NaN that the formats cannot hold names the element the
// whole-tensor call names, and leaves no output behind.

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

TEST_F(TensorIo, QuantizeStreamEqualsTheWholeTensorCall) {
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
TEST_F(TensorIo, QuantizeStreamWritesNpyAndHdf5InBands) {
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
  for (const std::string& out_path : {path("y.npy"), path("y.h5") + ":/g/y"}) {
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
TEST_F(TensorIo, QuantizeStreamNamesANaNInALateBand) {
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


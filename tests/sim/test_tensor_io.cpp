// The tensor readers of sim/io/tensor_io.cpp: round trips through each file
// kind, and the malformed files the fuzzer (tests/fuzz/fuzz_readers) found or
// aims at, which must fail with exmy::Error and not allocate what a header
// claims.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "formats/error.hpp"
#include "sim/io/h5.hpp"
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

}  // namespace
}  // namespace exmy::io


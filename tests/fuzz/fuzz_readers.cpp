// libFuzzer target: the tensor readers of sim/io/tensor_io.cpp on arbitrary
// file contents.
//
// Input layout: byte 0 picks the reader (modulo the number of enabled
// readers, in the order npy, raw, h5), bytes 1 and 2 the requested shape
// (signed; with bit 7 of byte 0 set for .npy and HDF5, the shape is left to
// the file), byte 3 (HDF5 only) the dataset name; the rest is written to a
// temporary file as it is. A reader must either return a tensor whose size
// matches its shape or throw exmy::Error; anything else (another exception,
// a sanitizer report, a tensor of the wrong size) is a crash.
//
// EXMY_FUZZ_READERS (default "npy,raw,h5") enables a subset of the readers.
// tools/ci-fuzz.sh runs npy,raw and h5 as separate jobs, because libhdf5
// 1.10 itself crashes on some malformed files (e.g. a NULL memcpy in
// H5F__accum_read after an unchecked huge malloc in H5C_protect); those are
// reported apart from exmy's own failures. The target calls
// read_tensor_in_process, so that libhdf5 runs (and crashes) in the fuzzed
// process; exmy's read_tensor reads HDF5 in a child process and turns such a
// crash into an exmy::Error (tests/sim/test_tensor_io.cpp checks it on the
// inputs of tests/fuzz/upstream).
//
// HDF5 is not instrumented (a system library), so its inputs only cover
// exmy's side of the reader; its cost per input is bounded by -max_len. The
// harness checks that the reader leaves no HDF5 handle open; memory that
// libhdf5 itself loses on malformed files is not exmy's and is suppressed
// (tests/fuzz/lsan.supp).
#include <hdf5.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "formats/error.hpp"
#include "sim/io/tensor_io.hpp"
#include "tests/fuzz/fuzz_support.hpp"

namespace {

const char* const kDatasets[] = {"/x", "/data", "/a/b", "x", "/", "/missing"};

enum Kind { kNpy, kRaw, kH5 };

// The readers enabled by EXMY_FUZZ_READERS.
const std::vector<Kind>& enabled_kinds() {
  static const std::vector<Kind> kinds = [] {
    const char* env = std::getenv("EXMY_FUZZ_READERS");
    const std::string list = env && *env ? env : "npy,raw,h5";
    std::vector<Kind> k;
    if (list.find("npy") != std::string::npos) k.push_back(kNpy);
    if (list.find("raw") != std::string::npos) k.push_back(kRaw);
    if (list.find("h5") != std::string::npos) k.push_back(kH5);
    if (k.empty()) {
      std::fprintf(stderr, "fuzz_readers: EXMY_FUZZ_READERS='%s' names no reader (npy, raw, h5)\n", list.c_str());
      std::abort();
    }
    return k;
  }();
  return kinds;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 4) return 0;
  const Kind kind = enabled_kinds()[data[0] % enabled_kinds().size()];
  const bool shape_from_file = (data[0] & 0x80) != 0 && kind != kRaw;
  int64_t rows = shape_from_file ? 0 : static_cast<int8_t>(data[1]);
  int64_t cols = shape_from_file ? 0 : static_cast<int8_t>(data[2]);
  const uint8_t* body = data + 4;
  const size_t body_size = size - 4;

  const std::string& dir = exmy::fuzz::work_dir("exmy_fuzz_readers");
  std::string file, path;
  switch (kind) {
    case kNpy: file = path = dir + "/in.npy"; break;
    case kRaw: file = path = dir + "/in.f32"; break;
    case kH5:
      file = dir + "/in.h5";
      path = file + ":" + kDatasets[data[3] % (sizeof kDatasets / sizeof kDatasets[0])];
      break;
  }
  exmy::fuzz::write_file(file, body, body_size);

  try {
    const exmy::io::Tensor t = exmy::io::read_tensor_in_process(path, rows, cols);
    if (t.rows < 0 || t.cols < 0 || static_cast<uint64_t>(t.rows) * static_cast<uint64_t>(t.cols) != t.data.size()) {
      std::fprintf(stderr, "fuzz_readers: tensor of shape %lld x %lld holds %zu values\n",
                   static_cast<long long>(t.rows), static_cast<long long>(t.cols), t.data.size());
      std::abort();
    }
    if (rows != 0 || cols != 0) {
      if (t.rows != rows || t.cols != cols) {
        std::fprintf(stderr, "fuzz_readers: asked for %lld x %lld, got %lld x %lld\n", static_cast<long long>(rows),
                     static_cast<long long>(cols), static_cast<long long>(t.rows), static_cast<long long>(t.cols));
        std::abort();
      }
    }
  } catch (const exmy::Error&) {
    // The expected way to reject a file.
  }
  // Every HDF5 handle the reader opened is closed again, on success and on error.
  if (kind == kH5 && H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_ALL) != 0) {
    std::fprintf(stderr, "fuzz_readers: %lld HDF5 objects left open\n",
                 static_cast<long long>(H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_ALL)));
    std::abort();
  }
  return 0;
}

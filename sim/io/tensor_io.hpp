// Reading and writing float32 tensors and code arrays for the command line:
// raw little-endian float32 (.f32/.bin/anything else), NumPy .npy, and
// HDF5 datasets named `file.h5:/path/to/dataset`.
//
// Writers never leave a partial file behind: each output is written to a
// temporary file and placed (renamed over a regular file or a link's
// target, copied into a FIFO, character device or '-') only when every
// output of the command has been produced (see OutputSet and
// sim/io/atomic_file.hpp).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "sim/io/atomic_file.hpp"

namespace exmy::io {

struct Tensor {
  std::vector<float> data;
  int64_t rows = 0, cols = 0;
  bool shape_known = false;  // the file itself carried a 2-D shape
};

// Reads a float32 tensor. `rows`/`cols` of 0 mean "take them from the file"
// (possible for .npy and HDF5 with a 1-D or 2-D shape). Throws exmy::Error.
// HDF5 datasets are read in a child process, so that a crash of libhdf5 on
// a corrupt file (it has some) is an exmy::Error like any other bad input.
Tensor read_tensor(const std::string& path, int64_t rows, int64_t cols);
// The same with HDF5 read in this process (the fuzz target, which follows
// libhdf5's crashes and coverage in-process).
Tensor read_tensor_in_process(const std::string& path, int64_t rows, int64_t cols);

// A float32 tensor read in bands of rows, in order (`exmy quantize` streams
// its input): opening checks the file, its header and the shape as
// read_tensor does, with the same messages; read() gives the next rows.
// Raw and .npy files are read piece by piece from the file; an HDF5
// dataset is read whole (in a child process, by read_tensor) and handed out
// from memory.
class TensorReader {
 public:
  TensorReader(const std::string& path, int64_t rows, int64_t cols);
  ~TensorReader();
  TensorReader(const TensorReader&) = delete;
  TensorReader& operator=(const TensorReader&) = delete;
  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }
  bool shape_known() const { return shape_known_; }  // the file itself carried a 2-D shape
  // The next `rows` rows into dst (rows * cols floats). Throws exmy::Error.
  void read(float* dst, int64_t rows);
  // Back to row 0, for another pass.
  void rewind() { next_ = 0; }

 private:
  void read_at(void* dst, size_t n, uint64_t at) const;
  std::string path_;
  int fd_ = -1;            // raw or .npy file
  uint64_t data_off_ = 0;  // where its values start
  std::vector<float> whole_;  // an HDF5 dataset
  int64_t rows_ = 0, cols_ = 0, next_ = 0;
  bool shape_known_ = false;
};

// Kind of a path by its name.
enum class FileKind { raw, npy, hdf5 };
FileKind file_kind(const std::string& path);
// Splits `file.h5:/dataset` into its two parts.
void split_h5_path(const std::string& path, std::string& file, std::string& dataset);

// What stands at an output path of a tensor (`file.h5:/dataset` checks the
// file) is one exmy writes to (output_target), else exmy::Error: callers
// check their outputs before any work.
void check_output_path(const std::string& path);

// A set of outputs committed together.
class OutputSet {
 public:
  OutputSet() = default;
  OutputSet(const OutputSet&) = delete;
  OutputSet& operator=(const OutputSet&) = delete;
  ~OutputSet();  // removes uncommitted temporaries

  // Float32 tensor to raw/.npy/HDF5 (by the name of `path`).
  void add_tensor(const std::string& path, const float* data, int64_t rows, int64_t cols);
  // Bytes, written as they are.
  void add_bytes(const std::string& path, const void* data, size_t n);
  // Text.
  void add_text(const std::string& path, const std::string& text);
  // Outputs written in pieces, in order: open_tensor (a float32 tensor of
  // rows x cols, by the name of `path`) or open_bytes returns the output's
  // number; append adds its next piece (whole rows of a tensor, as bytes).
  size_t open_tensor(const std::string& path, int64_t rows, int64_t cols);
  size_t open_bytes(const std::string& path);
  void append(size_t output, const void* data, size_t n);
  // Closes every output and renames every temporary into place.
  void commit();

 private:
  struct Sink;  // an open temporary (tensor_io.cpp)
  struct Pending {
    std::string tmp, dest;
    OutputTarget target;     // what stands at dest (sim/io/atomic_file.hpp)
    std::string h5_dataset;  // non-empty: copy this dataset into an existing HDF5 file
    std::shared_ptr<Sink> sink;
  };
  std::vector<Pending> pending_;
  Pending pending_for(const std::string& dest, const std::string& h5_dataset);
};

// NumPy .npy bytes for a 2-D little-endian float32 array.
std::vector<uint8_t> npy_bytes(const float* data, int64_t rows, int64_t cols);

}  // namespace exmy::io

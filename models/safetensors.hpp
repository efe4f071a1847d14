// Reading and writing safetensors files: an 8-byte little-endian header
// length, a JSON header {name: {dtype, shape, data_offsets: [begin, end]},
// "__metadata__": {...}}, then the raw little-endian tensor bytes.
// Floating dtypes F32, BF16, F16, F64 and integer I32, I64 are read into
// float, double or integers; F32, BF16, F64, I32, I64 are written.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace exmy::models {

struct StTensorInfo {
  std::string name;
  std::string dtype;            // "F32", "BF16", ...
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte range in the data section
  int64_t numel() const;
};

class SafetensorsReader {
 public:
  // Reads the whole file; throws exmy::Error naming the file and the
  // problem for a missing, truncated or malformed file.
  explicit SafetensorsReader(const std::string& path);

  const std::string& path() const { return path_; }
  const std::vector<StTensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const StTensorInfo* find(std::string_view name) const;
  const StTensorInfo& get(std::string_view name) const;  // throws naming the tensor

  // Converts to T: float or double from floating dtypes, int32_t or int64_t
  // from integer dtypes (a value that does not fit is an error).
  template <class T>
  void read(const StTensorInfo& t, T* out) const;
  template <class T>
  std::vector<T> read(std::string_view name) const;

 private:
  std::string path_;
  std::vector<uint8_t> data_;  // the data section
  std::vector<StTensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

// A tensor to write: exactly one source pointer is set; `dtype` is the
// stored type (F32, BF16 or F64 from a floating source, rounded to nearest
// even; I32 or I64 from an integer source).
struct StSource {
  std::string name;
  std::vector<int64_t> shape;
  std::string dtype = "F32";
  const float* f32 = nullptr;
  const double* f64 = nullptr;
  const int32_t* i32 = nullptr;
  const int64_t* i64 = nullptr;
};

// Writes PATH.tmp and renames it to PATH when complete.
void write_safetensors(const std::string& path, const std::vector<StSource>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace exmy::models

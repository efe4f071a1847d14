// The run file: one HDF5 file per run that grows a row at a time, readable
// while the run goes on and after it is killed.
//
// The API is "append a row to dataset /a/b/c": a scalar row (one number) or
// a fixed-length vector row (width numbers), float32, float64, int64 or
// uint64. The first append creates the dataset (and its groups) as an
// extendible, chunked, deflate-compressed array of shape (rows,) or
// (rows, width); later appends must match its type and width.
//
// Convention that keeps rows aligned: every group of row datasets has a
// `step` dataset (int64), and its other datasets get exactly one row per
// `step` row. /train/{step, loss, lr, ...}, /eval/{step, loss}, and the
// statistics groups /quant/<layer>/<gemm>/<operand>/{step, <stat>...} all
// follow it; resuming a run (continue_from) relies on it to cut every group
// at the checkpoint's step.
//
// Appended rows are held in memory until flush(), which writes every
// dataset except the `step`s, flushes, then writes the `step`s and flushes
// again. So a reader of a live or killed run sees a group's `step` row only
// once the rest of that row is on disk: the first len(step) rows of each
// dataset of the group are complete (a dataset may show more, never fewer).
//
// Concurrent reading (HDF5 SWMR): the file is written in HDF5's latest
// format; after start_swmr() appends are visible to readers that open the
// file with SWMR read (h5py: h5py.File(path, "r", swmr=True)) as of the last
// flush(), and a process killed with kill -9 leaves every flushed row
// readable the same way (or after `h5clear -s FILE` for readers without
// SWMR). HDF5 1.10 cannot create objects while in SWMR mode, so a dataset or
// attribute first written after start_swmr() briefly closes the file,
// creates it, and re-enters SWMR mode; declaring datasets before
// start_swmr() (declare()) avoids that; so does leave_swmr() ... start_swmr()
// around a burst of new objects (the trainer's capture step).
//
// Besides rows, write_tensor() stores a whole float32 array with attributes
// (the /capture tensors). continue_from() copies those of steps <= max_step
// unchanged (the path holds the step: /capture/step_<N>/...).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "sim/io/h5.hpp"

namespace exmy::io {

enum class ElemType : uint8_t { f32, f64, i64, u64 };

template <class T>
constexpr ElemType elem_type_of();
template <>
constexpr ElemType elem_type_of<float>() { return ElemType::f32; }
template <>
constexpr ElemType elem_type_of<double>() { return ElemType::f64; }
template <>
constexpr ElemType elem_type_of<int64_t>() { return ElemType::i64; }
template <>
constexpr ElemType elem_type_of<uint64_t>() { return ElemType::u64; }

class RunFile {
 public:
  // Creates `path`, replacing any file there.
  explicit RunFile(const std::string& path, int deflate_level = 4);
  // Writes `path` as a copy of the run file `from` in which every group with
  // a `step` dataset keeps only its rows with step <= max_step (the rows a
  // resumed run will not write again), with the same root attributes.
  static std::unique_ptr<RunFile> continue_from(const std::string& from, const std::string& path, int64_t max_step);
  // Opens an existing run file (closed cleanly, e.g. by continue_from) to
  // append to its datasets.
  static std::unique_ptr<RunFile> open_append(const std::string& path);
  ~RunFile();
  RunFile(const RunFile&) = delete;
  RunFile& operator=(const RunFile&) = delete;

  const std::string& path() const { return path_; }

  // Root attributes (replacing an existing one).
  void set_attribute(const std::string& name, const std::string& value);
  void set_attribute(const std::string& name, const char* value) { set_attribute(name, std::string(value)); }
  void set_attribute(const std::string& name, int64_t value);
  void set_attribute(const std::string& name, double value);
  std::optional<std::string> string_attribute(const std::string& name);

  // An attribute of a dataset or group (replacing an existing one); h5py
  // reads a string list as a list of str.
  void set_attribute(const std::string& object, const std::string& name, const std::vector<std::string>& values);

  // Creates an empty dataset for rows of `width` elements (0: scalar rows)
  // unless it exists; checks type and width when it does. `chunk_rows`
  // rows per chunk (0: about 64 KiB); the statistics use small chunks, as
  // they have many datasets that grow by a row at a time.
  void declare(const std::string& dataset, ElemType type, int64_t width = 0, int64_t chunk_rows = 0);

  template <class T>
  void append(const std::string& dataset, T value) {
    append_rows(dataset, elem_type_of<T>(), 0, &value, 1);
  }
  template <class T>
  void append(const std::string& dataset, std::span<const T> row) {
    append_rows(dataset, elem_type_of<T>(), static_cast<int64_t>(row.size()), row.data(), 1);
  }
  // `n` rows at once, row-major; width 0 for scalar rows.
  void append_rows(const std::string& dataset, ElemType type, int64_t width, const void* data, int64_t n);

  bool has(const std::string& dataset) const { return sets_.count(dataset) > 0; }
  int64_t rows(const std::string& dataset) const;
  // The rows of a float64 column this file holds (written and pending), for
  // writers that continue a running figure after a resume. Throws for an
  // undeclared dataset or one of another type or width.
  std::vector<double> f64_column(const std::string& dataset) const;
  std::vector<std::string> datasets() const;

  // A scalar attribute of a tensor written by write_tensor.
  struct Attribute {
    std::string name;
    std::variant<std::string, int64_t, uint64_t, double> value;
  };
  // A whole float32 array of shape (rows, cols), contiguous, with
  // attributes; not a row dataset (append() refuses it). Fails when the
  // path exists.
  void write_tensor(const std::string& path, const float* data, int64_t rows, int64_t cols,
                    const std::vector<Attribute>& attributes);

  // From here on, SWMR readers see every flushed row.
  void start_swmr();
  // Flushes and leaves SWMR mode, so that many objects can be created
  // without reopening the file for each; start_swmr() re-enters it.
  void leave_swmr();
  bool swmr() const { return swmr_; }
  // Writes every appended row to the file (the `step`s last) and flushes it.
  void flush();
  // Flushes and closes; further calls throw. The destructor closes too.
  void close();

 private:
  struct Dataset {
    h5::Handle id;
    ElemType type = ElemType::f64;
    int64_t width = 0;
    int64_t rows = 0;                // rows in the file
    int64_t chunk_rows = 1;          // rows per chunk
    std::vector<uint8_t> pending;    // rows appended since the last flush
    int64_t pending_rows = 0;
  };
  Dataset& create(const std::string& dataset, ElemType type, int64_t width, int64_t chunk_rows);
  void write_pending(const std::string& dataset, Dataset& d);
  RunFile() = default;
  void open_file(bool create, bool swmr);
  // Runs `fn` with the file out of SWMR mode (reopening around it when needed).
  template <class Fn>
  void structural(Fn&& fn);
  void reopen_datasets();

  std::string path_;
  int deflate_ = 4;
  h5::Handle file_;
  std::map<std::string, Dataset> sets_;
  bool swmr_ = false;
  bool failed_ = false;  // a write failed: close() releases without flushing
};

// Reading helpers (tests, resume, inspection). They open the file with SWMR
// read, so they also work while a run is writing it or after a kill.
std::vector<double> read_run_column(const std::string& file, const std::string& dataset);

// The rows of a group that were written, from its `step` column: they end
// before the first step below 1, HDF5's fill value in a row that a full disk
// cut off (steps start at 1). Every reader of row groups cuts there.
inline size_t written_rows(const std::vector<double>& steps) {
  size_t n = 0;
  while (n < steps.size() && steps[n] >= 1) ++n;
  return n;
}
std::optional<std::string> read_run_attribute(const std::string& file, const std::string& name);
// Every dataset of the file (absolute paths, sorted).
std::vector<std::string> list_run_datasets(const std::string& file);
// A float32 tensor (write_tensor) with its shape; throws exmy::Error naming it when missing.
std::vector<float> read_run_tensor(const std::string& file, const std::string& dataset, int64_t& rows, int64_t& cols);

}  // namespace exmy::io

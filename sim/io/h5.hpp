// Small helpers over the HDF5 C API shared by the run file and the
// checkpoints: an owning handle, attributes, whole-array datasets. Every
// failure becomes an exmy::Error naming the file and object; HDF5's own
// error printing is switched off (it would print stacks to stderr).
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace exmy::io::h5 {

// Owns one hid_t and closes it with the matching H5*close.
class Handle {
 public:
  Handle() = default;
  Handle(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
  ~Handle() { reset(); }
  Handle(Handle&& o) noexcept : id_(o.id_), close_(o.close_) { o.id_ = -1; }
  Handle& operator=(Handle&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = o.id_;
      close_ = o.close_;
      o.id_ = -1;
    }
    return *this;
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  void reset() {
    if (id_ >= 0 && close_) close_(id_);
    id_ = -1;
  }
  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }

 private:
  hid_t id_ = -1;
  herr_t (*close_)(hid_t) = nullptr;
};

void silence_errors();  // idempotent

// libhdf5 1.10 crashes (SEGV) on some malformed files instead of returning
// an error (tests/fuzz/upstream). run_isolated runs `child`, which reads
// `file` with libhdf5, in a child process: it sends its result through
// `send` (only once it has it: whatever it throws before is the answer
// instead), and `receive` reads that result in this process from the pipe
// (with read_all), returning false when it is incomplete. An exmy::Error
// `child` throws is thrown here with the same message; a child that dies or
// stops short becomes an exmy::Error naming `file`. The child writes nothing
// to stderr and leaves with _exit. Where no pipe or child process can be
// had, `in_process` does the work here instead.
// libhdf5 can also loop forever on one (a corrupt global heap under a
// string attribute did): the child is killed, and an exmy::Error names
// `file`, when `idle_limit_s` seconds pass without a heartbeat() from it and
// before its answer (by default read_idle_limit(); 0: no limit).
using Send = std::function<bool(const void* p, size_t n)>;
// 30 s, or EXMY_HDF5_IDLE_LIMIT seconds when that is set to a positive number.
double read_idle_limit();
void run_isolated(const std::string& file, const std::function<void(const Send& send)>& child,
                  const std::function<bool(int fd)>& receive, const std::function<void()>& in_process,
                  double idle_limit_s = read_idle_limit());
// The common case: a string result.
std::string run_isolated(const std::string& file, const std::function<std::string()>& fn,
                         double idle_limit_s = read_idle_limit());
// Tells run_isolated's parent that the child is making progress; readers
// call it before each libhdf5 read. Does nothing outside such a child.
void heartbeat();
// Reads exactly n bytes, retried on EINTR; false on EOF or error.
bool read_all(int fd, void* p, size_t n);

// Opens an existing file read-only for reading a run file: plainly first (a
// closed file: a corrupt checksum fails at once), then as an SWMR reader (a
// file a run is writing, or one a killed run left open) with 25 metadata read
// attempts instead of libhdf5's 100, whose doubling back-off would spend
// hours on a corrupt block. Returns an invalid handle when neither works.
Handle open_read(const std::string& path);

// A file access property list asking for the newest file format (SWMR needs it).
Handle latest_format_fapl();
// A link creation property list that creates missing intermediate groups.
Handle intermediate_groups_lcpl();

// Files and groups for the writers outside sim/io (checkpoints, sweep
// attributes), so that no raw HDF5 call lives elsewhere. Each returns an
// invalid handle on failure; the caller names the file in its message.
// create_file truncates `path` (a temporary: io::write_file_atomic) and
// uses the newest file format, whose metadata carries checksums.
Handle create_file(const std::string& path, bool latest_format = true);
Handle open_file(const std::string& path, bool writable);
// Whether `path` is a regular file with an HDF5 signature.
bool is_hdf5_file(const std::string& path);
// The datasets below group `group` of a file (paths relative to it, in
// HDF5's name order), or nullopt when there is no such group.
std::optional<std::vector<std::string>> datasets_below(hid_t file, const std::string& group);
// Whether the dataset at `path` is float32 with two dimensions.
bool is_float32_matrix(hid_t loc, const std::string& path);
// A dataset at `path` (missing groups created) holding a whole column:
// variable-length UTF-8 strings, or float64 / int64 / uint64 numbers,
// contiguous (the small tables of sweep results); throws naming `path`.
void write_column(hid_t loc, const std::string& path, const std::vector<std::string>& v);
void write_column(hid_t loc, const std::string& path, const std::vector<double>& v);
void write_column(hid_t loc, const std::string& path, const std::vector<int64_t>& v);
void write_column(hid_t loc, const std::string& path, const std::vector<uint64_t>& v);
// A group: the root, an existing one, or one created with any missing parents.
Handle open_root(hid_t file);
Handle open_group(hid_t loc, const std::string& path);
Handle open_or_create_group(hid_t loc, const std::string& path);
Handle open_dataset(hid_t loc, const std::string& path);
// H5Fflush of the whole file; false on failure.
bool flush_file(hid_t file);

// True when every component of the absolute `path` exists under `loc`.
bool path_exists(hid_t loc, const std::string& path);

// Root/group/dataset attributes; writing replaces an existing attribute.
// Strings are variable-length UTF-8 (h5py reads them as str).
void write_attribute(hid_t obj, const std::string& name, const std::string& value);
void write_attribute(hid_t obj, const std::string& name, int64_t value);
void write_attribute(hid_t obj, const std::string& name, double value);
void write_u64_attribute(hid_t obj, const std::string& name, uint64_t value);
// A one-dimensional array of variable-length UTF-8 strings (h5py: a list of str).
void write_attribute(hid_t obj, const std::string& name, const std::vector<std::string>& values);
// Scalar attributes (nullopt when missing, of another type, or an array).
std::optional<std::string> read_string_attribute(hid_t obj, const std::string& name);
std::optional<std::vector<std::string>> read_string_list_attribute(hid_t obj, const std::string& name);
std::optional<int64_t> read_int_attribute(hid_t obj, const std::string& name);
std::optional<double> read_double_attribute(hid_t obj, const std::string& name);
// A uint64 attribute (nullopt when missing, not an integer, or unreadable).
std::optional<uint64_t> read_u64_attribute(hid_t obj, const std::string& name);
bool has_attribute(hid_t obj, const std::string& name);
// Copies scalar string, integer and float attributes and string lists of `from` to `to`.
void copy_attributes(hid_t from, hid_t to);

// A whole dataset of float32 / uint64 / float64 with the given shape,
// chunked with HDF5's Fletcher-32 checksum (a corrupt chunk fails the read).
void write_array(hid_t loc, const std::string& path, const float* data, const std::vector<int64_t>& shape);
void write_array(hid_t loc, const std::string& path, const uint64_t* data, const std::vector<int64_t>& shape);
void write_array(hid_t loc, const std::string& path, const double* data, const std::vector<int64_t>& shape);
// Reads a float32 dataset; throws exmy::Error (naming `what`) when it is missing or its shape differs.
void read_array(hid_t loc, const std::string& path, float* data, const std::vector<int64_t>& shape,
                const std::string& what);
std::vector<uint64_t> read_u64_array(hid_t loc, const std::string& path, const std::string& what);
std::vector<double> read_f64_array(hid_t loc, const std::string& path, const std::string& what);

}  // namespace exmy::io::h5

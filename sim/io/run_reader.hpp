// The one reader of run files (docs/hdf5-schema.md): `exmy inspect`, the
// sweep summaries, resume and the tests read run.h5 through it. It opens the
// file with SWMR read (io::h5::open_read), so a file a run is writing, or
// one a killed run left open, reads as well as a closed one; every dataset
// read refreshes to the writer's last flush. Failures are exmy::Error lines
// naming the file and the dataset.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "sim/io/h5.hpp"

namespace exmy::io {

class RunReader {
 public:
  // Throws when `path` is missing, a directory, not HDF5, or cannot be opened.
  explicit RunReader(const std::string& path);

  const std::string& path() const { return path_; }
  // Every dataset and group (absolute paths; datasets sorted), listed on
  // first use (a walk of the whole file: the single-dataset reads below do
  // not need it).
  const std::vector<std::string>& datasets() const;
  const std::set<std::string>& groups() const;
  bool has(const std::string& dataset) const;
  // Groups below `top` (paths relative to it) that hold a `step` dataset.
  std::vector<std::string> step_groups(const std::string& top) const;

  // A numeric dataset as doubles: (rows,) or (rows, width) row-major, with
  // *width (where given) set to 0 for one dimension. Throws when it is
  // missing, not numeric, or of more than two dimensions.
  std::vector<double> read(const std::string& dataset, int64_t* width = nullptr) const;
  // A dataset, or nothing when the file has no such dataset.
  std::vector<double> column(const std::string& dataset) const {
    return has(dataset) ? read(dataset) : std::vector<double>{};
  }
  // A float32 tensor of two dimensions (RunFile::write_tensor) with its shape.
  std::vector<float> tensor(const std::string& dataset, int64_t& rows, int64_t& cols) const;

  // Root attributes: one string attribute (nullopt when missing or not a
  // string), and all of them as printable text (numbers as %.10g).
  std::optional<std::string> string_attribute(const std::string& name) const;
  std::map<std::string, std::string> attributes() const;

  hid_t file() const { return f_.get(); }

 private:
  void list() const;

  std::string path_;
  h5::Handle f_, root_;
  mutable bool listed_ = false;
  mutable std::vector<std::string> datasets_;
  mutable std::set<std::string> dataset_set_;
  mutable std::set<std::string> groups_;
};

}  // namespace exmy::io

#include "sim/io/run_file.hpp"

#include "sim/io/run_reader.hpp"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <type_traits>

#include "formats/error.hpp"
#include "sim/io/atomic_file.hpp"

namespace exmy::io {

using h5::Handle;

namespace {

hid_t file_type(ElemType t) {
  switch (t) {
    case ElemType::f32: return H5T_IEEE_F32LE;
    case ElemType::f64: return H5T_IEEE_F64LE;
    case ElemType::i64: return H5T_STD_I64LE;
    case ElemType::u64: return H5T_STD_U64LE;
  }
  return H5T_IEEE_F64LE;
}

hid_t mem_type(ElemType t) {
  switch (t) {
    case ElemType::f32: return H5T_NATIVE_FLOAT;
    case ElemType::f64: return H5T_NATIVE_DOUBLE;
    case ElemType::i64: return H5T_NATIVE_INT64;
    case ElemType::u64: return H5T_NATIVE_UINT64;
  }
  return H5T_NATIVE_DOUBLE;
}

size_t elem_bytes(ElemType t) { return t == ElemType::f32 ? 4 : 8; }

const char* type_name(ElemType t) {
  switch (t) {
    case ElemType::f32: return "float32";
    case ElemType::f64: return "float64";
    case ElemType::i64: return "int64";
    case ElemType::u64: return "uint64";
  }
  return "?";
}

// The ElemType a stored dataset's type maps to.
bool elem_type_of_stored(hid_t dtype, ElemType& out) {
  const H5T_class_t c = H5Tget_class(dtype);
  const size_t size = H5Tget_size(dtype);
  if (c == H5T_FLOAT) {
    out = size == 4 ? ElemType::f32 : ElemType::f64;
    return size == 4 || size == 8;
  }
  if (c == H5T_INTEGER && size == 8) {
    out = H5Tget_sign(dtype) == H5T_SGN_NONE ? ElemType::u64 : ElemType::i64;
    return true;
  }
  return false;
}

// Row datasets are appended at their end, so each keeps at most one or two
// chunks in its cache; a small hash table saves memory when a run file has
// thousands of statistics datasets (HDF5's default is 521 slots each).
Handle dataset_access() {
  Handle dapl(H5Pcreate(H5P_DATASET_ACCESS), H5Pclose);
  H5Pset_chunk_cache(dapl.get(), 11, 1 << 20, H5D_CHUNK_CACHE_W0_DEFAULT);
  return dapl;
}

// Rows per chunk of a stored dataset of rank `rank` (0: not chunked).
int64_t chunk_rows_of(hid_t dataset, int rank) {
  Handle dcpl(H5Dget_create_plist(dataset), H5Pclose);
  hsize_t chunk[2] = {0, 0};
  if (H5Pget_layout(dcpl.get()) == H5D_CHUNKED && H5Pget_chunk(dcpl.get(), rank, chunk) == rank)
    return static_cast<int64_t>(chunk[0]);
  return 0;
}

bool is_capture(const std::string& path) { return path.starts_with("/capture/"); }

// N of "/capture/step_<N>/...", or -1.
int64_t capture_step(const std::string& path) {
  const std::string prefix = "/capture/step_";
  if (!path.starts_with(prefix)) return -1;
  int64_t n = 0;
  size_t i = prefix.size();
  if (i >= path.size() || !std::isdigit(static_cast<unsigned char>(path[i]))) return -1;
  for (; i < path.size() && std::isdigit(static_cast<unsigned char>(path[i])); ++i) n = n * 10 + (path[i] - '0');
  return n;
}

Handle open_for_reading(const std::string& path) {
  h5::silence_errors();
  // SWMR read works for a file a writer holds open in SWMR mode, for one
  // left behind by a killed writer, and for a cleanly closed one.
  Handle f = h5::open_read(path);
  if (!f.valid()) throw Error("cannot open run file '" + path + "' (missing, or not an HDF5 file)");
  return f;
}

// The cause of a failed write for its message.
std::string write_failure(const std::string& path) {
  const std::string full = disk_full_note(path);
  return full.empty() ? std::string("an I/O error, or the disk is full") : full;
}

bool is_step(const std::string& path) { return path == "/step" || path.ends_with("/step"); }

std::string parent_of(const std::string& path) {
  const size_t s = path.rfind('/');
  return s == std::string::npos || s == 0 ? "/" : path.substr(0, s);
}

std::vector<double> read_column(hid_t f, const std::string& dataset, const std::string& file) {
  if (!h5::path_exists(f, dataset)) throw Error("run file '" + file + "' has no dataset '" + dataset + "'");
  Handle d(H5Dopen2(f, dataset.c_str(), H5P_DEFAULT), H5Dclose);
  Handle s(H5Dget_space(d.get()), H5Sclose);
  const hssize_t n = H5Sget_simple_extent_npoints(s.get());
  if (!d.valid() || n < 0) throw Error("cannot read dataset '" + dataset + "' of run file '" + file + "'");
  std::vector<double> v(static_cast<size_t>(n));
  if (n > 0 && H5Dread(d.get(), H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()) < 0)
    throw Error("cannot read dataset '" + dataset + "' of run file '" + file + "'");
  return v;
}

herr_t collect_dataset(hid_t, const char* name, const H5O_info_t* info, void* out) {
  if (info->type == H5O_TYPE_DATASET) static_cast<std::vector<std::string>*>(out)->push_back(std::string("/") + name);
  return 0;
}

}  // namespace

RunFile::RunFile(const std::string& path, int deflate_level) : path_(path), deflate_(deflate_level) {
  h5::silence_errors();
  open_file(true, false);
}

RunFile::~RunFile() {
  try {
    close();
  } catch (...) {
    // Closing is best effort in a destructor; close() reports errors.
  }
}

void RunFile::open_file(bool create, bool swmr) {
  Handle fapl = h5::latest_format_fapl();
  // A run file keeps thousands of datasets open (one per statistic of every
  // quantized operand). HDF5's default metadata cache (2 MiB, adaptive) then
  // has to evict entries while it writes, and in SWMR-write mode that
  // eviction of flush-dependent entries fails inside the library (1.10).
  // A cache large enough for every open object header and chunk index
  // never evicts in the first place.
  H5AC_cache_config_t mdc;
  mdc.version = H5AC__CURR_CACHE_CONFIG_VERSION;
  if (H5Pget_mdc_config(fapl.get(), &mdc) >= 0) {
    mdc.set_initial_size = true;
    mdc.initial_size = 64u << 20;
    mdc.min_size = 64u << 20;
    mdc.max_size = 128u << 20;  // HDF5's upper limit
    if (H5Pset_mdc_config(fapl.get(), &mdc) < 0) throw Error("HDF5: cannot size the metadata cache");
  }
  if (create) {
    file_ = Handle(H5Fcreate(path_.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get()), H5Fclose);
    if (!file_.valid()) throw Error("cannot create run file '" + path_ + "'");
  } else {
    const unsigned flags = H5F_ACC_RDWR | (swmr ? H5F_ACC_SWMR_WRITE : 0u);
    file_ = Handle(H5Fopen(path_.c_str(), flags, fapl.get()), H5Fclose);
    if (!file_.valid()) throw Error("cannot reopen run file '" + path_ + "'");
  }
  swmr_ = swmr;
}

void RunFile::reopen_datasets() {
  Handle dapl = dataset_access();
  for (auto& [name, d] : sets_) {
    d.id = Handle(H5Dopen2(file_.get(), name.c_str(), dapl.get()), H5Dclose);
    if (!d.id.valid()) throw Error("run file '" + path_ + "': cannot reopen dataset '" + name + "'");
  }
}

template <class Fn>
void RunFile::structural(Fn&& fn) {
  if (!file_.valid()) throw Error("run file '" + path_ + "' is closed");
  if (!swmr_) {
    fn();
    return;
  }
  for (auto& [name, d] : sets_) d.id.reset();
  file_.reset();
  open_file(false, false);
  reopen_datasets();
  fn();
  for (auto& [name, d] : sets_) d.id.reset();
  file_.reset();
  open_file(false, true);
  reopen_datasets();
}

void RunFile::set_attribute(const std::string& name, const std::string& value) {
  structural([&] { h5::write_attribute(file_.get(), name, value); });
}
void RunFile::set_attribute(const std::string& name, int64_t value) {
  structural([&] { h5::write_attribute(file_.get(), name, value); });
}
void RunFile::set_attribute(const std::string& name, double value) {
  structural([&] { h5::write_attribute(file_.get(), name, value); });
}
void RunFile::set_attribute(const std::string& object, const std::string& name,
                            const std::vector<std::string>& values) {
  structural([&] {
    Handle o(H5Oopen(file_.get(), object.c_str(), H5P_DEFAULT), H5Oclose);
    if (!o.valid()) throw Error("run file '" + path_ + "' has no object '" + object + "'");
    h5::write_attribute(o.get(), name, values);
  });
}
std::optional<std::string> RunFile::string_attribute(const std::string& name) {
  return h5::read_string_attribute(file_.get(), name);
}

RunFile::Dataset& RunFile::create(const std::string& dataset, ElemType type, int64_t width, int64_t rows_per_chunk) {
  if (dataset.empty() || dataset[0] != '/') throw Error("run file dataset '" + dataset + "' must be an absolute path");
  if (width < 0) throw Error("run file dataset '" + dataset + "': negative row width");
  if (is_capture(dataset)) throw Error("run file dataset '" + dataset + "': /capture/ holds tensors, not rows");
  structural([&] {
    const int rank = width > 0 ? 2 : 1;
    // About 64 KiB per chunk unless asked otherwise: rows are small and
    // appended one at a time.
    const hsize_t chunk_rows =
        rows_per_chunk > 0 ? static_cast<hsize_t>(rows_per_chunk)
                           : std::max<hsize_t>(1, 8192 / static_cast<hsize_t>(std::max<int64_t>(width, 1)));
    const hsize_t dims[2] = {0, static_cast<hsize_t>(width)};
    const hsize_t maxdims[2] = {H5S_UNLIMITED, static_cast<hsize_t>(width)};
    const hsize_t chunk[2] = {chunk_rows, static_cast<hsize_t>(width)};
    Handle space(H5Screate_simple(rank, dims, maxdims), H5Sclose);
    Handle dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
    H5Pset_chunk(dcpl.get(), rank, chunk);
    if (deflate_ > 0) {
      H5Pset_shuffle(dcpl.get());
      H5Pset_deflate(dcpl.get(), static_cast<unsigned>(deflate_));
      // The chunk being appended to stays uncompressed until it is full and
      // is then compressed once. Compressing it at every flush would change
      // its size each time, and the reallocation of thousands of chunks per
      // flush is what makes HDF5's SWMR flush slow (see flush()).
      H5Pset_chunk_opts(dcpl.get(), H5D_CHUNK_DONT_FILTER_PARTIAL_CHUNKS);
    }
    Handle lcpl = h5::intermediate_groups_lcpl();
    Handle dapl = dataset_access();
    Handle d(H5Dcreate2(file_.get(), dataset.c_str(), file_type(type), space.get(), lcpl.get(), dcpl.get(),
                        dapl.get()),
             H5Dclose);
    if (!d.valid())
      throw Error("run file '" + path_ + "': cannot create dataset '" + dataset +
                  "' (a group or dataset of that name already exists?)");
    Dataset ds;
    ds.id = std::move(d);
    ds.type = type;
    ds.width = width;
    ds.chunk_rows = static_cast<int64_t>(chunk_rows);
    sets_.emplace(dataset, std::move(ds));
  });
  return sets_.at(dataset);
}

void RunFile::declare(const std::string& dataset, ElemType type, int64_t width, int64_t chunk_rows) {
  auto it = sets_.find(dataset);
  if (it == sets_.end()) {
    create(dataset, type, width, chunk_rows);
    return;
  }
  if (it->second.type != type || it->second.width != width)
    throw Error("run file dataset '" + dataset + "' holds " + type_name(it->second.type) + " rows of width " +
                std::to_string(it->second.width) + ", not " + type_name(type) + " of width " + std::to_string(width));
}

void RunFile::append_rows(const std::string& dataset, ElemType type, int64_t width, const void* data, int64_t n) {
  declare(dataset, type, width);
  if (n <= 0) return;
  // Rows wait in memory until flush(), which writes every group's `step`
  // after its other datasets (see the header).
  Dataset& d = sets_.at(dataset);
  const size_t bytes = static_cast<size_t>(n * std::max<int64_t>(width, 1)) * elem_bytes(type);
  const auto* p = static_cast<const uint8_t*>(data);
  d.pending.insert(d.pending.end(), p, p + bytes);
  d.pending_rows += n;
}

void RunFile::write_pending(const std::string& dataset, Dataset& d) {
  if (d.pending_rows == 0) return;
  const int64_t n = d.pending_rows, width = d.width;
  const hsize_t start[2] = {static_cast<hsize_t>(d.rows), 0};
  const hsize_t count[2] = {static_cast<hsize_t>(n), static_cast<hsize_t>(width)};
  const hsize_t extent[2] = {static_cast<hsize_t>(d.rows + n), static_cast<hsize_t>(width)};
  const int rank = width > 0 ? 2 : 1;
  if (H5Dset_extent(d.id.get(), extent) < 0) {
    failed_ = true;
    throw Error("run file '" + path_ + "': cannot extend dataset '" + dataset + "'");
  }
  Handle fspace(H5Dget_space(d.id.get()), H5Sclose);
  Handle mspace(H5Screate_simple(rank, count, nullptr), H5Sclose);
  if (H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, start, nullptr, count, nullptr) < 0 ||
      H5Dwrite(d.id.get(), mem_type(d.type), mspace.get(), fspace.get(), H5P_DEFAULT, d.pending.data()) < 0) {
    failed_ = true;
    throw Error("run file '" + path_ + "': cannot write dataset '" + dataset + "' (" + write_failure(path_) + ")");
  }
  d.rows += n;
  d.pending.clear();
  d.pending_rows = 0;
}

int64_t RunFile::rows(const std::string& dataset) const {
  auto it = sets_.find(dataset);
  return it == sets_.end() ? 0 : it->second.rows + it->second.pending_rows;
}

std::vector<double> RunFile::f64_column(const std::string& dataset) const {
  const auto it = sets_.find(dataset);
  if (it == sets_.end() || it->second.type != ElemType::f64 || it->second.width != 0)
    throw Error("run file '" + path_ + "': '" + dataset + "' is not a float64 column");
  const Dataset& d = it->second;
  std::vector<double> v(static_cast<size_t>(d.rows + d.pending_rows));
  if (d.rows > 0 && H5Dread(d.id.get(), H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()) < 0)
    throw Error("run file '" + path_ + "': cannot read '" + dataset + "'");
  if (d.pending_rows > 0) std::memcpy(v.data() + d.rows, d.pending.data(), static_cast<size_t>(d.pending_rows) * sizeof(double));
  return v;
}

std::vector<std::string> RunFile::datasets() const {
  std::vector<std::string> v;
  for (const auto& [name, d] : sets_) v.push_back(name);
  return v;
}

void RunFile::start_swmr() {
  if (swmr_) return;
  if (!file_.valid()) throw Error("run file '" + path_ + "' is closed");
  // Reopening in SWMR-write mode (rather than H5Fstart_swmr_write) sidesteps
  // that call's rules about which objects may be open at the switch.
  for (auto& [name, d] : sets_) d.id.reset();
  H5Fflush(file_.get(), H5F_SCOPE_GLOBAL);
  file_.reset();
  open_file(false, true);
  reopen_datasets();
}

void RunFile::leave_swmr() {
  if (!swmr_) return;
  flush();
  for (auto& [name, d] : sets_) d.id.reset();
  file_.reset();
  open_file(false, false);
  reopen_datasets();
}

void RunFile::write_tensor(const std::string& path, const float* data, int64_t rows, int64_t cols,
                           const std::vector<Attribute>& attributes) {
  if (rows < 0 || cols < 0) throw Error("run file tensor '" + path + "': negative shape");
  structural([&] {
    if (h5::path_exists(file_.get(), path)) throw Error("run file '" + path_ + "' already holds '" + path + "'");
    const hsize_t dims[2] = {static_cast<hsize_t>(rows), static_cast<hsize_t>(cols)};
    Handle space(H5Screate_simple(2, dims, nullptr), H5Sclose);
    Handle lcpl = h5::intermediate_groups_lcpl();
    Handle d(H5Dcreate2(file_.get(), path.c_str(), H5T_IEEE_F32LE, space.get(), lcpl.get(), H5P_DEFAULT, H5P_DEFAULT),
             H5Dclose);
    if (!d.valid() || (rows * cols > 0 && H5Dwrite(d.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0))
      throw Error("run file '" + path_ + "': cannot write tensor '" + path + "' (" + write_failure(path_) + ")");
    for (const auto& a : attributes)
      std::visit(
          [&](const auto& v) {
            using V = std::decay_t<decltype(v)>;
            if constexpr (std::is_same_v<V, uint64_t>) h5::write_u64_attribute(d.get(), a.name, v);
            else h5::write_attribute(d.get(), a.name, v);
          },
          a.value);
  });
}

void RunFile::flush() {
  if (!file_.valid()) throw Error("run file '" + path_ + "' is closed");
  // Two phases, each ending in a flush to disk: first every dataset but the
  // `step`s, then the `step`s. A reader (or a file cut by kill -9) never sees
  // a step whose row is missing elsewhere in its group.
  //
  // Within a phase, the file is also flushed after every kChunkWriteBatch
  // writes that start or complete a chunk. Such a write allocates file space
  // and changes the chunk index, and HDF5 1.10's metadata cache flush in
  // SWMR mode costs about the square of the number of such changes (the
  // first flush of a run with ~14,000 statistics datasets took 10-15 s, the
  // ones at chunk boundaries up to 25 s); a flush has a fixed cost too, so
  // plain appends inside a chunk are not batched.
  constexpr int kChunkWriteBatch = 1024;
  auto sync = [&] {
    if (H5Fflush(file_.get(), H5F_SCOPE_GLOBAL) < 0) {
      failed_ = true;
      throw Error("cannot flush run file '" + path_ + "' (" + write_failure(path_) + ")");
    }
  };
  for (const bool steps : {false, true}) {
    int chunk_writes = 0;
    for (auto& [name, d] : sets_) {
      if (is_step(name) != steps || d.pending_rows == 0) continue;
      const int64_t c = std::max<int64_t>(d.chunk_rows, 1);
      const bool chunk_write = d.rows % c == 0 || (d.rows + d.pending_rows) / c != d.rows / c;
      write_pending(name, d);
      if (chunk_write && ++chunk_writes % kChunkWriteBatch == 0) sync();
    }
    sync();
  }
}

void RunFile::close() {
  if (!file_.valid()) return;
  // After a failed write HDF5's own state is suspect: writing again can
  // crash inside the library. What was flushed before stays on disk.
  if (!failed_) flush();
  for (auto& [name, d] : sets_) d.id.reset();
  file_.reset();
}

std::unique_ptr<RunFile> RunFile::continue_from(const std::string& from, const std::string& path, int64_t max_step) {
  Handle src = open_for_reading(from);
  std::unique_ptr<RunFile> rf(new RunFile());
  rf->path_ = path;
  h5::silence_errors();
  rf->open_file(true, false);
  {
    Handle sroot(H5Gopen2(src.get(), "/", H5P_DEFAULT), H5Gclose);
    Handle droot(H5Gopen2(rf->file_.get(), "/", H5P_DEFAULT), H5Gclose);
    h5::copy_attributes(sroot.get(), droot.get());
  }
  std::vector<std::string> names;
  if (H5Ovisit2(src.get(), H5_INDEX_NAME, H5_ITER_INC, collect_dataset, &names, H5O_INFO_BASIC) < 0)
    throw Error("cannot read run file '" + from + "' (corrupt?)");
  std::map<std::string, int64_t> keep;  // group -> rows to keep
  for (const auto& name : names) {
    if (is_capture(name)) {
      // Tensors of a capture step the resumed run has already done are
      // kept as they are; later ones it will write again.
      const int64_t step = capture_step(name);
      if (step < 0 || step > max_step) continue;
      // Read and written again rather than H5Ocopy'd: HDF5 1.10's H5Ocopy
      // crashes on a dataset whose many string attributes are in dense
      // attribute storage.
      int64_t rows = 0, cols = 0;
      const std::vector<float> x = read_run_tensor(from, name, rows, cols);
      rf->write_tensor(name, x.data(), rows, cols, {});
      Handle sd(H5Dopen2(src.get(), name.c_str(), H5P_DEFAULT), H5Dclose);
      Handle dd(H5Dopen2(rf->file_.get(), name.c_str(), H5P_DEFAULT), H5Dclose);
      if (!sd.valid() || !dd.valid()) throw Error("cannot copy '" + name + "' of run file '" + from + "'");
      h5::copy_attributes(sd.get(), dd.get());
      continue;
    }
    Handle d(H5Dopen2(src.get(), name.c_str(), H5P_DEFAULT), H5Dclose);
    Handle t(H5Dget_type(d.get()), H5Tclose);
    Handle s(H5Dget_space(d.get()), H5Sclose);
    ElemType type;
    const int rank = H5Sget_simple_extent_ndims(s.get());
    hsize_t dims[2] = {0, 0};
    if (!d.valid() || !elem_type_of_stored(t.get(), type) || rank < 1 || rank > 2 ||
        H5Sget_simple_extent_dims(s.get(), dims, nullptr) != rank)
      throw Error("run file '" + from + "': dataset '" + name + "' is not a row dataset exmy wrote");
    const int64_t width = rank == 2 ? static_cast<int64_t>(dims[1]) : 0;
    int64_t n = static_cast<int64_t>(dims[0]);
    const std::string group = parent_of(name);
    if (!keep.count(group)) {
      int64_t k = -1;
      const std::string step = (group == "/" ? "" : group) + "/step";
      if (h5::path_exists(src.get(), step)) {
        const auto steps = read_column(src.get(), step, from);
        k = 0;
        const int64_t written = static_cast<int64_t>(written_rows(steps));
        while (k < written && steps[static_cast<size_t>(k)] <= static_cast<double>(max_step)) ++k;
      }
      keep[group] = k;
    }
    if (keep[group] >= 0) n = std::min(n, keep[group]);
    std::vector<uint8_t> buf(static_cast<size_t>(n * std::max<int64_t>(width, 1)) * elem_bytes(type));
    if (n > 0) {
      const hsize_t start[2] = {0, 0};
      const hsize_t count[2] = {static_cast<hsize_t>(n), static_cast<hsize_t>(width)};
      Handle ms(H5Screate_simple(rank, count, nullptr), H5Sclose);
      if (H5Sselect_hyperslab(s.get(), H5S_SELECT_SET, start, nullptr, count, nullptr) < 0 ||
          H5Dread(d.get(), mem_type(type), ms.get(), s.get(), H5P_DEFAULT, buf.data()) < 0)
        throw Error("cannot read dataset '" + name + "' of run file '" + from + "' (corrupt?)");
    }
    rf->declare(name, type, width, chunk_rows_of(d.get(), rank));  // the same chunking as the original
    rf->append_rows(name, type, width, buf.data(), n);
    rf->write_pending(name, rf->sets_.at(name));  // one dataset in memory at a time
    h5::copy_attributes(d.get(), rf->sets_.at(name).id.get());
  }
  return rf;
}

std::unique_ptr<RunFile> RunFile::open_append(const std::string& path) {
  h5::silence_errors();
  std::unique_ptr<RunFile> rf(new RunFile());
  rf->path_ = path;
  rf->open_file(false, false);
  std::vector<std::string> names;
  if (H5Ovisit2(rf->file_.get(), H5_INDEX_NAME, H5_ITER_INC, collect_dataset, &names, H5O_INFO_BASIC) < 0)
    throw Error("cannot read run file '" + path + "' (corrupt?)");
  Handle dapl = dataset_access();
  for (const auto& name : names) {
    if (is_capture(name)) continue;  // tensors, not rows
    Dataset ds;
    ds.id = Handle(H5Dopen2(rf->file_.get(), name.c_str(), dapl.get()), H5Dclose);
    Handle t(H5Dget_type(ds.id.get()), H5Tclose);
    Handle s(H5Dget_space(ds.id.get()), H5Sclose);
    const int rank = H5Sget_simple_extent_ndims(s.get());
    hsize_t dims[2] = {0, 0};
    if (!ds.id.valid() || !elem_type_of_stored(t.get(), ds.type) || rank < 1 || rank > 2 ||
        H5Sget_simple_extent_dims(s.get(), dims, nullptr) != rank)
      throw Error("run file '" + path + "': dataset '" + name + "' is not a row dataset exmy wrote");
    ds.width = rank == 2 ? static_cast<int64_t>(dims[1]) : 0;
    ds.rows = static_cast<int64_t>(dims[0]);
    ds.chunk_rows = std::max<int64_t>(chunk_rows_of(ds.id.get(), rank), 1);
    rf->sets_.emplace(name, std::move(ds));
  }
  return rf;
}

std::vector<double> read_run_column(const std::string& file, const std::string& dataset) {
  return RunReader(file).read(dataset);
}

std::optional<std::string> read_run_attribute(const std::string& file, const std::string& name) {
  return RunReader(file).string_attribute(name);
}

std::vector<std::string> list_run_datasets(const std::string& file) { return RunReader(file).datasets(); }

std::vector<float> read_run_tensor(const std::string& file, const std::string& dataset, int64_t& rows, int64_t& cols) {
  return RunReader(file).tensor(dataset, rows, cols);
}

}  // namespace exmy::io

#include "sim/io/tensor_io.hpp"

#include <fcntl.h>
#include <hdf5.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "formats/error.hpp"
#include "sim/io/h5.hpp"

namespace exmy::io {
namespace fs = std::filesystem;

namespace {

// The largest tensor exmy reads (the limit of `exmy quantize --shape`). It
// keeps every element and byte count inside int64_t and size_t.
constexpr int64_t kMaxElements = int64_t{1} << 40;

// Elements per HDF5 read: the reader's memory grows only with data that HDF5
// actually delivers, so a small file claiming a huge dataset fails early.
constexpr hsize_t kH5Piece = hsize_t{1} << 20;

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

void check_shape(const std::string& path, int64_t n_file, int64_t& rows, int64_t& cols, bool file_2d,
                 int64_t file_rows, int64_t file_cols) {
  if (rows == 0 && cols == 0) {
    if (file_2d) {
      rows = file_rows;
      cols = file_cols;
    } else {
      rows = 1;
      cols = n_file;
    }
    return;
  }
  if (rows * cols != n_file)
    throw Error("--shape " + std::to_string(rows) + "," + std::to_string(cols) + " needs " +
                std::to_string(rows * cols) + " elements but '" + path + "' holds " + std::to_string(n_file));
}

// Parses the Python-literal header of a .npy file (the subset NumPy writes)
// of `size` bytes; prefix(n) gives its first min(n, size) bytes.
void parse_npy(const std::string& path, uint64_t size, const std::function<std::vector<uint8_t>(size_t)>& prefix,
               size_t& data_off, int64_t& count, bool& is2d, int64_t& r, int64_t& c) {
  static const uint8_t magic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};
  std::vector<uint8_t> buf = prefix(12);
  if (buf.size() < 10 || std::memcmp(buf.data(), magic, 6) != 0) throw Error("'" + path + "' is not a .npy file (bad magic)");
  const int major = buf[6];
  size_t hlen, hoff;
  if (major == 1) {
    hlen = buf[8] | (static_cast<size_t>(buf[9]) << 8);
    hoff = 10;
  } else if (major == 2 || major == 3) {
    if (buf.size() < 12) throw Error("'" + path + "' is a truncated .npy file");
    hlen = buf[8] | (static_cast<size_t>(buf[9]) << 8) | (static_cast<size_t>(buf[10]) << 16) |
           (static_cast<size_t>(buf[11]) << 24);
    hoff = 12;
  } else {
    throw Error("'" + path + "' has unsupported .npy version " + std::to_string(major));
  }
  if (hoff + hlen > size) throw Error("'" + path + "' is a truncated .npy file (header runs past the end)");
  buf = prefix(hoff + hlen);
  const std::string h(reinterpret_cast<const char*>(buf.data() + hoff), hlen);
  auto value_of = [&](const std::string& key) -> std::string {
    const auto k = h.find("'" + key + "'");
    if (k == std::string::npos) throw Error("'" + path + "' .npy header lacks '" + key + "'");
    auto colon = h.find(':', k);
    if (colon == std::string::npos) throw Error("'" + path + "' has a malformed .npy header");
    size_t b = colon + 1;
    while (b < h.size() && h[b] == ' ') ++b;
    if (b >= h.size()) throw Error("'" + path + "' has a malformed .npy header");
    size_t e;
    if (h[b] == '(') e = h.find(')', b) + 1;
    else if (h[b] == '\'') e = h.find('\'', b + 1) + 1;
    else e = h.find_first_of(",}", b);
    if (e == std::string::npos || e == 0 || e <= b) throw Error("'" + path + "' has a malformed .npy header");
    return h.substr(b, e - b);
  };
  const std::string descr = value_of("descr");
  if (descr != "'<f4'" && descr != "'=f4'")
    throw Error("'" + path + "' holds dtype " + descr + "; exmy reads little-endian float32 ('<f4') .npy files");
  if (value_of("fortran_order") != "False")
    throw Error("'" + path + "' is stored in Fortran order; save it C-contiguous");
  const std::string shape = value_of("shape");
  if (shape.size() < 2 || shape.front() != '(' || shape.back() != ')')
    throw Error("'" + path + "' has a malformed .npy shape " + shape);
  std::vector<int64_t> dims;
  std::string inner = shape.substr(1, shape.size() - 2);
  std::stringstream ss(inner);
  std::string tok;
  while (std::getline(ss, tok, ',')) {
    size_t a = tok.find_first_not_of(' ');
    if (a == std::string::npos) continue;
    tok = tok.substr(a, tok.find_last_not_of(' ') - a + 1);
    int64_t d = 0;
    for (char ch : tok) {
      if (ch < '0' || ch > '9' || d > (int64_t{1} << 40)) throw Error("'" + path + "' has a malformed .npy shape " + shape);
      d = d * 10 + (ch - '0');
    }
    dims.push_back(d);
  }
  if (dims.size() > 2) throw Error("'" + path + "' has " + std::to_string(dims.size()) + " dimensions; exmy reads 1-D or 2-D arrays");
  count = 1;
  for (auto d : dims) {
    if (d != 0 && count > kMaxElements / d)
      throw Error("'" + path + "' has shape " + shape + ", more than 2^40 elements; exmy reads smaller tensors");
    count *= d;
  }
  is2d = dims.size() == 2;
  r = is2d ? dims[0] : 1;
  c = is2d ? dims[1] : count;
  data_off = hoff + hlen;
  if (size - data_off != static_cast<uint64_t>(count) * 4)
    throw Error("'" + path + "' holds " + std::to_string((size - data_off) / 4) + " float32 values but its header says " +
                std::to_string(count));
}

struct H5Silence {
  H5Silence() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }
};

// RAII for HDF5 ids.
struct H5Id {
  hid_t id = -1;
  herr_t (*close)(hid_t) = nullptr;
  H5Id(hid_t i, herr_t (*c)(hid_t)) : id(i), close(c) {}
  ~H5Id() {
    if (id >= 0 && close) close(id);
  }
  H5Id(const H5Id&) = delete;
  H5Id& operator=(const H5Id&) = delete;
};

// Refuses datasets whose values are not stored in the file: unwritten ones,
// chunked ones with missing chunks (both read back as fill values, for any
// claimed size), and contiguous or compact ones with fewer bytes stored than
// their shape needs.
void check_h5_storage(hid_t d, int nd, const hsize_t* dims, int64_t count, const std::string& dset,
                      const std::string& file) {
  const std::string what = "dataset '" + dset + "' in '" + file + "'";
  H5D_space_status_t status;
  if (H5Dget_space_status(d, &status) < 0) throw Error("cannot read " + what + " (corrupt file?)");
  if (status == H5D_SPACE_STATUS_NOT_ALLOCATED) throw Error(what + " holds no data (it was never written)");
  H5Id dcpl(H5Dget_create_plist(d), H5Pclose);
  if (dcpl.id < 0) throw Error("cannot read " + what + " (corrupt file?)");
  if (H5Pget_layout(dcpl.id) == H5D_CHUNKED) {
    hsize_t chunk[2] = {0, 0};
    if (H5Pget_chunk(dcpl.id, nd, chunk) != nd) throw Error("cannot read the chunking of " + what + " (corrupt file?)");
    hsize_t expected = 1;
    for (int k = 0; k < nd; ++k) {
      if (chunk[k] == 0) throw Error("cannot read the chunking of " + what + " (corrupt file?)");
      expected *= (dims[k] + chunk[k] - 1) / chunk[k];
    }
    hsize_t stored = 0;
    H5Id space(H5Dget_space(d), H5Sclose);
    if (H5Dget_num_chunks(d, space.id, &stored) < 0) throw Error("cannot read the chunks of " + what + " (corrupt file?)");
    if (stored != expected)
      throw Error(what + " stores " + std::to_string(stored) + " of its " + std::to_string(expected) +
                  " chunks; exmy reads fully written datasets");
  } else {
    const hsize_t stored = H5Dget_storage_size(d);
    if (stored < static_cast<hsize_t>(count) * 4)
      throw Error(what + " stores " + std::to_string(stored) + " bytes for " + std::to_string(count) +
                  " float32 values (truncated file?)");
  }
}

// Reads the whole dataset row-major into `data`, kH5Piece elements at a time.
void read_h5_pieces(hid_t d, hid_t space, int nd, const hsize_t* dims, int64_t count, std::vector<float>& data,
                    const std::string& dset, const std::string& file) {
  const hsize_t R = nd == 2 ? dims[0] : 1, C = nd == 2 ? dims[1] : dims[0];
  const hsize_t rows_per = C >= kH5Piece ? 1 : kH5Piece / C;
  const hsize_t cols_per = C >= kH5Piece ? kH5Piece : C;
  data.clear();
  data.reserve(static_cast<size_t>(std::min<int64_t>(count, int64_t{1} << 24)));
  for (hsize_t r = 0; r < R; r += rows_per) {
    const hsize_t nr = std::min(rows_per, R - r);
    for (hsize_t c = 0; c < C; c += cols_per) {
      const hsize_t nc = std::min(cols_per, C - c);
      const hsize_t start2[2] = {r, c}, count2[2] = {nr, nc};
      const hsize_t* start = nd == 2 ? start2 : start2 + 1;
      const hsize_t* cnt = nd == 2 ? count2 : count2 + 1;
      const hsize_t n = nr * nc;
      h5::heartbeat();
      H5Id mem(H5Screate_simple(1, &n, nullptr), H5Sclose);
      const size_t old = data.size();
      data.resize(old + static_cast<size_t>(n));
      if (mem.id < 0 || H5Sselect_hyperslab(space, H5S_SELECT_SET, start, nullptr, cnt, nullptr) < 0 ||
          H5Dread(d, H5T_NATIVE_FLOAT, mem.id, space, H5P_DEFAULT, data.data() + old) < 0)
        throw Error("cannot read dataset '" + dset + "' in '" + file + "' (corrupt file?)");
    }
  }
}

Tensor read_h5(const std::string& spec, int64_t rows, int64_t cols) {
  static H5Silence silence;
  std::string file, dset;
  split_h5_path(spec, file, dset);
  if (!fs::exists(file)) throw Error("cannot read '" + file + "': no such file");
  h5::heartbeat();
  H5Id f(H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (f.id < 0) throw Error("cannot open '" + file + "' as HDF5");
  if (H5Lexists(f.id, dset.c_str(), H5P_DEFAULT) <= 0) throw Error("'" + file + "' has no dataset '" + dset + "'");
  H5Id d(H5Dopen2(f.id, dset.c_str(), H5P_DEFAULT), H5Dclose);
  if (d.id < 0) throw Error("cannot open dataset '" + dset + "' in '" + file + "'");
  H5Id t(H5Dget_type(d.id), H5Tclose);
  if (H5Tget_class(t.id) != H5T_FLOAT || H5Tget_size(t.id) != 4)
    throw Error("dataset '" + dset + "' in '" + file + "' is not float32; exmy reads float32 datasets");
  H5Id s(H5Dget_space(d.id), H5Sclose);
  const int nd = H5Sget_simple_extent_ndims(s.id);
  if (nd < 1 || nd > 2) throw Error("dataset '" + dset + "' has " + std::to_string(nd) + " dimensions; exmy reads 1-D or 2-D datasets");
  hsize_t dims[2] = {1, 1};
  if (H5Sget_simple_extent_dims(s.id, dims, nullptr) != nd)
    throw Error("cannot read the shape of dataset '" + dset + "' in '" + file + "' (corrupt file?)");
  const hsize_t n0 = dims[0], n1 = nd == 2 ? dims[1] : 1;
  if (n0 > static_cast<hsize_t>(kMaxElements) || (n0 != 0 && n1 > static_cast<hsize_t>(kMaxElements) / n0))
    throw Error("dataset '" + dset + "' in '" + file + "' has more than 2^40 elements; exmy reads smaller tensors");
  const int64_t count = static_cast<int64_t>(n0 * n1);
  Tensor out;
  check_shape(spec, count, rows, cols, nd == 2, static_cast<int64_t>(dims[0]), nd == 2 ? static_cast<int64_t>(dims[1]) : count);
  out.rows = rows;
  out.cols = cols;
  out.shape_known = nd == 2;
  if (count > 0) {
    check_h5_storage(d.id, nd, dims, count, dset, file);
    read_h5_pieces(d.id, s.id, nd, dims, count, out.data, dset, file);
  }
  return out;
}

// The shape a caller asks for: 0 (from the file) or positive, at most 2^40 elements.
void check_requested_shape(int64_t rows, int64_t cols) {
  if (rows < 0 || cols < 0) throw Error("shape must not be negative");
  if (rows != 0 && cols > kMaxElements / rows)
    throw Error("shape " + std::to_string(rows) + "," + std::to_string(cols) + " has more than 2^40 elements");
}

// A user's HDF5 input is read in a child process (io::h5::run_isolated):
// libhdf5 1.10 crashes on some malformed files before it returns an error,
// and loops forever on others (the child is ended after read_idle_limit()
// seconds without a heartbeat: one per piece read).
// The reply: rows, cols, count, shape_known, then count floats.
Tensor read_h5_isolated(const std::string& spec, int64_t rows, int64_t cols) {
  std::string file, dset;
  split_h5_path(spec, file, dset);
  Tensor out;
  h5::run_isolated(
      file,
      [&](const h5::Send& send) {
        const Tensor t = read_h5(spec, rows, cols);
        const int64_t head[3] = {t.rows, t.cols, static_cast<int64_t>(t.data.size())};
        const uint8_t known = t.shape_known ? 1 : 0;
        if (send(head, sizeof head) && send(&known, 1)) send(t.data.data(), t.data.size() * sizeof(float));
      },
      [&](int fd) {
        int64_t head[3];
        uint8_t known = 0;
        if (!h5::read_all(fd, head, sizeof head) || !h5::read_all(fd, &known, 1) || head[2] < 0 ||
            head[2] > kMaxElements)
          return false;
        out.rows = head[0];
        out.cols = head[1];
        out.shape_known = known != 0;
        out.data.resize(static_cast<size_t>(head[2]));
        return h5::read_all(fd, out.data.data(), out.data.size() * sizeof(float));
      },
      [&] { out = read_h5(spec, rows, cols); });
  return out;
}

// The .npy header of a 2-D little-endian float32 array.
std::vector<uint8_t> npy_header(int64_t rows, int64_t cols) {
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + std::to_string(rows) + ", " +
                       std::to_string(cols) + "), }";
  // Pad so that the data starts at a multiple of 64 bytes, ending in '\n'.
  while ((10 + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::vector<uint8_t> out = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0};
  out.push_back(static_cast<uint8_t>(header.size() & 0xff));
  out.push_back(static_cast<uint8_t>(header.size() >> 8));
  out.insert(out.end(), header.begin(), header.end());
  return out;
}

}  // namespace

FileKind file_kind(const std::string& path) {
  if (path.find(".h5:") != std::string::npos || path.find(".hdf5:") != std::string::npos) return FileKind::hdf5;
  if (ends_with(path, ".npy")) return FileKind::npy;
  return FileKind::raw;
}

void split_h5_path(const std::string& path, std::string& file, std::string& dataset) {
  auto p = path.find(".h5:");
  size_t ext = 3;
  if (p == std::string::npos) {
    p = path.find(".hdf5:");
    ext = 5;
  }
  if (p == std::string::npos) throw Error("'" + path + "' is not of the form file.h5:/dataset");
  file = path.substr(0, p + ext);
  dataset = path.substr(p + ext + 1);
  if (dataset.empty() || dataset == "/") throw Error("'" + path + "' names no dataset (expected file.h5:/dataset)");
}

Tensor read_tensor(const std::string& path, int64_t rows, int64_t cols) {
  if (file_kind(path) != FileKind::hdf5) return read_tensor_in_process(path, rows, cols);
  check_requested_shape(rows, cols);
  return read_h5_isolated(path, rows, cols);
}

Tensor read_tensor_in_process(const std::string& path, int64_t rows, int64_t cols) {
  check_requested_shape(rows, cols);
  if (file_kind(path) == FileKind::hdf5) return read_h5(path, rows, cols);
  TensorReader in(path, rows, cols);
  Tensor t;
  t.rows = in.rows();
  t.cols = in.cols();
  t.shape_known = in.shape_known();
  t.data.resize(static_cast<size_t>(t.rows * t.cols));
  in.read(t.data.data(), t.rows);
  return t;
}

TensorReader::TensorReader(const std::string& path, int64_t rows, int64_t cols) : path_(path) {
  check_requested_shape(rows, cols);
  const FileKind kind = file_kind(path);
  if (kind == FileKind::hdf5) {  // read whole, in a child process (read_tensor)
    Tensor t = read_tensor(path, rows, cols);
    rows_ = t.rows;
    cols_ = t.cols;
    shape_known_ = t.shape_known;
    whole_ = std::move(t.data);
    return;
  }
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) throw Error("cannot read '" + path + "': " + std::strerror(errno));
  struct stat st;
  if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd_);
    throw Error("cannot read '" + path + "': not a regular file");
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  try {
    if (kind == FileKind::npy) {
      size_t off;
      int64_t count, r, c;
      bool is2d;
      auto prefix = [&](size_t n) {
        std::vector<uint8_t> b(static_cast<size_t>(std::min<uint64_t>(n, size)));
        read_at(b.data(), b.size(), 0);
        return b;
      };
      parse_npy(path, size, prefix, off, count, is2d, r, c);
      check_shape(path, count, rows, cols, is2d, r, c);
      shape_known_ = is2d;
      data_off_ = off;
    } else {
      if (rows == 0 && cols == 0) throw Error("'" + path + "' is a raw float32 file: give its shape with --shape R,C");
      if (size % 4 != 0)
        throw Error("'" + path + "' is " + std::to_string(size) + " bytes, not a whole number of float32 values");
      check_shape(path, static_cast<int64_t>(size / 4), rows, cols, false, 0, 0);
    }
  } catch (...) {
    ::close(fd_);
    throw;
  }
  rows_ = rows;
  cols_ = cols;
}

TensorReader::~TensorReader() {
  if (fd_ >= 0) ::close(fd_);
}

void TensorReader::read_at(void* dst, size_t n, uint64_t at) const {
  auto* p = static_cast<char*>(dst);
  while (n > 0) {
    const ssize_t got = ::pread(fd_, p, n, static_cast<off_t>(at));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) throw Error("cannot read '" + path_ + "': read failed");
    p += got;
    at += static_cast<uint64_t>(got);
    n -= static_cast<size_t>(got);
  }
}

void TensorReader::read(float* dst, int64_t rows) {
  if (rows < 0 || rows > rows_ - next_) throw Error("cannot read '" + path_ + "': rows past its end");
  const int64_t first = next_ * cols_, n = rows * cols_;
  if (n == 0) return;
  if (fd_ < 0) std::memcpy(dst, whole_.data() + first, sizeof(float) * static_cast<size_t>(n));
  else read_at(dst, sizeof(float) * static_cast<size_t>(n), data_off_ + sizeof(float) * static_cast<uint64_t>(first));
  next_ += rows;
}

std::vector<uint8_t> npy_bytes(const float* data, int64_t rows, int64_t cols) {
  std::vector<uint8_t> out = npy_header(rows, cols);
  const auto* p = reinterpret_cast<const uint8_t*>(data);
  out.insert(out.end(), p, p + rows * cols * 4);
  return out;
}

void check_output_path(const std::string& path) {
  std::string file = path, dataset;
  if (file_kind(path) == FileKind::hdf5) split_h5_path(path, file, dataset);
  output_target(file);
}

OutputSet::Pending OutputSet::pending_for(const std::string& dest, const std::string& h5_dataset) {
  static std::mt19937_64 rng{std::random_device{}()};
  Pending p;
  p.dest = dest;
  p.target = output_target(dest);
  p.tmp = temporary_for(p.target, std::to_string(getpid()) + "_" + std::to_string(rng() % 1000000));
  p.h5_dataset = h5_dataset;
  return p;
}

// An open temporary: a file of bytes, or an HDF5 dataset written in
// hyperslabs of whole rows.
struct OutputSet::Sink {
  std::string path, dataset;  // the temporary; the HDF5 dataset's name
  std::FILE* f = nullptr;
  std::unique_ptr<H5Id> h5, dset;  // (closed in reverse order: dataset first)
  int64_t cols = 0, rows_done = 0;
  ~Sink() {
    if (f) std::fclose(f);
  }
  void fail() const { throw Error("cannot write '" + path + "': " + std::strerror(errno)); }
  void append(const void* data, size_t n) {
    if (n == 0) return;
    if (f) {
      if (std::fwrite(data, 1, n, f) != n) fail();
      return;
    }
    const hsize_t rows = n / (4 * static_cast<size_t>(cols)), elems = n / 4;
    const hsize_t start[2] = {static_cast<hsize_t>(rows_done), 0}, count[2] = {rows, static_cast<hsize_t>(cols)};
    H5Id file_space(H5Dget_space(dset->id), H5Sclose);
    H5Id mem(H5Screate_simple(1, &elems, nullptr), H5Sclose);
    if (file_space.id < 0 || mem.id < 0 ||
        H5Sselect_hyperslab(file_space.id, H5S_SELECT_SET, start, nullptr, count, nullptr) < 0 ||
        H5Dwrite(dset->id, H5T_NATIVE_FLOAT, mem.id, file_space.id, H5P_DEFAULT, data) < 0)
      throw Error("cannot write dataset '" + dataset + "' in '" + path + "'");
    rows_done += static_cast<int64_t>(rows);
  }
  void close() {
    if (f) {
      std::FILE* g = f;
      f = nullptr;
      if (std::fclose(g) != 0) fail();
    }
    dset.reset();
    h5.reset();
  }
};

size_t OutputSet::open_tensor(const std::string& path, int64_t rows, int64_t cols) {
  if (file_kind(path) != FileKind::hdf5) {
    const size_t k = open_bytes(path);
    if (file_kind(path) == FileKind::npy) {
      const auto header = npy_header(rows, cols);
      append(k, header.data(), header.size());
    }
    return k;
  }
  static H5Silence silence;
  std::string file, dset;
  split_h5_path(path, file, dset);
  Pending p = pending_for(file, dset);
  auto sink = std::make_shared<Sink>();
  sink->path = p.tmp;
  sink->dataset = dset;
  sink->cols = cols;
  p.sink = sink;
  pending_.push_back(p);
  sink->h5 = std::make_unique<H5Id>(H5Fcreate(p.tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose);
  if (sink->h5->id < 0) throw Error("cannot create HDF5 file '" + p.tmp + "'");
  H5Id lcpl(H5Pcreate(H5P_LINK_CREATE), H5Pclose);
  H5Pset_create_intermediate_group(lcpl.id, 1);
  hsize_t dims[2] = {static_cast<hsize_t>(rows), static_cast<hsize_t>(cols)};
  H5Id space(H5Screate_simple(2, dims, nullptr), H5Sclose);
  sink->dset = std::make_unique<H5Id>(
      H5Dcreate2(sink->h5->id, dset.c_str(), H5T_IEEE_F32LE, space.id, lcpl.id, H5P_DEFAULT, H5P_DEFAULT), H5Dclose);
  if (sink->dset->id < 0) throw Error("cannot create dataset '" + dset + "' in '" + p.tmp + "'");
  return pending_.size() - 1;
}

size_t OutputSet::open_bytes(const std::string& path) {
  Pending p = pending_for(path, "");
  auto sink = std::make_shared<Sink>();
  sink->path = p.tmp;
  p.sink = sink;
  pending_.push_back(p);
  sink->f = std::fopen(p.tmp.c_str(), "wb");
  if (!sink->f) sink->fail();
  return pending_.size() - 1;
}

void OutputSet::append(size_t output, const void* data, size_t n) { pending_.at(output).sink->append(data, n); }

void OutputSet::add_tensor(const std::string& path, const float* data, int64_t rows, int64_t cols) {
  append(open_tensor(path, rows, cols), data, static_cast<size_t>(rows * cols) * 4);
}

void OutputSet::add_bytes(const std::string& path, const void* data, size_t n) { append(open_bytes(path), data, n); }

void OutputSet::add_text(const std::string& path, const std::string& text) { add_bytes(path, text.data(), text.size()); }

void OutputSet::commit() {
  for (auto& p : pending_) p.sink->close();
  for (auto& p : pending_) {
    if (!p.h5_dataset.empty() && !p.target.stream && fs::exists(p.target.file)) {
      // Copy the dataset into the existing file, replacing one of that name.
      static H5Silence silence;
      H5Id dst(H5Fopen(p.target.file.c_str(), H5F_ACC_RDWR, H5P_DEFAULT), H5Fclose);
      if (dst.id < 0) throw Error("cannot open '" + p.dest + "' to add dataset '" + p.h5_dataset + "'");
      H5Id src(H5Fopen(p.tmp.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
      if (H5Lexists(dst.id, p.h5_dataset.c_str(), H5P_DEFAULT) > 0) H5Ldelete(dst.id, p.h5_dataset.c_str(), H5P_DEFAULT);
      H5Id lcpl(H5Pcreate(H5P_LINK_CREATE), H5Pclose);
      H5Pset_create_intermediate_group(lcpl.id, 1);
      if (H5Ocopy(src.id, p.h5_dataset.c_str(), dst.id, p.h5_dataset.c_str(), H5P_DEFAULT, lcpl.id) < 0)
        throw Error("cannot write dataset '" + p.h5_dataset + "' into '" + p.dest + "'");
      fs::remove(p.tmp);
    } else {
      place_output(p.tmp, p.target, p.dest);
    }
    p.tmp.clear();
  }
  pending_.clear();
}

OutputSet::~OutputSet() {
  for (auto& p : pending_) {
    p.sink.reset();  // closed first
    std::error_code ec;
    if (!p.tmp.empty()) fs::remove(p.tmp, ec);
  }
}

}  // namespace exmy::io

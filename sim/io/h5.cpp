#include "sim/io/h5.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <sstream>

#include "formats/error.hpp"

namespace exmy::io::h5 {

void silence_errors() {
  static const bool done = [] {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    return true;
  }();
  (void)done;
}

namespace {

bool write_all(int fd, const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    const ssize_t k = ::write(fd, c, std::min<size_t>(n, size_t{1} << 30));
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    c += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

}  // namespace

bool read_all(int fd, void* p, size_t n) {
  char* c = static_cast<char*>(p);
  while (n > 0) {
    const ssize_t k = ::read(fd, c, std::min<size_t>(n, size_t{1} << 30));
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    c += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

namespace {

// A string sent as its length (uint64) and bytes; false when incomplete or
// not shorter than `limit`.
bool read_sized(int fd, std::string& out, uint64_t limit) {
  uint64_t len = 0;
  if (!read_all(fd, &len, sizeof len) || len >= limit) return false;
  out.resize(static_cast<size_t>(len));
  return read_all(fd, out.data(), out.size());
}

int g_heartbeat_fd = -1;  // in a run_isolated child with an idle limit: the write end of the beat pipe

// Waits for the child's answer (fd readable, or closed) while it beats on
// `beat`; false when `limit_s` seconds pass without either.
bool wait_for_answer(int fd, int beat, double limit_s) {
  using Clock = std::chrono::steady_clock;
  auto last = Clock::now();
  for (;;) {
    pollfd p[2] = {{fd, POLLIN, 0}, {beat, POLLIN, 0}};
    const int r = ::poll(p, beat >= 0 ? 2 : 1, 200);
    if (r < 0 && errno != EINTR) return true;  // cannot wait: read as before
    if (r > 0 && (p[0].revents & (POLLIN | POLLHUP | POLLERR))) return true;
    if (r > 0 && beat >= 0 && p[1].revents) {
      char buf[512];
      if (::read(beat, buf, sizeof buf) > 0) last = Clock::now();
      else if (p[1].revents & POLLHUP) beat = -1;  // (the answer follows)
    }
    if (std::chrono::duration<double>(Clock::now() - last).count() > limit_s) return false;
  }
}
}  // namespace

double read_idle_limit() {
  const char* e = std::getenv("EXMY_HDF5_IDLE_LIMIT");
  char* end = nullptr;
  const double v = e ? std::strtod(e, &end) : 0.0;
  return e && end != e && *end == '\0' && v > 0 && v < 1e6 ? v : 30.0;
}

void heartbeat() {
  if (g_heartbeat_fd < 0) return;
  const char c = 1;
  (void)!::write(g_heartbeat_fd, &c, 1);  // non-blocking: a full pipe already says enough
}

void run_isolated(const std::string& file, const std::function<void(const Send& send)>& child,
                  const std::function<bool(int fd)>& receive, const std::function<void()>& in_process,
                  double idle_limit_s) {
  // The reply: status 1 and the child's result; or status 0, length, message.
  int fds[2];
  if (::pipe(fds) != 0) return in_process();  // no pipe: run here
  int beat[2] = {-1, -1};
  if (idle_limit_s > 0 && ::pipe(beat) != 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    return in_process();
  }
  std::fflush(nullptr);  // nothing buffered is written twice
  const pid_t pid = ::fork();
  if (pid < 0) {
    for (const int f : {fds[0], fds[1], beat[0], beat[1]})
      if (f >= 0) ::close(f);
    return in_process();  // no child: run here
  }
  if (pid == 0) {
    ::close(fds[0]);
    if (beat[1] >= 0) {
      ::close(beat[0]);
      ::fcntl(beat[1], F_SETFL, ::fcntl(beat[1], F_GETFL) | O_NONBLOCK);
      g_heartbeat_fd = beat[1];
    }
    const int null = ::open("/dev/null", O_WRONLY);
    if (null >= 0) ::dup2(null, 2);
    bool sent = false;
    const Send send = [&](const void* p, size_t n) {
      const uint8_t ok = 1;
      if (!sent && !write_all(fds[1], &ok, 1)) return false;
      sent = true;
      return write_all(fds[1], p, n);
    };
    std::string message;
    try {
      child(send);
    } catch (const Error& e) {
      message = e.what();
    } catch (const std::exception& e) {
      message = "cannot read '" + file + "': " + e.what();
    }
    if (!sent) {
      const uint8_t ok = 0;
      const uint64_t len = message.size();
      if (write_all(fds[1], &ok, 1) && write_all(fds[1], &len, sizeof len)) write_all(fds[1], message.data(), len);
    }
    ::_exit(0);
  }
  ::close(fds[1]);
  if (beat[1] >= 0) {
    ::close(beat[1]);
    ::fcntl(beat[0], F_SETFL, ::fcntl(beat[0], F_GETFL) | O_NONBLOCK);
    const bool answered = wait_for_answer(fds[0], beat[0], idle_limit_s);
    ::close(beat[0]);
    if (!answered) {
      ::kill(pid, SIGKILL);
      ::close(fds[0]);
      while (::waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
      }
      char secs[32];
      std::snprintf(secs, sizeof secs, "%g", idle_limit_s);
      throw Error("cannot read '" + file + "': the HDF5 library made no progress on it for " + secs +
                  " s (corrupt file?)");
    }
  }
  uint8_t status = 0;
  std::string message;
  bool complete = read_all(fds[0], &status, 1);
  if (complete) complete = status == 1 ? receive(fds[0]) : read_sized(fds[0], message, uint64_t{1} << 20);
  ::close(fds[0]);
  int st = 0;
  while (::waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  if (complete && status == 1) return;
  if (complete) throw Error(message);
  if (WIFSIGNALED(st))
    throw Error("cannot read '" + file + "': the HDF5 library crashed on it (" + strsignal(WTERMSIG(st)) +
                "; corrupt file?)");
  throw Error("cannot read '" + file + "': the HDF5 reader stopped without an answer (corrupt file?)");
}

std::string run_isolated(const std::string& file, const std::function<std::string()>& fn, double idle_limit_s) {
  std::string out;
  run_isolated(
      file,
      [&](const Send& send) {
        const std::string r = fn();
        const uint64_t len = r.size();
        if (send(&len, sizeof len)) send(r.data(), r.size());
      },
      [&](int fd) { return read_sized(fd, out, uint64_t{1} << 40); },
      [&] { out = fn(); }, idle_limit_s);
  return out;
}

Handle open_read(const std::string& path) {
  silence_errors();
  Handle f(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (f.valid()) return f;
  Handle fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
  if (!fapl.valid() || H5Pset_metadata_read_attempts(fapl.get(), 25) < 0) return f;
  return Handle(H5Fopen(path.c_str(), H5F_ACC_RDONLY | H5F_ACC_SWMR_READ, fapl.get()), H5Fclose);
}

Handle latest_format_fapl() {
  Handle fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
  if (!fapl.valid() || H5Pset_libver_bounds(fapl.get(), H5F_LIBVER_LATEST, H5F_LIBVER_LATEST) < 0)
    throw Error("HDF5: cannot create a file access property list");
  return fapl;
}

Handle intermediate_groups_lcpl() {
  Handle lcpl(H5Pcreate(H5P_LINK_CREATE), H5Pclose);
  if (!lcpl.valid() || H5Pset_create_intermediate_group(lcpl.get(), 1) < 0)
    throw Error("HDF5: cannot create a link creation property list");
  return lcpl;
}

Handle create_file(const std::string& path, bool latest_format) {
  Handle fapl = latest_format ? latest_format_fapl() : Handle();
  return Handle(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, latest_format ? fapl.get() : H5P_DEFAULT),
                H5Fclose);
}

bool is_hdf5_file(const std::string& path) {
  std::error_code ec;
  return std::filesystem::is_regular_file(path, ec) && H5Fis_hdf5(path.c_str()) > 0;
}

namespace {
herr_t collect_datasets(hid_t, const char* name, const H5O_info_t* info, void* out) {
  heartbeat();
  if (info->type == H5O_TYPE_DATASET) static_cast<std::vector<std::string>*>(out)->push_back(name);
  return 0;
}

template <class T>
void write_numbers(hid_t loc, const std::string& path, const std::vector<T>& v, hid_t file_type, hid_t mem_type) {
  Handle lcpl = intermediate_groups_lcpl();
  const hsize_t n = v.size();
  Handle space(H5Screate_simple(1, &n, nullptr), H5Sclose);
  Handle d(H5Dcreate2(loc, path.c_str(), file_type, space.get(), lcpl.get(), H5P_DEFAULT, H5P_DEFAULT), H5Dclose);
  if (!d.valid() || (n > 0 && H5Dwrite(d.get(), mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()) < 0))
    throw Error("cannot write dataset '" + path + "'");
}
}  // namespace

std::optional<std::vector<std::string>> datasets_below(hid_t file, const std::string& group) {
  if (group != "/" && !path_exists(file, group)) return std::nullopt;
  Handle g(H5Oopen(file, group.c_str(), H5P_DEFAULT), H5Oclose);
  if (!g.valid()) return std::nullopt;
  std::vector<std::string> names;
  H5Ovisit2(g.get(), H5_INDEX_NAME, H5_ITER_INC, collect_datasets, &names, H5O_INFO_BASIC);
  return names;
}

bool is_float32_matrix(hid_t loc, const std::string& path) {
  heartbeat();
  Handle d(H5Dopen2(loc, path.c_str(), H5P_DEFAULT), H5Dclose);
  if (!d.valid()) return false;
  Handle t(H5Dget_type(d.get()), H5Tclose);
  Handle s(H5Dget_space(d.get()), H5Sclose);
  return H5Tget_class(t.get()) == H5T_FLOAT && H5Tget_size(t.get()) == 4 && H5Sget_simple_extent_ndims(s.get()) == 2;
}

void write_column(hid_t loc, const std::string& path, const std::vector<std::string>& v) {
  Handle type(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(type.get(), H5T_VARIABLE);
  H5Tset_cset(type.get(), H5T_CSET_UTF8);
  Handle lcpl = intermediate_groups_lcpl();
  const hsize_t n = v.size();
  Handle space(H5Screate_simple(1, &n, nullptr), H5Sclose);
  Handle d(H5Dcreate2(loc, path.c_str(), type.get(), space.get(), lcpl.get(), H5P_DEFAULT, H5P_DEFAULT), H5Dclose);
  std::vector<const char*> p;
  for (const auto& s : v) p.push_back(s.c_str());
  if (!d.valid() || (n > 0 && H5Dwrite(d.get(), type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, p.data()) < 0))
    throw Error("cannot write dataset '" + path + "'");
}
void write_column(hid_t loc, const std::string& path, const std::vector<double>& v) {
  write_numbers(loc, path, v, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE);
}
void write_column(hid_t loc, const std::string& path, const std::vector<int64_t>& v) {
  write_numbers(loc, path, v, H5T_STD_I64LE, H5T_NATIVE_INT64);
}
void write_column(hid_t loc, const std::string& path, const std::vector<uint64_t>& v) {
  write_numbers(loc, path, v, H5T_STD_U64LE, H5T_NATIVE_UINT64);
}

Handle open_file(const std::string& path, bool writable) {
  return Handle(H5Fopen(path.c_str(), writable ? H5F_ACC_RDWR : H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
}

Handle open_root(hid_t file) { return open_group(file, "/"); }

Handle open_group(hid_t loc, const std::string& path) {
  return Handle(H5Gopen2(loc, path.c_str(), H5P_DEFAULT), H5Gclose);
}

Handle open_dataset(hid_t loc, const std::string& path) {
  return Handle(H5Dopen2(loc, path.c_str(), H5P_DEFAULT), H5Dclose);
}

Handle open_or_create_group(hid_t loc, const std::string& path) {
  if (path_exists(loc, path)) return open_group(loc, path);
  Handle lcpl = intermediate_groups_lcpl();
  return Handle(H5Gcreate2(loc, path.c_str(), lcpl.get(), H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
}

bool flush_file(hid_t file) { return H5Fflush(file, H5F_SCOPE_GLOBAL) >= 0; }

bool path_exists(hid_t loc, const std::string& path) {
  // H5Lexists fails (rather than answering false) when an intermediate group
  // is missing, so walk the path one component at a time.
  std::string cur;
  std::stringstream ss(path);
  std::string part;
  while (std::getline(ss, part, '/')) {
    if (part.empty()) continue;
    // Relative paths (from a group) stay relative.
    cur += (cur.empty() && !path.starts_with('/') ? "" : "/") + part;
    if (H5Lexists(loc, cur.c_str(), H5P_DEFAULT) <= 0) return false;
  }
  return true;
}

namespace {

Handle string_type() {
  Handle t(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(t.get(), H5T_VARIABLE);
  H5Tset_cset(t.get(), H5T_CSET_UTF8);
  return t;
}

void replace_attribute(hid_t obj, const std::string& name, hid_t file_type, hid_t mem_type, const void* data) {
  if (H5Aexists(obj, name.c_str()) > 0) H5Adelete(obj, name.c_str());
  Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  Handle a(H5Acreate2(obj, name.c_str(), file_type, space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  if (!a.valid() || H5Awrite(a.get(), mem_type, data) < 0) throw Error("HDF5: cannot write attribute '" + name + "'");
}

Handle open_attribute(hid_t obj, const std::string& name) {
  if (H5Aexists(obj, name.c_str()) <= 0) return {};
  return Handle(H5Aopen(obj, name.c_str(), H5P_DEFAULT), H5Aclose);
}

// Elements of an attribute (1 for a scalar), or -1.
hssize_t attribute_points(hid_t a) {
  Handle space(H5Aget_space(a), H5Sclose);
  return space.valid() ? H5Sget_simple_extent_npoints(space.get()) : -1;
}

// A scalar attribute of `name`, or an invalid handle (missing, or an array:
// reading an array into one value would write past it).
Handle open_scalar_attribute(hid_t obj, const std::string& name) {
  Handle a = open_attribute(obj, name);
  if (!a.valid() || attribute_points(a.get()) != 1) return {};
  return a;
}

}  // namespace

void write_attribute(hid_t obj, const std::string& name, const std::string& value) {
  Handle t = string_type();
  const char* p = value.c_str();
  replace_attribute(obj, name, t.get(), t.get(), &p);
}

void write_attribute(hid_t obj, const std::string& name, int64_t value) {
  replace_attribute(obj, name, H5T_STD_I64LE, H5T_NATIVE_INT64, &value);
}

void write_attribute(hid_t obj, const std::string& name, double value) {
  replace_attribute(obj, name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &value);
}

void write_u64_attribute(hid_t obj, const std::string& name, uint64_t value) {
  replace_attribute(obj, name, H5T_STD_U64LE, H5T_NATIVE_UINT64, &value);
}

void write_attribute(hid_t obj, const std::string& name, const std::vector<std::string>& values) {
  if (H5Aexists(obj, name.c_str()) > 0) H5Adelete(obj, name.c_str());
  Handle t = string_type();
  const hsize_t n = values.size();
  Handle space(H5Screate_simple(1, &n, nullptr), H5Sclose);
  std::vector<const char*> p;
  for (const auto& v : values) p.push_back(v.c_str());
  Handle a(H5Acreate2(obj, name.c_str(), t.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  if (!a.valid() || (n > 0 && H5Awrite(a.get(), t.get(), p.data()) < 0))
    throw Error("HDF5: cannot write attribute '" + name + "'");
}

std::optional<std::string> read_string_attribute(hid_t obj, const std::string& name) {
  heartbeat();
  Handle a = open_scalar_attribute(obj, name);
  if (!a.valid()) return std::nullopt;
  Handle ft(H5Aget_type(a.get()), H5Tclose);
  if (H5Tget_class(ft.get()) != H5T_STRING) return std::nullopt;
  if (H5Tis_variable_str(ft.get()) > 0) {
    Handle t = string_type();
    char* p = nullptr;
    if (H5Aread(a.get(), t.get(), &p) < 0 || !p) return std::nullopt;
    std::string s(p);
    H5free_memory(p);
    return s;
  }
  const size_t n = H5Tget_size(ft.get());
  std::string s(n, '\0');
  Handle t(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(t.get(), n);
  if (H5Aread(a.get(), t.get(), s.data()) < 0) return std::nullopt;
  s.resize(s.find('\0') == std::string::npos ? n : s.find('\0'));
  return s;
}

std::optional<std::vector<std::string>> read_string_list_attribute(hid_t obj, const std::string& name) {
  heartbeat();
  Handle a = open_attribute(obj, name);
  if (!a.valid()) return std::nullopt;
  Handle ft(H5Aget_type(a.get()), H5Tclose);
  const hssize_t n = attribute_points(a.get());
  if (H5Tget_class(ft.get()) != H5T_STRING || H5Tis_variable_str(ft.get()) <= 0 || n < 0) return std::nullopt;
  std::vector<char*> p(static_cast<size_t>(n), nullptr);
  Handle t = string_type();
  if (n > 0 && H5Aread(a.get(), t.get(), p.data()) < 0) return std::nullopt;
  std::vector<std::string> v;
  for (char* c : p) {
    v.emplace_back(c ? c : "");
    if (c) H5free_memory(c);
  }
  return v;
}

std::optional<int64_t> read_int_attribute(hid_t obj, const std::string& name) {
  heartbeat();
  Handle a = open_scalar_attribute(obj, name);
  if (!a.valid()) return std::nullopt;
  Handle ft(H5Aget_type(a.get()), H5Tclose);
  if (H5Tget_class(ft.get()) != H5T_INTEGER) return std::nullopt;
  int64_t v = 0;
  if (H5Aread(a.get(), H5T_NATIVE_INT64, &v) < 0) return std::nullopt;
  return v;
}

std::optional<double> read_double_attribute(hid_t obj, const std::string& name) {
  heartbeat();
  Handle a = open_scalar_attribute(obj, name);
  if (!a.valid()) return std::nullopt;
  Handle ft(H5Aget_type(a.get()), H5Tclose);
  const H5T_class_t c = H5Tget_class(ft.get());
  if (c != H5T_FLOAT && c != H5T_INTEGER) return std::nullopt;
  double v = 0;
  if (H5Aread(a.get(), H5T_NATIVE_DOUBLE, &v) < 0) return std::nullopt;
  return v;
}

std::optional<uint64_t> read_u64_attribute(hid_t obj, const std::string& name) {
  heartbeat();
  Handle a = open_scalar_attribute(obj, name);
  if (!a.valid()) return std::nullopt;
  Handle ft(H5Aget_type(a.get()), H5Tclose);
  if (H5Tget_class(ft.get()) != H5T_INTEGER) return std::nullopt;
  uint64_t v = 0;
  if (H5Aread(a.get(), H5T_NATIVE_UINT64, &v) < 0) return std::nullopt;
  return v;
}

bool has_attribute(hid_t obj, const std::string& name) { return H5Aexists(obj, name.c_str()) > 0; }

void copy_attributes(hid_t from, hid_t to) {
  H5O_info_t info;
  if (H5Oget_info2(from, &info, H5O_INFO_NUM_ATTRS) < 0) return;
  for (hsize_t i = 0; i < info.num_attrs; ++i) {
    char name[1024];
    if (H5Aget_name_by_idx(from, ".", H5_INDEX_CRT_ORDER, H5_ITER_INC, i, name, sizeof name, H5P_DEFAULT) < 0 &&
        H5Aget_name_by_idx(from, ".", H5_INDEX_NAME, H5_ITER_INC, i, name, sizeof name, H5P_DEFAULT) < 0)
      continue;
    Handle a(H5Aopen(from, name, H5P_DEFAULT), H5Aclose);
    Handle ft(H5Aget_type(a.get()), H5Tclose);
    switch (H5Tget_class(ft.get())) {
      case H5T_STRING:
        if (attribute_points(a.get()) != 1) {
          if (auto v = read_string_list_attribute(from, name)) write_attribute(to, name, *v);
        } else if (auto s = read_string_attribute(from, name)) {
          write_attribute(to, name, *s);
        }
        break;
      case H5T_INTEGER:
        if (H5Tget_sign(ft.get()) == H5T_SGN_NONE && H5Tget_size(ft.get()) == 8) {
          // uint64 stays uint64 (a Philox stream above 2^63 would not fit an int64)
          uint64_t v = 0;
          if (attribute_points(a.get()) == 1 && H5Aread(a.get(), H5T_NATIVE_UINT64, &v) >= 0)
            write_u64_attribute(to, name, v);
        } else if (auto v = read_int_attribute(from, name)) {
          write_attribute(to, name, *v);
        }
        break;
      case H5T_FLOAT:
        if (auto v = read_double_attribute(from, name)) write_attribute(to, name, *v);
        break;
      default: break;
    }
  }
}

namespace {

// Chunked with the Fletcher-32 checksum filter, so that a flipped bit in the
// data is a read error instead of a silently different number (HDF5 checks
// the checksum of every chunk it reads). Chunks of at most 16 MiB, cut along
// the leading dimensions; empty and scalar datasets stay contiguous (HDF5
// cannot chunk them).
Handle checksummed_dcpl(const std::vector<hsize_t>& dims, size_t elem_bytes) {
  Handle dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  if (!dcpl.valid()) throw Error("HDF5: cannot create a dataset creation property list");
  if (dims.empty() || std::find(dims.begin(), dims.end(), hsize_t{0}) != dims.end()) return dcpl;
  std::vector<hsize_t> chunk = dims;
  constexpr uint64_t kMaxChunkBytes = uint64_t{16} << 20;
  auto bytes = [&] {
    uint64_t b = elem_bytes;
    for (hsize_t c : chunk) b *= c;
    return b;
  };
  for (size_t k = 0; k < chunk.size() && bytes() > kMaxChunkBytes; ++k)
    while (chunk[k] > 1 && bytes() > kMaxChunkBytes) chunk[k] = (chunk[k] + 1) / 2;
  if (H5Pset_chunk(dcpl.get(), static_cast<int>(chunk.size()), chunk.data()) < 0 || H5Pset_fletcher32(dcpl.get()) < 0)
    throw Error("HDF5: cannot set up a checksummed dataset");
  return dcpl;
}

template <class T>
void write_array_impl(hid_t loc, const std::string& path, const T* data, const std::vector<int64_t>& shape,
                      hid_t file_type, hid_t mem_type) {
  std::vector<hsize_t> dims(shape.begin(), shape.end());
  Handle space(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), H5Sclose);
  Handle lcpl = intermediate_groups_lcpl();
  Handle dcpl = checksummed_dcpl(dims, sizeof(T));
  Handle d(H5Dcreate2(loc, path.c_str(), file_type, space.get(), lcpl.get(), dcpl.get(), H5P_DEFAULT), H5Dclose);
  if (!d.valid() || H5Dwrite(d.get(), mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0)
    throw Error("HDF5: cannot write dataset '" + path + "' (disk full?)");
}

std::string shape_text(const std::vector<hsize_t>& s) {
  std::string t = "[";
  for (size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
  return t + "]";
}

}  // namespace

void write_array(hid_t loc, const std::string& path, const float* data, const std::vector<int64_t>& shape) {
  write_array_impl(loc, path, data, shape, H5T_IEEE_F32LE, H5T_NATIVE_FLOAT);
}

void write_array(hid_t loc, const std::string& path, const uint64_t* data, const std::vector<int64_t>& shape) {
  write_array_impl(loc, path, data, shape, H5T_STD_U64LE, H5T_NATIVE_UINT64);
}

void write_array(hid_t loc, const std::string& path, const double* data, const std::vector<int64_t>& shape) {
  write_array_impl(loc, path, data, shape, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE);
}

void read_array(hid_t loc, const std::string& path, float* data, const std::vector<int64_t>& shape,
                const std::string& what) {
  if (!path_exists(loc, path)) throw Error(what + " has no dataset '" + path + "'");
  Handle d(H5Dopen2(loc, path.c_str(), H5P_DEFAULT), H5Dclose);
  Handle s(H5Dget_space(d.get()), H5Sclose);
  const int nd = H5Sget_simple_extent_ndims(s.get());
  std::vector<hsize_t> dims(static_cast<size_t>(std::max(nd, 0)));
  if (!d.valid() || nd < 0 || H5Sget_simple_extent_dims(s.get(), dims.data(), nullptr) != nd)
    throw Error(what + ": cannot read dataset '" + path + "' (corrupt file?)");
  const std::vector<hsize_t> want(shape.begin(), shape.end());
  if (dims != want)
    throw Error(what + ": '" + path + "' has shape " + shape_text(dims) + ", the model expects " + shape_text(want));
  if (H5Dread(d.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0)
    throw Error(what + ": cannot read dataset '" + path + "' (corrupt file?)");
}

std::vector<uint64_t> read_u64_array(hid_t loc, const std::string& path, const std::string& what) {
  if (!path_exists(loc, path)) throw Error(what + " has no dataset '" + path + "'");
  Handle d(H5Dopen2(loc, path.c_str(), H5P_DEFAULT), H5Dclose);
  Handle s(H5Dget_space(d.get()), H5Sclose);
  const hssize_t n = H5Sget_simple_extent_npoints(s.get());
  if (!d.valid() || n < 0) throw Error(what + ": cannot read dataset '" + path + "' (corrupt file?)");
  std::vector<uint64_t> v(static_cast<size_t>(n));
  if (n > 0 && H5Dread(d.get(), H5T_NATIVE_UINT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()) < 0)
    throw Error(what + ": cannot read dataset '" + path + "' (corrupt file?)");
  return v;
}

std::vector<double> read_f64_array(hid_t loc, const std::string& path, const std::string& what) {
  if (!path_exists(loc, path)) throw Error(what + " has no dataset '" + path + "'");
  Handle d(H5Dopen2(loc, path.c_str(), H5P_DEFAULT), H5Dclose);
  Handle s(H5Dget_space(d.get()), H5Sclose);
  const hssize_t n = H5Sget_simple_extent_npoints(s.get());
  if (!d.valid() || n < 0) throw Error(what + ": cannot read dataset '" + path + "' (corrupt file?)");
  std::vector<double> v(static_cast<size_t>(n));
  if (n > 0 && H5Dread(d.get(), H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()) < 0)
    throw Error(what + ": cannot read dataset '" + path + "' (corrupt file?)");
  return v;
}

}  // namespace exmy::io::h5

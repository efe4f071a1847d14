#include "sim/io/run_reader.hpp"

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "formats/error.hpp"

namespace exmy::io {
namespace fs = std::filesystem;
using h5::Handle;

namespace {

struct Listing {
  std::vector<std::string>* datasets;
  std::set<std::string>* groups;
};

herr_t visit(hid_t, const char* name, const H5O_info_t* info, void* out) {
  auto* l = static_cast<Listing*>(out);
  h5::heartbeat();
  const std::string p = std::string("/") + name;
  if (info->type == H5O_TYPE_DATASET) l->datasets->push_back(p);
  else if (info->type == H5O_TYPE_GROUP) l->groups->insert(p);
  return 0;
}

herr_t attr_name(hid_t, const char* name, const H5A_info_t*, void* out) {
  static_cast<std::vector<std::string>*>(out)->push_back(name);
  return 0;
}

}  // namespace

RunReader::RunReader(const std::string& path) : path_(path) {
  h5::silence_errors();
  std::error_code ec;
  if (!fs::exists(path, ec)) throw Error("run file '" + path + "' does not exist");
  if (fs::is_directory(path, ec)) throw Error("'" + path + "' is a directory without a run.h5");
  if (H5Fis_hdf5(path.c_str()) <= 0) throw Error("'" + path + "' is not an HDF5 file");
  f_ = h5::open_read(path);
  if (!f_.valid()) throw Error("cannot open '" + path + "' (a run killed while writing? try h5clear -s)");
  root_ = Handle(H5Gopen2(f_.get(), "/", H5P_DEFAULT), H5Gclose);
  if (!root_.valid()) throw Error("cannot read run file '" + path + "' (corrupt?)");
}

void RunReader::list() const {
  if (listed_) return;
  Listing l{&datasets_, &groups_};
  if (H5Ovisit2(f_.get(), H5_INDEX_NAME, H5_ITER_INC, visit, &l, H5O_INFO_BASIC) < 0)
    throw Error("cannot read run file '" + path_ + "' (corrupt?)");
  std::sort(datasets_.begin(), datasets_.end());
  dataset_set_.insert(datasets_.begin(), datasets_.end());
  listed_ = true;
}

const std::vector<std::string>& RunReader::datasets() const {
  list();
  return datasets_;
}

const std::set<std::string>& RunReader::groups() const {
  list();
  return groups_;
}

bool RunReader::has(const std::string& d) const {
  if (listed_) return dataset_set_.count(d) > 0;
  h5::heartbeat();
  if (!h5::path_exists(f_.get(), d)) return false;
  H5O_info_t info;
  return H5Oget_info_by_name2(f_.get(), d.c_str(), &info, H5O_INFO_BASIC, H5P_DEFAULT) >= 0 &&
         info.type == H5O_TYPE_DATASET;
}

std::vector<std::string> RunReader::step_groups(const std::string& top) const {
  std::vector<std::string> out;
  const std::string prefix = top + "/";
  for (const auto& d : datasets())
    if (d.starts_with(prefix) && d.ends_with("/step") && d.size() > prefix.size() + 5)
      out.push_back(d.substr(prefix.size(), d.size() - prefix.size() - 5));
  return out;
}

std::vector<double> RunReader::read(const std::string& d, int64_t* width) const {
  h5::heartbeat();
  if (!has(d)) throw Error("run file '" + path_ + "' has no dataset '" + d + "'");
  Handle ds(H5Dopen2(f_.get(), d.c_str(), H5P_DEFAULT), H5Dclose);
  if (!ds.valid()) throw Error("run file '" + path_ + "': cannot open dataset '" + d + "'");
  H5Drefresh(ds.get());  // SWMR: the writer's last flush
  Handle sp(H5Dget_space(ds.get()), H5Sclose);
  const int rank = H5Sget_simple_extent_ndims(sp.get());
  hsize_t dims[2] = {0, 0};
  if (rank < 1 || rank > 2 || H5Sget_simple_extent_dims(sp.get(), dims, nullptr) != rank)
    throw Error("run file '" + path_ + "': dataset '" + d + "' is not a row dataset");
  if (width) *width = rank == 2 ? static_cast<int64_t>(dims[1]) : 0;
  std::vector<double> v(static_cast<size_t>(dims[0] * (rank == 2 ? dims[1] : 1)));
  if (!v.empty() && H5Dread(ds.get(), H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()) < 0)
    throw Error("run file '" + path_ + "': cannot read dataset '" + d + "' (not numeric?)");
  return v;
}

std::vector<float> RunReader::tensor(const std::string& d, int64_t& rows, int64_t& cols) const {
  h5::heartbeat();
  if (!has(d)) throw Error("run file '" + path_ + "' has no dataset '" + d + "'");
  Handle ds(H5Dopen2(f_.get(), d.c_str(), H5P_DEFAULT), H5Dclose);
  Handle s(H5Dget_space(ds.get()), H5Sclose);
  hsize_t dims[2] = {0, 0};
  if (!ds.valid() || H5Sget_simple_extent_ndims(s.get()) != 2 || H5Sget_simple_extent_dims(s.get(), dims, nullptr) != 2)
    throw Error("run file '" + path_ + "': '" + d + "' is not a 2-D tensor");
  rows = static_cast<int64_t>(dims[0]);
  cols = static_cast<int64_t>(dims[1]);
  std::vector<float> v(static_cast<size_t>(rows * cols));
  if (!v.empty() && H5Dread(ds.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()) < 0)
    throw Error("cannot read '" + d + "' of run file '" + path_ + "'");
  return v;
}

std::optional<std::string> RunReader::string_attribute(const std::string& name) const {
  h5::heartbeat();
  return h5::read_string_attribute(root_.get(), name);
}

std::map<std::string, std::string> RunReader::attributes() const {
  std::map<std::string, std::string> out;
  std::vector<std::string> names;
  H5Aiterate2(root_.get(), H5_INDEX_NAME, H5_ITER_INC, nullptr, attr_name, &names);
  for (const auto& n : names) {
    h5::heartbeat();
    Handle a(H5Aopen(root_.get(), n.c_str(), H5P_DEFAULT), H5Aclose);
    Handle t(H5Aget_type(a.get()), H5Tclose);
    switch (H5Tget_class(t.get())) {
      case H5T_STRING:
        if (auto s = h5::read_string_attribute(root_.get(), n)) out[n] = *s;
        break;
      case H5T_INTEGER:
        if (auto i = h5::read_int_attribute(root_.get(), n)) out[n] = std::to_string(*i);
        break;
      case H5T_FLOAT:
        if (auto x = h5::read_double_attribute(root_.get(), n)) {
          char buf[40];
          std::snprintf(buf, sizeof buf, "%.10g", *x);
          out[n] = buf;
        }
        break;
      default: out[n] = "(not shown)";
    }
  }
  return out;
}

}  // namespace exmy::io

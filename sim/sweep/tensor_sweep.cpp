#include "sim/sweep/tensor_sweep.hpp"

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <climits>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>

#include "formats/error.hpp"
#include "formats/spec.hpp"
#include "formats/vocab.hpp"
#include "sim/io/atomic_file.hpp"
#include "sim/io/h5.hpp"
#include "sim/io/tensor_io.hpp"
#include "sim/quant/ini.hpp"
#include "sim/sweep/runner.hpp"
#include "sim/sweep/sweep.hpp"

namespace exmy::sweep {
namespace fs = std::filesystem;
using io::h5::Handle;

std::vector<std::string> grid_knob_names() {
  std::vector<std::string> k = {"format"};
  for (const auto& q : quant_knobs()) {
    std::string n = q.name;
    for (char& c : n)
      if (c == '_') c = '-';
    k.push_back(n);
  }
  return k;
}

namespace {

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

std::string num(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

// A knob's CSV field: its printed value, but a real value at %.17g (empty
// when unset), a given tensor amax at %.17g and a boolean as on/off, the
// spelling the sweep outputs have always had (docs/sweeps.md).
std::string csv_knob(const QuantKnob& k, const QuantSpec& s) {
  if (std::string_view(k.name) == "tensor_amax" && s.amax_kind == AmaxKind::given) return num(s.amax_value);
  const KnobValue v = typed_value(k, s);
  if (k.kind == KnobKind::real) return std::isnan(std::get<double>(v)) ? "" : num(std::get<double>(v));
  if (k.kind == KnobKind::boolean) return std::get<int64_t>(v) ? "on" : "off";
  return k.print(s);
}

// The recorded QuantSpec of a captured tensor (capture_attributes in
// sim/train/quant_io.cpp), when the dataset carries one.
std::optional<QuantSpec> recorded_spec(hid_t ds) {
  using namespace io::h5;
  if (!read_string_attribute(ds, "elem")) return std::nullopt;
  try {
    // One attribute per knob, typed by its kind (capture_attributes); a
    // knob an older file lacks keeps its default.
    Knobs k;
    for (const QuantKnob& q : quant_knobs()) {
      std::optional<KnobValue> v;
      switch (q.kind) {
        case KnobKind::text: v = read_string_attribute(ds, q.name); break;
        case KnobKind::boolean:
        case KnobKind::integer: v = read_int_attribute(ds, q.name); break;
        case KnobKind::real: v = read_double_attribute(ds, q.name); break;
        case KnobKind::u64: {
          if (!has_attribute(ds, q.name)) break;
          const auto u = read_u64_attribute(ds, q.name);
          if (!u) return std::nullopt;
          v = *u;
          break;
        }
      }
      if (!v) continue;
      std::string text = typed_text(q, *v);
      if (std::string_view(q.name) == "tensor_amax" && text == "given") {
        const auto a = read_double_attribute(ds, "tensor_amax_value");
        if (!a) return std::nullopt;
        text = num(*a);
      }
      k.emplace_back(q.name, text);
    }
    QuantSpec s = exmy::spec_from_knobs(k);
    s.validate();
    return s;
  } catch (const Error&) {
    return std::nullopt;
  }
}

}  // namespace

std::string canonical_knob(const std::string& knob) {
  std::string k = knob;
  for (char& c : k)
    if (c == '_') c = '-';
  const std::vector<std::string> names = grid_knob_names();
  for (const auto& n : names)
    if (n == k) return k;
  std::string all;
  for (const auto& n : names) all += (all.empty() ? "" : ", ") + n;
  throw Error("unknown knob '" + knob + "' (expected one of " + all + ")");
}

QuantSpec spec_from_knobs(const std::vector<std::pair<std::string, std::string>>& knobs) {
  QuantSpec s;
  bool have_elem = false;
  for (const auto& [raw, v] : knobs) {
    const std::string k = canonical_knob(raw);
    if (k == "format") {
      // ELEM[/SCALE[/BLOCK]]
      std::vector<std::string> parts;
      size_t a = 0;
      for (;;) {
        const size_t p = v.find('/', a);
        parts.push_back(v.substr(a, p == std::string::npos ? std::string::npos : p - a));
        if (p == std::string::npos) break;
        a = p + 1;
      }
      if (parts.size() > 3 || parts[0].empty())
        throw Error("bad format '" + v + "' (expected ELEM[/SCALE[/BLOCK]], e.g. e2m1/ue5m3/1x16)");
      const char* names[] = {"elem", "scale", "block"};
      for (size_t i = 0; i < parts.size(); ++i) set_knob(s, names[i], parts[i]);
    } else {
      set_knob(s, k, v);
    }
    have_elem = have_elem || k == "format" || k == "elem";
  }
  if (!have_elem) throw Error("a combination needs an element format (elem or format)");
  s.validate();
  return s;
}

std::vector<Combo> expand_families(const std::vector<std::pair<std::string, Family>>& families) {
  std::vector<Combo> out;
  std::set<std::string> names;
  for (const auto& [fname, fam] : families) {
    int64_t n = 1;
    for (const auto& [k, vals] : fam) {
      if (vals.empty()) throw Error("family '" + fname + "': no values for " + k);
      n *= static_cast<int64_t>(vals.size());
    }
    if (n > 100000) throw Error("family '" + fname + "' has more than 100000 combinations");
    for (int64_t i = 0; i < n; ++i) {
      Combo c;
      c.family = fname;
      int64_t rest = i;
      std::vector<size_t> pos(fam.size());
      for (size_t a = fam.size(); a-- > 0;) {
        pos[a] = static_cast<size_t>(rest % static_cast<int64_t>(fam[a].second.size()));
        rest /= static_cast<int64_t>(fam[a].second.size());
      }
      std::string varying;
      for (size_t a = 0; a < fam.size(); ++a) {
        const std::string k = canonical_knob(fam[a].first);
        const std::string& v = fam[a].second[pos[a]];
        c.knobs.emplace_back(k, v);
        if (fam[a].second.size() > 1) varying += (varying.empty() ? "" : ",") + k + "=" + v;
      }
      c.name = varying.empty() ? fname : fname + ":" + varying;
      try {
        c.spec = spec_from_knobs(c.knobs);
      } catch (const Error& e) {
        throw Error("combination '" + c.name + "': " + e.what());
      }
      if (!names.insert(c.name).second) throw Error("two combinations are named '" + c.name + "'");
      out.push_back(std::move(c));
    }
  }
  return out;
}

std::vector<std::pair<std::string, Family>> load_tensor_grid(const std::string& path) {
  const auto ini = sim::quant::read_ini(path);
  std::vector<std::pair<std::string, Family>> fams;
  for (const auto& sec : ini.sections) fams.emplace_back(sec, Family{});
  for (const auto& e : ini.entries) {
    const std::string at = path + ":" + std::to_string(e.line);
    if (e.section.empty()) throw Error(at + ": key '" + e.key + "' before the first [family] section");
    try {
      canonical_knob(e.key);
    } catch (const Error& err) {
      throw Error(at + ": " + err.what());
    }
    for (auto& [name, fam] : fams)
      if (name == e.section) fam.emplace_back(e.key, split_values(e.value, at + ": " + e.key));
  }
  if (fams.empty()) throw Error(path + ": no [family] section");
  return fams;
}

std::vector<TensorRef> list_tensors(const std::vector<std::string>& inputs, const std::string& group) {
  std::vector<TensorRef> out;
  io::h5::silence_errors();
  for (const auto& in : inputs) {
    // file.h5:/dataset, a whole HDF5 file (by its name or its signature), or .npy.
    std::string file = in, dset;
    if (io::file_kind(in) == io::FileKind::hdf5) {
      io::split_h5_path(in, file, dset);
    } else if (io::file_kind(in) == io::FileKind::npy) {
      if (!fs::exists(in)) throw Error("'" + in + "' does not exist");
      out.push_back(TensorRef{in, "", fs::path(in).filename().string()});
      continue;
    } else if (!in.ends_with(".h5") && !in.ends_with(".hdf5") &&
               !io::h5::is_hdf5_file(in)) {
      if (!fs::exists(in)) throw Error("'" + in + "' does not exist");
      throw Error("'" + in + "' is neither an HDF5 file nor a .npy file");
    }
    if (!fs::exists(file)) throw Error("'" + file + "' does not exist");
    if (!dset.empty()) {
      out.push_back(TensorRef{file, dset, dset});
      continue;
    }
    const std::string g = group.empty() || group == "/" ? "/" : (group.front() == '/' ? group : "/" + group);
    // The 2-D float32 datasets under g, one path per line, listed in a child
    // process: libhdf5 crashes on some corrupt files (io::h5::run_isolated).
    const std::string listed = io::h5::run_isolated(file, [&] {
      Handle f = io::h5::open_file(file, false);
      if (!f.valid()) throw Error("cannot open '" + file + "' as HDF5");
      const auto below = io::h5::datasets_below(f.get(), g);
      if (!below)
        throw Error("'" + file + "' has no group '" + g + "' (tensors are captured with --set train.capture_step=N; "
                    "or give --group)");
      std::string paths;
      for (const auto& rel : *below) {
        const std::string path = (g == "/" ? "/" : g + "/") + rel;
        if (io::h5::is_float32_matrix(f.get(), path)) paths += path + "\n";
      }
      return paths;
    });
    size_t found = 0;
    for (size_t at = 0; at < listed.size();) {
      const size_t nl = listed.find('\n', at);
      const std::string path = listed.substr(at, nl - at);
      at = nl + 1;
      out.push_back(TensorRef{file, path, inputs.size() > 1 ? file + ":" + path : path});
      ++found;
    }
    if (found == 0) throw Error("'" + file + "' holds no 2-D float32 dataset under '" + g + "'");
  }
  return out;
}

LoadedTensor load_tensor(const TensorRef& t) {
  LoadedTensor out;
  io::Tensor x = io::read_tensor(t.dataset.empty() ? t.file : t.file + ":" + t.dataset, 0, 0);
  if (!x.shape_known || x.rows < 1 || x.cols < 1)
    throw Error("'" + t.name + "' is not a 2-D tensor");
  out.data = std::move(x.data);
  out.rows = x.rows;
  out.cols = x.cols;
  if (!t.dataset.empty()) {
    Handle f = io::h5::open_file(t.file, false);
    Handle d = f.valid() ? io::h5::open_dataset(f.get(), t.dataset) : Handle();
    if (d.valid()) out.recorded = recorded_spec(d.get());
  }
  return out;
}

TensorSweep run_tensor_sweep(const std::vector<TensorRef>& tensors, const std::vector<Combo>& combos, bool recorded,
                             int threads) {
  TensorSweep s;
  s.tensors = tensors;
  s.combos = combos;
  for (size_t ti = 0; ti < tensors.size(); ++ti) {
    const LoadedTensor x = load_tensor(tensors[ti]);
    s.shapes.emplace_back(x.rows, x.cols);
    // threads 0: one thread per 64k elements, at most the cores this process
    // may use (a pool of threads on a small tensor costs more than it gives;
    // the results do not depend on the count).
    const int nthreads =
        threads > 0 ? threads
                    : static_cast<int>(std::clamp<int64_t>(x.rows * x.cols / 65536, 1, available_cores()));
    auto one = [&](size_t ci, const QuantSpec& spec) {
      TensorResult r;
      r.tensor = ti;
      r.combo = ci;
      r.spec = spec;
      try {
        r.info = quantize(spec, x.data.data(), x.rows, x.cols, QuantOutput{nullptr, nullptr, nullptr, &r.stats}, nthreads);
      } catch (const Error& e) {
        r.error = e.what();
        r.stats = QuantStats{};
      }
      s.results.push_back(std::move(r));
    };
    if (recorded && x.recorded) one(SIZE_MAX, *x.recorded);
    for (size_t ci = 0; ci < combos.size(); ++ci) one(ci, combos[ci].spec);
  }
  return s;
}

namespace {

std::string combo_name(const TensorSweep& s, const TensorResult& r) {
  return r.combo == SIZE_MAX ? std::string("recorded") : s.combos[r.combo].name;
}
std::string combo_family(const TensorSweep& s, const TensorResult& r) {
  return r.combo == SIZE_MAX ? std::string("recorded") : s.combos[r.combo].family;
}

// The CSV of `exmy sweep-tensors`: one row per call, its knobs and the
// statistics of the table (formats/vocab.hpp).
void write_results_csv(const TensorSweep& s, const std::string& path) {
  std::ofstream o(path, std::ios::binary | std::ios::trunc);
  o << "tensor,rows,cols,combo,family,";
  for (const QuantKnob& k : quant_knobs()) o << k.name << ",";
  o << "amax,t,";
  for (const QuantStat& c : quant_stats()) o << c.name << ",";
  o << "error\n";
  for (const auto& r : s.results) {
    const QuantSpec& q = r.spec;
    const QuantStats& st = r.stats;
    o << csv_field(s.tensors[r.tensor].name) << "," << s.shapes[r.tensor].first << "," << s.shapes[r.tensor].second
      << "," << csv_field(combo_name(s, r)) << "," << csv_field(combo_family(s, r)) << ",";
    for (const QuantKnob& k : quant_knobs()) o << csv_field(csv_knob(k, q)) << ",";
    o << (r.error.empty() ? num(r.info.amax) : "") << ","
      << (r.error.empty() ? num(r.info.t) : "") << ",";
    // The statistics of the table (formats/vocab.hpp), empty for a failed call.
    for (const QuantStat& c : quant_stats()) {
      if (r.error.empty()) o << (c.kind == StatKind::count ? std::to_string(c.count(st)) : num(c.value(st)));
      o << ",";
    }
    o << csv_field(r.error) << "\n";
  }
  o.close();
  if (!o) throw Error("cannot write '" + path + "'");
}

// One column per QuantSpec knob (formats/vocab.hpp), typed by its kind;
// the tensor amax as text (none, auto or the value at %.17g).
void write_knob_columns(hid_t F, const TensorSweep& s) {
  for (const QuantKnob& k : quant_knobs()) {
    const std::string path = std::string("/results/") + k.name;
    const bool as_text = k.kind == KnobKind::text;
    std::vector<std::string> text;
    std::vector<double> real;
    std::vector<int64_t> integer;
    std::vector<uint64_t> u64;
    for (const auto& r : s.results) {
      if (as_text) {
        text.push_back(csv_knob(k, r.spec));
        continue;
      }
      const KnobValue v = typed_value(k, r.spec);
      if (k.kind == KnobKind::real) real.push_back(std::get<double>(v));
      else if (k.kind == KnobKind::u64) u64.push_back(std::get<uint64_t>(v));
      else integer.push_back(std::get<int64_t>(v));
    }
    if (as_text) io::h5::write_column(F, path, text);
    else if (k.kind == KnobKind::real) io::h5::write_column(F, path, real);
    else if (k.kind == KnobKind::u64) io::h5::write_column(F, path, u64);
    else io::h5::write_column(F, path, integer);
  }
}

// The HDF5 file of `exmy sweep-tensors`: /tensors, /combos and one
// /results column per knob and statistic.
void write_results_h5(const TensorSweep& s, const std::string& file) {
  Handle f = io::h5::create_file(file, false);
  if (!f.valid()) throw Error("cannot create '" + file + "'");
  std::vector<std::string> tnames;
  std::vector<int64_t> trows, tcols;
  for (size_t i = 0; i < s.tensors.size(); ++i) {
    tnames.push_back(s.tensors[i].name);
    trows.push_back(s.shapes[i].first);
    tcols.push_back(s.shapes[i].second);
  }
  io::h5::write_column(f.get(), "/tensors/name", tnames);
  io::h5::write_column(f.get(), "/tensors/rows", trows);
  io::h5::write_column(f.get(), "/tensors/cols", tcols);
  std::vector<std::string> cnames, cfam;
  for (const auto& c : s.combos) {
    cnames.push_back(c.name);
    cfam.push_back(c.family);
  }
  io::h5::write_column(f.get(), "/combos/name", cnames);
  io::h5::write_column(f.get(), "/combos/family", cfam);

  std::vector<int64_t> tensor, combo;
  std::vector<std::string> cname, error;
  std::vector<double> amax_used, t;
  const auto& stats = quant_stats();
  std::vector<std::vector<uint64_t>> counts(stats.size());  // StatKind::count columns
  std::vector<std::vector<double>> values(stats.size());    // the others
  for (const auto& r : s.results) {
    const QuantStats& st = r.stats;
    tensor.push_back(static_cast<int64_t>(r.tensor));
    combo.push_back(r.combo == SIZE_MAX ? -1 : static_cast<int64_t>(r.combo));
    cname.push_back(combo_name(s, r));
    error.push_back(r.error);
    amax_used.push_back(r.error.empty() ? r.info.amax : NAN);
    t.push_back(r.error.empty() ? static_cast<double>(r.info.t) : NAN);
    for (size_t i = 0; i < stats.size(); ++i) {
      if (stats[i].kind == StatKind::count) counts[i].push_back(stats[i].count(st));
      else values[i].push_back(r.error.empty() ? stats[i].value(st) : NAN);
    }
  }
  const hid_t F = f.get();
  io::h5::write_column(F, "/results/tensor", tensor);
  io::h5::write_column(F, "/results/combo", combo);
  io::h5::write_column(F, "/results/combo_name", cname);
  write_knob_columns(F, s);
  io::h5::write_column(F, "/results/error", error);
  io::h5::write_column(F, "/results/amax", amax_used);
  io::h5::write_column(F, "/results/t", t);
  for (size_t i = 0; i < stats.size(); ++i) {
    const std::string path = std::string("/results/") + stats[i].name;
    if (stats[i].kind == StatKind::count) io::h5::write_column(F, path, counts[i]);
    else io::h5::write_column(F, path, values[i]);
  }
  Handle root = io::h5::open_root(F);
  io::h5::write_attribute(root.get(), "schema", std::string("exmy sweep-tensors 1"));
}

}  // namespace

void write_tensor_sweep(const TensorSweep& s, const std::string& csv_path, const std::string& h5_path) {
  // Both outputs are checked before either is written (sim/io/atomic_file.hpp).
  const io::OutputTarget csv_at = csv_path.empty() ? io::OutputTarget{} : io::output_target(csv_path);
  const io::OutputTarget h5_at = h5_path.empty() ? io::OutputTarget{} : io::output_target(h5_path);
  const std::string csv_tmp = csv_path.empty() ? "" : io::temporary_for(csv_at);
  const std::string h5_tmp = h5_path.empty() ? "" : io::temporary_for(h5_at);
  struct Cleanup {
    std::vector<std::string> files;
    ~Cleanup() {
      std::error_code ec;
      for (const auto& f : files) fs::remove(f, ec);
    }
  } cleanup;
  if (!csv_path.empty()) {
    cleanup.files.push_back(csv_tmp);
    write_results_csv(s, csv_tmp);
  }
  if (!h5_path.empty()) {
    io::h5::silence_errors();
    cleanup.files.push_back(h5_tmp);
    write_results_h5(s, h5_tmp);
  }
  if (!csv_path.empty()) io::place_output(csv_tmp, csv_at, csv_path);
  if (!h5_path.empty()) io::place_output(h5_tmp, h5_at, h5_path);
  cleanup.files.clear();
}

}  // namespace exmy::sweep

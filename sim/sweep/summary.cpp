#include "sim/sweep/summary.hpp"

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "formats/error.hpp"
#include "sim/io/atomic_file.hpp"
#include "sim/io/run_file.hpp"
#include "sim/io/run_reader.hpp"
#include "sim/train/loss_window.hpp"

extern char** environ;

namespace exmy::sweep {
namespace fs = std::filesystem;

namespace {

using io::RunReader;

// Rows of one statistics group: only the first len(step) rows count, up to
// the last row written (io::written_rows).
struct Group {
  const RunReader& r;
  std::string path;
  std::vector<double> step;
  Group(const RunReader& rr, std::string p) : r(rr), path(std::move(p)) {
    step = r.column(path + "/step");
    step.resize(io::written_rows(step));
  }
  std::vector<double> col(const std::string& name) const {
    auto v = r.column(path + "/" + name);
    if (v.size() > step.size()) v.resize(step.size());
    return v;
  }
  bool has(const std::string& name) const { return r.has(path + "/" + name); }
  std::vector<double> ratio(const std::string& num, const std::string& den) const {
    const auto a = col(num), b = col(den);
    std::vector<double> out(std::min(a.size(), b.size()));
    for (size_t i = 0; i < out.size(); ++i) out[i] = b[i] > 0 ? a[i] / b[i] : NAN;
    return out;
  }
};

std::string fmt(const char* f, double v) {
  if (std::isnan(v)) return "";
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}
// Full precision for CSV (a double read back is the same double).
std::string num(double v) { return fmt("%.17g", v); }

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

std::string md_cell(std::string s) {
  std::string out;
  for (char c : s) out += c == '|' ? std::string("\\|") : std::string(1, c);
  return out;
}

std::string percent(double v) {
  if (std::isnan(v)) return "";
  if (v == 0) return "0";
  return fmt("%.3g%%", 100 * v);
}

using io::write_text_atomic;

void update_worst(Figure& f, const std::vector<double>& v, const std::vector<double>& step, const std::string& where,
                  bool by_magnitude) {
  for (size_t i = 0; i < v.size(); ++i) {
    if (!std::isfinite(v[i])) continue;
    const double key = by_magnitude ? std::fabs(v[i]) : v[i];
    const double cur = by_magnitude ? std::fabs(f.value) : f.value;
    if (!f.present || key > cur) {
      f.value = v[i];
      f.present = true;
      f.at = where + "@" + std::to_string(static_cast<int64_t>(step[i]));
    }
  }
}

struct Acc {
  double sum = 0, max = -INFINITY;
  int64_t n = 0;
  void add(const std::vector<double>& v) {
    for (double x : v)
      if (std::isfinite(x)) {
        sum += x;
        max = std::max(max, x);
        ++n;
      }
  }
  double mean() const { return n ? sum / static_cast<double>(n) : NAN; }
  double maximum() const { return n ? max : NAN; }
};

int operand_rank(const std::string& o) {
  static const char* order[] = {"fprop-x", "fprop-w", "dgrad-dy", "dgrad-w", "wgrad-dy", "wgrad-x"};
  for (int i = 0; i < 6; ++i)
    if (o == order[i]) return i;
  return 6;
}
int gemm_rank(const std::string& g) {
  static const char* order[] = {"fprop", "dgrad", "wgrad"};
  for (int i = 0; i < 3; ++i)
    if (g == order[i]) return i;
  return 3;
}

void read_statistics(const RunReader& rr, RunRow& row) {
  struct RoleAcc {
    int64_t groups = 0, rows = 0;
    Acc uf, sat, suf, ssat, smin, sqnr, bias, mag, relerr;
  };
  std::map<std::string, RoleAcc> ops, gemms;
  for (const auto& rel : rr.step_groups("/quant")) {
    const size_t a = rel.rfind('/');
    if (a == std::string::npos || a == 0) continue;
    const size_t b = rel.rfind('/', a - 1);
    if (b == std::string::npos) continue;  // not <layer>/<gemm>/<operand>
    const std::string operand = rel.substr(a + 1);
    Group g(rr, "/quant/" + rel);
    const auto uf = g.has("underflow_fraction") ? g.col("underflow_fraction") : g.ratio("underflow", "nonzero");
    const auto sat = g.ratio("saturated", "elements");
    const auto suf = g.ratio("scale_underflow", "blocks");
    const auto ssat = g.ratio("scale_saturated", "blocks");
    update_worst(row.underflow, uf, g.step, rel, false);
    update_worst(row.saturated, sat, g.step, rel, false);
    update_worst(row.scale_underflow, suf, g.step, rel, false);
    update_worst(row.scale_saturated, ssat, g.step, rel, false);
    RoleAcc& acc = ops[operand];
    ++acc.groups;
    acc.rows += static_cast<int64_t>(g.step.size());
    acc.uf.add(uf);
    acc.sat.add(sat);
    acc.suf.add(suf);
    acc.ssat.add(ssat);
    acc.smin.add(g.ratio("scale_at_min", "blocks"));
    acc.sqnr.add(g.col("sqnr_db"));
  }
  Acc wgrad;
  for (const auto& rel : rr.step_groups("/gemm")) {
    const size_t a = rel.rfind('/');
    if (a == std::string::npos || a == 0) continue;  // not <layer>/<gemm>
    const std::string gemm = rel.substr(a + 1);
    Group g(rr, "/gemm/" + rel);
    // The multiplicative bias gain − 1 (run files before it was stored
    // have `gain`, from which it is the same double).
    auto bias = g.has("multiplicative_bias") ? g.col("multiplicative_bias") : g.col("gain");
    if (!g.has("multiplicative_bias"))
      for (double& x : bias) x -= 1.0;
    if (gemm == "wgrad") {
      wgrad.add(bias);
      update_worst(row.grad_bias_worst, bias, g.step, rel, true);
    }
    RoleAcc& acc = gemms[gemm];
    ++acc.groups;
    acc.rows += static_cast<int64_t>(g.step.size());
    acc.bias.add(bias);
    acc.mag.add(g.col("magnitude_bias"));
    acc.relerr.add(g.col("relative_error"));
  }
  row.grad_bias = wgrad.mean();
  std::vector<std::string> names;
  for (const auto& [k, v] : ops) names.push_back(k);
  std::sort(names.begin(), names.end(), [](const std::string& x, const std::string& y) {
    return operand_rank(x) != operand_rank(y) ? operand_rank(x) < operand_rank(y) : x < y;
  });
  for (const auto& n : names) {
    const RoleAcc& a = ops[n];
    RoleRow r;
    r.kind = "operand";
    r.role = n;
    r.groups = a.groups;
    r.rows = a.rows;
    r.underflow_mean = a.uf.mean();
    r.underflow_max = a.uf.maximum();
    r.saturated_mean = a.sat.mean();
    r.saturated_max = a.sat.maximum();
    r.scale_underflow_mean = a.suf.mean();
    r.scale_underflow_max = a.suf.maximum();
    r.scale_saturated_mean = a.ssat.mean();
    r.scale_saturated_max = a.ssat.maximum();
    r.scale_at_min_mean = a.smin.mean();
    r.sqnr_db_mean = a.sqnr.mean();
    r.multiplicative_bias_mean = r.magnitude_bias_mean = r.relative_error_mean = NAN;
    row.roles.push_back(r);
  }
  names.clear();
  for (const auto& [k, v] : gemms) names.push_back(k);
  std::sort(names.begin(), names.end(), [](const std::string& x, const std::string& y) {
    return gemm_rank(x) != gemm_rank(y) ? gemm_rank(x) < gemm_rank(y) : x < y;
  });
  for (const auto& n : names) {
    const RoleAcc& a = gemms[n];
    RoleRow r;
    r.kind = "gemm";
    r.role = n;
    r.groups = a.groups;
    r.rows = a.rows;
    r.underflow_mean = r.underflow_max = r.saturated_mean = r.saturated_max = NAN;
    r.scale_underflow_mean = r.scale_underflow_max = r.scale_saturated_mean = r.scale_saturated_max = NAN;
    r.scale_at_min_mean = r.sqnr_db_mean = NAN;
    r.multiplicative_bias_mean = a.bias.mean();
    r.magnitude_bias_mean = a.mag.mean();
    r.relative_error_mean = a.relerr.mean();
    row.roles.push_back(r);
  }
}

void read_run(const std::string& path, std::optional<double> diverge_above, RunRow& row) {
  const RunReader rr(path);
  row.has_file = true;
  Group train(rr, "/train");
  const auto loss = train.col("loss");
  row.logged = static_cast<int64_t>(loss.size());
  row.loss_curve = loss;
  row.loss_curve_step.assign(train.step.begin(), train.step.begin() + static_cast<std::ptrdiff_t>(loss.size()));
  if (!loss.empty()) {
    row.first_loss = loss.front();
    row.last_step = static_cast<int64_t>(train.step[loss.size() - 1]);
    const auto tokens = train.col("tokens");
    const auto elapsed = train.col("elapsed_s");
    if (!tokens.empty() && !elapsed.empty()) {
      row.tokens = static_cast<int64_t>(tokens.back());
      row.elapsed_s = elapsed.back();
      if (row.elapsed_s > 0) row.tokens_per_s = tokens.back() / row.elapsed_s;
    }
  }
  // The final-window train loss, over every step's loss (/step_loss; run
  // files written before it have none, and so no final-window loss).
  const auto steps = Group(rr, "/step_loss").col("loss");
  if (!steps.empty()) {
    row.final_train_loss = train::final_window_loss(steps);
    row.window = train::final_window_steps(static_cast<int64_t>(steps.size()));
  }
  Group eval(rr, "/eval");
  const auto val = eval.col("loss");
  if (!val.empty()) row.final_val_loss = val.back();
  bool nonfinite = false;
  for (double x : loss) nonfinite = nonfinite || !std::isfinite(x);
  if (nonfinite) row.diverged = "nonfinite";
  else if (!std::isnan(row.final_train_loss) &&
           row.final_train_loss > (diverge_above ? *diverge_above : row.first_loss))
    row.diverged = "above";
  read_statistics(rr, row);
}

// The plot script, its interpreter, and whether they can run.
void run_plots(const SummaryOptions& opt, const std::string& out) {
  auto warn = [&](const std::string& m) {
    if (opt.out) std::fprintf(opt.out, "exmy sweep: warning: no plots: %s\n", m.c_str());
  };
  std::error_code ec;
  if (opt.plot_script.empty()) return;
  if (!fs::exists(opt.plot_script, ec)) return warn("'" + opt.plot_script + "' not found");
  if (::access(opt.python.c_str(), X_OK) != 0) return warn(opt.python + " not found (apt-get install python3)");
  std::vector<std::string> argv = {opt.python, opt.plot_script, out};
  std::vector<char*> cargv;
  for (auto& a : argv) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  pid_t pid = -1;
  if (::posix_spawn(&pid, argv[0].c_str(), nullptr, nullptr, cargv.data(), environ) != 0)
    return warn("cannot start " + opt.python);
  int ws = 0;
  ::waitpid(pid, &ws, 0);
  if (!WIFEXITED(ws) || WEXITSTATUS(ws) != 0)
    warn(opt.plot_script + " failed (exit status " + std::to_string(WIFEXITED(ws) ? WEXITSTATUS(ws) : -1) +
         "; it needs python3-h5py and python3-matplotlib)");
}

struct Stat {
  double mean = NAN, sd = NAN, min = NAN, max = NAN;
  int64_t n = 0;
};
Stat stat_of(const std::vector<double>& v) {
  Stat s;
  std::vector<double> x;
  for (double d : v)
    if (std::isfinite(d)) x.push_back(d);
  s.n = static_cast<int64_t>(x.size());
  if (x.empty()) return s;
  double sum = 0;
  for (double d : x) sum += d;
  s.mean = sum / static_cast<double>(x.size());
  double ss = 0;
  for (double d : x) ss += (d - s.mean) * (d - s.mean);
  s.sd = x.size() > 1 ? std::sqrt(ss / static_cast<double>(x.size() - 1)) : 0;
  s.min = *std::min_element(x.begin(), x.end());
  s.max = *std::max_element(x.begin(), x.end());
  return s;
}

}  // namespace

std::vector<RunRow> collect_rows(const SweepSpec& spec, const std::vector<RunSpec>& runs, const std::string& out) {
  std::vector<RunRow> rows(runs.size());
  for (size_t i = 0; i < runs.size(); ++i) {
    RunRow& row = rows[i];
    row.run = &runs[i];
    const RunState st = run_state(out, runs[i]);
    row.status = st.status;
    row.message = st.message;
    const fs::path h5 = fs::path(run_dir(out, runs[i])) / "run.h5";
    std::error_code ec;
    if (fs::exists(h5, ec)) {
      try {
        read_run(h5.string(), spec.diverge_above, row);
      } catch (const Error& e) {
        if (row.message.empty()) row.message = e.what();
      }
    }
    if (st.status == RunStatus::diverged) row.diverged = "nonfinite";
  }
  for (auto& row : rows) {
    if (!row.run->reference) continue;
    const RunRow& ref = rows[static_cast<size_t>(*row.run->reference)];
    row.gap_train = row.final_train_loss - ref.final_train_loss;
    row.gap_val = row.final_val_loss - ref.final_val_loss;
  }
  return rows;
}

namespace {

// summary.csv: every figure at full precision.
std::string runs_csv(const std::vector<std::string>& keys, const std::vector<RunRow>& rows) {
  std::string csv = "index,name,status";
  for (const auto& k : keys) {
    csv += ',';
    csv += csv_field(k);
  }
  csv += ",last_step,final_window_train_loss,final_window_steps,final_val_loss,reference,gap_train,gap_val,diverged,"
         "underflow,underflow_at,saturated,saturated_at,scale_underflow,scale_underflow_at,"
         "scale_saturated,scale_saturated_at,grad_bias,grad_bias_worst,grad_bias_worst_at,"
         "tokens,tokens_per_s,elapsed_s,message\n";
  auto fig = [](const Figure& f) { return f.present ? num(f.value) + "," + csv_field(f.at) : std::string(","); };
  for (const auto& r : rows) {
    csv += std::to_string(r.run->index) + "," + csv_field(r.run->name) + "," + std::string(status_name(r.status));
    for (const auto& [k, v] : r.run->values) {
      csv += ',';
      csv += csv_field(v);
    }
    csv += "," + (r.has_file ? std::to_string(r.last_step) : std::string()) + "," + num(r.final_train_loss) + "," +
           (r.window > 0 ? std::to_string(r.window) : std::string()) + "," + num(r.final_val_loss) + "," + (r.run->reference ? std::to_string(*r.run->reference) : std::string()) + "," +
           num(r.gap_train) + "," + num(r.gap_val) + "," + r.diverged + "," + fig(r.underflow) + "," +
           fig(r.saturated) + "," + fig(r.scale_underflow) + "," + fig(r.scale_saturated) + "," + num(r.grad_bias) +
           "," + fig(r.grad_bias_worst) + "," + (r.has_file ? std::to_string(r.tokens) : std::string()) + "," +
           num(r.tokens_per_s) + "," + num(r.elapsed_s) + "," + csv_field(r.message) + "\n";
  }
  return csv;

}

// summary_roles.csv: per run and role, means and maxima over layers and steps.
std::string roles_csv(const std::vector<std::string>& keys, const std::vector<RunRow>& rows) {
  std::string roles = "index,name";
  for (const auto& k : keys) {
    roles += ',';
    roles += csv_field(k);
  }
  roles += ",kind,role,groups,rows,underflow_mean,underflow_max,saturated_mean,saturated_max,"
           "scale_underflow_mean,scale_underflow_max,scale_saturated_mean,scale_saturated_max,"
           "scale_at_min_mean,sqnr_db_mean,multiplicative_bias_mean,magnitude_bias_mean,relative_error_mean\n";
  for (const auto& r : rows)
    for (const auto& x : r.roles) {
      roles += std::to_string(r.run->index) + "," + csv_field(r.run->name);
      for (const auto& [k, v] : r.run->values) {
        roles += ',';
        roles += csv_field(v);
      }
      roles += "," + x.kind + "," + x.role + "," + std::to_string(x.groups) + "," + std::to_string(x.rows) + "," +
               num(x.underflow_mean) + "," + num(x.underflow_max) + "," + num(x.saturated_mean) + "," +
               num(x.saturated_max) + "," + num(x.scale_underflow_mean) + "," + num(x.scale_underflow_max) + "," +
               num(x.scale_saturated_mean) + "," + num(x.scale_saturated_max) + "," + num(x.scale_at_min_mean) +
               "," + num(x.sqnr_db_mean) + "," + num(x.multiplicative_bias_mean) + "," + num(x.magnitude_bias_mean) + "," + num(x.relative_error_mean) +
               "\n";
    }
  return roles;

}

// summary.md up to its group section: the counts, what the columns mean,
// the table of runs and the messages of runs that did not finish.
void runs_md(std::ostringstream& md, const SweepSpec& spec, const std::vector<RunSpec>& runs,
             const std::vector<RunRow>& rows, const std::vector<std::string>& keys,
             const std::map<std::string, std::string>& shorts) {
  int64_t counts[6] = {0, 0, 0, 0, 0, 0};
  for (const auto& r : rows) ++counts[static_cast<int>(r.status)];
  md << "# Sweep " << spec.name << "\n\n";
  md << runs.size() << " runs: " << counts[static_cast<int>(RunStatus::done)] << " done, "
     << counts[static_cast<int>(RunStatus::diverged)] << " diverged, " << counts[static_cast<int>(RunStatus::failed)]
     << " failed, "
     << counts[static_cast<int>(RunStatus::pending)] + counts[static_cast<int>(RunStatus::interrupted)] +
            counts[static_cast<int>(RunStatus::running)]
     << " not finished. Base configuration `" << spec.base << "`";
  if (!spec.fixed.empty()) {
    md << "; for every run:";
    for (const auto& [k, v] : spec.fixed) md << " `" << k << "=" << v << "`";
  }
  md << ".\n\n";
  md << "Final-window train loss (last N steps): the mean training loss of the last N = max(1, round(steps/10)) steps "
        "of every step's loss (docs/training.md; N per run in summary.csv, final_window_steps). Val loss: the last "
        "validation loss.";
  if (!spec.reference.empty()) {
    md << " Gap: val loss minus that of the reference run (same other axis values,";
    for (const auto& [k, v] : spec.reference) md << " `" << k << "=" << v << "`";
    md << ").";
  }
  md << " Diverged: `nonfinite` (the trainer stopped on a NaN/Inf) or `above` (train loss above "
     << (spec.diverge_above ? fmt("%g", *spec.diverge_above) : std::string("the run's first logged loss")) << ")."
     << " Underflow, scale underflow/saturation: worst over every quantized operand and statistics step."
     << " Grad bias: mean multiplicative bias (gain − 1, gain = Σŷy/Σy²) of the wgrad GEMMs. Full figures: summary.csv, summary_roles.csv.\n\n";
  md << "| # | run | status |";
  for (const auto& k : keys) md << " " << md_cell(shorts.at(k)) << " |";
  md << " final-window train loss (last N steps) | val loss |" << (spec.reference.empty() ? "" : " gap |")
     << " diverged | underflow | scale uf | scale sat | grad bias | tok/s |\n|---|---|---|";
  for (size_t i = 0; i < keys.size(); ++i) md << "---|";
  md << "---:|---:|" << (spec.reference.empty() ? "" : "---:|") << "---|---:|---:|---:|---:|---:|\n";
  for (const auto& r : rows) {
    md << "| " << r.run->index << " | " << md_cell(r.run->name) << " | " << status_name(r.status) << " |";
    for (const auto& [k, v] : r.run->values) md << " " << md_cell(v) << " |";
    md << " " << fmt("%.4f", r.final_train_loss) << " | " << fmt("%.4f", r.final_val_loss) << " |";
    if (!spec.reference.empty()) md << " " << fmt("%+.4f", r.gap_val) << " |";
    md << " " << r.diverged << " | " << (r.underflow.present ? percent(r.underflow.value) : "") << " | "
       << (r.scale_underflow.present ? percent(r.scale_underflow.value) : "") << " | "
       << (r.scale_saturated.present ? percent(r.scale_saturated.value) : "") << " | "
       << fmt("%+.4f", r.grad_bias) << " | " << fmt("%.0f", r.tokens_per_s) << " |\n";
  }
  bool any_message = false;
  for (const auto& r : rows) any_message = any_message || (!r.message.empty() && r.status != RunStatus::done);
  if (any_message) {
    md << "\n";
    for (const auto& r : rows)
      if (!r.message.empty() && r.status != RunStatus::done)
        md << "* run " << r.run->index << " (" << status_name(r.status) << "): " << md_cell(r.message) << "\n";
  }

}

// Means and spread over the group_over axis (e.g. seeds): summary.md's
// section, and summary_groups.csv as the result.
std::string groups_md_csv(std::ostringstream& md, const SweepSpec& spec, const std::vector<RunRow>& rows,
                          const std::map<std::string, std::string>& shorts) {
  size_t g_axis = 0;
  for (size_t a = 0; a < spec.axes.size(); ++a)
    for (const auto& k : spec.axes[a].keys)
      if (k == spec.group_over) g_axis = a;
  std::map<std::vector<int64_t>, std::vector<const RunRow*>> groups;
  std::vector<std::vector<int64_t>> order;
  for (const auto& r : rows) {
    auto key = r.run->position;
    key[g_axis] = -1;
    if (!groups.count(key)) order.push_back(key);
    groups[key].push_back(&r);
  }
  std::string gcsv;
  for (size_t a = 0; a < spec.axes.size(); ++a)
    if (a != g_axis)
      for (const auto& k : spec.axes[a].keys) gcsv += csv_field(k) + ",";
  gcsv += "runs,finished,diverged,train_loss_mean,train_loss_sd,train_loss_min,train_loss_max,val_loss_mean,"
          "val_loss_sd,val_loss_min,val_loss_max,gap_val_mean,gap_val_sd\n";
  md << "\n## Over " << spec.group_over << "\n\nMean ± sample standard deviation (min..max) over the runs that "
     << "finished without diverging.\n\n|";
  for (size_t a = 0; a < spec.axes.size(); ++a)
    if (a != g_axis)
      for (const auto& k : spec.axes[a].keys) md << " " << md_cell(shorts.at(k)) << " |";
  md << " runs | final-window train loss (last N steps) | val loss |" << (spec.reference.empty() ? "" : " gap |") << "\n|";
  for (size_t a = 0; a < spec.axes.size(); ++a)
    if (a != g_axis)
      for (size_t k = 0; k < spec.axes[a].keys.size(); ++k) md << "---|";
  md << "---|---:|---:|" << (spec.reference.empty() ? "" : "---:|") << "\n";
  for (const auto& key : order) {
    const auto& members = groups[key];
    std::vector<double> tl, vl, gv;
    int64_t finished = 0, diverged = 0;
    for (const RunRow* r : members) {
      if (r->status != RunStatus::done && r->status != RunStatus::diverged) continue;
      ++finished;
      if (!r->diverged.empty()) {
        ++diverged;
        continue;
      }
      tl.push_back(r->final_train_loss);
      vl.push_back(r->final_val_loss);
      gv.push_back(r->gap_val);
    }
    const Stat t = stat_of(tl), v = stat_of(vl), g = stat_of(gv);
    const RunRow& first = *members.front();
    md << "|";
    for (size_t a = 0; a < spec.axes.size(); ++a) {
      if (a == g_axis) continue;
      for (size_t k = 0; k < spec.axes[a].keys.size(); ++k) {
        const std::string& val = spec.axes[a].values[k][static_cast<size_t>(first.run->position[a])];
        md << " " << md_cell(val) << " |";
        gcsv += csv_field(val) + ",";
      }
    }
    auto cell = [](const Stat& s) {
      if (s.n == 0) return std::string();
      return fmt("%.4f", s.mean) + " ± " + fmt("%.4f", s.sd) + " (" + fmt("%.4f", s.min) + ".." +
             fmt("%.4f", s.max) + ")";
    };
    md << " " << finished << "/" << members.size() << (diverged ? " (" + std::to_string(diverged) + " diverged)" : "")
       << " | " << cell(t) << " | " << cell(v) << " |";
    if (!spec.reference.empty()) md << " " << (g.n ? fmt("%+.4f", g.mean) + " ± " + fmt("%.4f", g.sd) : "") << " |";
    md << "\n";
    gcsv += std::to_string(members.size()) + "," + std::to_string(finished) + "," + std::to_string(diverged) + "," +
            num(t.mean) + "," + num(t.sd) + "," + num(t.min) + "," + num(t.max) + "," + num(v.mean) + "," +
            num(v.sd) + "," + num(v.min) + "," + num(v.max) + "," + num(g.mean) + "," + num(g.sd) + "\n";
  }
  return gcsv;
}

}  // namespace

std::vector<RunRow> write_summary(const SweepSpec& spec, const std::vector<RunSpec>& runs, const std::string& out,
                                  const SummaryOptions& opt) {
  const auto rows = collect_rows(spec, runs, out);
  const auto keys = spec.axis_keys();
  const auto shorts = short_names(keys);
  const fs::path dir(out);
  fs::create_directories(dir);
  write_text_atomic(dir / "summary.csv", runs_csv(keys, rows));
  write_text_atomic(dir / "summary_roles.csv", roles_csv(keys, rows));
  std::ostringstream md;
  runs_md(md, spec, runs, rows, keys, shorts);
  if (!spec.group_over.empty()) write_text_atomic(dir / "summary_groups.csv", groups_md_csv(md, spec, rows, shorts));
  md << "\nPlots (analysis/sweep_plots.py): plots/loss_curves.png, plots/<metric>_by_<axis>.png.\n";
  write_text_atomic(dir / "summary.md", md.str());
  run_plots(opt, out);
  return rows;
}

}  // namespace exmy::sweep

#include "sim/eval/inspect.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <functional>
#include <set>

#include "formats/error.hpp"
#include "sim/io/run_file.hpp"
#include "sim/io/run_reader.hpp"

namespace exmy::eval {
namespace fs = std::filesystem;

bool natural_less(const std::string& a, const std::string& b) {
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (std::isdigit(static_cast<unsigned char>(a[i])) && std::isdigit(static_cast<unsigned char>(b[j]))) {
      size_t i2 = i, j2 = j;
      while (i2 < a.size() && std::isdigit(static_cast<unsigned char>(a[i2]))) ++i2;
      while (j2 < b.size() && std::isdigit(static_cast<unsigned char>(b[j2]))) ++j2;
      // Compare the numbers by value: strip leading zeros, then length, then digits.
      std::string_view x(a.data() + i, i2 - i), y(b.data() + j, j2 - j);
      while (x.size() > 1 && x[0] == '0') x.remove_prefix(1);
      while (y.size() > 1 && y[0] == '0') y.remove_prefix(1);
      if (x.size() != y.size()) return x.size() < y.size();
      if (x != y) return x < y;
      i = i2;
      j = j2;
    } else {
      if (a[i] != b[j]) return a[i] < b[j];
      ++i;
      ++j;
    }
  }
  return a.size() - i < b.size() - j;
}

namespace {

// The order of GEMMs and operands in tables (others sort after, by name).
int gemm_rank(const std::string& g) {
  static const char* order[] = {"fprop", "dgrad", "wgrad"};
  for (int i = 0; i < 3; ++i)
    if (g == order[i]) return i;
  return 3;
}
int operand_rank(const std::string& o) {
  static const char* order[] = {"fprop-x", "fprop-w", "dgrad-dy", "dgrad-w", "wgrad-dy", "wgrad-x",
                                "x",       "w",       "dy"};
  for (int i = 0; i < 9; ++i)
    if (o == order[i]) return i;
  return 9;
}

// Forward order of the linears of a block (LinearKind's order).
int kind_rank(const std::string& layer) {
  static const char* order[] = {"in_proj", "out_proj", "q_proj", "k_proj", "v_proj", "o_proj", "up_proj", "down_proj"};
  const size_t dot = layer.rfind('.');
  const std::string last = dot == std::string::npos ? layer : layer.substr(dot + 1);
  for (int i = 0; i < 8; ++i)
    if (last == order[i]) return i;
  return 8;
}

// Blocks in order (numbers as numbers), the linears of a block in forward
// order, the LM head (named "lm_head") after every block.
bool layer_less(const std::string& a, const std::string& b) {
  const bool ha = a.starts_with("lm_head"), hb = b.starts_with("lm_head");
  if (ha != hb) return hb;
  const size_t da = a.rfind('.'), db = b.rfind('.');
  const std::string pa = da == std::string::npos ? "" : a.substr(0, da);
  const std::string pb = db == std::string::npos ? "" : b.substr(0, db);
  if (pa != pb) return natural_less(pa, pb);
  if (kind_rank(a) != kind_rank(b)) return kind_rank(a) < kind_rank(b);
  return natural_less(a, b);
}

using Reader = io::RunReader;

// The rows of a group: its `step` column and any dataset of it, cut to
// len(step) rows, up to the last row written (io::written_rows).
struct GroupRows {
  const Reader& r;
  std::string group;
  std::vector<double> step;
  GroupRows(const Reader& rd, std::string g) : r(rd), group(std::move(g)) {
    step = r.read(group + "/step");
    step.resize(io::written_rows(step));
  }
  bool has(const std::string& name) const { return r.has(group + "/" + name); }
  std::vector<double> col(const std::string& name) const {
    if (!has(name)) return {};
    std::vector<double> v = r.read(group + "/" + name);
    v.resize(std::min(v.size(), step.size()));
    return v;
  }
};

// Worst over the rows of `values` (NaN and Inf skipped): the largest, or
// the smallest with `lowest`, or the largest in magnitude with `magnitude`.
enum class Pick { largest, lowest, magnitude };
Worst worst_of(const std::vector<double>& values, const std::vector<double>& steps, Pick pick) {
  Worst w;
  for (size_t i = 0; i < values.size() && i < steps.size(); ++i) {
    const double v = values[i];
    if (!std::isfinite(v)) continue;
    ++w.rows;
    w.last = v;
    bool better = false;
    if (w.step < 0) better = true;
    else if (pick == Pick::largest) better = v > w.worst;
    else if (pick == Pick::lowest) better = v < w.worst;
    else better = std::fabs(v) > std::fabs(w.worst);
    if (better) {
      w.worst = v;
      w.step = static_cast<int64_t>(steps[i]);
    }
  }
  return w;
}

// num / den elementwise (den 0: NaN, skipped); empty when either is missing.
std::vector<double> ratio(const std::vector<double>& num, const std::vector<double>& den) {
  if (num.empty() || den.empty()) return {};
  std::vector<double> v(std::min(num.size(), den.size()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = den[i] > 0 ? num[i] / den[i] : NAN;
  return v;
}

// The rows of one operand group a statistic of the operand table is ranked
// by: a count as a fraction of its `per` (or the stored `<name>_fraction`
// of the statistics table, where the file has it), another as stored.
std::vector<double> operand_column(const GroupRows& g, const QuantStat& st) {
  if (!st.per) return g.col(st.name);
  const std::string stored = std::string(st.name) + "_fraction";
  const auto& all = quant_stats();
  const bool in_table = std::any_of(all.begin(), all.end(), [&](const QuantStat& o) { return o.name == stored; });
  return in_table && g.has(stored) ? g.col(stored) : ratio(g.col(st.name), g.col(st.per));
}

// Its name in the CSV: "<name>_fraction" or "<name>_min".
std::string operand_csv_name(const QuantStat& st) {
  return std::string(st.name) + (st.per ? "_fraction" : "_min");
}

// "a/b/c" -> components.
std::vector<std::string> components(const std::string& path) {
  std::vector<std::string> v;
  size_t i = 0;
  while (i < path.size()) {
    size_t j = path.find('/', i);
    if (j == std::string::npos) j = path.size();
    if (j > i) v.push_back(path.substr(i, j - i));
    i = j + 1;
  }
  return v;
}

std::string join(const std::vector<std::string>& v, size_t from, size_t to, char sep) {
  std::string s;
  for (size_t i = from; i < to; ++i) s += (i > from ? std::string(1, sep) : std::string()) + v[i];
  return s;
}


}  // namespace

const std::vector<const QuantStat*>& operand_table_stats() {
  static const std::vector<const QuantStat*> v = [] {
    std::vector<const QuantStat*> r;
    for (const QuantStat& st : quant_stats())
      if (st.worst != StatWorst::none) r.push_back(&st);
    return r;
  }();
  return v;
}

namespace {

// The loss summary of /train.
void read_train(const Reader& r, RunSummary& s) {
  if (r.has("/train/step")) {
    GroupRows g(r, "/train");
    s.train_rows = static_cast<int64_t>(g.step.size());
    const auto loss = g.col("loss");
    if (!g.step.empty()) {
      s.steps = static_cast<int64_t>(g.step.back());
      const auto tokens = g.col("tokens");
      if (!tokens.empty()) s.tokens = static_cast<int64_t>(tokens.back());
      const auto el = g.col("elapsed_s");
      if (!el.empty()) s.elapsed_s = el.back();
      auto tps = g.col("tokens_per_s");
      tps.erase(std::remove_if(tps.begin(), tps.end(), [](double x) { return !(x > 0) || !std::isfinite(x); }),
                tps.end());
      if (!tps.empty()) {
        std::sort(tps.begin(), tps.end());
        const size_t n = tps.size();
        s.tokens_per_s_median = n % 2 ? tps[n / 2] : 0.5 * (tps[n / 2 - 1] + tps[n / 2]);
      }
    }
    if (!loss.empty()) {
      s.first_loss = loss.front();
      s.first_step = static_cast<int64_t>(g.step.front());
      s.last_loss = loss.back();
      s.last_step = static_cast<int64_t>(g.step[loss.size() - 1]);
      const Worst m = worst_of(loss, g.step, Pick::lowest);
      s.min_loss = m.present() ? m.worst : NAN;
      s.min_step = m.step;
    }
  }
}

// /eval: the trainer's rows and the quantized evaluations.
void read_evals(const Reader& r, RunSummary& s) {
  if (r.has("/eval/step")) {
    GroupRows g(r, "/eval");
    const auto loss = g.col("loss");
    s.eval_rows = static_cast<int64_t>(loss.size());
    if (!loss.empty()) {
      s.final_val_loss = loss.back();
      s.final_val_step = static_cast<int64_t>(g.step[loss.size() - 1]);
      const Worst b = worst_of(loss, g.step, Pick::lowest);
      s.best_val_loss = b.present() ? b.worst : NAN;
      s.best_val_step = b.step;
    }
  }
  for (const auto& rel : r.step_groups("/eval")) {
    GroupRows g(r, "/eval/" + rel);
    EvalSeries e;
    e.group = "/eval/" + rel;
    e.loss = g.col("loss");
    e.step.assign(g.step.begin(), g.step.begin() + static_cast<std::ptrdiff_t>(e.loss.size()));
    s.quantized_evals.push_back(std::move(e));
  }

}

// The per-operand and per-GEMM tables of /quant and /gemm, in layer order.
void read_statistics(const Reader& r, RunSummary& s) {
  std::set<int64_t> steps_seen;
  s.has_quant = r.groups().count("/quant") > 0;
  s.has_gemm = r.groups().count("/gemm") > 0;
  for (const auto& rel : r.step_groups("/quant")) {
    const auto c = components(rel);
    if (c.size() < 3) continue;  // not <layer>/<gemm>/<operand>
    GroupRows g(r, "/quant/" + rel);
    for (double st : g.step) steps_seen.insert(static_cast<int64_t>(st));
    OperandRow row;
    row.layer = join(c, 0, c.size() - 2, '.');
    row.gemm = c[c.size() - 2];
    row.operand = c.back();
    for (const QuantStat* st : operand_table_stats())
      row.worst.push_back(worst_of(operand_column(g, *st), g.step,
                                   st->worst == StatWorst::lowest ? Pick::lowest : Pick::largest));
    s.operands.push_back(std::move(row));
  }
  for (const auto& rel : r.step_groups("/gemm")) {
    const auto c = components(rel);
    if (c.size() < 2) continue;  // not <layer>/<gemm>
    GroupRows g(r, "/gemm/" + rel);
    for (double st : g.step) steps_seen.insert(static_cast<int64_t>(st));
    GemmRow row;
    row.layer = join(c, 0, c.size() - 1, '.');
    row.gemm = c.back();
    // gain − 1 (older run files store only `gain`: the same double).
    std::vector<double> bias = g.col(g.has("multiplicative_bias") ? "multiplicative_bias" : "gain");
    if (!g.has("multiplicative_bias"))
      for (double& x : bias) x -= 1.0;
    row.gradient_bias = worst_of(bias, g.step, Pick::magnitude);
    row.magnitude_bias = worst_of(g.col("magnitude_bias"), g.step, Pick::magnitude);
    row.relative_error = worst_of(g.col("relative_error"), g.step, Pick::largest);
    row.cosine = worst_of(g.col("cosine"), g.step, Pick::lowest);
    s.gemms.push_back(std::move(row));
  }
  s.stat_steps = static_cast<int64_t>(steps_seen.size());
  std::sort(s.operands.begin(), s.operands.end(), [](const OperandRow& a, const OperandRow& b) {
    if (a.layer != b.layer) return layer_less(a.layer, b.layer);
    if (a.gemm != b.gemm) return gemm_rank(a.gemm) != gemm_rank(b.gemm) ? gemm_rank(a.gemm) < gemm_rank(b.gemm) : a.gemm < b.gemm;
    return operand_rank(a.operand) != operand_rank(b.operand) ? operand_rank(a.operand) < operand_rank(b.operand)
                                                              : a.operand < b.operand;
  });
  std::sort(s.gemms.begin(), s.gemms.end(), [](const GemmRow& a, const GemmRow& b) {
    if (a.layer != b.layer) return layer_less(a.layer, b.layer);
    return gemm_rank(a.gemm) != gemm_rank(b.gemm) ? gemm_rank(a.gemm) < gemm_rank(b.gemm) : a.gemm < b.gemm;
  });
}

}  // namespace

RunSummary read_run_summary(const std::string& path_in) {
  std::string path = path_in;
  std::error_code ec;
  if (fs::is_directory(path, ec) && fs::exists(fs::path(path) / "run.h5", ec)) path = (fs::path(path) / "run.h5").string();
  const Reader r(path);
  RunSummary s;
  s.path = path;
  s.attributes = r.attributes();
  if (s.attributes.count("format") && s.attributes.at("format") == "exmy-checkpoint")
    throw Error("'" + path + "' is an exmy checkpoint, not a run file (inspect the run's run.h5)");
  if (!s.attributes.count("schema_version") || !s.attributes.count("config"))
    throw Error("'" + path + "' is not an exmy run file (no schema_version and config root attributes)");

  read_train(r, s);
  read_evals(r, s);
  read_statistics(r, s);
  return s;
}

// ---------------------------------------------------------------------------
// Printing
// ---------------------------------------------------------------------------

namespace {

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

// A fraction as a percentage with 3 significant digits; "0" for zero.
std::string pct(double f) {
  if (f == 0) return "0";
  return fmt("%#.3g%%", 100 * f);
}

// "1.23% @40", or "-" when absent.
std::string cell(const Worst& w, const std::function<std::string(double)>& f) {
  if (!w.present()) return "-";
  if (w.worst == 0) return "0";  // zero at every step: no step to name
  return f(w.worst) + " @" + std::to_string(w.step);
}

void print_table(std::FILE* out, const std::vector<std::string>& head, const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> w(head.size());
  for (size_t c = 0; c < head.size(); ++c) w[c] = head[c].size();
  for (const auto& r : rows)
    for (size_t c = 0; c < r.size(); ++c) w[c] = std::max(w[c], r[c].size());
  auto line = [&](const std::vector<std::string>& r) {
    std::string s = " ";
    for (size_t c = 0; c < r.size(); ++c) {
      std::string v = r[c];
      // Text columns (the first ones) left-aligned, figures right-aligned.
      const bool text = c < 3 && (head[c] == "layer" || head[c] == "gemm" || head[c] == "operand");
      if (text) v += std::string(w[c] - v.size(), ' ');
      else v = std::string(w[c] - v.size(), ' ') + v;
      s += (c == 0 ? " " : "  ") + v;
    }
    while (!s.empty() && s.back() == ' ') s.pop_back();
    std::fprintf(out, "%s\n", s.c_str());
  };
  line(head);
  for (const auto& r : rows) line(r);
}

std::string count(double n) {
  if (n >= 1e9) return fmt("%.2fG", n / 1e9);
  if (n >= 1e6) return fmt("%.2fM", n / 1e6);
  if (n >= 1e3) return fmt("%.1fk", n / 1e3);
  return fmt("%.0f", n);
}

void print_text_block(std::FILE* out, const std::string& title, const std::string& text) {
  std::fprintf(out, "\n%s:\n", title.c_str());
  size_t i = 0;
  while (i < text.size()) {
    size_t j = text.find('\n', i);
    if (j == std::string::npos) j = text.size();
    std::fprintf(out, "  %s\n", text.substr(i, j - i).c_str());
    i = j + 1;
  }
}

// The `plan` attribute ("NAME: fprop-x{...} fprop-w{...} ..." or
// "NAME: bf16", one line per linear) with the linears of identical settings
// grouped and each role on a line of its own.
void print_plan(std::FILE* out, const std::string& text) {
  std::vector<std::pair<std::string, std::vector<std::string>>> groups;  // settings -> linears, first-seen order
  size_t i = 0;
  while (i < text.size()) {
    size_t j = text.find('\n', i);
    if (j == std::string::npos) j = text.size();
    const std::string line = text.substr(i, j - i);
    i = j + 1;
    const size_t c = line.find(": ");
    if (line.empty()) continue;
    const std::string name = c == std::string::npos ? line : line.substr(0, c);
    const std::string rest = c == std::string::npos ? "" : line.substr(c + 2);
    auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == rest; });
    if (it == groups.end()) groups.push_back({rest, {name}});
    else it->second.push_back(name);
  }
  std::fprintf(out, "\nplan (%zu linears, grouped by identical settings):\n", [&] {
    size_t n = 0;
    for (const auto& g : groups) n += g.second.size();
    return n;
  }());
  for (const auto& [rest, names] : groups) {
    std::string list;
    for (const auto& n : names) list += (list.empty() ? "" : ", ") + n;
    // Role settings "role{k=v ...}" one per line; anything else (bf16) inline.
    if (rest.find('{') == std::string::npos) {
      std::fprintf(out, "  %s: %s\n", list.c_str(), rest.c_str());
      continue;
    }
    std::fprintf(out, "  %s:\n", list.c_str());
    size_t k = 0;
    while (k < rest.size()) {
      const size_t open = rest.find('{', k), close = rest.find('}', k);
      if (open == std::string::npos || close == std::string::npos || close < open) {
        std::fprintf(out, "    %s\n", rest.substr(k).c_str());
        break;
      }
      std::string role = rest.substr(k, open - k);
      role.erase(0, role.find_first_not_of(' '));
      std::fprintf(out, "    %-9s %s\n", role.c_str(), rest.substr(open + 1, close - open - 1).c_str());
      k = close + 1;
    }
  }
}

// The `top` rows with the largest key, in table order.
template <class Row>
std::vector<const Row*> pick_rows(const std::vector<Row>& rows, int64_t top, const std::function<double(const Row&)>& key) {
  std::vector<const Row*> v;
  for (const auto& r : rows) v.push_back(&r);
  if (top <= 0 || static_cast<int64_t>(v.size()) <= top) return v;
  std::vector<const Row*> sorted = v;
  std::stable_sort(sorted.begin(), sorted.end(), [&](const Row* a, const Row* b) { return key(*a) > key(*b); });
  sorted.resize(static_cast<size_t>(top));
  std::set<const Row*> keep(sorted.begin(), sorted.end());
  std::vector<const Row*> out;
  for (const Row* r : v)
    if (keep.count(r)) out.push_back(r);
  return out;
}

double or_zero(const Worst& w) { return w.present() ? std::fabs(w.worst) : 0; }

}  // namespace

void print_run_summary(std::FILE* out, const RunSummary& s, const InspectOptions& opt) {
  const auto attr = [&](const char* k) { return s.attributes.count(k) ? s.attributes.at(k) : std::string("?"); };
  std::fprintf(out, "run file %s\n", s.path.c_str());
  std::fprintf(out, "  exmy %s (commit %s), started %s on %s, %s threads, seed %s\n", attr("exmy_version").c_str(),
               attr("git_commit").c_str(), attr("start_time").c_str(), attr("host").c_str(), attr("threads").c_str(),
               attr("seed").c_str());
  std::fprintf(out, "  model %s (%s parameters), precision %s, %s tokens/step\n", attr("model").c_str(),
               s.attributes.count("parameters") ? count(std::stod(attr("parameters"))).c_str() : "?",
               attr("precision").c_str(), attr("tokens_per_step").c_str());
  std::fprintf(out, "  data %s\n", attr("data").c_str());
  if (s.attributes.count("resumed_at_steps") && !s.attributes.at("resumed_at_steps").empty())
    std::fprintf(out, "  resumed at steps %s\n", attr("resumed_at_steps").c_str());
  // Every other single-line attribute (schema additions, recipes' names, ...).
  static const std::set<std::string> shown = {"exmy_version", "git_commit", "start_time", "host",    "threads",
                                              "seed",         "model",      "parameters", "precision", "tokens_per_step",
                                              "data",         "resumed_at_steps", "config"};
  std::vector<std::pair<std::string, std::string>> blocks;
  for (const auto& [k, v] : s.attributes) {
    if (shown.count(k)) continue;
    if (v.find('\n') != std::string::npos) blocks.emplace_back(k, v);
    else std::fprintf(out, "  %s: %s\n", k.c_str(), v.c_str());
  }
  if (opt.config) {
    if (s.attributes.count("config")) print_text_block(out, "configuration (resolved)", s.attributes.at("config"));
    for (const auto& [k, v] : blocks) {
      if (k == "plan") print_plan(out, v);
      else print_text_block(out, k, v);
    }
  }

  std::fprintf(out, "\nloss:\n");
  if (s.train_rows == 0) {
    std::fprintf(out, "  no training rows (/train is empty or absent)\n");
  } else {
    std::fprintf(out, "  steps %lld, tokens %s, %s tokens/s (median of logged intervals)", static_cast<long long>(s.steps),
                 count(static_cast<double>(s.tokens)).c_str(), count(s.tokens_per_s_median).c_str());
    if (s.elapsed_s > 0)
      std::fprintf(out, ", %s tokens/s overall (%.1f s)", count(static_cast<double>(s.tokens) / s.elapsed_s).c_str(),
                   s.elapsed_s);
    std::fprintf(out, "\n  train loss: first %.4f (step %lld), last %.4f (step %lld), min %.4f (step %lld)\n", s.first_loss,
                 static_cast<long long>(s.first_step), s.last_loss, static_cast<long long>(s.last_step), s.min_loss,
                 static_cast<long long>(s.min_step));
  }
  if (s.eval_rows > 0)
    std::fprintf(out, "  validation loss: final %.4f (step %lld), best %.4f (step %lld)\n", s.final_val_loss,
                 static_cast<long long>(s.final_val_step), s.best_val_loss, static_cast<long long>(s.best_val_step));
  else
    std::fprintf(out, "  no validation rows\n");
  for (const auto& e : s.quantized_evals) {
    if (e.loss.empty()) continue;
    std::fprintf(out, "  eval %s: %.4f (step %lld)", e.group.substr(6).c_str(), e.loss.back(),
                 static_cast<long long>(e.step.back()));
    if (e.loss.size() > 1) std::fprintf(out, ", %zu rows", e.loss.size());
    std::fprintf(out, "\n");
  }

  if (s.operands.empty() && s.gemms.empty()) {
    std::fprintf(out, "\nno per-tensor statistics (%s): a run without a quantized recipe, or with statistics off\n",
                 s.has_quant || s.has_gemm ? "/quant and /gemm hold no rows" : "no /quant or /gemm group");
    return;
  }
  std::fprintf(out, "\nworst figures over %lld sampled steps (value @step)\n", static_cast<long long>(s.stat_steps));
  if (!s.operands.empty()) {
    std::fprintf(out, "\noperands: underflow = non-zero inputs flushed to zero, saturated = elements clamped,\n"
                      "scale underflow / saturated = block scales that underflowed / clamped, lowest SQNR\n");
    const auto& stats = operand_table_stats();
    // Rows are ranked by their largest fraction.
    const auto rows = pick_rows<OperandRow>(s.operands, opt.top, [&](const OperandRow& r) {
      double m = 0;
      for (size_t i = 0; i < stats.size(); ++i)
        if (stats[i]->per) m = std::max(m, or_zero(r.worst[i]));
      return m;
    });
    std::vector<std::vector<std::string>> t;
    for (const auto* r : rows) {
      std::vector<std::string> cells = {r->layer, r->gemm, r->operand};
      for (size_t i = 0; i < stats.size(); ++i)
        cells.push_back(stats[i]->per ? cell(r->worst[i], pct)
                                      : cell(r->worst[i], [u = stats[i]->unit](double v) { return fmt("%.1f", v) + " " + u; }));
      t.push_back(std::move(cells));
    }
    std::vector<std::string> head = {"layer", "gemm", "operand"};
    for (const QuantStat* st : stats) head.push_back(st->heading);
    print_table(out, head, t);
  }
  if (!s.gemms.empty()) {
    std::fprintf(out,
                 "\nGEMMs against the unquantized GEMM: bias = gain - 1 with gain = sum(yhat*y)/sum(y^2) (wgrad: the "
                 "gradient bias), magnitude bias = (mean|yhat| - mean|y|)/mean|y| (grows with noise, not a bias), "
                 "relative error, cosine\n");
    const auto rows = pick_rows<GemmRow>(s.gemms, opt.top, [](const GemmRow& r) { return or_zero(r.gradient_bias); });
    std::vector<std::vector<std::string>> t;
    const auto signed_pct = [](double v) { return fmt("%+#.3g%%", 100 * v); };
    for (const auto* r : rows)
      t.push_back({r->layer, r->gemm, cell(r->gradient_bias, signed_pct), cell(r->magnitude_bias, signed_pct),
                   cell(r->relative_error, pct), cell(r->cosine, [](double v) { return fmt("%.6f", v); })});
    print_table(out, {"layer", "gemm", "bias (gain-1)", "magnitude bias", "relative error", "cosine min"}, t);
  }
}

std::string summary_csv(const RunSummary& s) {
  std::string o = "table,layer,gemm,operand,statistic,worst,step,last,rows\n";
  auto num = [](double v) { return fmt("%.17g", v); };
  auto add = [&](const char* table, const std::string& layer, const std::string& gemm, const std::string& operand,
                 const char* stat, const Worst& w) {
    o += std::string(table) + "," + layer + "," + gemm + "," + operand + "," + stat + ",";
    if (w.present()) o += num(w.worst) + "," + std::to_string(w.step) + "," + num(w.last);
    else o += ",,";
    o += "," + std::to_string(w.rows) + "\n";
  };
  const auto& stats = operand_table_stats();
  for (const auto& r : s.operands)
    for (size_t i = 0; i < stats.size(); ++i)
      add("operand", r.layer, r.gemm, r.operand, operand_csv_name(*stats[i]).c_str(), r.worst[i]);
  for (const auto& r : s.gemms) {
    add("gemm", r.layer, r.gemm, "", "multiplicative_bias", r.gradient_bias);
    add("gemm", r.layer, r.gemm, "", "magnitude_bias", r.magnitude_bias);
    add("gemm", r.layer, r.gemm, "", "relative_error", r.relative_error);
    add("gemm", r.layer, r.gemm, "", "cosine_min", r.cosine);
  }
  return o;
}

}  // namespace exmy::eval

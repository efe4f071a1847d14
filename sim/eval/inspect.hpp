// Reading a run file back for `exmy inspect`: the configuration, a loss
// summary, the quantized evaluations, and per-layer tables of the worst
// statistics over the run (docs/eval.md).
//
// The statistics are read from whatever the run file holds, without a list
// of layers or statistics of its own: every group under /quant with a `step`
// dataset is one operand (/quant/<layer>/<gemm>/<operand>/), every group
// under /gemm with a `step` dataset one GEMM (/gemm/<layer>/<gemm>/); the
// layer is the path between them (nested groups joined with '.'). A run
// without those groups (an fp32/bf16 run, statistics off) has empty tables.
// Only the first len(step) rows of a group count (a live run may show more
// rows in its other datasets; see sim/io/run_file.hpp).
#pragma once

#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "formats/vocab.hpp"

namespace exmy::eval {

// One figure of one operand or GEMM over the run: its worst value and the
// step where it first occurred, and the value of the last row.
struct Worst {
  double worst = 0;
  int64_t step = -1;  // -1: no finite value (or the dataset is absent)
  double last = 0;
  int64_t rows = 0;   // finite values seen
  bool present() const { return step >= 0; }
};

// The figures of the operand table: one per row of quant_stats()
// (formats/vocab.hpp) whose `worst` is set, in the table's order
// (operand_table_stats()). A count is a fraction in [0, 1] of the count its
// row names as `per` (underflow: the stored underflow_fraction where the
// file has it); the others are their own lowest value (SQNR in dB).
struct OperandRow {
  std::string layer, gemm, operand;
  std::vector<Worst> worst;  // worst[i]: operand_table_stats()[i]
};
const std::vector<const QuantStat*>& operand_table_stats();
// The figures of the GEMM table: the largest |multiplicative bias| gain − 1
// (signed; for wgrad the recipe's gradient bias), the largest |magnitude
// bias| (mean|ŷ| − mean|y|)/mean|y| (signed; it grows with noise, so it is
// no bias measure), the largest relative error, the lowest cosine.
struct GemmRow {
  std::string layer, gemm;
  Worst gradient_bias, magnitude_bias, relative_error, cosine;
};

struct EvalSeries {
  std::string group;  // "/eval/te-nvfp4/current"
  std::vector<double> step, loss;
};

struct RunSummary {
  std::string path;
  std::map<std::string, std::string> attributes;  // root attributes, as text
  // /train
  int64_t train_rows = 0;
  int64_t steps = 0, tokens = 0;
  double first_loss = 0, last_loss = 0, min_loss = 0;
  int64_t first_step = 0, last_step = 0, min_step = 0;
  double tokens_per_s_median = 0, elapsed_s = 0;
  // /eval (the trainer's validation loss)
  int64_t eval_rows = 0;
  double final_val_loss = 0, best_val_loss = 0;
  int64_t final_val_step = 0, best_val_step = 0;
  std::vector<EvalSeries> quantized_evals;  // /eval/<name>/<policy>
  // statistics
  bool has_quant = false, has_gemm = false;
  int64_t stat_steps = 0;  // distinct sampled steps seen in /quant and /gemm
  std::vector<OperandRow> operands;  // layer order (natural), then gemm, operand
  std::vector<GemmRow> gemms;
};

// Throws exmy::Error with one line for a missing file, a file that is not
// HDF5, or an HDF5 file that is not an exmy run file. `path` may be a run
// directory (its run.h5).
RunSummary read_run_summary(const std::string& path);

struct InspectOptions {
  bool config = true;  // print the configuration and recipe texts
  int64_t top = 0;     // > 0: only the `top` worst rows of each table
};
void print_run_summary(std::FILE* out, const RunSummary& s, const InspectOptions& opt = {});
// The tables as CSV, one row per (table, layer, gemm, operand, statistic):
// table,layer,gemm,operand,statistic,worst,step,last,rows
std::string summary_csv(const RunSummary& s);

// "layers.10.x" after "layers.9.x": numbers inside names compare as numbers.
bool natural_less(const std::string& a, const std::string& b);

}  // namespace exmy::eval

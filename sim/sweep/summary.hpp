// The summary of a sweep: one row per run from its run file (docs/sweeps.md).
//
//   final_train_loss   the final-window train loss (last N steps): the mean loss of the
//                      last N = max(1, round(steps/10)) steps (sim/train/loss_window.hpp)
//   final_val_loss     the last validation loss
//   gap_train/gap_val  the two above minus the reference run's (empty without one)
//   diverged           nonfinite (the trainer stopped on a NaN/Inf loss or gradient),
//                      above (final_train_loss > diverge_above, or, without that
//                      key, above the run's first logged loss), or empty
//   underflow          worst underflow fraction (underflow / nonzero) of any quantized
//                      operand on any statistics step; saturated (saturated / elements),
//                      scale_underflow and scale_saturated (per block) likewise;
//                      *_at names the operand (layer/gemm/operand) and step
//   grad_bias          mean multiplicative bias (gain − 1) of the wgrad GEMMs (all
//                      layers, all statistics steps): the recipe's gradient bias;
//                      grad_bias_worst the value of largest magnitude
//   tokens_per_s       tokens trained / training wall time (last /train row)
// The statistics figures are empty for runs without /quant or /gemm. They are
// the figures of `exmy inspect` (worst over rows), over the whole run.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "sim/sweep/runner.hpp"
#include "sim/sweep/sweep.hpp"

namespace exmy::sweep {

struct Figure {
  double value = 0;
  std::string at;  // "layer/gemm/operand@step"
  bool present = false;
};

// Per role: means and maxima over layers and statistics steps.
struct RoleRow {
  std::string kind;  // operand | gemm
  std::string role;  // fprop-x ... | fprop, dgrad, wgrad
  int64_t groups = 0, rows = 0;
  double underflow_mean = 0, underflow_max = 0, saturated_mean = 0, saturated_max = 0;
  double scale_underflow_mean = 0, scale_underflow_max = 0, scale_saturated_mean = 0, scale_saturated_max = 0;
  double scale_at_min_mean = 0, sqnr_db_mean = 0;
  double multiplicative_bias_mean = 0, magnitude_bias_mean = 0, relative_error_mean = 0;
};

struct RunRow {
  const RunSpec* run = nullptr;
  RunStatus status = RunStatus::pending;
  std::string message;
  bool has_file = false;
  int64_t last_step = 0, logged = 0, tokens = 0;
  double first_loss = NAN, final_train_loss = NAN, final_val_loss = NAN;
  int64_t window = 0;  // N: steps averaged (0: the run file has no per-step losses)
  double gap_train = NAN, gap_val = NAN;
  std::string diverged;
  Figure underflow, saturated, scale_underflow, scale_saturated, grad_bias_worst;
  double grad_bias = NAN;
  double tokens_per_s = NAN, elapsed_s = NAN;
  std::vector<RoleRow> roles;
  std::vector<double> loss_curve_step, loss_curve;  // for the plots (read again by the script)
};

struct SummaryOptions {
  std::string plot_script;              // analysis/sweep_plots.py; empty: no plots
  std::string python = "/usr/bin/python3";
  std::FILE* out = stdout;
};

// Reads every run (missing files give rows with status and empty figures).
std::vector<RunRow> collect_rows(const SweepSpec& spec, const std::vector<RunSpec>& runs, const std::string& out);

// Writes summary.csv, summary.md, summary_roles.csv and, with group_over,
// summary_groups.csv into `out`, then runs the plot script (a warning, not
// an error, when it cannot: no python3, no h5py/matplotlib). Returns the rows.
std::vector<RunRow> write_summary(const SweepSpec& spec, const std::vector<RunSpec>& runs, const std::string& out,
                                  const SummaryOptions& opt);

}  // namespace exmy::sweep

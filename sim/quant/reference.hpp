// Tensor-reference state (docs/recipes.md §5): the reference amax A each
// quantization call of a (layer, role) uses, under the policies
//
//   current      A = max|x| of the tensor being quantized;
//   periodic:D   sample-and-hold: A = max|x| sampled by the first call of
//                optimizer step 1, D+1, 2D+1, ... and held unchanged in
//                between (micro-batches of a step share the step's value);
//   delayed:L    A = max over the amaxes recorded on the last L optimizer
//                steps before this one (one record per step: the max over
//                that step's calls); no history yet: no tensor scale;
//   none         no tensor scale.
//
// With row outer scales (outer_scale = row) the reference is one amax per
// row of the operand, and periodic and delayed hold and record them row by
// row (the max over calls and ranks taken per row).
//
// The state is part of the training state: save() gives a flat
// key -> numbers map a checkpoint stores, and load() restores it so that a
// resumed run continues bit for bit. load(..., cold_restart = true)
// emulates the reference implementation, whose references start empty
// after a resume: a periodic reference then samples on its first call.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "formats/quant_core.hpp"
#include "sim/quant/recipe.hpp"

namespace exmy::sim::quant {

class ReferenceState {
 public:
  // The tensor reference of one call.
  struct Use {
    AmaxKind kind = AmaxKind::none;  // current: the call measures A itself
    double value = 0;                // A for AmaxKind::given
    std::vector<double> rows;        // ... per row, for a reference of row outer scales
  };

  // Called before quantizing, with the 1-based optimizer step. `rows`: the
  // call's rows when the operand has row outer scales (the reference is then
  // one amax per row, held row by row), else 0. Throws exmy::Error when a
  // held per-row reference has another number of rows.
  Use begin_call(const RefPolicy& p, int64_t step, int64_t rows = 0);
  // Called after quantizing with max|x| of the quantized tensor (for
  // `current` calls: the A the call measured) and, for row outer scales,
  // max|x| of each row. Periodic samples and delayed records are taken here.
  void end_call(const RefPolicy& p, int64_t step, double amax, const std::vector<double>* row_amax = nullptr);
  // True when end_call needs max|x| of a call that did not measure it.
  static bool needs_amax(const RefPolicy& p) { return p.kind == RefPolicy::Kind::delayed; }
  // True when the coming end_call reads its amax at all (a periodic sample,
  // a delayed record); between begin_call and end_call.
  bool takes_amax(const RefPolicy& p) const {
    return (p.kind == RefPolicy::Kind::periodic && sampling_) || p.kind == RefPolicy::Kind::delayed;
  }

  std::vector<double> save() const;
  void load(const std::vector<double>& v);  // throws exmy::Error when malformed

  // A reference frozen at `amax`: a periodic reference holding it as if
  // sampled at step 1 (an evaluation's weights measured once at load, a
  // calibrated activation scale). Under a policy that never samples again
  // in the steps it runs, every call uses `amax`.
  static ReferenceState frozen(double amax);
  // ... and one per row (row outer scales).
  static ReferenceState frozen_rows(std::vector<double> row_amax);
  // The reference this state gives the next call (of step `next_step`)
  // under a held policy p, frozen: periodic, the held sample; delayed, the
  // window's max (as the next training step would see it; no history: no
  // tensor scale). Throws exmy::Error when a periodic state holds no sample
  // or p is not periodic or delayed.
  ReferenceState frozen_at(const RefPolicy& p, int64_t next_step) const;

  // delayed: the max over the calls of the step in progress. A
  // data-parallel run combines it across ranks with max after each step's
  // micro-batches (every rank then records the same history entry).
  bool has_step_amax() const { return have_cur_; }
  double step_amax() const { return cur_max_; }
  void set_step_amax(double a) { cur_max_ = a; }
  // ... and per row (empty for a tensor reference): the same max, row by row.
  const std::vector<double>& step_row_amax() const { return cur_rows_; }
  void set_step_row_amax(std::vector<double> a) { cur_rows_ = std::move(a); }

  // Inspection (tests, statistics).
  bool has_held() const { return has_held_; }
  double held() const { return held_; }
  int64_t sampled_step() const { return sampled_step_; }
  const std::vector<double>& history() const { return history_; }
  const std::vector<double>& held_rows() const { return held_rows_; }
  const std::vector<std::vector<double>>& row_history() const { return row_history_; }
  bool operator==(const ReferenceState&) const = default;

 private:
  // periodic
  bool has_held_ = false;
  double held_ = 0;
  int64_t sampled_step_ = 0;
  bool sampling_ = false;  // between begin_call and end_call of a sampling call
  // delayed
  std::vector<double> history_;  // oldest first, at most L entries
  int64_t cur_step_ = 0;
  bool have_cur_ = false;
  double cur_max_ = 0;
  // row outer scales: the same, one entry per row (periodic: held_rows_;
  // delayed: row_history_, oldest first, and cur_rows_)
  std::vector<double> held_rows_;
  std::vector<std::vector<double>> row_history_;
  std::vector<double> cur_rows_;
};

// Flat representation a checkpoint stores: key "LAYER/SLOT" -> numbers.
using FlatReferenceState = std::map<std::string, std::vector<double>>;

// All references of a model, keyed by "LAYER/SLOT" where SLOT is a role name
// ("fprop-x", ...) or "dy" for the dY reference shared by dgrad-dy and
// wgrad-dy.
class ReferenceStore {
 public:
  ReferenceState& get(const std::string& key) { return states_[key]; }
  const std::map<std::string, ReferenceState>& states() const { return states_; }

  FlatReferenceState save() const;
  // Replaces the whole state with `flat` (every other reference starts
  // empty). With cold_restart the saved values are ignored: every reference
  // starts empty, as in the reference implementation after a resume.
  // States keep their addresses (linears hold pointers to them).
  void load(const FlatReferenceState& flat, bool cold_restart = false);
  // Every reference back to empty.
  void clear();

 private:
  std::map<std::string, ReferenceState> states_;
};

// The key of a (layer, role) reference.
std::string reference_key(const std::string& layer, Role role, bool shared_dy);

}  // namespace exmy::sim::quant

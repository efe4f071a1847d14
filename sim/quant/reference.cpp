#include "sim/quant/reference.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "formats/error.hpp"

namespace exmy::sim::quant {
namespace {

// max that propagates NaN (a NaN amax makes the reference NaN: t = 1).
double nan_max(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<double>::quiet_NaN();
  return std::max(a, b);
}

constexpr double kFormatVersion = 1;
constexpr double kRowsFormatVersion = 2;  // with per-row references

}  // namespace

ReferenceState::Use ReferenceState::begin_call(const RefPolicy& p, int64_t step, int64_t rows) {
  Use u;
  const size_t nr = static_cast<size_t>(rows);
  // A held per-row reference fits only an operand of its own rows.
  auto check_rows = [&](const std::vector<double>& held, const char* what) {
    if ((rows > 0) != !held.empty() || held.size() != nr)
      throw Error(std::string(what) + " holds " +
                  (held.empty() ? std::string("one tensor amax") : std::to_string(held.size()) + " row amaxes") +
                  ", but the operand has " +
                  (rows > 0 ? std::to_string(rows) + " rows with row outer scales" : std::string("a tensor scale")));
  };
  switch (p.kind) {
    case RefPolicy::Kind::none: u.kind = AmaxKind::none; return u;
    case RefPolicy::Kind::current: u.kind = AmaxKind::current; return u;
    case RefPolicy::Kind::periodic: {
      const bool schedule = (step - 1) % p.n == 0;
      sampling_ = !has_held_ || (schedule && sampled_step_ != step);
      if (sampling_) {
        u.kind = AmaxKind::current;
      } else {
        check_rows(held_rows_, "the periodic reference");
        u.kind = AmaxKind::given;
        u.value = held_;
        u.rows = held_rows_;
      }
      return u;
    }
    case RefPolicy::Kind::delayed: {
      if (!have_cur_ || cur_step_ != step) {
        if (have_cur_) {
          history_.push_back(cur_max_);
          if (!cur_rows_.empty()) row_history_.push_back(cur_rows_);
          if (static_cast<int64_t>(history_.size()) > p.n)
            history_.erase(history_.begin(), history_.end() - p.n);
          if (static_cast<int64_t>(row_history_.size()) > p.n)
            row_history_.erase(row_history_.begin(), row_history_.end() - p.n);
        }
        have_cur_ = true;
        cur_step_ = step;
        cur_max_ = 0;
        cur_rows_.assign(nr, 0.0);
      }
      // The window may have shrunk (a different L after a resume).
      const size_t n = std::min(history_.size(), static_cast<size_t>(p.n));
      if (n == 0) {
        u.kind = AmaxKind::none;
        return u;
      }
      double a = 0;
      for (size_t i = history_.size() - n; i < history_.size(); ++i) a = nan_max(a, history_[i]);
      u.kind = AmaxKind::given;
      u.value = a;
      if (rows > 0 || !row_history_.empty()) {
        if (row_history_.size() < n) check_rows({}, "the delayed reference");
        u.rows.assign(nr, 0.0);
        for (size_t i = row_history_.size() - n; i < row_history_.size(); ++i) {
          check_rows(row_history_[i], "the delayed reference");
          for (size_t r = 0; r < nr; ++r) u.rows[r] = nan_max(u.rows[r], row_history_[i][r]);
        }
      }
      return u;
    }
  }
  return u;
}

void ReferenceState::end_call(const RefPolicy& p, int64_t step, double amax, const std::vector<double>* row_amax) {
  if (p.kind == RefPolicy::Kind::periodic && sampling_) {
    has_held_ = true;
    held_ = amax;
    held_rows_ = row_amax ? *row_amax : std::vector<double>{};
    sampled_step_ = step;
    sampling_ = false;
  } else if (p.kind == RefPolicy::Kind::delayed) {
    cur_max_ = nan_max(cur_max_, amax);
    if (row_amax) {
      if (cur_rows_.size() != row_amax->size())
        throw Error("the delayed reference records " + std::to_string(cur_rows_.size()) + " rows, the call has " +
                    std::to_string(row_amax->size()));
      for (size_t r = 0; r < cur_rows_.size(); ++r) cur_rows_[r] = nan_max(cur_rows_[r], (*row_amax)[r]);
    }
  }
}

ReferenceState ReferenceState::frozen(double amax) {
  ReferenceState r;
  r.has_held_ = true;
  r.held_ = amax;
  r.sampled_step_ = 1;
  return r;
}

ReferenceState ReferenceState::frozen_rows(std::vector<double> row_amax) {
  double a = 0;
  for (const double v : row_amax) a = nan_max(a, v);
  ReferenceState r = frozen(a);
  r.held_rows_ = std::move(row_amax);
  return r;
}

ReferenceState ReferenceState::frozen_at(const RefPolicy& p, int64_t next_step) const {
  if (p.kind == RefPolicy::Kind::periodic) {
    if (!has_held_) throw Error("the periodic reference holds no sample");
    return held_rows_.empty() ? frozen(held_) : frozen_rows(held_rows_);
  }
  if (p.kind != RefPolicy::Kind::delayed) throw Error("a " + ref_policy_name(p) + " reference holds nothing");
  ReferenceState c = *this;
  const size_t rows = !cur_rows_.empty() ? cur_rows_.size() : row_history_.empty() ? 0 : row_history_.back().size();
  const Use u = c.begin_call(p, next_step, static_cast<int64_t>(rows));
  if (u.kind == AmaxKind::none) return frozen(std::numeric_limits<double>::quiet_NaN());
  return u.rows.empty() ? frozen(u.value) : frozen_rows(u.rows);
}

// Layout: version, has_held, held, sampled_step, have_cur, cur_step,
// cur_max, L, history[L]; version 2 (row outer scales) then adds
// R, held_rows[R], R', cur_rows[R'], H, and H times (R_i, row_history_i[R_i]).
std::vector<double> ReferenceState::save() const {
  const bool rows = !held_rows_.empty() || !cur_rows_.empty() || !row_history_.empty();
  std::vector<double> v = {rows ? kRowsFormatVersion : kFormatVersion,
                           has_held_ ? 1.0 : 0.0,
                           held_,
                           static_cast<double>(sampled_step_),
                           have_cur_ ? 1.0 : 0.0,
                           static_cast<double>(cur_step_),
                           cur_max_,
                           static_cast<double>(history_.size())};
  v.insert(v.end(), history_.begin(), history_.end());
  if (!rows) return v;
  auto put = [&v](const std::vector<double>& a) {
    v.push_back(static_cast<double>(a.size()));
    v.insert(v.end(), a.begin(), a.end());
  };
  put(held_rows_);
  put(cur_rows_);
  v.push_back(static_cast<double>(row_history_.size()));
  for (const auto& h : row_history_) put(h);
  return v;
}

void ReferenceState::load(const std::vector<double>& v) {
  const auto bad = [&] { return Error("malformed tensor-reference state (" + std::to_string(v.size()) + " numbers)"); };
  if (v.size() < 8 || (v[0] != kFormatVersion && v[0] != kRowsFormatVersion) || !(v[7] >= 0) ||
      v.size() < 8 + static_cast<size_t>(v[7]))
    throw bad();
  const size_t nh = static_cast<size_t>(v[7]);
  if (v[0] == kFormatVersion && v.size() != 8 + nh) throw bad();
  ReferenceState r;
  r.has_held_ = v[1] != 0;
  r.held_ = v[2];
  r.sampled_step_ = static_cast<int64_t>(v[3]);
  r.have_cur_ = v[4] != 0;
  r.cur_step_ = static_cast<int64_t>(v[5]);
  r.cur_max_ = v[6];
  r.history_.assign(v.begin() + 8, v.begin() + 8 + static_cast<std::ptrdiff_t>(nh));
  size_t at = 8 + nh;
  auto take = [&](std::vector<double>& a) {
    if (at >= v.size() || !(v[at] >= 0) || v[at] > static_cast<double>(v.size() - at - 1)) throw bad();
    const size_t n = static_cast<size_t>(v[at]);
    a.assign(v.begin() + static_cast<std::ptrdiff_t>(at + 1), v.begin() + static_cast<std::ptrdiff_t>(at + 1 + n));
    at += 1 + n;
  };
  if (v[0] == kRowsFormatVersion) {
    take(r.held_rows_);
    take(r.cur_rows_);
    if (at >= v.size() || !(v[at] >= 0) || v[at] > static_cast<double>(v.size() - at - 1)) throw bad();
    r.row_history_.resize(static_cast<size_t>(v[at++]));
    for (auto& h : r.row_history_) take(h);
    if (at != v.size()) throw bad();
  }
  *this = std::move(r);
}

FlatReferenceState ReferenceStore::save() const {
  FlatReferenceState flat;
  for (const auto& [k, s] : states_) flat[k] = s.save();
  return flat;
}

void ReferenceStore::load(const FlatReferenceState& flat, bool cold_restart) {
  // Parse everything first, so a malformed entry leaves the store unchanged.
  std::map<std::string, ReferenceState> loaded;
  if (!cold_restart) {
    for (const auto& [k, v] : flat) {
      try {
        loaded[k].load(v);
      } catch (const Error& e) {
        throw Error("tensor reference '" + k + "': " + e.what());
      }
    }
  }
  clear();
  for (auto& [k, s] : loaded) states_[k] = s;
}

void ReferenceStore::clear() {
  for (auto& [k, s] : states_) s = ReferenceState{};
}

std::string reference_key(const std::string& layer, Role role, bool shared_dy) {
  if (shared_dy && (role == Role::dgrad_dy || role == Role::wgrad_dy)) return layer + "/dy";
  return layer + "/" + std::string(role_name(role));
}

}  // namespace exmy::sim::quant

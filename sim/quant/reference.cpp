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

}  // namespace

ReferenceState::Use ReferenceState::begin_call(const RefPolicy& p, int64_t step) {
  Use u;
  switch (p.kind) {
    case RefPolicy::Kind::none: u.kind = AmaxKind::none; return u;
    case RefPolicy::Kind::current: u.kind = AmaxKind::current; return u;
    case RefPolicy::Kind::periodic: {
      const bool schedule = (step - 1) % p.n == 0;
      sampling_ = !has_held_ || (schedule && sampled_step_ != step);
      if (sampling_) {
        u.kind = AmaxKind::current;
      } else {
        u.kind = AmaxKind::given;
        u.value = held_;
      }
      return u;
    }
    case RefPolicy::Kind::delayed: {
      if (!have_cur_ || cur_step_ != step) {
        if (have_cur_) {
          history_.push_back(cur_max_);
          if (static_cast<int64_t>(history_.size()) > p.n)
            history_.erase(history_.begin(), history_.end() - p.n);
        }
        have_cur_ = true;
        cur_step_ = step;
        cur_max_ = 0;
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
      return u;
    }
  }
  return u;
}

void ReferenceState::end_call(const RefPolicy& p, int64_t step, double amax) {
  if (p.kind == RefPolicy::Kind::periodic && sampling_) {
    has_held_ = true;
    held_ = amax;
    sampled_step_ = step;
    sampling_ = false;
  } else if (p.kind == RefPolicy::Kind::delayed) {
    cur_max_ = nan_max(cur_max_, amax);
  }
}

ReferenceState ReferenceState::frozen(double amax) {
  ReferenceState r;
  r.has_held_ = true;
  r.held_ = amax;
  r.sampled_step_ = 1;
  return r;
}

std::vector<double> ReferenceState::save() const {
  std::vector<double> v = {kFormatVersion,
                           has_held_ ? 1.0 : 0.0,
                           held_,
                           static_cast<double>(sampled_step_),
                           have_cur_ ? 1.0 : 0.0,
                           static_cast<double>(cur_step_),
                           cur_max_,
                           static_cast<double>(history_.size())};
  v.insert(v.end(), history_.begin(), history_.end());
  return v;
}

void ReferenceState::load(const std::vector<double>& v) {
  if (v.size() < 8 || v[0] != kFormatVersion || v[7] < 0 || v.size() != 8 + static_cast<size_t>(v[7]))
    throw Error("malformed tensor-reference state (" + std::to_string(v.size()) + " numbers)");
  *this = ReferenceState{};
  has_held_ = v[1] != 0;
  held_ = v[2];
  sampled_step_ = static_cast<int64_t>(v[3]);
  have_cur_ = v[4] != 0;
  cur_step_ = static_cast<int64_t>(v[5]);
  cur_max_ = v[6];
  history_.assign(v.begin() + 8, v.end());
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

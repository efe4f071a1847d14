// The final-window train loss: the one figure called "train loss" at the end
// of a run (trainer summary, sweep console, summary.md/summary.csv). It is
// the mean of the training losses of the last W steps, W = max(1,
// round-half-up(steps / 10)) = max(1, (steps + 5) / 10) in integers: the last
// 10% of the run's steps (docs/training.md). The losses are those of every
// step (the trainer keeps them in its checkpoints and writes them to the
// run file's /step_loss), never only the logged rows.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <string>

namespace exmy::train {

inline int64_t final_window_steps(int64_t steps) { return std::max<int64_t>(1, (steps + 5) / 10); }

// `losses[i]` is the loss of step i + 1; the run has losses.size() steps.
// The mean of the last final_window_steps(losses.size()) of them, summed in
// step order in double; NaN for no steps.
inline double final_window_loss(std::span<const double> losses) {
  if (losses.empty()) return NAN;
  const size_t w = static_cast<size_t>(final_window_steps(static_cast<int64_t>(losses.size())));
  double s = 0;
  for (size_t i = losses.size() - w; i < losses.size(); ++i) s += losses[i];
  return s / static_cast<double>(w);
}

// The name every output gives the figure: "final-window train loss (last W steps)".
inline std::string final_window_label(int64_t steps) {
  return "final-window train loss (last " + std::to_string(final_window_steps(steps)) + " steps)";
}

}  // namespace exmy::train

// The host emulation of the layer kernels: the launches of
// models/layer_launches.hpp with sim::HostLaunch (threads one after another).
#include "models/cuda/layers_cuda.hpp"
#include "sim/parallel.hpp"

#define EXMY_LAUNCHER sim::HostLaunch
#define EXMY_SUFFIX emulated
#include "models/cuda/layers_define.hpp"

#include <algorithm>

namespace exmy::models {

TokenGroups group_tokens(const int32_t* tokens, int64_t N) {
  // A stable counting sort over the distinct tokens present.
  std::vector<int32_t> distinct(tokens, tokens + N);
  std::sort(distinct.begin(), distinct.end());
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
  TokenGroups g;
  g.rows = distinct;
  g.starts.assign(distinct.size() + 1, 0);
  for (int64_t n = 0; n < N; ++n) {
    const auto k = std::lower_bound(distinct.begin(), distinct.end(), tokens[n]) - distinct.begin();
    ++g.starts[static_cast<size_t>(k) + 1];
  }
  for (size_t k = 0; k < distinct.size(); ++k) g.starts[k + 1] += g.starts[k];
  std::vector<int64_t> next(g.starts.begin(), g.starts.end() - 1);
  g.positions.resize(static_cast<size_t>(N));
  for (int64_t n = 0; n < N; ++n) {
    const auto k = std::lower_bound(distinct.begin(), distinct.end(), tokens[n]) - distinct.begin();
    g.positions[static_cast<size_t>(next[static_cast<size_t>(k)]++)] = n;
  }
  return g;
}

}  // namespace exmy::models

// The kernels' weight-gradient partials follow the CPU's row blocks.
static_assert(exmy::models::kGradRowBlock == exmy::sim::kRowBlock);

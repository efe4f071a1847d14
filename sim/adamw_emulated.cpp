// The host emulation of the AdamW kernel (sim/adamw_update.hpp).
#include "sim/adamw_update.hpp"

namespace exmy::sim {

void adamw_update_emulated(float* p, float* m, float* v, const float* g, int64_t n, float dk, const AdamWScalars& s) {
  adamw_range_launches(HostLaunch{}, p, m, v, g, n, dk, s);
}

void adamw_bf16_update_emulated(float* p, float* master, float* m, float* v, const float* g, int64_t n, float dk,
                                const AdamWScalars& s) {
  adamw_bf16_range_launches(HostLaunch{}, p, master, m, v, g, n, dk, s);
}

void global_norm_partials_emulated(const float* g, int64_t n, double* part) {
  global_norm_launches(HostLaunch{}, g, n, part);
}

}  // namespace exmy::sim

// The AdamW kernel on a CUDA device: sim/adamw_update.hpp's launch with
// sim::DeviceLaunch (the arithmetic is adamw_update, shared with the CPU).
#include "sim/adamw_update.hpp"

namespace exmy::sim {

void adamw_update_cuda(float* p, float* m, float* v, const float* g, int64_t n, float dk, const AdamWScalars& s) {
  adamw_range_launches(DeviceLaunch{}, p, m, v, g, n, dk, s);
}

void adamw_bf16_update_cuda(float* p, float* master, float* m, float* v, const float* g, int64_t n, float dk,
                            const AdamWScalars& s) {
  adamw_bf16_range_launches(DeviceLaunch{}, p, master, m, v, g, n, dk, s);
}

void global_norm_partials_cuda(const float* g, int64_t n, double* part) {
  global_norm_launches(DeviceLaunch{}, g, n, part);
}

}  // namespace exmy::sim

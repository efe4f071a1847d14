// Defines the entry points of sim/quant/quant_launches.hpp for one
// launcher: included with EXMY_LAUNCHER and EXMY_SUFFIX defined.
#include "sim/quant/quant_launches.hpp"

#define EXMY_CAT2(a, b) a##_##b
#define EXMY_CAT(a, b) EXMY_CAT2(a, b)

namespace exmy::sim::quant {

void EXMY_CAT(transpose, EXMY_SUFFIX)(float* dst, const float* src, int64_t rows, int64_t cols) {
  transpose_launches(EXMY_LAUNCHER{}, dst, src, rows, cols);
}
void EXMY_CAT(round_bf16, EXMY_SUFFIX)(float* dst, const float* src, int64_t n) {
  round_bf16_launches(EXMY_LAUNCHER{}, dst, src, n);
}
void EXMY_CAT(add, EXMY_SUFFIX)(float* dst, const float* src, int64_t n) { add_launches(EXMY_LAUNCHER{}, dst, src, n); }
void EXMY_CAT(encode, EXMY_SUFFIX)(double* v, const EncodePlan& p, const void* codes, const void* scale_codes,
                                   int64_t rows, int64_t cols) {
  encode_launches(EXMY_LAUNCHER{}, v, p, codes, scale_codes, rows, cols);
}

}  // namespace exmy::sim::quant

#undef EXMY_CAT
#undef EXMY_CAT2

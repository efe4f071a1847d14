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
void EXMY_CAT(encode_bf16, EXMY_SUFFIX)(uint16_t* v, const EncodePlan& p, const void* codes, const void* scale_codes,
                                        int64_t rows, int64_t cols) {
  encode_bf16_launches(EXMY_LAUNCHER{}, v, p, codes, scale_codes, rows, cols);
}

void EXMY_CAT(decode_alpha, EXMY_SUFFIX)(float* alpha, const float* t_a, const float* t_b) {
  decode_alpha_launches(EXMY_LAUNCHER{}, alpha, t_a, t_b);
}

void EXMY_CAT(max_abs_bits, EXMY_SUFFIX)(uint32_t* part, const uint32_t* bits, int64_t n, int64_t parts) {
  max_abs_bits_launches(EXMY_LAUNCHER{}, part, bits, n, parts);
}
void EXMY_CAT(count_codes, EXMY_SUFFIX)(uint32_t* part, const uint8_t* codes, int code_bytes, int64_t blocks,
                                        int64_t parts) {
  count_codes_launches(EXMY_LAUNCHER{}, part, codes, code_bytes, blocks, parts);
}
void EXMY_CAT(sum_parts, EXMY_SUFFIX)(uint64_t* counts, const uint32_t* part, int64_t parts, int64_t bins) {
  sum_parts_launches(EXMY_LAUNCHER{}, counts, part, parts, bins);
}
void EXMY_CAT(gather_rows, EXMY_SUFFIX)(float* dst, const float* src, int64_t ld, int64_t M, int64_t R) {
  gather_rows_launches(EXMY_LAUNCHER{}, dst, src, ld, M, R);
}
void EXMY_CAT(gather_columns, EXMY_SUFFIX)(float* dst, const float* src, int64_t rows, int64_t cols, int64_t R) {
  gather_columns_launches(EXMY_LAUNCHER{}, dst, src, rows, cols, R);
}
void EXMY_CAT(gemm_sums, EXMY_SUFFIX)(GemmPartial* out, const float* got, const float* ref, int64_t R, int64_t N,
                                      GemmPartial* a, GemmPartial* b, TreeTail<GemmPartial>* tail) {
  gemm_sums_launches(EXMY_LAUNCHER{}, out, got, ref, R, N, a, b, tail);
}
void EXMY_CAT(count_blocks, EXMY_SUFFIX)(uint32_t* part, const float* x, int64_t rows, int64_t cols, int64_t br,
                                         int64_t bc, const uint8_t* codes, int code_bytes, int64_t parts) {
  count_blocks_launches(EXMY_LAUNCHER{}, part, x, rows, cols, br, bc, codes, code_bytes, parts);
}
void EXMY_CAT(finish_blocks, EXMY_SUFFIX)(uint64_t* counts, const uint32_t* part, int64_t parts, int64_t bins) {
  finish_blocks_launches(EXMY_LAUNCHER{}, counts, part, parts, bins);
}
StatsKernels EXMY_CAT(stats_kernels, EXMY_SUFFIX)() {
  return {EXMY_CAT(max_abs_bits, EXMY_SUFFIX), EXMY_CAT(count_codes, EXMY_SUFFIX),
          EXMY_CAT(sum_parts, EXMY_SUFFIX),
          EXMY_CAT(gather_rows, EXMY_SUFFIX),  EXMY_CAT(gather_columns, EXMY_SUFFIX),
          EXMY_CAT(gemm_sums, EXMY_SUFFIX),    EXMY_CAT(count_blocks, EXMY_SUFFIX),
          EXMY_CAT(finish_blocks, EXMY_SUFFIX)};
}

}  // namespace exmy::sim::quant

#undef EXMY_CAT
#undef EXMY_CAT2

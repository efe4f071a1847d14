// The `fp32` GEMM output model in BF16 (RuntimeOptions::fp32_gemm = bf16,
// docs/recipes.md §6): which formats bfloat16 holds, the encode_bf16 kernel
// against the exact encoding, and the GEMM of the encoded operands with the
// tensor scales applied to its result against the sgemm model within the
// budget derived below.
//
// Built twice (tests/quant/CMakeLists.txt): test_fp32_gemm_bf16_emulated
// (label "unit": the kernel's threads on the host, the GEMM sim::gemm's as
// the CPU and cuda-emulated run it) and, with CUDA, test_fp32_gemm_bf16
// (label "gpu": the kernel on the device and the GEMM through cuBLASLt's
// BF16 tensor cores with its epilogue alpha; SKIPPED without a device).
//
// The budget. Let e = q·s be an operand's encoded values (exact in BF16),
// t its tensor encode scale, x̂ = e/t·(1 + ε) its decoded values: one
// rounding in `exact` arithmetic, two (fl(e · fl(1/t))) in `fp32`, so
// |ε| <= γ_2 with γ_n = n·u/(1 - n·u), u = 2^-24, as long as x̂ is normal
// (the test checks that every non-zero x̂ is). Per output, with
// S = Σ_k |x̂_a x̂_b| and E = Σ_k |e_a e_b| / (t_a t_b) <= S / (1 - γ_2)^2:
//   sgemm: |C_s - Σ x̂_a x̂_b| <= γ_K S (Higham §3.1, any order, FMA or not);
//          |Σ x̂_a x̂_b - Σ e_a e_b / (t_a t_b)| <= γ_4 E;
//   bf16:  C_b = fl(α · acc), α = fl(fl(1/t_a) · fl(1/t_b)) = (1 + θ)/(t_a t_b)
//          with |θ| <= γ_3, |acc - Σ e_a e_b| <= γ'_K Σ |e_a e_b|, so
//          |C_b - Σ e_a e_b / (t_a t_b)| <= ((1 + γ'_K)(1 + γ_4) - 1) E,
// where γ' is γ with the accumulation's unit: u = 2^-24 for sim::gemm,
// 2^-23 for the tensor cores (they truncate: tests/sim/test_gemm_cuda.cpp).
// So |C_b - C_s| <= γ_K S + (γ_4 + (1 + γ'_K)(1 + γ_4) - 1) S / (1 - γ_2)^2,
// the same with row outer scales (α per output element, apply_outer_alpha).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "formats/quantize.hpp"
#include "formats/spec.hpp"
#include "sim/bf16.hpp"
#include "sim/gemm.hpp"
#include "sim/quant/grouped_gemm.hpp"
#include "sim/quant/quant_launches.hpp"
#include "sim/quant/quant_ops.hpp"
#include "tests/models/kernel_test.hpp"  // BufferOf, KERNEL, EXMY_REQUIRE_CUDA, expect_bits

#if !defined(EXMY_TEST_EMULATED)
#include "sim/cuda/gemm_cuda.hpp"
#endif

namespace exmy::sim::quant {
namespace {

using models::BufferOf;
using Vec = std::vector<float>;

QuantSpec spec_of(const char* elem, const char* scale, int br, int bc) {
  QuantSpec s;
  s.elem = parse_format(elem);
  if (*scale) {
    s.scale = parse_format(scale);
    s.block_rows = br;
    s.block_cols = bc;
    s.scale_target = 448;
  }
  s.amax_kind = AmaxKind::current;
  return s;
}

TEST(Fp32GemmBf16, WhichFormatsBfloat16Holds) {
  struct Case {
    const char *elem, *scale;
    bool held;
  };
  for (const Case c : {
           // at most 8 significant bits in every product, and in range
           Case{"e2m1", "ue4m3", true}, Case{"e2m1", "ue5m3", true}, Case{"e4m3", "ue4m3", true},
           Case{"e4m3", "ue5m3", true}, Case{"e5m2", "ue5m3", true}, Case{"e2m1", "e4m3", true},
           Case{"e4m3", "", true}, Case{"e5m2", "", true}, Case{"bf16", "", true},
           // UE8M0: 6 · 2^127 overflows bfloat16; E4M3's 2^-9 · 2^-127 lies below its subnormals
           Case{"e2m1", "ue8m0", false}, Case{"e4m3", "ue8m0", false},
           // 9 or more significant bits: (2^5 - 1)(2^4 - 1) = 465 needs 9
           Case{"e3m4", "ue5m3", false}, Case{"fp16", "", false}, Case{"fp32", "", false},
           Case{"bf16", "ue5m3", false}}) {
    SCOPED_TRACE(std::string(c.elem) + " / " + c.scale);
    EXPECT_EQ(bf16_holds_encoded(spec_of(c.elem, c.scale, 1, 16)), c.held);
    EXPECT_EQ(bf16_holds_encoded(spec_of(c.elem, c.scale, 1, 16)), c.held);  // (the cached answer)
  }
}

// Normal data with every 97th element times 40 (blocks of spread scales).
Vec data(int64_t rows, int64_t cols, uint32_t seed, float scale = 1.0f) {
  Vec x = models::randn(static_cast<size_t>(rows * cols), seed, scale);
  for (size_t i = 0; i < x.size(); i += 97) x[i] *= 40.0f;
  return x;
}

struct Quantized {
  Vec dq;
  std::vector<uint8_t> codes, scale_codes;
  QuantInfo info;
};

Quantized run_quantize(const QuantSpec& q, const Vec& x, int64_t rows, int64_t cols) {
  Quantized r;
  r.dq.resize(x.size());
  r.codes.resize(x.size() * static_cast<size_t>(q.elem.code_bytes()));
  r.scale_codes.resize(static_cast<size_t>(std::max<int64_t>(1, block_count(q, rows, cols))) * 2);
  r.info = quantize(q, x.data(), rows, cols, QuantOutput{r.dq.data(), r.codes.data(), r.scale_codes.data(), nullptr});
  return r;
}

// encode_bf16 of the kernel (on the device: its copies) for q's operand.
std::vector<uint16_t> encode_kernel(const QuantSpec& q, const Quantized& r, int64_t rows, int64_t cols) {
  BufferOf<uint8_t> codes(r.codes), scodes(r.scale_codes);
  BufferOf<uint16_t> v(std::vector<uint16_t>(static_cast<size_t>(rows * cols), 0xdead));
  KERNEL(encode_bf16)(v.ptr(), encode_plan(q), codes.ptr(), q.scale ? scodes.ptr() : nullptr, rows, cols);
  return v.get();
}

TEST(Fp32GemmBf16, EncodeBf16IsTheExactEncoding) {
  EXMY_REQUIRE_CUDA();
  struct Case {
    const char *elem, *scale;
    int br, bc;
    int64_t rows, cols;
  };
  for (const Case c : {Case{"e2m1", "ue4m3", 1, 16, 37, 45}, Case{"e2m1", "ue5m3", 16, 16, 40, 48},
                       Case{"e4m3", "ue4m3", 1, 32, 9, 70}, Case{"e4m3", "", 1, 1, 13, 21},
                       Case{"e2m1", "e4m3", 16, 1, 33, 20}}) {
    SCOPED_TRACE(std::string(c.elem) + " / " + c.scale + " " + std::to_string(c.br) + "x" + std::to_string(c.bc));
    const QuantSpec q = spec_of(c.elem, c.scale, c.br, c.bc);
    ASSERT_TRUE(bf16_holds_encoded(q));
    Vec x = data(c.rows, c.cols, 11);
    x[3] = 0.0f, x[4] = -0.0f;
    const Quantized r = run_quantize(q, x, c.rows, c.cols);
    std::vector<double> enc(x.size());
    encode_operand(enc.data(), q, r.codes.data(), q.scale ? r.scale_codes.data() : nullptr, c.rows, c.cols);
    const std::vector<uint16_t> got = encode_kernel(q, r, c.rows, c.cols);
    int64_t nonzero = 0;
    for (size_t i = 0; i < enc.size(); ++i) {
      const float f = static_cast<float>(enc[i]);
      ASSERT_EQ(static_cast<double>(f), enc[i]) << i;
      ASSERT_EQ(models::bits(f) & 0xffffu, 0u) << i << ": " << enc[i] << " is not a bfloat16";
      ASSERT_EQ(got[i], static_cast<uint16_t>(models::bits(f) >> 16)) << i << ": " << enc[i];
      nonzero += enc[i] != 0;
    }
    EXPECT_GT(nonzero, static_cast<int64_t>(enc.size()) / 2);
  }
}

#if defined(EXMY_TEST_EMULATED)
// The CPU's encoding (value tables, rows in parallel: cpu_quant_ops, which
// `train.fp32_gemm = bf16` runs on the CPU) gives the device kernel's bits.
TEST(Fp32GemmBf16, CpuEncodeBf16GivesTheKernelsBits) {
  for (const auto& [elem, scale, br, bc] : {std::tuple{"e2m1", "ue4m3", 1, 16}, std::tuple{"e2m1", "ue5m3", 16, 16},
                                           std::tuple{"e4m3", "ue4m3", 1, 32}, std::tuple{"e5m2", "", 1, 1},
                                           std::tuple{"e2m1", "e4m3", 16, 1}}) {
    SCOPED_TRACE(std::string(elem) + " / " + scale);
    const QuantSpec q = spec_of(elem, scale, br, bc);
    const int64_t rows = 300, cols = 272;  // (enough for the rows to run in parallel)
    Vec x = data(rows, cols, 5);
    x[7] = 0.0f, x[8] = -0.0f;
    const Quantized r = run_quantize(q, x, rows, cols);
    std::vector<uint16_t> cpu(x.size(), 0xdead);
    cpu_quant_ops().encode_bf16(cpu.data(), q, r.codes.data(), q.scale ? r.scale_codes.data() : nullptr, rows, cols);
    const std::vector<uint16_t> kernel = encode_kernel(q, r, rows, cols);
    for (size_t i = 0; i < cpu.size(); ++i) ASSERT_EQ(cpu[i], kernel[i]) << i;
  }
}
#endif

double gamma(double n, double u) { return n * u / (1 - n * u); }

// C_b (M,N) of the GEMM in BF16 under test: sim::gemm's on the host, the
// tensor cores' with cuBLASLt's epilogue alpha on the device.
Vec gemm_bf16_under_test(const std::vector<uint16_t>& A, const std::vector<uint16_t>& B, int64_t M, int64_t N,
                         int64_t K, float alpha) {
#if defined(EXMY_TEST_EMULATED)
  Vec C(static_cast<size_t>(M * N));
  gemm_bf16_host(C.data(), A.data(), B.data(), M, N, K, alpha);
  return C;
#else
  BufferOf<uint16_t> a(A), b(B);
  BufferOf<float> c(Vec(static_cast<size_t>(M * N), -1234.5f));
  CudaGemm g;
  g.run(c.ptr(), N, a.ptr(), K, Op::N, b.ptr(), K, Op::T, M, N, K, false, GemmOperands::bf16, alpha);
  return c.get();
#endif
}

// The same GEMM with its alpha made from the two tensor scales where the
// GEMM runs (decode_alpha; on the device cuBLASLt reads it in device
// pointer mode), as QuantOps::gemm_bf16_scaled runs it. Also checks that
// alpha equals tensor_decode_alpha's bit for bit.
Vec gemm_bf16_scaled_under_test(const std::vector<uint16_t>& A, const std::vector<uint16_t>& B, int64_t M, int64_t N,
                                int64_t K, float t_a, float t_b) {
  BufferOf<float> ta(Vec{t_a}), tb(Vec{t_b}), alpha(Vec{-1.0f});
  KERNEL(decode_alpha)(alpha.ptr(), ta.ptr(), tb.ptr());
  EXPECT_EQ(models::bits(alpha.get()[0]), models::bits(tensor_decode_alpha(t_a, t_b)));
#if defined(EXMY_TEST_EMULATED)
  return gemm_bf16_under_test(A, B, M, N, K, alpha.get()[0]);
#else
  BufferOf<uint16_t> a(A), b(B);
  BufferOf<float> c(Vec(static_cast<size_t>(M * N), -1234.5f));
  CudaGemm g;
  g.run_device_alpha(c.ptr(), N, a.ptr(), K, Op::N, b.ptr(), K, Op::T, M, N, K, GemmOperands::bf16, alpha.ptr());
  return c.get();
#endif
}

TEST(Fp32GemmBf16, WithinItsBudgetOfTheSgemmModel) {
  EXMY_REQUIRE_CUDA();
  const double u = std::ldexp(1.0, -24), u_acc = models::kOnDevice ? std::ldexp(1.0, -23) : u;
  struct Case {
    int64_t M, N, K;
    bool rows_a, fp32_arith;
  };
  for (const Case c : {Case{37, 45, 200, false, true}, Case{64, 48, 1024, false, false}, Case{5, 7, 16, false, true},
                       Case{40, 33, 256, true, true}}) {
    SCOPED_TRACE(std::to_string(c.M) + "x" + std::to_string(c.N) + "x" + std::to_string(c.K) +
                 (c.rows_a ? " row scales" : "") + (c.fp32_arith ? " fp32 arith" : " exact arith"));
    QuantSpec qa = spec_of("e2m1", "ue4m3", 1, 16), qb = spec_of("e2m1", "ue4m3", 16, 16);
    if (c.fp32_arith) qa.arith = qb.arith = Arith::fp32;
    if (c.rows_a) qa.outer = OuterScale::row;
    const Vec x = data(c.M, c.K, 21), w = data(c.N, c.K, 22, 0.05f);
    const Quantized a = run_quantize(qa, x, c.M, c.K), b = run_quantize(qb, w, c.N, c.K);
    for (const Vec* dq : {&a.dq, &b.dq})
      for (const float v : *dq) ASSERT_TRUE(v == 0 || std::fabs(v) >= 0x1p-126f) << v << " (the budget assumes normal x̂)";

    Vec sg(static_cast<size_t>(c.M * c.N));
    gemm(sg.data(), c.N, a.dq.data(), c.K, Op::N, b.dq.data(), c.K, Op::T, c.M, c.N, c.K, false);
    const std::vector<uint16_t> ea = encode_kernel(qa, a, c.M, c.K), eb = encode_kernel(qb, b, c.N, c.K);
    const bool rows = !a.info.row_t.empty();
    Vec got = rows ? gemm_bf16_under_test(ea, eb, c.M, c.N, c.K, 1.0f)
                   : gemm_bf16_scaled_under_test(ea, eb, c.M, c.N, c.K, a.info.t, b.info.t);
    if (rows) apply_outer_alpha(got.data(), c.M, c.N, a.info.t, a.info.row_t.data(), b.info.t, nullptr);
    if (!rows) {  // the host's alpha gives the same bits where the GEMM is sim::gemm's
      const Vec host = gemm_bf16_under_test(ea, eb, c.M, c.N, c.K, tensor_decode_alpha(a.info.t, b.info.t));
      if (!models::kOnDevice) {
        EXPECT_EQ(0, std::memcmp(host.data(), got.data(), sizeof(float) * got.size()));
      }
    }
    // The same GEMM without its tensor scales (alpha = 1): far outside the
    // budget, which therefore sees a scale applied wrongly.
    const Vec unscaled = gemm_bf16_under_test(ea, eb, c.M, c.N, c.K, 1.0f);

    const double g_k = gamma(static_cast<double>(c.K), u), g4 = gamma(4, u), g2 = gamma(2, u);
    const double factor = g_k + (g4 + (1 + gamma(static_cast<double>(c.K), u_acc)) * (1 + g4) - 1) / ((1 - g2) * (1 - g2));
    double worst = 0;
    int64_t differ = 0, outside_unscaled = 0, nonzero = 0;
    for (int64_t i = 0; i < c.M; ++i)
      for (int64_t j = 0; j < c.N; ++j) {
        double S = 0;
        for (int64_t k = 0; k < c.K; ++k)
          S += std::fabs(static_cast<double>(a.dq[i * c.K + k]) * b.dq[j * c.K + k]);
        const size_t at = static_cast<size_t>(i * c.N + j);
        const double err = std::fabs(static_cast<double>(got[at]) - sg[at]), budget = factor * S;
        worst = std::max(worst, budget > 0 ? err / budget : err);
        ASSERT_LE(err, budget) << "C[" << i << "," << j << "]: bf16 " << got[at] << ", sgemm " << sg[at];
        differ += models::bits(got[at]) != models::bits(sg[at]);
        outside_unscaled += std::fabs(static_cast<double>(unscaled[at]) - sg[at]) > budget;
        nonzero += sg[at] != 0;
      }
    std::printf("  largest error %.3g of its budget; %lld of %lld outputs differ from sgemm in some bit\n", worst,
                static_cast<long long>(differ), static_cast<long long>(c.M * c.N));
    EXPECT_GT(nonzero, c.M * c.N / 4);
    EXPECT_EQ(outside_unscaled, nonzero);
  }
}

}  // namespace
}  // namespace exmy::sim::quant

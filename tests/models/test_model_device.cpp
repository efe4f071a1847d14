// The whole model on a device backend (models/backend.hpp) against the same
// model on the CPU: forward (loss, per-token losses, logits) and backward
// (every parameter's gradient), over two steps with different batches (so
// the backend's scratch and uploads are reused), for the fp32 policy, the
// bf16 policy with BF16 activations, and block recompute.
//
// Built twice (tests/models/CMakeLists.txt, exmy_kernel_test):
// - test_model_device_emulated (label "unit"): the emulated device backend
//   (the kernels' launches run on the host) with the CPU's linears. Every
//   kernel's emulation equals its CPU twin bit for bit, and the linears are
//   the CPU's, so the model must equal the CPU model bit for bit.
// - test_model_device (label "gpu", CUDA builds): the CUDA backend with the
//   device linears (cuBLASLt). There the GEMMs' accumulation order and the
//   device's exp/log differ from the CPU (each within the budget its own
//   test derives: tests/sim/test_linear_cuda.cpp, tests/models/
//   test_layers_cuda.cpp, test_ssd_cuda.cpp, test_attention_cuda.cpp), and
//   those differences pass through every layer, so the whole model is held
//   to a tolerance, not a derived bound: the mean loss within 1e-5
//   relative, each per-token loss within 1e-4 absolute, and each
//   parameter's gradient within 1e-3 of that parameter's gradient norm
//   (about 2^-10: at proxy-tiny's K <= 64 and 5 layers, the per-GEMM budget
//   is below 2^-17 relative to sum |a b|, so this leaves two orders of
//   magnitude for the propagation; FP4 recipes are not compared here).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "models/backend.hpp"
#include "models/config.hpp"
#include "models/nemotron_h.hpp"
#include "sim/linear.hpp"

#if defined(EXMY_TEST_EMULATED)
#define EXMY_REQUIRE_CUDA() \
  do {                      \
  } while (0)
#else
#include "models/cuda/backend_cuda.hpp"
#include "sim/cuda/gemm_cuda.hpp"
#include "sim/cuda/linear_cuda.hpp"
#include "tests/require_cuda.hpp"
#endif

namespace exmy::models {
namespace {

#if defined(EXMY_TEST_EMULATED)
constexpr bool kExact = true;
#else
constexpr bool kExact = false;
#endif

std::vector<int32_t> random_tokens(int64_t n, int64_t vocab, uint32_t seed) {
  std::mt19937 g(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = static_cast<int32_t>(g() % static_cast<uint32_t>(vocab));
  return t;
}

// The device side of a comparison: its backend and a linear factory that
// works on the backend's memory.
struct Device {
  std::unique_ptr<Backend<float>> be;
#if !defined(EXMY_TEST_EMULATED)
  std::unique_ptr<sim::CudaGemm> gemm;
#endif
  std::unique_ptr<sim::LinearFactory<float>> factory;
  explicit Device(const std::string& policy) {
#if defined(EXMY_TEST_EMULATED)
    be = make_emulated_device_backend();
    factory = sim::make_linear_factory<float>(policy);  // host memory: the CPU's linears
#else
    be = make_cuda_backend(0);
    gemm = std::make_unique<sim::CudaGemm>();
    factory = sim::make_cuda_linear_factory(policy, *gemm);
#endif
  }
};

std::vector<float> to_host(NemotronH<float>& m, const float* p, size_t n) {
  std::vector<float> v(n);
  m.backend().memory().to_host(v.data(), p, n * sizeof(float));
  return v;
}

void expect_close(const std::vector<float>& got, const std::vector<float>& want, double tol_abs,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int bad = 0;
  for (size_t i = 0; i < want.size() && bad < 5; ++i) {
    const bool ok = kExact ? std::memcmp(&got[i], &want[i], sizeof(float)) == 0
                           : std::fabs(static_cast<double>(got[i]) - want[i]) <= tol_abs;
    if (!ok) {
      ADD_FAILURE() << what << " element " << i << ": device " << got[i] << ", CPU " << want[i];
      ++bad;
    }
  }
}

struct Case {
  const char* policy;
  bool bf16_act, recompute;
  int64_t B, T;
};

void compare(const Case& k) {
  NemotronHConfig c = preset_config("proxy-tiny");  // M-*M-: every mixer; chunk 8, so T = 20 ends mid-chunk
  auto cpu_factory = sim::make_linear_factory<float>(k.policy);
  NemotronH<float> cpu(c, *cpu_factory);
  Device dev(k.policy);
  NemotronH<float> gpu(c, *dev.factory, *dev.be);
  for (NemotronH<float>* m : {&cpu, &gpu}) {
    m->set_bf16_activations(k.bf16_act);
    m->set_recompute(k.recompute);
    m->init_weights(7);
  }
  const auto& views = cpu.arena().layout().views();
  const size_t P = cpu.arena().params().size();
  // The initial weights, made on the host and copied over.
  {
    const auto w = to_host(gpu, gpu.arena().params().data(), P);
    ASSERT_EQ(std::memcmp(w.data(), cpu.arena().params().data(), P * sizeof(float)), 0);
  }
  const int64_t N = k.B * k.T, V = c.vocab_size;
  for (int step = 0; step < 2; ++step) {
    const std::string what = std::string(k.policy) + (k.bf16_act ? " bf16-act" : "") +
                             (k.recompute ? " recompute" : "") + " step " + std::to_string(step);
    const auto tokens = random_tokens(N, V, 10 + step);
    auto targets = random_tokens(N, V, 20 + step);
    targets[3] = -1;  // an ignored position
    double loss[2];
    int i = 0;
    for (NemotronH<float>* m : {&cpu, &gpu}) {
      m->arena().zero_grad();
      loss[i++] = m->forward(tokens.data(), targets.data(), k.B, k.T);
      m->backward();
    }
    if (kExact) {
      EXPECT_EQ(std::memcmp(&loss[0], &loss[1], sizeof(double)), 0) << what << ": " << loss[1] << " vs " << loss[0];
    } else {
      EXPECT_NEAR(loss[1], loss[0], 1e-5 * loss[0]) << what;
    }
    EXPECT_EQ(gpu.counted_targets(), cpu.counted_targets()) << what;
    for (int64_t n = 0; n < N; ++n) {
      const double a = gpu.token_losses()[static_cast<size_t>(n)], b = cpu.token_losses()[static_cast<size_t>(n)];
      if (kExact) ASSERT_EQ(std::memcmp(&a, &b, sizeof a), 0) << what << " token " << n;
      else ASSERT_NEAR(a, b, 1e-4) << what << " token " << n;
    }
    const std::vector<float> want_logits(cpu.logits(), cpu.logits() + N * V);
    expect_close(to_host(gpu, gpu.logits(), static_cast<size_t>(N * V)), want_logits, 1e-4, what + " logits");
    const auto g = to_host(gpu, gpu.arena().grads().data(), P);
    const float* want = cpu.arena().grads().data();
    for (const sim::ParamView& v : views) {
      std::vector<float> a(g.begin() + v.offset, g.begin() + v.offset + v.numel);
      std::vector<float> b(want + v.offset, want + v.offset + v.numel);
      double norm = 0;
      for (float x : b) norm += static_cast<double>(x) * x;
      expect_close(a, b, 1e-3 * std::sqrt(norm), what + " gradient of " + v.name);
    }
  }
}

TEST(ModelDevice, Fp32) {
  EXMY_REQUIRE_CUDA();
  compare({"fp32", false, false, 2, 20});
}

TEST(ModelDevice, Bf16PolicyWithBf16Activations) {
  EXMY_REQUIRE_CUDA();
  compare({"bf16", true, false, 2, 20});
}

TEST(ModelDevice, BlockRecompute) {
  EXMY_REQUIRE_CUDA();
  compare({"fp32", false, true, 3, 9});
}

#if defined(EXMY_TEST_EMULATED)
// The emulated memory says it is not the host's, so the model's staged
// copies (initial weights) run in CI; the backend names itself.
TEST(ModelDevice, EmulatedBackendIsADeviceToTheModel) {
  auto be = make_emulated_device_backend();
  EXPECT_FALSE(be->memory().on_host());
  EXPECT_STREQ(be->name(), "cuda-emulated");
  EXPECT_TRUE(cpu_backend<float>().memory().on_host());
}
#endif

}  // namespace
}  // namespace exmy::models

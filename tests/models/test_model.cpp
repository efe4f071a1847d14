// The assembled model: a whole-model gradient check, bit-identity across
// thread counts, and the precision policies.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <bit>
#include <random>

#include "formats/error.hpp"
#include "models/nemotron_h.hpp"
#include "sim/parallel.hpp"
#include "tests/models/grad_check.hpp"

namespace exmy::models {
namespace {

std::vector<int32_t> random_tokens(int64_t n, int64_t vocab, uint32_t seed) {
  std::mt19937 g(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = static_cast<int32_t>(g() % static_cast<uint32_t>(vocab));
  return t;
}

TEST(Model, ArenaHoldsEveryParameterOnce) {
  const NemotronHConfig c = preset_config("proxy-tiny");
  auto f = sim::make_linear_factory<float>("fp32");
  NemotronH<float> m(c, *f);
  EXPECT_EQ(m.arena().layout().num_params(), parameter_count(c));
  // 2 Mamba (in, out) + 1 attention (q, k, v, o) + 2 MLP (up, down) + LM head.
  ASSERT_EQ(m.linears().size(), 2u * 2 + 4 + 2 * 2 + 1);
  EXPECT_EQ(m.linears()[0]->info().name, "layers.0.mixer.in_proj");
  EXPECT_EQ(m.linears()[0]->info().kind, sim::LinearKind::mamba_in_proj);
  EXPECT_EQ(m.linears()[4]->info().name, "layers.2.mixer.q_proj");
  EXPECT_EQ(m.linears()[4]->info().layer, 2);
  EXPECT_EQ(m.linears().back()->info().name, "lm_head");
  EXPECT_EQ(m.linears().back()->info().layer, 5);
  for (const auto& v : m.arena().layout().views()) {
    const bool no_decay = v.name.find("norm") != std::string::npos || v.name.ends_with("A_log") ||
                          v.name.ends_with(".D") || v.name.ends_with("dt_bias") || v.name.ends_with(".bias");
    EXPECT_EQ(v.weight_decay, !no_decay) << v.name;
  }
}

// linear_infos (the memory plan's view of the linears, read from the
// layout) names every linear the model makes, with its block, kind and
// shape, for presets with every block type and GQA.
TEST(Model, LinearInfosAreTheModelsLinears) {
  for (const char* preset : {"proxy-tiny", "proxy-10m", "proxy-125m"}) {
    SCOPED_TRACE(preset);
    const NemotronHConfig c = preset_config(preset);
    auto f = sim::make_linear_factory<float>("fp32");
    NemotronH<float> m(c, *f);
    std::vector<sim::LinearInfo> made;
    for (const auto& l : m.linears()) made.push_back(l->info());
    std::vector<sim::LinearInfo> read = linear_infos(c);
    const auto by_name = [](const sim::LinearInfo& a, const sim::LinearInfo& b) { return a.name < b.name; };
    std::sort(made.begin(), made.end(), by_name);
    std::sort(read.begin(), read.end(), by_name);
    ASSERT_EQ(read.size(), made.size());
    for (size_t i = 0; i < made.size(); ++i) {
      EXPECT_EQ(read[i].name, made[i].name);
      EXPECT_EQ(read[i].layer, made[i].layer) << made[i].name;
      EXPECT_EQ(read[i].kind, made[i].kind) << made[i].name;
      EXPECT_EQ(read[i].in_features, made[i].in_features) << made[i].name;
      EXPECT_EQ(read[i].out_features, made[i].out_features) << made[i].name;
    }
  }
}

TEST(GradCheck, WholeModelProxyTiny) {
  // Double precision, bigger-than-default weights so every path carries a
  // visible gradient; T = 20 spans three SSD chunks of 8 (the last partial).
  NemotronHConfig c = preset_config("proxy-tiny");
  apply_override(c, "initializer_range", "0.3");
  auto f = sim::make_linear_factory<double>("fp32");
  NemotronH<double> m(c, *f);
  m.init_weights(7);
  const int64_t B = 2, T = 20;
  const auto tokens = random_tokens(B * T, c.vocab_size, 1);
  auto targets = random_tokens(B * T, c.vocab_size, 2);
  targets[5] = -100;  // an ignored position
  m.arena().zero_grad();
  const double loss = m.forward(tokens.data(), targets.data(), B, T);
  EXPECT_GT(loss, 0);
  EXPECT_EQ(m.counted_targets(), B * T - 1);
  m.backward();
  auto params = m.arena().params();
  auto grads = m.arena().grads();
  std::mt19937 g(3);
  int checked_views = 0;
  for (const auto& v : m.arena().layout().views()) {
    // Up to 6 elements per parameter tensor, at random positions.
    std::vector<double> x, a;
    std::vector<int64_t> where;
    for (int k = 0; k < std::min<int64_t>(6, v.numel); ++k) {
      int64_t i;
      do i = v.offset + static_cast<int64_t>(g() % static_cast<uint32_t>(v.numel));
      while (std::find(where.begin(), where.end(), i) != where.end());  // distinct positions
      where.push_back(i);
      x.push_back(params[static_cast<size_t>(i)]);
      a.push_back(grads[static_cast<size_t>(i)]);
    }
    auto loss_fn = [&] {
      for (size_t k = 0; k < where.size(); ++k) params[static_cast<size_t>(where[k])] = x[k];
      return m.forward(tokens.data(), targets.data(), B, T);
    };
    // Tensors whose sampled gradients are all ~0 (e.g. embedding rows of
    // tokens that never occur) cannot be checked by ratio; they still must
    // agree with the difference quotient.
    double scale = 0;
    for (double e : a) scale = std::max(scale, std::abs(e));
    if (scale < 1e-8) {
      for (size_t k = 0; k < where.size(); ++k) {
        const double keep = x[k];
        x[k] = keep + 1e-5;
        const double lp = loss_fn();
        x[k] = keep - 1e-5;
        const double lm = loss_fn();
        x[k] = keep;
        EXPECT_NEAR((lp - lm) / 2e-5, a[k], 1e-9) << v.name;
      }
      loss_fn();
      continue;
    }
    test::check_grad(v.name, x, a, loss_fn, 6, 1e-5, 1e-5);
    loss_fn();
    ++checked_views;
  }
  EXPECT_GE(checked_views, static_cast<int>(m.arena().layout().views().size()) - 3);
}

template <class T>
bool same_bits(const T* a, const T* b, size_t n, size_t* where) {
  for (size_t i = 0; i < n; ++i)
    if (std::memcmp(a + i, b + i, sizeof(T)) != 0) return *where = i, false;
  return true;
}

void thread_independence(NemotronHConfig c, const std::string& policy, int64_t B, int64_t T) {
  auto f = sim::make_linear_factory<float>(policy);
  const auto tokens = random_tokens(B * T, c.vocab_size, 5);
  const auto targets = random_tokens(B * T, c.vocab_size, 6);
  std::vector<float> logits[2], grads[2];
  double loss[2];
  const int saved = omp_get_max_threads();
  // Every loop threaded, however small.
  const int64_t saved_min = sim::parallel_min_work();
  sim::parallel_min_work() = 0;
  for (int r = 0; r < 2; ++r) {
    omp_set_num_threads(r + 1);
    NemotronH<float> m(c, *f);
    m.set_bf16_activations(policy == "bf16");  // the trainer's bf16 policy rounds activations too
    m.init_weights(11);
    m.arena().zero_grad();
    loss[r] = m.forward(tokens.data(), targets.data(), B, T);
    m.backward();
    logits[r].assign(m.logits(), m.logits() + B * T * c.vocab_size);
    grads[r].assign(m.arena().grads().begin(), m.arena().grads().end());
  }
  omp_set_num_threads(saved);
  sim::parallel_min_work() = saved_min;
  EXPECT_EQ(std::bit_cast<uint64_t>(loss[0]), std::bit_cast<uint64_t>(loss[1]));
  size_t i = 0;
  EXPECT_TRUE(same_bits(logits[0].data(), logits[1].data(), logits[0].size(), &i)) << "logit " << i;
  EXPECT_TRUE(same_bits(grads[0].data(), grads[1].data(), grads[0].size(), &i)) << "gradient element " << i;
  double gsum = 0;
  for (float x : grads[0]) gsum += std::abs(x);
  EXPECT_GT(gsum, 0);
}

TEST(Model, BitIdenticalWithOneOrTwoThreads) { thread_independence(preset_config("proxy-tiny"), "fp32", 3, 20); }

TEST(Model, BitIdenticalWithOneOrTwoThreadsMultiTileBf16) {
  // Big enough that GEMMs span several tiles and every parallel loop has
  // many blocks.
  NemotronHConfig c = preset_config("proxy-tiny");
  apply_override(c, "hidden_size", "96");
  apply_override(c, "intermediate_size", "320");
  apply_override(c, "vocab_size", "300");
  apply_override(c, "chunk_size", "32");
  thread_independence(c, "bf16", 2, 150);
}

TEST(Model, Bf16PolicyStaysCloseToFp32) {
  const NemotronHConfig c = preset_config("proxy-tiny");
  const auto tokens = random_tokens(40, c.vocab_size, 8), targets = random_tokens(40, c.vocab_size, 9);
  double loss[2];
  for (int r = 0; r < 2; ++r) {
    auto f = sim::make_linear_factory<float>(r ? "bf16" : "fp32");
    NemotronH<float> m(c, *f);
    m.init_weights(1);
    loss[r] = m.forward(tokens.data(), targets.data(), 2, 20);
  }
  EXPECT_NE(loss[0], loss[1]);
  EXPECT_NEAR(loss[0], loss[1], 1e-2 * loss[0]);
  EXPECT_NEAR(loss[0], std::log(64.0), 0.1);  // near-uniform predictions at init
}

TEST(Model, Bf16ActivationsAreBf16AndTrackFp32) {
  // With BF16 activations every logit (the LM head's output) holds a BF16
  // value; the loss stays near the FP32 one, and the residual stream in
  // FP32 (residual_in_fp32) changes the result.
  NemotronHConfig c = preset_config("proxy-tiny");
  const auto tokens = random_tokens(40, c.vocab_size, 8), targets = random_tokens(40, c.vocab_size, 9);
  auto fp32 = sim::make_linear_factory<float>("fp32");
  auto bf16 = sim::make_linear_factory<float>("bf16");
  NemotronH<float> ref(c, *fp32);
  ref.init_weights(1);
  const double l32 = ref.forward(tokens.data(), targets.data(), 2, 20);
  NemotronH<float> m(c, *bf16);
  m.set_bf16_activations(true);
  m.init_weights(1);
  const double l16 = m.forward(tokens.data(), targets.data(), 2, 20);
  for (int64_t i = 0; i < 40 * c.vocab_size; ++i) ASSERT_EQ(sim::round_bf16(m.logits()[i]), m.logits()[i]) << i;
  EXPECT_NEAR(l16, l32, 2e-2 * l32);
  m.arena().zero_grad();
  m.backward();
  double g = 0;
  for (float x : m.arena().grads()) g += std::fabs(x);
  EXPECT_GT(g, 0);
  apply_override(c, "residual_in_fp32", "true");
  NemotronH<float> r(c, *bf16);
  r.set_bf16_activations(true);
  r.init_weights(1);
  EXPECT_NE(r.forward(tokens.data(), targets.data(), 2, 20), l16);
}

TEST(Model, InitIsDeterministicAndHfLike) {
  const NemotronHConfig c = preset_config("proxy-tiny");
  auto f = sim::make_linear_factory<double>("fp32");
  NemotronH<double> a(c, *f), b(c, *f);
  a.init_weights(42);
  b.init_weights(42);
  EXPECT_TRUE(std::equal(a.arena().params().begin(), a.arena().params().end(), b.arena().params().begin()));
  EXPECT_EQ(a.arena().param("layers.0.mixer.A_log")[3], std::log(4.0));
  EXPECT_EQ(a.arena().param("layers.0.mixer.D")[0], 1.0);
  EXPECT_EQ(a.arena().param("norm_f.weight")[0], 1.0);
  // dt_bias = softplus^-1(dt) with dt in [time_step_min, time_step_max].
  for (int h = 0; h < 4; ++h) {
    const double dt = std::log1p(std::exp(a.arena().param("layers.0.mixer.dt_bias")[h]));
    EXPECT_GE(dt, c.time_step_min * (1 - 1e-12));
    EXPECT_LE(dt, c.time_step_max * (1 + 1e-12));
  }
}

TEST(Model, AnyMixOfBlockTypesRuns) {
  // Patterns without one or two of the block types (their scratch buffers
  // are then empty), and a sequence shorter than one SSD chunk.
  for (const char* pattern : {"M", "*", "-", "MM**--", "*-M", "-M-"}) {
    NemotronHConfig c = preset_config("proxy-tiny");
    apply_override(c, "hybrid_override_pattern", pattern);
    auto f = sim::make_linear_factory<float>("fp32");
    NemotronH<float> m(c, *f);
    m.init_weights(2);
    for (int64_t T : {5, 19}) {
      const auto tokens = random_tokens(2 * T, c.vocab_size, 3), targets = random_tokens(2 * T, c.vocab_size, 4);
      m.arena().zero_grad();
      const double loss = m.forward(tokens.data(), targets.data(), 2, T);
      m.backward();
      EXPECT_TRUE(std::isfinite(loss)) << pattern;
      double g = 0;
      for (float x : m.arena().grads()) g += std::abs(x);
      EXPECT_TRUE(std::isfinite(g) && g > 0) << pattern;
    }
  }
}

TEST(Model, RejectsTokensOutsideTheVocabulary) {
  const NemotronHConfig c = preset_config("proxy-tiny");
  auto f = sim::make_linear_factory<float>("fp32");
  NemotronH<float> m(c, *f);
  std::vector<int32_t> tok = {1, 2, 64};
  try {
    m.forward(tok.data(), nullptr, 1, 3);
    FAIL();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "token 64 at position 2 is outside the vocabulary [0, 64)");
  }
  EXPECT_THROW(NemotronH<float>(preset_config("proxy-tiny"), *f).backward(), Error);
}

}  // namespace
}  // namespace exmy::models

// Agreement with HF transformers' NemotronHForCausalLM on the committed
// fixture tests/reference/nemotron_h_tiny (made by
// tests/reference/make_nemotron_h_fixture.py: a random 5-block model, M-*M-,
// batch 2 x 20 tokens, three SSD chunks per sequence, run by PyTorch in
// float32 on the CPU through HF's torch fallback of the Mamba-2 kernels).
//
// Tolerances. The reference is itself FP32: every logit carries the rounding
// of its own evaluation order (PyTorch's einsums and GEMMs vs exmy's chunked
// GEMMs). A logit here is the end of ~20 dependent stages (norms, GEMMs with
// at most 64-term sums, the SSD's chunk products) over O(1) values; each
// stage adds at most a few units of 2^-24 relative error in practice
// (sqrt(K) u for K-term sums), so the two FP32 results, and exmy's FP64
// result, agree to ~1e-6 of the logit scale. The bounds below are 1e-5 of
// the largest |logit| (and 1e-4 of the largest gradient of each tensor,
// whose backward sums are longer): ten times that noise, and far below any
// real mistake (a wrong sign, index or missing term moves results by O(1e-2)
// or more).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "models/hf_checkpoint.hpp"
#include "models/safetensors.hpp"

namespace exmy::models {
namespace {

const std::string kDir = EXMY_FIXTURE_DIR;

template <class Real>
void check_against_hf(const char* label) {
  ASSERT_TRUE(std::filesystem::exists(kDir + "/fixture.safetensors"))
      << "missing fixture " << kDir << " (run tests/reference/make_nemotron_h_fixture.py)";
  const NemotronHConfig cfg = resolve_config(kDir);
  SafetensorsReader fx(kDir + "/fixture.safetensors");
  const auto ids64 = fx.read<int64_t>("input_ids");
  const auto tgt64 = fx.read<int64_t>("targets");
  const auto& shape = fx.get("input_ids").shape;
  ASSERT_EQ(shape.size(), 2u);
  const int64_t B = shape[0], T = shape[1], V = cfg.vocab_size;
  const std::vector<int32_t> ids(ids64.begin(), ids64.end()), tgt(tgt64.begin(), tgt64.end());
  const auto hf_logits = fx.read<double>("logits");
  const double hf_loss = fx.read<double>("loss").at(0);

  auto factory = sim::make_linear_factory<Real>("fp32");
  NemotronH<Real> m(cfg, *factory);
  load_hf_weights(m, kDir);
  m.arena().zero_grad();
  const double loss = m.forward(ids.data(), tgt.data(), B, T);
  m.backward();

  double scale = 0, worst = 0;
  for (int64_t i = 0; i < B * T * V; ++i) {
    scale = std::max(scale, std::abs(hf_logits[i]));
    worst = std::max(worst, std::abs(static_cast<double>(m.logits()[i]) - hf_logits[i]));
  }
  ASSERT_GT(scale, 1.0);  // not vacuous
  std::printf("[%s] logits: max |exmy - HF| = %.3g (max |logit| %.3g); loss exmy %.9f HF %.9f\n", label, worst, scale,
              loss, hf_loss);
  EXPECT_LE(worst, 1e-5 * scale);
  EXPECT_NEAR(loss, hf_loss, 1e-5 * hf_loss);

  double worst_rel = 0;
  std::string worst_name;
  int compared = 0;
  for (const auto& v : m.arena().layout().views()) {
    const StTensorInfo* t = fx.find("grad.backbone." + v.name);
    if (!t) t = fx.find("grad.model." + v.name);
    if (!t) t = fx.find("grad." + v.name);
    ASSERT_NE(t, nullptr) << "fixture lacks the gradient of " << v.name;
    std::vector<double> g(static_cast<size_t>(t->numel()));
    fx.read(*t, g.data());
    ASSERT_EQ(static_cast<int64_t>(g.size()), v.numel);
    const Real* mine = m.arena().grad(v.name);
    double gs = 0, err = 0;
    for (size_t i = 0; i < g.size(); ++i) {
      gs = std::max(gs, std::abs(g[i]));
      err = std::max(err, std::abs(static_cast<double>(mine[i]) - g[i]));
    }
    if (gs == 0) continue;  // e.g. embedding rows of absent tokens are zero in both
    EXPECT_LE(err, 1e-4 * gs) << v.name;
    if (err / gs > worst_rel) worst_rel = err / gs, worst_name = v.name;
    ++compared;
  }
  std::printf("[%s] gradients of %d tensors: worst relative error %.3g (%s)\n", label, compared, worst_rel,
              worst_name.c_str());
  EXPECT_EQ(compared, static_cast<int>(m.arena().layout().views().size()));
}

TEST(HfReference, Fp32ModelMatchesTransformers) { check_against_hf<float>("fp32"); }
TEST(HfReference, Fp64ModelMatchesTransformers) { check_against_hf<double>("fp64"); }

}  // namespace
}  // namespace exmy::models

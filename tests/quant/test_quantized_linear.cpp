// The quantized linear layer: operands along the right axis, shared weight
// tiles, the stream derivation, statistics and captures, gradient bias, and
// every recipe training the tiny proxy model.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <set>
#include <tuple>

#include "formats/error.hpp"
#include "formats/spec.hpp"
#include "models/nemotron_h.hpp"
#include "sim/gemm.hpp"
#include "sim/parallel.hpp"
#include "sim/quant/grouped_gemm.hpp"
#include "sim/quant/quantized_linear.hpp"
#include "sim/quant/stream.hpp"

namespace exmy::sim::quant {
namespace {

std::vector<float> randn(int64_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(g);
  return v;
}

std::vector<float> transposed(const std::vector<float>& a, int64_t rows, int64_t cols) {
  std::vector<float> t(a.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) t[static_cast<size_t>(c * rows + r)] = a[static_cast<size_t>(r * cols + c)];
  return t;
}

std::vector<float> decoded(const QuantSpec& spec, const std::vector<float>& x, int64_t rows, int64_t cols,
                           QuantStats* st = nullptr, std::vector<uint8_t>* scodes = nullptr) {
  std::vector<float> y(x.size());
  QuantOutput out;
  out.values = y.data();
  out.stats = st;
  if (scodes) {
    scodes->resize(static_cast<size_t>(std::max<int64_t>(1, block_count(spec, rows, cols))) * 2);
    out.scale_codes = scodes->data();
  }
  quantize(spec, x.data(), rows, cols, out);
  return y;
}

void expect_bits_equal(const float* a, const float* b, int64_t n, const char* what) {
  for (int64_t i = 0; i < n; ++i)
    ASSERT_EQ(std::bit_cast<uint32_t>(a[i]), std::bit_cast<uint32_t>(b[i])) << what << " [" << i << "] " << a[i] << " vs " << b[i];
}

LinearInfo info_of(const std::string& name, int layer, LinearKind kind, int64_t in, int64_t out) {
  LinearInfo i;
  i.name = name;
  i.layer = layer;
  i.kind = kind;
  i.in_features = in;
  i.out_features = out;
  return i;
}

Recipe recipe_text(const std::string& body) { return parse_recipe("[recipe]\nlayers = all\n" + body, "test", "test"); }

// One linear of a recipe, with its runtime.
struct Rig {
  std::shared_ptr<QuantRuntime> rt;
  std::unique_ptr<RecipeLinearFactory> factory;
  std::unique_ptr<Linear<float>> lin;
  Rig(const Recipe& r, const LinearInfo& info, RuntimeOptions opt = {}) {
    rt = std::make_shared<QuantRuntime>(opt);
    factory = std::make_unique<RecipeLinearFactory>(r, 4, rt);
    lin = factory->make(info);
  }
};

struct Tensors {
  int64_t T, in, out;
  std::vector<float> X, W, dY, Y, dX, dW;
  Tensors(int64_t T_, int64_t in_, int64_t out_, uint32_t seed) : T(T_), in(in_), out(out_) {
    X = randn(T * in, seed);
    W = randn(out * in, seed + 1, 0.1f);
    dY = randn(T * out, seed + 2, 1e-3f);
    Y.assign(static_cast<size_t>(T * out), 0);
    dX.assign(static_cast<size_t>(T * in), 0);
    dW.assign(static_cast<size_t>(out * in), 0);
  }
  void run(Linear<float>& l) {
    l.forward(Y.data(), X.data(), W.data(), T);
    l.backward(dX.data(), dW.data(), dY.data(), X.data(), W.data(), T);
  }
};

const char* kExact = "[all]\nelem = fp32\nscale = none\nreference = none\n";

TEST(QuantizedLinear, ExactFormatsEqualThePlainLinear) {
  const LinearInfo info = info_of("layers.0.mixer.up_proj", 0, LinearKind::mlp_up, 40, 56);
  MemoryStatsSink sink;
  // All rows: a sample of rows is a GEMM of another shape, whose FP32 sums
  // may be ordered differently (differences at FP32 rounding level).
  RuntimeOptions opt;
  opt.gemm_stats_rows = 0;
  Rig q(recipe_text(kExact), info, opt);
  ASSERT_NE(dynamic_cast<QuantizedLinear*>(q.lin.get()), nullptr);
  q.rt->set_stats_sink(&sink);
  q.rt->begin({1, 0, true, false});
  auto plain = make_linear_factory<float>("fp32")->make(info);
  Tensors a(48, 40, 56, 1), b(48, 40, 56, 1);
  a.run(*q.lin);
  b.run(*plain);
  expect_bits_equal(a.Y.data(), b.Y.data(), a.T * a.out, "Y");
  expect_bits_equal(a.dX.data(), b.dX.data(), a.T * a.in, "dX");
  expect_bits_equal(a.dW.data(), b.dW.data(), a.out * a.in, "dW");
  for (Gemm g : {Gemm::fprop, Gemm::dgrad, Gemm::wgrad}) {
    const auto* r = sink.find(info.name, g);
    ASSERT_NE(r, nullptr);
    EXPECT_EQ(r->stats.sum_err2, 0.0);
    EXPECT_EQ(r->stats.gain(), 1.0);
    EXPECT_EQ(r->stats.magnitude_bias(), 0.0);
  }
  for (Role role : kRoles) {
    const auto* r = sink.find(info.name, role);
    ASSERT_NE(r, nullptr);
    EXPECT_EQ(r->stats.q.sum_sq_err, 0.0);
    EXPECT_GT(r->stats.q.sum_sq, 0.0);
  }
}

// current and periodic (held) references: amax from the reference and
// measured apart
const char* kMixedForDefer = R"(
[all]
elem = e2m1
scale = ue5m3
block = 1x32
[fprop-w]
reference = periodic:10
[wgrad-x]
reference = none
)";

// compare_gemm's sums in their stated order (sim/quant/stats_items.hpp):
// segments of 256 outputs along each compared row, each summed from 0.0 in
// column order, then the pairwise tree over the segments in row-major
// order, written here from the definition; the data make a plain
// row-by-row sum differ, so no other order passes.
TEST(QuantizedLinear, GemmStatsSumInTheirStatedOrder) {
  struct Six {
    double v[6] = {0, 0, 0, 0, 0, 0};
  };
  const auto plus = [](const Six& a, const Six& b) {
    Six s;
    for (int k = 0; k < 6; ++k) s.v[k] = a.v[k] + b.v[k];
    return s;
  };
  std::function<Six(const std::vector<Six>&, size_t, size_t)> tree = [&](const std::vector<Six>& p, size_t lo,
                                                                        size_t hi) {
    if (hi - lo == 1) return p[lo];
    size_t h = 1;
    while (h * 2 < hi - lo) h *= 2;
    return plus(tree(p, lo, lo + h), tree(p, lo + h, hi));
  };
  int differs = 0;
  for (const auto& [M, N, R] : {std::tuple<int64_t, int64_t, int64_t>{10, 700, 4}, {7, 256, 7}, {50, 2000, 13},
                                {3, 5, 3}}) {
    const auto yhat = randn(M * N, static_cast<uint32_t>(M + N), 1.0f);
    auto y = randn(R * N, static_cast<uint32_t>(M + N + 1), 1.0f);
    const std::vector<int64_t> rows = sample_rows(M, R);
    for (size_t i = 0; i < y.size(); i += 3) y[i] *= 1e5f;
    std::vector<Six> seg;
    Six plain;
    for (int64_t i = 0; i < R; ++i) {
      const int64_t r = rows.empty() ? i : rows[static_cast<size_t>(i)];
      for (int64_t c0 = 0; c0 < N; c0 += 256) {
        Six s;
        for (int64_t j = c0; j < std::min(N, c0 + 256); ++j) {
          const double a = yhat[static_cast<size_t>(r * N + j)], b = y[static_cast<size_t>(i * N + j)], e = a - b;
          const double t[6] = {b * b, a * a, a * b, e * e, std::fabs(b), std::fabs(a)};
          for (int k = 0; k < 6; ++k) s.v[k] += t[k], plain.v[k] += t[k];
        }
        seg.push_back(s);
      }
    }
    const Six want = tree(seg, 0, seg.size());
    const GemmStats g = compare_gemm(yhat.data(), y.data(), M, N, rows);
    EXPECT_EQ(g.count, static_cast<uint64_t>(R * N));
    EXPECT_EQ(g.rows, static_cast<uint64_t>(R));
    const double got[6] = {g.sum_y2, g.sum_yhat2, g.sum_y_yhat, g.sum_err2, g.sum_abs_y, g.sum_abs_yhat};
    for (int k = 0; k < 6; ++k) {
      EXPECT_EQ(std::bit_cast<uint64_t>(got[k]), std::bit_cast<uint64_t>(want.v[k])) << M << "x" << N << " sum " << k;
      differs += std::bit_cast<uint64_t>(plain.v[k]) != std::bit_cast<uint64_t>(want.v[k]);
    }
  }
  EXPECT_GT(differs, 3);  // the data tell the orders apart
}

// A recipe whose roles all differ, so a mix-up of roles or axes shows.
const char* kMixed = R"(
[all]
elem = e2m1
scale = ue4m3
block = 1x16
arith = fp32
reference = current
[fprop-w]
scale_target = 300
[dgrad-dy]
round = stochastic-fastest
[dgrad-w]
scale_target = 200
[wgrad-dy]
round = stochastic-fast
sr_bits = 5
[wgrad-x]
elem = e3m2
)";

TEST(QuantizedLinear, OperandsAreQuantizedAlongTheirGemmsK) {
  const int64_t T = 40, in = 48, out = 36;
  const LinearInfo info = info_of("layers.2.mixer.down_proj", 2, LinearKind::mlp_down, in, out);
  MemoryCaptureSink cap;
  RuntimeOptions opt;
  opt.seed = 99;
  Rig q(recipe_text(kMixed), info, opt);
  q.rt->set_capture_sink(&cap);
  q.rt->begin({5, 1, false, true});
  Tensors a(T, in, out, 7);
  a.run(*q.lin);

  // The captured operand of each role is the GEMM's K-major view.
  struct Want {
    Role role;
    std::vector<float> x;
    int64_t rows, cols;
  };
  const std::vector<Want> want = {{Role::fprop_x, a.X, T, in},
                                  {Role::fprop_w, a.W, out, in},
                                  {Role::dgrad_dy, a.dY, T, out},
                                  {Role::dgrad_w, transposed(a.W, out, in), in, out},
                                  {Role::wgrad_dy, transposed(a.dY, T, out), out, T},
                                  {Role::wgrad_x, transposed(a.X, T, in), in, T}};
  std::vector<std::vector<float>> dq(kNumRoles);
  for (const auto& w : want) {
    SCOPED_TRACE(std::string(role_name(w.role)));
    const auto* c = cap.find(info.name, w.role);
    ASSERT_NE(c, nullptr);
    EXPECT_EQ(c->rows, w.rows);
    EXPECT_EQ(c->cols, w.cols);
    EXPECT_EQ(c->x, w.x);
    EXPECT_EQ(c->spec.seed, 99u);
    EXPECT_EQ(c->spec.stream, quant_stream(5, 1, 2, LinearKind::mlp_down, w.role));
    EXPECT_EQ(c->key.gemm, role_gemm(w.role));
    dq[role_index(w.role)] = decoded(c->spec, w.x, w.rows, w.cols);
  }
  // The axis matters: quantizing W^T is not the transpose of quantizing W.
  const auto* cw = cap.find(info.name, Role::dgrad_w);
  EXPECT_NE(transposed(decoded(cw->spec, a.W, out, in), out, in), dq[role_index(Role::dgrad_w)]);

  // The GEMM outputs are the GEMMs of exactly those decoded operands.
  std::vector<float> Y(T * out), dX(T * in), dW(out * in);
  gemm(Y.data(), out, dq[0].data(), in, Op::N, dq[1].data(), in, Op::T, T, out, in, false);
  gemm(dX.data(), in, dq[2].data(), out, Op::N, dq[3].data(), out, Op::T, T, in, out, false);
  gemm(dW.data(), in, dq[4].data(), T, Op::N, dq[5].data(), T, Op::T, out, in, T, false);
  expect_bits_equal(a.Y.data(), Y.data(), T * out, "Y");
  expect_bits_equal(a.dX.data(), dX.data(), T * in, "dX");
  expect_bits_equal(a.dW.data(), dW.data(), out * in, "dW");
}

// RuntimeOptions::fp32_gemm = bf16 on recipes whose formats bfloat16 holds
// (E2M1 with UE4M3 scales; row outer scales on the activations and
// gradients, the RHT on the wgrad operands, stochastic rounding on dY):
// each GEMM is the BF16 GEMM of the captured operands' encodings with the
// tensor scales applied to its result (gemm_bf16_host, then
// apply_outer_alpha with row scales), bit for bit; and mxfp4, whose UE8M0
// scales bfloat16 does not hold, keeps the sgemm model's bits.
TEST(QuantizedLinear, Fp32ModelInBf16MultipliesTheEncodedOperands) {
  const int64_t T = 48, in = 64, out = 32;
  for (const char* name : {"nvfp4-row-scaled", "te-nvfp4", "mxfp4"}) {
    SCOPED_TRACE(name);
    const LinearInfo info = info_of("layers.0.mixer.up_proj", 0, LinearKind::mlp_up, in, out);
    MemoryCaptureSink cap;
    RuntimeOptions opt;
    opt.seed = 5;
    opt.fp32_gemm = Fp32Gemm::bf16;
    Rig q(load_recipe(name), info, opt);
    ASSERT_NE(dynamic_cast<QuantizedLinear*>(q.lin.get()), nullptr);
    q.rt->set_capture_sink(&cap);
    q.rt->begin({2, 0, false, true});
    Tensors a(T, in, out, 3);
    a.run(*q.lin);
    const bool held = std::string(name) != "mxfp4";

    struct Side {
      std::vector<float> dq;
      std::vector<uint16_t> enc;
      QuantInfo info;
    };
    const auto side = [&](Role role, const std::vector<float>& x, int64_t rows, int64_t cols) {
      const auto* c = cap.find(info.name, role);
      EXPECT_NE(c, nullptr);
      Side s;
      s.dq.resize(x.size());
      std::vector<uint8_t> codes(x.size()), scodes(static_cast<size_t>(block_count(c->spec, rows, cols)));
      s.info = quantize(c->spec, x.data(), rows, cols, QuantOutput{s.dq.data(), codes.data(), scodes.data(), nullptr});
      EXPECT_EQ(bf16_holds_encoded(c->spec), held);
      if (held) {
        s.enc.resize(x.size());
        QuantSpec plain = c->spec;
        plain.rht = false;  // codes of the transformed operand
        cpu_quant_ops().encode_bf16(s.enc.data(), plain, codes.data(), scodes.data(), rows, cols);
      }
      return s;
    };
    const auto product = [&](const Side& A, const Side& B, int64_t M, int64_t N, int64_t K) {
      std::vector<float> C(static_cast<size_t>(M * N));
      if (!held) {
        gemm(C.data(), N, A.dq.data(), K, Op::N, B.dq.data(), K, Op::T, M, N, K, false);
      } else if (!A.info.row_t.empty() || !B.info.row_t.empty()) {
        gemm_bf16_host(C.data(), A.enc.data(), B.enc.data(), M, N, K, 1.0f);
        apply_outer_alpha(C.data(), M, N, A.info.t, A.info.row_t.empty() ? nullptr : A.info.row_t.data(), B.info.t,
                          B.info.row_t.empty() ? nullptr : B.info.row_t.data());
      } else {
        gemm_bf16_host(C.data(), A.enc.data(), B.enc.data(), M, N, K, tensor_decode_alpha(A.info.t, B.info.t));
      }
      return C;
    };
    const Side x = side(Role::fprop_x, a.X, T, in), w = side(Role::fprop_w, a.W, out, in);
    const Side dy = side(Role::dgrad_dy, a.dY, T, out), wt = side(Role::dgrad_w, transposed(a.W, out, in), in, out);
    const Side dyt = side(Role::wgrad_dy, transposed(a.dY, T, out), out, T);
    const Side xt = side(Role::wgrad_x, transposed(a.X, T, in), in, T);
    const auto Y = product(x, w, T, out, in), dX = product(dy, wt, T, in, out), dW = product(dyt, xt, out, in, T);
    expect_bits_equal(a.Y.data(), Y.data(), T * out, "Y");
    expect_bits_equal(a.dX.data(), dX.data(), T * in, "dX");
    expect_bits_equal(a.dW.data(), dW.data(), out * in, "dW");
    if (held) {  // (not the sgemm model's bits)
      std::vector<float> sg(static_cast<size_t>(T * out));
      gemm(sg.data(), out, x.dq.data(), in, Op::N, w.dq.data(), in, Op::T, T, out, in, false);
      EXPECT_NE(0, std::memcmp(sg.data(), a.Y.data(), sizeof(float) * sg.size()));
    }
  }
}

// The CPU's ops, recording what each quantization call said of its info
// (QuantOps::quantize's need_info: a device's calls with false need not
// wait) and the deferred checks.
class NeedsRecorder final : public QuantOps {
 public:
  std::vector<bool> needs;
  int checks = 0;
  QuantOps& cpu = cpu_quant_ops();
  const char* name() const override { return "recorder"; }
  Memory& memory() override { return cpu.memory(); }
  void transpose(float* d, const float* s, int64_t r, int64_t c) override { cpu.transpose(d, s, r, c); }
  void round_bf16(float* d, const float* s, int64_t n) override { cpu.round_bf16(d, s, n); }
  void rht(const QuantSpec& q, float* x, int64_t r, int64_t c) override { cpu.rht(q, x, r, c); }
  QuantInfo quantize(const QuantSpec& q, const float* x, int64_t r, int64_t c, const QuantOutput& o, bool need_info,
                     float* t_out) override {
    needs.push_back(need_info);
    return cpu.quantize(q, x, r, c, o, need_info, t_out);
  }
  QuantInfo quantize_recorded(const QuantSpec& q, const float* x, int64_t r, int64_t c, const QuantOutput& o,
                              bool need_info, float* t_out, OperandStats& os) override {
    needs.push_back(need_info);
    return cpu.quantize_recorded(q, x, r, c, o, need_info, t_out, os);
  }
  void check_deferred() override { ++checks; }
  // As a device's ops say (their results filled at once all the same).
  bool defer = false;
  int collects = 0;
  bool defers_stats() const override { return defer; }
  void collect_stats() override { ++collects; }
  void gemm(float* C, int64_t ldc, const float* A, int64_t lda, Op oa, const float* B, int64_t ldb, Op ob, int64_t M,
            int64_t N, int64_t K) override {
    cpu.gemm(C, ldc, A, lda, oa, B, ldb, ob, M, N, K);
  }
  void add(float* d, const float* s, int64_t n) override { cpu.add(d, s, n); }
  void encode(double* v, const QuantSpec& q, const void* c, const void* sc, int64_t r, int64_t k) override {
    cpu.encode(v, q, c, sc, r, k);
  }
  void grouped_gemm(float* C, const double* A, const double* B, int64_t M, int64_t N, int64_t K, const GemmModel& m,
                    float alpha) override {
    cpu.grouped_gemm(C, A, B, M, N, K, m, alpha);
  }
  void grouped_gemm_scaled(float* C, const double* A, const double* B, int64_t M, int64_t N, int64_t K,
                           const GemmModel& m, const float* ta, const float* tb) override {
    cpu.grouped_gemm_scaled(C, A, B, M, N, K, m, ta, tb);
  }
  void outer_alpha(float* C, int64_t M, int64_t N, float ta, const float* ra, float tb, const float* rb) override {
    cpu.outer_alpha(C, M, N, ta, ra, tb, rb);
  }
  void encode_bf16(uint16_t* v, const QuantSpec& q, const void* c, const void* sc, int64_t r, int64_t k) override {
    cpu.encode_bf16(v, q, c, sc, r, k);
  }
  void gemm_bf16(float* C, const uint16_t* A, const uint16_t* B, int64_t M, int64_t N, int64_t K, float a) override {
    cpu.gemm_bf16(C, A, B, M, N, K, a);
  }
  void gemm_bf16_scaled(float* C, const uint16_t* A, const uint16_t* B, int64_t M, int64_t N, int64_t K,
                        const float* ta, const float* tb) override {
    cpu.gemm_bf16_scaled(C, A, B, M, N, K, ta, tb);
  }
  double abs_max(const float* x, int64_t n) override { return cpu.abs_max(x, n); }
  void add_block_ranges(const float* x, int64_t r, int64_t c, int br, int bc, OperandStats& st) override {
    cpu.add_block_ranges(x, r, c, br, bc, st);
  }
  void add_scale_codes(const ScaleCodeTable& t, const void* c, int64_t b, OperandStats& st) override {
    cpu.add_scale_codes(t, c, b, st);
  }
  void gather_rows(float* d, const float* s, int64_t ld, int64_t M, int64_t R) override { cpu.gather_rows(d, s, ld, M, R); }
  void gather_columns(float* d, const float* s, int64_t r, int64_t c, int64_t R) override {
    cpu.gather_columns(d, s, r, c, R);
  }
};

// Which quantization calls read their info (QuantOps::quantize's
// need_info): with the sgemm GEMM, the BF16 GEMM or the grouped model
// (which read t where the ops run) and current references none do (a
// device's calls then need not wait), nor do statistics (which take the
// call's amax and scale with its statistics, quantize_recorded); the BF16
// GEMM of row-scaled operands (the tensor scales applied to the result
// from the host) and a periodic reference's sampling step do; begin()
// checks what was deferred.
TEST(QuantizedLinear, CallsSayWhetherTheyReadTheirInfo) {
  struct Case {
    const char* recipe;
    Fp32Gemm fp32_gemm;
    bool stats;
    int64_t step;
    bool need;
  };
  for (const Case c : {Case{"nvfp4-no-rht-all", Fp32Gemm::sgemm, false, 1, false},
                       Case{"nvfp4-no-rht-all", Fp32Gemm::sgemm, true, 1, false},
                       Case{"nvfp4-no-rht-all-grouped", Fp32Gemm::sgemm, true, 1, false},
                       Case{"nvfp4-no-rht-all", Fp32Gemm::bf16, false, 1, false},  // (t read where the ops run)
                       // every GEMM has a row-scaled operand: both operands' scales are read on the host
                       // (nvfp4-row-scaled's weights, per tensor, too)
                       Case{"nvfp4-row-scaled", Fp32Gemm::bf16, false, 1, true},
                       Case{"nvfp4-no-rht-all-grouped", Fp32Gemm::sgemm, false, 1, false},  // (t read where the ops run)
                       // samples at step 1 (but wgrad-dy: the dY reference it shares with dgrad-dy holds
                       // what dgrad-dy sampled)
                       Case{"ue5m3-b16-fp32gemm", Fp32Gemm::sgemm, false, 1, true},
                       Case{"mxfp4", Fp32Gemm::bf16, false, 1, false}}) {          // (no BF16: UE8M0)
    SCOPED_TRACE(std::string(c.recipe) + (c.fp32_gemm == Fp32Gemm::bf16 ? " bf16" : "") + (c.stats ? " stats" : ""));
    const LinearInfo info = info_of("layers.0.mixer.up_proj", 0, LinearKind::mlp_up, 32, 48);
    RuntimeOptions opt;
    opt.fp32_gemm = c.fp32_gemm;
    Rig q(load_recipe(c.recipe), info, opt);
    NeedsRecorder rec;
    q.rt->set_ops(rec);
    MemoryStatsSink sink;
    q.rt->set_stats_sink(&sink);
    q.rt->begin({c.step, 0, c.stats, false});
    EXPECT_EQ(rec.checks, 1);
    Tensors a(32, 32, 48, 5);
    a.run(*q.lin);
    ASSERT_EQ(rec.needs.size(), static_cast<size_t>(kNumRoles));
    for (size_t i = 0; i < rec.needs.size(); ++i) {
      const bool shared_dy = std::string(c.recipe) == "ue5m3-b16-fp32gemm" && kRoles[i] == Role::wgrad_dy;
      EXPECT_EQ(rec.needs[i], c.need && !shared_dy) << role_name(kRoles[i]);
    }
  }
  // ue5m3-b16-fp32gemm after its sampling step: held references, nothing read
  const LinearInfo info = info_of("layers.0.mixer.up_proj", 0, LinearKind::mlp_up, 32, 48);
  Rig q(load_recipe("ue5m3-b16-fp32gemm"), info);
  NeedsRecorder rec;
  q.rt->set_ops(rec);
  Tensors a(32, 32, 48, 5);
  q.rt->begin({1, 0, false, false});
  a.run(*q.lin);
  rec.needs.clear();
  q.rt->begin({2, 0, false, false});
  a.run(*q.lin);
  ASSERT_EQ(rec.needs.size(), static_cast<size_t>(kNumRoles));
  for (const bool n : rec.needs) EXPECT_FALSE(n);
  q.rt->finish();
  EXPECT_EQ(rec.checks, 3);
}

// On ops that defer statistics (a device's), a statistics step's records
// reach the sink at finish(), after one collect, with the values and in the
// order ops that fill them at once give.
TEST(QuantizedLinear, DeferredStatisticsReachTheSinkAtFinishInCallOrder) {
  const LinearInfo info = info_of("layers.0.mixer.up_proj", 0, LinearKind::mlp_up, 32, 48);
  MemoryStatsSink sinks[2];
  for (const bool defer : {false, true}) {
    Rig q(recipe_text(kMixedForDefer), info);
    NeedsRecorder rec;
    rec.defer = defer;
    q.rt->set_ops(rec);
    MemoryStatsSink& sink = sinks[defer];
    q.rt->set_stats_sink(&sink);
    q.rt->begin({1, 0, true, false});
    Tensors a(32, 32, 48, 5);
    a.run(*q.lin);
    EXPECT_EQ(sink.operands.size(), defer ? 0u : 6u);
    EXPECT_EQ(sink.gemms.size(), defer ? 0u : 3u);
    q.rt->finish();
    EXPECT_EQ(rec.collects, defer ? 1 : 0);
    ASSERT_EQ(sink.operands.size(), 6u);
    ASSERT_EQ(sink.gemms.size(), 3u);
    q.rt->begin({2, 0, false, false});  // nothing more to hand
    a.run(*q.lin);
    q.rt->finish();
    EXPECT_EQ(sink.operands.size(), 6u);
    EXPECT_EQ(rec.collects, defer ? 1 : 0);
  }
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(sinks[1].operands[i].key.role, sinks[0].operands[i].key.role);
    OperandStats d = sinks[1].operands[i].stats, w = sinks[0].operands[i].stats;
    EXPECT_EQ(std::bit_cast<uint64_t>(d.reference), std::bit_cast<uint64_t>(w.reference));
    d.reference = w.reference = 0;  // (NaN for wgrad-x, which has none)
    EXPECT_EQ(d, w) << i << ": amax " << d.amax << " " << w.amax << ", reference " << d.reference << " " << w.reference
                    << ", t " << d.tensor_scale << " " << w.tensor_scale << ", sum_sq " << d.q.sum_sq << " " << w.q.sum_sq;
    EXPECT_GT(d.amax, 0.0);
  }
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(sinks[1].gemms[i].key.gemm, sinks[0].gemms[i].key.gemm);
    EXPECT_EQ(sinks[1].gemms[i].stats, sinks[0].gemms[i].stats);
  }
}

TEST(QuantizedLinear, WeightTilesAreSharedByBothViews) {
  const Recipe r = load_recipe("te-nvfp4");
  const auto specs = r.resolve(info_of("l", 0, LinearKind::mlp_up, 80, 48), 20);
  QuantSpec fw = specs[role_index(Role::fprop_w)].q, dw = specs[role_index(Role::dgrad_w)].q;
  ASSERT_EQ(fw.block_rows, 16);
  fw.amax_kind = dw.amax_kind = AmaxKind::current;
  const int64_t out = 48, in = 80;
  auto W = randn(out * in, 3);
  for (size_t i = 0; i < W.size(); i += 37) W[i] *= 40;  // tiles with very different scales
  std::vector<uint8_t> s1, s2;
  const auto a = decoded(fw, W, out, in, nullptr, &s1);
  const auto b = decoded(dw, transposed(W, out, in), in, out, nullptr, &s2);
  EXPECT_EQ(transposed(a, out, in), b);
  // Tile (i, j) of W carries the scale of tile (j, i) of W^T.
  for (int64_t i = 0; i < out / 16; ++i)
    for (int64_t j = 0; j < in / 16; ++j) EXPECT_EQ(s1[i * (in / 16) + j], s2[j * (out / 16) + i]);
}

TEST(QuantizedLinear, StreamDerivationIsPinned) {
  static_assert(static_cast<int>(LinearKind::mamba_in_proj) == 0 && static_cast<int>(LinearKind::mlp_down) == 7 &&
                static_cast<int>(LinearKind::lm_head) == 8);
  static_assert(static_cast<int>(Role::fprop_x) == 0 && static_cast<int>(Role::wgrad_x) == 5);
  EXPECT_EQ(quant_stream(1, 0, 0, LinearKind::mamba_in_proj, Role::fprop_x), 0x0000000100000000ull);
  EXPECT_EQ(quant_stream(7, 3, 12, LinearKind::mlp_down, Role::wgrad_x), 0x0000000700300C75ull);
  EXPECT_EQ(quant_stream(123456, 0, 52, LinearKind::lm_head, Role::dgrad_dy), 0x0001E24000003482ull);
  EXPECT_EQ(quant_stream(4294967295, 4095, 4095, LinearKind::attn_v, Role::wgrad_dy), 0xFFFFFFFFFFFFFF44ull);
  EXPECT_THROW(quant_stream(int64_t{1} << 32, 0, 0, LinearKind::attn_v, Role::fprop_x), Error);
  EXPECT_THROW(quant_stream(1, 4096, 0, LinearKind::attn_v, Role::fprop_x), Error);
}

TEST(QuantizedLinear, RecordedStatisticsEqualQuantizeOnTheCapturedTensors) {
  // TE settings with periodic references and RHT on wgrad: step 1 samples
  // the references, steps 2-3 use the held values.
  Recipe r = load_recipe("te-nvfp4");
  apply_recipe_override(r, "recipe.all.reference", "periodic:2");
  apply_recipe_override(r, "recipe.keep_last_bf16", "0");
  const LinearInfo info = info_of("layers.1.mixer.in_proj", 1, LinearKind::mamba_in_proj, 32, 48);
  MemoryStatsSink sink;
  MemoryCaptureSink cap;
  Rig q(r, info);
  q.rt->set_stats_sink(&sink);
  q.rt->set_capture_sink(&cap);
  int compared = 0;
  for (int64_t step = 1; step <= 3; ++step) {
    q.rt->begin({step, 0, true, true});
    Tensors a(64, 32, 48, static_cast<uint32_t>(10 * step));
    a.run(*q.lin);
    for (Role role : kRoles) {
      SCOPED_TRACE(testing::Message() << role_name(role) << " step " << step);
      const auto* c = cap.find(info.name, role);
      const auto* s = sink.find(info.name, role);
      ASSERT_TRUE(c && s);
      ASSERT_EQ(c->key.step, step);
      QuantStats st;
      std::vector<float> y(c->x.size());
      std::vector<uint8_t> sc(static_cast<size_t>(block_count(c->spec, c->rows, c->cols)));
      QuantOutput out;
      out.values = y.data();
      out.stats = &st;
      out.scale_codes = sc.data();
      const QuantInfo qi = quantize(c->spec, c->x.data(), c->rows, c->cols, out);
      EXPECT_EQ(st, s->stats.q);
      EXPECT_EQ(std::bit_cast<uint64_t>(qi.amax), std::bit_cast<uint64_t>(s->stats.reference));
      EXPECT_EQ(qi.t, s->stats.tensor_scale);
      // amax of the tensor as quantized (after the RHT)
      std::vector<float> h = c->x;
      if (c->spec.rht) hadamard16(h.data(), c->rows, c->cols, 1, c->spec.rht_signs);
      EXPECT_EQ(s->stats.amax, abs_max(h.data(), static_cast<int64_t>(h.size())));
      // histogram and at-max/min from the scale codes
      OperandStats os;
      ScaleCodeTable(*c->spec.scale).add(sc.data(), static_cast<int64_t>(sc.size()), os);
      EXPECT_EQ(os.scale_hist, s->stats.scale_hist);
      EXPECT_EQ(os.scale_at_max, s->stats.scale_at_max);
      uint64_t hist_total = os.scale_zero + os.scale_nan;
      for (auto v : os.scale_hist) hist_total += v;
      EXPECT_EQ(hist_total, s->stats.q.blocks);
      EXPECT_EQ(c->spec.amax_kind, step == 2 ? AmaxKind::given : AmaxKind::current);
      ++compared;
    }
  }
  EXPECT_EQ(compared, 18);
}

// The block-scale histogram and the at-max/at-min counts from a list of
// scale codes, against their definition (stats.hpp) applied block by block
// with Format::decode: one-byte codes (counted per code) and two-byte ones,
// block counts that are not a multiple of four, zero, NaN and Inf scales.
TEST(ScaleCodeTable, CountsEqualTheDefinition) {
  std::mt19937 rng(17);
  for (const char* name : {"ue5m3", "ue8m0", "e4m3", "ue4m3", "bf16"}) {
    const Format fs = parse_format(name);
    const int cb = fs.code_bytes();
    const uint32_t ncodes = 1u << fs.bits;
    double min_pos = INFINITY;
    for (uint32_t c = 0; c < ncodes; ++c) {
      const double v = fs.decode(c);
      if (v > 0 && v < min_pos) min_pos = v;
    }
    for (const int64_t blocks : {0, 1, 3, 4, 1001}) {
      std::vector<uint8_t> codes(static_cast<size_t>(blocks * cb));
      std::vector<uint32_t> list(static_cast<size_t>(blocks));
      for (int64_t b = 0; b < blocks; ++b) {
        // runs of one code, and codes at the format's ends
        const uint32_t r = rng();
        uint32_t c = r % 4 == 0 && b > 0 ? list[static_cast<size_t>(b - 1)] : r % ncodes;
        if (r % 16 == 1) c = 0;
        if (r % 16 == 2) c = fs.max_mag;
        if (r % 16 == 3) c = ncodes - 1;
        list[static_cast<size_t>(b)] = c;
        for (int k = 0; k < cb; ++k) codes[static_cast<size_t>(b * cb + k)] = static_cast<uint8_t>(c >> (8 * k));
      }
      OperandStats want;
      for (const uint32_t c : list) {
        const double s = fs.decode(c);
        if (std::isnan(s)) ++want.scale_nan;
        else if (s == 0) ++want.scale_zero;
        else if (std::isinf(s)) ++want.scale_hist[kScaleHistBins - 1];
        else
          ++want.scale_hist[static_cast<size_t>(
              std::clamp(static_cast<int>(std::floor(std::log2(std::fabs(s)))) - kScaleHistMinLog2, 0, kScaleHistBins - 1))];
        want.scale_at_max += s == fs.max;
        want.scale_at_min += s == min_pos;
        if (cb == 1) ++want.scale_codes[c];
      }
      OperandStats got;
      ScaleCodeTable(fs).add(codes.data(), blocks, got);
      const std::string what = std::string(name) + ", " + std::to_string(blocks) + " blocks";
      EXPECT_EQ(got.scale_hist, want.scale_hist) << what;
      EXPECT_EQ(got.scale_zero, want.scale_zero) << what;
      EXPECT_EQ(got.scale_nan, want.scale_nan) << what;
      EXPECT_EQ(got.scale_at_max, want.scale_at_max) << what;
      EXPECT_EQ(got.scale_at_min, want.scale_at_min) << what;
      EXPECT_EQ(got.scale_codes, want.scale_codes) << what;
      if (blocks == 1001) {
        EXPECT_GT(want.scale_at_max + want.scale_zero, 0u) << what;
      }
    }
  }
}

TEST(QuantizedLinear, PeriodicReferencesAcrossStepsAndMicroBatches) {
  const LinearInfo info = info_of("layers.0.mixer.o_proj", 0, LinearKind::attn_o, 32, 32);
  Rig q(recipe_text("shared_dy_reference = true\n[all]\nelem = e2m1\nscale = ue5m3\narith = fp32\nzero_scale = one\n"
                    "reference = periodic:2\n"),
        info);
  MemoryStatsSink sink;
  q.rt->set_stats_sink(&sink);
  std::vector<double> x_ref, dy_ref, x_amax, dy_amax;
  for (int64_t step = 1; step <= 4; ++step)
    for (int64_t mb = 0; mb < 2; ++mb) {
      q.rt->begin({step, mb, true, false});
      Tensors a(32, 32, 32, static_cast<uint32_t>(100 + 10 * step + mb));
      a.X[5] = static_cast<float>(10 * step + mb);  // a distinct amax per call
      a.dY[7] = static_cast<float>(step + 0.1 * mb);
      a.run(*q.lin);
      x_ref.push_back(sink.find(info.name, Role::fprop_x)->stats.reference);
      x_amax.push_back(sink.find(info.name, Role::fprop_x)->stats.amax);
      dy_ref.push_back(sink.find(info.name, Role::dgrad_dy)->stats.reference);
      dy_amax.push_back(sink.find(info.name, Role::dgrad_dy)->stats.amax);
      EXPECT_EQ(sink.find(info.name, Role::wgrad_dy)->stats.reference, dy_ref.back());  // one shared dY reference
    }
  // Sampled by the first micro-batch of steps 1 and 3, held otherwise.
  const std::vector<double> want_x = {x_amax[0], x_amax[0], x_amax[0], x_amax[0],
                                      x_amax[4], x_amax[4], x_amax[4], x_amax[4]};
  EXPECT_EQ(x_ref, want_x);
  EXPECT_EQ(x_amax[0], 10.0);
  EXPECT_EQ(x_amax[4], 30.0);
  EXPECT_EQ(dy_ref[3], dy_amax[0]);
  EXPECT_EQ(dy_ref[5], dy_amax[4]);
  // The state checkpoints and restores.
  const auto flat = q.rt->references().save();
  EXPECT_EQ(flat.count(info.name + "/dy"), 1u);
  EXPECT_EQ(flat.count(info.name + "/fprop-x"), 1u);
}

TEST(QuantizedLinear, StochasticRoundingRemovesTheGradientBias) {
  // wgrad: dW = dY^T X with X = 1 and dY blocks along tokens of [1, 0.41, ...]:
  // every 0.41 lands at 2.46 on the e2m1 grid, which RNE rounds to 2 (a
  // biased weight gradient) and SR to 2 or 3 with mean 2.46.
  const int64_t T = 256, in = 16, out = 16;
  std::vector<float> X(T * in, 1.0f), W(out * in, 0.01f), dY(T * out);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t o = 0; o < out; ++o) dY[t * out + o] = (t % 16 == 0) ? 1.0f : 0.41f;
  const LinearInfo info = info_of("layers.0.mixer.up_proj", 0, LinearKind::mlp_up, in, out);
  auto bias_of = [&](const char* round, int steps) {
    RuntimeOptions opt;
    opt.gemm_stats_rows = 0;  // every output
    Rig q(recipe_text(std::string("[all]\nelem = e2m1\nscale = ue4m3\narith = fp32\n[wgrad-dy]\nround = ") + round +
                      "\n"),
          info, opt);
    MemoryStatsSink sink;
    q.rt->set_stats_sink(&sink);
    double bias = 0;
    for (int step = 1; step <= steps; ++step) {
      q.rt->begin({step, 0, true, false});
      std::vector<float> dW(out * in, 0.0f);
      q.lin->backward(nullptr, dW.data(), dY.data(), X.data(), W.data(), T);
      bias += sink.find(info.name, Gemm::wgrad)->stats.multiplicative_bias();
    }
    return bias / steps;
  };
  const double rne = bias_of("rne", 1);
  const double sr = bias_of("stochastic-fast", 40);
  // RNE: (15*2/6*1 + 1) / (15*0.41 + 1) - 1 = -0.1608...
  EXPECT_NEAR(rne, (15.0 * 2.0 / 6.0 + 1.0) / (15.0 * 0.41 + 1.0) - 1.0, 1e-5);
  // SR: unbiased. 40 steps x 256 outputs x 240 rounded terms: the standard
  // error of the mean bias is ~2e-4.
  EXPECT_LT(std::fabs(sr), 2e-3) << sr;
}

// The gradient bias is gain - 1, not the magnitude bias: with zero-mean
// outputs and unbiased stochastic rounding the noise makes |ŷ| larger than
// |y| on average (a magnitude "bias" of several percent) while the
// multiplicative bias stays at the level of its standard error.
TEST(QuantizedLinear, GradientBiasIsGainMinusOneNotMagnitude) {
  const int64_t T = 256, in = 64, out = 64;
  const LinearInfo info = info_of("layers.0.mixer.up_proj", 0, LinearKind::mlp_up, in, out);
  RuntimeOptions opt;
  opt.gemm_stats_rows = 0;
  // Only dY^T is quantized (exact SR, E2M1, one scale per 16 tokens); X^T
  // is exact. The first token of every 16 has a 20x larger dY, which sets
  // the block scale, and X = 0, so it adds nothing to y: the other dY sit at
  // ~0.3 of an E2M1 unit and SR makes them very noisy.
  Rig q(recipe_text("[all]\nelem = e2m1\nscale = ue4m3\narith = fp32\n[wgrad-dy]\nround = stochastic\nsr_bits = 24\n"
                    "[wgrad-x]\nelem = fp32\nscale = none\nreference = none\n"),
        info, opt);
  MemoryStatsSink sink;
  q.rt->set_stats_sink(&sink);
  auto X = randn(T * in, 21), dY = randn(T * out, 23, 1e-3f);
  const auto W = randn(out * in, 22, 0.1f);
  for (int64_t t = 0; t < T; t += 16) {
    for (int64_t i = 0; i < in; ++i) X[static_cast<size_t>(t * in + i)] = 0;
    for (int64_t o = 0; o < out; ++o) dY[static_cast<size_t>(t * out + o)] = 20e-3f;
  }
  double mult = 0, mag = 0, err2 = 0;
  const int steps = 8;
  for (int step = 1; step <= steps; ++step) {
    q.rt->begin({step, 0, true, false});
    std::vector<float> dW(out * in, 0.0f);
    q.lin->backward(nullptr, dW.data(), dY.data(), X.data(), W.data(), T);
    const GemmStats& st = sink.find(info.name, Gemm::wgrad)->stats;
    // The two figures from the recorded sums, by their definitions.
    EXPECT_EQ(st.multiplicative_bias(), st.sum_y_yhat / st.sum_y2 - 1.0);
    EXPECT_EQ(st.magnitude_bias(), (st.sum_abs_yhat - st.sum_abs_y) / st.sum_abs_y);
    mult += st.multiplicative_bias();
    mag += st.magnitude_bias();
    err2 += st.sum_err2 / st.sum_y2;
    sink.gemms.clear();
  }
  mult /= steps;
  mag /= steps;
  const double rel_noise2 = err2 / steps;  // E[(ŷ-y)²]/E[y²]
  // Standard error of gain - 1 over steps x out x in independent outputs:
  // sqrt(rel_noise2 / (steps * out * in)); 5 of them is the bound.
  EXPECT_LT(std::fabs(mult), 5 * std::sqrt(rel_noise2 / (steps * out * in))) << mult;
  // For Gaussian y and independent noise, E|y + e| / E|y| = sqrt(1 + rel_noise2):
  // the magnitude figure grows with noise.
  EXPECT_GT(rel_noise2, 0.2);
  EXPECT_NEAR(mag, std::sqrt(1 + rel_noise2) - 1, 0.25 * (std::sqrt(1 + rel_noise2) - 1)) << mag;
  EXPECT_GT(mag, 10 * std::fabs(mult));
}

TEST(QuantizedLinear, GroupedModelIsTheGroupedGemmOfTheEncodedOperands) {
  const int64_t T = 32, in = 80, out = 24;
  const LinearInfo info = info_of("layers.0.mixer.up_proj", 0, LinearKind::mlp_up, in, out);
  Recipe r = load_recipe("ue5m3-b16");
  MemoryCaptureSink cap;
  Rig q(r, info);
  q.rt->set_capture_sink(&cap);
  q.rt->begin({1, 0, false, true});
  Tensors a(T, in, out, 21);
  a.run(*q.lin);
  auto enc = [&](Role role, float& t) {
    const auto* c = cap.find(info.name, role);
    std::vector<uint8_t> codes(c->x.size()), sc(static_cast<size_t>(block_count(c->spec, c->rows, c->cols)));
    std::vector<float> y(c->x.size());
    QuantOutput o;
    o.values = y.data();
    o.codes = codes.data();
    o.scale_codes = sc.data();
    t = quantize(c->spec, c->x.data(), c->rows, c->cols, o).t;
    std::vector<double> v(c->x.size());
    encode_operand(v.data(), c->spec, codes.data(), sc.data(), c->rows, c->cols);
    return v;
  };
  float tx, tw, tdy, twt;
  const auto ex = enc(Role::fprop_x, tx), ew = enc(Role::fprop_w, tw);
  const auto edy = enc(Role::dgrad_dy, tdy), ewt = enc(Role::dgrad_w, twt);
  std::vector<float> Y(T * out), dX(T * in);
  grouped_gemm_ref(Y.data(), ex.data(), ew.data(), T, out, in, r.gemm, tensor_decode_alpha(tx, tw));
  grouped_gemm_ref(dX.data(), edy.data(), ewt.data(), T, in, out, r.gemm, tensor_decode_alpha(tdy, twt));
  expect_bits_equal(a.Y.data(), Y.data(), T * out, "Y");
  expect_bits_equal(a.dX.data(), dX.data(), T * in, "dX");  // dX was zero: 0 + GEMM
}

TEST(QuantizedLinear, ResultsDoNotDependOnThreadsOrStatistics) {
  const LinearInfo info = info_of("layers.1.mixer.up_proj", 1, LinearKind::mlp_up, 64, 96);
  auto run = [&](const std::string& recipe, int threads, bool stats) {
    Recipe r = load_recipe(recipe);
    apply_recipe_override(r, "recipe.keep_last_bf16", "0");
    RuntimeOptions opt;
    opt.gemm_stats_sample = 16;
    opt.gemm_stats_rows = 5;  // binds for wgrad (M = 96: ceil(96/16) = 6), not for fprop (M = 64: 4)
    Rig q(r, info, opt);
    MemoryStatsSink sink;
    q.rt->set_stats_sink(&sink);
    q.rt->begin({3, 0, stats, false});
    omp_set_num_threads(threads);
    Tensors a(64, 64, 96, 5);
    a.run(*q.lin);
    omp_set_num_threads(omp_get_num_procs());
    if (stats) {
      EXPECT_EQ(sink.find(info.name, Gemm::wgrad)->stats.rows, 5u);
      EXPECT_EQ(sink.find(info.name, Gemm::fprop)->stats.rows, 4u);
    }
    std::vector<float> all = a.Y;
    all.insert(all.end(), a.dX.begin(), a.dX.end());
    all.insert(all.end(), a.dW.begin(), a.dW.end());
    return all;
  };
  parallel_min_work() = 0;
  for (const char* recipe : {"te-nvfp4", "ue5m3-b16"}) {
    SCOPED_TRACE(recipe);
    const auto base = run(recipe, 1, false);
    const auto threaded = run(recipe, 2, true);
    expect_bits_equal(base.data(), threaded.data(), static_cast<int64_t>(base.size()), "1 thread vs 2 with stats");
  }
  parallel_min_work() = int64_t{1} << 15;
}

TEST(QuantizedLinear, RhtNeedsKMultipleOf16) {
  Recipe r = load_recipe("te-nvfp4");
  apply_recipe_override(r, "recipe.keep_last_bf16", "0");
  const LinearInfo info = info_of("layers.0.mixer.up_proj", 0, LinearKind::mlp_up, 32, 32);
  Rig q(r, info);
  ASSERT_NE(dynamic_cast<QuantizedLinear*>(q.lin.get()), nullptr);
  Tensors a(20, 32, 32, 1);
  // the forward GEMM has K = 32, wgrad K = tokens = 20
  EXPECT_NO_THROW(q.lin->forward(a.Y.data(), a.X.data(), a.W.data(), 20));
  try {
    q.lin->backward(a.dX.data(), a.dW.data(), a.dY.data(), a.X.data(), a.W.data(), 20);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("layers.0.mixer.up_proj, wgrad-dy"), std::string::npos) << e.what();
  }
}

TEST(QuantizedLinear, FactorySelectsLayers) {
  const Recipe r = load_recipe("te-nvfp4");
  auto rt = std::make_shared<QuantRuntime>();
  RecipeLinearFactory f(r, 52, rt);  // the 8B's depth: the last 8 blocks (15%) in BF16
  EXPECT_EQ(f.policy(), "recipe:te-nvfp4");
  EXPECT_NE(dynamic_cast<QuantizedLinear*>(f.make(info_of("a", 43, LinearKind::mlp_up, 16, 16)).get()), nullptr);
  EXPECT_EQ(dynamic_cast<QuantizedLinear*>(f.make(info_of("b", 44, LinearKind::mlp_up, 16, 16)).get()), nullptr);
  EXPECT_EQ(dynamic_cast<QuantizedLinear*>(f.make(info_of("lm_head", 52, LinearKind::lm_head, 16, 16)).get()), nullptr);
}

// A recipe that keeps every block unquantized is refused at start unless
// asked for; proxy-tiny has 5 blocks.
TEST(QuantizedLinear, ARecipeQuantizingNothingIsAnError) {
  Recipe r = load_recipe("te-nvfp4");
  apply_recipe_override(r, "recipe.keep_last_bf16=8");
  auto rt = std::make_shared<QuantRuntime>();
  try {
    RecipeLinearFactory f(r, 5, rt);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("recipe 'te-nvfp4' quantizes no linear of this 5-block model"), std::string::npos) << m;
    EXPECT_NE(m.find("recipe.allow_no_quantized=true"), std::string::npos) << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  }
  apply_recipe_override(r, "recipe.keep_last_bf16=60%");  // 3 of 5
  apply_recipe_override(r, "recipe.keep_first_bf16=2");
  EXPECT_THROW(RecipeLinearFactory(r, 5, rt), Error);
  EXPECT_NO_THROW(RecipeLinearFactory(r, 7, rt));  // 2 + 4 (4.2) of 7
  apply_recipe_override(r, "recipe.allow_no_quantized=true");
  EXPECT_NO_THROW(RecipeLinearFactory(r, 5, rt));
  Recipe head = load_recipe("te-nvfp4");
  apply_recipe_override(head, "recipe.keep_last_bf16=100%");
  apply_recipe_override(head, "recipe.lm_head=true");  // the LM head is still quantized
  EXPECT_NO_THROW(RecipeLinearFactory(head, 5, rt));
  EXPECT_NO_THROW(RecipeLinearFactory(load_recipe("bf16"), 5, rt));  // layers = none asks for it
  EXPECT_NO_THROW(RecipeLinearFactory(load_recipe("te-nvfp4"), 5, rt));  // 15% of 5: 1 block
}

// bfloat16 round to nearest even written from the definition: keep 8
// significant bits (7 stored), ties to even, overflow to infinity.
float bf16_reference(float x) {
  if (!std::isfinite(x) || x == 0) return x;
  int e = 0;
  std::frexp(static_cast<double>(x), &e);        // |x| in [2^(e-1), 2^e)
  const int lsb = std::max(e - 8, -126 - 7);     // bf16 has float32's exponent range, subnormals to 2^-133
  const double q = std::ldexp(static_cast<double>(x), -lsb);
  double r = std::floor(q);
  const double rest = q - r;
  if (rest > 0.5 || (rest == 0.5 && std::fmod(r, 2.0) != 0)) r += 1;
  const double y = std::ldexp(r, lsb);
  if (std::fabs(y) >= 0x1p128) return std::copysign(INFINITY, x);  // rounded above bf16's max 0x1.fep127
  return static_cast<float>(y);
}

TEST(QuantizedLinear, PreRoundBf16QuantizesTheBf16Operand) {
  // The reference itself on hand-made cases: a tie to even up, one to even
  // down, a value just above a tie, a subnormal, an overflow.
  EXPECT_EQ(bf16_reference(1.0f + 0x1p-8f), 1.0f);                 // tie, 1.0 is even
  EXPECT_EQ(bf16_reference(1.0f + 3 * 0x1p-8f), 1.0f + 0x1p-6f);   // tie, rounds up to even
  EXPECT_EQ(bf16_reference(1.0f + 0x1p-8f + 0x1p-20f), 1.0f + 0x1p-7f);
  EXPECT_EQ(bf16_reference(0x1.8p-140f), 0.0f);  // below half of 2^-133
  EXPECT_EQ(bf16_reference(0x1.81p-133f), 0x1p-132f);
  EXPECT_EQ(bf16_reference(0x1.ffp127f), INFINITY);
  const int64_t T = 32, in = 48, out = 32;
  const LinearInfo info = info_of("layers.1.mixer.up_proj", 1, LinearKind::mlp_up, in, out);
  auto text = [](bool pre_round) {
    const std::string p = pre_round ? "pre_round = bf16\n" : "";
    return recipe_text("[all]\nelem = e2m1\nscale = ue4m3\narith = fp32\nround = rne\n[gradients]\nround = "
                       "stochastic-fast\n" + p + "[weights]\nblock = 16x16\n" + p);
  };
  const std::string base = "[all]\nelem = e2m1\nscale = ue4m3\n";
  Rig pre(text(true), info);
  Rig plain(text(false), info);
  Tensors a(T, in, out, 9), b(T, in, out, 9);
  // Values with bits below bf16's: W and dY carry 23-bit significands.
  for (auto& w : b.W) w = bf16_reference(w);
  for (auto& d : b.dY) d = bf16_reference(d);
  ASSERT_NE(a.W, b.W);
  for (int64_t step = 1; step <= 2; ++step) {
    pre.rt->begin({step, 0, false, false});
    plain.rt->begin({step, 0, false, false});
    a.run(*pre.lin);
    b.run(*plain.lin);
    expect_bits_equal(a.Y.data(), b.Y.data(), T * out, "Y");
    expect_bits_equal(a.dX.data(), b.dX.data(), T * in, "dX");
    expect_bits_equal(a.dW.data(), b.dW.data(), out * in, "dW");
  }
  // Without pre_round the FP32 operands give other results.
  Rig fp32(text(false), info);
  Tensors c(T, in, out, 9);
  fp32.rt->begin({1, 0, false, false});
  c.run(*fp32.lin);
  Tensors d(T, in, out, 9);
  Rig pre1(text(true), info);
  pre1.rt->begin({1, 0, false, false});
  d.run(*pre1.lin);
  EXPECT_NE(c.dW, d.dW);
  // The knob round-trips and prints.
  const Recipe r = recipe_text(base + "[fprop-x]\npre_round = bf16\n");
  EXPECT_NE(recipe_to_ini(r).find("pre_round = bf16"), std::string::npos);
  EXPECT_NE(role_spec_string(r.resolve(info, 4)[0]).find("pre_round=bf16"), std::string::npos);
  EXPECT_NE(role_spec_string(r.resolve(info, 4)[1]).find("pre_round=none"), std::string::npos);
}

TEST(QuantizedLinear, EveryRecipeTrainsProxyTiny) {
  const models::NemotronHConfig cfg = models::preset_config("proxy-tiny");
  const int64_t B = 2, T = 16;
  std::mt19937 g(4);
  std::vector<int32_t> tokens(B * T), targets(B * T);
  for (auto& t : tokens) t = static_cast<int32_t>(g() % cfg.vocab_size);
  for (auto& t : targets) t = static_cast<int32_t>(g() % cfg.vocab_size);
  for (const auto& name : recipe_names()) {
    for (bool all_layers : {false, true}) {
      Recipe r = load_recipe(name);
      if (all_layers) {
        if (!r.quantize || r.keep_last_bf16.of(cfg.num_hidden_layers) == 0) continue;
        apply_recipe_override(r, "recipe.keep_last_bf16", "1");
      }
      SCOPED_TRACE(name + (all_layers ? " (keep_last_bf16 = 1)" : ""));
      auto rt = std::make_shared<QuantRuntime>();
      MemoryStatsSink sink;
      rt->set_stats_sink(&sink);
      RecipeLinearFactory f(r, cfg.num_hidden_layers, rt);
      models::NemotronH<float> m(cfg, f);
      m.init_weights(1);
      int quantized = 0;
      for (const auto& l : m.linears()) quantized += dynamic_cast<QuantizedLinear*>(l.get()) != nullptr;
      for (int64_t step = 1; step <= 2; ++step) {
        rt->begin({step, 0, step == 2, false});
        m.arena().zero_grad();
        const double loss = m.forward(tokens.data(), targets.data(), B, T);
        ASSERT_TRUE(std::isfinite(loss)) << loss;
        EXPECT_GT(loss, 0.5 * std::log(static_cast<double>(cfg.vocab_size)));
        m.backward();
        for (float v : m.arena().grads()) ASSERT_TRUE(std::isfinite(v));
      }
      EXPECT_EQ(sink.operands.size(), static_cast<size_t>(6 * quantized));
      EXPECT_EQ(sink.gemms.size(), static_cast<size_t>(3 * quantized));
      // Every quantizing recipe quantizes some linear of proxy-tiny (5 blocks):
      // the BF16 tails are fractions of the depth.
      if (name != "bf16" && name != "fp32") {
        EXPECT_GT(quantized, 0);
      }
    }
  }
}

}  // namespace
}  // namespace exmy::sim::quant

namespace exmy::sim::quant {
namespace {

TEST(QuantizedLinear, PlanFieldsAndQuantizeOptions) {
  Recipe r = load_recipe("ue5m3-b16");
  auto rt = std::make_shared<QuantRuntime>();
  RecipeLinearFactory f(r, 4, rt);
  f.make(info_of("layers.3.mixer.down_proj", 3, LinearKind::mlp_down, 32, 16));
  f.make(info_of("lm_head", 4, LinearKind::lm_head, 16, 64));
  ASSERT_EQ(f.plan().size(), 2u);
  EXPECT_TRUE(f.plan()[0].quantized);
  EXPECT_FALSE(f.plan()[1].quantized);
  const std::string text = f.plan_text();
  EXPECT_NE(text.find("layers.3.mixer.down_proj: fprop-x{elem=e2m1 scale=ue5m3 block=1x16"), std::string::npos) << text;
  EXPECT_NE(text.find("wgrad-dy{elem=e2m1 scale=ue5m3 block=1x16 scale_rule=amax-rne arith=fp32 round=stochastic-fast "
                      "sr_bits=8 scale_target=2048"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("lm_head: bf16"), std::string::npos);

  QuantSpec q = f.plan()[0].specs[role_index(Role::wgrad_dy)].q;
  q.amax_kind = AmaxKind::given;
  q.amax_value = 0.123456789f;
  q.seed = 7;
  q.stream = quant_stream(3, 0, 3, LinearKind::mlp_down, Role::wgrad_dy);
  EXPECT_EQ(quantize_options(q),
            "--elem e2m1 --scale ue5m3 --block 1x16 --scale-rule amax-rne --tensor-amax 0.123456791 --scale-target 2048 "
            "--round stochastic-fast --sr-bits 8 --seed 7 --stream 12884902772 --arith fp32 --zero-scale one");
  // Every field has a distinct name, and the counts read back.
  OperandStats os;
  os.q.elements = 12;
  os.scale_at_max = 3;
  std::set<std::string> names;
  for (const auto& fld : operand_fields()) {
    names.insert(fld.name);
    if (std::string(fld.name) == "elements") {
      EXPECT_EQ(fld.get(os), 12.0);
    }
    if (std::string(fld.name) == "scale_at_max") {
      EXPECT_EQ(fld.get(os), 3.0);
    }
  }
  EXPECT_EQ(names.size(), operand_fields().size());
  EXPECT_EQ(gemm_fields().size(), 13u);
}

}  // namespace
}  // namespace exmy::sim::quant

namespace exmy::sim::quant {
namespace {

// The dynamic range of each block from its definition (stats.hpp): the
// largest k with m * 2^k <= amax (exact in double), for every block of a
// (rows, cols) tensor taken element by element with the block's indices;
// all-zero and non-finite blocks left out.
std::array<uint64_t, kRangeHistBins> ranges_by_definition(const std::vector<float>& x, int64_t rows, int64_t cols,
                                                          int br, int bc) {
  std::array<uint64_t, kRangeHistBins> h{};
  for (int64_t r0 = 0; r0 < rows; r0 += br)
    for (int64_t c0 = 0; c0 < cols; c0 += bc) {
      double amax = 0, m = INFINITY;
      bool finite = true;
      for (int64_t r = r0; r < std::min(rows, r0 + br); ++r)
        for (int64_t c = c0; c < std::min(cols, c0 + bc); ++c) {
          const double a = std::fabs(static_cast<double>(x[static_cast<size_t>(r * cols + c)]));
          if (!std::isfinite(a)) finite = false;
          if (a > amax) amax = a;
          if (a > 0 && a < m) m = a;
        }
      if (!finite || amax == 0) continue;
      int k = 0;
      while (k + 1 < kRangeHistBins && std::ldexp(m, k + 1) <= amax) ++k;
      ++h[static_cast<size_t>(k)];
    }
  return h;
}

// add_block_ranges against the definition: 1D and 2D blocks, partial edge
// blocks, zero blocks, NaN and Inf, ranges at exact powers of two and past
// the last bin, with 1 and 2 threads.
TEST(BlockRanges, CountsEqualTheDefinition) {
  std::mt19937 rng(23);
  std::normal_distribution<float> nd;
  for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{1, 16}, {7, 37}, {33, 64}, {130, 300}})
    for (const auto& [br, bc] : {std::pair<int, int>{1, 16}, {1, 32}, {16, 1}, {16, 16}, {1, 1}}) {
      std::vector<float> x(static_cast<size_t>(rows * cols));
      for (size_t i = 0; i < x.size(); ++i) {
        const uint32_t r = rng();
        x[i] = std::ldexp(nd(rng), static_cast<int>(r % 40) - 20);
        if (r % 7 == 0) x[i] = 0;
        if (r % 97 == 1) x[i] = 0.5f;  // exact ratios with the 1.0s and 2.0s
        if (r % 97 == 2) x[i] = 2.0f;
        if (r % 211 == 3) x[i] = 1e-40f;  // subnormal: ranges past bin 63 with the large ones
        if (r % 211 == 4) x[i] = 1e30f;
        if (r % 401 == 5) x[i] = NAN;
        if (r % 401 == 6) x[i] = -INFINITY;
      }
      // a zero block
      for (int64_t i = 0; i < std::min<int64_t>(cols, bc); ++i) x[static_cast<size_t>(i)] = 0;
      const auto want = ranges_by_definition(x, rows, cols, br, bc);
      for (const int threads : {1, 2}) {
        const int saved = omp_get_max_threads();
        const int64_t saved_work = parallel_min_work();
        omp_set_num_threads(threads);
        parallel_min_work() = threads > 1 ? 1 : saved_work;  // small tensors threaded too
        OperandStats got;
        add_block_ranges(x.data(), rows, cols, br, bc, got);
        omp_set_num_threads(saved);
        parallel_min_work() = saved_work;
        EXPECT_EQ(got.range_hist, want) << rows << "x" << cols << " blocks " << br << "x" << bc << ", " << threads
                                        << " threads";
      }
    }
  EXPECT_EQ(range_bin(1.0f, 1.0f), 0);
  EXPECT_EQ(range_bin(2.0f, 1.0f), 1);
  EXPECT_EQ(range_bin(std::nextafter(2.0f, 0.0f), 1.0f), 0);
  EXPECT_EQ(range_bin(3e38f, 1e-45f), kRangeHistBins - 1);
}

}  // namespace
}  // namespace exmy::sim::quant

// Finite-difference checks (double) of every layer's backward, and of the
// chunked SSD scan against the per-token recurrence.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "models/attention.hpp"
#include "models/layer_rows.hpp"  // kCeSegment
#include "models/layers.hpp"
#include "models/ssd.hpp"
#include "sim/linear.hpp"
#include "tests/models/grad_check.hpp"

namespace exmy::models {
namespace {

using test::check_grad;
using test::dot;
using test::randn;
using test::uniform;
using V = std::vector<double>;

TEST(GradCheck, RmsNorm) {
  const int64_t N = 5, C = 7;
  const double eps = 1e-5;
  V x = randn(N * C, 1), w = randn(C, 2, 0.5, 1.0), wout = randn(N * C, 3);
  auto loss = [&] {
    V out(N * C), r(N);
    rmsnorm_forward(out.data(), r.data(), x.data(), w.data(), N, C, eps);
    return dot(out, wout);
  };
  V out(N * C), r(N), dx(N * C, 0.0), dw(C, 0.0);
  rmsnorm_forward(out.data(), r.data(), x.data(), w.data(), N, C, eps);
  rmsnorm_backward(dx.data(), dw.data(), wout.data(), x.data(), w.data(), r.data(), N, C);
  check_grad("rmsnorm dx", x, dx, loss);
  check_grad("rmsnorm dw", w, dw, loss);
}

TEST(GradCheck, GatedGroupedRmsNorm) {
  // y and z are views with row strides (as inside the in_proj output).
  const int64_t N = 4, D = 12, G = 3, ldy = 12, ldz = 15;
  const double eps = 1e-5;
  V y = randn(N * ldy, 4), z = randn(N * ldz, 5), w = randn(D, 6, 0.5, 1.0), wout = randn(N * D, 7);
  auto loss = [&] {
    V out(N * D), r(N * G);
    gated_rmsnorm_forward(out.data(), r.data(), y.data(), ldy, z.data(), ldz, w.data(), N, D, G, eps);
    return dot(out, wout);
  };
  V out(N * D), r(N * G), dy(N * ldy, 0.0), dz(N * ldz, 0.0), dw(D, 0.0);
  gated_rmsnorm_forward(out.data(), r.data(), y.data(), ldy, z.data(), ldz, w.data(), N, D, G, eps);
  gated_rmsnorm_backward(dy.data(), ldy, dz.data(), ldz, dw.data(), wout.data(), y.data(), ldy, z.data(), ldz, w.data(),
                         r.data(), N, D, G);
  check_grad("gated norm dy", y, dy, loss);
  check_grad("gated norm dz", z, dz, loss);
  check_grad("gated norm dw", w, dw, loss);
  // The columns past D in the strided z rows belong to someone else.
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = D; c < ldz; ++c) EXPECT_EQ(dz[n * ldz + c], 0.0);
}

TEST(GradCheck, CausalConv1dSilu) {
  const int64_t B = 2, T = 6, Cc = 5, K = 4, ldx = 8;
  V x = randn(B * T * ldx, 8), w = randn(Cc * K, 9, 0.5), bias = randn(Cc, 10, 0.3), wout = randn(B * T * Cc, 11);
  auto loss = [&] {
    V out(B * T * Cc);
    conv1d_silu_forward(out.data(), x.data(), ldx, w.data(), bias.data(), B, T, Cc, K);
    return dot(out, wout);
  };
  V dx(B * T * ldx, 0.0), dw(Cc * K, 0.0), db(Cc, 0.0);
  conv1d_silu_backward(dx.data(), ldx, dw.data(), db.data(), wout.data(), x.data(), ldx, w.data(), bias.data(), B, T,
                       Cc, K);
  check_grad("conv1d dx", x, dx, loss);
  check_grad("conv1d dw", w, dw, loss);
  check_grad("conv1d dbias", bias, db, loss);
  // Causality: the output at t=0 of batch row 1 does not see batch row 0.
  V out(B * T * Cc);
  conv1d_silu_forward(out.data(), x.data(), ldx, w.data(), bias.data(), B, T, Cc, K);
  const double o = out[T * Cc];
  x[(T - 1) * ldx] += 1.0;  // last token of batch row 0
  conv1d_silu_forward(out.data(), x.data(), ldx, w.data(), bias.data(), B, T, Cc, K);
  EXPECT_EQ(out[T * Cc], o);
}

TEST(GradCheck, Embedding) {
  const int64_t N = 6, C = 5, Vc = 4;
  const std::vector<int32_t> tok = {3, 1, 3, 0, 2, 3};  // repeated rows accumulate
  V wte = randn(Vc * C, 12), wout = randn(N * C, 13);
  auto loss = [&] {
    V out(N * C);
    embedding_forward(out.data(), tok.data(), wte.data(), N, C);
    return dot(out, wout);
  };
  V dwte(Vc * C, 0.0);
  embedding_backward(dwte.data(), wout.data(), tok.data(), N, C);
  check_grad("embedding", wte, dwte, loss);
}

TEST(GradCheck, CrossEntropy) {
  const int64_t N = 5, Vc = 9;
  const std::vector<int32_t> tgt = {1, 8, -100, 0, 8};  // -100: ignored
  V logits = randn(N * Vc, 14, 2.0);
  auto loss = [&] {
    std::vector<double> l(N);
    return cross_entropy_forward(l.data(), nullptr, logits.data(), tgt.data(), N, Vc);
  };
  std::vector<double> l(N);
  int64_t counted = 0;
  cross_entropy_forward(l.data(), &counted, logits.data(), tgt.data(), N, Vc);
  EXPECT_EQ(counted, 4);
  EXPECT_EQ(l[2], 0.0);
  V d(N * Vc, 0.0);
  cross_entropy_backward(d.data(), logits.data(), tgt.data(), N, Vc, 1.0 / static_cast<double>(counted));
  check_grad("cross-entropy", logits, d, loss);
}

// docs: a row's sum of exp(l - max) runs in segments of kCeSegment columns,
// each from 0 in column order, added in segment order (what a device's
// thread per segment gives): rows wider than a segment, written out here
// from that definition (std::exp is the CPU's exp), equal the CPU's losses
// and gradients bit for bit; a row of one segment is the plain column order.
TEST(Layers, CrossEntropySumsInSegments) {
  const int64_t N = 6;
  for (const int64_t Vc : {int64_t{700}, 3 * kCeSegment + 5}) {
    std::vector<float> logits(static_cast<size_t>(N * Vc));
    std::mt19937 g(static_cast<unsigned>(Vc));
    std::normal_distribution<float> nd(0.0f, 3.0f);
    for (auto& x : logits) x = nd(g);
    // Row 0: the max first and every other term below half an ulp of 1, so
    // that the order shows: column after column each term is lost in the
    // sum (which stays 1), segment by segment the other segments' terms add
    // up first and survive.
    for (int64_t v = 0; v < Vc; ++v) logits[static_cast<size_t>(v)] = v == 0 ? 0.0f : -37.5f;
    std::vector<int32_t> tgt(static_cast<size_t>(N));
    for (int64_t n = 0; n < N; ++n) tgt[static_cast<size_t>(n)] = static_cast<int32_t>((n * 611) % Vc);
    std::vector<double> losses(static_cast<size_t>(N));
    cross_entropy_forward(losses.data(), nullptr, logits.data(), tgt.data(), N, Vc);
    std::vector<float> d(logits.size(), 0.0f);
    cross_entropy_backward(d.data(), logits.data(), tgt.data(), N, Vc, 0.5);
    for (int64_t n = 0; n < N; ++n) {
      const float* l = logits.data() + n * Vc;
      const float mx = *std::max_element(l, l + Vc);
      double sum = 0;
      for (int64_t v0 = 0; v0 < Vc; v0 += kCeSegment) {
        double seg = 0;
        for (int64_t v = v0; v < std::min(Vc, v0 + kCeSegment); ++v) seg += static_cast<double>(std::exp(l[v] - mx));
        sum += seg;
      }
      if (n == 0) {
        EXPECT_EQ(sum == 1.0, Vc <= kCeSegment) << "V " << Vc;  // the order shows in row 0
      }
      const double loss = static_cast<double>(mx) + std::log(sum) - static_cast<double>(l[tgt[static_cast<size_t>(n)]]);
      EXPECT_EQ(losses[static_cast<size_t>(n)], loss) << "V " << Vc << " row " << n;
      const float inv = static_cast<float>(1.0 / sum);
      for (int64_t v = 0; v < Vc; ++v) {
        float want = 0.5f * (std::exp(l[v] - mx) * inv);
        if (v == tgt[static_cast<size_t>(n)]) want -= 0.5f;
        ASSERT_EQ(d[static_cast<size_t>(n * Vc + v)], want) << "V " << Vc << " row " << n << " column " << v;
      }
    }
  }
}

TEST(GradCheck, MlpSquaredRelu) {
  // up linear -> relu^2 -> down linear through the fp32 linear policy.
  const int64_t N = 6, C = 5, I = 8;
  auto factory = sim::make_linear_factory<double>("fp32");
  auto up = factory->make({"layers.1.mixer.up_proj", 1, sim::LinearKind::mlp_up, C, I});
  auto down = factory->make({"layers.1.mixer.down_proj", 1, sim::LinearKind::mlp_down, I, C});
  V x = randn(N * C, 15), wu = randn(I * C, 16, 0.5), wd = randn(C * I, 17, 0.5), wout = randn(N * C, 18);
  V u(N * I), a(N * I), y(N * C);
  auto fwd = [&] {
    up->forward(u.data(), x.data(), wu.data(), N);
    relu2_forward(a.data(), u.data(), N * I);
    down->forward(y.data(), a.data(), wd.data(), N);
    return dot(y, wout);
  };
  fwd();
  V da(N * I, 0.0), du(N * I, 0.0), dx(N * C, 0.0), dwu(I * C, 0.0), dwd(C * I, 0.0);
  down->backward(da.data(), dwd.data(), wout.data(), a.data(), wd.data(), N);
  relu2_backward(du.data(), da.data(), u.data(), N * I);
  up->backward(dx.data(), dwu.data(), du.data(), x.data(), wu.data(), N);
  check_grad("mlp dx", x, dx, fwd);
  check_grad("mlp dW up", wu, dwu, fwd);
  check_grad("mlp dW down", wd, dwd, fwd);
}

TEST(GradCheck, CausalGqaAttention) {
  // GQA (2 query heads per KV head), MQA (one KV head) and plain MHA.
  for (auto [hq, hkv] : std::vector<std::pair<int64_t, int64_t>>{{4, 2}, {3, 1}, {2, 2}}) {
    AttnDims d;
    d.batch = 2, d.seqlen = 7, d.q_heads = hq, d.kv_heads = hkv, d.head_dim = 3;
    const int64_t N = d.batch * d.seqlen, qd = d.q_heads * d.head_dim, kvd = d.kv_heads * d.head_dim;
    V q = randn(N * qd, 19), k = randn(N * kvd, 20), v = randn(N * kvd, 21), wout = randn(N * qd, 22);
    auto loss = [&] {
      V out(N * qd), lse(d.batch * d.q_heads * d.seqlen);
      attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), d);
      return dot(out, wout);
    };
    V out(N * qd), lse(d.batch * d.q_heads * d.seqlen), dq(N * qd, 0.0), dk(N * kvd, 0.0), dv(N * kvd, 0.0);
    attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), d);
    attention_backward(dq.data(), dk.data(), dv.data(), wout.data(), out.data(), lse.data(), q.data(), k.data(),
                       v.data(), d);
    const std::string tag = " (" + std::to_string(hq) + " q heads, " + std::to_string(hkv) + " kv heads)";
    check_grad("attention dq" + tag, q, dq, loss);
    check_grad("attention dk" + tag, k, dk, loss);
    check_grad("attention dv" + tag, v, dv, loss);
    // The first query sees only the first key: its output is v_0 of its kv head.
    for (int64_t e = 0; e < d.head_dim; ++e) EXPECT_NEAR(out[e], v[e], 1e-15) << tag;
  }
}

TEST(Attention, QueryBlocksMatchTheFullSoftmax) {
  // attention_* work in blocks of 64 queries over the keys each block can
  // see; 150 tokens give two full blocks and a partial one. Reference: the
  // whole (T x T) causal softmax per head, straight from the definition.
  AttnDims d;
  d.batch = 1, d.seqlen = 150, d.q_heads = 4, d.kv_heads = 2, d.head_dim = 5;
  const int64_t S = d.seqlen, Dh = d.head_dim, qd = d.q_heads * Dh, kvd = d.kv_heads * Dh;
  V q = randn(S * qd, 31), k = randn(S * kvd, 32), v = randn(S * kvd, 33), dout = randn(S * qd, 34);
  V out(S * qd), lse(d.q_heads * S), dq(S * qd, 0.0), dk(S * kvd, 0.0), dv(S * kvd, 0.0);
  attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), d);
  attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), out.data(), lse.data(), q.data(), k.data(),
                     v.data(), d);
  V rout(S * qd, 0.0), rdq(S * qd, 0.0), rdk(S * kvd, 0.0), rdv(S * kvd, 0.0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(Dh));
  for (int64_t h = 0; h < d.q_heads; ++h) {
    const int64_t g = h / (d.q_heads / d.kv_heads);
    auto Q = [&](int64_t t, int64_t e) { return q[t * qd + h * Dh + e]; };
    auto K = [&](int64_t t, int64_t e) { return k[t * kvd + g * Dh + e]; };
    auto Vv = [&](int64_t t, int64_t e) { return v[t * kvd + g * Dh + e]; };
    for (int64_t i = 0; i < S; ++i) {
      std::vector<double> p(static_cast<size_t>(i + 1));
      double mx = -1e300, sum = 0;
      for (int64_t j = 0; j <= i; ++j) {
        double sc = 0;
        for (int64_t e = 0; e < Dh; ++e) sc += Q(i, e) * K(j, e);
        p[static_cast<size_t>(j)] = sc * scale;
        mx = std::max(mx, p[static_cast<size_t>(j)]);
      }
      for (auto& x : p) sum += (x = std::exp(x - mx));
      for (auto& x : p) x /= sum;
      // out_i = sum_j p_j v_j; dp_j = dout_i . v_j; ds_j = p_j (dp_j - sum_k p_k dp_k)
      std::vector<double> dp(p.size());
      double pdp = 0;
      for (int64_t j = 0; j <= i; ++j) {
        for (int64_t e = 0; e < Dh; ++e) {
          rout[i * qd + h * Dh + e] += p[static_cast<size_t>(j)] * Vv(j, e);
          dp[static_cast<size_t>(j)] += dout[i * qd + h * Dh + e] * Vv(j, e);
          rdv[j * kvd + g * Dh + e] += p[static_cast<size_t>(j)] * dout[i * qd + h * Dh + e];
        }
        pdp += p[static_cast<size_t>(j)] * dp[static_cast<size_t>(j)];
      }
      for (int64_t j = 0; j <= i; ++j) {
        const double ds = p[static_cast<size_t>(j)] * (dp[static_cast<size_t>(j)] - pdp) * scale;
        for (int64_t e = 0; e < Dh; ++e) {
          rdq[i * qd + h * Dh + e] += ds * K(j, e);
          rdk[j * kvd + g * Dh + e] += ds * Q(i, e);
        }
      }
    }
  }
  auto max_diff = [](const V& a, const V& b) {
    double m = 0;
    for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
    return m;
  };
  EXPECT_LT(max_diff(out, rout), 1e-12);
  EXPECT_LT(max_diff(dq, rdq), 1e-12);
  EXPECT_LT(max_diff(dk, rdk), 1e-12);
  EXPECT_LT(max_diff(dv, rdv), 1e-12);
}

TEST(GradCheck, MambaTimeStep) {
  const int64_t N = 6, H = 4, ld = 7;
  V raw = randn(N * ld, 23, 2.0), bias = randn(H, 24), wout = randn(N * H, 25);
  // A clamp window inside the range of values, so both sides are exercised.
  const double lo = 0.05, hi = 3.0;
  auto loss = [&] {
    V dt(N * H);
    mamba_dt_forward(dt.data(), raw.data(), ld, bias.data(), N, H, lo, hi);
    return dot(dt, wout);
  };
  V dt(N * H), draw(N * ld, 0.0), dbias(H, 0.0);
  mamba_dt_forward(dt.data(), raw.data(), ld, bias.data(), N, H, lo, hi);
  int clamped = 0;
  for (double x : dt) clamped += (x == lo || x == hi);
  EXPECT_GT(clamped, 0);
  mamba_dt_backward(draw.data(), ld, dbias.data(), wout.data(), raw.data(), bias.data(), N, H, lo, hi);
  check_grad("dt raw", raw, draw, loss);
  check_grad("dt bias", bias, dbias, loss);
}

// ---------------------------------------------------------------------------
// SSD scan
// ---------------------------------------------------------------------------

struct SsdCase {
  SsdDims d;
  int64_t ldx, ldbc;  // xBC rows: [x (H*P) | B (G*N) | C (G*N) | pad]
  V xbc, dt, A_log, D;
  SsdCase(int64_t batch, int64_t seqlen, int64_t heads, int64_t head_dim, int64_t groups, int64_t state, int64_t chunk,
          uint32_t seed) {
    d.batch = batch, d.seqlen = seqlen, d.heads = heads, d.head_dim = head_dim, d.groups = groups, d.state = state;
    d.chunk = chunk;
    ldx = ldbc = heads * head_dim + 2 * groups * state + 3;
    xbc = randn(batch * seqlen * ldx, seed);
    dt = uniform(batch * seqlen * heads, seed + 1, 0.05, 0.6);
    A_log = uniform(heads, seed + 2, -1.0, 1.0);
    D = randn(heads, seed + 3);
  }
  int64_t N() const { return d.batch * d.seqlen; }
  int64_t ydim() const { return d.heads * d.head_dim; }
  const double* x() const { return xbc.data(); }
  const double* Bm() const { return xbc.data() + ydim(); }
  const double* Cm() const { return xbc.data() + ydim() + d.groups * d.state; }
};

struct SsdGrads {
  V dxbc, ddt, dA_log, dD;
};

V ssd_chunk_forward(const SsdCase& c) {
  V y(c.N() * c.ydim()), acs(c.d.acs_size()), st(c.d.states_size());
  ssd_chunk_scan_forward(y.data(), acs.data(), st.data(), c.x(), c.ldx, c.Bm(), c.Cm(), c.ldbc, c.dt.data(),
                         c.A_log.data(), c.D.data(), c.d);
  return y;
}

V ssd_ref_forward(const SsdCase& c) {
  V y(c.N() * c.ydim());
  ssd_scan_ref_forward(y.data(), c.x(), c.ldx, c.Bm(), c.Cm(), c.ldbc, c.dt.data(), c.A_log.data(), c.D.data(), c.d);
  return y;
}

SsdGrads ssd_chunk_backward(const SsdCase& c, const V& dy) {
  V y(c.N() * c.ydim()), acs(c.d.acs_size()), st(c.d.states_size());
  ssd_chunk_scan_forward(y.data(), acs.data(), st.data(), c.x(), c.ldx, c.Bm(), c.Cm(), c.ldbc, c.dt.data(),
                         c.A_log.data(), c.D.data(), c.d);
  SsdGrads g{V(c.xbc.size(), 0.0), V(c.dt.size(), 0.0), V(c.d.heads, 0.0), V(c.d.heads, 0.0)};
  const int64_t off = c.ydim(), GN = c.d.groups * c.d.state;
  ssd_chunk_scan_backward(g.dxbc.data(), g.dxbc.data() + off, g.dxbc.data() + off + GN, g.ddt.data(), g.dA_log.data(),
                          g.dD.data(), dy.data(), c.x(), c.ldx, c.Bm(), c.Cm(), c.ldbc, c.dt.data(), c.A_log.data(),
                          c.D.data(), acs.data(), st.data(), c.d);
  return g;
}

SsdGrads ssd_ref_backward(const SsdCase& c, const V& dy) {
  SsdGrads g{V(c.xbc.size(), 0.0), V(c.dt.size(), 0.0), V(c.d.heads, 0.0), V(c.d.heads, 0.0)};
  const int64_t off = c.ydim(), GN = c.d.groups * c.d.state;
  ssd_scan_ref_backward(g.dxbc.data(), g.dxbc.data() + off, g.dxbc.data() + off + GN, g.ddt.data(), g.dA_log.data(),
                        g.dD.data(), dy.data(), c.x(), c.ldx, c.Bm(), c.Cm(), c.ldbc, c.dt.data(), c.A_log.data(),
                        c.D.data(), c.d);
  return g;
}

double max_abs_diff(const V& a, const V& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}
double max_abs(const V& a) {
  double m = 0;
  for (double x : a) m = std::max(m, std::abs(x));
  return m;
}

TEST(SsdScan, ChunkedEqualsPerTokenRecurrence) {
  // Sequence lengths around the chunk size: shorter than one chunk, exact
  // multiples, and a partial last chunk; one and several groups.
  for (auto [seqlen, chunk, groups] : std::vector<std::array<int64_t, 3>>{
           {3, 4, 1}, {8, 4, 2}, {11, 4, 2}, {16, 16, 1}, {17, 5, 4}, {9, 1, 2}}) {
    SsdCase c(2, seqlen, 4, 3, groups, 5, chunk, static_cast<uint32_t>(100 + seqlen));
    const V yc = ssd_chunk_forward(c), yr = ssd_ref_forward(c);
    // Both are exact algebraic rearrangements evaluated in double: they
    // differ by summation order only (relative ~1e-15).
    EXPECT_LE(max_abs_diff(yc, yr), 1e-12 * max_abs(yr)) << "forward, seqlen " << seqlen << " chunk " << chunk;
    const V dy = randn(yr.size(), 7);
    const SsdGrads gc = ssd_chunk_backward(c, dy), gr = ssd_ref_backward(c, dy);
    EXPECT_LE(max_abs_diff(gc.dxbc, gr.dxbc), 1e-11 * max_abs(gr.dxbc)) << "dxBC, seqlen " << seqlen;
    EXPECT_LE(max_abs_diff(gc.ddt, gr.ddt), 1e-11 * max_abs(gr.ddt)) << "ddt, seqlen " << seqlen;
    EXPECT_LE(max_abs_diff(gc.dA_log, gr.dA_log), 1e-11 * max_abs(gr.dA_log)) << "dA_log, seqlen " << seqlen;
    EXPECT_LE(max_abs_diff(gc.dD, gr.dD), 1e-11 * max_abs(gr.dD)) << "dD, seqlen " << seqlen;
  }
}

TEST(SsdScan, ChunkedFloatTracksDouble) {
  // FP32 chunked scan against the double reference: FP32 rounding noise only.
  SsdCase c(2, 40, 4, 8, 2, 16, 16, 300);
  const V yr = ssd_ref_forward(c);
  auto f = [](const V& v) { return std::vector<float>(v.begin(), v.end()); };
  const auto xbc = f(c.xbc), dt = f(c.dt), A_log = f(c.A_log), D = f(c.D);
  std::vector<float> y(yr.size()), acs(c.d.acs_size()), st(c.d.states_size());
  const int64_t off = c.ydim(), GN = c.d.groups * c.d.state;
  ssd_chunk_scan_forward(y.data(), acs.data(), st.data(), xbc.data(), c.ldx, xbc.data() + off, xbc.data() + off + GN,
                         c.ldbc, dt.data(), A_log.data(), D.data(), c.d);
  double worst = 0;
  for (size_t i = 0; i < y.size(); ++i) worst = std::max(worst, std::abs(y[i] - yr[i]));
  // Each output sums ~ chunk*state + head_dim*state products of O(1)
  // values: a few hundred FP32 roundings of size <= 2^-24 relative.
  EXPECT_LE(worst, 2e-5 * max_abs(yr));
}

TEST(GradCheck, SsdChunkedScan) {
  SsdCase c(2, 11, 4, 3, 2, 5, 4, 400);
  const V w = randn(c.N() * c.ydim(), 401);
  auto loss = [&] { return dot(ssd_chunk_forward(c), w); };
  const SsdGrads g = ssd_chunk_backward(c, w);
  // Only the x, B and C columns of xBC feed the scan.
  V dxbc = g.dxbc;
  for (int64_t r = 0; r < c.N(); ++r)
    for (int64_t j = c.ydim() + 2 * c.d.groups * c.d.state; j < c.ldx; ++j) EXPECT_EQ(dxbc[r * c.ldx + j], 0.0);
  check_grad("ssd dxBC", c.xbc, g.dxbc, loss, 1000);
  check_grad("ssd ddt", c.dt, g.ddt, loss);
  check_grad("ssd dA_log", c.A_log, g.dA_log, loss);
  check_grad("ssd dD", c.D, g.dD, loss);
}

TEST(GradCheck, SsdReferenceRecurrence) {
  SsdCase c(1, 9, 2, 3, 1, 4, 4, 500);
  const V w = randn(c.N() * c.ydim(), 501);
  auto loss = [&] { return dot(ssd_ref_forward(c), w); };
  const SsdGrads g = ssd_ref_backward(c, w);
  check_grad("ssd ref dxBC", c.xbc, g.dxbc, loss, 1000);
  check_grad("ssd ref ddt", c.dt, g.ddt, loss);
  check_grad("ssd ref dA_log", c.A_log, g.dA_log, loss);
  check_grad("ssd ref dD", c.D, g.dD, loss);
}

}  // namespace
}  // namespace exmy::models

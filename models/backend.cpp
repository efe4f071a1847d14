#include "models/backend.hpp"

#include <utility>

#include "formats/launch_profile.hpp"

#include "models/attention.hpp"
#include "models/layers.hpp"
#include "models/ssd.hpp"
#include "sim/linear.hpp"

namespace exmy::models {

namespace {

// Every call is the CPU function of the same name, timed under that name
// while a launch profile is on (exmy bench train --profile).
template <class F>
void timed(const char* name, F&& f) {
  launch_profile_host(name, 0, std::forward<F>(f));
}

template <class T>
class CpuBackend final : public Backend<T> {
 public:
  const char* name() const override { return "cpu"; }
  sim::Memory& memory() override { return sim::host_memory(); }

  void embedding_forward(T* out, const int32_t* tokens, const T* wte, int64_t N, int64_t C) override {
    timed("embedding_forward", [&] { models::embedding_forward(out, tokens, wte, N, C); });
  }
  void embedding_backward(T* dwte, const T* dout, const int32_t* tokens, int64_t N, int64_t C) override {
    timed("embedding_backward", [&] { models::embedding_backward(dwte, dout, tokens, N, C); });
  }
  void rmsnorm_forward(T* out, T* rstd, const T* x, const T* w, int64_t N, int64_t C, double eps) override {
    timed("rmsnorm_forward", [&] { models::rmsnorm_forward(out, rstd, x, w, N, C, eps); });
  }
  void rmsnorm_backward(T* dx, T* dw, const T* dout, const T* x, const T* w, const T* rstd, int64_t N,
                        int64_t C) override {
    timed("rmsnorm_backward", [&] { models::rmsnorm_backward(dx, dw, dout, x, w, rstd, N, C); });
  }
  void gated_rmsnorm_forward(T* out, T* rstd, const T* y, int64_t ldy, const T* z, int64_t ldz, const T* w, int64_t N,
                             int64_t D, int64_t G, double eps) override {
    timed("gated_rmsnorm_forward", [&] {
      models::gated_rmsnorm_forward(out, rstd, y, ldy, z, ldz, w, N, D, G, eps);
    });
  }
  void gated_rmsnorm_backward(T* dy, int64_t lddy, T* dz, int64_t lddz, T* dw, const T* dout, const T* y, int64_t ldy,
                              const T* z, int64_t ldz, const T* w, const T* rstd, int64_t N, int64_t D,
                              int64_t G) override {
    timed("gated_rmsnorm_backward", [&] {
      models::gated_rmsnorm_backward(dy, lddy, dz, lddz, dw, dout, y, ldy, z, ldz, w, rstd, N, D, G);
    });
  }
  void conv1d_silu_forward(T* out, const T* x, int64_t ldx, const T* w, const T* bias, int64_t B, int64_t T_,
                           int64_t Cc, int64_t K) override {
    timed("conv1d_silu_forward", [&] { models::conv1d_silu_forward(out, x, ldx, w, bias, B, T_, Cc, K); });
  }
  void conv1d_silu_backward(T* dx, int64_t lddx, T* dw, T* dbias, const T* dout, const T* x, int64_t ldx, const T* w,
                            const T* bias, int64_t B, int64_t T_, int64_t Cc, int64_t K) override {
    timed("conv1d_silu_backward", [&] {
      models::conv1d_silu_backward(dx, lddx, dw, dbias, dout, x, ldx, w, bias, B, T_, Cc, K);
    });
  }
  void relu2_forward(T* out, const T* in, int64_t n) override {
    timed("relu2_forward", [&] { models::relu2_forward(out, in, n); });
  }
  void relu2_backward(T* din, const T* dout, const T* in, int64_t n) override {
    timed("relu2_backward", [&] { models::relu2_backward(din, dout, in, n); });
  }
  void add_forward(T* out, const T* a, const T* b, int64_t n) override {
    timed("add_forward", [&] { models::add_forward(out, a, b, n); });
  }
  double cross_entropy_forward(double* losses, int64_t* counted, const T* logits, const int32_t* targets, int64_t N,
                               int64_t V) override {
    double mean = 0;
    timed("cross_entropy_forward", [&] {
      mean = models::cross_entropy_forward(losses, counted, logits, targets, N, V);
    });
    return mean;
  }
  void cross_entropy_backward(T* dlogits, const T* logits, const int32_t* targets, int64_t N, int64_t V,
                              double scale) override {
    timed("cross_entropy_backward", [&] { models::cross_entropy_backward(dlogits, logits, targets, N, V, scale); });
  }
  void mamba_dt_forward(T* dt, const T* dt_raw, int64_t ld, const T* dt_bias, int64_t N, int64_t H, double lo,
                        double hi) override {
    timed("mamba_dt_forward", [&] { models::mamba_dt_forward(dt, dt_raw, ld, dt_bias, N, H, lo, hi); });
  }
  void mamba_dt_backward(T* ddt_raw, int64_t ld, T* ddt_bias, const T* ddt, const T* dt_raw, const T* dt_bias,
                         int64_t N, int64_t H, double lo, double hi) override {
    timed("mamba_dt_backward", [&] {
      models::mamba_dt_backward(ddt_raw, ld, ddt_bias, ddt, dt_raw, dt_bias, N, H, lo, hi);
    });
  }
  void ssd_chunk_scan_forward(T* y, T* acs, T* states, const T* x, int64_t ldx, const T* Bm, const T* Cm,
                              int64_t ldbc, const T* dt, const T* A_log, const T* D, const SsdDims& d) override {
    timed("ssd_chunk_scan_forward", [&] {
      models::ssd_chunk_scan_forward(y, acs, states, x, ldx, Bm, Cm, ldbc, dt, A_log, D, d);
    });
  }
  void ssd_chunk_scan_backward(T* dx, T* dB, T* dC, T* ddt, T* dA_log, T* dD, const T* dy, const T* x, int64_t ldx,
                               const T* Bm, const T* Cm, int64_t ldbc, const T* dt, const T* A_log, const T* D,
                               const T* acs, const T* states, const SsdDims& d) override {
    timed("ssd_chunk_scan_backward", [&] {
      models::ssd_chunk_scan_backward(dx, dB, dC, ddt, dA_log, dD, dy, x, ldx, Bm, Cm, ldbc, dt, A_log, D, acs,
                                      states, d);
    });
  }
  void attention_forward(T* out, T* lse, const T* q, const T* k, const T* v, const AttnDims& d) override {
    timed("attention_forward", [&] { models::attention_forward(out, lse, q, k, v, d); });
  }
  void attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* out, const T* lse, const T* q, const T* k,
                          const T* v, const AttnDims& d) override {
    timed("attention_backward", [&] { models::attention_backward(dq, dk, dv, dout, out, lse, q, k, v, d); });
  }
  void round_bf16(T* p, int64_t n) override {
    timed("round_bf16", [&] { sim::round_bf16(p, p, n); });
  }
};

}  // namespace

template <class T>
Backend<T>& cpu_backend() {
  static CpuBackend<T>* be = new CpuBackend<T>;  // never destroyed (see sim::host_memory)
  return *be;
}

template Backend<float>& cpu_backend<float>();
template Backend<double>& cpu_backend<double>();

}  // namespace exmy::models

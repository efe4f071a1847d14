// Where a model runs: its memory and the kernels of its layers. NemotronH
// and its mixers call the layers only through a Backend, on buffers in the
// backend's memory (sim::MemBuf), so models/nemotron_h.cpp, mamba2.cpp,
// attention.cpp and mlp.cpp are the same code on the CPU and on a device:
// - cpu_backend<T>(): host memory and the CPU layers of models/layers.hpp,
//   models/ssd.hpp and models/attention.hpp (threaded, float or double);
// - make_emulated_device_backend(): host memory and the CUDA kernels'
//   launches run one thread after another on the host (sim::HostLaunch):
//   the device's code path, checked in CI against the CPU bit for bit
//   (tests/models/test_backend.cpp);
// - make_cuda_backend(device) (models/cuda/backend_cuda.hpp, CUDA builds):
//   the device's memory and the same launches as CUDA kernels.
// The signatures are those of the CPU functions (outputs first, then
// inputs, then sizes; backward += into every gradient), with two host-side
// arrays: the token and target ids (the host feeds the batches; a device
// backend copies them over) and the per-token losses, which
// cross_entropy_forward writes to the host.
#pragma once

#include <cstdint>
#include <memory>

#include "sim/memory.hpp"

namespace exmy::models {

struct SsdDims;   // models/ssd.hpp
struct AttnDims;  // models/attention.hpp

template <class T>
class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;  // "cpu", "cuda-emulated", "cuda:0"
  virtual sim::Memory& memory() = 0;

  // models/layers.hpp
  virtual void embedding_forward(T* out, const int32_t* tokens_host, const T* wte, int64_t N, int64_t C) = 0;
  virtual void embedding_backward(T* dwte, const T* dout, const int32_t* tokens_host, int64_t N, int64_t C) = 0;
  virtual void rmsnorm_forward(T* out, T* rstd, const T* x, const T* w, int64_t N, int64_t C, double eps) = 0;
  virtual void rmsnorm_backward(T* dx, T* dw, const T* dout, const T* x, const T* w, const T* rstd, int64_t N,
                                int64_t C) = 0;
  virtual void gated_rmsnorm_forward(T* out, T* rstd, const T* y, int64_t ldy, const T* z, int64_t ldz, const T* w,
                                     int64_t N, int64_t D, int64_t G, double eps) = 0;
  virtual void gated_rmsnorm_backward(T* dy, int64_t lddy, T* dz, int64_t lddz, T* dw, const T* dout, const T* y,
                                      int64_t ldy, const T* z, int64_t ldz, const T* w, const T* rstd, int64_t N,
                                      int64_t D, int64_t G) = 0;
  virtual void conv1d_silu_forward(T* out, const T* x, int64_t ldx, const T* w, const T* bias, int64_t B, int64_t T_,
                                   int64_t Cc, int64_t K) = 0;
  virtual void conv1d_silu_backward(T* dx, int64_t lddx, T* dw, T* dbias, const T* dout, const T* x, int64_t ldx,
                                    const T* w, const T* bias, int64_t B, int64_t T_, int64_t Cc, int64_t K) = 0;
  virtual void relu2_forward(T* out, const T* in, int64_t n) = 0;
  virtual void relu2_backward(T* din, const T* dout, const T* in, int64_t n) = 0;
  virtual void add_forward(T* out, const T* a, const T* b, int64_t n) = 0;
  // losses_host (N) and *counted on the host; returns the mean loss.
  virtual double cross_entropy_forward(double* losses_host, int64_t* counted, const T* logits,
                                       const int32_t* targets_host, int64_t N, int64_t V) = 0;
  virtual void cross_entropy_backward(T* dlogits, const T* logits, const int32_t* targets_host, int64_t N, int64_t V,
                                      double scale) = 0;
  // models/ssd.hpp
  virtual void mamba_dt_forward(T* dt, const T* dt_raw, int64_t ld, const T* dt_bias, int64_t N, int64_t H, double lo,
                                double hi) = 0;
  virtual void mamba_dt_backward(T* ddt_raw, int64_t ld, T* ddt_bias, const T* ddt, const T* dt_raw,
                                 const T* dt_bias, int64_t N, int64_t H, double lo, double hi) = 0;
  virtual void ssd_chunk_scan_forward(T* y, T* acs, T* states, const T* x, int64_t ldx, const T* Bm, const T* Cm,
                                      int64_t ldbc, const T* dt, const T* A_log, const T* D, const SsdDims& d) = 0;
  virtual void ssd_chunk_scan_backward(T* dx, T* dB, T* dC, T* ddt, T* dA_log, T* dD, const T* dy, const T* x,
                                       int64_t ldx, const T* Bm, const T* Cm, int64_t ldbc, const T* dt,
                                       const T* A_log, const T* D, const T* acs, const T* states,
                                       const SsdDims& d) = 0;
  // models/attention.hpp
  virtual void attention_forward(T* out, T* lse, const T* q, const T* k, const T* v, const AttnDims& d) = 0;
  virtual void attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* out, const T* lse, const T* q,
                                  const T* k, const T* v, const AttnDims& d) = 0;
  // sim::round_bf16 in place (the bf16 policy's kept activations)
  virtual void round_bf16(T* p, int64_t n) = 0;

  // n elements from p, zero.
  void zero(T* p, int64_t n) {
    if (n > 0) memory().zero(p, static_cast<size_t>(n) * sizeof(T));
  }
};

// The CPU's layers on host memory (stateless; one per scalar type).
template <class T>
Backend<T>& cpu_backend();

// The CUDA kernels' launches run on the host, on host memory.
std::unique_ptr<Backend<float>> make_emulated_device_backend();

}  // namespace exmy::models

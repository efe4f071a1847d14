// The device backend (models/backend.hpp) for one build of the CUDA kernels:
// included by models/backend_emulated.cpp (EXMY_SUFFIX emulated: the
// launches run on the host) and models/cuda/backend_cuda.cpp (EXMY_SUFFIX
// cuda: CUDA kernels). The class is the same for both; only the kernels'
// suffix, the memory and attention's kernels differ. Every kernel's scratch is one buffer of the
// backend, grown to the largest call; the host's token and target ids are
// copied over on each call (N int32: small next to a layer), and the
// per-token losses copied back.
// The includer also defines EXMY_ITEM_KERNELS: 1 for the block launches of
// the SSD scan and of attention at the CPU's blocking, with the CPU's
// products entry by entry (the emulated backend: the CPU's bits), 0 for the
// same launches on cuBLASLt at attention's device blocking, or the SSD's
// thread kernels with EXMY_CUDA_SSD=threads and attention's row kernels
// with EXMY_CUDA_ATTENTION=rows (the CUDA backend: within an FP32 budget of
// the CPU). EXMY_CUDA_SSD=fused and =pieces (the SSD's fused forward, its
// block launches' products on bfloat16 pieces) and
// EXMY_CUDA_ATTENTION=fused take those kernels in both backends, the
// emulated one running their host emulations (no longer the CPU's bits).
#if !defined(EXMY_ITEM_KERNELS)
#error "define EXMY_ITEM_KERNELS (1: the CPU's bits, 0: the device's kernels) before including this file"
#endif
#include <algorithm>

#include "models/attention_blocks.hpp"
#include "models/attention_fused.hpp"  // attention_fused_applies, its scratch
#include "models/attention_launches.hpp"
#include "models/backend.hpp"
#include "models/cuda/attention_cuda.hpp"
#include "models/cuda/layers_cuda.hpp"
#include "models/cuda/ssd_cuda.hpp"
#include "models/layer_launches.hpp"
#include "models/ssd_launches.hpp"

#define EXMY_CAT2(a, b) a##_##b
#define EXMY_CAT(a, b) EXMY_CAT2(a, b)
#define EXMY_K(name) EXMY_CAT(name, EXMY_SUFFIX)

namespace exmy::models {
namespace {

class DeviceBackend final : public Backend<float> {
 public:
  DeviceBackend(const char* name, sim::Memory& memory)
      : name_(name), mem_(&memory), scratch_(memory), tokens_(memory), targets_(memory), losses_(memory),
        mean_(memory), counted_(memory), rows_(memory), starts_(memory), positions_(memory) {}

  const char* name() const override { return name_; }
  sim::Memory& memory() override { return *mem_; }

  void embedding_forward(float* out, const int32_t* tokens, const float* wte, int64_t N, int64_t C) override {
    EXMY_K(embedding_forward)(out, upload(tokens_, tokens, N), wte, N, C);
  }
  void embedding_backward(float* dwte, const float* dout, const int32_t* tokens, int64_t N, int64_t C) override {
    const TokenGroups g = group_tokens(tokens, N);
    const auto distinct = static_cast<int64_t>(g.rows.size());
    EXMY_K(embedding_backward)(dwte, dout, upload(rows_, g.rows.data(), distinct),
                               upload(starts_, g.starts.data(), distinct + 1),
                               upload(positions_, g.positions.data(), N), distinct, C);
  }
  void rmsnorm_forward(float* out, float* rstd, const float* x, const float* w, int64_t N, int64_t C,
                       double eps) override {
    EXMY_K(rmsnorm_forward)(out, rstd, x, w, N, C, eps);
  }
  void rmsnorm_backward(float* dx, float* dw, const float* dout, const float* x, const float* w, const float* rstd,
                        int64_t N, int64_t C) override {
    EXMY_K(rmsnorm_backward)(dx, dw, dout, x, w, rstd, N, C, scratch(rmsnorm_backward_scratch(N, C)));
  }
  void gated_rmsnorm_forward(float* out, float* rstd, const float* y, int64_t ldy, const float* z, int64_t ldz,
                             const float* w, int64_t N, int64_t D, int64_t G, double eps) override {
    EXMY_K(gated_rmsnorm_forward)(out, rstd, y, ldy, z, ldz, w, N, D, G, eps);
  }
  void gated_rmsnorm_backward(float* dy, int64_t lddy, float* dz, int64_t lddz, float* dw, const float* dout,
                              const float* y, int64_t ldy, const float* z, int64_t ldz, const float* w,
                              const float* rstd, int64_t N, int64_t D, int64_t G) override {
    EXMY_K(gated_rmsnorm_backward)(dy, lddy, dz, lddz, dw, dout, y, ldy, z, ldz, w, rstd, N, D, G,
                                   scratch(gated_rmsnorm_backward_scratch(N, D, G)));
  }
  void conv1d_silu_forward(float* out, const float* x, int64_t ldx, const float* w, const float* bias, int64_t B,
                           int64_t T_, int64_t Cc, int64_t K) override {
    EXMY_K(conv1d_silu_forward)(out, x, ldx, w, bias, B, T_, Cc, K);
  }
  void conv1d_silu_backward(float* dx, int64_t lddx, float* dw, float* dbias, const float* dout, const float* x,
                            int64_t ldx, const float* w, const float* bias, int64_t B, int64_t T_, int64_t Cc,
                            int64_t K) override {
    EXMY_K(conv1d_silu_backward)(dx, lddx, dw, dbias, dout, x, ldx, w, bias, B, T_, Cc, K,
                                 scratch(conv1d_silu_backward_scratch(B, T_, Cc)));
  }
  void relu2_forward(float* out, const float* in, int64_t n) override { EXMY_K(relu2_forward)(out, in, n); }
  void relu2_backward(float* din, const float* dout, const float* in, int64_t n) override {
    EXMY_K(relu2_backward)(din, dout, in, n);
  }
  void add_forward(float* out, const float* a, const float* b, int64_t n) override {
    EXMY_K(add_forward)(out, a, b, n);
  }
  double cross_entropy_forward(double* losses_host, int64_t* counted, const float* logits,
                               const int32_t* targets_host, int64_t N, int64_t V) override {
    losses_.resize_zero(N);
    mean_.resize_zero(1);
    counted_.resize_zero(1);
    EXMY_K(cross_entropy_forward)(losses_.data(), mean_.data(), counted_.data(), logits,
                                  upload(targets_, targets_host, N), N, V, scratch(cross_entropy_scratch(N, V)));
    double mean = 0;
    mem_->to_host(losses_host, losses_.data(), static_cast<size_t>(N) * sizeof(double));
    mem_->to_host(&mean, mean_.data(), sizeof mean);
    mem_->to_host(counted, counted_.data(), sizeof *counted);
    return mean;
  }
  void cross_entropy_backward(float* dlogits, const float* logits, const int32_t* targets_host, int64_t N, int64_t V,
                              double scale) override {
    EXMY_K(cross_entropy_backward)(dlogits, logits, upload(targets_, targets_host, N), N, V, scale,
                                   scratch(cross_entropy_scratch(N, V)));
  }
  void mamba_dt_forward(float* dt, const float* dt_raw, int64_t ld, const float* dt_bias, int64_t N, int64_t H,
                        double lo, double hi) override {
    EXMY_K(mamba_dt_forward)(dt, dt_raw, ld, dt_bias, N, H, lo, hi);
  }
  void mamba_dt_backward(float* ddt_raw, int64_t ld, float* ddt_bias, const float* ddt, const float* dt_raw,
                         const float* dt_bias, int64_t N, int64_t H, double lo, double hi) override {
    EXMY_K(mamba_dt_backward)(ddt_raw, ld, ddt_bias, ddt, dt_raw, dt_bias, N, H, lo, hi,
                              scratch(mamba_dt_backward_scratch(N, H)));
  }
  void ssd_chunk_scan_forward(float* y, float* acs, float* states, const float* x, int64_t ldx, const float* Bm,
                              const float* Cm, int64_t ldbc, const float* dt, const float* A_log, const float* D,
                              const SsdDims& d) override {
#if EXMY_ITEM_KERNELS
    if (ssd_fused_chosen(d))
      ssd_fused_forward_emulated(y, acs, states, x, ldx, Bm, Cm, ldbc, dt, A_log, D, d,
                                 scratch(ssd_fused_forward_scratch(d)));
    else if (ssd_pieces_chosen())
      ssd_pieces_forward_emulated(y, acs, states, x, ldx, Bm, Cm, ldbc, dt, A_log, D, d,
                                  scratch(ssd_blocks_forward_scratch(d, kSsdSlabFloats, true)));
    else
      ssd_blocks_forward_emulated(y, acs, states, x, ldx, Bm, Cm, ldbc, dt, A_log, D, d,
                                  scratch(ssd_blocks_forward_scratch(d)));
#else
    if (ssd_threads_chosen())
      EXMY_K(ssd_parallel_forward)(y, acs, states, x, ldx, Bm, Cm, ldbc, dt, A_log, D, d,
                                   scratch(ssd_parallel_forward_scratch(d)));
    else if (ssd_fused_chosen(d))
      EXMY_K(ssd_fused_forward)(y, acs, states, x, ldx, Bm, Cm, ldbc, dt, A_log, D, d,
                                scratch(ssd_fused_forward_scratch(d)));
    else if (ssd_pieces_chosen())
      EXMY_K(ssd_pieces_forward)(y, acs, states, x, ldx, Bm, Cm, ldbc, dt, A_log, D, d,
                                 scratch(ssd_blocks_forward_scratch(d, kSsdSlabFloats, true)));
    else
      EXMY_K(ssd_blocks_forward)(y, acs, states, x, ldx, Bm, Cm, ldbc, dt, A_log, D, d,
                                 scratch(ssd_blocks_forward_scratch(d)));
#endif
  }
  void ssd_chunk_scan_backward(float* dx, float* dB, float* dC, float* ddt, float* dA_log, float* dD,
                               const float* dy, const float* x, int64_t ldx, const float* Bm, const float* Cm,
                               int64_t ldbc, const float* dt, const float* A_log, const float* D, const float* acs,
                               const float* states, const SsdDims& d) override {
#if EXMY_ITEM_KERNELS
    if (ssd_fused_chosen(d) && ssd_pieces_chosen())
      ssd_fused_pieces_backward_emulated(dx, dB, dC, ddt, dA_log, dD, dy, x, ldx, Bm, Cm, ldbc, dt, A_log, D, acs,
                                         states, d, scratch(ssd_fused_backward_scratch(d, kSsdSlabFloats, true)));
    else if (ssd_fused_chosen(d))
      ssd_fused_backward_emulated(dx, dB, dC, ddt, dA_log, dD, dy, x, ldx, Bm, Cm, ldbc, dt, A_log, D, acs, states, d,
                                  scratch(ssd_fused_backward_scratch(d)));
    else if (ssd_pieces_chosen())
      ssd_pieces_backward_emulated(dx, dB, dC, ddt, dA_log, dD, dy, x, ldx, Bm, Cm, ldbc, dt, A_log, D, acs, states,
                                   d, scratch(ssd_blocks_backward_scratch(d, kSsdSlabFloats, true)));
    else
      ssd_blocks_backward_emulated(dx, dB, dC, ddt, dA_log, dD, dy, x, ldx, Bm, Cm, ldbc, dt, A_log, D, acs, states,
                                   d, scratch(ssd_blocks_backward_scratch(d)));
#else
    if (ssd_threads_chosen())
      EXMY_K(ssd_parallel_backward)(dx, dB, dC, ddt, dA_log, dD, dy, x, ldx, Bm, Cm, ldbc, dt, A_log, D, acs, states,
                                    d, scratch(ssd_parallel_backward_scratch(d)));
    else if (ssd_fused_chosen(d) && ssd_pieces_chosen())
      EXMY_K(ssd_fused_pieces_backward)(dx, dB, dC, ddt, dA_log, dD, dy, x, ldx, Bm, Cm, ldbc, dt, A_log, D, acs,
                                        states, d, scratch(ssd_fused_backward_scratch(d, kSsdSlabFloats, true)));
    else if (ssd_fused_chosen(d))
      EXMY_K(ssd_fused_backward)(dx, dB, dC, ddt, dA_log, dD, dy, x, ldx, Bm, Cm, ldbc, dt, A_log, D, acs, states, d,
                                 scratch(ssd_fused_backward_scratch(d)));
    else if (ssd_pieces_chosen())
      EXMY_K(ssd_pieces_backward)(dx, dB, dC, ddt, dA_log, dD, dy, x, ldx, Bm, Cm, ldbc, dt, A_log, D, acs, states,
                                  d, scratch(ssd_blocks_backward_scratch(d, kSsdSlabFloats, true)));
    else
      EXMY_K(ssd_blocks_backward)(dx, dB, dC, ddt, dA_log, dD, dy, x, ldx, Bm, Cm, ldbc, dt, A_log, D, acs, states, d,
                                  scratch(ssd_blocks_backward_scratch(d)));
#endif
  }
  // Attention: the block launches (models/attention_blocks.hpp), in the
  // emulated backend with the CPU's blocking and products (the CPU's bits,
  // which the whole-model emulation tests require; with
  // EXMY_CUDA_ATTENTION=fused the fused kernels' emulation instead, so that
  // CI trains through them), in the CUDA backend
  // with the device's blocking on cuBLASLt, its products on bfloat16
  // pieces (within an FP32 budget of the CPU), or its row kernels
  // (EXMY_CUDA_ATTENTION=rows), or its fused kernels
  // (EXMY_CUDA_ATTENTION=fused, models/attention_fused.hpp).
  void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                         const AttnDims& d) override {
#if EXMY_ITEM_KERNELS
    if (attention_fused_chosen() && attention_fused_applies(d))
      attention_fused_forward_emulated(out, lse, q, k, v, d);
    else
      attention_blocks_forward_emulated(out, lse, q, k, v, d, attn_cpu_blocking(),
                                        scratch(attention_blocks_forward_scratch(d, attn_cpu_blocking())));
#else
    if (attention_rows_chosen()) {
      EXMY_K(attention_rows_forward)(out, lse, q, k, v, d);
    } else if (attention_fused_chosen() && attention_fused_applies(d)) {
      EXMY_K(attention_fused_forward)(out, lse, q, k, v, d);
    } else {
      const AttnBlocking blk = attention_device_blocking_chosen(d);
      EXMY_K(attention_blocks_forward)(out, lse, q, k, v, d, blk, scratch(attention_blocks_forward_scratch(d, blk)));
    }
#endif
  }
  void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* out, const float* lse,
                          const float* q, const float* k, const float* v, const AttnDims& d) override {
#if EXMY_ITEM_KERNELS
    if (attention_fused_chosen() && attention_fused_applies(d))
      attention_fused_backward_emulated(dq, dk, dv, dout, out, lse, q, k, v, d,
                                        scratch(attention_fused_backward_scratch(d)));
    else
      attention_blocks_backward_emulated(dq, dk, dv, dout, out, lse, q, k, v, d, attn_cpu_blocking(),
                                         scratch(attention_blocks_backward_scratch(d, attn_cpu_blocking())));
#else
    if (attention_rows_chosen()) {
      EXMY_K(attention_rows_backward)(dq, dk, dv, dout, out, lse, q, k, v, d,
                                      scratch(attention_rows_backward_scratch(d)));
    } else if (attention_fused_chosen() && attention_fused_applies(d)) {
      EXMY_K(attention_fused_backward)(dq, dk, dv, dout, out, lse, q, k, v, d,
                                       scratch(attention_fused_backward_scratch(d)));
    } else {
      const AttnBlocking blk = attention_device_blocking_chosen(d);
      EXMY_K(attention_blocks_backward)(dq, dk, dv, dout, out, lse, q, k, v, d, blk,
                                        scratch(attention_blocks_backward_scratch(d, blk)));
    }
#endif
  }
  void round_bf16(float* p, int64_t n) override { EXMY_K(round_bf16)(p, p, n); }

 private:
  const char* name_;
  sim::Memory* mem_;
  sim::MemBuf<float> scratch_;
  sim::MemBuf<int32_t> tokens_, targets_;
  sim::MemBuf<double> losses_, mean_;
  sim::MemBuf<int64_t> counted_;
  sim::MemBuf<int32_t> rows_;
  sim::MemBuf<int64_t> starts_, positions_;

  // n floats of scratch (the kernels write what they read; not zeroed
  // beyond the first growth).
  float* scratch(int64_t n) {
    if (n > scratch_.size()) scratch_.resize_zero(n);
    return scratch_.data();
  }
  template <class I>
  I* upload(sim::MemBuf<I>& dst, const I* host, int64_t n) {
    if (n > dst.size()) dst.resize_zero(n);
    if (n > 0) mem_->from_host(dst.data(), host, static_cast<size_t>(n) * sizeof(I));
    return dst.data();
  }
};

}  // namespace
}  // namespace exmy::models

#undef EXMY_K
#undef EXMY_CAT
#undef EXMY_CAT2

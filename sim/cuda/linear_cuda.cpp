// sim/cuda/linear_cuda.hpp: the device Linears of the `fp32` and `bf16`
// policies, the same GEMM calls as PlainLinear and Bf16Linear in
// sim/linear.cpp with CudaGemm in place of sim::gemm.
#include "sim/cuda/linear_cuda.hpp"

#include <cuda_runtime.h>

#include <string>

#include "formats/cuda/cuda_check.hpp"

namespace exmy::sim {
namespace {

// The three GEMMs of a linear layer (sim/linear.cpp's fprop, dgrad, wgrad),
// operands float32 or bfloat16 bits.
void fprop(CudaGemm& g, GemmOperands kind, float* Y, const void* X, const void* W, int64_t tokens, int64_t in,
           int64_t out) {
  g.run(Y, out, X, in, Op::N, W, in, Op::T, tokens, out, in, false, kind);
}
void dgrad(CudaGemm& g, GemmOperands kind, float* dX, const void* dY, const void* W, int64_t tokens, int64_t in,
           int64_t out) {
  g.run(dX, in, dY, out, Op::N, W, in, Op::N, tokens, in, out, true, kind);
}
void wgrad(CudaGemm& g, GemmOperands kind, float* dW, const void* dY, const void* X, int64_t tokens, int64_t in,
           int64_t out) {
  g.run(dW, in, dY, out, Op::T, X, in, Op::N, out, in, tokens, true, kind);
}

class PlainCudaLinear final : public Linear<float> {
 public:
  PlainCudaLinear(const LinearInfo& info, CudaGemm& gemm) : Linear<float>(info), gemm_(gemm) {}
  void forward(float* Y, const float* X, const float* W, int64_t tokens) override {
    fprop(gemm_, GemmOperands::fp32, Y, X, W, tokens, info_.in_features, info_.out_features);
  }
  void backward(float* dX, float* dW, const float* dY, const float* X, const float* W, int64_t tokens) override {
    const int64_t in = info_.in_features, out = info_.out_features;
    if (dX) dgrad(gemm_, GemmOperands::fp32, dX, dY, W, tokens, in, out);
    wgrad(gemm_, GemmOperands::fp32, dW, dY, X, tokens, in, out);
  }

 private:
  CudaGemm& gemm_;
};

// A device buffer of bfloat16 bits that only grows.
class Bf16Buffer {
 public:
  Bf16Buffer() = default;
  ~Bf16Buffer() {
    if (p_) cudaFree(p_);
  }
  Bf16Buffer(const Bf16Buffer&) = delete;
  Bf16Buffer& operator=(const Bf16Buffer&) = delete;

  // At least n elements; the old contents are not kept. cudaFree waits for
  // the device, so no enqueued GEMM still reads the old buffer.
  uint16_t* get(int64_t n) {
    if (n > size_) {
      if (p_) cuda_check(cudaFree(p_), "cudaFree (bf16 operand scratch)");
      p_ = nullptr;
      size_ = 0;
      cuda_check(cudaMalloc(&p_, sizeof(uint16_t) * static_cast<size_t>(n)), "cudaMalloc (bf16 operand scratch)");
      size_ = n;
    }
    return p_;
  }

 private:
  uint16_t* p_ = nullptr;
  int64_t size_ = 0;
};

// The bfloat16 copies of X, W and dY, shared by a factory's Linears.
struct Bf16Scratch {
  Bf16Buffer x, w, dy;
};

const uint16_t* rounded(Bf16Buffer& buf, const float* src, int64_t n) {
  uint16_t* dst = buf.get(n);
  bf16_bits_cuda(dst, src, n);
  return dst;
}

// Bf16Linear of sim/linear.cpp: the same operands rounded at the same points,
// into the factory's scratch.
class Bf16CudaLinear final : public Linear<float> {
 public:
  Bf16CudaLinear(const LinearInfo& info, CudaGemm& gemm, std::shared_ptr<Bf16Scratch> scratch)
      : Linear<float>(info), gemm_(gemm), s_(std::move(scratch)) {}
  void forward(float* Y, const float* X, const float* W, int64_t tokens) override {
    const int64_t in = info_.in_features, out = info_.out_features;
    const uint16_t* xq = rounded(s_->x, X, tokens * in);
    const uint16_t* wq = rounded(s_->w, W, out * in);
    fprop(gemm_, GemmOperands::bf16, Y, xq, wq, tokens, in, out);
  }
  void backward(float* dX, float* dW, const float* dY, const float* X, const float* W, int64_t tokens) override {
    const int64_t in = info_.in_features, out = info_.out_features;
    const uint16_t* dyq = rounded(s_->dy, dY, tokens * out);
    if (dX) dgrad(gemm_, GemmOperands::bf16, dX, dyq, rounded(s_->w, W, out * in), tokens, in, out);
    wgrad(gemm_, GemmOperands::bf16, dW, dyq, rounded(s_->x, X, tokens * in), tokens, in, out);
  }

 private:
  CudaGemm& gemm_;
  std::shared_ptr<Bf16Scratch> s_;
};

class PlainCudaFactory final : public LinearFactory<float> {
 public:
  explicit PlainCudaFactory(CudaGemm& gemm) : gemm_(gemm) {}
  std::string policy() const override { return "fp32"; }
  std::unique_ptr<Linear<float>> make(const LinearInfo& info) const override {
    return std::make_unique<PlainCudaLinear>(info, gemm_);
  }

 private:
  CudaGemm& gemm_;
};

class Bf16CudaFactory final : public LinearFactory<float> {
 public:
  explicit Bf16CudaFactory(CudaGemm& gemm) : gemm_(gemm), scratch_(std::make_shared<Bf16Scratch>()) {}
  std::string policy() const override { return "bf16"; }
  std::unique_ptr<Linear<float>> make(const LinearInfo& info) const override {
    return std::make_unique<Bf16CudaLinear>(info, gemm_, scratch_);
  }

 private:
  CudaGemm& gemm_;
  std::shared_ptr<Bf16Scratch> scratch_;
};

}  // namespace

std::unique_ptr<LinearFactory<float>> make_cuda_linear_factory(std::string_view policy, CudaGemm& gemm) {
  switch (parse_linear_policy(policy)) {
    case LinearPolicy::fp32: return std::make_unique<PlainCudaFactory>(gemm);
    case LinearPolicy::bf16: return std::make_unique<Bf16CudaFactory>(gemm);
  }
  return nullptr;  // not reached
}

}  // namespace exmy::sim

// sim::CudaGemm (gemm_cuda.hpp) on cuBLASLt.
//
// cuBLAS is column-major: a row-major (r x c) matrix with row stride ld is
// the column-major (c x r) matrix with leading dimension ld, its transpose.
// So the row-major C = op(A) op(B) is computed as the column-major
// C^T = op(B)^T op(A)^T: cuBLAS's first operand is our B (with our opB),
// its second our A (with our opA), and its (m, n, k) are our (N, M, K).
//
// cuBLASLt is loaded at the first CudaGemm (dlopen), not linked: mapping
// its ~500 MB library costs every exmy process ~200 MB of resident memory
// at start, CPU runs included, which the memory plans would then have to
// carry.
#include "sim/cuda/gemm_cuda.hpp"

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <type_traits>

#include "formats/cuda/cuda_check.hpp"
#include "formats/error.hpp"
#include "formats/kernel_launch.hpp"  // DeviceProfileScope

namespace exmy::sim {
namespace {

void check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw Error(std::string("cuBLASLt error in ") + what + ": status " + std::to_string(static_cast<int>(s)));
}

cublasOperation_t op_of(Op op) { return op == Op::N ? CUBLAS_OP_N : CUBLAS_OP_T; }

// The cuBLASLt entry points this file calls, from the library found by the
// dynamic loader (LD_LIBRARY_PATH, the executable's run path), else from
// the toolkit exmy was built with; listed once, X(name) for each.
#define EXMY_LT_FUNCTIONS(X) \
  X(cublasLtCreate) \
  X(cublasLtDestroy) \
  X(cublasLtMatmul) \
  X(cublasLtMatmulAlgoGetHeuristic) \
  X(cublasLtMatmulDescCreate) \
  X(cublasLtMatmulDescDestroy) \
  X(cublasLtMatmulDescSetAttribute) \
  X(cublasLtMatmulPreferenceCreate) \
  X(cublasLtMatmulPreferenceDestroy) \
  X(cublasLtMatmulPreferenceSetAttribute) \
  X(cublasLtMatrixLayoutCreate) \
  X(cublasLtMatrixLayoutDestroy) \
  X(cublasLtMatrixLayoutSetAttribute)

struct Lt {
#define EXMY_LT(name) decltype(&::name) name = nullptr;
  EXMY_LT_FUNCTIONS(EXMY_LT)
#undef EXMY_LT
};

const Lt& lt() {
  static const Lt l = [] {
    const std::string soname = "libcublasLt.so." + std::to_string(CUBLAS_VER_MAJOR);
    void* h = dlopen(soname.c_str(), RTLD_NOW | RTLD_LOCAL);
#if defined(EXMY_CUBLASLT_DIR)
    if (!h) h = dlopen((std::string(EXMY_CUBLASLT_DIR) + "/" + soname).c_str(), RTLD_NOW | RTLD_LOCAL);
#endif
    if (!h) throw Error("cannot load " + soname + " (cuBLASLt, for the GEMMs on the device): " + dlerror());
    Lt t;
    auto get = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(h, name));
      if (!fn) throw Error(soname + " has no " + name);
    };
#define EXMY_LT(name) get(t.name, #name);
    EXMY_LT_FUNCTIONS(EXMY_LT)
#undef EXMY_LT
    return t;
  }();
  return l;
}
#undef EXMY_LT_FUNCTIONS

// A batch of products: how many, and each operand's stride in elements.
struct GemmBatch {
  int64_t count = 1, sa = 0, sb = 0, sc = 0;
  auto key() const { return std::make_tuple(count, sa, sb, sc); }
};

// The alignment in bytes (a power of two, at most 256) every matrix of an
// operand starts at: its address's and, in a batch, its stride's. cuBLASLt's
// heuristic assumes 256 unless told (CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_*),
// and an algorithm chosen for 256 may fault or read wrongly on a matrix that
// starts, say, 64 bytes into a line (attention's per-head blocks, scratch
// arrays 64-byte aligned).
uint32_t alignment(const void* p, int64_t stride_bytes = 0) {
  uint64_t bits = reinterpret_cast<uintptr_t>(p) | static_cast<uint64_t>(stride_bytes) | 256u;
  return static_cast<uint32_t>(bits & (~bits + 1));  // the lowest set bit
}
struct GemmAlign {
  uint32_t a = 256, b = 256, c = 256;  // our A, B, C
  auto key() const { return std::make_tuple(a, b, c); }
};

}  // namespace

struct CudaGemm::Impl {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  // A shape's descriptors and algorithm, chosen once.
  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
    bool none = false;  // a batch the heuristic has no algorithm for (run_batched: one call per entry)
  };
  using Batch = GemmBatch;
  using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int, int, int, bool,
                         std::tuple<int64_t, int64_t, int64_t, int64_t>, std::tuple<uint32_t, uint32_t, uint32_t>>;
  std::map<Key, Plan> plans;
  float* zero = nullptr;  // beta = 0 in device memory (device pointer mode)

  ~Impl() {
    for (auto& [k, p] : plans) {
      lt().cublasLtMatrixLayoutDestroy(p.a);
      lt().cublasLtMatrixLayoutDestroy(p.b);
      lt().cublasLtMatrixLayoutDestroy(p.c);
      lt().cublasLtMatmulDescDestroy(p.desc);
    }
    if (workspace) cudaFree(workspace);
    if (zero) cudaFree(zero);
    if (handle) lt().cublasLtDestroy(handle);
  }

  const Plan& plan(int64_t ldc, int64_t lda, Op opA, int64_t ldb, Op opB, int64_t M, int64_t N, int64_t K,
                   GemmOperands operands, const GemmAlign& align, bool device_alpha = false,
                   const Batch& batch = Batch{}) {
    const Key key{ldc,
                  lda,
                  ldb,
                  M,
                  N,
                  K,
                  static_cast<int>(opA),
                  static_cast<int>(opB),
                  static_cast<int>(operands),
                  device_alpha,
                  batch.key(),
                  align.key()};
    if (auto it = plans.find(key); it != plans.end()) return it->second;
    Plan p;
    const cudaDataType_t in = operands == GemmOperands::bf16 ? CUDA_R_16BF : CUDA_R_32F;
    check(lt().cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
    if (device_alpha) {
      const cublasLtPointerMode_t pm = CUBLASLT_POINTER_MODE_DEVICE;
      check(lt().cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_POINTER_MODE, &pm, sizeof pm),
            "POINTER_MODE");
    }
    const cublasOperation_t ta = op_of(opB), tb = op_of(opA);  // cuBLAS's first operand is our B
    check(lt().cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta), "TRANSA");
    check(lt().cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb), "TRANSB");
    // column-major shapes as stored: our B is (N x K) for opB = N, (K x N) for T
    const uint64_t m = static_cast<uint64_t>(N), n = static_cast<uint64_t>(M), k = static_cast<uint64_t>(K);
    check(lt().cublasLtMatrixLayoutCreate(&p.a, in, opB == Op::N ? m : k, opB == Op::N ? k : m, ldb), "layout B");
    check(lt().cublasLtMatrixLayoutCreate(&p.b, in, opA == Op::N ? k : n, opA == Op::N ? n : k, lda), "layout A");
    check(lt().cublasLtMatrixLayoutCreate(&p.c, CUDA_R_32F, m, n, ldc), "layout C");
    if (batch.count > 1) {  // cuBLAS's first operand is our B, its second our A
      const auto strided = [&](cublasLtMatrixLayout_t l, int64_t stride, const char* what) {
        const int32_t count = static_cast<int32_t>(batch.count);
        check(lt().cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count), what);
        check(lt().cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                                    sizeof stride),
              what);
      };
      strided(p.a, batch.sb, "batch of B");
      strided(p.b, batch.sa, "batch of A");
      strided(p.c, batch.sc, "batch of C");
    }
    cublasLtMatmulPreference_t pref = nullptr;
    check(lt().cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
    check(lt().cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes,
                                               sizeof workspace_bytes),
          "workspace preference");
    // cuBLAS's A is our B, its B our A; D is C
    for (const auto& [attr, bytes] : {std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align.b},
                                      std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align.a},
                                      std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align.c},
                                      std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align.c}})
      check(lt().cublasLtMatmulPreferenceSetAttribute(pref, attr, &bytes, sizeof bytes), "alignment preference");
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    const cublasStatus_t s = lt().cublasLtMatmulAlgoGetHeuristic(handle, p.desc, p.a, p.b, p.c, p.c, pref, 1, &result, &found);
    lt().cublasLtMatmulPreferenceDestroy(pref);
    check(s, "cublasLtMatmulAlgoGetHeuristic");
    if (found == 0 && batch.count > 1) {
      p.none = true;  // (kept, with its descriptors, so that the search runs once)
      return plans.emplace(key, p).first->second;
    }
    if (found == 0) throw Error("cuBLASLt has no algorithm for a " + std::to_string(M) + "x" + std::to_string(N) + "x" +
                                std::to_string(K) + " GEMM");
    p.algo = result.algo;
    return plans.emplace(key, p).first->second;
  }
};

namespace {

// A GEMM's row in a profile (named by operands and M x N x K, so that a
// profile shows each linear's rate); empty when no profile records.
std::string profile_name(GemmOperands operands, int64_t M, int64_t N, int64_t K) {
  if (!launch_profile_on()) return {};
  return std::string("cublasLt ") + (operands == GemmOperands::bf16 ? "bf16 " : "fp32 ") + std::to_string(M) + "x" +
         std::to_string(N) + "x" + std::to_string(K);
}

}  // namespace

CudaGemm::CudaGemm(size_t workspace_bytes) : impl_(std::make_unique<Impl>()) {
  check(lt().cublasLtCreate(&impl_->handle), "cublasLtCreate");
  impl_->workspace_bytes = workspace_bytes;
  if (workspace_bytes > 0) cuda_check(cudaMalloc(&impl_->workspace, workspace_bytes), "cudaMalloc (GEMM workspace)");
}

CudaGemm::~CudaGemm() = default;

void CudaGemm::run_device_alpha(float* C, int64_t ldc, const void* A, int64_t lda, Op opA, const void* B, int64_t ldb,
                                Op opB, int64_t M, int64_t N, int64_t K, GemmOperands operands, const float* alpha) {
  if (M == 0 || N == 0) return;
  if (K == 0) {  // an empty sum: C = 0
    for (int64_t r = 0; r < M; ++r) cuda_check(cudaMemsetAsync(C + r * ldc, 0, sizeof(float) * N), "cudaMemset");
    return;
  }
  if (!impl_->zero) {
    cuda_check(cudaMalloc(&impl_->zero, sizeof(float)), "cudaMalloc (GEMM beta)");
    cuda_check(cudaMemset(impl_->zero, 0, sizeof(float)), "cudaMemset (GEMM beta)");
  }
  const Impl::Plan& p = impl_->plan(ldc, lda, opA, ldb, opB, M, N, K, operands,
                                    GemmAlign{alignment(A), alignment(B), alignment(C)}, /*device_alpha=*/true);
  DeviceProfileScope timed(profile_name(operands, M, N, K), gemm_flops(M, N, K));
  check(lt().cublasLtMatmul(impl_->handle, p.desc, alpha, B, p.a, A, p.b, impl_->zero, C, p.c, C, p.c, &p.algo,
                            impl_->workspace, impl_->workspace_bytes, 0),
        "cublasLtMatmul");
}

void CudaGemm::run_batched(int64_t count, float* C, int64_t ldc, int64_t sc, const void* A, int64_t lda, int64_t sa,
                           Op opA, const void* B, int64_t ldb, int64_t sb, Op opB, int64_t M, int64_t N, int64_t K,
                           bool accumulate, GemmOperands operands) {
  if (count <= 0 || M == 0 || N == 0) return;
  const int64_t es = operands == GemmOperands::bf16 ? 2 : 4;  // bytes an operand element
  const auto* a = static_cast<const char*>(A);
  const auto* b = static_cast<const char*>(B);
  const auto each = [&] {  // one call per entry
    for (int64_t t = 0; t < count; ++t)
      run(C + t * sc, ldc, a + t * sa * es, lda, opA, b + t * sb * es, ldb, opB, M, N, K, accumulate, operands);
  };
  if (count == 1 || K == 0 || count > INT32_MAX) return each();  // (K = 0: each entry's C = 0, or unchanged)
  const GemmAlign align{alignment(A, es * sa), alignment(B, es * sb), alignment(C, 4 * sc)};
  const Impl::Plan& p =
      impl_->plan(ldc, lda, opA, ldb, opB, M, N, K, operands, align, false, Impl::Batch{count, sa, sb, sc});
  if (p.none) return each();  // the heuristic has no algorithm for this batch
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  DeviceProfileScope timed(launch_profile_on() ? std::string("cublasLt ") +
                                                     (operands == GemmOperands::bf16 ? "bf16" : "fp32") +
                                                     " batched " + std::to_string(count) + "x " + std::to_string(M) +
                                                     "x" + std::to_string(N) + "x" + std::to_string(K)
                                               : std::string(),
                           static_cast<double>(count) * gemm_flops(M, N, K));
  check(lt().cublasLtMatmul(impl_->handle, p.desc, &alpha, B, p.a, A, p.b, &beta, C, p.c, C, p.c, &p.algo,
                            impl_->workspace, impl_->workspace_bytes, 0),
        "cublasLtMatmul (batched)");
}

void CudaGemm::run(float* C, int64_t ldc, const void* A, int64_t lda, Op opA, const void* B, int64_t ldb, Op opB,
                   int64_t M, int64_t N, int64_t K, bool accumulate, GemmOperands operands, float alpha) {
  if (M == 0 || N == 0) return;
  if (K == 0) {  // an empty sum: C = 0, or C unchanged
    if (!accumulate)
      for (int64_t r = 0; r < M; ++r) cuda_check(cudaMemsetAsync(C + r * ldc, 0, sizeof(float) * N), "cudaMemset");
    return;
  }
  const Impl::Plan& p =
      impl_->plan(ldc, lda, opA, ldb, opB, M, N, K, operands, GemmAlign{alignment(A), alignment(B), alignment(C)});
  const float beta = accumulate ? 1.0f : 0.0f;
  DeviceProfileScope timed(profile_name(operands, M, N, K), gemm_flops(M, N, K));
  check(lt().cublasLtMatmul(impl_->handle, p.desc, &alpha, B, p.a, A, p.b, &beta, C, p.c, C, p.c, &p.algo,
                       impl_->workspace, impl_->workspace_bytes, 0),
        "cublasLtMatmul");
}

namespace {
// DeviceBatchedGemm's handle (gemm_cuda.hpp: made at the first call, never
// destroyed).
CudaGemm& batched_gemm() {
  static CudaGemm* const gemm = new CudaGemm(0);
  return *gemm;
}
}  // namespace

void DeviceBatchedGemm::operator()(int64_t count, float* C, int64_t ldc, int64_t sc, const float* A, int64_t lda,
                                   int64_t sa, Op opA, const float* B, int64_t ldb, int64_t sb, Op opB, int64_t M,
                                   int64_t N, int64_t K, bool accumulate) const {
  batched_gemm().run_batched(count, C, ldc, sc, A, lda, sa, opA, B, ldb, sb, opB, M, N, K, accumulate);
}
void DeviceBatchedGemm::operator()(int64_t count, float* C, int64_t ldc, int64_t sc, const uint16_t* A, int64_t lda,
                                   int64_t sa, Op opA, const uint16_t* B, int64_t ldb, int64_t sb, Op opB, int64_t M,
                                   int64_t N, int64_t K, bool accumulate) const {
  batched_gemm().run_batched(count, C, ldc, sc, A, lda, sa, opA, B, ldb, sb, opB, M, N, K, accumulate,
                             GemmOperands::bf16);
}

}  // namespace exmy::sim

// The chunked SSD scan's kernels of models/ssd_launches.hpp, float32, with
// the arguments of models/ssd.hpp's ssd_chunk_scan_* plus a scratch:
// - ssd_chunk_scan_forward_emulated / ssd_chunk_scan_backward_emulated: the
//   item launches on the host (HostLaunch, SerialGemm), host pointers,
//   scratch ssd_forward_scratch(d) / ssd_backward_scratch(d) floats. They
//   equal the CPU scan bit for bit (the same item functions, the same Eigen
//   products, the host's exp); the tests hold the other families to them.
//   Always built.
// - ssd_parallel_forward_* / ssd_parallel_backward_*: the thread launches
//   (models/ssd_threads.hpp), scratch ssd_parallel_forward_scratch(d) /
//   ssd_parallel_backward_scratch(d) floats, in two builds: *_cuda on the
//   current CUDA device, device pointers, the default stream (asynchronous;
//   a failed launch throws exmy::Error naming the kernel), only where exmy
//   is built with CUDA (EXMY_HAVE_CUDA): the CUDA backend runs these with
//   EXMY_CUDA_SSD=threads;
//   *_emulated, the same launches with the threads run one after another on
//   the host, always built, so that CI holds them to the budget. Their sums
//   are NaiveGemm's, not Eigen's, and on a device exp is the device's: within
//   the FP32 budget of tests/models/test_ssd_cuda.cpp of the CPU.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "models/ssd_blocks.hpp"    // the scratch sizes
#include "models/ssd_fused.hpp"     // ssd_fused_applies
#include "models/ssd_launches.hpp"

namespace exmy::models {

// A family's forward and backward entry points for one build (suffix
// emulated or cuda), with the scan's arguments (models/ssd.hpp) and a
// scratch; EXMY_SSD_FAMILY_BUILDS(family) declares the emulated build and,
// with CUDA, the device's.
#define EXMY_SSD_FAMILY(family, suffix)                                                                              \
  void ssd_##family##_forward_##suffix(float* y, float* acs, float* states, const float* x, int64_t ldx,            \
                                       const float* Bm, const float* Cm, int64_t ldbc, const float* dt,             \
                                       const float* A_log, const float* D, const SsdDims& d, float* scratch);       \
  void ssd_##family##_backward_##suffix(float* dx, float* dB, float* dC, float* ddt, float* dA_log, float* dD,      \
                                        const float* dy, const float* x, int64_t ldx, const float* Bm,              \
                                        const float* Cm, int64_t ldbc, const float* dt, const float* A_log,         \
                                        const float* D, const float* acs, const float* states, const SsdDims& d,    \
                                        float* scratch);
#if defined(EXMY_HAVE_CUDA)
#define EXMY_SSD_FAMILY_BUILDS(family) EXMY_SSD_FAMILY(family, emulated) EXMY_SSD_FAMILY(family, cuda)
#else
#define EXMY_SSD_FAMILY_BUILDS(family) EXMY_SSD_FAMILY(family, emulated)
#endif

// ssd_chunk_scan_forward_emulated / ssd_chunk_scan_backward_emulated (the
// item launches on the host; see the top of this file).
EXMY_SSD_FAMILY(chunk_scan, emulated)

// ssd_parallel_*: the thread launches (see the top of this file).
EXMY_SSD_FAMILY_BUILDS(parallel)

// ssd_blocks_*: the block launches (models/ssd_blocks.hpp), scratch
// ssd_blocks_forward_scratch(d) / ssd_blocks_backward_scratch(d) floats:
// *_emulated on the host (HostLaunch, LoopGemm<SerialGemm>: the CPU's
// products entry by entry, the CPU's exp: the CPU's bits), *_cuda on the
// current device (DeviceLaunch, cuBLASLt's strided batches, the default
// stream): within the FP32 budget of tests/models/test_ssd_cuda.cpp of the
// CPU.
EXMY_SSD_FAMILY_BUILDS(blocks)

// ssd_pieces_*: the block launches with their products on the BF16 tensor
// cores as products of bfloat16 pieces (models/split_gemm.hpp: C and B one
// piece where they hold bfloat16 values, SsdDims::xbc_bf16, other operands
// three), scratch ssd_blocks_forward_scratch(d, kSsdSlabFloats, true) /
// ssd_blocks_backward_scratch(d, kSsdSlabFloats, true) floats (the slab's
// pieces first): *_emulated on the host (SplitGemm over HostBf16Gemm, the
// device's products emulated), *_cuda on the current device (SplitGemm over
// cuBLASLt's BF16 strided batches); both within the budget of
// tests/models/test_ssd_cuda.cpp of the CPU (the bound of the pieces'
// products, test::RunErrSplitGemm, plus the CPU's).
EXMY_SSD_FAMILY_BUILDS(pieces)

// ssd_fused_*: the forward with each chunk's output as one fused kernel on
// the BF16 tensor cores (models/ssd_fused.hpp; scratch
// ssd_fused_forward_scratch(d) floats): acs and states as the block
// launches' (the same launches), y within the budget of
// tests/models/test_ssd_cuda.cpp of the CPU; and the backward with each
// chunk's diagonal block as two fused kernels (models/ssd_fused_bwd.hpp;
// scratch ssd_fused_backward_scratch(d) floats), the rest the block
// launches' with FP32 products, within that budget. *_emulated on the host
// (HostLaunch, LoopGemm<SerialGemm>, the kernels' emulations), *_cuda on
// the current device. Heads wider than 64 or states wider than 128 are
// refused (exmy::Error).
EXMY_SSD_FAMILY_BUILDS(fused)
#undef EXMY_SSD_FAMILY_BUILDS
#undef EXMY_SSD_FAMILY

// ssd_fused_pieces_backward_*: the fused backward with the block launches'
// other products on bfloat16 pieces, as ssd_pieces_backward_* (scratch
// ssd_fused_backward_scratch(d, kSsdSlabFloats, true) floats).
#define EXMY_SSD_BACKWARD(name)                                                                                      \
  void name(float* dx, float* dB, float* dC, float* ddt, float* dA_log, float* dD, const float* dy, const float* x, \
            int64_t ldx, const float* Bm, const float* Cm, int64_t ldbc, const float* dt, const float* A_log,       \
            const float* D, const float* acs, const float* states, const SsdDims& d, float* scratch);
EXMY_SSD_BACKWARD(ssd_fused_pieces_backward_emulated)
#if defined(EXMY_HAVE_CUDA)
EXMY_SSD_BACKWARD(ssd_fused_pieces_backward_cuda)
#endif
#undef EXMY_SSD_BACKWARD

// EXMY_CUDA_SSD, read once ("" when unset): a comma-separated list of the
// choices below.
inline std::string_view ssd_env() {
  static const std::string_view v = [] {
    const char* e = std::getenv("EXMY_CUDA_SSD");
    return std::string_view(e ? e : "");
  }();
  return v;
}
// Whether `word` is one of a comma-separated list's entries.
inline bool ssd_list_has(std::string_view list, std::string_view word) {
  std::string_view rest = list;
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    if (rest.substr(0, comma) == word) return true;
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
  }
  return false;
}
inline bool ssd_env_has(std::string_view word) { return ssd_list_has(ssd_env(), word); }
// Which family the CUDA backend runs: the block launches, unless the
// environment says `threads` (the thread kernels, forward and backward;
// kept until a device has timed both, docs/benchmarks.md).
inline bool ssd_threads_chosen() { return ssd_env_has("threads"); }
// `fused`: the forward's chunk outputs and the backward's diagonal blocks
// as the fused kernels where they apply (ssd_fused_applies).
inline bool ssd_fused_chosen(const SsdDims& d) {
  return !ssd_threads_chosen() && ssd_env_has("fused") && ssd_fused_applies(d);
}
// `pieces`: the block launches' products on bfloat16 pieces (the forward's
// unless it is fused, and the backward's, with the fused diagonal blocks
// the other products'). `fused,pieces` takes both.
inline bool ssd_pieces_chosen() { return !ssd_threads_chosen() && ssd_env_has("pieces"); }
// The scratch (floats) the CUDA backend's scan asks for: the larger of the
// forward's and the backward's of the family it runs (the emulated
// backend runs the block launches, with the fused forward or the pieces
// where chosen, and asks for the same). Inline: the memory plan
// (models/mamba2.cpp) needs no kernels.
inline int64_t ssd_device_scratch(const SsdDims& d) {
  if (ssd_threads_chosen()) return std::max(ssd_parallel_forward_scratch(d), ssd_parallel_backward_scratch(d));
  const bool pieces = ssd_pieces_chosen();
  if (ssd_fused_chosen(d))
    return std::max(ssd_fused_forward_scratch(d), ssd_fused_backward_scratch(d, kSsdSlabFloats, pieces));
  return std::max(ssd_blocks_forward_scratch(d, kSsdSlabFloats, pieces),
                  ssd_blocks_backward_scratch(d, kSsdSlabFloats, pieces));
}

}  // namespace exmy::models

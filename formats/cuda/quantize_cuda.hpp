// Block-scaled quantization on a CUDA device (docs/numerics.md §3, §5): the same
// bits as exmy::quantize_ref, made by the same header-only core
// (formats/quant_core.hpp, round.hpp, philox.hpp) compiled for the device.
//
// What runs where:
// - device: the random Hadamard transform (every size and kind; one thread
//   per segment running formats/hadamard_segment.hpp's rht_segment, the
//   function the CPU's hadamard calls, on a copy of x: the caller's tensor is
//   left as it was), the tensor amax for `--tensor-amax auto` (an integer
//   max over the bits of |x|, NaN if any element is NaN) and the
//   tensor-level scale from it (set_tensor_amax, one thread), with row outer
//   scales each row's max |x| and plan instead (a warp and a thread per
//   row), block amax, block scales and element encoding, integer statistics
//   (atomics), the segment partials of the double sums;
// - host: validation and the plan's format part (and the transform's sign
//   vector, rht_params), the error message for the first unrepresentable
//   element, the tree that combines the segment partials of the double sums
//   (docs/numerics.md §5), which the device makes one thread per segment,
//   and, in quantize_cuda only, the code/dequantization conventions of
//   other implementations.
// As in quantize(), the transformed tensor is the one quantized: the
// statistics and the amax are those of the rotated x.
//
// Entry points: quantize_cuda takes host pointers (device buffers are
// allocated and freed inside each call); a CudaQuantizer takes device
// pointers and keeps its small device buffers from call to call (the
// benchmark and, later, the training backend); apply_rht_cuda rotates a
// device tensor in place (a quantized linear on a device rotating an
// operand). These need exmy built with CUDA (EXMY_HAVE_CUDA). The host
// emulations, quantize_cuda_emulated (built with CUDA) and
// apply_rht_emulated (always built), run the kernels' thread bodies on the
// host, for the tests.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "formats/quantize.hpp"

namespace exmy {

// True when the CUDA runtime finds at least one usable device.
bool cuda_available();

// Name of device 0 and its compute capability, or why there is none.
std::string cuda_device_description();

// Same contract as quantize_ref / quantize: x is [rows, cols] row-major on
// the host; every non-null pointer of `out` is filled on the host. Throws
// exmy::Error for invalid specs, for unrepresentable elements (the lowest
// flat index is named, as quantize does), when no device is available, or
// when a CUDA call fails.
QuantInfo quantize_cuda(const QuantSpec& spec, const float* x, int64_t rows, int64_t cols, const QuantOutput& out);

// Number of visible CUDA devices; 0 with `error` set to the runtime's words
// when the query fails (no driver, no device).
int cuda_device_count(std::string* error);

// Makes device `index` current for this host thread (cudaSetDevice).
void cuda_select_device(int index);

// Quantization of tensors that are already on the current device. run()
// has quantize_cuda's contract except that x and every non-null pointer of
// `out` but out.stats are device pointers (out.stats is on the host), and
// that the code/dequantization conventions of other implementations are not
// supported there yet (an exmy::Error says so; quantize_cuda applies them on
// the host). With spec.rht the transform runs on the device, on a scratch
// copy of x (x is not modified), and the rotated tensor is quantized, as in
// quantize(). The tensor amax and the tensor-level scale are computed on the
// device, so the only host synchronisation is the final copy of the
// counters and the plan (and of the sum partials with statistics). Scratch
// is grown, never shrunk: repeated calls at one size allocate nothing.
//
// With wait = false the call returns without waiting for the device where
// the host can make the QuantInfo itself: no statistics, no row outer
// scales, and a tensor reference that is given or none (the host makes the
// plan the device's tensor plan kernel makes, from the same EXMY_HD code),
// or a current one when the caller reads none of the info (need_info =
// false: its amax and t are then NaN). An unrepresentable element of such a
// call is reported, with quantize's message, by the next check() or the
// next call that waits (which checks first). Other calls wait as before.
// t_out (a device pointer, or null): where the call's tensor encode scale t
// goes, on the device (for a GEMM whose epilogue applies it).
//
// record (a device pointer, or null): the call's statistics left on the
// device instead of out.stats (which is then null): its QuantStats, made
// there from the counters and the §5 tree of its sum partials
// (formats/tree_launches.hpp), with the plan's reference amax and tensor
// scale: the values a call that waits returns in out.stats and its
// QuantInfo. Such a call need not wait (the conditions above, out.stats
// being null), so a training step's statistics come to the host in one
// copy at its end. With row outer scales the record's amax and t are the
// call plan's (no tensor scale); the rows' are in the QuantInfo.
struct QuantRecord {
  QuantStats stats;
  double amax = 0;  // the reference A (NaN: none)
  float t = 1;      // the tensor encode scale
};

class CudaQuantizer {
 public:
  CudaQuantizer();
  ~CudaQuantizer();
  CudaQuantizer(const CudaQuantizer&) = delete;
  CudaQuantizer& operator=(const CudaQuantizer&) = delete;
  QuantInfo run(const QuantSpec& spec, const float* x, int64_t rows, int64_t cols, const QuantOutput& out,
                bool wait = true, bool need_info = true, float* t_out = nullptr, QuantRecord* record = nullptr);
  // Throws the first unrepresentable element of the calls that did not
  // wait (in call order); waits for the device when there are any.
  void check();

  struct Impl;  // defined in quantize.cu (quantize_cuda uses it too)

 private:
  std::unique_ptr<Impl> impl_;
};

// For tests: the same call with the kernels' per-block code run on the host
// (blocks in order, the lanes of each block's group one after another), no
// device needed. It checks the kernels' traversal, NaN-block, zero-scale and
// statistics logic where no GPU is present; it does not check the device
// compilation of the core, which only a device run can.
// With `record` (host memory), the call's statistics go there as
// CudaQuantizer::run leaves them on a device (out.stats may be null then),
// formed by the same tree levels run on the host.
QuantInfo quantize_cuda_emulated(const QuantSpec& spec, const float* x, int64_t rows, int64_t cols,
                                 const QuantOutput& out, QuantRecord* record = nullptr);

// The spec's random Hadamard transform (rht_size, rht_kind, rht_signs along
// its block axis; spec.rht itself is not read, as for apply_rht) of x
// [rows, cols] row-major, in place, bit for bit exmy::apply_rht's. Throws
// apply_rht's exmy::Error for a bad size or an axis length that is not a
// multiple of it.
// - apply_rht_cuda: x on the current device; one thread per segment on the
//   default stream, asynchronous (stream-ordered; a failed launch throws
//   exmy::Error naming the kernel). Only with EXMY_HAVE_CUDA.
// - apply_rht_emulated: x on the host, the same launch with its threads run
//   one after another on the host; always built.
#if defined(EXMY_HAVE_CUDA)
void apply_rht_cuda(const QuantSpec& spec, float* x_device, int64_t rows, int64_t cols);
#endif
void apply_rht_emulated(const QuantSpec& spec, float* x, int64_t rows, int64_t cols);

namespace detail {
struct ScaleThr;
// The scale-code thresholds the threshold path's kernel makes on the device
// for plan p (its tensor scale set): scale_code_thresholds(p)'s value
// (a check for the device tests).
ScaleThr scale_code_thresholds_cuda(const QuantPlan& p);
// The name of the launch (as the device profile times it) that quantizes a
// call of spec on [rows, cols] with aligned tensors: "quantize threshold
// path", "quantize FP4 step path" (", column blocks" for R x 1 blocks),
// "quantize blocks (general kernel)" or "quantize without block scales"
// (a check for the tests that a path is the one they mean to test).
const char* quantize_path_cuda(const QuantSpec& spec, int64_t rows, int64_t cols);
}  // namespace detail

}  // namespace exmy

#include "sim/io/quantize_stream.hpp"

#include <algorithm>
#include <functional>
#include <future>
#include <vector>

namespace exmy::io {

QuantStats quantize_stream(const QuantSpec& spec, TensorReader& in, const QuantizeFiles& files, OutputSet& outputs,
                           int threads, bool reference, int64_t band_bytes) {
  const int64_t rows = in.rows(), cols = in.cols();
  BandQuantizer q(spec, rows, cols, files.stats, threads);
  const int64_t unit = q.band_rows();
  const int64_t band = reference ? rows : unit * std::max<int64_t>(1, band_bytes / std::max<int64_t>(1, 4 * cols * unit));
  const int64_t max_rows = std::min(band, rows);
  const int eb = spec.elem.code_bytes(), sb = spec.scale ? spec.scale->code_bytes() : 1;
  std::vector<float> x(static_cast<size_t>(max_rows * cols));
  // Two sets of outputs (the second made when a second band comes): a band
  // is written (on another thread) while the next one is read and quantized.
  struct Band {
    std::vector<float> values;
    std::vector<uint8_t> codes, scodes;
  } bands[2];

  if (q.needs_amax() && !reference) {
    for (int64_t r0 = 0; r0 < rows; r0 += band) {
      const int64_t k = std::min(band, rows - r0);
      in.read(x.data(), k);
      q.measure(x.data(), k);
    }
    in.rewind();
  }
  constexpr size_t kNone = ~size_t{0};
  const size_t to_values = files.values.empty() ? kNone : outputs.open_tensor(files.values, rows, cols);
  const size_t to_codes = files.codes.empty() ? kNone : outputs.open_bytes(files.codes);
  const size_t to_scales = files.scales.empty() ? kNone : outputs.open_bytes(files.scales);
  auto write = [&](const Band& b, int64_t k) {
    if (to_values != kNone) outputs.append(to_values, b.values.data(), static_cast<size_t>(k * cols) * 4);
    if (to_codes != kNone) outputs.append(to_codes, b.codes.data(), static_cast<size_t>(k * cols * eb));
    if (to_scales != kNone) outputs.append(to_scales, b.scodes.data(), static_cast<size_t>(block_count(spec, k, cols) * sb));
  };
  QuantStats stats;
  std::future<void> writing;  // the previous band's write (its error is thrown by get())
  for (int64_t r0 = 0, i = 0; r0 < rows; r0 += band, ++i) {
    const int64_t k = std::min(band, rows - r0);
    Band& b = bands[i & 1];  // its last write, two bands back, has finished
    if (b.values.empty()) {
      b.values.resize(x.size());
      b.codes.resize(x.size() * static_cast<size_t>(eb));
      b.scodes.resize(static_cast<size_t>(block_count(spec, max_rows, cols) * sb));
    }
    in.read(x.data(), k);
    const QuantOutput out{b.values.data(), b.codes.data(), b.scodes.data(), reference ? &stats : nullptr};
    if (reference) quantize_ref(spec, x.data(), k, cols, out);
    else q.quantize(x.data(), k, out);
    if (writing.valid()) writing.get();
    writing = std::async(std::launch::async, write, std::cref(b), k);
  }
  if (writing.valid()) writing.get();
  if (!files.stats) return {};
  return reference ? stats : q.stats();
}

}  // namespace exmy::io

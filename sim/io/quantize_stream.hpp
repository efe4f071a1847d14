// `exmy quantize` on a file (docs/numerics.md §7): the tensor read in bands
// of rows, quantized band by band by exmy::BandQuantizer and written band by
// band (on a second thread, while the next band is read and quantized),
// with the same buffers for every band, so that memory does not grow with
// the number of rows. The outputs equal those of exmy::quantize on the
// whole tensor, bit for bit.
#pragma once

#include <cstdint>
#include <string>

#include "formats/quantize.hpp"
#include "sim/io/tensor_io.hpp"

namespace exmy::io {

// Where the outputs go; an empty path is not written.
struct QuantizeFiles {
  std::string values, codes, scales;
  bool stats = false;  // return the statistics
};

// Quantizes `in` by `spec` into `outputs` (the caller commits them) and
// returns the statistics (zero unless files.stats). Bands hold about
// `band_bytes` of input, at least one block row; with a current tensor amax
// the input is read twice (the amax first, docs/numerics.md §3 step 1).
// `reference`: the scalar reference, on the whole tensor as one band.
QuantStats quantize_stream(const QuantSpec& spec, TensorReader& in, const QuantizeFiles& files, OutputSet& outputs,
                           int threads, bool reference = false, int64_t band_bytes = int64_t{1} << 20);

}  // namespace exmy::io

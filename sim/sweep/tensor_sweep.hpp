// Offline tensor sweeps (`exmy sweep-tensors`, docs/sweeps.md): quantize
// captured tensors with every combination of a grid of format, scale,
// block, rounding, ... settings and report the statistics of each
// call, computed by exmy::quantize itself. No training: the cheap way to
// explore a format space on real tensors.
//
// Inputs: HDF5 files (every 2-D float32 dataset under a group, /capture by
// default: what `exmy train --set train.capture_step=N` writes), single
// datasets `file.h5:/path`, and .npy files (2-D float32).
//
// A combination is a QuantSpec written with the option names of `exmy
// quantize` (knobs): elem, scale, block, scale-rule, tensor-amax,
// scale-target, round, sr-bits, seed, stream, arith, zero-scale,
// convention, dequant, saturate, rht, rht-signs (grid_knob_names(): the
// knob table of formats/vocab.hpp, with its spelling of values), and
// `format` = ELEM[/SCALE[/BLOCK]] for the first three at once. A family maps knobs to lists of values and
// stands for their grid; the defaults are exmy quantize's. The grid INI
// file has one section per family:
//
//   [nvfp4]
//   format = e2m1/e4m3/1x16
//   tensor-amax = auto
//   round = rne, stochastic
//   [ue5m3]
//   format = e2m1/ue5m3/1x16, e2m1/ue5m3/1x32
//   tensor-amax = auto
//   scale-target = 448
//
// The combination "recorded" (optional) replays, for each captured tensor
// that carries them, the quantization parameters recorded as its attributes
// by the capture, so its statistics are those of the training call.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "formats/quantize.hpp"

namespace exmy::sweep {

// knob -> values, in the order given.
using Family = std::vector<std::pair<std::string, std::vector<std::string>>>;

struct Combo {
  std::string family;
  std::string name;                                 // "family:knob=value,..." of the knobs that vary, or the family
  std::vector<std::pair<std::string, std::string>> knobs;  // every knob given, with its value
  QuantSpec spec;
};

// A grid's knob names: `format` = ELEM[/SCALE[/BLOCK]], then the QuantSpec
// knobs of formats/vocab.hpp with '-' for '_' ("scale-rule").
std::vector<std::string> grid_knob_names();
// Knob names: '-' or '_' ("scale_rule" = "scale-rule"). Throws exmy::Error
// naming an unknown knob or a bad value (the parsers of exmy quantize).
std::string canonical_knob(const std::string& knob);
QuantSpec spec_from_knobs(const std::vector<std::pair<std::string, std::string>>& knobs);
std::vector<Combo> expand_families(const std::vector<std::pair<std::string, Family>>& families);
std::vector<std::pair<std::string, Family>> load_tensor_grid(const std::string& path);

struct TensorRef {
  std::string file;     // HDF5 or .npy file
  std::string dataset;  // HDF5 dataset path ("" for .npy)
  std::string name;     // what the outputs call it
};
struct LoadedTensor {
  std::vector<float> data;
  int64_t rows = 0, cols = 0;
  std::optional<QuantSpec> recorded;  // from capture attributes
};

// The tensors named by `inputs` (see above); `group` for whole HDF5 files.
// Throws exmy::Error for a missing file or one with no 2-D float32 dataset.
std::vector<TensorRef> list_tensors(const std::vector<std::string>& inputs, const std::string& group);
LoadedTensor load_tensor(const TensorRef& t);

struct TensorResult {
  size_t tensor = 0;  // index into the tensor list
  size_t combo = 0;   // index into the combination list; SIZE_MAX: recorded
  QuantSpec spec;
  QuantInfo info;
  QuantStats stats;
  std::string error;  // a combination that does not apply (e.g. a block that does not divide K)
};

// Every tensor with every combination (and the recorded one when asked).
struct TensorSweep {
  std::vector<TensorRef> tensors;
  std::vector<std::pair<int64_t, int64_t>> shapes;
  std::vector<Combo> combos;
  std::vector<TensorResult> results;
};
TensorSweep run_tensor_sweep(const std::vector<TensorRef>& tensors, const std::vector<Combo>& combos,
                             bool recorded, int threads);

// CSV (one row per result, doubles at full precision) and HDF5 (/tensors,
// /combos, /results: column datasets), written to temporaries and renamed.
void write_tensor_sweep(const TensorSweep& s, const std::string& csv_path, const std::string& h5_path);

}  // namespace exmy::sweep

// Sweep files and their expansion into named runs (docs/sweeps.md).
//
// A sweep file is INI (experiments/sweeps/*.ini):
//
//   [sweep]
//   name = lr-seed                       # default: the file's stem
//   base = experiments/proxy-tiny.ini    # the run configuration every run starts from
//   reference = optim.lr=1e-2            # each run's reference: same other axis values, these values
//   diverge_above = 8                    # final-window loss above this flags a run (default: its first loss)
//   group_over = train.seed              # summary.md: mean and spread over this axis
//   [set]                                # assignments for every run
//   train.steps = 100
//   [grid]                               # one axis per key; the first axis varies slowest
//   train.seed = 1, 2, 3
//   optim.lr = 3e-3, 1e-2
//   [zip.shape]                          # one axis whose keys step together (lists of equal length)
//   model.hidden_size = 64, 128
//   model.num_attention_heads = 2, 4
//
// Keys are `exmy train` configuration keys, each passed to the run as
// `--set section.key=VALUE` (so recipe.SECTION.KNOB overrides work too);
// `recipe` is short for train.recipe. Values are comma-separated; a value
// holding a comma is written in double quotes. Axes are ordered as they
// appear in the file (the keys of [grid] in order, each [zip.NAME] at its
// header), and runs are numbered row-major over them: the first axis
// varies slowest.
//
// Run names: a zero-padded index (at least 3 digits) and, for every axis
// key, `short=value`, joined by '_' ("004_seed=2_lr=1e-2"). The short name
// is the key's last dotted component, lengthened from the left where two
// axis keys would share it; values keep [A-Za-z0-9.+-], turn every run of
// other characters into one '-', lose leading dots and dashes (not a minus
// sign) and are cut at 40 characters; a name is cut at 160. The index alone
// identifies a run; the rest is for people.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace exmy::sweep {

using Assignment = std::pair<std::string, std::string>;  // key, value

struct Axis {
  std::string name;                              // the key, or the zip section's NAME
  std::vector<std::string> keys;                 // one key, or the zipped keys
  std::vector<std::vector<std::string>> values;  // values[k][i]: key k at position i
  int64_t size() const { return values.empty() ? 0 : static_cast<int64_t>(values[0].size()); }
};

struct SweepSpec {
  std::string path;  // the sweep file ("" when parsed from text)
  std::string name;
  std::string base;                  // base run configuration (relative to the working directory)
  std::vector<Assignment> fixed;     // [set], then the command line's --set
  std::vector<Axis> axes;
  std::vector<Assignment> reference;  // empty: no reference
  std::optional<double> diverge_above;
  std::string group_over;  // an axis key, or empty

  int64_t run_count() const;
  // Every axis key, in axis order (zip keys in their order).
  std::vector<std::string> axis_keys() const;
};

// Parses sweep-file text; `origin` names it in messages. Throws exmy::Error
// with one line ("FILE:LINE: ...") for anything malformed: unknown sections
// or [sweep] keys, an empty or duplicated value list, zipped lists of
// different lengths, a key given twice across axes, a reference or
// group_over naming no axis.
SweepSpec parse_sweep(const std::string& text, const std::string& origin);
SweepSpec load_sweep(const std::string& path);

// "recipe" -> "train.recipe"; every other key as it is.
std::string canonical_key(const std::string& key);

// Splits "a, b, \"c,d\"" into {"a", "b", "c,d"}; throws on an empty item.
std::vector<std::string> split_values(const std::string& list, const std::string& what);

struct RunSpec {
  int64_t index = 0;
  std::string name;
  std::vector<int64_t> position;     // index into each axis
  std::vector<Assignment> values;    // axis key -> value, in axis order
  std::vector<std::string> args;     // `exmy train` arguments: --config, --set ... (no --out, no threads)
  std::optional<int64_t> reference;  // index of the reference run
};

// Every run of the sweep, index i at position i. Threads are not part of a
// run (results do not depend on them): the runner adds train.threads.
std::vector<RunSpec> expand(const SweepSpec& spec);

// The pieces of a name (exposed for tests).
std::string sanitize_value(const std::string& value);
std::map<std::string, std::string> short_names(const std::vector<std::string>& keys);

}  // namespace exmy::sweep

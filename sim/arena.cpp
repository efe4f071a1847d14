#include "sim/arena.hpp"

#include "formats/error.hpp"

namespace exmy::sim {

int ArenaLayout::add(std::string name, std::vector<int64_t> shape, bool weight_decay, uint8_t init) {
  if (index_.count(name)) throw Error("parameter '" + name + "' registered twice");
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d <= 0) throw Error("parameter '" + name + "' has a non-positive dimension " + std::to_string(d));
    n *= d;
  }
  ParamView v;
  v.name = std::move(name);
  v.shape = std::move(shape);
  v.offset = size_;
  v.numel = n;
  v.weight_decay = weight_decay;
  v.init = init;
  size_ += align_up(n);
  num_params_ += n;
  const int i = static_cast<int>(views_.size());
  index_.emplace(v.name, i);
  views_.push_back(std::move(v));
  return i;
}

int ArenaLayout::find(std::string_view name) const {
  auto it = index_.find(std::string(name));
  return it == index_.end() ? -1 : it->second;
}

const ParamView& ArenaLayout::get(std::string_view name) const {
  const int i = find(name);
  if (i < 0) throw Error("no parameter named '" + std::string(name) + "'");
  return views_[static_cast<size_t>(i)];
}

}  // namespace exmy::sim

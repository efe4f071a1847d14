// The parameter arena: every parameter of a model lives in one contiguous
// buffer, and its gradient at the same offset of a second buffer of the same
// size. A model registers named views (name, shape, weight-decay flag) once in
// an ArenaLayout; the optimizer, gradient clipping, norms, statistics and
// checkpoints are then one loop over the arena (or over the views, where they
// need names), never a hand-kept list of tensors.
//
// Views start at multiples of kAlignElems elements. The padding between views
// is zero in both buffers and stays zero (nothing writes it), so a loop over
// the whole arena (a global gradient norm, an AdamW step) is still exact.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "sim/memory.hpp"
#include "sim/tensor.hpp"

namespace exmy::sim {

struct ParamView {
  std::string name;            // stable name, HF-style without the model prefix: "layers.3.mixer.in_proj.weight"
  std::vector<int64_t> shape;  // row-major
  int64_t offset = 0;          // first element in the arena
  int64_t numel = 0;           // product of shape
  bool weight_decay = true;    // false for norms, biases, A_log, D, dt_bias (the usual no-decay set)
  uint8_t init = 0;            // how the model initialises it (its own enum, models::ParamInit); 0 by default
};

class ArenaLayout {
 public:
  // Registers a view and returns its index. Throws exmy::Error on a duplicate
  // name or a non-positive dimension.
  int add(std::string name, std::vector<int64_t> shape, bool weight_decay, uint8_t init = 0);

  const std::vector<ParamView>& views() const { return views_; }
  const ParamView& view(int i) const { return views_.at(static_cast<size_t>(i)); }
  // The view named `name`; throws exmy::Error naming it when there is none.
  const ParamView& get(std::string_view name) const;
  // Index of the view named `name`, or -1.
  int find(std::string_view name) const;

  int64_t size() const { return size_; }                 // arena elements, padding included
  int64_t num_params() const { return num_params_; }     // sum of numel over views

 private:
  std::vector<ParamView> views_;
  std::unordered_map<std::string, int> index_;
  int64_t size_ = 0;
  int64_t num_params_ = 0;
};

template <class T>
class ParamArena {
 public:
  ParamArena() = default;
  // Parameters and gradients in `memory` (the host by default; a device
  // backend's memory for a model on the device), all zero.
  explicit ParamArena(ArenaLayout layout, Memory& memory = host_memory())
      : layout_(std::move(layout)), data_(memory, layout_.size()), grad_(memory, layout_.size()) {}

  Memory& memory() const { return data_.memory(); }
  const ArenaLayout& layout() const { return layout_; }

  T* param(int i) { return data_.data() + layout_.view(i).offset; }
  const T* param(int i) const { return data_.data() + layout_.view(i).offset; }
  T* grad(int i) { return grad_.data() + layout_.view(i).offset; }
  const T* grad(int i) const { return grad_.data() + layout_.view(i).offset; }
  T* param(std::string_view name) { return data_.data() + layout_.get(name).offset; }
  T* grad(std::string_view name) { return grad_.data() + layout_.get(name).offset; }

  // The whole arena, padding included (padding is always zero).
  std::span<T> params() { return {data_.data(), static_cast<size_t>(data_.size())}; }
  std::span<const T> params() const { return {data_.data(), static_cast<size_t>(data_.size())}; }
  std::span<T> grads() { return {grad_.data(), static_cast<size_t>(grad_.size())}; }
  std::span<const T> grads() const { return {grad_.data(), static_cast<size_t>(grad_.size())}; }

  void zero_grad() { grad_.zero(); }

 private:
  ArenaLayout layout_;
  MemBuf<T> data_;
  MemBuf<T> grad_;
};

}  // namespace exmy::sim

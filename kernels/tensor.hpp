// A float tensor with a shape: either owning its storage or a view into someone else's, such as
// a layer's slice of the flat parameter buffer.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "kernels/graph.hpp"

namespace gg::kernels {

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(Dims shape) : shape_(std::move(shape)), storage_(numel(shape_), 0.f) {
    data_ = storage_.data();
  }
  static Tensor view(float* data, Dims shape) {
    Tensor t;
    t.shape_ = std::move(shape);
    t.data_ = data;
    return t;
  }
  Tensor(const Tensor& o) : shape_(o.shape_), storage_(o.storage_), data_(o.data_) {
    if (o.owning()) data_ = storage_.data();
  }
  Tensor& operator=(const Tensor& o) {
    if (this != &o) *this = Tensor(o);
    return *this;
  }
  Tensor(Tensor&&) noexcept = default;  // a moved vector keeps its buffer, so data_ stays valid
  Tensor& operator=(Tensor&&) noexcept = default;

  bool owning() const { return !storage_.empty(); }
  const Dims& shape() const { return shape_; }
  int64_t size() const { return numel(shape_); }
  float* data() { return data_; }
  const float* data() const { return data_; }
  float& operator[](int64_t i) { return data_[i]; }
  float operator[](int64_t i) const { return data_[i]; }
  float* begin() { return data_; }
  float* end() { return data_ + size(); }

 private:
  Dims shape_;
  std::vector<float> storage_;
  float* data_ = nullptr;
};

// Whether every one of the n values at p is a finite number (no NaN, no inf).
inline bool all_finite(const float* p, int64_t n) {
  return std::all_of(p, p + n, [](float v) { return std::isfinite(v); });
}
inline bool all_finite(const std::vector<float>& v) {
  return all_finite(v.data(), static_cast<int64_t>(v.size()));
}

}  // namespace gg::kernels

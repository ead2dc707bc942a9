// FlashAttention, step by step — core/tensor.h
// A host tensor: a shape and a flat, row-major (C order) vector. Every stage exchanges float32 tensors
// through the harness; `TensorT<double>` holds the fp64 reference.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace fa {

template <typename T>
struct TensorT {
  std::vector<int64_t> shape;
  std::vector<T> data;

  TensorT() = default;
  explicit TensorT(std::vector<int64_t> s, T fill = T(0)) : shape(std::move(s)), data(count(shape), fill) {}

  static size_t count(const std::vector<int64_t>& s) {
    size_t n = 1;
    for (int64_t e : s) n *= size_t(e);
    return n;
  }
  size_t size() const { return data.size(); }
  bool empty() const { return data.empty(); }
  T* ptr() { return data.data(); }
  const T* ptr() const { return data.data(); }
};

using Tensor = TensorT<float>;

std::string shape_str(const std::vector<int64_t>& s);  // "[2, 8, 128, 64]"

}  // namespace fa

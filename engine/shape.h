// A tensor's extents, outermost first. Tensors are contiguous and row-major.
// Every Shape is checked when it is made: the product of its nonzero extents fits in int64,
// so numel() and every row-major stride are exact. bytes() checks the size in bytes the
// same way (it must fit in int64, the size NumPy and the buffer protocol can index).
#pragma once
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "engine/error.h"

namespace belay {

class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims) : dims_(dims) { numel_ = checked_numel(dims_); }
  explicit Shape(std::vector<int64_t> dims) : dims_(std::move(dims)) { numel_ = checked_numel(dims_); }

  size_t rank() const { return dims_.size(); }
  int64_t operator[](size_t i) const { return dims_[i]; }
  const std::vector<int64_t>& dims() const { return dims_; }
  int64_t numel() const { return numel_; }
  // numel() * element_size, or a UsageError when it (or the nonzero extents' product times
  // element_size, which bounds every stride) does not fit in int64.
  int64_t bytes(size_t element_size) const {
    int64_t n;
    if (__builtin_mul_overflow(nonzero_product(dims_), static_cast<int64_t>(element_size), &n))
      throw UsageError("shape " + str() + " of " + std::to_string(element_size) +
                       "-byte elements needs more than 2^63 bytes: no tensor can be that large");
    return numel_ == 0 ? 0 : n;
  }
  bool operator==(const Shape& o) const { return dims_ == o.dims_; }
  bool operator!=(const Shape& o) const { return dims_ != o.dims_; }
  std::string str() const { return str(dims_); }
  static std::string str(const std::vector<int64_t>& dims) {
    std::string s = "[";
    for (size_t i = 0; i < dims.size(); ++i) {
      if (i) s += ", ";
      s += std::to_string(dims[i]);
    }
    return s + "]";
  }

  // The element count of `dims`, or a UsageError naming the shape when the product of its
  // nonzero extents overflows int64 (the one overflow check every shape goes through).
  static int64_t checked_numel(const std::vector<int64_t>& dims) {
    nonzero_product(dims);
    int64_t n = 1;
    for (int64_t d : dims) n *= d;  // exact: |n| <= the nonzero product, or 0
    return n;
  }

 private:
  static int64_t nonzero_product(const std::vector<int64_t>& dims) {
    int64_t n = 1;
    for (int64_t d : dims)
      if (d != 0 && __builtin_mul_overflow(n, d, &n))
        throw UsageError("shape " + str(dims) + " has more elements than fit in 64 bits (2^63 - 1 at most)");
    return n;
  }

  std::vector<int64_t> dims_;
  int64_t numel_ = 1;
};

}  // namespace belay

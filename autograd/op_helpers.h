// Internal to autograd: the small helpers the op files (ops.cpp, math_ops.cpp, nn_ops.cpp,
// batched_ops.cpp) share: a tensor's backend, the dtype of a mixed pair, a run of dims'
// product, and where a backward kernel writes an input's gradient.
#pragma once
#include <cstdint>
#include <vector>

#include "autograd/cast_census.h"
#include "autograd/graph.h"
#include "engine/backend.h"

namespace belay {

inline const Backend& be(const Tensor& t) { return backend_for(t.device()); }

// The dtype an elementwise op of two inputs produces: theirs when they agree, else FP32.
inline DType promote(DType a, DType b) { return a == b ? a : DType::F32; }

// d[begin] * ... * d[end - 1] (1 for an empty run): the sizes of an axis view.
inline int64_t dims_product(const std::vector<int64_t>& d, size_t begin, size_t end) {
  int64_t n = 1;
  for (size_t i = begin; i < end; ++i) n *= d[i];
  return n;
}

// Where a backward kernel writes node n's gradient: straight into n's FP32 gradient when it
// has one (the kernel adds to it: no extra pass over memory), else into a fresh tensor that
// finish() hands to accumulate_grad (which adopts it as the first gradient or converts it).
class GradTarget {
 public:
  GradTarget() = default;  // no gradient wanted
  // n may be null (no such input). zeroed: the fresh tensor starts at 0, for a kernel that
  // can only add; otherwise the kernel must write all of it (accumulate() is false).
  GradTarget(Node* n, DType fresh_dtype, bool zeroed = false) {
    if (!n || !n->requires_grad) return;
    node_ = n;
    into_grad_ = n->grad.defined() && n->grad.dtype() == DType::F32;
    if (into_grad_) return;
    // A leaf's FP16/BF16 gradient under a cast census: the kernel writes FP32, and finish()
    // rounds it into fresh_dtype through the census (the bits the kernel's own rounding gives).
    census_ = n->is_leaf ? active_cast_census() : nullptr;
    if (census_ && counted_cast(DType::F32, fresh_dtype)) {
      counted_dtype_ = fresh_dtype;
      fresh_dtype = DType::F32;
    }
    fresh_ = zeroed ? Tensor::zeros(n->value.shape(), fresh_dtype, n->value.device())
                    : Tensor::empty(n->value.shape(), fresh_dtype, n->value.device());
  }
  // The tensor the kernel writes, or null when no gradient is wanted.
  Tensor* out() { return !node_ ? nullptr : into_grad_ ? &node_->grad : &fresh_; }
  // Whether out() already holds a gradient the kernel must add to.
  bool accumulate() const { return into_grad_; }
  // After the kernel: a fresh tensor goes to the node (n's own gradient needs nothing more).
  void finish() {
    if (!node_ || into_grad_) return;
    if (counted_dtype_ != DType::F32)
      fresh_ = cast_counted(census_, CastSite::GradBuffer, fresh_, counted_dtype_, node_->name);
    accumulate_grad(*node_, fresh_, true);
  }

 private:
  Node* node_ = nullptr;
  bool into_grad_ = false;
  Tensor fresh_;
  CastCensus* census_ = nullptr;
  DType counted_dtype_ = DType::F32;  // the dtype fresh_ is rounded into by finish(); F32: none
};

// A gradient that one kernel call produces: produce(out, accumulate) writes the gradient into
// `out`, or adds it there when accumulate is true.
template <class Produce>
void write_grad(Node& n, DType fresh_dtype, Produce&& produce) {
  GradTarget target(&n, fresh_dtype);
  if (Tensor* out = target.out()) {
    produce(*out, target.accumulate());
    target.finish();
  }
}

}  // namespace belay

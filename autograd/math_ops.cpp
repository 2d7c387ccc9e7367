// The operators of the Python Var (apps/python/bind_var_math.cpp) as differentiable ops:
// broadcasting arithmetic, the elementwise functions of UnaryOp, softmax and log-softmax over
// the last dim, sums over an axis, and the shape ops (transpose, reshape, rows). Each forward
// and backward is a backend op (engine/backend.h), so each runs on every device.
#include <algorithm>
#include <string>

#include "amp/autocast.h"
#include "autograd/autocast_input.h"
#include "autograd/op_helpers.h"
#include "autograd/ops.h"
#include "engine/error.h"

namespace belay {
namespace {

const char* op_name(BinaryOp op) {
  switch (op) {
    case BinaryOp::Add: return "add";
    case BinaryOp::Sub: return "sub";
    case BinaryOp::Mul: return "mul";
    default: return "div";
  }
}

OpClass op_class(BinaryOp op) {
  switch (op) {
    case BinaryOp::Add: return OpClass::Add;
    case BinaryOp::Sub: return OpClass::Sub;
    case BinaryOp::Mul: return OpClass::Mul;
    default: return OpClass::Div;
  }
}

// How `small` broadcasts over `full` (see binary() in ops.h), as an axis view of full; throws
// when it does not. Equal shapes are the view {n, 1, 1}: nothing is broadcast.
AxisView broadcast_view(const char* op, const Tensor& full_t, const Tensor& small_t) {
  const Shape& full = full_t.shape();
  const Shape& small = small_t.shape();
  const std::vector<int64_t>& f = full.dims();
  std::vector<int64_t> s = small.dims();
  const int64_t n = full.numel();
  if (full == small) return {n, 1, 1};
  if (small.numel() == 1) return {1, n, 1};
  if (s.size() == f.size()) {  // one run of adjacent dims where small has 1 and full does not
    size_t first = f.size(), last = 0;
    bool fits = true;
    for (size_t d = 0; d < f.size(); ++d) {
      if (s[d] == f[d]) continue;
      if (s[d] != 1) fits = false;
      first = std::min(first, d);
      last = d;
    }
    for (size_t d = first; fits && d <= last; ++d) fits = s[d] == 1;
    if (fits) return {dims_product(f, 0, first), dims_product(f, first, last + 1), dims_product(f, last + 1, f.size())};
  }
  while (!s.empty() && s.front() == 1) s.erase(s.begin());  // [1, N] over [M, K, N] is a row too
  if (s.size() <= f.size() && std::equal(s.begin(), s.end(), f.end() - static_cast<std::ptrdiff_t>(s.size()))) {
    const int64_t inner = Shape(s).numel();
    return {1, n / inner, inner};
  }
  const auto name = [](const Tensor& t) { return std::string(dtype_name(t.dtype())) + t.shape().str(); };
  throw UsageError(std::string(op) + ": shape mismatch, cannot broadcast " + name(small_t) + " over " + name(full_t) +
              "; belay broadcasts a one-element value, a row (the trailing dims) or one run of dims of extent 1");
}

// out = full op small (swapped: small op full), out shaped like full and of dtype dt.
Tensor apply_binary(BinaryOp op, const Tensor& full, const Tensor& small, const AxisView& view, bool swapped, DType dt) {
  Tensor out = Tensor::empty(full.shape(), dt, full.device());
  if (view.len == 1)
    be(out).binary(op, swapped ? small.reshape(full.shape()) : full, swapped ? full : small.reshape(full.shape()), out);
  else
    be(out).binary_broadcast(op, full, small, view, swapped, out);
  return out;
}

// alpha * g summed down to the reduced operand's shape (its gradient), in dtype dt.
Tensor reduce_grad(const Tensor& g, const AxisView& view, float alpha, const Shape& shape, DType dt) {
  Tensor out = Tensor::empty(shape, dt, g.device());
  if (view.len == 1)
    be(out).scale(g.reshape(shape), alpha, out);
  else
    be(out).sum_axis(g, view, alpha, out, false);
  return out;
}

// The gradients of out = a op b where `full` (a, or b when swapped) has out's shape and the other
// broadcasts along `view`. g: d out; y: out's value.
void binary_backward(BinaryOp op, Node& full, Node& small, const AxisView& view, bool swapped, const Tensor& g,
                     const Tensor& y) {
  const Tensor& f = full.value;
  const Tensor& s = small.value;
  Node& a = swapped ? small : full;
  Node& b = swapped ? full : small;
  // d out / d a and d out / d b, each as a full-shaped tensor (then reduced for the small one).
  auto grad_a_full = [&]() -> Tensor {
    if (op == BinaryOp::Add || op == BinaryOp::Sub) return g;
    if (op == BinaryOp::Mul) return swapped ? apply_binary(BinaryOp::Mul, g, f, {g.numel(), 1, 1}, false, g.dtype())
                                            : apply_binary(BinaryOp::Mul, g, s, view, false, g.dtype());
    return swapped ? apply_binary(BinaryOp::Div, g, f, {g.numel(), 1, 1}, false, g.dtype())   // g / b
                   : apply_binary(BinaryOp::Div, g, s, view, false, g.dtype());
  };
  auto grad_b_full = [&]() -> Tensor {  // Sub: -g; Mul: g a; Div: -g y / b (alpha -1 applied later)
    if (op == BinaryOp::Add || op == BinaryOp::Sub) return g;
    if (op == BinaryOp::Mul) return swapped ? apply_binary(BinaryOp::Mul, g, s, view, false, g.dtype())
                                            : apply_binary(BinaryOp::Mul, g, f, {g.numel(), 1, 1}, false, g.dtype());
    const Tensor gy = apply_binary(BinaryOp::Mul, g, y, {g.numel(), 1, 1}, false, DType::F32);
    return swapped ? apply_binary(BinaryOp::Div, gy, f, {g.numel(), 1, 1}, false, DType::F32)
                   : apply_binary(BinaryOp::Div, gy, s, view, false, DType::F32);
  };
  const float b_sign = op == BinaryOp::Sub || op == BinaryOp::Div ? -1.0f : 1.0f;
  if (a.requires_grad) {
    const Tensor d = grad_a_full();
    if (swapped) accumulate_grad(a, reduce_grad(d, view, 1.0f, a.value.shape(), a.value.dtype()), true);
    else accumulate_grad(a, d, d.data() != g.data());
  }
  if (b.requires_grad) {
    const Tensor d = grad_b_full();
    if (!swapped) {
      accumulate_grad(b, reduce_grad(d, view, b_sign, b.value.shape(), b.value.dtype()), true);
    } else if (b_sign != 1.0f) {
      Tensor neg_d = Tensor::empty(d.shape(), b.value.dtype(), d.device());
      be(d).scale(d, b_sign, neg_d);
      accumulate_grad(b, neg_d, true);
    } else {
      accumulate_grad(b, d, d.data() != g.data());
    }
  }
}

Var unary_op(UnaryOp op, float p, const Var& x_in, OpClass cls, const char* name) {
  if (!x_in.defined()) throw Error(std::string(name) + ": undefined input");
  const Var x = autocast_input(x_in, cls);
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  be(y).unary(op, p, x.value(), y);
  return make_result(y, name, {x}, [op, p](Node& self) {
    Node& x = *self.inputs[0];
    Tensor d = Tensor::empty(x.value.shape(), x.value.dtype(), x.value.device());
    be(d).unary_backward(op, p, x.value, self.value, self.grad, d);
    accumulate_grad(x, d, true);
  });
}

Var softmax_op(const Var& x_in, bool log, bool causal) {
  const char* name = log ? "log_softmax" : "softmax";
  if (!x_in.defined()) throw Error(std::string(name) + ": undefined input");
  const Var x = autocast_input(x_in, log ? OpClass::LogSoftmax : OpClass::Softmax);
  const Shape& s = x.shape();
  if (s.rank() == 0 || s[s.rank() - 1] == 0) throw UsageError(std::string(name) + ": needs a last dim, got " + x.value().describe());
  const int64_t cols = s[s.rank() - 1];
  if (causal && (s.rank() < 2 || s[s.rank() - 2] != cols))
    throw UsageError(std::string(name) + ": a causal mask needs square scores [..., T, T], got " + x.value().describe());
  Tensor y = Tensor::empty(s, x.dtype(), x.device());
  be(y).softmax(x.value(), cols, log, causal, y);
  return make_result(y, name, {x}, [cols, log, causal](Node& self) {
    Node& x = *self.inputs[0];
    Tensor d = Tensor::empty(x.value.shape(), x.value.dtype(), x.value.device());
    be(d).softmax_backward(self.value, self.grad, cols, log, causal, d);
    accumulate_grad(x, d, true);
  }, BackwardReads{0u, true});
}

Var sum_axis_op(const Var& x, int64_t axis, bool keepdim, bool mean) {
  const char* name = mean ? "mean" : "sum";
  if (!x.defined()) throw Error(std::string(name) + ": undefined input");
  const std::vector<int64_t>& d = x.shape().dims();
  const int64_t rank = static_cast<int64_t>(d.size());
  if (axis < -rank || axis >= rank)
    throw UsageError(std::string(name) + ": axis " + std::to_string(axis) + " is out of range for " + x.value().describe());
  const size_t a = static_cast<size_t>(axis < 0 ? axis + rank : axis);
  const AxisView view{dims_product(d, 0, a), d[a], dims_product(d, a + 1, d.size())};
  std::vector<int64_t> out_dims = d;
  if (keepdim) out_dims[a] = 1;
  else out_dims.erase(out_dims.begin() + static_cast<std::ptrdiff_t>(a));
  // An empty axis: alpha = inf and a sum of 0, so the mean is NaN, as NumPy's mean of nothing.
  const float alpha = mean ? 1.0f / static_cast<float>(view.len) : 1.0f;
  Tensor out = Tensor::empty(Shape(out_dims), DType::F32, x.device());
  be(out).sum_axis(x.value(), view, alpha, out, false);
  return make_result(out, name, {x}, [view, alpha](Node& self) {
    Node& x = *self.inputs[0];
    Tensor dx = Tensor::empty(x.value.shape(), x.value.dtype(), x.value.device());
    be(dx).broadcast_axis(self.grad, view, alpha, dx);
    accumulate_grad(x, dx, true);
  }, kReadsNothing);
}

}  // namespace

// What binary_backward reads: nothing for + and -, both inputs for *, and the output too for /.
static BackwardReads binary_reads(BinaryOp op) {
  if (op == BinaryOp::Add || op == BinaryOp::Sub) return kReadsNothing;
  return {0b11u, op == BinaryOp::Div};
}

Var binary(BinaryOp op, const Var& a_in, const Var& b_in) {
  const char* name = op_name(op);
  if (!a_in.defined() || !b_in.defined()) throw Error(std::string(name) + ": undefined input");
  check_same_device(name, a_in.value(), b_in.value());
  const Var a = autocast_input(a_in, op_class(op)), b = autocast_input(b_in, op_class(op));
  // The operand with more elements sets the shape (the first when they tie).
  const bool swapped = b.value().numel() > a.value().numel() ||
                       (b.value().numel() == a.value().numel() && b.shape().rank() > a.shape().rank());
  const Var& full = swapped ? b : a;
  const Var& small = swapped ? a : b;
  const AxisView view = broadcast_view(name, full.value(), small.value());
  Tensor out = apply_binary(op, full.value(), small.value(), view, swapped, promote(a.dtype(), b.dtype()));
  return make_result(out, name, {full, small}, [op, view, swapped](Node& self) {
    binary_backward(op, *self.inputs[0], *self.inputs[1], view, swapped, self.grad, self.value);
  }, binary_reads(op));
}

Var sub(const Var& a, const Var& b) { return binary(BinaryOp::Sub, a, b); }
Var div(const Var& a, const Var& b) { return binary(BinaryOp::Div, a, b); }
Var neg(const Var& x) { return scale(x, -1.0f); }

Var exp(const Var& x) { return unary_op(UnaryOp::Exp, 0.0f, x, OpClass::Exp, "exp"); }
Var log(const Var& x) { return unary_op(UnaryOp::Log, 0.0f, x, OpClass::Log, "log"); }
Var tanh(const Var& x) { return unary_op(UnaryOp::Tanh, 0.0f, x, OpClass::Tanh, "tanh"); }
Var sigmoid(const Var& x) { return unary_op(UnaryOp::Sigmoid, 0.0f, x, OpClass::Sigmoid, "sigmoid"); }
Var pow(const Var& x, float p) { return unary_op(UnaryOp::Pow, p, x, OpClass::Pow, "pow"); }

Var softmax(const Var& x, bool causal) { return softmax_op(x, false, causal); }
Var log_softmax(const Var& x, bool causal) { return softmax_op(x, true, causal); }

Var sum(const Var& x, int64_t axis, bool keepdim) { return sum_axis_op(x, axis, keepdim, false); }
Var mean(const Var& x, int64_t axis, bool keepdim) { return sum_axis_op(x, axis, keepdim, true); }

Var transpose(const Var& x) {
  if (!x.defined() || x.shape().rank() != 2)
    throw UsageError("transpose: needs a matrix [M, N], got " + (x.defined() ? x.value().describe() : std::string("nothing")));
  Tensor out = Tensor::empty(Shape{x.shape()[1], x.shape()[0]}, x.dtype(), x.device());
  be(out).transpose(x.value(), out);
  return make_result(out, "transpose", {x}, [](Node& self) {
    Node& x = *self.inputs[0];
    Tensor d = Tensor::empty(x.value.shape(), self.grad.dtype(), self.grad.device());
    be(d).transpose(self.grad, d);
    accumulate_grad(x, d, true);
  }, kReadsNothing);
}

Var reshape(const Var& x, const std::vector<int64_t>& dims_in) {
  if (!x.defined()) throw Error("reshape: undefined input");
  std::vector<int64_t> dims = dims_in;
  int64_t known = 1, infer = -1;
  for (size_t i = 0; i < dims.size(); ++i) {
    if (dims[i] == -1 && infer < 0) infer = static_cast<int64_t>(i);
    else if (dims[i] < 0) throw UsageError("reshape: extent " + std::to_string(dims[i]) + " in " + Shape::str(dims_in) + " (only one -1 may be inferred)");
    else known = Shape::checked_numel({known, dims[i]});
  }
  const int64_t n = x.value().numel();
  if (infer >= 0) {
    if (known == 0 || n % known != 0)
      throw UsageError("reshape: cannot infer the -1 of " + Shape::str(dims_in) + " for " + x.value().describe());
    dims[static_cast<size_t>(infer)] = n / known;
  }
  const Shape shape(dims);
  if (shape.numel() != n)
    throw UsageError("reshape: " + x.value().describe() + " has " + std::to_string(n) + " elements, " + shape.str() + " holds " +
                std::to_string(shape.numel()));
  return make_result(x.value().reshape(shape), "reshape", {x}, [](Node& self) {
    Node& x = *self.inputs[0];
    // Handed on, not copied: a node's gradient is its own (adopted or cloned into it) and is
    // dropped once its backward has run (Var::backward), so x may keep the buffer.
    accumulate_grad(x, self.grad.reshape(x.value.shape()), true);
  }, kReadsNothing);
}

Var slice_rows(const Var& x, int64_t begin, int64_t end) {
  if (!x.defined()) throw Error("slice_rows: undefined input");
  Tensor out = x.value().copy_rows(begin, end);  // checks the range
  return make_result(out, "slice_rows", {x}, [begin](Node& self) {
    Node& x = *self.inputs[0];
    const Tensor& g = self.grad;
    Tensor d = Tensor::zeros(x.value.shape(), g.dtype(), g.device());
    const size_t row_bytes = x.value.dim(0) ? d.nbytes() / static_cast<size_t>(x.value.dim(0)) : 0;
    be(d).copy_bytes(static_cast<char*>(d.data()) + static_cast<size_t>(begin) * row_bytes, d.device(), g.data(),
                     g.device(), g.nbytes());
    accumulate_grad(x, d, true);
  }, kReadsNothing);
}

Var select_row(const Var& x, int64_t index) {
  if (!x.defined() || x.shape().rank() == 0)
    throw UsageError("select_row: needs a value with a first dim, got " + (x.defined() ? x.value().describe() : std::string("nothing")));
  const int64_t rows = x.shape()[0];
  if (index < -rows || index >= rows)
    throw UsageError("index " + std::to_string(index) + " is out of range for dim 0 of " + x.value().describe());
  const int64_t i = index < 0 ? index + rows : index;
  std::vector<int64_t> dims(x.shape().dims().begin() + 1, x.shape().dims().end());
  return reshape(slice_rows(x, i, i + 1), dims);
}

}  // namespace belay

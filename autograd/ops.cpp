#include "autograd/ops.h"

#include <cstring>
#include <string>

#include "amp/autocast.h"
#include "autograd/autocast_input.h"
#include "autograd/cast_census.h"
#include "autograd/op_helpers.h"
#include "engine/error.h"

namespace belay {
namespace {

void check_inputs(const char* op, const Var& a, const Var& b) {
  if (!a.defined() || !b.defined()) throw Error(std::string(op) + ": undefined input");
  check_same_device(op, a.value(), b.value());
}

// Under autocast, the dtype matrix products run in (the table's rule for the class: the
// autocast dtype, or FP32 for a class kept out of it with --fp32-ops); otherwise the
// inputs' own (which must agree).
DType matmul_dtype(const char* op, OpClass cls, const Var& a, const Var& b) {
  const AutocastRule rule = autocast_rule(cls);
  if (rule == AutocastRule::Fp32) return DType::F32;
  if (rule == AutocastRule::LowPrecision) return autocast_policy().dtype;
  if (a.dtype() != b.dtype())
    throw UsageError(std::string(op) + ": dtypes differ (" + a.value().describe() + " vs " + b.value().describe() +
                "); cast one, or run under autocast");
  return a.dtype();
}

void gemm(const Tensor& a, bool ta, const Tensor& b, bool tb, Tensor& c, bool accumulate, const Tensor* bias = nullptr) {
  GemmArgs args;
  args.a = &a;
  args.trans_a = ta;
  args.b = &b;
  args.trans_b = tb;
  args.c = &c;
  args.beta = accumulate ? 1.0f : 0.0f;
  args.bias = bias;
  be(c).gemm(args);
}

void check_matrix(const char* op, const char* what, const Tensor& t) {
  if (t.rank() != 2) throw UsageError(std::string(op) + ": " + what + " must be a matrix, got " + t.describe());
}

// "cast for linear", ...: one string per op class of the table, made once and never freed
// (Node::op points at it).
const char* cast_op_name(OpClass cls) {
  static const std::vector<std::pair<OpClass, std::string>> names = [] {
    std::vector<std::pair<OpClass, std::string>> out;
    size_t n = 0;
    const AutocastEntry* table = autocast_table(&n);
    for (size_t i = 0; i < n; ++i) out.emplace_back(table[i].op, std::string("cast for ") + table[i].name);
    return out;
  }();
  for (const auto& [op, name] : names)
    if (op == cls) return name.c_str();
  return "cast";
}

}  // namespace

DType autocast_dtype(OpClass cls, DType given) {
  switch (autocast_rule(cls)) {
    case AutocastRule::Fp32: return DType::F32;
    case AutocastRule::LowPrecision: return autocast_policy().dtype;
    default: return given;
  }
}

// Where a counted cast is (autograd/cast_census.h): a named leaf by its name, any other value
// by the module it is cast in, the op class and the operand: "blocks.0.mlp.fc.linear.input".
std::string cast_site(const Var& x, OpClass cls, const char* operand) {
  if (x.node_ptr()->is_leaf && !x.name().empty()) return x.name();
  const char* path = current_module_path();
  const char* op = cast_op_name(cls) + std::strlen("cast for ");
  return (*path ? std::string(path) + "." : std::string()) + op + "." + operand;
}

// The node of a cast of x. Its backward hands its own gradient on (dropped after this backward
// runs: Var::backward); from an input whose gradient is FP32 that gradient is kept in FP32
// (Node::fp32_grad), so nothing is rounded to the narrow dtype on the way back.
static Var cast_result(Tensor out, const char* op, const Var& x) {
  Var r = make_result(
      std::move(out), op, {x}, [](Node& self) { accumulate_grad(*self.inputs[0], self.grad, true); }, kReadsNothing);
  if (r.node_ptr() && grad_dtype_of(*x.node_ptr()) == DType::F32) r.node_ptr()->fp32_grad = true;
  return r;
}

Var autocast_cast(const Var& x, DType dtype, OpClass cls, const char* operand) {
  if (x.dtype() == dtype) return x;
  CastCensus* census = active_cast_census();
  Tensor out = census && census->counts_forward() ? cast_counted(census, CastSite::Forward, x.value(), dtype, cast_site(x, cls, operand))
                      : x.value().to(dtype);
  return cast_result(out, cast_op_name(cls), x);
}

Var autocast_input(const Var& x, OpClass cls) { return autocast_cast(x, autocast_dtype(cls, x.dtype()), cls, "input"); }

Var cast(const Var& x, DType dtype) { return cast_result(x.value().to(dtype), "cast", x); }

Var matmul(const Var& a_in, const Var& b_in) {
  check_inputs("matmul", a_in, b_in);
  check_matrix("matmul", "a", a_in.value());
  check_matrix("matmul", "b", b_in.value());
  if (a_in.shape()[1] != b_in.shape()[0])
    throw UsageError("matmul: inner sizes differ, " + a_in.value().describe() + " x " + b_in.value().describe());
  const DType dt = matmul_dtype("matmul", OpClass::Matmul, a_in, b_in);
  const Var a = autocast_cast(a_in, dt, OpClass::Matmul, "a"), b = autocast_cast(b_in, dt, OpClass::Matmul, "b");
  Tensor out = Tensor::empty(Shape{a.shape()[0], b.shape()[1]}, dt, a.device());
  gemm(a.value(), false, b.value(), false, out, false);
  return make_result(out, "matmul", {a, b}, [](Node& self) {
    Node& a = *self.inputs[0];
    Node& b = *self.inputs[1];
    const Tensor g = self.grad.dtype() == a.value.dtype() ? self.grad : self.grad.to(a.value.dtype());
    write_grad(a, grad_dtype_of(a), [&](Tensor& out, bool acc) { gemm(g, false, b.value, true, out, acc); });
    write_grad(b, grad_dtype_of(b), [&](Tensor& out, bool acc) { gemm(a.value, true, g, false, out, acc); });
  }, reads_inputs(0b11));
}

Var linear(const Var& x_in, const Var& w_in, const Var& bias) {
  check_inputs("linear", x_in, w_in);
  check_matrix("linear", "input", x_in.value());
  check_matrix("linear", "weight", w_in.value());
  if (x_in.shape()[1] != w_in.shape()[1])
    throw UsageError("linear: input " + x_in.value().describe() + " has " + std::to_string(x_in.shape()[1]) +
                " features, weight " + w_in.value().describe() + " expects " + std::to_string(w_in.shape()[1]));
  if (bias.defined()) {
    check_same_device("linear", x_in.value(), bias.value());
    if (bias.value().numel() != w_in.shape()[0])
      throw UsageError("linear: bias " + bias.value().describe() + " does not match weight " + w_in.value().describe());
  }
  const DType dt = matmul_dtype("linear", OpClass::Linear, x_in, w_in);
  const Var x = autocast_cast(x_in, dt, OpClass::Linear, "input"),
            w = autocast_cast(w_in, dt, OpClass::Linear, "weight");
  Tensor out = Tensor::empty(Shape{x.shape()[0], w.shape()[0]}, dt, x.device());
  // Y = X W^T + b, the bias added in FP32 before the one rounding.
  gemm(x.value(), false, w.value(), true, out, false, bias.defined() ? &bias.value() : nullptr);
  std::vector<Var> inputs{x, w};
  if (bias.defined()) inputs.push_back(bias);
  return make_result(out, "linear", inputs, [](Node& self) {
    Node& x = *self.inputs[0];
    Node& w = *self.inputs[1];
    const Tensor& g = self.grad;  // dY, in the compute dtype
    write_grad(x, grad_dtype_of(x), [&](Tensor& out, bool acc) { gemm(g, false, w.value, false, out, acc); });  // dX = dY W
    write_grad(w, grad_dtype_of(w), [&](Tensor& out, bool acc) { gemm(g, true, x.value, false, out, acc); });   // dW = dY^T X
    if (self.inputs.size() > 2) {
      Node& b = *self.inputs[2];
      write_grad(b, DType::F32, [&](Tensor& out, bool acc) {
        if (out.dtype() == DType::F32) {
          be(g).sum_rows(g, out, acc);
        } else {
          Tensor tmp = Tensor::empty(out.shape(), DType::F32, out.device());
          be(g).sum_rows(g, tmp, false);
          be(out).accumulate(out, tmp, 1.0f, nullptr);
        }
      });
    }
  }, reads_inputs(0b011));  // x and W; not the bias, not Y
}

Var add(const Var& a_in, const Var& b_in) {
  check_inputs("add", a_in, b_in);
  if (a_in.shape() != b_in.shape()) return binary(BinaryOp::Add, a_in, b_in);  // broadcasting (math_ops.cpp)
  const Var a = autocast_input(a_in, OpClass::Add), b = autocast_input(b_in, OpClass::Add);
  check_same_shape("add", a.value(), b.value());
  Tensor out = Tensor::empty(a.shape(), promote(a.dtype(), b.dtype()), a.device());
  be(out).binary(BinaryOp::Add, a.value(), b.value(), out);
  return make_result(out, "add", {a, b}, [](Node& self) {
    // a takes this node's own gradient (dropped after this backward: Var::backward), b a copy,
    // made before anything adds into a's (add(x, x): x's gradient becomes g + g in place).
    accumulate_grad(*self.inputs[0], self.grad, true);
    accumulate_grad(*self.inputs[1], self.grad, false);
  }, kReadsNothing);
}

Var mul(const Var& a_in, const Var& b_in) {
  check_inputs("mul", a_in, b_in);
  if (a_in.shape() != b_in.shape()) return binary(BinaryOp::Mul, a_in, b_in);
  const Var a = autocast_input(a_in, OpClass::Mul), b = autocast_input(b_in, OpClass::Mul);
  check_same_shape("mul", a.value(), b.value());
  Tensor out = Tensor::empty(a.shape(), promote(a.dtype(), b.dtype()), a.device());
  be(out).binary(BinaryOp::Mul, a.value(), b.value(), out);
  return make_result(out, "mul", {a, b}, [](Node& self) {
    Node& a = *self.inputs[0];
    Node& b = *self.inputs[1];
    for (auto [target, other] : {std::pair{&a, &b}, std::pair{&b, &a}}) {
      if (!target->requires_grad) continue;
      Tensor d = Tensor::empty(target->value.shape(), target->value.dtype(), target->value.device());
      be(d).binary(BinaryOp::Mul, self.grad, other->value, d);
      accumulate_grad(*target, d, true);
    }
  }, reads_inputs(0b11));
}

Var scale(const Var& a_in, float s) {
  const Var a = autocast_input(a_in, OpClass::Scale);
  Tensor out = Tensor::empty(a.shape(), a.dtype(), a.device());
  be(out).scale(a.value(), s, out);
  return make_result(out, "scale", {a}, [s](Node& self) {
    Node& a = *self.inputs[0];
    Tensor d = Tensor::empty(a.value.shape(), a.value.dtype(), a.value.device());
    be(d).scale(self.grad, s, d);
    accumulate_grad(a, d, true);
  }, kReadsNothing);
}

static Var activation_op(const Var& x_in, Activation act, const char* name) {
  const Var x = autocast_input(x_in, act == Activation::Relu ? OpClass::Relu : OpClass::Gelu);
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  be(out).activation(act, x.value(), out);
  return make_result(out, name, {x}, [act](Node& self) {
    Node& x = *self.inputs[0];
    Tensor d = Tensor::empty(x.value.shape(), x.value.dtype(), x.value.device());
    be(d).activation_backward(act, x.value, self.grad, d);
    accumulate_grad(x, d, true);
  }, reads_inputs(0b1));
}

Var relu(const Var& x) { return activation_op(x, Activation::Relu, "relu"); }
Var gelu(const Var& x) { return activation_op(x, Activation::Gelu, "gelu"); }
Var gelu_tanh(const Var& x) { return activation_op(x, Activation::GeluTanh, "gelu_tanh"); }
Var activation(const Var& x, Activation act) {
  return act == Activation::Relu ? relu(x) : act == Activation::Gelu ? gelu(x) : gelu_tanh(x);
}

static Var reduce_op(const Var& x, float factor, const char* name) {
  Tensor out = Tensor::empty(Shape{1}, DType::F32, x.device());
  be(out).sum(x.value(), out);
  if (factor != 1.0f) be(out).scale(out, factor, out);
  return make_result(out, name, {x}, [factor](Node& self) {
    Node& x = *self.inputs[0];
    Tensor d = Tensor::empty(x.value.shape(), x.value.dtype(), x.value.device());
    be(d).broadcast_scalar(self.grad, factor, d);
    accumulate_grad(x, d, true);
  }, kReadsNothing);
}

Var sum(const Var& x) { return reduce_op(x, 1.0f, "sum"); }
Var mean(const Var& x) { return reduce_op(x, 1.0f / static_cast<float>(x.value().numel()), "mean"); }

Var mse_loss(const Var& pred_in, const Tensor& target) {
  const Var pred = autocast_input(pred_in, OpClass::MseLoss);
  check_same_device("mse_loss", pred.value(), target);
  check_same_shape("mse_loss", pred.value(), target);
  Tensor out = Tensor::empty(Shape{1}, DType::F32, pred.device());
  be(out).mse_forward(pred.value(), target, out);
  return make_result(out, "mse_loss", {pred}, [target](Node& self) {
    Node& p = *self.inputs[0];
    Tensor d = Tensor::empty(p.value.shape(), p.value.dtype(), p.value.device());
    be(d).mse_backward(p.value, target, self.grad, d);
    accumulate_grad(p, d, true);
  }, reads_inputs(0b1));
}

Var cross_entropy(const Var& logits_in, const Tensor& labels) {
  const Var logits = autocast_input(logits_in, OpClass::CrossEntropy);
  check_same_device("cross_entropy", logits.value(), labels);
  Tensor loss = Tensor::empty(Shape{1}, DType::F32, logits.device());
  Tensor dlogits_unit = Tensor::empty(logits.shape(), DType::F32, logits.device());
  be(loss).cross_entropy(logits.value(), labels, loss, dlogits_unit);
  // The gradient is dlogits_unit times the upstream gradient (a device scalar: the loss scale
  // over the accumulation steps, known only now). The unit gradient is this op's own buffer and
  // a graph runs its backward once, so it is scaled in place and handed on as the logits'
  // gradient where that is FP32 (no second [B, C] buffer, no zero fill), or scaled and rounded
  // into a BF16/FP16 one in one pass (scale_cast). Logits that already have a gradient get it
  // added in one pass instead.
  return make_result(loss, "cross_entropy", {logits}, [dlogits_unit](Node& self) mutable {
    Node& x = *self.inputs[0];
    if (!x.requires_grad) return;
    if (x.grad.defined()) {
      be(x.grad).accumulate(x.grad, dlogits_unit, 1.0f, &self.grad);
      return;
    }
    if (!x.is_leaf && grad_dtype_of(x) != DType::F32) {  // BF16/FP16 logits: scaled and rounded in one pass
      Tensor d = Tensor::empty(x.value.shape(), grad_dtype_of(x), x.value.device());
      be(d).scale_cast(dlogits_unit, self.grad, d);
      accumulate_grad(x, d, true);
      return;
    }
    be(dlogits_unit).scale_inplace({&dlogits_unit}, self.grad);
    accumulate_grad(x, dlogits_unit, true);
  }, kReadsNothing);
}

}  // namespace belay

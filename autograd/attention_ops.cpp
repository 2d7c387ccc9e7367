// The fused attention op (Backend::attention, FlashAttention-2's algorithm: docs/attention.md)
// with its backward. The graph keeps q, k, v, the output and one FP32 log-sum-exp per query
// row, never the [Tq, Tk] scores or probabilities the three-op path (bmm, softmax, bmm) keeps.
#include <cmath>
#include <string>

#include "amp/autocast.h"
#include "autograd/autocast_input.h"
#include "autograd/op_helpers.h"
#include "autograd/ops.h"
#include "engine/error.h"

namespace belay {
namespace {

// The dtype the op runs in: the autocast dtype (class `attention`: FP16/BF16 products, FP32
// softmax inside the kernel), FP32 under --fp32-ops attention, else the inputs' own.
DType attention_dtype(const Var& q, const Var& k, const Var& v) {
  const AutocastRule rule = autocast_rule(OpClass::Attention);
  if (rule == AutocastRule::Fp32) return DType::F32;
  if (rule == AutocastRule::LowPrecision) return autocast_policy().dtype;
  if (q.dtype() != k.dtype() || q.dtype() != v.dtype())
    throw UsageError("attention: dtypes differ (" + q.value().describe() + ", " + k.value().describe() + ", " +
                     v.value().describe() + "); cast them, or run under autocast");
  return q.dtype();
}

// The backward's three gradients, written by one kernel call: each into a fresh tensor of its
// input's gradient dtype (or a scratch one for an input that needs none), then accumulated.
void attention_grads(Node& self, const Tensor& lse, bool causal, float scale, int64_t heads) {
  Node& q = *self.inputs[0];
  Node& k = *self.inputs[1];
  Node& v = *self.inputs[2];
  const DType dt = self.value.dtype();
  const Tensor dout = self.grad.dtype() == dt ? self.grad : self.grad.to(dt);
  const auto fresh = [&](const Node& n) {
    const DType g = n.requires_grad ? grad_dtype_of(n) : dt;
    return Tensor::empty(n.value.shape(), g == DType::F32 ? DType::F32 : dt, n.value.device());
  };
  Tensor dq = fresh(q), dk = fresh(k), dv = fresh(v);
  be(dq).attention_backward(q.value, k.value, v.value, self.value, lse, dout, causal, scale, dq, dk, dv, heads);
  if (q.requires_grad) accumulate_grad(q, dq, true);
  if (k.requires_grad) accumulate_grad(k, dk, true);
  if (v.requires_grad) accumulate_grad(v, dv, true);
}

// The op on heads side by side (heads > 1: the last dim is H d) or on [..., T, d] items.
Var attention_op(const Var& q_in, const Var& k_in, const Var& v_in, int64_t heads, bool causal,
                 std::optional<float> scale_in) {
  if (!q_in.defined() || !k_in.defined() || !v_in.defined()) throw UsageError("attention: undefined input");
  check_same_device("attention", q_in.value(), k_in.value());
  check_same_device("attention", q_in.value(), v_in.value());
  if (q_in.shape().rank() < 2 || k_in.shape().rank() != q_in.shape().rank())
    throw UsageError("attention: expected q [..., Tq, d] and k, v [..., Tk, d], got " + q_in.value().describe() +
                     ", " + k_in.value().describe() + ", " + v_in.value().describe());
  if (heads < 1 || q_in.shape().dims().back() % heads != 0)
    throw UsageError("attention: " + std::to_string(heads) + " heads do not divide the last dim of " +
                     q_in.value().describe());
  const int64_t d = q_in.shape().dims().back() / heads;
  const float scale = scale_in ? *scale_in : 1.0f / std::sqrt(static_cast<float>(d));
  const DType dt = attention_dtype(q_in, k_in, v_in);
  const Var q = autocast_cast(q_in, dt, OpClass::Attention, "q"), k = autocast_cast(k_in, dt, OpClass::Attention, "k"),
            v = autocast_cast(v_in, dt, OpClass::Attention, "v");
  std::vector<int64_t> lse_dims(q.shape().dims().begin(), q.shape().dims().end() - 1);  // [..., Tq] or [..., H, Tq]
  if (heads > 1) lse_dims.insert(lse_dims.end() - 1, heads);
  Tensor out = Tensor::empty(q.shape(), dt, q.device());
  Tensor lse = Tensor::empty(Shape(lse_dims), DType::F32, q.device());
  try {
    be(out).attention(q.value(), k.value(), v.value(), causal, scale, out, lse, heads);
  } catch (const Error& e) {
    throw UsageError(e.what());  // a shape the op does not take is the caller's mistake
  }
  return make_result(out, "attention", {q, k, v},
                     [lse, causal, scale, heads](Node& self) { attention_grads(self, lse, causal, scale, heads); });
}

}  // namespace

Var attention(const Var& q, const Var& k, const Var& v, bool causal, std::optional<float> scale) {
  return attention_op(q, k, v, 1, causal, scale);
}

Var attention_heads(const Var& q, const Var& k, const Var& v, int64_t heads, bool causal, std::optional<float> scale) {
  return attention_op(q, k, v, heads, causal, scale);
}

}  // namespace belay

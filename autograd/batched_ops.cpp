// The products and views of attention: bmm (a batch of matrix products through the backend's
// batched GEMM, transposes read through its layout flags) and transpose of two dims (one copy,
// Backend::swap_axes), with the head split and merge built from it. Why a copy for the heads:
// belay's tensors are dense, and the GEMM reads a batch with one stride per operand, while a
// head of [B, T, H * d] sits at two strides (over B and over H); one pass over the activations
// (memory-bound, O(T d) per head against O(T^2 d) of product) buys a layout every kernel reads.
#include <algorithm>
#include <string>

#include "amp/autocast.h"
#include "autograd/autocast_input.h"
#include "autograd/op_helpers.h"
#include "autograd/ops.h"
#include "engine/error.h"

namespace belay {
namespace {

// A batch of products as the backend's GEMM takes it: each operand [batch, rows, cols], or
// [rows, cols] when it is shared over the batch (stride 0); C [batch, M, N].
struct Batched {
  int64_t batch = 1;
  bool a_shared = false, b_shared = false;
};

Tensor as_items(const Tensor& t, int64_t batch, bool shared) {
  const int64_t rows = t.dim(t.rank() - 2), cols = t.dim(t.rank() - 1);
  return shared || batch == 1 ? t.reshape(Shape{rows, cols}) : t.reshape(Shape{batch, rows, cols});
}

void batched_gemm(const Batched& bt, const Tensor& a, bool ta, const Tensor& b, bool tb, Tensor& c, bool accumulate) {
  const Tensor a3 = as_items(a, bt.batch, bt.a_shared), b3 = as_items(b, bt.batch, bt.b_shared);
  Tensor c3 = as_items(c, bt.batch, false);
  GemmArgs args;
  args.a = &a3;
  args.trans_a = ta;
  args.b = &b3;
  args.trans_b = tb;
  args.c = &c3;
  args.beta = accumulate ? 1.0f : 0.0f;
  args.batch = bt.batch;
  args.stride_a = bt.a_shared ? 0 : a3.numel() / bt.batch;
  args.stride_b = bt.b_shared ? 0 : b3.numel() / bt.batch;
  be(c).gemm(args);
}

DType bmm_dtype(const Var& a, const Var& b) {
  const AutocastRule rule = autocast_rule(OpClass::Bmm);
  if (rule == AutocastRule::Fp32) return DType::F32;
  if (rule == AutocastRule::LowPrecision) return autocast_policy().dtype;
  if (a.dtype() != b.dtype())
    throw UsageError("bmm: dtypes differ (" + a.value().describe() + " vs " + b.value().describe() +
                     "); cast one, or run under autocast");
  return a.dtype();
}

// The gradient of a B shared over the batch: the items' products summed. With A stored
// [batch, M, K] (not transposed) the sum is one product over batch * M rows, by the GEMM's own
// reduction; otherwise each item's product lands in an FP32 scratch summed over the batch.
void shared_b_grad(int64_t batch, const Tensor& a, bool ta, bool tb, const Tensor& g, Tensor& out, bool acc) {
  const int64_t m = g.dim(g.rank() - 2), n = g.dim(g.rank() - 1);
  if (!ta) {
    const Tensor a2 = a.reshape(Shape{batch * m, a.dim(a.rank() - 1)}), g2 = g.reshape(Shape{batch * m, n});
    const Batched one{1, false, false};
    if (tb) batched_gemm(one, g2, true, a2, false, out, acc);  // dB [N, K] = sum g_i^T A_i
    else batched_gemm(one, a2, true, g2, false, out, acc);     // dB [K, N] = sum A_i^T g_i
    return;
  }
  Tensor items = Tensor::empty(Shape{batch, out.dim(0), out.dim(1)}, DType::F32, out.device());
  const Batched bt{batch, false, false};
  if (tb) batched_gemm(bt, g, true, a, true, items, false);  // dB_i [N, K] = g_i^T A_i^T
  else batched_gemm(bt, a, false, g, false, items, false);   // dB_i [K, N] = A_i g_i  (A_i stored [K, M])
  be(out).sum_axis(items, AxisView{1, batch, out.numel()}, 1.0f, out, acc);
}

}  // namespace

Var bmm(const Var& a_in, const Var& b_in, bool trans_a, bool trans_b) {
  if (!a_in.defined() || !b_in.defined()) throw UsageError("bmm: undefined input");
  check_same_device("bmm", a_in.value(), b_in.value());
  const std::vector<int64_t>& da = a_in.shape().dims();
  const std::vector<int64_t>& db = b_in.shape().dims();
  const auto shapes = [&] { return a_in.value().describe() + " x " + b_in.value().describe(); };
  if (da.size() < 2 || db.size() < 2) throw UsageError("bmm: operands must have at least two dims, got " + shapes());
  const bool b_shared = db.size() == 2 && da.size() > 2;
  if (!b_shared && !std::equal(da.begin(), da.end() - 2, db.begin(), db.end() - 2))
    throw UsageError("bmm: leading dims differ, " + shapes() +
                     " (b must have a's leading dims, or none: one matrix for every item)");
  const int64_t m = trans_a ? da[da.size() - 1] : da[da.size() - 2];
  const int64_t k = trans_a ? da[da.size() - 2] : da[da.size() - 1];
  const int64_t kb = trans_b ? db[db.size() - 1] : db[db.size() - 2];
  const int64_t n = trans_b ? db[db.size() - 2] : db[db.size() - 1];
  if (k != kb)
    throw UsageError("bmm: inner sizes differ, " + shapes() + " with trans_a=" + std::to_string(trans_a) +
                     ", trans_b=" + std::to_string(trans_b));
  const DType dt = bmm_dtype(a_in, b_in);
  const Var a = autocast_cast(a_in, dt, OpClass::Bmm, "a"), b = autocast_cast(b_in, dt, OpClass::Bmm, "b");
  const Batched bt{dims_product(da, 0, da.size() - 2), false, b_shared};
  if (bt.batch == 0 || m == 0 || n == 0 || k == 0) throw UsageError("bmm: empty operand, " + shapes());
  std::vector<int64_t> dc(da.begin(), da.end() - 2);
  dc.push_back(m);
  dc.push_back(n);
  Tensor out = Tensor::empty(Shape(dc), dt, a.device());
  batched_gemm(bt, a.value(), trans_a, b.value(), trans_b, out, false);
  return make_result(out, "bmm", {a, b}, [bt, trans_a, trans_b](Node& self) {
    Node& a = *self.inputs[0];
    Node& b = *self.inputs[1];
    const Tensor g = self.grad.dtype() == a.value.dtype() ? self.grad : self.grad.to(a.value.dtype());
    // C = op(A) op(B): d op(A) = dC op(B)^T, d op(B) = op(A)^T dC; a transposed operand's
    // gradient is the transpose of that, written by swapping the product's operands.
    const Batched ga{bt.batch, false, bt.b_shared}, gb{bt.batch, bt.b_shared, false};
    write_grad(a, grad_dtype_of(a), [&](Tensor& out, bool acc) {
        if (trans_a) batched_gemm(gb, b.value, trans_b, g, true, out, acc);  // dA = op(B) dC^T
        else batched_gemm(ga, g, false, b.value, !trans_b, out, acc);        // dA = dC op(B)^T
      });
    write_grad(b, grad_dtype_of(b), [&](Tensor& out, bool acc) {
        if (bt.b_shared) shared_b_grad(bt.batch, a.value, trans_a, trans_b, g, out, acc);
        else if (trans_b) batched_gemm(bt, g, true, a.value, trans_a, out, acc);  // dB = dC^T op(A)
        else batched_gemm(bt, a.value, !trans_a, g, false, out, acc);            // dB = op(A)^T dC
      });
  }, reads_inputs(0b11));
}

Var transpose(const Var& x, int64_t dim0, int64_t dim1) {
  if (!x.defined()) throw UsageError("transpose: undefined input");
  const std::vector<int64_t>& d = x.shape().dims();
  const int64_t rank = static_cast<int64_t>(d.size());
  const int64_t d0 = dim0 < 0 ? dim0 + rank : dim0, d1 = dim1 < 0 ? dim1 + rank : dim1;
  if (d0 < 0 || d0 >= rank || d1 < 0 || d1 >= rank)
    throw UsageError("transpose: dims " + std::to_string(dim0) + ", " + std::to_string(dim1) + " out of range for " +
                     x.value().describe());
  if (d0 == d1) return x;
  const size_t lo = static_cast<size_t>(std::min(d0, d1)), hi = static_cast<size_t>(std::max(d0, d1));
  const SwapAxesView view{dims_product(d, 0, lo), d[lo], dims_product(d, lo + 1, hi), d[hi],
                          dims_product(d, hi + 1, d.size())};
  std::vector<int64_t> swapped = d;
  std::swap(swapped[lo], swapped[hi]);
  Tensor out = Tensor::empty(Shape(swapped), x.dtype(), x.device());
  be(out).swap_axes(x.value(), view, out);
  return make_result(out, "transpose", {x}, [view](Node& self) {
    Node& x = *self.inputs[0];
    if (!x.requires_grad) return;
    const SwapAxesView back{view.outer, view.q, view.mid, view.p, view.inner};
    Tensor g = Tensor::empty(x.value.shape(), self.grad.dtype(), x.value.device());
    be(g).swap_axes(self.grad, back, g);
    accumulate_grad(x, g, true);
  }, kReadsNothing);
}

Var split_heads(const Var& x, int64_t heads) {
  const std::vector<int64_t>& d = x.shape().dims();
  if (d.size() < 2 || heads < 1 || d.back() % heads != 0)
    throw UsageError("split_heads: expected [..., T, H * d] with H = " + std::to_string(heads) + " dividing the last "
                     "dim, got " + x.value().describe());
  std::vector<int64_t> r(d.begin(), d.end() - 1);
  r.push_back(heads);
  r.push_back(d.back() / heads);
  return transpose(reshape(x, r), -3, -2);  // [..., T, H, d] -> [..., H, T, d]
}

Var merge_heads(const Var& x) {
  const std::vector<int64_t>& d = x.shape().dims();
  if (d.size() < 3) throw UsageError("merge_heads: expected [..., H, T, d], got " + x.value().describe());
  const Var t = transpose(x, -3, -2);  // [..., T, H, d]
  std::vector<int64_t> r(d.begin(), d.end() - 3);
  r.push_back(d[d.size() - 2]);
  r.push_back(d[d.size() - 3] * d.back());
  return reshape(t, r);
}

}  // namespace belay

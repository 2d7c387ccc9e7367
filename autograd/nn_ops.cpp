// The transformer's ops as differentiable ops: embedding (a gather of table rows) and
// LayerNorm over the last dim. Their forward and backward are backend ops (engine/backend.h);
// autocast's table (amp/autocast.cpp) says which dtype each runs in.
#include <string>

#include "amp/autocast.h"
#include "autograd/autocast_input.h"
#include "autograd/op_helpers.h"
#include "autograd/ops.h"
#include "engine/error.h"

namespace belay {
namespace {

std::string describe(const Var& v) { return v.defined() ? v.value().describe() : std::string("nothing"); }

}  // namespace

Var embedding(const Var& table_in, const Tensor& ids) {
  if (!table_in.defined() || !ids.defined()) throw UsageError("embedding: undefined input");
  if (table_in.shape().rank() != 2)
    throw UsageError("embedding: the table must be a matrix [V, D], got " + table_in.value().describe());
  if (ids.dtype() != DType::F32)
    throw UsageError("embedding: ids must be fp32 values holding row indices (as cross_entropy's labels), got " +
                     ids.describe());
  check_same_device("embedding", table_in.value(), ids);
  const Var table = autocast_input(table_in, OpClass::Embedding);
  const int64_t n = ids.numel(), dim = table.shape()[1];
  Tensor rows = Tensor::empty(Shape{n, dim}, table.dtype(), table.device());
  be(rows).embedding(table.value(), ids, rows);  // checks every id
  std::vector<int64_t> dims = ids.shape().dims();
  dims.push_back(dim);
  return make_result(rows.reshape(Shape(dims)), "embedding", {table}, [ids, n, dim](Node& self) {
    Node& t = *self.inputs[0];
    const Tensor g = self.grad.reshape(Shape{n, dim});
    // The kernel only adds: a fresh FP32 gradient is zeroed first.
    write_grad(t, DType::F32, [&](Tensor& out, bool accumulate) {
      if (!accumulate) be(out).fill(out, 0.0f);
      be(out).embedding_backward(g, ids, out);
    });
  }, kReadsNothing);
}

Var layer_norm(const Var& x_in, const Var& weight, const Var& bias, float eps) {
  if (!x_in.defined()) throw UsageError("layer_norm: undefined input");
  const Shape& s = x_in.shape();
  if (s.rank() == 0 || s[s.rank() - 1] < 1)
    throw UsageError("layer_norm: needs a last dim to normalise over, got " + x_in.value().describe());
  const int64_t cols = s[s.rank() - 1], rows = x_in.value().numel() / cols;
  for (const Var* p : {&weight, &bias})
    if (p->defined()) {
      check_same_device("layer_norm", x_in.value(), p->value());
      if (p->value().numel() != cols || p->shape().rank() != 1)
        throw UsageError("layer_norm: weight and bias must be [" + std::to_string(cols) + "] (x's last dim), got " +
                         describe(*p) + " for x " + x_in.value().describe());
    }
  if (!(eps >= 0.0f)) throw UsageError("layer_norm: eps must be >= 0, got " + std::to_string(eps));
  const Var x = autocast_input(x_in, OpClass::LayerNorm);
  Tensor y = Tensor::empty(s, x.dtype(), x.device());
  Tensor mean = Tensor::empty(Shape{rows}, DType::F32, x.device());
  Tensor rstd = Tensor::empty(Shape{rows}, DType::F32, x.device());
  const bool has_w = weight.defined(), has_b = bias.defined();
  be(y).layer_norm(x.value(), has_w ? &weight.value() : nullptr, has_b ? &bias.value() : nullptr, eps, y, mean, rstd);
  std::vector<Var> inputs{x};
  if (has_w) inputs.push_back(weight);
  if (has_b) inputs.push_back(bias);
  return make_result(y, "layer_norm", inputs, [has_w, has_b, mean, rstd](Node& self) {
    Node& x = *self.inputs[0];
    Node* w = has_w ? self.inputs[1].get() : nullptr;
    Node* b = has_b ? self.inputs[has_w ? 2 : 1].get() : nullptr;
    const Tensor* wv = w ? &w->value : nullptr;
    // dweight and dbias: into FP32 gradients directly where they exist, else fresh FP32
    // tensors. The kernel adds into both or neither: a fresh target is zeroed, so
    // "accumulate" is right for it too.
    GradTarget dw(w, DType::F32, true), db(b, DType::F32, true);
    Tensor dx = Tensor::empty(x.value.shape(), x.value.dtype(), x.value.device());
    be(dx).layer_norm_backward(x.value, wv, mean, rstd, self.grad, dx, dw.out(), db.out(), true);
    if (x.requires_grad) accumulate_grad(x, dx, true);
    dw.finish();
    db.finish();
  }, reads_inputs(0b011));
}

}  // namespace belay

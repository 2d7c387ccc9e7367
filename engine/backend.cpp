#include "engine/backend.h"

#include "engine/error.h"

namespace belay {

StoredMatrix stored_matrix(const Tensor& t) {
  if (t.rank() < 2) return {0, 0};
  return {t.dim(t.rank() - 2), t.dim(t.rank() - 1)};
}

namespace {

// A batched operand's items must lie inside it and start on a stored row (the CUDA kernels
// copy whole rows, padded, and need each item 16-byte aligned like the first).
void check_batch_operand(const char* what, const Tensor& t, int64_t batch, int64_t stride) {
  const StoredMatrix s = stored_matrix(t);
  const int64_t items = s.rows * s.cols;
  const bool row_multiple = stride == 0 || (s.cols > 0 && stride % s.cols == 0 && stride >= items);
  if (stride < 0 || !row_multiple || (batch - 1) * stride + items > t.numel())
    throw Error(std::string("gemm: ") + what + " " + t.describe() + " does not hold " + std::to_string(batch) +
                " matrices of [" + std::to_string(s.rows) + ", " + std::to_string(s.cols) + "] " +
                std::to_string(stride) + " elements apart (a stride is 0 or a whole number of rows, at least one "
                "matrix)");
}

}  // namespace

GemmDims check_gemm(const GemmArgs& args) {
  if (!args.a || !args.b || !args.c) throw Error("gemm: missing operand");
  const Tensor& a = *args.a;
  const Tensor& b = *args.b;
  const Tensor& c = *args.c;
  check_defined("gemm", a);
  check_defined("gemm", b);
  check_defined("gemm", c);
  check_same_device("gemm", a, b);
  check_same_device("gemm", a, c);
  // Unbatched: matrices (leading dims of extent 1 allowed, as a batch of one).
  const bool batched = args.batch != 1;
  const auto fits = [batched](const Tensor& t) {
    const StoredMatrix s = stored_matrix(t);
    return t.rank() >= 2 && (batched || t.numel() == s.rows * s.cols);
  };
  if (!fits(a) || !fits(b) || !fits(c))
    throw Error("gemm: expected matrices, got " + a.describe() + ", " + b.describe() + ", " + c.describe());
  if (a.dtype() != b.dtype())
    throw Error("gemm: operand dtypes differ, " + a.describe() + " vs " + b.describe() + " (cast one first)");
  const StoredMatrix sa = stored_matrix(a), sb = stored_matrix(b), sc = stored_matrix(c);
  GemmDims d;
  d.m = args.trans_a ? sa.cols : sa.rows;
  d.k = args.trans_a ? sa.rows : sa.cols;
  const int64_t kb = args.trans_b ? sb.cols : sb.rows;
  d.n = args.trans_b ? sb.rows : sb.cols;
  if (d.k != kb || sc.rows != d.m || sc.cols != d.n)
    throw Error("gemm: shapes do not chain, op(A) is [" + std::to_string(d.m) + ", " + std::to_string(d.k) +
                "], op(B) is [" + std::to_string(kb) + ", " + std::to_string(d.n) + "], C is " + c.describe());
  if (batched) {
    if (args.batch < 1) throw Error("gemm: batch " + std::to_string(args.batch) + " (expected >= 1)");
    check_batch_operand("A", a, args.batch, args.stride_a);
    check_batch_operand("B", b, args.batch, args.stride_b);
    if (c.numel() != args.batch * d.m * d.n)
      throw Error("gemm: C " + c.describe() + " is not " + std::to_string(args.batch) + " dense [" +
                  std::to_string(d.m) + ", " + std::to_string(d.n) + "] results");
  }
  if (args.beta != 0.0f && (args.beta != 1.0f || c.dtype() != DType::F32))
    throw Error("gemm: beta must be 0, or 1 with an fp32 C (gradient accumulation)");
  if (args.bias) {
    check_same_device("gemm bias", a, *args.bias);
    if (args.bias->numel() != d.n)
      throw Error("gemm: bias " + args.bias->describe() + " does not match N = " + std::to_string(d.n));
  }
  return d;
}

void check_swap_axes(const Tensor& x, const SwapAxesView& view, const Tensor& out) {
  check_defined("swap_axes", x);
  check_defined("swap_axes", out);
  check_same_device("swap_axes", x, out);
  const bool ok = view.outer >= 0 && view.p >= 0 && view.mid >= 0 && view.q >= 0 && view.inner >= 0;
  if (!ok || x.numel() != view.numel() || out.numel() != view.numel() || x.dtype() != out.dtype())
    throw Error("swap_axes: " + x.describe() + " and " + out.describe() + " do not fit the view [" +
                std::to_string(view.outer) + ", " + std::to_string(view.p) + ", " + std::to_string(view.mid) + ", " +
                std::to_string(view.q) + ", " + std::to_string(view.inner) + "] with one dtype");
}

void check_axis_view(const char* op, const Tensor& full, const Tensor& reduced, const AxisView& view) {
  check_defined(op, full);
  check_defined(op, reduced);
  check_same_device(op, full, reduced);
  if (view.outer < 0 || view.len < 0 || view.inner < 0 || full.numel() != view.outer * view.len * view.inner ||
      reduced.numel() != view.outer * view.inner)
    throw Error(std::string(op) + ": " + full.describe() + " and " + reduced.describe() + " do not fit the axis view [" +
                std::to_string(view.outer) + ", " + std::to_string(view.len) + ", " + std::to_string(view.inner) + "]");
}

void check_softmax(const char* op, const Tensor& x, int64_t cols, const Tensor& y) {
  check_defined(op, x);
  check_defined(op, y);
  check_same_device(op, x, y);
  check_same_shape(op, x, y);
  if (cols < 1 || x.numel() % cols != 0)
    throw Error(std::string(op) + ": rows of " + std::to_string(cols) + " do not tile " + x.describe());
}

void check_embedding(const char* op, const Tensor& table, const Tensor& ids, const Tensor& out) {
  for (const Tensor* t : {&table, &ids, &out}) check_defined(op, *t);
  check_same_device(op, table, ids);
  check_same_device(op, table, out);
  if (table.rank() != 2 || out.rank() != 2 || out.dim(0) != ids.numel() || out.dim(1) != table.dim(1))
    throw Error(std::string(op) + ": expected table [V, D], ids of N elements and rows [N, D], got " +
                table.describe() + ", " + ids.describe() + " and " + out.describe());
  check_dtype(op, ids, DType::F32);
}

void check_layer_norm(const char* op, const Tensor& x, const Tensor* weight, const Tensor* bias, const Tensor& y,
                      const Tensor& mean, const Tensor& rstd) {
  for (const Tensor* t : {&x, &y, &mean, &rstd}) check_defined(op, *t);
  check_same_device(op, x, y);
  check_same_device(op, x, mean);
  check_same_device(op, x, rstd);
  check_same_shape(op, x, y);
  if (x.rank() == 0 || x.dim(x.rank() - 1) < 1)
    throw Error(std::string(op) + ": x needs a last dim of at least 1, got " + x.describe());
  const int64_t cols = x.dim(x.rank() - 1), rows = x.numel() / cols;
  for (const Tensor* p : {weight, bias})
    if (p) {
      check_defined(op, *p);
      check_same_device(op, x, *p);
      if (p->numel() != cols)
        throw Error(std::string(op) + ": weight and bias need " + std::to_string(cols) + " elements (x's last dim), got " +
                    p->describe());
    }
  check_dtype(op, mean, DType::F32);
  check_dtype(op, rstd, DType::F32);
  if (mean.numel() != rows || rstd.numel() != rows)
    throw Error(std::string(op) + ": mean and rstd need " + std::to_string(rows) + " elements (x's rows), got " +
                mean.describe() + " and " + rstd.describe());
}

void check_layer_norm_grads(const char* op, const Tensor& x, const Tensor& dx, const Tensor* dweight,
                            const Tensor* dbias) {
  check_defined(op, dx);
  check_same_device(op, x, dx);
  check_same_shape(op, x, dx);
  const int64_t cols = x.dim(x.rank() - 1);
  for (const Tensor* p : {dweight, dbias})
    if (p && (!p->defined() || p->dtype() != DType::F32 || p->numel() != cols || p->device() != x.device()))
      throw Error(std::string(op) + ": dweight and dbias must be fp32 of " + std::to_string(cols) +
                  " elements on x's device, got " + p->describe());
}

void check_cross_entropy(const Tensor& logits, const Tensor& labels, const Tensor& loss, const Tensor& dlogits) {
  for (const Tensor* t : {&logits, &labels, &loss, &dlogits}) check_defined("cross_entropy", *t);
  check_same_device("cross_entropy", logits, labels);
  check_same_device("cross_entropy", logits, loss);
  check_same_device("cross_entropy", logits, dlogits);
  if (logits.rank() != 2 || labels.numel() != logits.dim(0))
    throw Error("cross_entropy: expected logits [B, C] and labels [B], got " + logits.describe() + " and " +
                labels.describe());
  if (logits.dim(1) < 1 && logits.dim(0) > 0)
    throw Error("cross_entropy: logits " + logits.describe() + " have no classes: no label can be valid");
  if (loss.numel() != 1 || loss.dtype() != DType::F32)
    throw Error("cross_entropy: expected an fp32 one-element loss, got " + loss.describe());
  check_dtype("cross_entropy", dlogits, DType::F32);
  check_same_shape("cross_entropy", logits, dlogits);
}

void check_step_scalars(const char* op, const StepScalars& s, DeviceKind kind) {
  const Tensor* first = nullptr;
  for (const Tensor* t : {s.inv_scale, s.clip_coef, s.found_inf, s.lr, s.applied_steps}) {
    if (!t) throw Error(std::string(op) + ": a step scalar is missing (inv_scale, clip_coef, found_inf, lr, applied_steps)");
    check_f32_scalar(op, *t, kind);
    if (first) check_same_device(op, *first, *t);
    first = t;
  }
}

void check_lookup(const Tensor& table, const Tensor& index, const Tensor& out, DeviceKind kind) {
  check_device_kind("lookup", table, kind);
  check_dtype("lookup table", table, DType::F32);
  if (table.rank() != 1 || table.numel() < 1)
    throw Error("lookup: the table must be a non-empty vector, got " + table.describe());
  check_f32_scalar("lookup", index, kind);
  check_f32_scalar("lookup", out, kind);
  check_same_device("lookup", table, index);
  check_same_device("lookup", table, out);
}

}  // namespace belay

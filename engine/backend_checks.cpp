// Every op's argument checks (engine/backend_checks.h): metadata only (shape, dtype, device,
// the storage's address range), never a tensor's values, so they cost the CUDA backend no
// host read.
#include "engine/backend_checks.h"

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "engine/census.h"
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
    check_defined("gemm", *args.bias);
    check_same_device("gemm bias", a, *args.bias);
    if (args.bias->numel() != d.n)
      throw Error("gemm: bias " + args.bias->describe() + " does not match N = " + std::to_string(d.n));
  }
  return d;
}

namespace {

// Each tensor defined, on the backend's kind of device, and all on the first one's device: a
// device pointer reaching a CPU loop, or a host pointer reaching a CUDA kernel (an illegal
// address, which ends the CUDA context for good), would be a crash instead of an Error.
// Null entries are operands the call left out (an optional bias, weight or factor).
void check_on_one_device(const char* op, DeviceKind kind, std::initializer_list<const Tensor*> tensors) {
  const Tensor* first = nullptr;
  for (const Tensor* t : tensors) {
    if (!t) continue;
    check_device_kind(op, *t, kind);
    if (first) check_same_device(op, *first, *t);
    else first = t;
  }
}

bool overlaps(const Tensor& a, const Tensor& b) {
  if (a.nbytes() == 0 || b.nbytes() == 0 || a.device() != b.device()) return false;
  const char* pa = static_cast<const char*>(a.data());
  const char* pb = static_cast<const char*>(b.data());
  return pa < pb + b.nbytes() && pb < pa + a.nbytes();
}

[[noreturn]] void throw_shared(const char* op, const Tensor& out, const Tensor& other) {
  throw Error(std::string(op) + ": an output shares storage with another operand (" + out.describe() + " and " +
              other.describe() + "); give each output a tensor of its own");
}

// An output of an op that reads its inputs more than once, or writes elsewhere than where it
// reads: it must not share storage with any of `others` (inputs, or the op's other outputs).
void check_apart(const char* op, const Tensor& out, std::initializer_list<const Tensor*> others) {
  for (const Tensor* t : others)
    if (t && overlaps(out, *t)) throw_shared(op, out, *t);
}

// An elementwise output reads element i before writing it and nothing else there: it may be
// one of its inputs exactly (the same storage and dtype), but not overlap one otherwise.
void check_elementwise_alias(const char* op, const Tensor& out, std::initializer_list<const Tensor*> inputs) {
  for (const Tensor* t : inputs)
    if (t && overlaps(out, *t) && (out.data() != t->data() || out.dtype() != t->dtype())) throw_shared(op, out, *t);
}

void check_scalars(const char* op, DeviceKind kind, std::initializer_list<const Tensor*> scalars) {
  for (const Tensor* t : scalars) check_f32_scalar(op, *t, kind);
}

// Shapes of the ops that take a shape parameter (devices are checked before these).
void check_axis_view(const char* op, const Tensor& full, const Tensor& reduced, const AxisView& view) {
  if (view.outer < 0 || view.len < 0 || view.inner < 0 || full.numel() != view.outer * view.len * view.inner ||
      reduced.numel() != view.outer * view.inner)
    throw Error(std::string(op) + ": " + full.describe() + " and " + reduced.describe() + " do not fit the axis view [" +
                std::to_string(view.outer) + ", " + std::to_string(view.len) + ", " + std::to_string(view.inner) + "]");
}

void check_softmax_rows(const char* op, const Tensor& x, int64_t cols, const Tensor& y) {
  check_same_shape(op, x, y);
  if (cols < 1 || x.numel() % cols != 0)
    throw Error(std::string(op) + ": rows of " + std::to_string(cols) + " do not tile " + x.describe());
}

// embedding: table [V, D], ids of any shape (FP32 holding row indices, as cross_entropy's
// labels), rows [ids.numel(), D]; backward: the same with dtable for the table.
void check_embedding_shapes(const char* op, const Tensor& table, const Tensor& ids, const Tensor& rows) {
  if (table.rank() != 2 || rows.rank() != 2 || rows.dim(0) != ids.numel() || rows.dim(1) != table.dim(1))
    throw Error(std::string(op) + ": expected table [V, D], ids of N elements and rows [N, D], got " +
                table.describe() + ", " + ids.describe() + " and " + rows.describe());
  check_dtype(op, ids, DType::F32);
}

// layer_norm: x (and y, dy) [rows, cols] with cols = the last dim; weight and bias (either
// may be absent) of cols elements; mean and rstd FP32 of rows elements.
void check_layer_norm_shapes(const char* op, const Tensor& x, const Tensor* weight, const Tensor* bias,
                             const Tensor& y, const Tensor& mean, const Tensor& rstd) {
  check_same_shape(op, x, y);
  if (x.rank() == 0 || x.dim(x.rank() - 1) < 1)
    throw Error(std::string(op) + ": x needs a last dim of at least 1, got " + x.describe());
  const int64_t cols = x.dim(x.rank() - 1), rows = x.numel() / cols;
  for (const Tensor* p : {weight, bias})
    if (p && p->numel() != cols)
      throw Error(std::string(op) + ": weight and bias need " + std::to_string(cols) + " elements (x's last dim), got " +
                  p->describe());
  check_dtype(op, mean, DType::F32);
  check_dtype(op, rstd, DType::F32);
  if (mean.numel() != rows || rstd.numel() != rows)
    throw Error(std::string(op) + ": mean and rstd need " + std::to_string(rows) + " elements (x's rows), got " +
                mean.describe() + " and " + rstd.describe());
}

// Every StepScalars member present, each an FP32 [1] on the backend's kind of device, all on one.
void check_step_scalars(const char* op, const StepScalars& s, DeviceKind kind) {
  const Tensor* first = nullptr;
  for (const Tensor* t : {s.inv_scale, s.clip_coef, s.found_inf, s.lr, s.applied_steps}) {
    if (!t) throw Error(std::string(op) + ": a step scalar is missing (inv_scale, clip_coef, found_inf, lr, applied_steps)");
    check_f32_scalar(op, *t, kind);
    if (first) check_same_device(op, *first, *t);
    first = t;
  }
}

// A list of gradients (guard, unscale, scale_inplace): each present and on the device of
// `scalar`, which must not share storage with any of them.
template <class T>
void check_grad_list(const char* op, DeviceKind kind, const std::vector<T*>& grads, const Tensor& scalar) {
  for (const Tensor* g : grads) {
    if (!g) throw Error(std::string(op) + ": a gradient is missing (null tensor pointer)");
    check_on_one_device(op, kind, {&scalar, g});
    check_apart(op, scalar, {g});
  }
}

std::string slot_name(const char* op, size_t i) { return std::string(op) + ": slot " + std::to_string(i); }

}  // namespace

namespace checks {

void cast(DeviceKind kind, const Tensor& src, const Tensor& dst) {
  check_on_one_device("cast", kind, {&src, &dst});
  if (src.numel() != dst.numel()) throw Error("cast: element counts differ, " + src.describe() + " vs " + dst.describe());
  check_elementwise_alias("cast", dst, {&src});
}

void cast_census(DeviceKind kind, const Tensor& src, const Tensor& dst, const Tensor& record) {
  check_on_one_device("cast_census", kind, {&src, &dst, &record});
  if (src.numel() != dst.numel())
    throw Error("cast_census: element counts differ, " + src.describe() + " vs " + dst.describe());
  check_dtype("cast_census", src, DType::F32);
  if (dst.dtype() != DType::F16 && dst.dtype() != DType::BF16)
    throw Error("cast_census: casts into FP16 or BF16, not " + std::string(dtype_name(dst.dtype())));
  if (src.numel() > static_cast<int64_t>(UINT32_MAX))
    throw Error("cast_census: the census counts in 32 bits; " + src.describe() + " is too large for it");
  check_dtype("cast_census", record, DType::F32);
  if (record.rank() != 1 || record.dim(0) != kCensusFields)
    throw Error("cast_census: the record must be FP32 [" + std::to_string(kCensusFields) + "], got " +
                record.describe());
  check_apart("cast_census", dst, {&src, &record});
  check_apart("cast_census", record, {&src});
}

void fill(DeviceKind kind, const Tensor& t) { check_on_one_device("fill", kind, {&t}); }

// The elementwise ops: every operand shaped like the first, the output maybe one of the inputs.
void elementwise(const char* op, DeviceKind kind, std::initializer_list<const Tensor*> inputs, const Tensor& out) {
  check_on_one_device(op, kind, inputs);
  check_on_one_device(op, kind, {*inputs.begin(), &out});
  for (const Tensor* t : inputs) check_same_shape(op, **inputs.begin(), *t);
  check_same_shape(op, **inputs.begin(), out);
  check_elementwise_alias(op, out, inputs);
}

void accumulate(DeviceKind kind, const Tensor& dst, const Tensor& src, const Tensor* s) {
  check_on_one_device("accumulate", kind, {&dst, &src, s});
  check_same_shape("accumulate", dst, src);
  if (s) {
    check_f32_scalar("accumulate", *s, kind);
    check_apart("accumulate", dst, {s});  // read by every element while dst is written
  }
  check_elementwise_alias("accumulate", dst, {&src});
}

void broadcast_scalar(DeviceKind kind, const Tensor& s, const Tensor& out) {
  check_on_one_device("broadcast_scalar", kind, {&s, &out});
  check_f32_scalar("broadcast_scalar", s, kind);
  check_elementwise_alias("broadcast_scalar", out, {&s});
}

void binary_broadcast(DeviceKind kind, const Tensor& a, const Tensor& b, const AxisView& view, const Tensor& out) {
  check_on_one_device("binary_broadcast", kind, {&a, &b, &out});
  check_same_shape("binary_broadcast", a, out);
  check_axis_view("binary_broadcast", a, b, view);
  check_elementwise_alias("binary_broadcast", out, {&a});
  check_apart("binary_broadcast", out, {&b});  // b is read again for every position along the axis
}

void broadcast_axis(DeviceKind kind, const Tensor& g, const AxisView& view, const Tensor& out) {
  check_on_one_device("broadcast_axis", kind, {&g, &out});
  check_axis_view("broadcast_axis", out, g, view);
  check_apart("broadcast_axis", out, {&g});
}

void sum_axis(DeviceKind kind, const Tensor& x, const AxisView& view, const Tensor& out) {
  check_on_one_device("sum_axis", kind, {&x, &out});
  check_axis_view("sum_axis", x, out, view);
  check_apart("sum_axis", out, {&x});
}

void softmax(DeviceKind kind, const Tensor& x, int64_t cols, const Tensor& y) {
  check_on_one_device("softmax", kind, {&x, &y});
  check_softmax_rows("softmax", x, cols, y);
  check_apart("softmax", y, {&x});
}

void softmax_backward(DeviceKind kind, const Tensor& y, const Tensor& dy, int64_t cols, const Tensor& dx) {
  check_on_one_device("softmax_backward", kind, {&y, &dy, &dx});
  check_softmax_rows("softmax_backward", y, cols, dy);
  check_softmax_rows("softmax_backward", y, cols, dx);
  check_apart("softmax_backward", dx, {&y, &dy});
}

void embedding(DeviceKind kind, const Tensor& table, const Tensor& ids, const Tensor& out) {
  check_on_one_device("embedding", kind, {&table, &ids, &out});
  check_embedding_shapes("embedding", table, ids, out);
  if (out.dtype() != table.dtype()) throw Error("embedding: out " + out.describe() + " must have the table's dtype");
  check_apart("embedding", out, {&table, &ids});
}

void embedding_backward(DeviceKind kind, const Tensor& dout, const Tensor& ids, const Tensor& dtable) {
  check_on_one_device("embedding_backward", kind, {&dtable, &ids, &dout});
  check_embedding_shapes("embedding_backward", dtable, ids, dout);
  check_dtype("embedding_backward", dtable, DType::F32);
  check_apart("embedding_backward", dtable, {&dout, &ids});
}

void layer_norm(DeviceKind kind, const Tensor& x, const Tensor* weight, const Tensor* bias, const Tensor& y,
                const Tensor& mean, const Tensor& rstd) {
  check_on_one_device("layer_norm", kind, {&x, &y, &mean, &rstd, weight, bias});
  check_layer_norm_shapes("layer_norm", x, weight, bias, y, mean, rstd);
  check_apart("layer_norm", y, {&x, weight, bias, &mean, &rstd});
  check_apart("layer_norm", mean, {&x, weight, bias, &rstd});
  check_apart("layer_norm", rstd, {&x, weight, bias});
}

// layer_norm_backward's outputs: dx like x, dweight and dbias (either may be absent) FP32 of
// the row width; none of them sharing storage with an input or with each other.
void layer_norm_backward(DeviceKind kind, const Tensor& x, const Tensor* weight, const Tensor& mean,
                         const Tensor& rstd, const Tensor& dy, const Tensor& dx, const Tensor* dweight,
                         const Tensor* dbias) {
  const char* op = "layer_norm_backward";
  check_on_one_device(op, kind, {&x, &mean, &rstd, &dy, weight});
  check_layer_norm_shapes(op, x, weight, nullptr, dy, mean, rstd);
  check_on_one_device(op, kind, {&x, &dx});
  check_same_shape(op, x, dx);
  const int64_t cols = x.dim(x.rank() - 1);
  for (const Tensor* p : {dweight, dbias})
    if (p && (!p->defined() || p->dtype() != DType::F32 || p->numel() != cols || p->device() != x.device()))
      throw Error(std::string(op) + ": dweight and dbias must be fp32 of " + std::to_string(cols) +
                  " elements on x's device, got " + p->describe());
  check_apart(op, dx, {&x, weight, &mean, &rstd, &dy, dweight, dbias});
  if (dweight) check_apart(op, *dweight, {&x, weight, &mean, &rstd, &dy, dbias});
  if (dbias) check_apart(op, *dbias, {&x, weight, &mean, &rstd, &dy});
}

void transpose(DeviceKind kind, const Tensor& x, const Tensor& out) {
  check_on_one_device("transpose", kind, {&x, &out});
  if (x.rank() != 2 || out.rank() != 2 || out.dim(0) != x.dim(1) || out.dim(1) != x.dim(0) || out.dtype() != x.dtype())
    throw Error("transpose: expected x [M, N] and out [N, M] of one dtype, got " + x.describe() + " and " +
                out.describe());
  check_apart("transpose", out, {&x});
}

void swap_axes(DeviceKind kind, const Tensor& x, const SwapAxesView& view, const Tensor& out) {
  check_on_one_device("swap_axes", kind, {&x, &out});
  const bool ok = view.outer >= 0 && view.p >= 0 && view.mid >= 0 && view.q >= 0 && view.inner >= 0;
  if (!ok || x.numel() != view.numel() || out.numel() != view.numel() || x.dtype() != out.dtype())
    throw Error("swap_axes: " + x.describe() + " and " + out.describe() + " do not fit the view [" +
                std::to_string(view.outer) + ", " + std::to_string(view.p) + ", " + std::to_string(view.mid) + ", " +
                std::to_string(view.q) + ", " + std::to_string(view.inner) + "] with one dtype");
  check_apart("swap_axes", out, {&x});
}

namespace {

bool same_leading_dims(const Tensor& a, const Tensor& b) {
  if (a.rank() != b.rank()) return false;
  for (int i = 0; i + 2 < static_cast<int>(a.rank()); ++i)
    if (a.dim(i) != b.dim(i)) return false;
  return true;
}

// The extents of q, k, v: the same leading dims, heads dividing the last one, nothing empty,
// the head dim within the kernels' reach.
AttentionDims attention_dims(const char* op, const Tensor& q, const Tensor& k, const Tensor& v, int64_t heads) {
  const auto all = [&] { return q.describe() + ", " + k.describe() + ", " + v.describe(); };
  if (q.rank() < 2 || !same_leading_dims(q, k) || !same_leading_dims(q, v))
    throw Error(std::string(op) + ": expected q [..., Tq, d] and k, v [..., Tk, d] with the same leading dims, got " +
                all());
  const int r = q.rank();
  if (heads < 1 || q.dim(r - 1) % heads != 0)
    throw Error(std::string(op) + ": " + std::to_string(heads) + " heads do not divide q's last dim, got " + all());
  AttentionDims d;
  d.heads = heads;
  d.tq = q.dim(r - 2);
  d.tk = k.dim(r - 2);
  d.d = q.dim(r - 1) / heads;
  d.items = d.tq == 0 ? 0 : q.numel() / (d.tq * std::max<int64_t>(d.d, 1));
  if (v.dim(r - 2) != d.tk || k.dim(r - 1) != d.ld() || v.dim(r - 1) != d.ld())
    throw Error(std::string(op) + ": k and v must be [..., Tk, d] with q's d, got " + all());
  if (d.items < 1 || d.tq < 1 || d.tk < 1 || d.d < 1)
    throw Error(std::string(op) + ": empty operand, " + all());
  if (d.d > kMaxAttentionHeadDim)
    throw Error(std::string(op) + ": head dim " + std::to_string(d.d) + " is beyond the fused kernels' " +
                std::to_string(kMaxAttentionHeadDim) + " (use the naive path: bmm, softmax, bmm)");
  return d;
}

// The shapes and dtypes every attention call shares: q, k, v, out and lse.
AttentionDims check_attention_shapes(const char* op, const Tensor& q, const Tensor& k, const Tensor& v,
                                     const Tensor& out, const Tensor& lse, int64_t heads) {
  const AttentionDims d = attention_dims(op, q, k, v, heads);
  if (k.dtype() != q.dtype() || v.dtype() != q.dtype())
    throw Error(std::string(op) + ": q, k and v must share one dtype, got " + q.describe() + ", " + k.describe() +
                ", " + v.describe());
  check_same_shape(op, q, out);
  check_dtype(op, out, q.dtype());
  check_dtype(op, lse, DType::F32);
  if (lse.numel() != d.items * d.tq)
    throw Error(std::string(op) + ": lse " + lse.describe() + " must hold one value per query row (" +
                std::to_string(d.items * d.tq) + ")");
  return d;
}

void check_attention_grad(const char* op, const Tensor& input, const Tensor& grad) {
  check_same_shape(op, input, grad);
  if (grad.dtype() != DType::F32 && grad.dtype() != input.dtype())
    throw Error(std::string(op) + ": gradient " + grad.describe() + " must be fp32 or its input's dtype");
}

}  // namespace

AttentionDims attention(DeviceKind kind, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                        const Tensor& lse, int64_t heads) {
  const char* op = "attention";
  check_on_one_device(op, kind, {&q, &k, &v, &out, &lse});
  const AttentionDims d = check_attention_shapes(op, q, k, v, out, lse, heads);
  check_apart(op, out, {&q, &k, &v, &lse});
  check_apart(op, lse, {&q, &k, &v});
  return d;
}

AttentionDims attention_backward(DeviceKind kind, const Tensor& q, const Tensor& k, const Tensor& v,
                                 const Tensor& out, const Tensor& lse, const Tensor& dout, const Tensor& dq,
                                 const Tensor& dk, const Tensor& dv, int64_t heads) {
  const char* op = "attention_backward";
  check_on_one_device(op, kind, {&q, &k, &v, &out, &lse, &dout, &dq, &dk, &dv});
  const AttentionDims d = check_attention_shapes(op, q, k, v, out, lse, heads);
  check_same_shape(op, out, dout);
  check_dtype(op, dout, out.dtype());
  check_attention_grad(op, q, dq);
  check_attention_grad(op, k, dk);
  check_attention_grad(op, v, dv);
  check_apart(op, dq, {&q, &k, &v, &out, &lse, &dout, &dk, &dv});
  check_apart(op, dk, {&q, &k, &v, &out, &lse, &dout, &dv});
  check_apart(op, dv, {&q, &k, &v, &out, &lse, &dout});
  return d;
}

GemmDims gemm(DeviceKind kind, const GemmArgs& args) {
  const GemmDims d = check_gemm(args);  // first: it reports a missing operand
  check_on_one_device("gemm", kind, {args.a, args.b, args.c, args.bias});
  check_apart("gemm", *args.c, {args.a, args.b, args.bias});
  return d;
}

void sum_rows(DeviceKind kind, const Tensor& x, const Tensor& out) {
  check_on_one_device("sum_rows", kind, {&x, &out});
  check_dtype("sum_rows", out, DType::F32);
  if (x.rank() != 2 || out.numel() != x.dim(1))
    throw Error("sum_rows: expected x [M, N] and out [N], got " + x.describe() + " and " + out.describe());
  check_apart("sum_rows", out, {&x});
}

void sum(DeviceKind kind, const Tensor& x, const Tensor& out) {
  check_on_one_device("sum", kind, {&x, &out});
  check_f32_scalar("sum", out, kind);
  check_apart("sum", out, {&x});
}

void mse_forward(DeviceKind kind, const Tensor& pred, const Tensor& target, const Tensor& out) {
  check_on_one_device("mse_loss", kind, {&pred, &target, &out});
  check_same_shape("mse_loss", pred, target);
  check_f32_scalar("mse_loss", out, kind);
  check_apart("mse_loss", out, {&pred, &target});
}

void mse_backward(DeviceKind kind, const Tensor& pred, const Tensor& target, const Tensor& g, const Tensor& dpred) {
  const char* op = "mse_loss backward";
  check_on_one_device(op, kind, {&pred, &target, &g, &dpred});
  check_same_shape(op, pred, target);
  check_same_shape(op, pred, dpred);
  check_f32_scalar(op, g, kind);
  check_elementwise_alias(op, dpred, {&pred, &target});
  check_apart(op, dpred, {&g});
}

// logits [B, C], labels [B], loss an FP32 [1], dlogits FP32 shaped like the logits.
void cross_entropy(DeviceKind kind, const Tensor& logits, const Tensor& labels, const Tensor& loss,
                   const Tensor& dlogits) {
  check_on_one_device("cross_entropy", kind, {&logits, &labels, &loss, &dlogits});
  if (logits.rank() != 2 || labels.numel() != logits.dim(0))
    throw Error("cross_entropy: expected logits [B, C] and labels [B], got " + logits.describe() + " and " +
                labels.describe());
  if (logits.dim(1) < 1 && logits.dim(0) > 0)
    throw Error("cross_entropy: logits " + logits.describe() + " have no classes: no label can be valid");
  if (loss.numel() != 1 || loss.dtype() != DType::F32)
    throw Error("cross_entropy: expected an fp32 one-element loss, got " + loss.describe());
  check_dtype("cross_entropy", dlogits, DType::F32);
  check_same_shape("cross_entropy", logits, dlogits);
  check_apart("cross_entropy", dlogits, {&logits, &labels, &loss});
  check_apart("cross_entropy", loss, {&logits, &labels});
}

void guard(DeviceKind kind, const std::vector<const Tensor*>& grads, const Tensor& inv_scale, const Tensor& found_inf,
           const Tensor& norm, const GuardCensus& census) {
  check_scalars("guard", kind, {&inv_scale, &found_inf, &norm});
  check_on_one_device("guard", kind, {&inv_scale, &found_inf, &norm});
  check_grad_list("guard", kind, grads, found_inf);
  check_grad_list("guard", kind, grads, norm);
  check_apart("guard", found_inf, {&inv_scale, &norm});
  check_apart("guard", norm, {&inv_scale});
  if (!census.out) return;
  const Tensor& c = *census.out;
  check_on_one_device("guard", kind, {&inv_scale, &c});
  check_dtype("guard", c, DType::F32);
  if (c.rank() != 2 || c.dim(0) != static_cast<int64_t>(grads.size()) || c.dim(1) != kCensusFields)
    throw Error("guard: the census must be FP32 [" + std::to_string(grads.size()) + ", " +
                std::to_string(kCensusFields) + "] (one record per gradient), got " + c.describe());
  if (census.format != DType::F16 && census.format != DType::BF16)
    throw Error("guard: the census counts against FP16 or BF16, not " + std::string(dtype_name(census.format)));
  for (const Tensor* g : grads)
    if (g->numel() > static_cast<int64_t>(UINT32_MAX))
      throw Error("guard: the census counts in 32 bits; a gradient of " + std::to_string(g->numel()) +
                  " elements is too large for it");
  check_apart("guard", c, {&inv_scale, &found_inf, &norm});
  for (const Tensor* g : grads) check_apart("guard", c, {g});
}

void clip_coefficient(DeviceKind kind, const Tensor& norm, const Tensor& clip_coef) {
  check_scalars("clip_coefficient", kind, {&norm, &clip_coef});
  check_on_one_device("clip_coefficient", kind, {&norm, &clip_coef});
}

void unscale_inplace(DeviceKind kind, const std::vector<Tensor*>& grads, const Tensor& inv_scale,
                     const Tensor& found_inf) {
  check_scalars("unscale", kind, {&inv_scale, &found_inf});
  check_on_one_device("unscale", kind, {&inv_scale, &found_inf});
  check_apart("unscale", found_inf, {&inv_scale});
  check_grad_list("unscale", kind, grads, inv_scale);
  check_grad_list("unscale", kind, grads, found_inf);
}

void scale_inplace(DeviceKind kind, const std::vector<Tensor*>& grads, const Tensor& factor) {
  check_f32_scalar("scale_inplace", factor, kind);
  check_grad_list("scale_inplace", kind, grads, factor);
}

void scale_cast(DeviceKind kind, const Tensor& src, const Tensor& factor, const Tensor& dst) {
  check_f32_scalar("scale_cast", factor, kind);
  check_on_one_device("scale_cast", kind, {&src, &dst, &factor});
  check_dtype("scale_cast", src, DType::F32);
  if (src.numel() != dst.numel())
    throw Error("scale_cast: element counts differ, " + src.describe() + " vs " + dst.describe());
  check_elementwise_alias("scale_cast", dst, {&src});
  check_apart("scale_cast", factor, {&src, &dst});
}

void clamp_inplace(DeviceKind kind, const Tensor& x) { check_on_one_device("clamp", kind, {&x}); }

// Each slot's tensors present, on the step scalars' device, FP32 state shaped like the
// master, and no two of them sharing storage.
void adamw(DeviceKind kind, const std::vector<AdamWSlot>& slots, const StepScalars& s) {
  check_step_scalars("adamw", s, kind);
  for (size_t i = 0; i < slots.size(); ++i) {
    const AdamWSlot& sl = slots[i];
    if (!sl.master || !sl.m || !sl.v || !sl.grad)
      throw Error(slot_name("adamw", i) + " lacks its master, m, v or grad (a null tensor pointer)");
    check_on_one_device("adamw", kind, {s.found_inf, sl.master, sl.m, sl.v, sl.grad, sl.working});
    check_dtype("adamw master", *sl.master, DType::F32);
    check_dtype("adamw m", *sl.m, DType::F32);
    check_dtype("adamw v", *sl.v, DType::F32);
    for (const Tensor* t : {sl.grad, static_cast<const Tensor*>(sl.m), static_cast<const Tensor*>(sl.v)})
      check_same_shape("adamw", *sl.master, *t);
    if (sl.working) check_same_shape("adamw working copy", *sl.master, *sl.working);
    check_apart("adamw", *sl.master, {sl.m, sl.v, sl.grad, sl.working});
    check_apart("adamw", *sl.m, {sl.v, sl.grad, sl.working});
    check_apart("adamw", *sl.v, {sl.grad, sl.working});
    if (sl.working) check_apart("adamw", *sl.working, {sl.grad});
  }
}

// As adamw's; the momentum buffer (FP32 like the master) is required when momentum != 0.
void sgd(DeviceKind kind, float momentum, const std::vector<SgdSlot>& slots, const StepScalars& s) {
  check_step_scalars("sgd", s, kind);
  for (size_t i = 0; i < slots.size(); ++i) {
    const SgdSlot& sl = slots[i];
    if (!sl.master || !sl.grad) throw Error(slot_name("sgd", i) + " lacks its master or grad (a null tensor pointer)");
    const Tensor* buf = sl.momentum && sl.momentum->defined() ? sl.momentum : nullptr;
    if (momentum != 0.0f && !buf)
      throw Error(slot_name("sgd", i) + " has no momentum buffer, and momentum is " + std::to_string(momentum));
    check_on_one_device("sgd", kind, {s.found_inf, sl.master, sl.grad, buf, sl.working});
    check_dtype("sgd master", *sl.master, DType::F32);
    check_same_shape("sgd", *sl.master, *sl.grad);
    if (buf) {
      check_same_shape("sgd momentum", *sl.master, *buf);
      check_dtype("sgd momentum", *buf, DType::F32);
    }
    if (sl.working) check_same_shape("sgd working copy", *sl.master, *sl.working);
    check_apart("sgd", *sl.master, {buf, sl.grad, sl.working});
    if (buf) check_apart("sgd", *buf, {sl.grad, sl.working});
    if (sl.working) check_apart("sgd", *sl.working, {sl.grad});
  }
}

// table a non-empty FP32 vector; index and out FP32 [1]; all on one device.
void lookup(DeviceKind kind, const Tensor& table, const Tensor& index, const Tensor& out) {
  check_device_kind("lookup", table, kind);
  check_dtype("lookup table", table, DType::F32);
  if (table.rank() != 1 || table.numel() < 1)
    throw Error("lookup: the table must be a non-empty vector, got " + table.describe());
  check_scalars("lookup", kind, {&index, &out});
  check_on_one_device("lookup", kind, {&table, &index, &out});
}

void count_applied(DeviceKind kind, const Tensor& count, const Tensor& found_inf) {
  check_scalars("count_applied", kind, {&count, &found_inf});
  check_on_one_device("count_applied", kind, {&count, &found_inf});
  check_apart("count_applied", count, {&found_inf});
}

void read_async(DeviceKind kind, const std::vector<const Tensor*>& scalars) {
  if (scalars.size() > static_cast<size_t>(kMaxReadbackScalars))
    throw Error("read_async: " + std::to_string(scalars.size()) + " scalars given, at most " +
                std::to_string(kMaxReadbackScalars) + " per call; split them over several calls");
  for (const Tensor* t : scalars) {
    if (!t) throw Error("read_async: a scalar is missing (null tensor pointer)");
    check_f32_scalar("read_async", *t, kind);
    check_on_one_device("read_async", kind, {scalars.front(), t});
  }
}

void scaler_update(DeviceKind kind, const Tensor& scale, const Tensor& growth_tracker, const Tensor& hysteresis_left,
                   const Tensor& found_inf) {
  check_scalars("scaler_update", kind, {&scale, &growth_tracker, &hysteresis_left, &found_inf});
  check_on_one_device("scaler_update", kind, {&scale, &growth_tracker, &hysteresis_left, &found_inf});
  check_apart("scaler_update", scale, {&growth_tracker, &hysteresis_left, &found_inf});
  check_apart("scaler_update", growth_tracker, {&hysteresis_left, &found_inf});
  check_apart("scaler_update", hysteresis_left, {&found_inf});
}

}  // namespace checks
}  // namespace belay

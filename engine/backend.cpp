// The op table's entries (engine/backend.h): each runs its op's checks
// (engine/backend_checks.cpp) and then the backend's implementation, nothing else.
#include "engine/backend.h"

#include "engine/backend_checks.h"
#include "engine/error.h"

namespace belay {

void Backend::cast(const Tensor& src, Tensor& dst) const {
  checks::cast(kind_, src, dst);
  cast_impl(src, dst);
}
void Backend::scale_cast(const Tensor& src, const Tensor& factor, Tensor& dst) const {
  checks::scale_cast(kind_, src, factor, dst);
  scale_cast_impl(src, factor, dst);
}
void Backend::cast_census(const Tensor& src, Tensor& dst, Tensor& record) const {
  checks::cast_census(kind_, src, dst, record);
  cast_census_impl(src, dst, record);
}
void Backend::fill(Tensor& t, float value) const {
  checks::fill(kind_, t);
  fill_impl(t, value);
}
void Backend::binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out) const {
  checks::elementwise("binary", kind_, {&a, &b}, out);
  binary_impl(op, a, b, out);
}
void Backend::scale(const Tensor& x, float s, Tensor& out) const {
  checks::elementwise("scale", kind_, {&x}, out);
  scale_impl(x, s, out);
}
void Backend::accumulate(Tensor& dst, const Tensor& src, float alpha, const Tensor* s) const {
  checks::accumulate(kind_, dst, src, s);
  accumulate_impl(dst, src, alpha, s);
}
void Backend::broadcast_scalar(const Tensor& s, float alpha, Tensor& out) const {
  checks::broadcast_scalar(kind_, s, out);
  broadcast_scalar_impl(s, alpha, out);
}
void Backend::activation(Activation act, const Tensor& x, Tensor& y) const {
  checks::elementwise("activation", kind_, {&x}, y);
  activation_impl(act, x, y);
}
void Backend::activation_backward(Activation act, const Tensor& x, const Tensor& dy, Tensor& dx) const {
  checks::elementwise("activation_backward", kind_, {&x, &dy}, dx);
  activation_backward_impl(act, x, dy, dx);
}
void Backend::unary(UnaryOp op, float p, const Tensor& x, Tensor& y) const {
  checks::elementwise("unary", kind_, {&x}, y);
  unary_impl(op, p, x, y);
}
void Backend::unary_backward(UnaryOp op, float p, const Tensor& x, const Tensor& y, const Tensor& dy,
                             Tensor& dx) const {
  checks::elementwise("unary_backward", kind_, {&x, &y, &dy}, dx);
  unary_backward_impl(op, p, x, y, dy, dx);
}
void Backend::binary_broadcast(BinaryOp op, const Tensor& a, const Tensor& b, const AxisView& view, bool swapped,
                               Tensor& out) const {
  checks::binary_broadcast(kind_, a, b, view, out);
  binary_broadcast_impl(op, a, b, view, swapped, out);
}
void Backend::broadcast_axis(const Tensor& g, const AxisView& view, float alpha, Tensor& out) const {
  checks::broadcast_axis(kind_, g, view, out);
  broadcast_axis_impl(g, view, alpha, out);
}
void Backend::sum_axis(const Tensor& x, const AxisView& view, float alpha, Tensor& out, bool accumulate) const {
  checks::sum_axis(kind_, x, view, out);
  sum_axis_impl(x, view, alpha, out, accumulate);
}
void Backend::softmax(const Tensor& x, int64_t cols, bool log, bool causal, Tensor& y) const {
  checks::softmax(kind_, x, cols, y);
  softmax_impl(x, cols, log, causal, y);
}
void Backend::softmax_backward(const Tensor& y, const Tensor& dy, int64_t cols, bool log, bool causal,
                               Tensor& dx) const {
  checks::softmax_backward(kind_, y, dy, cols, dx);
  softmax_backward_impl(y, dy, cols, log, causal, dx);
}
void Backend::embedding(const Tensor& table, const Tensor& ids, Tensor& out) const {
  checks::embedding(kind_, table, ids, out);
  embedding_impl(table, ids, out);
}
void Backend::embedding_backward(const Tensor& dout, const Tensor& ids, Tensor& dtable) const {
  checks::embedding_backward(kind_, dout, ids, dtable);
  embedding_backward_impl(dout, ids, dtable);
}
void Backend::layer_norm(const Tensor& x, const Tensor* weight, const Tensor* bias, float eps, Tensor& y,
                         Tensor& mean, Tensor& rstd) const {
  checks::layer_norm(kind_, x, weight, bias, y, mean, rstd);
  layer_norm_impl(x, weight, bias, eps, y, mean, rstd);
}
void Backend::layer_norm_backward(const Tensor& x, const Tensor* weight, const Tensor& mean, const Tensor& rstd,
                                  const Tensor& dy, Tensor& dx, Tensor* dweight, Tensor* dbias,
                                  bool accumulate) const {
  checks::layer_norm_backward(kind_, x, weight, mean, rstd, dy, dx, dweight, dbias);
  layer_norm_backward_impl(x, weight, mean, rstd, dy, dx, dweight, dbias, accumulate);
}
void Backend::transpose(const Tensor& x, Tensor& out) const {
  checks::transpose(kind_, x, out);
  transpose_impl(x, out);
}
void Backend::swap_axes(const Tensor& x, const SwapAxesView& view, Tensor& out) const {
  checks::swap_axes(kind_, x, view, out);
  swap_axes_impl(x, view, out);
}
void Backend::attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, float scale, Tensor& out,
                        Tensor& lse, int64_t heads) const {
  const AttentionDims dims = checks::attention(kind_, q, k, v, out, lse, heads);
  attention_impl(q, k, v, causal, scale, dims, out, lse);
}
void Backend::attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                 const Tensor& lse, const Tensor& dout, bool causal, float scale, Tensor& dq,
                                 Tensor& dk, Tensor& dv, int64_t heads) const {
  const AttentionDims dims = checks::attention_backward(kind_, q, k, v, out, lse, dout, dq, dk, dv, heads);
  attention_backward_impl(q, k, v, out, lse, dout, causal, scale, dims, dq, dk, dv);
}
void Backend::gemm(const GemmArgs& args) const { gemm_impl(args, checks::gemm(kind_, args)); }
void Backend::sum_rows(const Tensor& x, Tensor& out, bool accumulate) const {
  checks::sum_rows(kind_, x, out);
  sum_rows_impl(x, out, accumulate);
}
void Backend::sum(const Tensor& x, Tensor& out) const {
  checks::sum(kind_, x, out);
  sum_impl(x, out);
}
void Backend::mse_forward(const Tensor& pred, const Tensor& target, Tensor& out) const {
  checks::mse_forward(kind_, pred, target, out);
  mse_forward_impl(pred, target, out);
}
void Backend::mse_backward(const Tensor& pred, const Tensor& target, const Tensor& g, Tensor& dpred) const {
  checks::mse_backward(kind_, pred, target, g, dpred);
  mse_backward_impl(pred, target, g, dpred);
}
void Backend::cross_entropy(const Tensor& logits, const Tensor& labels, Tensor& loss, Tensor& dlogits_unit) const {
  checks::cross_entropy(kind_, logits, labels, loss, dlogits_unit);
  cross_entropy_impl(logits, labels, loss, dlogits_unit);
}
void Backend::guard(const std::vector<const Tensor*>& grads, const Tensor& inv_scale, Tensor& found_inf,
                    Tensor& norm, const GuardCensus& census) const {
  checks::guard(kind_, grads, inv_scale, found_inf, norm, census);
  guard_impl(grads, inv_scale, found_inf, norm, census);
}
void Backend::guard_partials(const std::vector<const Tensor*>& grads, const Tensor& inv_scale,
                             std::vector<double>& partials) const {
  Tensor found = Tensor::empty(Shape{1}, DType::F32, Device::cpu());
  Tensor norm = Tensor::empty(Shape{1}, DType::F32, Device::cpu());
  if (kind_ == DeviceKind::CPU) checks::guard(kind_, grads, inv_scale, found, norm, {});
  guard_partials_impl(grads, inv_scale, partials);
}
void Backend::guard_partials_impl(const std::vector<const Tensor*>&, const Tensor&, std::vector<double>&) const {
  throw UsageError("the guard's per-tensor sums (a sharded optimizer, --shard-optimizer) are on the CPU backend only");
}
void Backend::clip_coefficient(const Tensor& norm, float max_norm, Tensor& clip_coef) const {
  checks::clip_coefficient(kind_, norm, clip_coef);
  clip_coefficient_impl(norm, max_norm, clip_coef);
}
void Backend::unscale_inplace(const std::vector<Tensor*>& grads, const Tensor& inv_scale, Tensor& found_inf) const {
  checks::unscale_inplace(kind_, grads, inv_scale, found_inf);
  unscale_inplace_impl(grads, inv_scale, found_inf);
}
void Backend::scale_inplace(const std::vector<Tensor*>& grads, const Tensor& factor) const {
  checks::scale_inplace(kind_, grads, factor);
  scale_inplace_impl(grads, factor);
}
void Backend::clamp_inplace(Tensor& x, float lo, float hi) const {
  checks::clamp_inplace(kind_, x);
  clamp_inplace_impl(x, lo, hi);
}
void Backend::adamw(const AdamWHyper& hyper, const std::vector<AdamWSlot>& slots, const StepScalars& s) const {
  checks::adamw(kind_, slots, s);
  adamw_impl(hyper, slots, s);
}
void Backend::sgd(float momentum, const std::vector<SgdSlot>& slots, const StepScalars& s) const {
  checks::sgd(kind_, momentum, slots, s);
  sgd_impl(momentum, slots, s);
}
void Backend::lookup(const Tensor& table, const Tensor& index, Tensor& out) const {
  checks::lookup(kind_, table, index, out);
  lookup_impl(table, index, out);
}
void Backend::count_applied(Tensor& count, const Tensor& found_inf) const {
  checks::count_applied(kind_, count, found_inf);
  count_applied_impl(count, found_inf);
}
std::unique_ptr<HostReadback> Backend::read_async(const std::vector<const Tensor*>& scalars) const {
  checks::read_async(kind_, scalars);
  return read_async_impl(scalars);
}
void Backend::scaler_update(const ScalerConfig& config, Tensor& scale, Tensor& growth_tracker,
                            Tensor& hysteresis_left, const Tensor& found_inf) const {
  checks::scaler_update(kind_, scale, growth_tracker, hysteresis_left, found_inf);
  scaler_update_impl(config, scale, growth_tracker, hysteresis_left, found_inf);
}

}  // namespace belay

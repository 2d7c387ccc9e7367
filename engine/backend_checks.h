// The argument checks of the op table (engine/backend.h), one per op, run by Backend's entries
// before any backend's `<op>_impl`: the one place where a call's tensors are checked, so every
// backend refuses the same calls with the same Error. `kind` is the backend's device kind.
#pragma once
#include <initializer_list>
#include <vector>

#include "engine/backend.h"

namespace belay {

StoredMatrix stored_matrix(const Tensor& t);
// A product's operands: all three on one device, A and B of one dtype, the shapes chaining,
// beta 0 or 1 (with an FP32 C), the bias of length N, a batch's items inside their operands.
// Also the CPU GEMM's own entry check (kernels/cpu/cpu_gemm.h, which tests and benchmarks
// call per ISA); throws Error naming what does not match.
GemmDims check_gemm(const GemmArgs& args);

namespace checks {

void cast(DeviceKind kind, const Tensor& src, const Tensor& dst);
// cast_census: an FP32 src into an FP16 or BF16 dst of as many elements (apart from it), at most
// 2^32 - 1 of them (the counts are 32-bit words), and the record FP32 [kCensusFields] apart
// from both.
void cast_census(DeviceKind kind, const Tensor& src, const Tensor& dst, const Tensor& record);
void fill(DeviceKind kind, const Tensor& t);
// binary, scale, activation, unary and their backwards: `inputs` and `out` of one shape.
void elementwise(const char* op, DeviceKind kind, std::initializer_list<const Tensor*> inputs, const Tensor& out);
void accumulate(DeviceKind kind, const Tensor& dst, const Tensor& src, const Tensor* s);
void broadcast_scalar(DeviceKind kind, const Tensor& s, const Tensor& out);
void binary_broadcast(DeviceKind kind, const Tensor& a, const Tensor& b, const AxisView& view, const Tensor& out);
void broadcast_axis(DeviceKind kind, const Tensor& g, const AxisView& view, const Tensor& out);
void sum_axis(DeviceKind kind, const Tensor& x, const AxisView& view, const Tensor& out);
void softmax(DeviceKind kind, const Tensor& x, int64_t cols, const Tensor& y);
void softmax_backward(DeviceKind kind, const Tensor& y, const Tensor& dy, int64_t cols, const Tensor& dx);
void embedding(DeviceKind kind, const Tensor& table, const Tensor& ids, const Tensor& out);
void embedding_backward(DeviceKind kind, const Tensor& dout, const Tensor& ids, const Tensor& dtable);
void layer_norm(DeviceKind kind, const Tensor& x, const Tensor* weight, const Tensor* bias, const Tensor& y,
                const Tensor& mean, const Tensor& rstd);
void layer_norm_backward(DeviceKind kind, const Tensor& x, const Tensor* weight, const Tensor& mean,
                         const Tensor& rstd, const Tensor& dy, const Tensor& dx, const Tensor* dweight,
                         const Tensor* dbias);
void transpose(DeviceKind kind, const Tensor& x, const Tensor& out);
void swap_axes(DeviceKind kind, const Tensor& x, const SwapAxesView& view, const Tensor& out);
// attention: q [..., Tq, d], k and v [..., Tk, d] with the same leading dims, one dtype (FP32,
// FP16, BF16), 1 <= d <= kMaxAttentionHeadDim; out like q, lse FP32 [..., Tq]; outputs apart.
// heads > 1: the last dim is heads x d (heads side by side), lse holds heads x Tq per item.
AttentionDims attention(DeviceKind kind, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                        const Tensor& lse, int64_t heads);
// attention_backward: the forward's checks on q, k, v, out, lse; dout like out; dq, dk, dv
// shaped as q, k, v, each FP32 or q's dtype, apart from every input and from each other.
AttentionDims attention_backward(DeviceKind kind, const Tensor& q, const Tensor& k, const Tensor& v,
                                 const Tensor& out, const Tensor& lse, const Tensor& dout, const Tensor& dq,
                                 const Tensor& dk, const Tensor& dv, int64_t heads);
GemmDims gemm(DeviceKind kind, const GemmArgs& args);
void sum_rows(DeviceKind kind, const Tensor& x, const Tensor& out);
void sum(DeviceKind kind, const Tensor& x, const Tensor& out);
void mse_forward(DeviceKind kind, const Tensor& pred, const Tensor& target, const Tensor& out);
void mse_backward(DeviceKind kind, const Tensor& pred, const Tensor& target, const Tensor& g, const Tensor& dpred);
void cross_entropy(DeviceKind kind, const Tensor& logits, const Tensor& labels, const Tensor& loss,
                   const Tensor& dlogits);
void guard(DeviceKind kind, const std::vector<const Tensor*>& grads, const Tensor& inv_scale, const Tensor& found_inf,
           const Tensor& norm, const GuardCensus& census);
void clip_coefficient(DeviceKind kind, const Tensor& norm, const Tensor& clip_coef);
void unscale_inplace(DeviceKind kind, const std::vector<Tensor*>& grads, const Tensor& inv_scale,
                     const Tensor& found_inf);
void scale_inplace(DeviceKind kind, const std::vector<Tensor*>& grads, const Tensor& factor);
void scale_cast(DeviceKind kind, const Tensor& src, const Tensor& factor, const Tensor& dst);
void clamp_inplace(DeviceKind kind, const Tensor& x);
void adamw(DeviceKind kind, const std::vector<AdamWSlot>& slots, const StepScalars& s);
void sgd(DeviceKind kind, float momentum, const std::vector<SgdSlot>& slots, const StepScalars& s);
void lookup(DeviceKind kind, const Tensor& table, const Tensor& index, const Tensor& out);
void count_applied(DeviceKind kind, const Tensor& count, const Tensor& found_inf);
void read_async(DeviceKind kind, const std::vector<const Tensor*>& scalars);
void scaler_update(DeviceKind kind, const Tensor& scale, const Tensor& growth_tracker, const Tensor& hysteresis_left,
                   const Tensor& found_inf);

}  // namespace checks
}  // namespace belay

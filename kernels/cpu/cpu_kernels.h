// The CPU backend's kernels as free functions, a file per concern named as kernels/cuda's
// (elementwise_kernels.cpp beside elementwise_kernels.cu, ...); kernels/cpu/cpu_backend.cpp
// only dispatches to them. Each takes the arguments of the Backend op of the same name
// (engine/backend.h) after engine/backend_checks.cpp has checked them, and relies on that.
#pragma once
#include <vector>

#include "engine/backend.h"

namespace belay::cpu {

// ---- cast_kernels.cpp
void cast(const Tensor& src, Tensor& dst);
void scale_cast(const Tensor& src, const Tensor& factor, Tensor& dst);
void cast_census(const Tensor& src, Tensor& dst, Tensor& record);
void fill(Tensor& t, float value);

// ---- elementwise_kernels.cpp
void binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out);
void scale(const Tensor& x, float s, Tensor& out);
void accumulate(Tensor& dst, const Tensor& src, float alpha, const Tensor* s);
void broadcast_scalar(const Tensor& s, float alpha, Tensor& out);
void activation(Activation act, const Tensor& x, Tensor& y);
void activation_backward(Activation act, const Tensor& x, const Tensor& dy, Tensor& dx);
void clamp_inplace(Tensor& x, float lo, float hi);
void scale_inplace(const std::vector<Tensor*>& grads, const Tensor& factor);

// ---- math_kernels.cpp (the Var operators)
void unary(UnaryOp op, float p, const Tensor& x, Tensor& y);
void unary_backward(UnaryOp op, float p, const Tensor& x, const Tensor& y, const Tensor& dy, Tensor& dx);
void binary_broadcast(BinaryOp op, const Tensor& a, const Tensor& b, const AxisView& view, bool swapped,
                      Tensor& out);
void broadcast_axis(const Tensor& g, const AxisView& view, float alpha, Tensor& out);
void sum_axis(const Tensor& x, const AxisView& view, float alpha, Tensor& out, bool accumulate);
void transpose(const Tensor& x, Tensor& out);
void swap_axes(const Tensor& x, const SwapAxesView& view, Tensor& out);

// ---- softmax_kernels.cpp
void softmax(const Tensor& x, int64_t cols, bool log, bool causal, Tensor& y);
void softmax_backward(const Tensor& y, const Tensor& dy, int64_t cols, bool log, bool causal, Tensor& dx);

// ---- attention_kernels.cpp (FlashAttention-2's tiles on the active ISA path: docs/attention.md)
void attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, float scale, const AttentionDims& dims,
               Tensor& out, Tensor& lse);
void attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                        const Tensor& dout, bool causal, float scale, const AttentionDims& dims, Tensor& dq,
                        Tensor& dk, Tensor& dv);

// ---- attention_bf16.cpp (the same two with the products on BF16 pairs: attention() and
// attention_backward() send BF16 inputs there on the amx path (AMX tiles) and the avx512bf16
// path (VDPBF16PS), attention_on_bf16_pairs; docs/attention.md)
bool attention_on_bf16_pairs(const Tensor& q);
void attention_bf16(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, float scale,
                    const AttentionDims& dims, Tensor& out, Tensor& lse);
void attention_backward_bf16(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                             const Tensor& dout, bool causal, float scale, const AttentionDims& dims, Tensor& dq,
                             Tensor& dk, Tensor& dv);
// The amx path's code on the emulator of the tile instructions (kernels/cpu/isa/amx_tiles.h) with baseline's
// softmax: runs on any x86-64 CPU (tests; amx_emulator_faults() in cpu_gemm.h counts the faults).
void attention_amx_emulated(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, float scale,
                            const AttentionDims& dims, Tensor& out, Tensor& lse);
void attention_backward_amx_emulated(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                     const Tensor& lse, const Tensor& dout, bool causal, float scale,
                                     const AttentionDims& dims, Tensor& dq, Tensor& dk, Tensor& dv);

// ---- embedding_kernels.cpp (an id that is not a row of the table: UsageError)
void embedding(const Tensor& table, const Tensor& ids, Tensor& out);
void embedding_backward(const Tensor& dout, const Tensor& ids, Tensor& dtable);

// ---- layer_norm_kernels.cpp
void layer_norm(const Tensor& x, const Tensor* weight, const Tensor* bias, float eps, Tensor& y, Tensor& mean,
                Tensor& rstd);
void layer_norm_backward(const Tensor& x, const Tensor* weight, const Tensor& mean, const Tensor& rstd,
                         const Tensor& dy, Tensor& dx, Tensor* dweight, Tensor* dbias, bool accumulate);

// ---- reduce_kernels.cpp
void sum_rows(const Tensor& x, Tensor& out, bool accumulate);
void sum(const Tensor& x, Tensor& out);
void mse_forward(const Tensor& pred, const Tensor& target, Tensor& out);
void mse_backward(const Tensor& pred, const Tensor& target, const Tensor& g, Tensor& dpred);

// ---- cross_entropy_kernels.cpp (a label that is not a class index: Error)
void cross_entropy(const Tensor& logits, const Tensor& labels, Tensor& loss, Tensor& dlogits);

// ---- guard_kernels.cpp
void guard(const std::vector<const Tensor*>& grads, const Tensor& inv_scale, Tensor& found_inf, Tensor& norm);
void guard_partials(const std::vector<const Tensor*>& grads, const Tensor& inv_scale, std::vector<double>& partials);
void guard_census(const std::vector<const Tensor*>& grads, const Tensor& inv_scale, Tensor& found_inf, Tensor& norm,
                  const GuardCensus& census);
void clip_coefficient(const Tensor& norm, float max_norm, Tensor& clip_coef);
void unscale_inplace(const std::vector<Tensor*>& grads, const Tensor& inv_scale, Tensor& found_inf);

// ---- optimizer_kernels.cpp
void adamw(const AdamWHyper& hyper, const std::vector<AdamWSlot>& slots, const StepScalars& s);
void sgd(float momentum, const std::vector<SgdSlot>& slots, const StepScalars& s);
void scaler_update(const ScalerConfig& c, Tensor& scale, Tensor& growth_tracker, Tensor& hysteresis_left,
                   const Tensor& found_inf);

// ---- step_scalar_kernels.cpp
void lookup(const Tensor& table, const Tensor& index, Tensor& out);
void count_applied(Tensor& count, const Tensor& found_inf);

}  // namespace belay::cpu

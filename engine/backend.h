// Internal to belay (installed only because public headers include it): user code calls the
// ops of autograd/ops.h and the modules instead.
// The op table: everything a device must do for belay to train on it. kernels/cpu and
// kernels/cuda each implement it; autograd, optim and amp reach the hardware only
// through it, so every backend is tested against the CPU one op by op (as ggml does).
// Scalars that steer a step (loss scale, found_inf, clip coefficient) are one-element
// FP32 tensors on the backend's device, so a step never needs a host round trip.
#pragma once
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "engine/activation.h"
#include "engine/allocator.h"
#include "engine/tensor.h"

namespace belay {

enum class BinaryOp { Add, Sub, Mul, Div };
// Elementwise functions with a backward computed from x and y = f(x) (kernels/common/
// unary_math.h: the formula both backends use). Pow's exponent is the op's parameter p.
enum class UnaryOp { Exp, Log, Tanh, Sigmoid, Pow };

// A tensor seen as [outer, len, inner] around one axis (or a run of adjacent axes) of
// extent len: reductions over that axis and broadcasts along it index the same way. The
// reduced (or broadcast) operand is [outer, inner]: element (o, l, i) of the full tensor
// reads element o * inner + i of it. A row [N] over [M, N] is {1, M, N}; a column [M, 1]
// over [M, N] is {M, N, 1}; a scalar over n elements is {1, n, 1}.
struct AxisView {
  int64_t outer = 1, len = 1, inner = 1;
  constexpr int64_t reduced_index(int64_t full_index) const { return full_index / (len * inner) * inner + full_index % inner; }
};

// C[M,N] = op(A)[M,K] * op(B)[K,N] (+ bias[N]) (+ C if beta == 1).
// A and B are FP32, FP16 or BF16 (same dtype); products and sums are FP32; C is written in
// its own dtype (rounded once). beta == 1 needs an FP32 C: it is how weight gradients
// accumulate across micro-batches with no extra pass.
// Batched (batch > 1): C_i = op(A_i) op(B_i) (+ bias) (+ C_i) for i < batch, each item with
// the bits of the unbatched call on it. The matrices are each operand's last two dims;
// A_i starts stride_a elements after A_{i-1} (0: one A for every item, as a weight shared
// over the batch), likewise B_i; C is dense, [..., M, N] with batch * M * N elements. A
// nonzero stride is a whole number of stored rows, at least one matrix: attention's
// [B, H, T, d] x [B, H, d, T] is batch B * H with strides T * d.
struct GemmArgs {
  const Tensor* a = nullptr;
  bool trans_a = false;
  const Tensor* b = nullptr;
  bool trans_b = false;
  Tensor* c = nullptr;
  float beta = 0.0f;
  const Tensor* bias = nullptr;
  int64_t batch = 1;
  int64_t stride_a = 0, stride_b = 0;  // elements; 0: broadcast over the batch
};

// The extents of a product, once its operands are checked (check_gemm, engine/backend_checks.h).
struct GemmDims {
  int64_t m = 0, n = 0, k = 0;
};
// The stored extents of a GEMM operand: its last two dims (a matrix, or each item of a batch).
struct StoredMatrix {
  int64_t rows = 0, cols = 0;
};
// swap_axes's view of a tensor: [outer, p, mid, q, inner] (Backend::swap_axes, below).
struct SwapAxesView {
  int64_t outer = 1, p = 1, mid = 1, q = 1, inner = 1;
  constexpr int64_t numel() const { return outer * p * mid * q * inner; }
};

// The extents of a fused attention call, once checked (checks::attention): `items` = B H
// problems, each q [tq, d] against k and v [tk, d]. heads = 1: the operands are [items, T, d];
// heads = H > 1: they are [B, T, H d] as the Linears give them (item b H + h: head h's d
// columns of sequence b's rows), so no copy splits or merges the heads.
struct AttentionDims {
  int64_t items = 1, tq = 1, tk = 1, d = 1, heads = 1;
  int64_t ld() const { return heads * d; }  // elements from one row of an item to its next
  // The element where row r of `item` starts, in an operand of `rows` rows per item (tq or tk).
  int64_t row_at(int64_t item, int64_t r, int64_t rows) const {
    return ((item / heads) * rows + r) * heads * d + (item % heads) * d;
  }
};
// The largest head dim the fused attention takes on every backend (GPT-2: 64).
constexpr int64_t kMaxAttentionHeadDim = 128;

struct AdamWHyper {
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
};

// The device scalars an optimizer pass reads: FP32 [1] tensors on the parameters' device,
// written by earlier kernels of the same step (the guard, the clip coefficient, the LR
// lookup), so the step is enqueued without the host ever reading one of them.
struct StepScalars {
  const Tensor* inv_scale = nullptr;      // gradients are multiplied by it on the fly ...
  const Tensor* clip_coef = nullptr;      // ... and by it
  const Tensor* found_inf = nullptr;      // nonzero: the pass changes nothing
  const Tensor* lr = nullptr;             // this step's learning rate
  const Tensor* applied_steps = nullptr;  // steps applied before this one: AdamW's t is this + 1
};

// One parameter's state as the fused AdamW pass sees it.
struct AdamWSlot {
  Tensor* master = nullptr;   // FP32
  Tensor* m = nullptr;        // FP32
  Tensor* v = nullptr;        // FP32
  const Tensor* grad = nullptr;  // FP32 or the compute dtype
  Tensor* working = nullptr;  // FP16/BF16 copy refreshed from the new master; null when FP32
  float weight_decay = 0.0f;
};

struct SgdSlot {
  Tensor* master = nullptr;
  Tensor* momentum = nullptr;  // FP32; undefined-free when momentum == 0
  const Tensor* grad = nullptr;
  Tensor* working = nullptr;
  float weight_decay = 0.0f;
};

// The rule of dynamic loss scaling that scaler_update applies, defined once: amp/grad_scaler.h's
// GradScalerOptions is this plus whether scaling is on and the scale it starts from.
struct ScalerConfig {
  float growth_factor = 2.0f;
  float backoff_factor = 0.5f;
  int growth_interval = 2000;
  int hysteresis = 1;  // overflows tolerated before backing off (1: back off on the first)
  float min_scale = 1.0f;
  float max_scale = 16777216.0f;  // 2^24
};

// Values on their way from the device to the host. The copy is enqueued behind the work
// that computes them; the host asks later (a log row, one step late) and waits only then.
// The guard's optional census output (Backend::guard).
struct GuardCensus {
  Tensor* out = nullptr;
  DType format = DType::F16;
};

class HostReadback {
 public:
  virtual ~HostReadback() = default;
  virtual bool ready() const = 0;                // the values have landed; never blocks
  virtual const std::vector<float>& wait() = 0;  // blocks until they have; the values
};
// The most scalars one read_async takes, on every backend: the CUDA gather is one warp into
// one pinned slot of this many floats (kernels/cuda/readback_kernels.cu).
constexpr int kMaxReadbackScalars = 16;

// Every op is a non-virtual entry that checks its arguments once for every backend
// (engine/backend_checks.cpp: each tensor defined and on this backend's kind of device, all
// on one device, dtypes, shapes, slot fields, scalars, aliasing) and then calls the backend's
// `<op>_impl`. So a mismatched call is the same Error on every backend, and no backend can
// forget a check another makes.
// Aliasing: the elementwise ops (cast within one dtype, binary, scale, accumulate,
// broadcast_scalar, activation, unary and their backwards, binary_broadcast's `a`,
// mse_backward, clip_coefficient) let an output be an input, the same storage and dtype;
// every other op refuses an output that shares storage with an input or another output.
class Backend {
 public:
  explicit Backend(DeviceKind kind) : kind_(kind) {}
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  DeviceKind kind() const { return kind_; }  // the device kind every tensor argument must be on

  // Memory.
  virtual RawMemory raw_memory() const = 0;
  virtual void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) const = 0;
  virtual void synchronize() const = 0;

  // Elementwise. `out` may alias an input (the same storage and dtype). Inputs of mixed
  // dtypes are computed in FP32.
  void cast(const Tensor& src, Tensor& dst) const;
  // dst = src * factor[0] (an FP32 device scalar), the product in FP32 and rounded once into
  // dst's dtype: scale_inplace then cast, in one pass and with their bits (the cross-entropy's
  // unit gradient, scaled by the loss scale and rounded into the BF16/FP16 logits' gradient).
  void scale_cast(const Tensor& src, const Tensor& factor, Tensor& dst) const;
  // cast from FP32 into FP16 or BF16, and in the same read the cast's census (engine/census.h:
  // kCensusFields words, FP32 [kCensusFields] read as bits) added into `record`: the values that
  // became non-finite (inf or NaN given, or rounded to inf), exact zeros, values that rounded
  // to zero, that landed subnormal, and the largest finite magnitude given (cast_census_class
  // of kernels/common/census_math.h). dst gets the bits cast() gives. Counts add up over calls:
  // one record can gather every cast of one site in a step.
  void cast_census(const Tensor& src, Tensor& dst, Tensor& record) const;
  void fill(Tensor& t, float value) const;
  void binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out) const;
  void scale(const Tensor& x, float s, Tensor& out) const;
  // dst += alpha * src * (s ? s[0] : 1): gradient accumulation (dst may be FP32, src low).
  void accumulate(Tensor& dst, const Tensor& src, float alpha, const Tensor* s) const;
  // out[i] = s[0] * alpha for every i: the backward of sum/mean.
  void broadcast_scalar(const Tensor& s, float alpha, Tensor& out) const;
  void activation(Activation act, const Tensor& x, Tensor& y) const;
  void activation_backward(Activation act, const Tensor& x, const Tensor& dy, Tensor& dx) const;
  // y = f(x) in FP32, rounded once into y's dtype; p: Pow's exponent (ignored otherwise).
  void unary(UnaryOp op, float p, const Tensor& x, Tensor& y) const;
  // dx = dy * f'(x), from x and y = f(x) (exp, tanh, sigmoid use y).
  void unary_backward(UnaryOp op, float p, const Tensor& x, const Tensor& y, const Tensor& dy, Tensor& dx) const;
  // out[k] = a[k] op b[view.reduced_index(k)] (swapped: b[...] op a[k]): b broadcast over a,
  // whose shape out has. b has view.outer * view.inner elements.
  void binary_broadcast(BinaryOp op, const Tensor& a, const Tensor& b, const AxisView& view, bool swapped,
                        Tensor& out) const;
  // out[k] = alpha * g[view.reduced_index(k)]: the backward of sum_axis (g broadcast back).
  void broadcast_axis(const Tensor& g, const AxisView& view, float alpha, Tensor& out) const;
  // out[o, i] (+)= alpha * sum over l of x[o, l, i], summed in double in l order and rounded
  // once (accumulate: added to out in FP32 first). out has view.outer * view.inner elements.
  void sum_axis(const Tensor& x, const AxisView& view, float alpha, Tensor& out, bool accumulate) const;
  // Softmax (log: log-softmax) of each row of x seen as [numel / cols, cols] (the last dim):
  // the row maximum subtracted, exp in FP32, the normaliser summed in double, y rounded once
  // into its dtype. causal: row r keeps columns c <= r % cols and the rest are masked (y = 0,
  // log: -inf), the mask of attention scores [..., T, T] (rows r of a T x T block are the queries).
  void softmax(const Tensor& x, int64_t cols, bool log, bool causal, Tensor& y) const;
  // dx from y and dy, row by row: softmax dx = y (dy - sum(dy y)); log-softmax
  // dx = dy - exp(y) sum(dy). Masked (causal) entries are constants: their dx is 0 and their
  // dy is left out of the sums.
  void softmax_backward(const Tensor& y, const Tensor& dy, int64_t cols, bool log, bool causal, Tensor& dx) const;
  // Embedding: row r of out = row ids[r] of table, bit for bit (out has the table's dtype).
  // ids hold row indices as FP32 values (as cross_entropy's labels: exact up to 2^24); an id
  // that is not an integer in [0, V) is an Error naming it and its position. (CUDA: the host
  // never reads device memory, so there, as with cross_entropy's labels, such an id gives a
  // NaN row instead, and the backward leaves it out.)
  void embedding(const Tensor& table, const Tensor& ids, Tensor& out) const;
  // dtable [V, D] (FP32) += the rows of dout, row r added into row ids[r], deterministically:
  // the result has the bits of the sequential loop `for r in order: dtable[ids[r]] += dout[r]`
  // (FP32 additions) at any thread count, repeated ids included. Each table row is owned by
  // one worker, which adds its occurrences in r order: no float atomics.
  void embedding_backward(const Tensor& dout, const Tensor& ids, Tensor& dtable) const;
  // LayerNorm over the last dim of x seen as [rows, cols]: mean and variance (biased, over cols)
  // in FP32 whatever x's dtype, y = (x - mean) * rstd * weight + bias rounded once into y's
  // dtype, rstd = 1 / sqrt(var + eps). weight and bias may be null (1 and 0). mean and rstd
  // (FP32 [rows]) are written for the backward.
  void layer_norm(const Tensor& x, const Tensor* weight, const Tensor* bias, float eps, Tensor& y, Tensor& mean,
                  Tensor& rstd) const;
  // From x, mean, rstd and dy: dx = rstd (g - mean(g) - xhat mean(g xhat)) with g = dy weight
  // and xhat = (x - mean) rstd, rounded once into dx's dtype; dweight (+)= sum over rows of
  // dy xhat and dbias (+)= sum over rows of dy (FP32, each null when not wanted; added to when
  // accumulate), summed in a fixed order whatever the thread count.
  void layer_norm_backward(const Tensor& x, const Tensor* weight, const Tensor& mean, const Tensor& rstd,
                           const Tensor& dy, Tensor& dx, Tensor* dweight, Tensor* dbias, bool accumulate) const;
  // out [N, M] = x [M, N] transposed, bit for bit (same dtype).
  void transpose(const Tensor& x, Tensor& out) const;
  // Two axes of x swapped, bit for bit (same dtype): x seen as [outer, p, mid, q, inner] is
  // written as out [outer, q, mid, p, inner]. The heads of attention ([B, T, H, d] <->
  // [B, H, T, d] is {B, T, 1, H, d}); its own inverse with p and q exchanged.
  void swap_axes(const Tensor& x, const SwapAxesView& view, Tensor& out) const;

  // Fused attention (FlashAttention-2's algorithm: docs/attention.md), forward: for each item
  // of q [..., Tq, d] and k, v [..., Tk, d] (the same leading dims, e.g. [B, H]; one dtype,
  // FP32, FP16 or BF16; 1 <= d <= kMaxAttentionHeadDim), or with heads = H > 1, q [..., Tq, H d]
  // and k, v [..., Tk, H d] whose last dim holds the H heads side by side (out alike, lse
  // [..., H, Tq]):
  //   out [..., Tq, d] = softmax(scale q k^T, masked) v, in q's dtype;
  //   lse [..., Tq] (FP32) = log of each query row's sum over its unmasked keys of
  //   exp(scale q.k), the one value per row the backward needs.
  // The [Tq, Tk] scores are never stored: they live a tile at a time in registers and L1 (or
  // shared memory), so the extra memory is O(items Tq), never O(Tq Tk). The score products,
  // the running max, the sum and the rescaling are FP32 whatever the dtype.
  // causal: query i sees keys j <= i + Tk - Tq (the mask aligned at the end, so with Tq == Tk it
  // is the usual lower triangle, and a single new query of a KV cache sees every cached key).
  // A query that sees no key (causal with Tq > Tk) gets out = 0 and lse = -inf.
  void attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, float scale, Tensor& out,
                 Tensor& lse, int64_t heads = 1) const;
  // The backward, from q, k, v, the forward's out and lse, and dout (out's shape and dtype):
  // dq, dk, dv (their inputs' shapes; each FP32 or q's dtype), the scores recomputed tile by
  // tile from lse. Deterministic: the same bits on every run and at every thread count (every
  // sum in a fixed order, no float atomics whose order varies).
  void attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                          const Tensor& dout, bool causal, float scale, Tensor& dq, Tensor& dk, Tensor& dv,
                          int64_t heads = 1) const;

  // Matrix products and reductions (fixed order, so a run repeats bit for bit).
  void gemm(const GemmArgs& args) const;
  // out[n] (+)= sum over rows m of x[m, n]; out is FP32: the bias gradient.
  void sum_rows(const Tensor& x, Tensor& out, bool accumulate) const;
  void sum(const Tensor& x, Tensor& out) const;  // out: FP32 [1]

  // Losses, in FP32 whatever the input dtype. out: FP32 [1].
  void mse_forward(const Tensor& pred, const Tensor& target, Tensor& out) const;
  // dpred = g[0] * 2 (pred - target) / N
  void mse_backward(const Tensor& pred, const Tensor& target, const Tensor& g, Tensor& dpred) const;
  // Mean cross-entropy of logits [B, C] against class indices held as FP32 values in
  // labels [B]. Fused: also writes dlogits_unit = (softmax - onehot) / B, the gradient for
  // an upstream gradient of 1 (FP32 [B, C]).
  void cross_entropy(const Tensor& logits, const Tensor& labels, Tensor& loss, Tensor& dlogits_unit) const;

  // AMP: the fused guard. One read of every gradient; nothing written to them.
  // found_inf[0] = 1 if any element is inf or NaN, else 0; norm[0] = sqrt(sum (g * inv_scale[0])^2),
  // the sum kept in FP64 and rounded to FP32 once, after the square root: a finite gradient
  // has a finite norm up to FP32's max (an FP32 sum of squares would overflow from 1.8e19).
  // With census.out, the same read also writes each gradient's census (engine/census.h) into
  // census.out, FP32 [grads, kCensusFields] read as 32-bit words, classified against
  // census.format (F16 or BF16); without it the guard is the same code as ever.
  void guard(const std::vector<const Tensor*>& grads, const Tensor& inv_scale, Tensor& found_inf, Tensor& norm,
             const GuardCensus& census = {}) const;
  // The guard's sums before they are combined: partials[t] = sum (grads[t] * inv_scale[0])^2
  // in FP64, summed exactly as the guard sums gradient t, so that the guard's norm is
  // sqrt(partials[0] + partials[1] + ...) in that order. Written to host memory: for a
  // sharded optimizer (amp/dist), whose ranks combine the partials of the tensors each owns.
  // The CPU backend has it; so does CUDA's, whose unsharded guard groups the same terms
  // otherwise (kernels/cuda/cuda_backend.cpp says how); another throws UsageError.
  void guard_partials(const std::vector<const Tensor*>& grads, const Tensor& inv_scale,
                      std::vector<double>& partials) const;
  // clip_coef = min(1, max_norm / (norm + 1e-6)).
  void clip_coefficient(const Tensor& norm, float max_norm, Tensor& clip_coef) const;
  // The unfused path, in PyTorch's order: g *= inv_scale in place (found_inf set if any is
  // non-finite), later g *= clip_coef in place.
  void unscale_inplace(const std::vector<Tensor*>& grads, const Tensor& inv_scale, Tensor& found_inf) const;
  void scale_inplace(const std::vector<Tensor*>& grads, const Tensor& factor) const;
  // x = min(max(x, lo), hi) in place: clip_grad_value.
  void clamp_inplace(Tensor& x, float lo, float hi) const;
  // One fused pass: g = grad * inv_scale * clip_coef; decoupled decay; m, v, master and the
  // working copy updated, with lr and the bias corrections 1 - beta^t (t = applied_steps + 1,
  // computed in FP64 from the device count) read on the device. Changes nothing when
  // found_inf[0] != 0.
  void adamw(const AdamWHyper& hyper, const std::vector<AdamWSlot>& slots, const StepScalars& s) const;
  void sgd(float momentum, const std::vector<SgdSlot>& slots, const StepScalars& s) const;
  // out[0] = table[min(index[0], n - 1)]: the schedule's LR at the applied-step count, picked
  // on the device. table: FP32 [n]; index and out: FP32 [1] (index holds an integer >= 0).
  void lookup(const Tensor& table, const Tensor& index, Tensor& out) const;
  // count[0] += 1 unless found_inf[0] != 0: the applied-step count, moved only by a step
  // that was applied. FP32 counts exactly up to 2^24 steps.
  void count_applied(Tensor& count, const Tensor& found_inf) const;
  // Snapshots these one-element FP32 tensors (at most kMaxReadbackScalars), in order, as they
  // are once the work already enqueued has run, into host memory (pinned, on a GPU), and
  // returns without waiting.
  std::unique_ptr<HostReadback> read_async(const std::vector<const Tensor*>& scalars) const;

  // Dynamic loss scaling: back off on found_inf (after `hysteresis` overflows), grow after
  // growth_interval clean steps. scale, growth_tracker, hysteresis_left: FP32 [1].
  void scaler_update(const ScalerConfig& config, Tensor& scale, Tensor& growth_tracker, Tensor& hysteresis_left,
                     const Tensor& found_inf) const;

 private:
  // What each backend implements, called by the entry of the same name once its arguments
  // have passed engine/backend_checks.cpp: an implementation may rely on every shape, dtype,
  // device and alias rule that file enforces.
  virtual void cast_impl(const Tensor& src, Tensor& dst) const = 0;
  virtual void scale_cast_impl(const Tensor& src, const Tensor& factor, Tensor& dst) const = 0;
  virtual void cast_census_impl(const Tensor& src, Tensor& dst, Tensor& record) const = 0;
  virtual void fill_impl(Tensor& t, float value) const = 0;
  virtual void binary_impl(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out) const = 0;
  virtual void scale_impl(const Tensor& x, float s, Tensor& out) const = 0;
  virtual void accumulate_impl(Tensor& dst, const Tensor& src, float alpha, const Tensor* s) const = 0;
  virtual void broadcast_scalar_impl(const Tensor& s, float alpha, Tensor& out) const = 0;
  virtual void activation_impl(Activation act, const Tensor& x, Tensor& y) const = 0;
  virtual void activation_backward_impl(Activation act, const Tensor& x, const Tensor& dy, Tensor& dx) const = 0;
  virtual void unary_impl(UnaryOp op, float p, const Tensor& x, Tensor& y) const = 0;
  virtual void unary_backward_impl(UnaryOp op, float p, const Tensor& x, const Tensor& y, const Tensor& dy,
                                   Tensor& dx) const = 0;
  virtual void binary_broadcast_impl(BinaryOp op, const Tensor& a, const Tensor& b, const AxisView& view, bool swapped,
                                     Tensor& out) const = 0;
  virtual void broadcast_axis_impl(const Tensor& g, const AxisView& view, float alpha, Tensor& out) const = 0;
  virtual void sum_axis_impl(const Tensor& x, const AxisView& view, float alpha, Tensor& out,
                             bool accumulate) const = 0;
  virtual void softmax_impl(const Tensor& x, int64_t cols, bool log, bool causal, Tensor& y) const = 0;
  virtual void softmax_backward_impl(const Tensor& y, const Tensor& dy, int64_t cols, bool log, bool causal,
                                     Tensor& dx) const = 0;
  virtual void embedding_impl(const Tensor& table, const Tensor& ids, Tensor& out) const = 0;
  virtual void embedding_backward_impl(const Tensor& dout, const Tensor& ids, Tensor& dtable) const = 0;
  virtual void layer_norm_impl(const Tensor& x, const Tensor* weight, const Tensor* bias, float eps, Tensor& y,
                               Tensor& mean, Tensor& rstd) const = 0;
  virtual void layer_norm_backward_impl(const Tensor& x, const Tensor* weight, const Tensor& mean, const Tensor& rstd,
                                        const Tensor& dy, Tensor& dx, Tensor* dweight, Tensor* dbias,
                                        bool accumulate) const = 0;
  virtual void transpose_impl(const Tensor& x, Tensor& out) const = 0;
  virtual void swap_axes_impl(const Tensor& x, const SwapAxesView& view, Tensor& out) const = 0;
  virtual void attention_impl(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, float scale,
                              const AttentionDims& dims, Tensor& out, Tensor& lse) const = 0;
  virtual void attention_backward_impl(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                       const Tensor& lse, const Tensor& dout, bool causal, float scale,
                                       const AttentionDims& dims, Tensor& dq, Tensor& dk, Tensor& dv) const = 0;
  virtual void gemm_impl(const GemmArgs& args, const GemmDims& dims) const = 0;
  virtual void sum_rows_impl(const Tensor& x, Tensor& out, bool accumulate) const = 0;
  virtual void sum_impl(const Tensor& x, Tensor& out) const = 0;
  virtual void mse_forward_impl(const Tensor& pred, const Tensor& target, Tensor& out) const = 0;
  virtual void mse_backward_impl(const Tensor& pred, const Tensor& target, const Tensor& g, Tensor& dpred) const = 0;
  virtual void cross_entropy_impl(const Tensor& logits, const Tensor& labels, Tensor& loss,
                                  Tensor& dlogits_unit) const = 0;
  virtual void guard_impl(const std::vector<const Tensor*>& grads, const Tensor& inv_scale, Tensor& found_inf,
                          Tensor& norm, const GuardCensus& census) const = 0;
  virtual void guard_partials_impl(const std::vector<const Tensor*>& grads, const Tensor& inv_scale,
                                   std::vector<double>& partials) const;
  virtual void clip_coefficient_impl(const Tensor& norm, float max_norm, Tensor& clip_coef) const = 0;
  virtual void unscale_inplace_impl(const std::vector<Tensor*>& grads, const Tensor& inv_scale,
                                    Tensor& found_inf) const = 0;
  virtual void scale_inplace_impl(const std::vector<Tensor*>& grads, const Tensor& factor) const = 0;
  virtual void clamp_inplace_impl(Tensor& x, float lo, float hi) const = 0;
  virtual void adamw_impl(const AdamWHyper& hyper, const std::vector<AdamWSlot>& slots, const StepScalars& s) const = 0;
  virtual void sgd_impl(float momentum, const std::vector<SgdSlot>& slots, const StepScalars& s) const = 0;
  virtual void lookup_impl(const Tensor& table, const Tensor& index, Tensor& out) const = 0;
  virtual void count_applied_impl(Tensor& count, const Tensor& found_inf) const = 0;
  virtual std::unique_ptr<HostReadback> read_async_impl(const std::vector<const Tensor*>& scalars) const = 0;
  virtual void scaler_update_impl(const ScalerConfig& config, Tensor& scale, Tensor& growth_tracker,
                                  Tensor& hysteresis_left, const Tensor& found_inf) const = 0;

  DeviceKind kind_;
};

// Defined by kernels/: the backend of a device. Throws Error when belay was built
// without CUDA or no GPU is visible.
const Backend& backend_for(Device device);
int cuda_device_count();       // 0 when built without CUDA or no GPU/driver
bool cuda_compiled();          // whether this build has the CUDA backend
void require_device(Device device);  // throws UsageError with a clear reason if unusable
// The CPU kernels' vector ISA (kernels/cpu/cpu_isa.h): force a path by name ("baseline",
// "avx2", "avx512"; UsageError if unknown or the CPU lacks it), and the `cpu isa:` line:
// the path in use and what the CPU has.
void select_cpu_isa(const std::string& name);
std::string cpu_isa_line();
std::string active_cpu_isa_name();  // "avx2": the path in use (checkpoints record it)
// The `cpu gemm:` line: the active path's GEMM blocking and the caches it was derived from
// (kernels/cpu/gemm_blocking.h).
std::string cpu_gemm_line();

}  // namespace belay

// Launchers of the CUDA kernels, callable from host C++ (the backend object in
// cuda_backend.cpp). Each takes raw device pointers; checking shapes and dtypes is the
// caller's job. Everything is enqueued on the default stream and nothing here waits for
// the device: the scalars that steer a step (inv_scale, found_inf, clip_coef, scale) are
// read by the kernels from device memory.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "engine/backend.h"
#include "engine/dtype.h"

namespace belay {

// ---- cast_kernels.cu
void launch_cast(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t n, cudaStream_t stream);
void launch_scale_cast(const float* src, const float* factor, void* dst, DType dst_dtype, int64_t n);
// The cast from FP32 with its census added into record (Backend::cast_census).
void launch_cast_census(const float* src, void* dst, DType dst_dtype, int64_t n, unsigned* record);
void launch_fill(void* dst, DType dtype, int64_t n, float value, cudaStream_t stream);

// ---- elementwise_kernels.cu
void launch_binary(BinaryOp op, const void* a, DType a_dtype, const void* b, DType b_dtype, void* out, DType out_dtype,
                   int64_t n);
void launch_scale(const void* x, DType x_dtype, float s, void* out, DType out_dtype, int64_t n);
// dst += alpha * src * (s ? s[0] : 1), s read on the device.
void launch_accumulate(void* dst, DType dst_dtype, const void* src, DType src_dtype, float alpha, const float* s,
                       int64_t n);
void launch_broadcast_scalar(const float* s, float alpha, void* out, DType out_dtype, int64_t n);
void launch_activation(Activation act, const void* x, DType x_dtype, void* y, DType y_dtype, int64_t n);
void launch_activation_backward(Activation act, const void* x, DType x_dtype, const void* dy, DType dy_dtype, void* dxo,
                                DType dxo_dtype, int64_t n);
void launch_clamp(void* x, DType x_dtype, float lo, float hi, int64_t n);
void launch_scale_by_scalar(void* x, DType x_dtype, const float* factor, int64_t n);  // x *= factor[0]

// ---- math_kernels.cu (the Var operators; Backend's contracts in engine/backend.h)
void launch_unary(UnaryOp op, float p, const void* x, DType x_dtype, void* y, DType y_dtype, int64_t n);
void launch_unary_backward(UnaryOp op, float p, const void* x, DType x_dtype, const void* y, DType y_dtype,
                           const void* g, DType g_dtype, void* out, DType out_dtype, int64_t n);
void launch_binary_broadcast(BinaryOp op, const void* a, DType a_dtype, const void* b, DType b_dtype,
                             const AxisView& view, bool swapped, void* out, DType out_dtype, int64_t n);
void launch_broadcast_axis(const void* g, DType g_dtype, const AxisView& view, float alpha, void* out, DType out_dtype,
                           int64_t n);
void launch_sum_axis(const void* x, DType x_dtype, const AxisView& view, float alpha, void* out, DType out_dtype,
                     bool accumulate);
void launch_transpose(const void* x, size_t elem_bytes, int64_t rows, int64_t cols, void* out);
// Backend::swap_axes: x [outer, p, mid, q, inner] -> out [outer, q, mid, p, inner], bit for bit.
void launch_swap_axes(const void* x, size_t elem_bytes, const SwapAxesView& view, void* out);

// ---- softmax_kernels.cu
void launch_softmax(const void* x, DType x_dtype, int64_t rows, int64_t cols, bool log, bool causal, void* y,
                    DType y_dtype);
void launch_softmax_backward(const void* y, DType y_dtype, const void* g, DType g_dtype, int64_t rows, int64_t cols,
                             bool log, bool causal, void* dx, DType dx_dtype);

// ---- embedding_kernels.cu
// out [n, dim] = rows ids[r] of table [vocab, dim] (F32, F16 or BF16), bit for bit; a bad id
// gives a NaN row. The backward adds dout's rows into dtable in the sequential loop's order;
// scratch: embedding_scratch_ints(n, vocab) ints of device memory.
inline int64_t embedding_scratch_ints(int64_t n, int64_t vocab) { return 2 * vocab + 1 + n; }
void launch_embedding(const void* table, DType table_dtype, const float* ids, int64_t n, int64_t vocab, int64_t dim,
                      void* out);
void launch_embedding_backward(const void* dout, DType dout_dtype, const float* ids, int64_t n, int64_t vocab,
                               int64_t dim, int32_t* scratch, float* dtable);

// ---- attention_kernels.cu (the fused attention of engine/backend.h; docs/attention.md)
// q [items, tq, ld], k and v [items, tk, ld] on the device, one dtype; ld >= d is the stored
// row length (for FP16 / BF16 a multiple of 8 with 16-byte aligned rows, zero-padded past d:
// the caller pads with launch_pad_rows); out [items, tq, d], lse FP32 [items, tq].
struct AttentionProblem {
  const void* q;
  const void* k;
  const void* v;
  DType dtype;
  int64_t items, tq, tk, d, ld;
  bool causal;
  float scale;
};
void launch_attention_forward(const AttentionProblem& a, void* out, float* lse);
// dq, dk, dv [.., d] in their own dtypes (FP32 or a's); dsum: FP32 scratch of items * tq
// (D = rowsum(dO o O)). dout's rows are ld long as q's (FP16 / BF16: the tensor cores read it
// too); out's are d.
void launch_attention_backward(const AttentionProblem& a, const void* out, const float* lse, const void* dout,
                               float* dsum, void* dq, DType dq_dtype, void* dk, DType dk_dtype, void* dv,
                               DType dv_dtype);

// ---- layer_norm_kernels.cu
// w and b may be null (1 and 0). The backward's partials: 2 x chunks x cols
// doubles (layer_norm_chunks), needed only when dweight or dbias is wanted.
struct LayerNormChunks {
  int64_t chunks, rows_per_chunk;
};
LayerNormChunks layer_norm_chunks(int64_t rows);
void launch_layer_norm(const void* x, DType x_dtype, const void* w, DType w_dtype, const void* b, DType b_dtype,
                       int64_t rows, int64_t cols, float eps, void* y, DType y_dtype, float* mean, float* rstd);
void launch_layer_norm_backward(const void* x, DType x_dtype, const void* w, DType w_dtype, const float* mean,
                                const float* rstd, const void* dy, DType dy_dtype, int64_t rows, int64_t cols, void* dx,
                                DType dx_dtype, double* partials, float* dweight, float* dbias, bool accumulate);

// ---- reduce_kernels.cu
// How many double partials launch_sum / launch_mse need as scratch.
int reduce_partials(int64_t n);
// sum_rows splits the rows into this many ranges (1: no split, no scratch); the scratch
// launch_sum_rows needs is splits * cols doubles when splits > 1.
int64_t sum_rows_splits(int64_t rows, int64_t cols);
void launch_sum_rows(const void* x, DType x_dtype, int64_t rows, int64_t cols, double* partials, float* out,
                     bool accumulate);
void launch_sum(const void* x, DType x_dtype, int64_t n, double* partials, float* out);
// One block: out[0] = (float)(sum of partials[0..count) in a fixed order * post_scale).
void launch_finish_sum(const double* partials, int64_t count, double post_scale, float* out);
void launch_mse_forward(const void* pred, DType pred_dtype, const void* target, DType target_dtype, int64_t n,
                        double* partials, float* out);
void launch_mse_backward(const void* pred, DType pred_dtype, const void* target, DType target_dtype, const float* g,
                         void* dpred, DType dpred_dtype, int64_t n);

// ---- cross_entropy_kernels.cu
// row_loss: `rows` doubles of scratch. An invalid label (not an integer in [0, classes))
// cannot throw without a host round trip: its row's loss and gradient become NaN, so the
// step is skipped as a non-finite loss (the CPU backend throws instead).
void launch_cross_entropy(const void* logits, DType logits_dtype, const void* labels, DType labels_dtype, int64_t rows,
                          int64_t classes, double* row_loss, float* loss, float* dlogits);

// ---- guard_kernels.cu
struct GradRef {
  void* data;
  DType dtype;
  int64_t n;
};
int64_t guard_partials(const std::vector<GradRef>& grads);  // double partials launch_guard needs
void launch_guard(const std::vector<GradRef>& grads, const float* inv_scale, float* found_inf, float* norm,
                  double* partials);
// The same guard (the same sums, the same bits) that also writes each gradient's census
// record (engine/census.h) to census[t * kCensusFields ...], classified against FP16 or BF16.
void launch_guard_census(const std::vector<GradRef>& grads, const float* inv_scale, float* found_inf, float* norm,
                         double* partials, unsigned* census, bool bf16);
// The guard's first pass alone (a sharded optimizer's per-tensor sums, Backend::guard_partials):
// block sums of (g * inv_scale)^2 in FP64, tensor t's being the next guard_blocks_of(n_t) of
// `partials` (at least guard_partials(grads) of them), nothing combined or written elsewhere.
int64_t guard_blocks_of(int64_t n);
void launch_guard_block_sums(const std::vector<GradRef>& grads, const float* inv_scale, double* partials);
void launch_clip_coefficient(const float* norm, float max_norm, float* clip_coef);
void launch_unscale(const std::vector<GradRef>& grads, const float* inv_scale, float* found_inf);

// ---- optimizer_kernels.cu
struct OptimRef {
  float* master;
  float* m;         // AdamW: first moment; SGD: momentum buffer or null
  float* v;         // AdamW: second moment; SGD: unused
  const void* grad;
  void* working;    // null when the parameter is FP32 only
  int64_t n;
  float weight_decay;
  DType grad_dtype;
  DType working_dtype;
};
// The device scalars of a step (StepScalars), as raw pointers. Read by every thread from
// device memory: none of them ever crosses to the host.
struct StepScalarPtrs {
  const float* inv_scale;
  const float* clip_coef;
  const float* found_inf;
  const float* lr;
  const float* applied_steps;  // AdamW only: its bias corrections come from it
};
void launch_adamw(const AdamWHyper& h, const std::vector<OptimRef>& slots, const StepScalarPtrs& s);
void launch_sgd(float momentum, const std::vector<OptimRef>& slots, const StepScalarPtrs& s);
void launch_scaler_update(const ScalerConfig& c, float* scale, float* growth_tracker, float* hysteresis_left,
                          const float* found_inf);

// ---- step_scalar_kernels.cu (one thread each: they move one float)
// out[0] = table[table_index(index[0], n)]
void launch_lookup(const float* table, int64_t n, const float* index, float* out);
// count[0] += 1 unless found_inf[0] != 0
void launch_count_applied(float* count, const float* found_inf);

// ---- readback_kernels.cu
// At most kMaxReadbackScalars (engine/backend.h) per read_async: their addresses travel as a
// kernel parameter.
// dst[i] = *src[i] for i < count; dst is pinned host memory seen through its device address.
void launch_readback_gather(const float* const* src, int count, float* dst);

// ---- gemm_dispatch.cu (tensor cores for FP16/BF16, SIMT for FP32)
struct GemmProblem {
  const void* a;
  const void* b;
  void* c;
  const void* bias;  // null: none
  int64_t m, n, k;
  int64_t lda, ldb;  // leading dimensions of A and B as stored
  bool trans_a, trans_b;
  DType ab_dtype, c_dtype, bias_dtype;
  float beta;  // 0, or 1 with an FP32 C
  // Batched (engine/backend.h GemmArgs): item i of A at a + i * stride_a elements (0: shared),
  // of B likewise, of C at c + i * m * n. gridDim.z runs over the items.
  int64_t batch = 1;
  int64_t stride_a = 0, stride_b = 0;
};
void launch_gemm(const GemmProblem& p);

}  // namespace belay

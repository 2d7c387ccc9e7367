// The CUDA backend object: its ops' arguments are checked on the host before they get here
// (engine/backend_checks.cpp: metadata only, never device memory); it enqueues kernels on the
// default stream. No op here waits for the GPU or copies device memory to the host: the
// scalars that steer a step are one-element device tensors that the kernels read, uploads
// return before the GPU has run them, and the host sees device scalars only through
// read_async's snapshots. Scratch buffers (reduction partials) come from the caching
// allocator, so a steady-state step allocates nothing; freeing one while a kernel still
// reads it is safe because every kernel runs in order on the one stream.
#include "kernels/cuda/cuda_backend.h"

#include <cuda_runtime.h>

#include <cstring>
#include <initializer_list>
#include <limits>

#include "engine/backend_checks.h"
#include "engine/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/gemm_kernels.h"
#include "kernels/cuda/pinned_transfers.h"

namespace belay {
namespace {

void* device_alloc(size_t bytes) {
  void* p = nullptr;
  if (cudaMalloc(&p, bytes) != cudaSuccess) {
    // Out of memory is not sticky, but it stays the "last error": clear it, or the next
    // after_launch() would report it as a failed kernel launch.
    (void)cudaGetLastError();
    return nullptr;
  }
  return p;
}
void device_free(void* p) { cudaFree(p); }


const float* scalar_ptr(const Tensor& t) { return t.data_as<float>(); }
float* scalar_ptr(Tensor& t) { return t.data_as<float>(); }

// `count` doubles of device scratch, from the caching allocator.
Tensor scratch_doubles(int64_t count, Device device) {
  return Tensor::empty(Shape{2 * (count > 0 ? count : 1)}, DType::F32, device);
}

void after_launch() { BELAY_CUDA_CHECK(cudaGetLastError()); }  // launch errors only; no wait

// The step scalars an optimizer reads (checked present and FP32 [1] on this GPU by
// engine/backend_checks.cpp; SGD is given applied_steps too, and ignores it).
StepScalarPtrs step_scalar_ptrs(const StepScalars& s) {
  return {scalar_ptr(*s.inv_scale), scalar_ptr(*s.clip_coef), scalar_ptr(*s.found_inf), scalar_ptr(*s.lr),
          scalar_ptr(*s.applied_steps)};
}

class CudaBackend final : public Backend {
 public:
  CudaBackend() : Backend(DeviceKind::CUDA) {}
  std::string name() const override { return "cuda"; }
  RawMemory raw_memory() const override { return {device_alloc, device_free}; }

  // A training step uploads its batch (and small values) every step and must not wait for
  // the GPU to do so: host -> device copies are staged through pinned memory and enqueued
  // (UploadStaging); the source may be reused as soon as this returns. Device -> host is a
  // plain cudaMemcpy, which waits for the queue: that is a host read, and the caller wants
  // the values now. Device -> device is enqueued like a kernel.
  void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) const override {
    if (bytes == 0) return;
    if (dst_device.is_cuda() && src_device.is_cpu()) {
      uploads_.upload(dst, src, bytes);
    } else if (dst_device.is_cpu() && src_device.is_cuda()) {
      BELAY_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
    } else if (dst_device.is_cuda() && src_device.is_cuda()) {
      BELAY_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, nullptr));
    } else {
      std::memcpy(dst, src, bytes);
    }
  }
  void synchronize() const override { BELAY_CUDA_CHECK(cudaDeviceSynchronize()); }

 private:
  // The ops, their arguments checked (engine/backend_checks.cpp): launches only.
  void cast_impl(const Tensor& src, Tensor& dst) const override {
    if (src.data() == dst.data() && src.dtype() == dst.dtype()) return;
    if (src.dtype() == dst.dtype()) {
      // A copy, bit for bit as the CPU's memmove (a round trip through FP32 would quiet
      // signalling NaNs), and at copy speed.
      BELAY_CUDA_CHECK(cudaMemcpyAsync(dst.data(), src.data(), src.nbytes(), cudaMemcpyDeviceToDevice, nullptr));
      return;
    }
    launch_cast(src.data(), src.dtype(), dst.data(), dst.dtype(), src.numel(), nullptr);
    after_launch();
  }
  void scale_cast_impl(const Tensor& src, const Tensor& factor, Tensor& dst) const override {
    launch_scale_cast(src.data_as<const float>(), scalar_ptr(factor), dst.data(), dst.dtype(), src.numel());
    after_launch();
  }
  void cast_census_impl(const Tensor& src, Tensor& dst, Tensor& record) const override {
    launch_cast_census(src.data_as<float>(), dst.data(), dst.dtype(), src.numel(), record.data_as<unsigned>());
    after_launch();
  }
  void fill_impl(Tensor& t, float value) const override {
    launch_fill(t.data(), t.dtype(), t.numel(), value, nullptr);
    after_launch();
  }

  void binary_impl(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out) const override {
    launch_binary(op, a.data(), a.dtype(), b.data(), b.dtype(), out.data(), out.dtype(), a.numel());
    after_launch();
  }

  void scale_impl(const Tensor& x, float s, Tensor& out) const override {
    launch_scale(x.data(), x.dtype(), s, out.data(), out.dtype(), x.numel());
    after_launch();
  }

  void accumulate_impl(Tensor& dst, const Tensor& src, float alpha, const Tensor* s) const override {
    launch_accumulate(dst.data(), dst.dtype(), src.data(), src.dtype(), alpha, s ? scalar_ptr(*s) : nullptr,
                      dst.numel());
    after_launch();
  }

  void broadcast_scalar_impl(const Tensor& s, float alpha, Tensor& out) const override {
    launch_broadcast_scalar(scalar_ptr(s), alpha, out.data(), out.dtype(), out.numel());
    after_launch();
  }

  void activation_impl(Activation act, const Tensor& x, Tensor& y) const override {
    launch_activation(act, x.data(), x.dtype(), y.data(), y.dtype(), x.numel());
    after_launch();
  }

  void activation_backward_impl(Activation act, const Tensor& x, const Tensor& dy, Tensor& dx) const override {
    launch_activation_backward(act, x.data(), x.dtype(), dy.data(), dy.dtype(), dx.data(), dx.dtype(), x.numel());
    after_launch();
  }

  void unary_impl(UnaryOp op, float p, const Tensor& x, Tensor& y) const override {
    launch_unary(op, p, x.data(), x.dtype(), y.data(), y.dtype(), x.numel());
    after_launch();
  }

  void unary_backward_impl(UnaryOp op, float p, const Tensor& x, const Tensor& y, const Tensor& dy,
                           Tensor& dx) const override {
    launch_unary_backward(op, p, x.data(), x.dtype(), y.data(), y.dtype(), dy.data(), dy.dtype(), dx.data(), dx.dtype(),
                          x.numel());
    after_launch();
  }

  void binary_broadcast_impl(BinaryOp op, const Tensor& a, const Tensor& b, const AxisView& view, bool swapped,
                             Tensor& out) const override {
    launch_binary_broadcast(op, a.data(), a.dtype(), b.data(), b.dtype(), view, swapped, out.data(), out.dtype(),
                            a.numel());
    after_launch();
  }

  void broadcast_axis_impl(const Tensor& g, const AxisView& view, float alpha, Tensor& out) const override {
    launch_broadcast_axis(g.data(), g.dtype(), view, alpha, out.data(), out.dtype(), out.numel());
    after_launch();
  }

  void sum_axis_impl(const Tensor& x, const AxisView& view, float alpha, Tensor& out, bool accumulate) const override {
    launch_sum_axis(x.data(), x.dtype(), view, alpha, out.data(), out.dtype(), accumulate);
    after_launch();
  }

  // Embedding (embedding_kernels.cu). An id that is not a row cannot be an Error here
  // without reading the ids on the host: as cross_entropy's labels, it gives a NaN row
  // (engine/backend.h), and the backward leaves it out.
  void embedding_impl(const Tensor& table, const Tensor& ids, Tensor& out) const override {
    launch_embedding(table.data(), table.dtype(), ids.data_as<float>(), ids.numel(), table.dim(0), table.dim(1),
                     out.data());
    after_launch();
  }

  // Scratch: the buckets of a stable counting sort of the ids (2V + 1 + N ints, from the
  // caching allocator); positions and rows are int32 on the device.
  void embedding_backward_impl(const Tensor& dout, const Tensor& ids, Tensor& dtable) const override {
    const int64_t n = ids.numel(), vocab = dtable.dim(0);
    if (n >= std::numeric_limits<int32_t>::max() || vocab >= std::numeric_limits<int32_t>::max() / 2)
      throw Error("embedding_backward: " + std::to_string(n) + " ids into " + std::to_string(vocab) +
                  " rows is beyond the CUDA kernel's 32-bit positions; split the batch");
    Tensor scratch = Tensor::empty(Shape{embedding_scratch_ints(n, vocab)}, DType::F32, dtable.device());
    launch_embedding_backward(dout.data(), dout.dtype(), ids.data_as<float>(), n, vocab, dtable.dim(1),
                              static_cast<int32_t*>(scratch.data()), dtable.data_as<float>());
    after_launch();
  }

  // LayerNorm (layer_norm_kernels.cu).
  void layer_norm_impl(const Tensor& x, const Tensor* weight, const Tensor* bias, float eps, Tensor& y, Tensor& mean,
                       Tensor& rstd) const override {
    const int64_t cols = x.dim(x.rank() - 1);
    launch_layer_norm(x.data(), x.dtype(), weight ? weight->data() : nullptr, weight ? weight->dtype() : DType::F32,
                      bias ? bias->data() : nullptr, bias ? bias->dtype() : DType::F32, x.numel() / cols, cols, eps,
                      y.data(), y.dtype(), mean.data_as<float>(), rstd.data_as<float>());
    after_launch();
  }

  void layer_norm_backward_impl(const Tensor& x, const Tensor* weight, const Tensor& mean, const Tensor& rstd,
                                const Tensor& dy, Tensor& dx, Tensor* dweight, Tensor* dbias,
                                bool accumulate) const override {
    const int64_t cols = x.dim(x.rank() - 1), rows = x.numel() / cols;
    const bool params = dweight || dbias;
    Tensor partials = scratch_doubles(params ? 2 * layer_norm_chunks(rows).chunks * cols : 0, x.device());
    launch_layer_norm_backward(x.data(), x.dtype(), weight ? weight->data() : nullptr,
                               weight ? weight->dtype() : DType::F32, mean.data_as<float>(), rstd.data_as<float>(),
                               dy.data(), dy.dtype(), rows, cols, dx.data(), dx.dtype(),
                               static_cast<double*>(partials.data()), dweight ? dweight->data_as<float>() : nullptr,
                               dbias ? dbias->data_as<float>() : nullptr, accumulate);
    after_launch();
  }

  void softmax_impl(const Tensor& x, int64_t cols, bool log, bool causal, Tensor& y) const override {
    launch_softmax(x.data(), x.dtype(), x.numel() / cols, cols, log, causal, y.data(), y.dtype());
    after_launch();
  }

  void softmax_backward_impl(const Tensor& y, const Tensor& dy, int64_t cols, bool log, bool causal,
                             Tensor& dx) const override {
    launch_softmax_backward(y.data(), y.dtype(), dy.data(), dy.dtype(), y.numel() / cols, cols, log, causal, dx.data(),
                            dx.dtype());
    after_launch();
  }

  // FP16 / BF16 rows reach the tensor cores through cp.async, 16 bytes at a time: a head dim
  // that is not a multiple of 8 (or a misaligned base) is first copied into zero-padded rows
  // (the GEMM's launch_pad_rows), which add nothing to any score, output or gradient.
  static AttentionProblem attention_problem(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, float scale,
                                            const AttentionDims& dims) {
    return {q.data(), k.data(), v.data(), q.dtype(), dims.items, dims.tq, dims.tk, dims.d, dims.d, causal, scale};
  }
  static bool attention_needs_padding(const Tensor& q, const std::initializer_list<const Tensor*> others, int64_t d) {
    if (q.dtype() == DType::F32) return false;
    bool aligned = rows_aligned(q.data(), d);
    for (const Tensor* t : others) aligned = aligned && rows_aligned(t->data(), d);
    return !aligned;
  }
  // A copy of t's `rows` rows of d elements in rows of padded_ld(d), zero past d.
  static Tensor padded_rows(const Tensor& t, int64_t rows, int64_t d) {
    Tensor p = Tensor::empty(Shape{rows, gemm::padded_ld(d)}, t.dtype(), t.device());
    if (rows > 0) launch_pad_rows(t.data(), rows, d, p.data());
    return p;
  }

  // Heads side by side ([B, T, H d], dims.heads > 1): the kernels read items of [T, d], so
  // here the heads are still copied apart ([B, H, T, d]) and back. (The CPU's kernels read
  // them in place; reading them with a row stride here is left to do: docs/not-done.md.)
  Tensor heads_apart(const Tensor& x, const AttentionDims& dims, int64_t rows) const {
    Tensor out = Tensor::empty(Shape{dims.items, rows, dims.d}, x.dtype(), x.device());
    swap_axes(x, SwapAxesView{dims.items / dims.heads, rows, 1, dims.heads, dims.d}, out);
    return out;
  }
  void heads_together(const Tensor& x, const AttentionDims& dims, int64_t rows, Tensor& out) const {
    swap_axes(x, SwapAxesView{dims.items / dims.heads, dims.heads, 1, rows, dims.d}, out);
  }

  void attention_impl(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, float scale,
                      const AttentionDims& dims, Tensor& out, Tensor& lse) const override {
    if (dims.heads > 1) {
      const Tensor qs = heads_apart(q, dims, dims.tq), ks = heads_apart(k, dims, dims.tk), vs = heads_apart(v, dims, dims.tk);
      Tensor os = Tensor::empty(qs.shape(), out.dtype(), out.device());
      attention(qs, ks, vs, causal, scale, os, lse);
      heads_together(os, dims, dims.tq, out);
      return;
    }
    AttentionProblem a = attention_problem(q, k, v, causal, scale, dims);
    Tensor qp, kp, vp;  // the padded copies, alive until the launch is enqueued (the allocator is stream-ordered)
    if (attention_needs_padding(q, {&k, &v}, dims.d)) {
      qp = padded_rows(q, dims.items * dims.tq, dims.d), kp = padded_rows(k, dims.items * dims.tk, dims.d);
      vp = padded_rows(v, dims.items * dims.tk, dims.d);
      a.q = qp.data(), a.k = kp.data(), a.v = vp.data(), a.ld = gemm::padded_ld(dims.d);
    }
    launch_attention_forward(a, out.data(), lse.data_as<float>());
    after_launch();
  }

  void attention_backward_impl(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                               const Tensor& dout, bool causal, float scale, const AttentionDims& dims, Tensor& dq,
                               Tensor& dk, Tensor& dv) const override {
    if (dims.heads > 1) {
      const Tensor qs = heads_apart(q, dims, dims.tq), ks = heads_apart(k, dims, dims.tk), vs = heads_apart(v, dims, dims.tk);
      const Tensor os = heads_apart(out, dims, dims.tq), gs = heads_apart(dout, dims, dims.tq);
      Tensor dqs = Tensor::empty(qs.shape(), dq.dtype(), dq.device()), dks = Tensor::empty(ks.shape(), dk.dtype(), dk.device());
      Tensor dvs = Tensor::empty(vs.shape(), dv.dtype(), dv.device());
      attention_backward(qs, ks, vs, os, lse, gs, causal, scale, dqs, dks, dvs);
      heads_together(dqs, dims, dims.tq, dq);
      heads_together(dks, dims, dims.tk, dk);
      heads_together(dvs, dims, dims.tk, dv);
      return;
    }
    AttentionProblem a = attention_problem(q, k, v, causal, scale, dims);
    const void* g = dout.data();
    Tensor qp, kp, vp, gp;  // as in the forward; dO is read by the tensor cores too (out is not)
    if (attention_needs_padding(q, {&k, &v, &dout}, dims.d)) {
      qp = padded_rows(q, dims.items * dims.tq, dims.d), kp = padded_rows(k, dims.items * dims.tk, dims.d);
      vp = padded_rows(v, dims.items * dims.tk, dims.d), gp = padded_rows(dout, dims.items * dims.tq, dims.d);
      a.q = qp.data(), a.k = kp.data(), a.v = vp.data(), a.ld = gemm::padded_ld(dims.d), g = gp.data();
    }
    Tensor dsum = Tensor::empty(Shape{dims.items * dims.tq > 0 ? dims.items * dims.tq : 1}, DType::F32, q.device());
    launch_attention_backward(a, out.data(), lse.data_as<float>(), g, dsum.data_as<float>(), dq.data(), dq.dtype(),
                              dk.data(), dk.dtype(), dv.data(), dv.dtype());
    after_launch();
  }

  void transpose_impl(const Tensor& x, Tensor& out) const override {
    launch_transpose(x.data(), dtype_size(x.dtype()), x.dim(0), x.dim(1), out.data());
    after_launch();
  }

  void swap_axes_impl(const Tensor& x, const SwapAxesView& view, Tensor& out) const override {
    launch_swap_axes(x.data(), dtype_size(x.dtype()), view, out.data());
    after_launch();
  }

  // A copy of t whose rows are padded to gemm::padded_ld(ld) elements (zero-filled); moves
  // `base`, `ld` and the batch `stride` to it.
  static Tensor pad_operand(const Tensor& t, const void*& base, int64_t& ld, int64_t& stride) {
    const int64_t rows = t.numel() / ld, padded = gemm::padded_ld(ld);
    Tensor out = Tensor::empty(Shape{rows, padded}, t.dtype(), t.device());
    launch_pad_rows(t.data(), rows, ld, out.data());
    base = out.data();
    stride = stride / ld * padded;
    ld = padded;
    return out;
  }

  void gemm_impl(const GemmArgs& args, const GemmDims& dims) const override {
    const auto [m, n, k] = dims;
    const Tensor& a = *args.a;
    const Tensor& b = *args.b;
    Tensor& c = *args.c;
    // Row tiles run along gridDim.y (at most 65535): 128-row tiles for the tensor-core
    // kernel, 64-row tiles for the FP32 one.
    constexpr int64_t kIntMax = std::numeric_limits<int>::max();
    const int64_t tile_m = a.dtype() == DType::F32 ? gemm::kF32Tile : gemm::kBM;
    if (m > kIntMax || n > kIntMax || k > kIntMax || (m + tile_m - 1) / tile_m > 65535)
      throw Error("gemm: " + std::to_string(m) + " x " + std::to_string(n) + " x " + std::to_string(k) +
                  " is beyond the CUDA kernels' limits (M <= " + std::to_string(65535 * tile_m) +
                  " for " + dtype_name(a.dtype()) + ", every extent < 2^31); split the product");
    GemmProblem p;
    p.a = a.data();
    p.b = b.data();
    p.c = c.data();
    p.bias = args.bias ? args.bias->data() : nullptr;
    p.m = m;
    p.n = n;
    p.k = k;
    p.lda = stored_matrix(a).cols;  // row-major storage: the stored row length
    p.ldb = stored_matrix(b).cols;
    p.batch = args.batch;
    p.stride_a = args.batch > 1 ? args.stride_a : 0;
    p.stride_b = args.batch > 1 ? args.stride_b : 0;
    p.trans_a = args.trans_a;
    p.trans_b = args.trans_b;
    p.ab_dtype = a.dtype();
    p.c_dtype = c.dtype();
    p.bias_dtype = args.bias ? args.bias->dtype() : DType::F32;
    p.beta = args.beta;
    // The tensor-core kernel copies 16-byte chunks (cp.async): an operand whose rows are not
    // 16-byte aligned is first copied into a zero-padded buffer whose rows are. O(MK + KN)
    // extra traffic against O(MNK) work; the buffers come from the caching allocator. A
    // batched operand is padded whole (all its rows), its stride kept a whole number of rows.
    Tensor a_padded, b_padded;
    if (a.dtype() != DType::F32 && m > 0 && n > 0) {
      if (!rows_aligned(p.a, p.lda)) a_padded = pad_operand(a, p.a, p.lda, p.stride_a);
      if (!rows_aligned(p.b, p.ldb)) b_padded = pad_operand(b, p.b, p.ldb, p.stride_b);
    }
    launch_gemm(p);
    after_launch();
  }

  void sum_rows_impl(const Tensor& x, Tensor& out, bool accumulate) const override {
    const int64_t splits = sum_rows_splits(x.dim(0), x.dim(1));
    Tensor partials = scratch_doubles(splits > 1 ? splits * x.dim(1) : 0, x.device());
    launch_sum_rows(x.data(), x.dtype(), x.dim(0), x.dim(1), static_cast<double*>(partials.data()),
                    out.data_as<float>(), accumulate);
    after_launch();
  }

  void sum_impl(const Tensor& x, Tensor& out) const override {
    Tensor partials = scratch_doubles(reduce_partials(x.numel()), x.device());
    launch_sum(x.data(), x.dtype(), x.numel(), static_cast<double*>(partials.data()), out.data_as<float>());
    after_launch();
  }

  void mse_forward_impl(const Tensor& pred, const Tensor& target, Tensor& out) const override {
    Tensor partials = scratch_doubles(reduce_partials(pred.numel()), pred.device());
    launch_mse_forward(pred.data(), pred.dtype(), target.data(), target.dtype(), pred.numel(),
                       static_cast<double*>(partials.data()), out.data_as<float>());
    after_launch();
  }

  void mse_backward_impl(const Tensor& pred, const Tensor& target, const Tensor& g, Tensor& dpred) const override {
    launch_mse_backward(pred.data(), pred.dtype(), target.data(), target.dtype(), scalar_ptr(g), dpred.data(),
                        dpred.dtype(), pred.numel());
    after_launch();
  }

  void cross_entropy_impl(const Tensor& logits, const Tensor& labels, Tensor& loss, Tensor& dlogits) const override {
    if (logits.dim(0) > std::numeric_limits<int>::max())
      throw Error("cross_entropy: more than 2^31 rows; split the batch");
    Tensor row_loss = scratch_doubles(logits.dim(0), logits.device());
    launch_cross_entropy(logits.data(), logits.dtype(), labels.data(), labels.dtype(), logits.dim(0), logits.dim(1),
                         static_cast<double*>(row_loss.data()), loss.data_as<float>(), dlogits.data_as<float>());
    after_launch();
  }

  void guard_impl(const std::vector<const Tensor*>& grads, const Tensor& inv_scale, Tensor& found_inf,
                  Tensor& norm, const GuardCensus& census) const override {
    std::vector<GradRef> refs;
    refs.reserve(grads.size());
    for (const Tensor* g : grads) refs.push_back({const_cast<void*>(g->data()), g->dtype(), g->numel()});  // read only
    Tensor partials = scratch_doubles(belay::guard_partials(refs), inv_scale.device());  // the launcher's, not Backend's
    if (census.out)
      launch_guard_census(refs, scalar_ptr(inv_scale), scalar_ptr(found_inf), scalar_ptr(norm),
                          static_cast<double*>(partials.data()), census.out->data_as<unsigned>(),
                          census.format == DType::BF16);
    else
      launch_guard(refs, scalar_ptr(inv_scale), scalar_ptr(found_inf), scalar_ptr(norm),
                   static_cast<double*>(partials.data()));
    after_launch();
  }

  // The guard's per-tensor sums on the host (a sharded optimizer, amp/dist): the guard's block
  // sums, copied out (a host read: it waits for the GPU), each tensor's added in block order.
  // The same terms as the guard's norm, grouped per tensor: the unsharded guard adds all the
  // blocks in one tree (guard_finish_kernel), so a norm made from these may differ from it in
  // the last bits (the CPU's guard sums per tensor, and there the two agree exactly).
  void guard_partials_impl(const std::vector<const Tensor*>& grads, const Tensor& inv_scale,
                           std::vector<double>& partials) const override {
    std::vector<GradRef> refs;
    refs.reserve(grads.size());
    for (const Tensor* g : grads) refs.push_back({const_cast<void*>(g->data()), g->dtype(), g->numel()});  // read only
    const int64_t blocks = belay::guard_partials(refs);
    Tensor sums = scratch_doubles(blocks, inv_scale.device());
    launch_guard_block_sums(refs, scalar_ptr(inv_scale), static_cast<double*>(sums.data()));
    after_launch();
    std::vector<double> host(static_cast<size_t>(blocks));
    BELAY_CUDA_CHECK(cudaMemcpy(host.data(), sums.data(), host.size() * sizeof(double), cudaMemcpyDeviceToHost));
    partials.assign(grads.size(), 0.0);
    size_t at = 0;
    for (size_t t = 0; t < grads.size(); ++t)
      for (int64_t b = 0; b < guard_blocks_of(grads[t]->numel()); ++b) partials[t] += host[at++];
  }

  void clip_coefficient_impl(const Tensor& norm, float max_norm, Tensor& clip_coef) const override {
    launch_clip_coefficient(scalar_ptr(norm), max_norm, scalar_ptr(clip_coef));
    after_launch();
  }

  void unscale_inplace_impl(const std::vector<Tensor*>& grads, const Tensor& inv_scale,
                            Tensor& found_inf) const override {
    std::vector<GradRef> refs;
    for (Tensor* g : grads) refs.push_back({g->data(), g->dtype(), g->numel()});
    launch_unscale(refs, scalar_ptr(inv_scale), scalar_ptr(found_inf));
    after_launch();
  }

  void scale_inplace_impl(const std::vector<Tensor*>& grads, const Tensor& factor) const override {
    for (Tensor* g : grads) launch_scale_by_scalar(g->data(), g->dtype(), scalar_ptr(factor), g->numel());
    after_launch();
  }

  void clamp_inplace_impl(Tensor& x, float lo, float hi) const override {
    launch_clamp(x.data(), x.dtype(), lo, hi, x.numel());
    after_launch();
  }

  void adamw_impl(const AdamWHyper& h, const std::vector<AdamWSlot>& slots, const StepScalars& sc) const override {
    const StepScalarPtrs ptrs = step_scalar_ptrs(sc);
    std::vector<OptimRef> refs;
    refs.reserve(slots.size());
    for (const AdamWSlot& s : slots) {
      refs.push_back({s.master->data_as<float>(), s.m->data_as<float>(), s.v->data_as<float>(), s.grad->data(),
                      s.working ? s.working->data() : nullptr, s.master->numel(), s.weight_decay, s.grad->dtype(),
                      s.working ? s.working->dtype() : DType::F32});
    }
    launch_adamw(h, refs, ptrs);
    after_launch();
  }

  void sgd_impl(float momentum, const std::vector<SgdSlot>& slots, const StepScalars& sc) const override {
    const StepScalarPtrs ptrs = step_scalar_ptrs(sc);
    std::vector<OptimRef> refs;
    for (const SgdSlot& s : slots) {
      const bool has_buf = s.momentum && s.momentum->defined();
      refs.push_back({s.master->data_as<float>(), has_buf ? s.momentum->data_as<float>() : nullptr, nullptr,
                      s.grad->data(), s.working ? s.working->data() : nullptr, s.master->numel(), s.weight_decay,
                      s.grad->dtype(), s.working ? s.working->dtype() : DType::F32});
    }
    launch_sgd(momentum, refs, ptrs);
    after_launch();
  }

  void lookup_impl(const Tensor& table, const Tensor& index, Tensor& out) const override {
    launch_lookup(table.data_as<float>(), table.numel(), scalar_ptr(index), scalar_ptr(out));
    after_launch();
  }

  void count_applied_impl(Tensor& count, const Tensor& found_inf) const override {
    launch_count_applied(scalar_ptr(count), scalar_ptr(found_inf));
    after_launch();
  }

  // One gather kernel into a pinned slot and an event behind it; the host waits only when
  // it asks for the values (HostReadback::wait), typically one step later to log a row.
  std::unique_ptr<HostReadback> read_async_impl(const std::vector<const Tensor*>& scalars) const override {
    std::vector<const float*> ptrs;
    ptrs.reserve(scalars.size());
    for (const Tensor* t : scalars) ptrs.push_back(scalar_ptr(*t));
    return readbacks_.read(ptrs);
  }

  void scaler_update_impl(const ScalerConfig& c, Tensor& scale, Tensor& growth_tracker, Tensor& hysteresis_left,
                          const Tensor& found_inf) const override {
    launch_scaler_update(c, scalar_ptr(scale), scalar_ptr(growth_tracker), scalar_ptr(hysteresis_left),
                         scalar_ptr(found_inf));
    after_launch();
  }

  // The backend object is const behind the op table; its pinned pools are its only state,
  // each guarded by its own mutex.
  mutable UploadStaging uploads_;
  mutable ReadbackPool readbacks_;
};

}  // namespace

int cuda_visible_devices() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

const Backend& cuda_backend() {
  static const CudaBackend backend;
  return backend;
}

}  // namespace belay

// The CPU backend object: host memory, and each op dispatched to its kernel
// (kernels/cpu/cpu_kernels.h, a file per concern) once engine/backend_checks.cpp has checked
// its arguments. Nothing else lives here.
#include "kernels/cpu/cpu_backend.h"

#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include "kernels/cpu/cpu_gemm.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/env_switch.h"

namespace belay {
namespace {

// Blocks of 2 MiB and more start on a 2 MiB boundary, their size rounded up to it, and ask Linux
// for transparent huge pages (madvise; where THP is off the advice is ignored): a GEMM walking a
// C or an A far larger than the TLB's reach misses it once a row on 4 KiB pages. On the AMX
// Xeon (1 thread, alternating in one process) GPT-2 small's products ran in 0.92-0.98 of the
// time on 4 KiB pages (the 768 x 768 one 0.99). BELAY_HUGE_PAGES=off: plain 64-byte alignment.
bool huge_pages() {
  static const bool on = env_switch("BELAY_HUGE_PAGES", {"on", "off"}) == 0;
  return on;
}

void* host_alloc(size_t bytes) {
  constexpr size_t kHuge = size_t{2} << 20;
  if (bytes >= kHuge && huge_pages()) {
    const size_t size = (bytes + kHuge - 1) / kHuge * kHuge;
    void* p = std::aligned_alloc(kHuge, size);
    if (p) madvise(p, size, MADV_HUGEPAGE);
    return p;
  }
  // 64-byte alignment for vector loads; round the size up as aligned_alloc requires.
  return std::aligned_alloc(64, (bytes + 63) / 64 * 64);
}
void host_free(void* p) { std::free(p); }

// Host memory is the device's: read_async copies the values at once, ready at once.
class ReadyReadback final : public HostReadback {
 public:
  explicit ReadyReadback(std::vector<float> values) : values_(std::move(values)) {}
  bool ready() const override { return true; }
  const std::vector<float>& wait() override { return values_; }

 private:
  std::vector<float> values_;
};

class CpuBackend final : public Backend {
 public:
  CpuBackend() : Backend(DeviceKind::CPU) {}
  std::string name() const override { return "cpu"; }
  // BELAY_HUGE_PAGES read (and a bad value refused) when the allocator is made: before any tensor.
  RawMemory raw_memory() const override {
    huge_pages();
    return {host_alloc, host_free};
  }
  void copy_bytes(void* dst, Device, const void* src, Device, size_t bytes) const override {
    std::memcpy(dst, src, bytes);
  }
  void synchronize() const override {}

 private:
  void cast_impl(const Tensor& src, Tensor& dst) const override { cpu::cast(src, dst); }
  void scale_cast_impl(const Tensor& src, const Tensor& factor, Tensor& dst) const override {
    cpu::scale_cast(src, factor, dst);
  }
  void cast_census_impl(const Tensor& src, Tensor& dst, Tensor& record) const override {
    cpu::cast_census(src, dst, record);
  }
  void fill_impl(Tensor& t, float value) const override { cpu::fill(t, value); }
  void binary_impl(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out) const override {
    cpu::binary(op, a, b, out);
  }
  void scale_impl(const Tensor& x, float s, Tensor& out) const override { cpu::scale(x, s, out); }
  void accumulate_impl(Tensor& dst, const Tensor& src, float alpha, const Tensor* s) const override {
    cpu::accumulate(dst, src, alpha, s);
  }
  void broadcast_scalar_impl(const Tensor& s, float alpha, Tensor& out) const override {
    cpu::broadcast_scalar(s, alpha, out);
  }
  void activation_impl(Activation act, const Tensor& x, Tensor& y) const override { cpu::activation(act, x, y); }
  void activation_backward_impl(Activation act, const Tensor& x, const Tensor& dy, Tensor& dx) const override {
    cpu::activation_backward(act, x, dy, dx);
  }
  void unary_impl(UnaryOp op, float p, const Tensor& x, Tensor& y) const override { cpu::unary(op, p, x, y); }
  void unary_backward_impl(UnaryOp op, float p, const Tensor& x, const Tensor& y, const Tensor& dy,
                           Tensor& dx) const override {
    cpu::unary_backward(op, p, x, y, dy, dx);
  }
  void binary_broadcast_impl(BinaryOp op, const Tensor& a, const Tensor& b, const AxisView& view, bool swapped,
                             Tensor& out) const override {
    cpu::binary_broadcast(op, a, b, view, swapped, out);
  }
  void broadcast_axis_impl(const Tensor& g, const AxisView& view, float alpha, Tensor& out) const override {
    cpu::broadcast_axis(g, view, alpha, out);
  }
  void sum_axis_impl(const Tensor& x, const AxisView& view, float alpha, Tensor& out, bool accumulate) const override {
    cpu::sum_axis(x, view, alpha, out, accumulate);
  }
  void softmax_impl(const Tensor& x, int64_t cols, bool log, bool causal, Tensor& y) const override {
    cpu::softmax(x, cols, log, causal, y);
  }
  void softmax_backward_impl(const Tensor& y, const Tensor& dy, int64_t cols, bool log, bool causal,
                             Tensor& dx) const override {
    cpu::softmax_backward(y, dy, cols, log, causal, dx);
  }
  void embedding_impl(const Tensor& table, const Tensor& ids, Tensor& out) const override {
    cpu::embedding(table, ids, out);
  }
  void embedding_backward_impl(const Tensor& dout, const Tensor& ids, Tensor& dtable) const override {
    cpu::embedding_backward(dout, ids, dtable);
  }
  void layer_norm_impl(const Tensor& x, const Tensor* weight, const Tensor* bias, float eps, Tensor& y, Tensor& mean,
                       Tensor& rstd) const override {
    cpu::layer_norm(x, weight, bias, eps, y, mean, rstd);
  }
  void layer_norm_backward_impl(const Tensor& x, const Tensor* weight, const Tensor& mean, const Tensor& rstd,
                                const Tensor& dy, Tensor& dx, Tensor* dweight, Tensor* dbias,
                                bool accumulate) const override {
    cpu::layer_norm_backward(x, weight, mean, rstd, dy, dx, dweight, dbias, accumulate);
  }
  void transpose_impl(const Tensor& x, Tensor& out) const override { cpu::transpose(x, out); }
  void swap_axes_impl(const Tensor& x, const SwapAxesView& view, Tensor& out) const override {
    cpu::swap_axes(x, view, out);
  }
  void attention_impl(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, float scale,
                      const AttentionDims& dims, Tensor& out, Tensor& lse) const override {
    cpu::attention(q, k, v, causal, scale, dims, out, lse);
  }
  void attention_backward_impl(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                               const Tensor& lse, const Tensor& dout, bool causal, float scale,
                               const AttentionDims& dims, Tensor& dq, Tensor& dk, Tensor& dv) const override {
    cpu::attention_backward(q, k, v, out, lse, dout, causal, scale, dims, dq, dk, dv);
  }
  // cpu_gemm checks its arguments again: it is also an entry of its own (tests, benchmarks).
  void gemm_impl(const GemmArgs& args, const GemmDims&) const override { cpu_gemm(args); }
  void sum_rows_impl(const Tensor& x, Tensor& out, bool accumulate) const override {
    cpu::sum_rows(x, out, accumulate);
  }
  void sum_impl(const Tensor& x, Tensor& out) const override { cpu::sum(x, out); }
  void mse_forward_impl(const Tensor& pred, const Tensor& target, Tensor& out) const override {
    cpu::mse_forward(pred, target, out);
  }
  void mse_backward_impl(const Tensor& pred, const Tensor& target, const Tensor& g, Tensor& dpred) const override {
    cpu::mse_backward(pred, target, g, dpred);
  }
  void cross_entropy_impl(const Tensor& logits, const Tensor& labels, Tensor& loss, Tensor& dlogits) const override {
    cpu::cross_entropy(logits, labels, loss, dlogits);
  }
  void guard_impl(const std::vector<const Tensor*>& grads, const Tensor& inv_scale, Tensor& found_inf,
                  Tensor& norm, const GuardCensus& census) const override {
    if (census.out) cpu::guard_census(grads, inv_scale, found_inf, norm, census);
    else cpu::guard(grads, inv_scale, found_inf, norm);
  }
  void guard_partials_impl(const std::vector<const Tensor*>& grads, const Tensor& inv_scale,
                           std::vector<double>& partials) const override {
    cpu::guard_partials(grads, inv_scale, partials);
  }
  void clip_coefficient_impl(const Tensor& norm, float max_norm, Tensor& clip_coef) const override {
    cpu::clip_coefficient(norm, max_norm, clip_coef);
  }
  void unscale_inplace_impl(const std::vector<Tensor*>& grads, const Tensor& inv_scale,
                            Tensor& found_inf) const override {
    cpu::unscale_inplace(grads, inv_scale, found_inf);
  }
  void scale_inplace_impl(const std::vector<Tensor*>& grads, const Tensor& factor) const override {
    cpu::scale_inplace(grads, factor);
  }
  void clamp_inplace_impl(Tensor& x, float lo, float hi) const override { cpu::clamp_inplace(x, lo, hi); }
  void adamw_impl(const AdamWHyper& hyper, const std::vector<AdamWSlot>& slots, const StepScalars& s) const override {
    cpu::adamw(hyper, slots, s);
  }
  void sgd_impl(float momentum, const std::vector<SgdSlot>& slots, const StepScalars& s) const override {
    cpu::sgd(momentum, slots, s);
  }
  void lookup_impl(const Tensor& table, const Tensor& index, Tensor& out) const override {
    cpu::lookup(table, index, out);
  }
  void count_applied_impl(Tensor& count, const Tensor& found_inf) const override {
    cpu::count_applied(count, found_inf);
  }
  std::unique_ptr<HostReadback> read_async_impl(const std::vector<const Tensor*>& scalars) const override {
    std::vector<float> values;
    for (const Tensor* t : scalars) values.push_back(t->data_as<const float>()[0]);
    return std::make_unique<ReadyReadback>(std::move(values));
  }
  void scaler_update_impl(const ScalerConfig& c, Tensor& scale, Tensor& growth_tracker, Tensor& hysteresis_left,
                          const Tensor& found_inf) const override {
    cpu::scaler_update(c, scale, growth_tracker, hysteresis_left, found_inf);
  }
};

}  // namespace

const Backend& cpu_backend() {
  static const CpuBackend backend;
  return backend;
}

}  // namespace belay

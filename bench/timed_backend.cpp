#include "bench/timed_backend.h"

#include "kernels/backend_hook.h"

namespace belay::bench {

const char* part_name(Part p) {
  static const char* names[] = {"gemm linear (+ head)", "gemm attention (bmm)", "softmax (attention)", "attention (fused)", "layer_norm",
                                "element-wise (gelu, add, bias grads)", "head split/merge copies", "embedding",
                                "loss (cross_entropy)", "casts", "belts (guard, clip, scaler)", "optimizer (AdamW)"};
  return names[static_cast<size_t>(p)];
}

// Every call: the clock around the CPU backend's own call, added to its part.
class TimedBackend final : public Backend {
 public:
  explicit TimedBackend(double (*clock_ms)()) : Backend(DeviceKind::CPU), clock_(clock_ms) {}
  mutable PartTotals totals;  // the calls are const (Backend's interface); the totals change

 private:
  const Backend& in_ = cpu_backend_direct();
  double (*clock_)();
  mutable int depth_ = 0;  // > 1: a call inside a timed call, already counted by the outer one

  struct Scope {
    const TimedBackend& b;
    size_t i;
    double t0;
    Scope(const TimedBackend& backend, Part p) : b(backend), i(static_cast<size_t>(p)), t0(b.clock_()) { ++b.depth_; }
    ~Scope() {
      if (--b.depth_ > 0) return;
      b.totals.ms[i] += b.clock_() - t0;
      ++b.totals.calls[i];
    }
  };
#define BELAY_TIMED(part, call) \
  Scope s(*this, Part::part);   \
  return in_.call

 public:
  std::string name() const override { return in_.name(); }
  RawMemory raw_memory() const override { return in_.raw_memory(); }
  void copy_bytes(void* d, Device dd, const void* s_, Device sd, size_t n) const override {
    Scope s(*this, Part::Heads);
    in_.copy_bytes(d, dd, s_, sd, n);
  }
  void synchronize() const override { in_.synchronize(); }

 private:
  // Each op: the CPU backend's own entry (its checks and its kernel), timed.
  void cast_impl(const Tensor& a, Tensor& b) const override { BELAY_TIMED(Cast, cast(a, b)); }
  void scale_cast_impl(const Tensor& a, const Tensor& f, Tensor& b) const override {
    BELAY_TIMED(Cast, scale_cast(a, f, b));
  }
  void cast_census_impl(const Tensor& a, Tensor& b, Tensor& r) const override { BELAY_TIMED(Cast, cast_census(a, b, r)); }
  void fill_impl(Tensor& t, float v) const override { BELAY_TIMED(Elementwise, fill(t, v)); }
  void binary_impl(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& o) const override {
    BELAY_TIMED(Elementwise, binary(op, a, b, o));
  }
  void scale_impl(const Tensor& x, float f, Tensor& o) const override { BELAY_TIMED(Elementwise, scale(x, f, o)); }
  void accumulate_impl(Tensor& d, const Tensor& x, float a, const Tensor* f) const override {
    BELAY_TIMED(Elementwise, accumulate(d, x, a, f));
  }
  void broadcast_scalar_impl(const Tensor& x, float a, Tensor& o) const override {
    BELAY_TIMED(Elementwise, broadcast_scalar(x, a, o));
  }
  void activation_impl(Activation a, const Tensor& x, Tensor& y) const override {
    BELAY_TIMED(Elementwise, activation(a, x, y));
  }
  void activation_backward_impl(Activation a, const Tensor& x, const Tensor& dy, Tensor& dx) const override {
    BELAY_TIMED(Elementwise, activation_backward(a, x, dy, dx));
  }
  void unary_impl(UnaryOp op, float p, const Tensor& x, Tensor& y) const override {
    BELAY_TIMED(Elementwise, unary(op, p, x, y));
  }
  void unary_backward_impl(UnaryOp op, float p, const Tensor& x, const Tensor& y, const Tensor& dy,
                           Tensor& dx) const override {
    BELAY_TIMED(Elementwise, unary_backward(op, p, x, y, dy, dx));
  }
  void binary_broadcast_impl(BinaryOp op, const Tensor& a, const Tensor& b, const AxisView& v, bool sw,
                             Tensor& o) const override {
    BELAY_TIMED(Elementwise, binary_broadcast(op, a, b, v, sw, o));
  }
  void broadcast_axis_impl(const Tensor& g, const AxisView& v, float a, Tensor& o) const override {
    BELAY_TIMED(Elementwise, broadcast_axis(g, v, a, o));
  }
  void sum_axis_impl(const Tensor& x, const AxisView& v, float a, Tensor& o, bool acc) const override {
    BELAY_TIMED(Elementwise, sum_axis(x, v, a, o, acc));
  }
  void softmax_impl(const Tensor& x, int64_t c, bool l, bool m, Tensor& y) const override {
    BELAY_TIMED(Softmax, softmax(x, c, l, m, y));
  }
  void attention_impl(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, float scale,
                      const AttentionDims& dims, Tensor& out, Tensor& lse) const override {
    BELAY_TIMED(Attention, attention(q, k, v, causal, scale, out, lse, dims.heads));
  }
  void attention_backward_impl(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                               const Tensor& lse, const Tensor& dout, bool causal, float scale,
                               const AttentionDims& dims, Tensor& dq, Tensor& dk, Tensor& dv) const override {
    BELAY_TIMED(Attention, attention_backward(q, k, v, out, lse, dout, causal, scale, dq, dk, dv, dims.heads));
  }
  void softmax_backward_impl(const Tensor& y, const Tensor& dy, int64_t c, bool l, bool m, Tensor& dx) const override {
    BELAY_TIMED(Softmax, softmax_backward(y, dy, c, l, m, dx));
  }
  void embedding_impl(const Tensor& t, const Tensor& ids, Tensor& o) const override {
    BELAY_TIMED(Embedding, embedding(t, ids, o));
  }
  void embedding_backward_impl(const Tensor& d, const Tensor& ids, Tensor& dt) const override {
    BELAY_TIMED(Embedding, embedding_backward(d, ids, dt));
  }
  void layer_norm_impl(const Tensor& x, const Tensor* w, const Tensor* b, float e, Tensor& y, Tensor& m,
                       Tensor& r) const override {
    BELAY_TIMED(LayerNorm, layer_norm(x, w, b, e, y, m, r));
  }
  void layer_norm_backward_impl(const Tensor& x, const Tensor* w, const Tensor& m, const Tensor& r, const Tensor& dy,
                                Tensor& dx, Tensor* dw, Tensor* db, bool acc) const override {
    BELAY_TIMED(LayerNorm, layer_norm_backward(x, w, m, r, dy, dx, dw, db, acc));
  }
  void transpose_impl(const Tensor& x, Tensor& o) const override { BELAY_TIMED(Heads, transpose(x, o)); }
  void swap_axes_impl(const Tensor& x, const SwapAxesView& v, Tensor& o) const override {
    BELAY_TIMED(Heads, swap_axes(x, v, o));
  }
  void gemm_impl(const GemmArgs& a, const GemmDims&) const override {
    Scope s(*this, a.batch == 1 ? Part::GemmLinear : Part::GemmBatched);
    in_.gemm(a);
  }
  void sum_rows_impl(const Tensor& x, Tensor& o, bool acc) const override { BELAY_TIMED(Elementwise, sum_rows(x, o, acc)); }
  void sum_impl(const Tensor& x, Tensor& o) const override { BELAY_TIMED(Elementwise, sum(x, o)); }
  void mse_forward_impl(const Tensor& p, const Tensor& t, Tensor& o) const override { BELAY_TIMED(Loss, mse_forward(p, t, o)); }
  void mse_backward_impl(const Tensor& p, const Tensor& t, const Tensor& g, Tensor& d) const override {
    BELAY_TIMED(Loss, mse_backward(p, t, g, d));
  }
  void cross_entropy_impl(const Tensor& l, const Tensor& y, Tensor& o, Tensor& d) const override {
    BELAY_TIMED(Loss, cross_entropy(l, y, o, d));
  }
  void guard_impl(const std::vector<const Tensor*>& g, const Tensor& i, Tensor& f, Tensor& n,
                  const GuardCensus& c) const override {
    BELAY_TIMED(Belts, guard(g, i, f, n, c));
  }
  void clip_coefficient_impl(const Tensor& n, float m, Tensor& c) const override {
    BELAY_TIMED(Belts, clip_coefficient(n, m, c));
  }
  void unscale_inplace_impl(const std::vector<Tensor*>& g, const Tensor& i, Tensor& f) const override {
    BELAY_TIMED(Belts, unscale_inplace(g, i, f));
  }
  void scale_inplace_impl(const std::vector<Tensor*>& g, const Tensor& f) const override {
    BELAY_TIMED(Belts, scale_inplace(g, f));
  }
  void clamp_inplace_impl(Tensor& x, float lo, float hi) const override { BELAY_TIMED(Belts, clamp_inplace(x, lo, hi)); }
  void adamw_impl(const AdamWHyper& h, const std::vector<AdamWSlot>& sl, const StepScalars& sc) const override {
    BELAY_TIMED(Optimizer, adamw(h, sl, sc));
  }
  void sgd_impl(float m, const std::vector<SgdSlot>& sl, const StepScalars& sc) const override {
    BELAY_TIMED(Optimizer, sgd(m, sl, sc));
  }
  void lookup_impl(const Tensor& t, const Tensor& i, Tensor& o) const override { BELAY_TIMED(Belts, lookup(t, i, o)); }
  void count_applied_impl(Tensor& c, const Tensor& f) const override { BELAY_TIMED(Belts, count_applied(c, f)); }
  std::unique_ptr<HostReadback> read_async_impl(const std::vector<const Tensor*>& s_) const override {
    BELAY_TIMED(Belts, read_async(s_));
  }
  void scaler_update_impl(const ScalerConfig& c, Tensor& s_, Tensor& g, Tensor& h, const Tensor& f) const override {
    BELAY_TIMED(Belts, scaler_update(c, s_, g, h, f));
  }
#undef BELAY_TIMED
};

PartTimer::PartTimer(double (*clock_ms)()) : backend_(std::make_unique<TimedBackend>(clock_ms)) { set_cpu_backend_override(backend_.get()); }
PartTimer::~PartTimer() { set_cpu_backend_override(nullptr); }
PartTotals& PartTimer::totals() { return backend_->totals; }

}  // namespace belay::bench

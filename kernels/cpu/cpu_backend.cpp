#include "kernels/cpu/cpu_backend.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "engine/error.h"
#include "kernels/common/element_math.h"
#include "kernels/cpu/cpu_gemm.h"

namespace belay {
namespace {

// Loops shorter than this run on one thread: forking costs more than it saves.
constexpr int64_t kParallelThreshold = 1 << 15;
// Reductions sum fixed chunks in double, then the chunk sums in order: the result does not
// depend on the thread count, so a run repeats bit for bit.
constexpr int64_t kReduceChunk = 1 << 14;

void* host_alloc(size_t bytes) {
  // 64-byte alignment for vector loads; round the size up as aligned_alloc requires.
  return std::aligned_alloc(64, (bytes + 63) / 64 * 64);
}
void host_free(void* p) { std::free(p); }

template <class F>
void parallel_for(int64_t n, F&& f) {
#pragma omp parallel for schedule(static) if (n > kParallelThreshold)
  for (int64_t i = 0; i < n; ++i) f(i);
}

// Sum of f(i) for i in [0, n), deterministic whatever the number of threads.
template <class F>
double deterministic_sum(int64_t n, F&& f) {
  const int64_t chunks = (n + kReduceChunk - 1) / kReduceChunk;
  thread_local std::vector<double> partial;
  partial.assign(static_cast<size_t>(chunks), 0.0);
  double* out = partial.data();
#pragma omp parallel for schedule(static) if (n > kParallelThreshold)
  for (int64_t c = 0; c < chunks; ++c) {
    double s = 0.0;
    const int64_t end = std::min(n, (c + 1) * kReduceChunk);
    for (int64_t i = c * kReduceChunk; i < end; ++i) s += f(i);
    out[c] = s;
  }
  double total = 0.0;
  for (int64_t c = 0; c < chunks; ++c) total += out[c];
  return total;
}

void check_cpu(const char* op, const Tensor& t) {
  check_defined(op, t);
  if (!t.device().is_cpu()) throw Error(std::string(op) + ": CPU backend given " + t.describe());
}

void check_scalar(const char* op, const Tensor& t) {
  check_cpu(op, t);
  if (t.numel() != 1 || t.dtype() != DType::F32)
    throw Error(std::string(op) + ": expected an fp32 one-element tensor, got " + t.describe());
}

class CpuBackend final : public Backend {
 public:
  std::string name() const override { return "cpu"; }
  RawMemory raw_memory() const override { return {host_alloc, host_free}; }

  void copy_bytes(void* dst, Device, const void* src, Device, size_t bytes) const override {
    std::memcpy(dst, src, bytes);
  }
  void synchronize() const override {}

  void cast(const Tensor& src, Tensor& dst) const override {
    check_cpu("cast", src);
    check_cpu("cast", dst);
    if (src.numel() != dst.numel()) throw Error("cast: element counts differ, " + src.describe() + " vs " + dst.describe());
    if (src.data() == dst.data() && src.dtype() == dst.dtype()) return;
    if (src.dtype() == dst.dtype()) {
      std::memmove(dst.data(), src.data(), src.nbytes());
      return;
    }
    const void* s = src.data();
    void* d = dst.data();
    const DType sd = src.dtype(), dd = dst.dtype();
    parallel_for(src.numel(), [&](int64_t i) { store_from_f32(d, dd, i, load_as_f32(s, sd, i)); });
  }

  void fill(Tensor& t, float value) const override {
    check_cpu("fill", t);
    void* d = t.data();
    const DType dt = t.dtype();
    parallel_for(t.numel(), [&](int64_t i) { store_from_f32(d, dt, i, value); });
  }

  void binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out) const override {
    check_cpu("binary", a);
    check_same_shape("binary", a, b);
    check_same_shape("binary", a, out);
    const void *pa = a.data(), *pb = b.data();
    void* po = out.data();
    const DType da = a.dtype(), db = b.dtype(), dout = out.dtype();
    parallel_for(a.numel(), [&](int64_t i) {
      const float x = load_as_f32(pa, da, i), y = load_as_f32(pb, db, i);
      const float r = op == BinaryOp::Add ? x + y : op == BinaryOp::Sub ? x - y : x * y;
      store_from_f32(po, dout, i, r);
    });
  }

  void scale(const Tensor& x, float s, Tensor& out) const override {
    check_cpu("scale", x);
    check_same_shape("scale", x, out);
    const void* px = x.data();
    void* po = out.data();
    const DType dx = x.dtype(), dout = out.dtype();
    parallel_for(x.numel(), [&](int64_t i) { store_from_f32(po, dout, i, s * load_as_f32(px, dx, i)); });
  }

  void accumulate(Tensor& dst, const Tensor& src, float alpha, const Tensor* s) const override {
    check_cpu("accumulate", dst);
    check_same_shape("accumulate", dst, src);
    const float factor = alpha * (s ? s->item() : 1.0f);
    const void* ps = src.data();
    void* pd = dst.data();
    const DType dsrc = src.dtype(), ddst = dst.dtype();
    parallel_for(dst.numel(), [&](int64_t i) {
      store_from_f32(pd, ddst, i, load_as_f32(pd, ddst, i) + factor * load_as_f32(ps, dsrc, i));
    });
  }

  void broadcast_scalar(const Tensor& s, float alpha, Tensor& out) const override {
    check_scalar("broadcast_scalar", s);
    fill(out, s.item() * alpha);
  }

  void activation(Activation act, const Tensor& x, Tensor& y) const override {
    check_cpu("activation", x);
    check_same_shape("activation", x, y);
    const void* px = x.data();
    void* py = y.data();
    const DType dx = x.dtype(), dy = y.dtype();
    parallel_for(x.numel(), [&](int64_t i) {
      const float v = load_as_f32(px, dx, i);
      store_from_f32(py, dy, i, act == Activation::Relu ? (v > 0.0f ? v : 0.0f) : gelu_f32(v));
    });
  }

  void activation_backward(Activation act, const Tensor& x, const Tensor& dy, Tensor& dx) const override {
    check_cpu("activation_backward", x);
    check_same_shape("activation_backward", x, dy);
    check_same_shape("activation_backward", x, dx);
    const void *px = x.data(), *pdy = dy.data();
    void* pdx = dx.data();
    const DType tx = x.dtype(), tdy = dy.dtype(), tdx = dx.dtype();
    parallel_for(x.numel(), [&](int64_t i) {
      const float v = load_as_f32(px, tx, i), g = load_as_f32(pdy, tdy, i);
      const float d = act == Activation::Relu ? (v > 0.0f ? g : 0.0f) : g * gelu_grad_f32(v);
      store_from_f32(pdx, tdx, i, d);
    });
  }

  void gemm(const GemmArgs& args) const override { cpu_gemm(args); }

  void sum_rows(const Tensor& x, Tensor& out, bool accumulate) const override {
    check_cpu("sum_rows", x);
    check_dtype("sum_rows", out, DType::F32);
    if (x.rank() != 2 || out.numel() != x.dim(1))
      throw Error("sum_rows: expected x [M, N] and out [N], got " + x.describe() + " and " + out.describe());
    const int64_t rows = x.dim(0), cols = x.dim(1);
    const void* px = x.data();
    const DType dx = x.dtype();
    float* po = out.data_as<float>();
    parallel_for(cols, [&](int64_t n) {
      double s = 0.0;
      for (int64_t m = 0; m < rows; ++m) s += load_as_f32(px, dx, m * cols + n);
      po[n] = accumulate ? po[n] + static_cast<float>(s) : static_cast<float>(s);
    });
  }

  void sum(const Tensor& x, Tensor& out) const override {
    check_cpu("sum", x);
    check_scalar("sum", out);
    const void* px = x.data();
    const DType dx = x.dtype();
    out.data_as<float>()[0] =
        static_cast<float>(deterministic_sum(x.numel(), [&](int64_t i) { return (double)load_as_f32(px, dx, i); }));
  }

  void mse_forward(const Tensor& pred, const Tensor& target, Tensor& out) const override {
    check_cpu("mse_loss", pred);
    check_same_shape("mse_loss", pred, target);
    check_scalar("mse_loss", out);
    const void *pp = pred.data(), *pt = target.data();
    const DType dp = pred.dtype(), dt = target.dtype();
    const double s = deterministic_sum(pred.numel(), [&](int64_t i) {
      const double d = (double)load_as_f32(pp, dp, i) - (double)load_as_f32(pt, dt, i);
      return d * d;
    });
    out.data_as<float>()[0] = static_cast<float>(s / static_cast<double>(pred.numel()));
  }

  void mse_backward(const Tensor& pred, const Tensor& target, const Tensor& g, Tensor& dpred) const override {
    check_cpu("mse_loss backward", pred);
    check_same_shape("mse_loss backward", pred, dpred);
    check_scalar("mse_loss backward", g);
    const float factor = 2.0f * g.item() / static_cast<float>(pred.numel());
    const void *pp = pred.data(), *pt = target.data();
    void* pd = dpred.data();
    const DType dp = pred.dtype(), dt = target.dtype(), dd = dpred.dtype();
    parallel_for(pred.numel(), [&](int64_t i) {
      store_from_f32(pd, dd, i, factor * (load_as_f32(pp, dp, i) - load_as_f32(pt, dt, i)));
    });
  }

  void cross_entropy(const Tensor& logits, const Tensor& labels, Tensor& loss, Tensor& dlogits) const override {
    check_cpu("cross_entropy", logits);
    if (logits.rank() != 2 || labels.numel() != logits.dim(0))
      throw Error("cross_entropy: expected logits [B, C] and labels [B], got " + logits.describe() + " and " +
                  labels.describe());
    check_scalar("cross_entropy", loss);
    check_dtype("cross_entropy", dlogits, DType::F32);
    check_same_shape("cross_entropy", logits, dlogits);
    const int64_t rows = logits.dim(0), classes = logits.dim(1);
    const std::vector<float> lab = labels.to_vector();
    for (int64_t r = 0; r < rows; ++r) {
      const float l = lab[r];
      if (!(l >= 0.0f) || l >= static_cast<float>(classes) || l != std::floor(l))
        throw Error("cross_entropy: label " + std::to_string(l) + " at row " + std::to_string(r) +
                    " is not a class index in [0, " + std::to_string(classes) + ")");
    }
    const void* px = logits.data();
    const DType dx = logits.dtype();
    float* pd = dlogits.data_as<float>();
    thread_local std::vector<double> row_loss;
    row_loss.assign(static_cast<size_t>(rows), 0.0);
    double* rl = row_loss.data();
    const double inv_rows = 1.0 / static_cast<double>(rows);
    parallel_for(rows, [&](int64_t r) {
      // log-softmax with the row maximum subtracted: exp never overflows for large logits.
      float mx = -INFINITY;
      for (int64_t c = 0; c < classes; ++c) mx = std::max(mx, load_as_f32(px, dx, r * classes + c));
      double z = 0.0;
      for (int64_t c = 0; c < classes; ++c) z += std::exp((double)load_as_f32(px, dx, r * classes + c) - mx);
      const double log_z = std::log(z) + mx;
      const int64_t label = static_cast<int64_t>(lab[r]);
      rl[r] = log_z - (double)load_as_f32(px, dx, r * classes + label);
      for (int64_t c = 0; c < classes; ++c) {
        const double p = std::exp((double)load_as_f32(px, dx, r * classes + c) - log_z);
        pd[r * classes + c] = static_cast<float>((p - (c == label ? 1.0 : 0.0)) * inv_rows);
      }
    });
    double total = 0.0;
    for (int64_t r = 0; r < rows; ++r) total += rl[r];
    loss.data_as<float>()[0] = static_cast<float>(total * inv_rows);
  }

  void guard(const std::vector<const Tensor*>& grads, const Tensor& inv_scale, Tensor& found_inf,
             Tensor& sumsq) const override {
    check_scalar("guard", inv_scale);
    check_scalar("guard", found_inf);
    check_scalar("guard", sumsq);
    const float inv = inv_scale.item();
    double total = 0.0;
    bool nonfinite = false;
    for (const Tensor* g : grads) {
      check_cpu("guard", *g);
      const void* pg = g->data();
      const DType dg = g->dtype();
      // One read per element: the finite check and the square of the unscaled value together.
      // A non-finite element makes its square non-finite, so the sum carries the flag.
      const double s = deterministic_sum(g->numel(), [&](int64_t i) {
        const float u = load_as_f32(pg, dg, i) * inv;
        return (double)u * (double)u;
      });
      if (!std::isfinite(s)) nonfinite = true;
      total += s;
    }
    found_inf.data_as<float>()[0] = nonfinite ? 1.0f : 0.0f;
    sumsq.data_as<float>()[0] = static_cast<float>(total);
  }

  void clip_coefficient(const Tensor& sumsq, float max_norm, Tensor& norm, Tensor& clip_coef) const override {
    check_scalar("clip_coefficient", sumsq);
    const float n = std::sqrt(sumsq.item());
    norm.data_as<float>()[0] = n;
    clip_coef.data_as<float>()[0] = clip_coefficient_of(n, max_norm);
  }

  void unscale_inplace(const std::vector<Tensor*>& grads, const Tensor& inv_scale, Tensor& found_inf) const override {
    check_scalar("unscale", inv_scale);
    check_scalar("unscale", found_inf);
    const float inv = inv_scale.item();
    bool nonfinite = false;
    for (Tensor* g : grads) {
      void* pg = g->data();
      const DType dg = g->dtype();
      const int64_t n = g->numel();
      bool local = false;
#pragma omp parallel for schedule(static) reduction(|| : local) if (n > kParallelThreshold)
      for (int64_t i = 0; i < n; ++i) {
        const float v = load_as_f32(pg, dg, i) * inv;
        if (!is_finite_f32(v)) local = true;
        store_from_f32(pg, dg, i, v);
      }
      nonfinite = nonfinite || local;
    }
    found_inf.data_as<float>()[0] = nonfinite ? 1.0f : 0.0f;
  }

  void scale_inplace(const std::vector<Tensor*>& grads, const Tensor& factor) const override {
    check_scalar("scale_inplace", factor);
    const float f = factor.item();
    for (Tensor* g : grads) scale(*g, f, *g);
  }

  void clamp_inplace(Tensor& x, float lo, float hi) const override {
    check_cpu("clamp", x);
    void* px = x.data();
    const DType dx = x.dtype();
    parallel_for(x.numel(), [&](int64_t i) {
      const float v = load_as_f32(px, dx, i);
      // NaN stays NaN (as torch.clamp): comparisons with NaN are false.
      store_from_f32(px, dx, i, v < lo ? lo : (v > hi ? hi : v));
    });
  }

  void adamw(const AdamWHyper& h, const std::vector<AdamWSlot>& slots, const Tensor& inv_scale,
             const Tensor& clip_coef, const Tensor& found_inf) const override {
    check_scalar("adamw", found_inf);
    if (found_inf.item() != 0.0f) return;  // a skipped step changes nothing
    const float inv = inv_scale.item(), coef = clip_coef.item();
    for (const AdamWSlot& s : slots) {
      check_dtype("adamw master", *s.master, DType::F32);
      check_dtype("adamw m", *s.m, DType::F32);
      check_dtype("adamw v", *s.v, DType::F32);
      check_same_shape("adamw", *s.master, *s.grad);
      float* p = s.master->data_as<float>();
      float* m = s.m->data_as<float>();
      float* v = s.v->data_as<float>();
      const void* g = s.grad->data();
      const DType dg = s.grad->dtype();
      void* w = s.working ? s.working->data() : nullptr;
      const DType dw = s.working ? s.working->dtype() : DType::F32;
      const float wd = s.weight_decay;
      parallel_for(s.master->numel(), [&](int64_t i) {
        adamw_element(effective_grad(load_as_f32(g, dg, i), inv, coef), p[i], m[i], v[i], h.lr, h.beta1, h.beta2,
                      h.eps, wd, h.bias_correction1, h.bias_correction2);
        if (w) store_from_f32(w, dw, i, p[i]);  // the working copy, written in the same pass
      });
    }
  }

  void sgd(float lr, float momentum, const std::vector<SgdSlot>& slots, const Tensor& inv_scale,
           const Tensor& clip_coef, const Tensor& found_inf) const override {
    check_scalar("sgd", found_inf);
    if (found_inf.item() != 0.0f) return;
    const float inv = inv_scale.item(), coef = clip_coef.item();
    for (const SgdSlot& s : slots) {
      float* p = s.master->data_as<float>();
      float* buf = s.momentum && s.momentum->defined() ? s.momentum->data_as<float>() : nullptr;
      const void* g = s.grad->data();
      const DType dg = s.grad->dtype();
      void* w = s.working ? s.working->data() : nullptr;
      const DType dw = s.working ? s.working->dtype() : DType::F32;
      const float wd = s.weight_decay;
      parallel_for(s.master->numel(), [&](int64_t i) {
        float dummy = 0.0f;
        sgd_element(effective_grad(load_as_f32(g, dg, i), inv, coef), p[i], buf ? buf[i] : dummy, lr, momentum, wd,
                    buf != nullptr);
        if (w) store_from_f32(w, dw, i, p[i]);
      });
    }
  }

  void scaler_update(const ScalerConfig& c, Tensor& scale, Tensor& growth_tracker, Tensor& hysteresis_left,
                     const Tensor& found_inf) const override {
    check_scalar("scaler_update", scale);
    scaler_transition(found_inf.item(), scale.data_as<float>()[0], growth_tracker.data_as<float>()[0],
                      hysteresis_left.data_as<float>()[0], c.growth_factor, c.backoff_factor,
                      static_cast<float>(c.growth_interval), static_cast<float>(c.hysteresis), c.min_scale,
                      c.max_scale);
  }
};

}  // namespace

const Backend& cpu_backend() {
  static const CpuBackend backend;
  return backend;
}

}  // namespace belay

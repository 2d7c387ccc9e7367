// --clip-mode value: every element clamped to [-c, c] after the gradients are unscaled, the
// same weights as PyTorch's order done by hand (unscale_, clip_grad_value_, step, update),
// and the cosine between the raw and the applied gradient measured on the device.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>

#include "amp/autocast.h"
#include "amp/clip.h"
#include "amp/safe_step.h"
#include "autograd/modules.h"
#include "engine/error.h"
#include "optim/adamw.h"
#include "tolerance.h"

using namespace belay;
using belay::test::bits_of;

namespace {

// A Linear(16 -> 4) whose gradients are large enough that a bound of 0.05 clamps some
// elements and not others.
struct Model {
  Rng rng{11};
  Linear model{16, 4, rng};
  AdamW opt{model.parameters(), AdamWOptions{1e-2f, 0.9f, 0.999f, 1e-8f, 0.0f, false}};
  GradScaler scaler;
  DType dtype;
  Tensor x, y;
  explicit Model(DType compute, GradScalerOptions so) : scaler(Device::cpu(), so), dtype(compute) {
    model.set_working_dtype(compute);
    Rng data(5);
    std::vector<float> xv(8 * 16), yv(8 * 4);
    for (float& v : xv) v = data.normal();
    for (float& v : yv) v = 3.0f * data.normal();
    x = Tensor::from_vector(xv, Shape{8, 16});
    y = Tensor::from_vector(yv, Shape{8, 4});
  }
  Var loss() {
    Autocast ac(dtype, dtype != DType::F32);
    return mse_loss(model(Var(x)), y);
  }
  std::vector<uint32_t> state_bits() {
    std::vector<uint32_t> all;
    for (const Var& p : model.parameters())
      for (uint32_t b : bits_of(p.master())) all.push_back(b);
    for (auto& [name, t] : opt.state_tensors())
      for (uint32_t b : bits_of(*t)) all.push_back(b);
    return all;
  }
};

std::vector<double> flat(const std::vector<Tensor*>& grads) {
  std::vector<double> out;
  for (const Tensor* g : grads)
    for (float v : g->to_vector()) out.push_back(v);
  return out;
}

}  // namespace

TEST_CASE("clip by value on the device: clamped elements, both norms and the dot product", "[amp][clip]") {
  for (DType dt : {DType::F32, DType::F16, DType::BF16}) {
    INFO("dtype " << dtype_name(dt));
    Tensor a = Tensor::from_vector({3.0f, -0.5f}, Shape{2}, dt), b = Tensor::from_vector({-4.0f}, Shape{1}, dt);
    const DeviceValueClip r = clip_grad_value_on_device({&a, &b}, 1.0f);
    CHECK(a.to_vector() == std::vector<float>{1.0f, -0.5f});
    CHECK(b.to_vector() == std::vector<float>{-1.0f});
    // Every value and product here is exact in FP32; the norms are rounded once from FP64.
    CHECK(r.norm.item() == static_cast<float>(std::sqrt(25.25)));
    CHECK(r.post_norm.item() == 1.5f);
    CHECK(r.dot.item() == 7.25f);
  }
  Tensor none = Tensor::from_vector({1.0f}, Shape{1});
  CHECK_THROWS_AS(clip_grad_value_on_device({&none}, 0.0f), Error);
}

TEST_CASE("SafeStep clipping by value equals PyTorch's order by hand, bit for bit", "[amp][clip]") {
  const float bound = 0.05f;
  for (DType dt : {DType::F32, DType::F16}) {
    GradScalerOptions so;
    so.enabled = dt == DType::F16;
    so.init_scale = 1024.0f;
    Model a(dt, so), b(dt, so);
    SafeStepOptions opts;
    opts.max_norm = bound;
    opts.clip_mode = ClipMode::Value;
    SafeStep step(a.opt, a.scaler, LrSchedule::constant(1e-2f), opts);
    b.opt.set_schedule(LrSchedule::constant(1e-2f));
    for (int i = 0; i < 4; ++i) {
      INFO("dtype " << dtype_name(dt) << " step " << i);
      const StepRow row = step.run([&](int) { return a.loss(); });
      // By hand: forward, scaled backward, unscale_, clamp, step, update.
      b.opt.zero_grad(true);
      Var loss = b.loss();
      b.scaler.check_loss(b.opt, loss.value());
      loss.backward(b.scaler.loss_seed_tensor(), 1.0f);
      b.scaler.unscale_(b.opt);
      const std::vector<double> raw = flat(b.opt.mutable_grads());
      clip_grad_value(b.opt.mutable_grads(), bound);
      const std::vector<double> applied = flat(b.opt.mutable_grads());
      b.scaler.step(b.opt);
      b.scaler.update();

      double dot = 0, n_raw = 0, n_applied = 0, magnitude = 0;
      size_t clamped = 0;
      for (size_t k = 0; k < raw.size(); ++k) {
        dot += raw[k] * applied[k];
        n_raw += raw[k] * raw[k];
        n_applied += applied[k] * applied[k];
        magnitude += std::fabs(raw[k] * applied[k]);
        clamped += raw[k] != applied[k];
      }
      REQUIRE(clamped > 0);                // the bound bites ...
      REQUIRE(clamped < raw.size());       // ... but not everywhere
      CHECK_FALSE(row.skipped);
      CHECK(row.grad_l2_pre_clip == static_cast<float>(std::sqrt(n_raw)));
      CHECK(row.grad_l2_post_clip == static_cast<float>(std::sqrt(n_applied)));
      // The cosine: an FP32 sum of raw.size() products (all >= 0: clamping keeps the sign),
      // two norms rounded once, one division and one rounding to FP32.
      const double cosine = dot / (std::sqrt(n_raw) * std::sqrt(n_applied));
      const double u = test::unit_roundoff(DType::F32);
      const test::Tolerance tol{static_cast<double>(raw.size() + 4) * u * magnitude / dot, 0.0};
      test::check_close({row.clip_cosine}, {cosine}, tol);
      CHECK(row.clip_cosine < 1.0f);  // clamping turned the gradient
    }
    CHECK(a.state_bits() == b.state_bits());
    CHECK(a.scaler.state().scale == b.scaler.state().scale);
  }
}

TEST_CASE("clipping by value skips a non-finite step like every other path", "[amp][clip][skip]") {
  GradScalerOptions so;
  so.init_scale = 1024.0f;
  Model a(DType::F16, so);
  SafeStepOptions opts;
  opts.max_norm = 0.05f;
  opts.clip_mode = ClipMode::Value;
  SafeStep step(a.opt, a.scaler, LrSchedule::constant(1e-2f), opts);
  step.after_backward = [](int64_t, Optimizer& o) { o.mutable_grads()[0]->set_element(0, INFINITY); };
  const std::vector<uint32_t> before = a.state_bits();
  const StepRow row = step.run([&](int) { return a.loss(); });
  CHECK(row.skipped);
  CHECK(row.skip_reason == "nonfinite_grad");
  CHECK(row.grad_l2_post_clip == 0.0f);
  CHECK(row.scaler_scale == 512.0f);
  CHECK(a.state_bits() == before);
}

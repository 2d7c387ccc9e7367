// SafeStep and the fused guard: the order of the step, skips that change nothing, and the
// fused path agreeing with PyTorch's unfused order.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>

#include "amp/autocast.h"
#include "amp/clip.h"
#include "amp/safe_step.h"
#include "autograd/modules.h"
#include "engine/allocator.h"
#include "engine/error.h"
#include "optim/adamw.h"
#include "tolerance.h"

using namespace belay;
using belay::test::bits_of;

namespace {

struct Run {
  Rng rng{7};
  Linear model{16, 4, rng};
  AdamW opt;
  GradScaler scaler;
  SafeStep step;
  Tensor x, y;
  DType dtype;

  Run(DType compute, bool fused, float max_norm, GradScalerOptions so = {}, LrSchedule sched = LrSchedule::constant(1e-2f),
      DType grad_dtype = DType::F32, bool unscale_grads = false)
      : opt(model.parameters(), AdamWOptions{1e-2f, 0.9f, 0.999f, 1e-8f, 0.01f, false}),
        scaler(Device::cpu(), so),
        step(opt, scaler, sched, SafeStepOptions{max_norm, 1, fused, ClipMode::Norm, unscale_grads}),
        dtype(compute) {
    model.set_working_dtype(compute);
    model.set_grad_dtype(grad_dtype);
    Rng data(3);
    std::vector<float> xv(8 * 16), yv(8 * 4);
    for (float& v : xv) v = data.normal();
    for (float& v : yv) v = data.normal();
    x = Tensor::from_vector(xv, Shape{8, 16});
    y = Tensor::from_vector(yv, Shape{8, 4});
  }
  StepRow run() {
    return step.run([&](int) {
      Autocast ac(dtype, dtype != DType::F32);
      return mse_loss(model(Var(x)), y);
    });
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

// A Linear(4 -> 2) trained in FP32 with `accum` micro-batches per step and a counting
// communicator.
struct AccumRun {
  Rng rng{1};
  Linear model{4, 2, rng};
  AdamW opt{model.parameters()};
  GradScaler scaler{Device::cpu(), GradScalerOptions{{}, false}};
  LocalCommunicator comm;
  SafeStep step;
  Tensor x = Tensor::full(Shape{2, 4}, 0.5f), y = Tensor::full(Shape{2, 2}, 1.0f);
  explicit AccumRun(int accum)
      : step(opt, scaler, LrSchedule::constant(1e-3f), SafeStepOptions{INFINITY, accum, true}, &comm) {}
};

}  // namespace

TEST_CASE("fused and unfused paths give bitwise equal weights with FP32 gradient buffers", "[amp][fused]") {
  for (DType dt : {DType::F32, DType::F16, DType::BF16}) {
    for (float max_norm : {INFINITY, 0.05f}) {  // 0.05 clips every step here
      GradScalerOptions so;
      so.enabled = dt == DType::F16;
      Run fused(dt, true, max_norm, so), unfused(dt, false, max_norm, so);
      for (int i = 0; i < 6; ++i) {
        const StepRow a = fused.run(), b = unfused.run();
        INFO("dtype " << dtype_name(dt) << " max_norm " << max_norm << " step " << i);
        CHECK(a.grad_l2_pre_clip == b.grad_l2_pre_clip);
        CHECK(a.loss == b.loss);
        CHECK_FALSE(a.skipped);
        if (std::isfinite(max_norm)) CHECK(a.grad_l2_post_clip == Approx(max_norm).epsilon(1e-5));
      }
      CHECK(fused.state_bits() == unfused.state_bits());
      // The working copy the next forward reads is the rounded master, written by the step.
      for (const Var& p : fused.model.parameters()) {
        CHECK(p.dtype() == dt);
        CHECK(bits_of(p.value()) == bits_of(p.master().to(dt)));
      }
    }
  }
}

TEST_CASE("unscale_grads: after a fused step the gradients are the unfused step's, bit for bit", "[amp][fused]") {
  for (DType dt : {DType::F32, DType::F16, DType::BF16}) {
    for (float max_norm : {INFINITY, 0.05f}) {  // 0.05 clips every step here
      INFO(dtype_name(dt) << " max_norm " << max_norm);
      GradScalerOptions so;
      so.enabled = dt == DType::F16;
      so.init_scale = 1024.0f;
      Run fused(dt, true, max_norm, so, LrSchedule::constant(1e-2f), DType::F32, true);
      Run unfused(dt, false, max_norm, so);
      Run scaled(dt, true, max_norm, so);  // unscale_grads off: the gradients stay as the guard read them
      for (int s = 0; s < 3; ++s) {
        fused.run();
        unfused.run();
        scaled.run();
      }
      const auto pf = fused.model.parameters(), pu = unfused.model.parameters(), ps = scaled.model.parameters();
      for (size_t i = 0; i < pf.size(); ++i) {
        CHECK(bits_of(pf[i].grad()) == bits_of(pu[i].grad()));
        if (dt == DType::F16 && std::isinf(max_norm)) {  // scaled by 1024, a power of two: exact
          const std::vector<float> g = pf[i].grad().to_vector(), gs = ps[i].grad().to_vector();
          for (size_t k = 0; k < g.size(); ++k) CHECK(gs[k] == g[k] * 1024.0f);
        }
      }
      CHECK(fused.state_bits() == scaled.state_bits());  // the step itself does not depend on it
    }
  }
}

TEST_CASE("a step run from inside its own loss function is refused, and the outer step abandoned", "[amp][skip]") {
  Run r(DType::F16, true, 1.0f);
  r.run();
  const std::vector<uint32_t> before = r.state_bits();
  const float scale = r.scaler.scale();
  const int64_t next = r.step.next_step();
  CHECK_THROWS_AS(r.step.run([&](int) { return r.run(), Var(); }), UsageError);
  CHECK_THROWS_WITH(r.step.run([&](int) { return r.run(), Var(); }),
                    Catch::Contains("run() called again while a step of the same SafeStep is running"));
  CHECK(r.state_bits() == before);
  CHECK(r.scaler.scale() == scale);
  CHECK(r.step.next_step() == next);
  for (const Var& p : r.model.parameters()) CHECK_FALSE(p.grad().defined());
  CHECK(r.run().step == next);  // usable again, as if nothing had happened
}

TEST_CASE("fused and unfused agree within rounding with FP16 gradient buffers", "[amp][fused]") {
  // Unfused unscales the FP16 gradients in place (one extra rounding per element, PyTorch
  // does the same); fused never writes them. The masters differ by at most a few FP16
  // roundings of the update, after a few steps: bounded by lr * steps * 2 * u_fp16 per weight.
  GradScalerOptions so;
  so.init_scale = 256.0f;
  Run fused(DType::F16, true, INFINITY, so, LrSchedule::constant(1e-2f), DType::F16);
  Run unfused(DType::F16, false, INFINITY, so, LrSchedule::constant(1e-2f), DType::F16);
  const int steps = 4;
  for (int i = 0; i < steps; ++i) {
    fused.run();
    unfused.run();
  }
  const double lr = 1e-2;
  // Adam's step is lr * m_hat / (sqrt(v_hat) + eps): a relative gradient error of u changes it
  // by at most ~2u of lr, per step.
  const test::Tolerance tol{0.0, lr * steps * 2.0 * test::unit_roundoff(DType::F16) * 4.0};
  for (size_t i = 0; i < 2; ++i) {
    const auto a = fused.model.parameters()[i].master().to_vector();
    const auto b = unfused.model.parameters()[i].master().to_vector();
    test::check_close(a, std::vector<double>(b.begin(), b.end()), tol);
  }
}

TEST_CASE("clip reports equal pre and post norms when nothing is clipped", "[amp][clip]") {
  Var w = Var::parameter(Tensor::from_vector({3.0f, 4.0f}, Shape{2}), "w");
  w.mutable_grad() = Tensor::from_vector({3.0f, 4.0f}, Shape{2});
  const ClipResult r = clip_grad_norm({&w.mutable_grad()}, 10.0f);
  CHECK(r.pre_clip_norm == 5.0f);
  CHECK(r.post_clip_norm == r.pre_clip_norm);
  CHECK(w.grad().to_vector() == std::vector<float>{3.0f, 4.0f});
  const ClipResult measured = clip_grad_norm({&w.mutable_grad()}, kNoClip);
  CHECK(measured.pre_clip_norm == 5.0f);
  CHECK(measured.post_clip_norm == 5.0f);
}

TEST_CASE("clip scales to max_norm over all gradients together", "[amp][clip]") {
  Tensor a = Tensor::from_vector({3.0f}, Shape{1}), b = Tensor::from_vector({4.0f}, Shape{1});
  const ClipResult r = clip_grad_norm({&a, &b}, 1.0f);
  CHECK(r.pre_clip_norm == 5.0f);
  CHECK(r.post_clip_norm == Approx(1.0f).epsilon(1e-6));
  const float coef = 1.0f / (5.0f + 1e-6f);
  CHECK(a.item() == 3.0f * coef);
  CHECK(b.item() == 4.0f * coef);
}

TEST_CASE("clip on a non-finite norm: error if asked, untouched otherwise", "[amp][clip]") {
  Tensor a = Tensor::from_vector({INFINITY, 1.0f}, Shape{2});
  CHECK_THROWS_WITH(clip_grad_norm({&a}, 1.0f, true), Catch::Contains("non-finite"));
  const ClipResult r = clip_grad_norm({&a}, 1.0f, false);
  CHECK(std::isinf(r.pre_clip_norm));
  CHECK(a.to_vector()[1] == 1.0f);
  CHECK_THROWS_AS(clip_grad_norm({&a}, 0.0f), Error);
}

TEST_CASE("clip_grad_value clamps every element", "[amp][clip]") {
  Tensor a = Tensor::from_vector({-5.0f, 0.5f, 7.0f}, Shape{3}, DType::BF16);
  clip_grad_value({&a}, 1.0f);
  CHECK(a.to_vector() == std::vector<float>{-1.0f, 0.5f, 1.0f});
}

TEST_CASE("a skipped step leaves masters, moments, step count and schedule untouched", "[amp][skip]") {
  for (bool fused : {true, false}) {
    GradScalerOptions so;
    so.init_scale = 1024.0f;
    Run r(DType::F16, fused, 1.0f, so, LrSchedule::warmup_cosine(1e-2f, 3, 20));
    r.run();
    r.run();
    const auto before = r.state_bits();
    const int64_t count = r.opt.step_count();
    const float lr_next = r.step.schedule().lr_at(count);
    r.step.after_backward = [](int64_t, Optimizer& o) { o.mutable_grads()[1]->set_element(0, NAN); };
    const StepRow skipped = r.run();
    CHECK(skipped.skipped);
    CHECK(skipped.skip_reason == "nonfinite_grad");
    CHECK(skipped.lr == lr_next);
    CHECK(skipped.scaler_scale == 512.0f);  // backed off
    CHECK(skipped.grad_l2_post_clip == 0.0f);
    CHECK(r.state_bits() == before);
    CHECK(r.opt.step_count() == count);
    r.step.after_backward = nullptr;
    const StepRow next = r.run();
    CHECK_FALSE(next.skipped);
    CHECK(next.lr == lr_next);  // the schedule did not move on the skip
    CHECK(r.opt.step_count() == count + 1);
  }
}

TEST_CASE("a non-finite loss skips the step, decided on the device", "[amp][skip]") {
  // The loss is not read on the host: its backward runs, the device flag marks the step as
  // an overflow, and the optimizer pass does nothing. Fused and unfused, FP32 and FP16.
  for (bool fused : {true, false}) {
    for (DType dt : {DType::F32, DType::F16}) {
      CAPTURE(fused, dtype_name(dt));
      GradScalerOptions so;
      so.enabled = dt == DType::F16;
      so.init_scale = 1024.0f;
      Run r(dt, fused, 1.0f, so);
      const auto before = r.state_bits();
      const StepRow row = r.step.run([&](int) {
        Autocast ac(dt, dt != DType::F32);
        return scale(mse_loss(r.model(Var(r.x)), r.y), INFINITY);
      });
      CHECK(row.skipped);
      CHECK(row.skip_reason == "nonfinite_loss");
      CHECK(std::isinf(row.loss));
      CHECK(row.grad_l2_post_clip == 0.0f);
      CHECK(row.scaler_scale == (dt == DType::F16 ? 512.0f : 1.0f));  // counts as an overflow
      CHECK(r.state_bits() == before);
      CHECK(r.opt.step_count() == 0);
      const StepRow next = r.run();  // the next step runs normally
      CHECK(next.step == 1);
      CHECK_FALSE(next.skipped);
      CHECK(r.opt.step_count() == 1);
    }
  }
}

TEST_CASE("one non-finite micro-batch loss skips the whole effective step", "[amp][skip][accum]") {
  AccumRun r(3);
  const std::vector<float> w0 = r.model.parameters()[0].master().to_vector();
  int calls = 0;
  const StepRow row = r.step.run([&](int k) {
    ++calls;
    Var loss = mse_loss(r.model(Var(r.x)), r.y);
    return k == 1 ? scale(loss, NAN) : loss;
  });
  CHECK(calls == 3);                    // every micro-batch still runs ...
  CHECK(r.comm.gradient_syncs() == 1);  // ... and the sync with it (ranks stay in step)
  CHECK(row.skip_reason == "nonfinite_loss");
  CHECK(std::isnan(row.loss));
  CHECK(r.model.parameters()[0].master().to_vector() == w0);
  CHECK(r.opt.step_count() == 0);
}

TEST_CASE("a loss function that throws leaves no trace: state, scale, step index, next step", "[amp][skip]") {
  // A non-finite loss in micro-batch 0, then a throw in micro-batch 1: had the aborted
  // step's loss check survived, the next step would be skipped as nonfinite_loss.
  GradScalerOptions so;
  so.init_scale = 1024.0f;
  Run r(DType::F16, true, 1.0f, so);
  SafeStep step(r.opt, r.scaler, LrSchedule::constant(1e-2f), SafeStepOptions{1.0f, 2, true});
  auto loss = [&](float factor) {
    Autocast ac(DType::F16);
    return scale(mse_loss(r.model(Var(r.x)), r.y), factor);
  };
  step.run([&](int) { return loss(1.0f); });
  const auto before = r.state_bits();
  CHECK_THROWS_WITH(step.run([&](int k) -> Var {
    if (k == 1) throw Error("loss function failed");
    return loss(INFINITY);
  }), "loss function failed");
  CHECK(r.state_bits() == before);
  CHECK(step.next_step() == 1);
  CHECK(r.scaler.scale() == 1024.0f);
  for (const Var& p : r.model.parameters()) CHECK_FALSE(p.grad().defined());
  const StepRow row = step.run([&](int) { return loss(1.0f); });
  CHECK(row.step == 1);
  CHECK_FALSE(row.skipped);
  CHECK(r.opt.step_count() == 2);
}

TEST_CASE("a step reads nothing back on the host: every decision is a device scalar", "[amp][sync]") {
  // On a GPU each blocking read is a synchronisation. On the CPU the same code path runs, and
  // the counter of blocking reads proves the step enqueues without one: fused and unfused,
  // FP16 with the scaler, clipping, and steps that skip on an injected inf.
  for (bool fused : {true, false}) {
    CAPTURE(fused);
    GradScalerOptions so;
    so.init_scale = 1024.0f;
    Run r(DType::F16, fused, 0.5f, so, LrSchedule::warmup_cosine(1e-2f, 2, 10));
    r.step.after_backward = [](int64_t s, Optimizer& o) {
      if (s == 2) o.mutable_grads()[0]->set_element(0, INFINITY);  // a write, not a read
    };
    std::vector<PendingStep> pending;
    const uint64_t reads = blocking_host_reads();
    for (int s = 0; s < 5; ++s)
      pending.push_back(r.step.enqueue([&](int) {
        Autocast ac(DType::F16);
        return mse_loss(r.model(Var(r.x)), r.y);
      }));
    CHECK(blocking_host_reads() == reads);
    std::vector<StepRow> rows;
    for (PendingStep& p : pending) rows.push_back(p.row());  // the log's asynchronous readback
    CHECK(blocking_host_reads() == reads);
    CHECK(rows[2].skipped);
    CHECK(rows[2].skip_reason == "nonfinite_grad");
    CHECK(rows[2].scaler_scale == 512.0f);
    CHECK(rows[3].lr == rows[2].lr);  // the skip did not move the schedule
    CHECK_FALSE(rows[4].skipped);
    CHECK(r.opt.step_count() == 4);
  }
}

TEST_CASE("a steady-state step allocates nothing from the system", "[amp][alloc]") {
  for (bool fused : {true, false}) {
    CAPTURE(fused);
    Run r(DType::F16, fused, 1.0f);
    for (int s = 0; s < 3; ++s) r.run();  // warm the caching allocator
    const uint64_t before = allocator_for(Device::cpu()).stats().system_allocs;
    for (int s = 0; s < 10; ++s) r.run();
    CHECK(allocator_for(Device::cpu()).stats().system_allocs == before);
  }
}

TEST_CASE("the loss is scaled for backward and the gradients unscaled before the step", "[amp][scaler]") {
  // The same step with and without loss scaling moves the weights identically (powers of
  // two scale exactly), and the logged norm is the unscaled one.
  GradScalerOptions on, off;
  on.init_scale = 1024.0f;
  off.enabled = false;
  Run a(DType::F32, true, INFINITY, on), b(DType::F32, true, INFINITY, off);
  const StepRow ra = a.run(), rb = b.run();
  CHECK(ra.grad_l2_pre_clip == rb.grad_l2_pre_clip);
  CHECK(a.state_bits() == b.state_bits());
  CHECK(ra.scaler_scale == 1024.0f);
  CHECK(rb.scaler_scale == 1.0f);
}

TEST_CASE("gradient accumulation: one sync and one step per effective batch", "[amp][accum]") {
  AccumRun r(4);
  int calls = 0;
  for (int s = 0; s < 3; ++s)
    r.step.run([&](int) {
      ++calls;
      return mse_loss(r.model(Var(r.x)), r.y);
    });
  CHECK(calls == 12);
  CHECK(r.comm.gradient_syncs() == 3);
  CHECK(r.opt.step_count() == 3);
}

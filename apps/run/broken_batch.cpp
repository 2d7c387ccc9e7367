// `belay train --scenario broken-batch`: 20 weights at 3.0, loss = sum of squares, Adam
// (lr 0.01, default betas and eps, no decay), 300 steps numbered from 0; the gradient of
// step 50 is multiplied by 1000. Once unclipped, once clipped to norm 1.0. The unclipped
// run's v absorbs the 1000x gradient, so sqrt(v_hat) stays huge and the steps tiny for
// hundreds of steps: one bad batch freezes Adam when nothing clips it.
#include <cmath>
#include <cstdio>
#include <ostream>
#include <vector>

#include "amp/safe_step.h"
#include "apps/run/train.h"
#include "autograd/ops.h"
#include "engine/backend.h"
#include "optim/adamw.h"

namespace belay {
namespace {

struct ScenarioTrace {
  std::vector<float> loss;         // at the start of each step
  std::vector<float> sqrt_v_hat;   // first weight, after each step's update
  float norm_at_50 = 0.0f;
};

ScenarioTrace run_scenario(float max_norm) {
  constexpr int kSteps = 300, kBadStep = 50;
  Var w = Var::parameter(Tensor::full(Shape{20}, 3.0f), "w");
  AdamWOptions o;
  o.lr = 0.01f;
  o.weight_decay = 0.0f;
  AdamW opt({w}, o);
  GradScalerOptions so;
  so.enabled = false;
  GradScaler scaler(Device::cpu(), so);
  SafeStepOptions sso;
  sso.max_norm = max_norm;
  SafeStep step(opt, scaler, LrSchedule::constant(o.lr), sso);
  step.after_backward = [](int64_t s, Optimizer& opt) {
    if (s != kBadStep) return;
    const Tensor factor = Tensor::scalar(1000.0f);
    backend_for(Device::cpu()).scale_inplace(opt.mutable_grads(), factor);
  };
  ScenarioTrace t;
  for (int s = 0; s < kSteps; ++s) {
    const StepRow row = step.run([&](int) { return sum(mul(w, w)); });
    t.loss.push_back(row.loss);
    if (s == kBadStep) t.norm_at_50 = row.grad_l2_pre_clip;
    const double v = opt.exp_avg_sq(0).to_vector()[0];
    const double bc2 = 1.0 - std::pow(0.999, static_cast<double>(opt.step_count()));
    t.sqrt_v_hat.push_back(static_cast<float>(std::sqrt(v / bc2)));
  }
  return t;
}

}  // namespace

int run_broken_batch(std::ostream& out) {
  const ScenarioTrace plain = run_scenario(INFINITY);
  const ScenarioTrace clipped = run_scenario(1.0f);
  char buf[200];
  out << "broken-batch: 20 weights at 3.0, loss = sum(w^2), Adam lr 0.01, 300 steps; step 50's gradient x1000\n";
  std::snprintf(buf, sizeof buf, "pre-clip gradient norm at step 50: %.6g (clipped run: %.6g, scaled to 1.0)\n",
                (double)plain.norm_at_50, (double)clipped.norm_at_50);
  out << buf;
  std::snprintf(buf, sizeof buf, "%6s  %16s  %16s  %22s\n", "step", "loss (no clip)", "loss (clip 1.0)",
                "sqrt(v_hat) w0 no clip");
  out << buf;
  for (int s : {49, 51, 100, 299}) {
    std::snprintf(buf, sizeof buf, "%6d  %16.6g  %16.6g  %22.6g\n", s, (double)plain.loss[s], (double)clipped.loss[s],
                  (double)plain.sqrt_v_hat[s]);
    out << buf;
  }
  out << "without clipping, the 1000x gradient lives on in v: sqrt(v_hat) stays large and each step moves the\n"
         "weights by about lr * m_hat / sqrt(v_hat), far less than lr, so the unclipped loss stalls.\n";
  return 0;
}

}  // namespace belay

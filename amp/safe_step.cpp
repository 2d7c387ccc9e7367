#include "amp/safe_step.h"

#include <cmath>

#include "amp/clip.h"
#include "engine/error.h"

namespace belay {

SafeStep::SafeStep(Optimizer& opt, GradScaler& scaler, LrSchedule schedule, SafeStepOptions options,
                   Communicator* comm)
    : opt_(opt), scaler_(scaler), schedule_(schedule), options_(options), comm_(comm ? comm : &local_comm_) {
  if (options_.accum_steps < 1) throw UsageError("accum_steps must be >= 1");
  if (std::isnan(options_.max_norm) || options_.max_norm <= 0.0f)
    throw UsageError("max_norm must be > 0 (inf: no clipping)");
}

StepRow SafeStep::run(const std::function<Var(int)>& loss_fn) {
  StepRow row;
  row.step = step_++;
  row.lr = schedule_.lr_at(opt_.step_count());
  opt_.set_lr(row.lr);
  opt_.zero_grad(true);

  // Forward and backward, micro-batch by micro-batch. The loss is checked before its
  // backward: a non-finite loss would only fill the gradients with NaN.
  // d(objective)/d(loss) = scale / accum_steps, from the scale in device memory.
  const float per_micro_batch = 1.0f / static_cast<float>(options_.accum_steps);
  double loss_sum = 0.0;
  for (int k = 0; k < options_.accum_steps; ++k) {
    Var loss = loss_fn(k);
    const float value = loss.value().item();
    loss_sum += value;
    if (!std::isfinite(value)) {
      opt_.zero_grad(true);
      scaler_.record_overflow(opt_);
      scaler_.update();
      row.loss = value;
      row.skipped = true;
      row.skip_reason = "nonfinite_loss";
      row.grad_l2_pre_clip = std::nanf("");
      row.grad_l2_post_clip = 0.0f;
      row.scaler_scale = scaler_.scale();
      return row;
    }
    loss.backward(scaler_.loss_seed_tensor(), per_micro_batch);
  }
  row.loss = static_cast<float>(loss_sum / options_.accum_steps);
  comm_->all_reduce_gradients(opt_.mutable_grads());  // once, after the last micro-batch
  if (after_backward) after_backward(row.step, opt_);

  float norm = 0.0f, post = 0.0f;
  if (options_.fused) {
    const GuardResult g = scaler_.guard(opt_, options_.max_norm);
    norm = g.norm.item();
    post = norm * g.clip_coef.item();
  } else {
    scaler_.unscale_(opt_);
    if (scaler_.found_inf(opt_)) {
      norm = std::numeric_limits<float>::infinity();
    } else {
      const ClipResult c = clip_grad_norm(opt_, options_.max_norm);
      norm = c.pre_clip_norm;
      post = c.post_clip_norm;
    }
  }
  const bool found_inf = scaler_.found_inf(opt_);
  scaler_.step(opt_);  // a no-op under found_inf
  scaler_.update();
  if (found_inf) opt_.zero_grad(true);

  row.grad_l2_pre_clip = norm;  // inf or NaN as measured when the step is skipped
  row.grad_l2_post_clip = found_inf ? 0.0f : post;
  row.skipped = found_inf;
  row.skip_reason = found_inf ? "nonfinite_grad" : "";
  row.scaler_scale = scaler_.scale();
  return row;
}

}  // namespace belay

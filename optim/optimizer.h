// The optimizer interface. Parameters hold FP32 masters; an optimizer keeps its state in
// FP32 and, in the same pass that updates a master, writes the FP16/BF16 working copy the
// next forward reads. A step takes three device scalars from the AMP guard (inv_scale,
// clip_coef, found_inf) and applies g * inv_scale * clip_coef on the fly; with found_inf
// set it changes nothing, not even its step count.
//
// The position of the run lives on the device too: the applied-step count is a device
// scalar advanced by a kernel only when found_inf is clear, the LR is picked on the device
// from the schedule's table at that count, and AdamW's bias corrections are computed from it
// in the update kernel. So a step is enqueued without the host reading anything back.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "autograd/graph.h"
#include "engine/backend.h"
#include "optim/lr_schedule.h"

namespace belay {

class Optimizer {
 public:
  explicit Optimizer(std::vector<Var> params, float lr);
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  void step(const Tensor& inv_scale, const Tensor& clip_coef, const Tensor& found_inf);
  void step();  // no scaling, no clipping
  void zero_grad(bool set_to_none = true);

  const std::vector<Var>& params() const { return params_; }
  // The gradients the next step will read (parameters without a gradient are skipped).
  std::vector<const Tensor*> grads() const;
  std::vector<Tensor*> mutable_grads();
  Device device() const { return device_; }

  // The LR as a function of the applied-step count (uploaded once as a table).
  void set_schedule(const LrSchedule& schedule);
  void set_lr(float lr) { set_schedule(LrSchedule::constant(lr)); }
  const LrSchedule& schedule() const { return schedule_; }
  // The LR the last step() used or would have used (a device scalar, for the log).
  const Tensor& lr_tensor() const { return lr_now_; }

  // Applied steps only. step_count() reads the device count (a host read: for checkpoints
  // and tests, never inside a step).
  int64_t step_count() const;
  void set_step_count(int64_t n);
  const Tensor& applied_steps_tensor() const { return applied_steps_; }

  // Named FP32 state tensors (moments, momentum buffers), for checkpoints.
  virtual std::vector<std::pair<std::string, Tensor*>> state_tensors() = 0;
  virtual std::string name() const = 0;

 protected:
  // One update pass with the step's device scalars (lr and applied_steps included).
  virtual void apply(const StepScalars& scalars) = 0;
  // The working copy to refresh with the master, or null when they share storage (FP32).
  static Tensor* working_copy_of(const Var& p);

  std::vector<Var> params_;
  Device device_;
  LrSchedule schedule_;
  Tensor lr_table_;       // FP32 [n]: lr_at(k) for k < n; the last entry holds from there on
  Tensor lr_now_;         // FP32 [1]
  Tensor applied_steps_;  // FP32 [1]: exact up to 2^24 steps
};

}  // namespace belay

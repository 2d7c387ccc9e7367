// SafeStep: the whole mixed-precision step, in the right order by construction.
//   for each micro-batch: forward -> loss finite? (no: SKIP nonfinite_loss, no backward)
//                         -> backward of loss * scale / accum_steps
//   gradient sync (once, after the last micro-batch)
//   -> guard (found_inf, norm of the unscaled gradients; fused: nothing written)
//   -> found_inf? SKIP nonfinite_grad : clip coefficient, optimizer step
//   -> scaler update (every step, skipped or not) -> the step's log row
// The LR comes from the schedule at the optimizer's applied-step count, so a skipped step
// does not advance it.
#pragma once
#include <functional>
#include <limits>

#include "amp/communicator.h"
#include "amp/grad_scaler.h"
#include "amp/step_log.h"
#include "autograd/graph.h"
#include "optim/lr_schedule.h"
#include "optim/optimizer.h"

namespace belay {

struct SafeStepOptions {
  float max_norm = std::numeric_limits<float>::infinity();  // inf: measure, never clip
  int accum_steps = 1;
  bool fused = true;  // false: unscale_ in place, clip_grad_norm_, step (PyTorch's order)
};

class SafeStep {
 public:
  SafeStep(Optimizer& opt, GradScaler& scaler, LrSchedule schedule, SafeStepOptions options = {},
           Communicator* comm = nullptr);

  // Runs one effective step: loss_fn(k) returns micro-batch k's FP32 loss (forward only).
  StepRow run(const std::function<Var(int micro_batch)>& loss_fn);

  // Called after the last backward, before the guard: lets a test or the demo plant a
  // non-finite gradient (--inject-inf). Gets the step index.
  std::function<void(int64_t step, Optimizer& opt)> after_backward;

  int64_t next_step() const { return step_; }
  void set_next_step(int64_t step) { step_ = step; }
  const SafeStepOptions& options() const { return options_; }
  const LrSchedule& schedule() const { return schedule_; }
  Communicator& communicator() { return *comm_; }

 private:
  Optimizer& opt_;
  GradScaler& scaler_;
  LrSchedule schedule_;
  SafeStepOptions options_;
  LocalCommunicator local_comm_;
  Communicator* comm_;
  int64_t step_ = 0;
};

}  // namespace belay

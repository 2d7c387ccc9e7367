// SafeStep: the whole mixed-precision step, in the right order by construction.
//   for each micro-batch: forward -> loss checked on the device (non-finite: the step will
//                         be skipped as nonfinite_loss) -> backward of loss * scale / accum_steps
//   gradient sync (once, after the last micro-batch)
//   -> guard (found_inf, norm of the unscaled gradients; fused: nothing written)
//   -> clip coefficient, optimizer step (a no-op under found_inf, on the device)
//   -> scaler update (every step, skipped or not) -> the step's log row
// The LR comes from the schedule at the optimizer's applied-step count, so a skipped step
// does not advance it.
//
// No host synchronisation: every decision above is data on the device (found_inf, the
// clip coefficient, the count that picks the LR and the bias corrections). A step is only
// enqueued; its row's values follow it to the host asynchronously and are read when the
// caller asks for them (one step late in `belay train`, so a GPU never waits for the host).
// The price: a non-finite loss still runs its backward (into gradients the step then
// ignores) instead of stopping before it, as PyTorch's GradScaler also does.
#pragma once
#include <functional>
#include <limits>
#include <memory>

#include "amp/clip.h"
#include "amp/dist/communicator.h"
#include "amp/grad_scaler.h"
#include "amp/step_log.h"
#include "autograd/cast_census.h"
#include "autograd/graph.h"
#include "optim/lr_schedule.h"
#include "optim/optimizer.h"

namespace belay {

// Norm: scale every gradient by min(1, max_norm / norm) (the direction is kept). Value:
// clamp every element to [-max_norm, max_norm] (torch's clip_grad_value_; the direction
// changes), always in separate passes after an in-place unscale, as PyTorch would.
enum class ClipMode { Norm, Value };

struct SafeStepOptions {
  float max_norm = std::numeric_limits<float>::infinity();  // inf: measure, never clip; Value: the bound
  int accum_steps = 1;
  bool fused = true;  // false: unscale_ in place, clip_grad_norm_, step (PyTorch's order)
  ClipMode clip_mode = ClipMode::Norm;
  // The fused step reads the gradients scaled and never writes them, so after it they still
  // hold loss scale x gradient. true: two more passes leave what the unfused step leaves (the
  // gradient unscaled, and clipped by norm when max_norm is finite), as PyTorch's p.grad
  // after scaler.step; the Python module asks for it, the CLI does not need it.
  bool unscale_grads = false;
  // The numerics census (engine/census.h): the fused guard also counts, per gradient, what
  // census_format (FP16 or BF16) would make of it at this step's scale; each row carries it.
  bool census = false;
  DType census_format = DType::F16;
  // With census: the census of the forward's casts too (autograd/cast_census.h: the autocast
  // casts of activations and the weights' working copies), in StepRow::cast_census. The
  // roundings into FP16/BF16 gradient buffers are counted whenever census is on.
  bool census_casts = false;
};

// What a step's census needs besides the guard's record: each gradient's name and size, in
// the order of opt.grads().
struct CensusNames {
  std::vector<std::string> names;
  std::vector<int64_t> numels;
};

// A step's census on its way to the host: the guard's records and the casts' (copies on the
// device, read back with the row).
struct PendingCensus {
  Tensor guard;  // FP32 [grads, kCensusFields] words; undefined without a census
  std::shared_ptr<const CensusNames> names;
  CastCensus::Taken forward, grad_buffers;
};

// A step that has been enqueued, and its log row on its way to the host.
class PendingStep {
 public:
  // value_clip: the values carry the post-clamp norm and the raw . clamped dot product.
  PendingStep(int64_t step, std::unique_ptr<HostReadback> values, bool value_clip = false, PendingCensus census = {});
  int64_t step() const { return step_; }
  bool ready() const { return values_->ready(); }  // never blocks
  StepRow row();                                   // waits for the values if they are not there yet

 private:
  int64_t step_;
  std::unique_ptr<HostReadback> values_;
  bool value_clip_;
  PendingCensus census_;
};

class SafeStep {
 public:
  SafeStep(Optimizer& opt, GradScaler& scaler, LrSchedule schedule, SafeStepOptions options = {},
           Communicator* comm = nullptr);

  // Enqueues one effective step: loss_fn(k) returns micro-batch k's FP32 loss (forward
  // only). Reads nothing back from the device.
  PendingStep enqueue(const std::function<Var(int micro_batch)>& loss_fn);
  // The same, waiting for the row (a simple loop, or a test).
  StepRow run(const std::function<Var(int micro_batch)>& loss_fn) { return enqueue(loss_fn).row(); }

  // Called after the last backward, before the guard: lets a test or the demo plant a
  // non-finite gradient (--inject-inf). Gets the step index.
  std::function<void(int64_t step, Optimizer& opt)> after_backward;

  int64_t next_step() const { return step_; }
  void set_next_step(int64_t step) { step_ = step; }
  const SafeStepOptions& options() const { return options_; }
  const LrSchedule& schedule() const { return opt_.schedule(); }
  Communicator& communicator() { return *comm_; }

 private:
  Optimizer& opt_;
  GradScaler& scaler_;
  SafeStepOptions options_;
  LocalCommunicator local_comm_;
  Communicator* comm_;
  int64_t step_ = 0;
  bool running_ = false;  // inside enqueue: a second step from the loss function is refused
  std::shared_ptr<const CensusNames> census_names_;  // the gradients' names, taken once
  CastCensus cast_census_;                           // its sites persist from step to step

  // The phases of enqueue.
  struct StepMeasures {
    Tensor norm, clip_coef, census;
    DeviceValueClip value_clip;
  };
  Tensor forward_backward(const std::function<Var(int)>& loss_fn, int64_t step);
  StepMeasures measure_and_clip();
  void leave_grads_unscaled(const Tensor& clip_coef);
  PendingCensus take_census(const Tensor& guard_census);
};

}  // namespace belay

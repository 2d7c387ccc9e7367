// Rollback (`belay train --rollback-on ...`): the run keeps its last good state in memory and
// returns to it when a condition fires. Three conditions, each with explicit thresholds:
//   skip-rate       more than max_skip_rate * skip_window of the last skip_window rows skipped
//                   (counted from the first row, so it can fire before the window fills)
//   nonfinite-loss  a row whose loss was inf or NaN
//   divergence      the smoothed loss (EMA, weight 0.1 per applied step) above
//                   divergence_factor x the best smoothed loss, after divergence_warmup applied steps
// The state is held in memory, not on disk: it is taken every few steps (a copy on the
// device, no file I/O, no fsync), restoring it cannot fail on a half-written or replaced file,
// and --checkpoint already covers a crash. A snapshot is "good" when it is taken right
// after an applied step with a finite loss and no condition is near its threshold.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "amp/grad_scaler.h"
#include "amp/step_log.h"
#include "apps/run/dataset.h"
#include "autograd/modules.h"
#include "optim/optimizer.h"

namespace belay {

struct RollbackOptions {
  bool on_skip_rate = false, on_nonfinite_loss = false, on_divergence = false;
  int64_t every = 10;            // --rollback-every: a new snapshot at most every N steps
  int64_t skip_window = 20;      // --rollback-skip-window
  double max_skip_rate = 0.25;   // --rollback-skip-rate
  double divergence_factor = 4;  // --divergence-factor
  int64_t divergence_warmup = 20;  // --divergence-warmup
  // After the condition fires: "stop" (exit 1, the restored state checkpointed), "fp32"
  // (continue with autocast off), "lower-lr" (continue with the LR multiplied by lr_factor).
  std::string policy = "stop";
  float lr_factor = 0.1f;
  int64_t max_rollbacks = 3;  // a condition firing once more than this stops the run (exit 1)
  std::string report;         // the case file (JSON); train picks a default
  bool enabled() const { return on_skip_rate || on_nonfinite_loss || on_divergence; }
  bool continues() const { return policy != "stop"; }
};

void validate_rollback(const RollbackOptions& options);  // UsageError on anything out of range

// Watches the rows; says when a condition fires and whether the state is good to keep.
class RollbackTrigger {
 public:
  explicit RollbackTrigger(RollbackOptions options);
  // The reason ("skip-rate: ...") when a condition fires on this row.
  std::optional<std::string> observe(const StepRow& row);
  bool healthy() const;  // a snapshot taken now would be a good one
  void reset();          // after a restore: every window starts again
  const std::string& condition() const { return condition_; }  // of the last firing

  static constexpr double kEmaWeight = 0.1;

 private:
  RollbackOptions o_;
  std::vector<bool> window_;  // ring of the last skip_window rows' skipped flags
  int64_t seen_ = 0, skips_ = 0;
  bool last_applied_ = false;
  int64_t applied_ = 0;
  double ema_ = 0.0, best_ = 0.0;
  std::string condition_;
};

// Everything a step depends on, copied on the device: masters, optimizer state, the
// optimizer's applied-step count (the LR schedule position), the scaler, the data position.
struct Snapshot {
  int64_t next_step = 0;
  int64_t optimizer_steps = 0;
  ScalerState scaler;
  std::string data_position;
  std::vector<Tensor> tensors;  // masters in parameter order, then optimizer state tensors
  size_t row_index = 0;         // how many rows the run had logged when it was taken
};

Snapshot take_snapshot(const Module& model, Optimizer& opt, const GradScaler& scaler, const Dataset& data,
                       int64_t next_step);
// Puts every value back, bit for bit, and refreshes the FP16/BF16 working copies.
void restore_snapshot(const Snapshot& snap, Module& model, Optimizer& opt, GradScaler& scaler, Dataset& data);

}  // namespace belay

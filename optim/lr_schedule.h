// Learning-rate schedules as pure functions of the number of APPLIED steps: a skipped
// step does not move the schedule, and the position is just the optimizer's step count
// (so a checkpoint needs nothing more to resume it).
#pragma once
#include <cstdint>
#include <string>

namespace belay {

struct LrSchedule {
  enum class Kind { Constant, WarmupCosine };
  Kind kind = Kind::Constant;
  float peak_lr = 1e-3f;
  int64_t warmup_steps = 0;  // linear from peak/warmup up to peak
  int64_t total_steps = 1;   // cosine reaches min_lr here
  float min_lr = 0.0f;

  // Both refuse an LR that is negative (the step would ascend), NaN or infinite (every weight
  // NaN after one step): check() below, the one place optimizers and schedules are held to.
  static LrSchedule constant(float lr) { return LrSchedule{Kind::Constant, lr, 0, 1, lr}.check(); }
  static LrSchedule warmup_cosine(float peak, int64_t warmup, int64_t total, float min_lr = 0.0f) {
    return LrSchedule{Kind::WarmupCosine, peak, warmup, total, min_lr}.check();
  }
  // This schedule, or a UsageError when an LR it gives is not a finite number >= 0.
  const LrSchedule& check() const;
  // A UsageError "<what>: lr must be a finite number >= 0, got <lr>" unless it is one.
  static void check_lr(const char* what, float lr);
  // The LR of the step taken after `applied_steps` applied steps (0 for the first).
  float lr_at(int64_t applied_steps) const;
};

LrSchedule parse_schedule(const std::string& name, float lr, int64_t warmup, int64_t total);  // throws UsageError

}  // namespace belay

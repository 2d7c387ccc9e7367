#include "optim/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "engine/error.h"

namespace belay {

float LrSchedule::lr_at(int64_t t) const {
  if (kind == Kind::Constant) return peak_lr;
  if (t < warmup_steps) return peak_lr * static_cast<float>(t + 1) / static_cast<float>(warmup_steps);
  const double span = static_cast<double>(std::max<int64_t>(1, total_steps - warmup_steps));
  const double progress = std::clamp(static_cast<double>(t - warmup_steps) / span, 0.0, 1.0);
  return static_cast<float>(min_lr + 0.5 * (peak_lr - min_lr) * (1.0 + std::cos(3.14159265358979323846 * progress)));
}

void LrSchedule::check_lr(const char* what, float lr) {
  if (std::isfinite(lr) && lr >= 0.0f) return;
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", static_cast<double>(lr));
  throw UsageError(std::string(what) + ": lr must be a finite number >= 0, got " + buf +
                   " (a negative LR ascends the loss; NaN or inf turns every weight into NaN)");
}

const LrSchedule& LrSchedule::check() const {
  // lr_at lies between min_lr and peak_lr (the warmup between 0 and peak_lr): both ends suffice.
  check_lr("LR schedule", peak_lr);
  check_lr("LR schedule (min_lr)", min_lr);
  return *this;
}

LrSchedule parse_schedule(const std::string& name, float lr, int64_t warmup, int64_t total) {
  if (name == "constant") return LrSchedule::constant(lr);
  if (name == "cosine") return LrSchedule::warmup_cosine(lr, warmup, total, 0.0f);
  throw UsageError("unknown schedule '" + name + "': use constant or cosine");
}

}  // namespace belay

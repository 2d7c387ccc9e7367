#include "optim/lr_schedule.h"

#include <algorithm>
#include <cmath>

#include "engine/error.h"

namespace belay {

float LrSchedule::lr_at(int64_t t) const {
  if (kind == Kind::Constant) return peak_lr;
  if (t < warmup_steps) return peak_lr * static_cast<float>(t + 1) / static_cast<float>(warmup_steps);
  const double span = static_cast<double>(std::max<int64_t>(1, total_steps - warmup_steps));
  const double progress = std::clamp(static_cast<double>(t - warmup_steps) / span, 0.0, 1.0);
  return static_cast<float>(min_lr + 0.5 * (peak_lr - min_lr) * (1.0 + std::cos(3.14159265358979323846 * progress)));
}

LrSchedule parse_schedule(const std::string& name, float lr, int64_t warmup, int64_t total) {
  if (name == "constant") return LrSchedule::constant(lr);
  if (name == "cosine") return LrSchedule::warmup_cosine(lr, warmup, total, 0.0f);
  throw UsageError("unknown schedule '" + name + "': use constant or cosine");
}

}  // namespace belay

#include "amp/scale_monitor.h"

#include <algorithm>

#include "engine/error.h"

namespace belay {

ScaleMonitor::ScaleMonitor(float initial, int64_t growth_interval, float min_scale)
    : growth_interval_(growth_interval), min_scale_(min_scale), last_(initial) {
  if (growth_interval_ < 1) throw UsageError("scale monitor: growth interval must be >= 1");
  summary_.min = summary_.max = initial;
}

ScaleMonitor::Verdict ScaleMonitor::observe(const StepRow& row) {
  Verdict v;
  const float s = row.scaler_scale;
  summary_.min = std::min(summary_.min, s);
  summary_.max = std::max(summary_.max, s);
  if (s < last_) {
    ++summary_.backoffs;
    v.backed_off = true;
    recent_backoffs_.push_back(row.step);
  } else if (s > last_) {
    ++summary_.growths;
  }
  last_ = s;
  // Keep the backoffs of the last growth_interval steps (this one included).
  while (!recent_backoffs_.empty() && recent_backoffs_.front() <= row.step - growth_interval_)
    recent_backoffs_.pop_front();
  if (recent_backoffs_.empty()) warned_repeat_ = false;
  v.backoffs_in_interval = static_cast<int64_t>(recent_backoffs_.size());
  if (!recent_backoffs_.empty()) v.interval_start = recent_backoffs_.front();
  if (v.backed_off && v.backoffs_in_interval >= kRepeatedBackoffs && !warned_repeat_) {
    v.repeated_backoff = true;
    warned_repeat_ = true;
  }
  if (row.skipped && s <= min_scale_ && !warned_min_) {
    v.hit_min = true;
    warned_min_ = true;
  }
  return v;
}

void ScaleMonitor::restart(float scale) {
  last_ = scale;
  summary_.min = std::min(summary_.min, scale);
  summary_.max = std::max(summary_.max, scale);
  recent_backoffs_.clear();
  warned_repeat_ = false;
}

}  // namespace belay

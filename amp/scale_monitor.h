// What the loss scale did over a run, read from the log rows: its min and max, how often it
// backed off and grew, and two warnings. A scale that backs off again and again within one
// growth interval is overflowing faster than it can recover (a falling scale does not prove
// the problem is gone); a scale that reaches min_scale can fall no further, so overflows
// from there on are not a scaling problem (look for the op that overflows; try bf16).
#pragma once
#include <cstdint>
#include <deque>

#include "amp/step_log.h"

namespace belay {

struct ScaleSummary {
  float min = 0.0f, max = 0.0f;  // over the initial scale and every row's
  int64_t backoffs = 0;          // rows whose scale is below the one before
  int64_t growths = 0;           // rows whose scale is above the one before
};

class ScaleMonitor {
 public:
  // initial: the scale the first observed step ran with.
  ScaleMonitor(float initial, int64_t growth_interval, float min_scale);
  struct Verdict {
    bool backed_off = false;
    // Set on the row that makes `kRepeatedBackoffs` backoffs within growth_interval steps,
    // once per such episode (the episode ends when a whole interval passes without one).
    bool repeated_backoff = false;
    int64_t backoffs_in_interval = 0;
    int64_t interval_start = 0;  // the step of the first backoff counted
    bool hit_min = false;        // the first overflow that leaves the scale at min_scale
  };
  Verdict observe(const StepRow& row);
  // The scale was set from outside (a rollback restored it): no backoff or growth counted.
  void restart(float scale);
  const ScaleSummary& summary() const { return summary_; }

  static constexpr int64_t kRepeatedBackoffs = 2;

 private:
  int64_t growth_interval_;
  float min_scale_;
  float last_;
  ScaleSummary summary_;
  std::deque<int64_t> recent_backoffs_;  // steps, within the last growth interval
  bool warned_repeat_ = false;
  bool warned_min_ = false;
};

}  // namespace belay

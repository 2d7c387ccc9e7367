// The per-step log: one CSV row per optimizer step, applied or skipped, with exactly the
// columns step,lr,grad_l2_pre_clip,grad_l2_post_clip,loss,skipped,skip_reason,scaler_scale.
// Every row is flushed when written, so Ctrl-C or kill -9 never loses a completed row.
// And the skip-rate monitor: a rolling rate with an alert line and an optional stop.
#pragma once
#include <cstdint>
#include <cstdio>
#include <deque>
#include <string>
#include <vector>

#include "engine/census.h"

namespace belay {

struct StepRow {
  int64_t step = 0;
  float lr = 0.0f;
  float grad_l2_pre_clip = 0.0f;   // norm of the unscaled gradients; inf/NaN on an overflow
  float grad_l2_post_clip = 0.0f;  // the norm applied; 0 when the step was skipped
  float loss = 0.0f;               // unscaled, averaged over micro-batches
  bool skipped = false;
  std::string skip_reason;         // "", "nonfinite_loss" or "nonfinite_grad"
  float scaler_scale = 1.0f;       // the scale after this step's update (what the next step uses)
  // Not in the CSV: cos(raw gradient, applied gradient) of an applied step. 1 under norm
  // clipping (a positive multiple keeps the direction); measured under --clip-mode value.
  float clip_cosine = 1.0f;
  // Not in the CSV: each gradient's census of this step, when the step was asked for it
  // (SafeStepOptions::census), in backward order (the reverse of the parameters' order).
  std::vector<TensorCensus> census;
  // Not in the CSV: the census of the forward's casts (SafeStepOptions::census_casts), one
  // entry per cast site (autograd/cast_census.h) in the order first seen.
  std::vector<TensorCensus> cast_census;
};

// The tensors of a census that hold a non-finite value, the first named and the others
// counted ("blocks.1.mlp.fc.weight(+2 more)"); "" when none does. The step log's
// `nonfinite_tensors` column.
std::string nonfinite_tensors(const std::vector<TensorCensus>& census);

extern const char* const kStepLogHeader;
std::string format_step_row(const StepRow& row);  // one CSV line, no newline

class StepLogWriter {
 public:
  // Opens (truncates) `path` and writes the header; throws UsageError naming the path if
  // it cannot be written. With keep_rows_through >= 0 an existing log is kept up to and
  // including that step (resuming a run) and appended to.
  // extra_columns: columns after the canonical 8, given only when a run asks for them (the
  // default log keeps exactly the 8): `policy`, for a run whose rollback may change the
  // precision policy or the LR; `heldout_loss`, for a run that evaluates held-out text;
  // `nonfinite_tensors`, for a run that takes the census (--census). A
  // resumed log must have the same columns.
  explicit StepLogWriter(const std::string& path, int64_t keep_rows_through = -1,
                         std::vector<std::string> extra_columns = {});
  ~StepLogWriter();
  StepLogWriter(const StepLogWriter&) = delete;
  StepLogWriter& operator=(const StepLogWriter&) = delete;
  // extra: one value per extra column (no commas; a policy label is never empty).
  void write(const StepRow& row, const std::vector<std::string>& extra = {});
  void close();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::vector<std::string> extra_columns_;
  std::FILE* file_ = nullptr;
};

struct SkipMonitorOptions {
  int64_t window = 1000;       // steps the rate is taken over
  double alert_rate = 0.05;    // an alert line when the rate passes this
  double max_rate = -1.0;      // stop the run when the rate stays above this ... (< 0: never)
  int64_t patience = 100;      // ... for this many consecutive steps
};

class SkipMonitor {
 public:
  explicit SkipMonitor(SkipMonitorOptions options = {});
  struct Verdict {
    double rate = 0.0;       // skips / steps over the last min(window, steps seen)
    bool alert = false;      // the rate just rose past alert_rate
    bool stop = false;       // above max_rate for `patience` consecutive steps
  };
  Verdict observe(bool skipped);
  const SkipMonitorOptions& options() const { return options_; }

 private:
  SkipMonitorOptions options_;
  std::deque<bool> recent_;
  int64_t skips_in_window_ = 0;
  bool alerting_ = false;
  int64_t above_max_for_ = 0;
};

}  // namespace belay

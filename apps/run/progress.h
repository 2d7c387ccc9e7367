// The progress display of a training run: one live line rewritten in place on a terminal,
// a plain line every tenth of the run otherwise (logs, pipes, CI).
#pragma once
#include <chrono>
#include <cstdint>
#include <iosfwd>

#include "amp/step_log.h"

namespace belay {

class Progress {
 public:
  // tokens_per_step > 0 (token data): the line also says tokens per second since the start.
  Progress(std::ostream& out, int64_t total_steps, bool live, int64_t tokens_per_step = 0);
  void update(const StepRow& row, int64_t skipped_so_far);
  void finish();

 private:
  std::ostream& out_;
  int64_t total_;
  bool live_;
  int64_t every_;
  bool dirty_ = false;
  int64_t tokens_per_step_;
  int64_t steps_seen_ = 0;
  std::chrono::steady_clock::time_point t0_;
};

// Whether `out` is the process's standard output attached to a terminal.
bool is_terminal(std::ostream& out);

// One printed row of --show-steps: "STEP     5 loss ... " or "SKIP     5 nonfinite_grad ...".
std::string describe_row(const StepRow& row);

}  // namespace belay

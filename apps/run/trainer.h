// The training run as a library: a Trainer is one run of `belay train`, and its phases are
// named functions that run() calls in order, top to bottom:
//   Trainer(config, out)  build: the dataset, the options checked, the model, the optimizer,
//                         the scaler and the SafeStep that ties them (nothing is written)
//   resume()              continue from config.resume, every check before anything is written
//   open_outputs()        the CSV opened, the checkpoint's and the rollback case file's paths checked
//   announce()            the header line
//   start()               progress display, signal handlers, monitors, anomaly mode, first snapshot
//   step(s)               enqueue step s (its batch, forward, backward, SafeStep)
//   log(row)              one finished step: CSV, progress, the monitors (may end the run)
//   checkpoint(next)      the run's state to config.checkpoint
//   rollback()            back to the last good state after a rollback condition fired
//   finish()              the final checkpoint, the result, the summary
// The CLI (`belay train`), belay.train in Python, validate --train and sweep all run a
// Trainer; run_training(config, out) is Trainer(config, out).run().
#pragma once
#include <chrono>
#include <deque>
#include <iosfwd>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "amp/census_log.h"
#include "amp/grad_scaler.h"
#include "amp/safe_step.h"
#include "amp/scale_monitor.h"
#include "amp/step_log.h"
#include "apps/run/dataset.h"
#include "apps/run/progress.h"
#include "apps/run/rollback.h"
#include "apps/run/tensorboard_events.h"
#include "apps/run/train.h"
#include "autograd/anomaly.h"
#include "autograd/modules.h"
#include "optim/optimizer.h"

namespace belay {

class SignalScope;
class TokenDataset;

class Trainer {
 public:
  // Build: throws UsageError on a bad option (validate) or input, before any file is written.
  Trainer(const TrainConfig& config, std::ostream& out);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // Every phase below in order: what `belay train` does. Call it once.
  TrainResult run();

  void resume();
  void open_outputs();
  void announce();
  void start();
  void step(int64_t s);
  void log(const StepRow& row);
  void checkpoint(int64_t next_step);
  bool rollback();  // whether the run goes on (under the rollback policy) or stops (exit 1)
  TrainResult finish();

  const TrainConfig& config() const { return c_; }

 private:
  // build
  void build_data();
  void build_model();
  void build_step();
  void shard_optimizer();
  double optimizer_state_bytes() const;
  static double peak_rss_bytes();
  // the steps
  void loop();
  bool stop_signalled(int64_t s);
  void drain(size_t keep);  // logs the rows of all but the newest `keep` steps in flight
  void check_batch(const Batch& batch);
  Var loss_of(const Tensor& x, const Tensor& y);
  std::vector<std::string> extra_columns(const StepRow& row) const;
  // What the census counts against: the compute dtype when it is BF16, else FP16 (the
  // format whose range loss scaling is for).
  DType census_format() const { return c_.dtype == DType::BF16 ? DType::BF16 : DType::F16; }
  double evaluate_heldout();
  void check_optimizer();
  void on_after_backward(int64_t s, Optimizer& o);
  // log
  void watch_scale(const StepRow& row);
  void watch_skips(const StepRow& row);
  // rollback
  std::string apply_rollback_policy(bool go_on);
  void record_rollback_case(const Snapshot& snap, const std::string& action);
  // finish
  void print_summary(const CommCounters& run_counters);
  void print_dist_summary(const CommCounters& run_counters);
  void print_memory_summary();
  std::string policy_label() const;

  TrainConfig c_;
  std::ostream& out_;
  // build
  std::unique_ptr<Dataset> data_;
  TokenDataset* tokens_ = nullptr;  // data_ when it is token data (--model gpt)
  Device device_;
  double param_bytes_ = 0.0;
  std::unique_ptr<Module> model_;
  std::unique_ptr<Optimizer> opt_;
  GradScalerOptions so_;
  std::unique_ptr<GradScaler> scaler_;
  std::unique_ptr<SafeStep> safe_step_;
  Communicator* comm_ = nullptr;
  int rank_ = 0, world_ = 1;
  CommCounters counters_before_;
  std::vector<double> rank_state_bytes_, rank_peak_rss_;  // per rank, at the end (world > 1)
  std::map<std::string, std::string> settings_;
  // resume
  int64_t first_step_ = 0;
  std::string experiment_;  // what --new-experiment changed and where, carried into every checkpoint
  std::map<std::string, std::string> records_;  // the run's other history (rollbacks), carried too
  // outputs
  bool policy_column_ = false;
  std::string rollback_report_;
  std::optional<StepLogWriter> log_;
  std::optional<CensusLogWriter> census_log_;
  std::optional<CensusSummary> census_summary_;
  std::optional<TensorBoardWriter> tensorboard_;
  void write_tensorboard(const StepRow& row, bool census_recorded);
  float census_scale_ = 1.0f;  // the scale the next logged step ran with (the previous row's)
  // the run
  std::optional<Progress> progress_;
  std::unique_ptr<SignalScope> signals_;
  std::optional<SkipMonitor> monitor_;
  std::optional<ScaleMonitor> scale_monitor_;
  double cosine_sum_ = 0.0;
  TrainResult result_;
  std::optional<DetectAnomaly> anomaly_;
  int64_t accum_ = 1, micro_ = 0;
  std::optional<std::pair<int64_t, double>> heldout_;  // the last evaluation: (step, loss)
  bool classify_ = false;
  // Rows are read one step late: step s is enqueued, then the row of step s - 1 is taken,
  // so a GPU always has the next step queued while the host logs the last one, and never
  // waits for the host. The CPU runs the same schedule, so both stop at the same step.
  std::deque<PendingStep> in_flight_;
  bool skip_stop_ = false;
  // Rollback: the last good state, and the reason once a condition fired (the rows still in
  // flight are logged, then the state is restored before the next step).
  std::optional<RollbackTrigger> trigger_;
  std::optional<Snapshot> snapshot_;
  std::optional<std::string> rollback_reason_;
  int64_t rollback_fired_at_ = -1;
  std::unique_ptr<nlohmann::json> cases_;  // the rollback report's cases (a pointer: no JSON in this header)
  std::chrono::steady_clock::time_point t0_;
  int64_t last_ = 0;  // the step the run stops before (--steps, or --stop-at)
};

}  // namespace belay

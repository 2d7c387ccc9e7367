#include "apps/train.h"

#include <chrono>
#include <cmath>
#include <csignal>
#include <deque>
#include <iostream>
#include <memory>
#include <new>
#include <stdexcept>
#include <optional>
#include <sstream>

#include <nlohmann/json.hpp>

#include "amp/autocast.h"
#include "amp/checkpoint.h"
#include "amp/communicator.h"
#include "amp/safe_step.h"
#include "apps/accum_check.h"
#include "apps/rollback.h"
#include "apps/dataset.h"
#include "apps/progress.h"
#include "autograd/modules.h"
#include "engine/backend.h"
#include "engine/atomic_file.h"
#include "engine/error.h"
#include "optim/adamw.h"
#include "optim/sgd.h"

namespace belay {

namespace {
volatile std::sig_atomic_t g_stop_signal = 0;
extern "C" void on_stop_signal(int sig) { g_stop_signal = sig; }
}  // namespace

void request_stop(int signal_number) { g_stop_signal = signal_number; }

int TrainConfig::world_size() const { return comm ? comm->world_size() : 1; }

namespace {
std::string short_count(double n) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", n);
  return buf;
}

// The model's parameter count by the config, in double (it is checked before it is built).
double parameter_count_of(const TrainConfig& c) {
  const double in = static_cast<double>(c.in_features), out = static_cast<double>(c.out_features);
  const double h = static_cast<double>(c.hidden);
  if (c.model != "mlp") return in * out + out;
  return in * h + h + (c.layers - 2) * (h * h + h) + h * out + out;
}

}  // namespace

void validate(const TrainConfig& c) {
  auto positive = [](const char* name, int64_t v) {
    if (v <= 0) throw UsageError(std::string("--") + name + " must be positive, got " + std::to_string(v));
  };
  positive("in", c.in_features);
  positive("out", c.out_features);
  positive("hidden", c.hidden);
  positive("batch", c.batch);
  positive("steps", c.steps);
  // The device keeps the applied-step count in FP32, exact up to 2^24.
  if (c.steps > (int64_t{1} << 24)) throw UsageError("--steps must be at most 16777216, got " + std::to_string(c.steps));
  if (c.micro_batch < 0) throw UsageError("--micro-batch must be positive, got " + std::to_string(c.micro_batch));
  if (c.batch % c.world_size() != 0)
    throw UsageError("--batch " + std::to_string(c.batch) + " is not a multiple of the world size " +
                     std::to_string(c.world_size()) + " (--batch is the effective batch, split across ranks)");
  if (c.micro_batch > 0 && c.local_batch() % c.micro_batch != 0)
    throw UsageError("--batch " + std::to_string(c.batch) + " is not a multiple of --micro-batch " +
                     std::to_string(c.micro_batch) +
                     (c.world_size() > 1 ? " x the world size " + std::to_string(c.world_size()) : std::string()));
  if (c.world_size() > 1) {
    // Anomaly mode stops one rank at its first non-finite value, leaving its peers in a collective.
    if (c.detect_anomaly) throw UsageError("--detect-anomaly is single-process only for now; drop it with --dist");
    // Its snapshots and report are per process, not yet agreed across ranks.
    if (c.rollback.enabled()) throw UsageError("--rollback-on is single-process only for now; drop it with --dist");
  }
  if (c.comm && c.comm->name() == "mpi" && c.device != "cpu")
    throw UsageError("--dist mpi trains on --device cpu; use --dist nccl for GPUs");
  if (c.comm && c.comm->name() == "nccl" && c.device == "cpu")
    throw UsageError("--dist nccl trains on GPU tensors: add --device cuda (or use --dist mpi on the CPU)");
  if (c.inject_rank >= c.world_size())
    throw UsageError("--inject-rank " + std::to_string(c.inject_rank) + " is not a rank of this run (world size " +
                     std::to_string(c.world_size()) + ")");
  if (c.model != "linear" && c.model != "mlp") throw UsageError("unknown model '" + c.model + "': use linear or mlp");
  if (c.model == "mlp" && c.layers < 2) throw UsageError("--layers must be at least 2, got " + std::to_string(c.layers));
  if (c.optimizer != "adamw" && c.optimizer != "sgd")
    throw UsageError("unknown optimizer '" + c.optimizer + "': use adamw or sgd");
  if (!(c.lr > 0.0f) || !std::isfinite(c.lr)) throw UsageError("--lr must be a positive number");
  if (!(c.weight_decay >= 0.0f)) throw UsageError("--weight-decay must be >= 0");
  if (!(c.momentum >= 0.0f && c.momentum < 1.0f)) throw UsageError("--momentum must be in [0, 1)");
  if (c.warmup < 0) throw UsageError("--warmup must be >= 0");
  // A warmup the schedule ignores, or one that never ends, would run without a word.
  if (c.warmup > 0 && c.schedule == "constant")
    throw UsageError("--warmup " + std::to_string(c.warmup) + " needs --schedule cosine (the constant schedule has no warmup)");
  if (c.schedule == "cosine" && c.warmup >= c.steps)
    throw UsageError("--warmup " + std::to_string(c.warmup) + " is as long as the run (--steps " +
                     std::to_string(c.steps) + "): the learning rate would never leave warmup; give a warmup below --steps");
  if (std::isnan(c.max_norm) || c.max_norm <= 0.0f) throw UsageError("--clip must be > 0");
  if (c.clip_mode == ClipMode::Value && std::isinf(c.max_norm))
    throw UsageError("--clip-mode value needs --clip VALUE (the bound each gradient element is clamped to)");
  if (c.checkpoint_every < 0) throw UsageError("--checkpoint-every must be >= 0");
  if (c.stop_at < -1) throw UsageError("--stop-at must be >= 0");
  if (c.checkpoint_every > 0 && c.checkpoint.empty()) throw UsageError("--checkpoint-every needs --checkpoint FILE");
  for (int64_t s : c.inject_inf)
    if (s < 0) throw UsageError("--inject-inf step must be >= 0, got " + std::to_string(s));
  for (auto [s, f] : c.spikes)
    if (s < 0 || !std::isfinite(f)) throw UsageError("--spike needs STEP >= 0 and a finite FACTOR");
  validate_rollback(c.rollback);
  if (c.rollback.policy == "fp32" && c.dtype == DType::F32)
    throw UsageError("--rollback-policy fp32 on an fp32 run changes nothing: use lower-lr F, or the default stop");
  // A size that cannot even be counted in bytes is bad input, not an out-of-memory.
  if (parameter_count_of(c) * 16.0 > 9.0e18)
    throw UsageError("the model would have " + short_count(parameter_count_of(c)) + " parameters: too many to address");
  if (static_cast<double>(c.batch) * static_cast<double>(c.in_features + c.out_features) * 4.0 > 9.0e18)
    throw UsageError("a batch of " + std::to_string(c.batch) + " rows is too large to address");
  parse_schedule(c.schedule, c.lr, c.warmup, c.steps);
  const Device device = parse_device(c.device);
  require_device(device);
}

std::unique_ptr<Module> make_model(const TrainConfig& c, Rng& rng, Device device) {
  if (c.model == "mlp")
    return std::make_unique<Mlp>(c.in_features, c.hidden, c.out_features, rng, c.layers, Activation::Gelu, device);
  return std::make_unique<Linear>(c.in_features, c.out_features, rng, true, device);
}

namespace {

std::unique_ptr<Optimizer> make_optimizer(const TrainConfig& c, const Module& model) {
  if (c.optimizer == "sgd") {
    SgdOptions o;
    o.lr = c.lr;
    o.momentum = c.momentum;
    o.weight_decay = c.weight_decay;
    return std::make_unique<Sgd>(model.parameters(), o);
  }
  AdamWOptions o;
  o.lr = c.lr;
  o.weight_decay = c.weight_decay;
  return std::make_unique<AdamW>(model.parameters(), o);
}

// Everything that decides the numbers a run produces: a resume must match all of it.
std::map<std::string, std::string> run_settings(const TrainConfig& c, const Dataset& data, bool scaler_on) {
  std::map<std::string, std::string> s{
      {"model", c.model},
      {"in", std::to_string(c.in_features)},
      {"out", std::to_string(c.out_features)},
      {"dtype", dtype_name(c.dtype)},
      {"grad_dtype", c.low_precision_grads ? "compute" : "fp32"},
      {"optimizer", c.optimizer},
      {"lr", exact_float(c.lr)},
      {"weight_decay", exact_float(c.weight_decay)},
      {"schedule", c.schedule},
      {"batch", std::to_string(c.batch)},
      {"micro_batch", std::to_string(c.micro_batch_size())},
      {"seed", std::to_string(c.seed)},
      {"clip", exact_float(c.max_norm)},
      {"fused", c.fused ? "1" : "0"},
      {"scaler", scaler_on ? "1" : "0"},
      {"data", data.describe()},
      {"fp32_ops", c.fp32_ops ? fp32_ops_names(c.fp32_ops) : "none"},
  };
  if (c.clip_mode == ClipMode::Value) s["clip_mode"] = "value";  // absent: norm (older checkpoints)
  if (c.model == "mlp") {
    s["hidden"] = std::to_string(c.hidden);
    s["layers"] = std::to_string(c.layers);
  }
  if (c.optimizer == "sgd") s["momentum"] = exact_float(c.momentum);
  if (c.schedule == "cosine") {
    s["warmup"] = std::to_string(c.warmup);
    s["schedule_total_steps"] = std::to_string(c.steps);
  }
  if (scaler_on) {
    s["scaler.growth_factor"] = exact_float(c.scaler.growth_factor);
    s["scaler.backoff_factor"] = exact_float(c.scaler.backoff_factor);
    s["scaler.growth_interval"] = std::to_string(c.scaler.growth_interval);
    s["scaler.hysteresis"] = std::to_string(c.scaler.hysteresis);
    s["scaler.min_scale"] = exact_float(c.scaler.min_scale);
    s["scaler.max_scale"] = exact_float(c.scaler.max_scale);
  }
  return s;
}

// Runs f under an AllocationPurpose (made by the caller). The caching allocator reports a
// failure with its exact size; a host container's std::bad_alloc (or length_error) carries
// none, so it is reported with `bytes`, what this part needs by the config.
template <class F>
auto out_of_memory_as_error(double bytes, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const std::bad_alloc&) {
    throw Error(out_of_memory_message(static_cast<size_t>(bytes)));
  } catch (const std::length_error&) {
    throw Error(out_of_memory_message(static_cast<size_t>(bytes)));
  }
}

template <class F>
auto allocating(const std::string& what, double bytes, F&& f) -> decltype(f()) {
  AllocationPurpose purpose(what);
  return out_of_memory_as_error(bytes, f);
}

std::string short_float(float x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", static_cast<double>(x));
  return buf;
}

// Installs the SIGINT/SIGTERM handlers for the life of a run, and restores the old ones.
class SignalScope {
 public:
  explicit SignalScope(bool active) : active_(active) {
    if (!active_) return;
    g_stop_signal = 0;
    old_int_ = std::signal(SIGINT, on_stop_signal);
    old_term_ = std::signal(SIGTERM, on_stop_signal);
  }
  ~SignalScope() {
    if (!active_) return;
    std::signal(SIGINT, old_int_);
    std::signal(SIGTERM, old_term_);
  }

 private:
  bool active_;
  void (*old_int_)(int) = SIG_DFL;
  void (*old_term_)(int) = SIG_DFL;
};

}  // namespace

TrainResult run_training(const TrainConfig& config, std::ostream& out) {
  TrainConfig c = config;
  std::unique_ptr<Dataset> data;
  if (c.make_dataset) {
    data = c.make_dataset();
    c.in_features = data->in_features();
    c.out_features = data->out_features();
  } else if (!c.data.empty()) {
    // Anomaly mode keeps non-finite rows, so that the run meets them and says where.
    data = load_dataset(c.data, c.detect_anomaly);
    c.in_features = data->in_features();
    c.out_features = data->out_features();
    if (data->classification() && c.model != "mlp")
      throw UsageError("class labels in '" + c.data + "' need --model mlp (cross-entropy on logits)");
  }
  validate(c);
  const Device device = parse_device(c.device);
  const double param_bytes = 4.0 * parameter_count_of(c);
  Rng init_rng(c.seed);
  std::unique_ptr<Module> model =
      allocating("the model's parameters (FP32 masters)", param_bytes, [&] { return make_model(c, init_rng, device); });
  if (!c.init.empty()) load_initial_weights(c.init, *model);
  // A linear kept in FP32 (--fp32-ops linear) reads the FP32 masters, not a rounded copy.
  const DType working = (c.fp32_ops & static_cast<uint32_t>(OpClass::Linear)) ? DType::F32 : c.dtype;
  allocating("the model's " + std::string(dtype_name(working)) + " working copy", param_bytes / 2.0, [&] {
    model->set_working_dtype(working);
    model->set_grad_dtype(c.low_precision_grads ? c.dtype : DType::F32);
  });
  if (!data)
    data = allocating("the synthetic data's teacher weights", 4.0 * static_cast<double>(c.in_features + 1) *
                                                                   static_cast<double>(c.out_features),
                      [&] { return make_synthetic_regression(c.in_features, c.out_features, c.seed); });

  std::unique_ptr<Optimizer> opt = allocating("the optimizer state", 2.0 * param_bytes, [&] { return make_optimizer(c, *model); });
  GradScalerOptions so = c.scaler;
  if (!c.scaler_explicit) so.enabled = default_scaler_enabled(c.dtype);
  GradScaler scaler(device, so);
  SafeStepOptions sso;
  sso.max_norm = c.max_norm;
  sso.fused = c.fused;
  sso.clip_mode = c.clip_mode;
  sso.accum_steps = static_cast<int>(c.accum_steps());
  SafeStep step(*opt, scaler, parse_schedule(c.schedule, c.lr, c.warmup, c.steps), sso, c.comm);
  Communicator& comm = step.communicator();
  const int rank = comm.rank(), world = comm.world_size();
  // The communicator may outlive this run (belay sweep trains every point on one): count
  // this run's calls alone.
  const CommCounters counters_before = comm.counters();
  if (rank != 0) c.quiet = true;  // rank 0 speaks for the run (errors are still printed by any rank)
  // After the gradient all-reduce: an inf planted on one rank reaches only the belts' agreement.
  step.after_backward = [&](int64_t s, Optimizer& o) {
    if (c.inject_inf.count(s) && (c.inject_rank < 0 || c.inject_rank == rank) && !o.grads().empty())
      o.mutable_grads()[0]->set_element(0, INFINITY);
    // Anomaly mode: the gradient buffers as the guard will read them (a fault planted above
    // is found here: the ops' own backward checks ran before it).
    if (anomaly_mode_enabled())
      for (const Var& p : o.params())
        if (p.grad().defined()) check_gradient("gradient buffer", "", "gradient of " + p.name(), p.grad());
  };
  auto settings = run_settings(c, *data, so.enabled);

  // Resume: everything is validated before anything is written. Another precision policy
  // (dtype, gradient dtype, loss scaling, fp32_ops: is_policy_setting) is a new experiment,
  // allowed only when asked for, and then recorded.
  int64_t first_step = 0;
  std::string experiment;  // what --new-experiment changed and where, carried into every checkpoint
  std::map<std::string, std::string> records;  // the run's other history (rollbacks), carried too
  if (!c.resume.empty()) {
    const RunState st = load_checkpoint(c.resume, *model, *opt, settings, c.new_experiment);
    if (st.scaler_state_loaded) scaler.load_state(st.scaler);
    experiment = st.experiment;
    data->set_position(st.data_position);
    records = st.records;
    const std::vector<std::string>& policy_changes = st.policy_changes;
    first_step = st.next_step;
    step.set_next_step(first_step);
    if (first_step > c.steps)
      throw UsageError("checkpoint '" + c.resume + "' is at step " + std::to_string(first_step) + ", past --steps " +
                       std::to_string(c.steps));
    if (!policy_changes.empty()) {
      std::string what = "new experiment at step " + std::to_string(first_step) + " from '" + c.resume + "':";
      for (const std::string& change : policy_changes) what += " " + change + ",";
      what.pop_back();
      experiment += (experiment.empty() ? "" : "; ") + what;
    }
  }
  // The policy label of the CSV's `policy` column (there only when a rollback may change it).
  auto policy_label = [&] { return std::string(dtype_name(c.dtype)) + "@lr=" + short_float(c.lr); };
  const bool policy_column = c.rollback.continues();
  std::string rollback_report = c.rollback.report;
  if (rollback_report.empty() && c.rollback.enabled()) {
    const std::string stem = c.csv.size() > 4 && c.csv.substr(c.csv.size() - 4) == ".csv" ? c.csv.substr(0, c.csv.size() - 4) : c.csv;
    rollback_report = c.csv.empty() ? "rollback.json" : stem + ".rollback.json";
  }
  if (c.rollback.enabled()) check_writable(rollback_report);
  // Open the log before any work: an unwritable path fails here, leaving nothing behind.
  // A resumed run keeps the rows up to the checkpoint, so the file reads as one run.
  std::optional<StepLogWriter> log;
  if (!c.csv.empty() && rank == 0) log.emplace(c.csv, c.resume.empty() ? -1 : first_step - 1, policy_column);
  // Rank 0 writes the checkpoint: a path it cannot write fails now, not after the run.
  if (!c.checkpoint.empty() && rank == 0) check_writable(c.checkpoint);

  auto checkpoint_now = [&](int64_t next_step) {
    RunState st;
    st.next_step = next_step;
    st.optimizer_steps = opt->step_count();
    st.scaler = scaler.state();
    st.data_position = data->position();
    st.settings = settings;
    st.records = records;
    st.experiment = experiment;
    // Rank 0 writes for all, once every rank's weights and scaler state are seen to agree.
    save_checkpoint(c.checkpoint, *model, *opt, st, comm);
  };

  if (!c.quiet) {
    out << "belay train: " << c.model << " " << model->parameter_count() << " parameters, " << dtype_name(c.dtype)
        << " on " << device.str() << ", " << c.optimizer << " lr " << c.lr << ", batch " << c.batch;
    if (c.accum_steps() > 1 || world > 1) {
      out << " (" << c.accum_steps() << " x " << c.micro_batch_size();
      if (world > 1) out << " x " << world << " ranks";
      out << ")";
    }
    out << ", loss scaling " << (scaler.enabled() ? "on" : "off") << ", clip "
        << (c.clip_mode == ClipMode::Value ? "value " : "") << c.max_norm << ", data "
        << data->describe();
    if (c.fp32_ops) out << ", fp32 ops " << fp32_ops_names(c.fp32_ops);
    if (c.detect_anomaly) out << ", anomaly detection on";
    if (first_step > 0) out << ", resumed at step " << first_step;
    out << "\n";
    if (!experiment.empty()) out << "experiment: " << experiment << "\n";
  }
  Progress progress(out, c.steps, !c.show_steps && !c.quiet && is_terminal(out));
  SignalScope signals(c.handle_signals);
  SkipMonitor monitor(c.skip);
  ScaleMonitor scale_monitor(scaler.scale(), so.growth_interval, so.min_scale);
  double cosine_sum = 0.0;

  TrainResult result;
  std::optional<DetectAnomaly> anomaly;
  if (c.detect_anomaly) {
    anomaly.emplace(scaler.enabled());  // with loss scaling, gradients are scaled
    anomaly->on_scaler_event = [&](const AnomalyReport& r) {
      result.scaler_events.push_back(r);
      if (!c.quiet) {
        progress.finish();
        out << r.describe();
      }
    };
  }
  const int64_t accum = c.accum_steps(), micro = c.micro_batch_size();
  const bool classify = data->classification();

  // Rows are read one step late: step s is enqueued, then the row of step s - 1 is taken,
  // so a GPU always has the next step queued while the host logs the last one, and never
  // waits for the host. The CPU runs the same schedule, so both stop at the same step.
  std::deque<PendingStep> in_flight;
  bool skip_stop = false;
  // Rollback: the last good state, and the reason once a condition fired (the rows still in
  // flight are logged, then the state is restored before the next step).
  RollbackTrigger trigger(c.rollback);
  std::optional<Snapshot> snapshot;
  std::optional<std::string> rollback_reason;
  int64_t rollback_fired_at = -1;
  nlohmann::json cases = nlohmann::json::array();
  // One finished step: CSV row, progress, the skip monitor (which may end the run: exit 1).
  auto consume = [&](PendingStep& pending) {
    const StepRow row = pending.row();
    result.rows.push_back(row);
    if (log) log->write(row, policy_column ? policy_label() : std::string());
    if (c.rollback.enabled() && !rollback_reason) {
      rollback_reason = trigger.observe(row);
      if (rollback_reason) rollback_fired_at = row.step;
    }
    if (result.rows.size() == 1) result.first_loss = row.loss;
    if (row.skipped)
      ++result.skipped;
    else
      result.final_loss = row.loss;
    if (c.show_steps && !c.quiet) out << describe_row(row) << "\n";
    if (!c.quiet && !c.show_steps) progress.update(row, result.skipped);
    if (!row.skipped && row.grad_l2_post_clip < row.grad_l2_pre_clip) {  // the clip changed this gradient
      ++result.clipped;
      result.min_clip_cosine = std::min(result.min_clip_cosine, row.clip_cosine);
      cosine_sum += row.clip_cosine;
    }
    if (scaler.enabled()) {
      const ScaleMonitor::Verdict sv = scale_monitor.observe(row);
      if (sv.repeated_backoff && !c.quiet) {
        progress.finish();
        out << "warning: the loss scale backed off " << sv.backoffs_in_interval << " times within one growth interval ("
            << so.growth_interval << " steps, from step " << sv.interval_start << " to " << row.step
            << "): overflows keep coming, and a falling scale does not prove they are gone\n";
      }
      if (sv.hit_min && !c.quiet) {
        progress.finish();
        out << "warning: the loss scale reached --min-scale " << so.min_scale << " at step " << row.step
            << " (an overflow): it can fall no further, so overflows from here on are not cured by scaling; look for "
               "the op that overflows (or try bf16)\n";
      }
    }
    const SkipMonitor::Verdict v = monitor.observe(row.skipped);
    if (v.alert && !c.quiet) {
      progress.finish();
      out << "alert: skip rate " << 100.0 * v.rate << "% over the last "
          << std::min<int64_t>(static_cast<int64_t>(result.rows.size()), c.skip.window) << " steps is above "
          << 100.0 * c.skip.alert_rate << "%\n";
    }
    if (v.stop && !skip_stop) {
      skip_stop = true;
      progress.finish();
      std::ostringstream why;
      why << "skip rate stayed above " << 100.0 * c.skip.max_rate << "% for " << c.skip.patience
          << " consecutive steps (through step " << row.step << "); stopping";
      result.stop_reason = why.str();
      out << "belay: error: " << result.stop_reason << "\n";
      result.exit_code = 1;
    }
  };
  // Takes the rows of all but the newest `keep` steps in flight.
  auto drain = [&](size_t keep) {
    while (in_flight.size() > keep) {
      consume(in_flight.front());
      in_flight.pop_front();
    }
  };

  // Rollback: what fired is written to the case file, the last good state is restored, and
  // the run stops (exit 1, the restored state checkpointed) or goes on under the new policy.
  // Returns whether it goes on. Every row is drained before.
  auto roll_back = [&]() -> bool {
    const Snapshot& snap = *snapshot;
    ++result.rollbacks;
    const bool go_on = c.rollback.continues() && result.rollbacks <= c.rollback.max_rollbacks;
    nlohmann::json rows = nlohmann::json::array();
    for (size_t i = snap.row_index; i < result.rows.size(); ++i) rows.push_back(format_step_row(result.rows[i]));
    restore_snapshot(snap, *model, *opt, scaler, *data);
    step.set_next_step(snap.next_step);
    trigger.reset();
    scale_monitor.restart(snap.scaler.scale);
    std::string action = "stop";
    if (go_on && c.rollback.policy == "fp32") {
      action = std::string("continue in fp32 (was ") + dtype_name(c.dtype) + ")";
      c.dtype = DType::F32;
      c.low_precision_grads = false;
      model->set_working_dtype(DType::F32);
      model->set_grad_dtype(DType::F32);
    } else if (go_on) {
      const float old_lr = c.lr;
      c.lr *= c.rollback.lr_factor;
      opt->set_schedule(parse_schedule(c.schedule, c.lr, c.warmup, c.steps));
      action = "continue with lr " + short_float(c.lr) + " (was " + short_float(old_lr) + ")";
    } else if (c.rollback.continues()) {
      action = "stop (" + std::to_string(c.rollback.max_rollbacks) + " rollbacks already)";
    }
    settings = run_settings(c, *data, so.enabled);  // a checkpoint records the policy now in force
    records[std::to_string(rollback_fired_at) + ".rollback"] =
        *rollback_reason + "; restored step " + std::to_string(snap.next_step) + "; " + action;
    cases.push_back({{"step", rollback_fired_at},
                     {"condition", trigger.condition()},
                     {"reason", *rollback_reason},
                     {"restored_step", snap.next_step},
                     {"restored_state",
                      {{"optimizer_steps", snap.optimizer_steps},
                       {"scaler_scale", snap.scaler.scale},
                       {"scaler_growth_tracker", snap.scaler.growth_tracker},
                       {"scaler_hysteresis_left", snap.scaler.hysteresis_left},
                       {"data_position", snap.data_position}}},
                     {"action", action},
                     {"columns", kStepLogHeader},
                     {"rows", rows}});
    write_file_atomically(rollback_report, nlohmann::json{{"format", "belay.rollback.v1"}, {"cases", cases}}.dump(2) + "\n");
    progress.finish();
    const std::string what = "rollback: " + *rollback_reason + "; restored the state of step " +
                             std::to_string(snap.next_step) + " (weights, optimizer, scaler, data, LR position); case in " +
                             rollback_report;
    if (go_on) {
      if (!c.quiet) out << what << "; " << action << "\n";
    } else {
      result.stop_reason = what + "; stopping" + (c.rollback.continues() ? " (--max-rollbacks)" : "");
      out << "belay: error: " << result.stop_reason << "\n";
      result.exit_code = 1;
    }
    rollback_reason.reset();
    return go_on;
  };

  const auto t0 = std::chrono::steady_clock::now();
  const int64_t last = c.stop_at >= 0 ? std::min(c.steps, c.stop_at) : c.steps;
  // Anomaly mode: the batch as the model will read it (with the data row of a file's row).
  auto check_batch = [&](const Batch& batch) {
    const int64_t first_row = data->last_batch_first_row();
    for (const auto& [name, t] : {std::pair<const char*, const Tensor*>{"x", &batch.x}, {"y", &batch.y}}) {
      try {
        check_finite("input", "batch", "", name, *t);
      } catch (const AnomalyError& e) {
        AnomalyReport r = e.report();
        if (first_row >= 0) r.tensor += " (data row " + std::to_string(first_row + r.first_row) + ")";
        throw AnomalyError(r);
      }
    }
  };
  // Anomaly mode: what the optimizer wrote, masters and the working copies the next forward reads.
  auto check_optimizer = [&] {
    for (const Var& p : model->parameters()) {
      check_finite("optimizer", c.optimizer, "", "master " + p.name(), p.master());
      if (p.value().dtype() != DType::F32) check_finite("optimizer", c.optimizer, "", "working copy " + p.name(), p.value());
    }
  };
  if (c.rollback.enabled()) snapshot = take_snapshot(*model, *opt, scaler, *data, first_step);  // the start is good
  try {
    for (int64_t s = first_step;; ++s) {
      const bool done = s >= last;
      if (!done) {
        const auto ts = std::chrono::steady_clock::now();
        const double batch_bytes =
            4.0 * static_cast<double>(c.batch) * static_cast<double>(c.in_features + c.out_features);
        std::optional<AllocationPurpose> purpose(std::in_place, "the batch of step", s);
        Batch batch = out_of_memory_as_error(batch_bytes, [&] { return data->next(c.batch, device); });
        if (auto it = c.spikes.find(s); it != c.spikes.end() && !classify)
          backend_for(device).scale(batch.y, it->second, batch.y);
        if (world > 1) {  // every rank reads the effective batch and keeps its own rows
          const int64_t local = c.local_batch();
          batch.x = batch.x.slice_rows(rank * local, (rank + 1) * local);
          batch.y = batch.y.slice_rows(rank * local, (rank + 1) * local);
        }
        if (anomaly) {
          anomaly->set_step(s);
          check_batch(batch);
        }
        purpose.emplace("the activations and gradients of step", s);
        in_flight.push_back(step.enqueue([&](int k) {
          const Tensor x = accum == 1 ? batch.x : batch.x.slice_rows(k * micro, (k + 1) * micro);
          const Tensor y = accum == 1 ? batch.y : batch.y.slice_rows(k * micro, (k + 1) * micro);
          Autocast autocast(c.dtype, c.dtype != DType::F32, c.fp32_ops);
          Var pred = (*model)(Var(x));
          return classify ? cross_entropy(pred, y) : mse_loss(pred, y);
        }));
        if (anomaly) check_optimizer();
        drain(c.sync_each_step ? 0 : 1);
        // The period of the loop: in steady state, one step of the device's work.
        result.step_ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - ts).count());
      }
      const bool checkpoint_due =
          !done && !c.checkpoint.empty() && c.checkpoint_every > 0 && (s + 1) % c.checkpoint_every == 0;
      const bool snapshot_due = !done && snapshot && s + 1 - snapshot->next_step >= c.rollback.every;
      // Every row up to here is in the CSV (and judged) before a checkpoint or a snapshot is
      // taken, and before a rollback restores: the price is one wait for the device there.
      // A snapshot stays due while the state is not healthy, so such a stretch waits each step.
      if (done || checkpoint_due || snapshot_due || rollback_reason) drain(0);
      if (rollback_reason) {
        if (!roll_back()) break;
        s = snapshot->next_step - 1;  // the loop's ++s runs the step after the snapshot next
        continue;
      }
      if (done) break;
      if (checkpoint_due) checkpoint_now(s + 1);
      if (snapshot_due && trigger.healthy()) {
        snapshot = take_snapshot(*model, *opt, scaler, *data, s + 1);
        snapshot->row_index = result.rows.size();
      }
      if (skip_stop) break;
      // Taken together: a signal seen by one rank stops every rank after the same step.
      int sig = world > 1 ? comm.max_over_ranks(g_stop_signal) : static_cast<int>(g_stop_signal);
      if (sig == 0 && c.stop_requested) sig = c.stop_requested();
      if (sig != 0) {
        drain(0);
        progress.finish();
        if (!c.quiet)
          out << "stopping after step " << s << " on " << (sig == SIGINT ? "SIGINT" : "SIGTERM")
              << (c.checkpoint.empty() ? "" : "; checkpoint " + c.checkpoint) << "\n";
        result.exit_code = 128 + sig;
        break;
      }
    }
  } catch (const AnomalyError& e) {
    // The first non-finite value: the rows before it go to the log, the report to the user,
    // and no checkpoint is written (the state may hold the non-finite value).
    drain(0);
    progress.finish();
    if (log) log->close();
    if (!c.quiet) out << e.report().describe();
    throw;
  }
  drain(0);
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const CommCounters run_counters = comm.counters() - counters_before;
  result.gradient_syncs = run_counters.gradient_syncs;
  result.gradient_bytes = run_counters.gradient_bytes;
  result.gradient_buckets = run_counters.gradient_buckets;
  result.gradient_sync_seconds = run_counters.gradient_sync_seconds;
  result.gradient_wait_seconds = run_counters.gradient_wait_seconds;
  result.scale = scale_monitor.summary();
  if (result.clipped > 0) result.mean_clip_cosine = cosine_sum / static_cast<double>(result.clipped);
  progress.finish();
  // The final checkpoint (also after a signal or a skip-rate stop): the run can continue.
  if (!c.checkpoint.empty()) checkpoint_now(step.next_step());
  if (log) log->close();
  g_stop_signal = 0;
  for (const Var& p : model->parameters())
    for (float v : p.master().to_vector()) result.final_weights.push_back(v);
  result.final_scaler = scaler.state();
  result.final_optimizer_steps = opt->step_count();
  result.final_next_step = step.next_step();
  result.final_data_position = data->position();
  if (!c.quiet) {
    out << "done: " << result.rows.size() << " steps (" << result.rows.size() - result.skipped << " applied, "
        << result.skipped << " skipped) in " << result.seconds << " s; loss " << result.first_loss << " -> "
        << result.final_loss << "; final scale " << scaler.scale();
    if (result.rollbacks > 0) out << "; " << result.rollbacks << (result.rollbacks == 1 ? " rollback" : " rollbacks");
    if (c.fp32_ops) out << "; fp32 ops " << fp32_ops_names(c.fp32_ops);
    if (c.detect_anomaly) out << "; " << result.scaler_events.size() << " scaler event(s), no anomaly";
    if (!c.csv.empty()) out << "; log " << c.csv;
    if (!c.checkpoint.empty()) out << "; checkpoint " << c.checkpoint;
    out << "\n";
    if (world > 1 || comm.name() != "local") {
      out << "dist " << comm.name() << ": " << world << " ranks; per rank " << result.gradient_syncs
          << " gradient all-reduces, " << result.gradient_bytes << " bytes, " << run_counters.agreements
          << " small collectives of the belts\n";
      out << "dist " << comm.name() << ": " << result.gradient_buckets << " buckets "
          << (comm.bucket_bytes() == 0 ? std::string("(one per step)")
                                       : "of <= " + short_count(static_cast<double>(comm.bucket_bytes()) / 1048576.0) + " MB")
          << " (" << run_counters.buckets_during_backward << " started during backward, "
          << run_counters.buckets_done_in_backward << " done before it ended); gradient sync "
          << short_count(result.gradient_sync_seconds) << " s, of which waiting " << short_count(result.gradient_wait_seconds)
          << " s (" << short_count(100.0 * result.gradient_sync_seconds / std::max(result.seconds, 1e-9))
          << "% of the run)\n";
    }
    if (scaler.enabled())
      out << "scale: min " << result.scale.min << ", max " << result.scale.max << ", " << result.scale.backoffs
          << " backoffs, " << result.scale.growths << " growths\n";
    if (result.clipped > 0) {
      out << "clipping (" << (c.clip_mode == ClipMode::Value ? "value" : "norm") << " at " << c.max_norm
          << "): " << result.clipped << " of " << result.rows.size() - result.skipped
          << " applied steps clipped; cosine(raw, applied gradient) ";
      if (c.clip_mode == ClipMode::Value)
        out << "min " << result.min_clip_cosine << ", mean " << result.mean_clip_cosine << " (clamping turns the gradient)\n";
      else
        out << "1 (scaled as a whole: the direction is kept)\n";
    }
  }
  return result;
}

}  // namespace belay

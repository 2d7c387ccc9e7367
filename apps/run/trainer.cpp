#include "apps/run/trainer.h"

#include <algorithm>
#include <chrono>
#include <fstream>
#include <cmath>
#include <csignal>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <memory>
#include <new>
#include <stdexcept>
#include <optional>
#include <sstream>

#include <nlohmann/json.hpp>

#include "amp/autocast.h"
#include "amp/checkpoint.h"
#include "amp/dist/communicator.h"
#include "apps/run/model_kinds.h"
#include "apps/run/token_dataset.h"
#include "engine/allocator.h"
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
  write_model_settings(c, s);  // the model's kind and shape (belay sample and validate rebuild it from them)
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

// " (A -> B bits per byte)": the first and last held-out loss in the unit that compares
// tokenizers; nothing when the text per token is unknown.
std::string bits_per_byte_text(const TrainResult& r) {
  if (r.heldout_bytes_per_token <= 0.0) return "";
  const double to_bpb = 1.0 / (std::log(2.0) * r.heldout_bytes_per_token);
  std::ostringstream s;
  s << std::setprecision(4) << std::fixed << " (" << r.heldout.front().second * to_bpb << " -> "
    << r.heldout.back().second * to_bpb << " bits per byte)";
  return s.str();
}

// A held-out loss as the CSV and the summary print it: 6 significant digits.
std::string heldout_text(double loss) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", loss);
  return buf;
}

std::string short_float(float x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", static_cast<double>(x));
  return buf;
}

}  // namespace

// ---- build

Trainer::Trainer(const TrainConfig& config, std::ostream& out) : c_(config), out_(out) {
  check_given_options(model_kind(c_.model), c_.given);  // a usage error before any file is read
  build_data();
  check_train_config(c_);
  device_ = parse_device(c_.device);
  param_bytes_ = 4.0 * parameter_count_of(c_);
  build_model();
  if (!data_)
    data_ = allocating("the synthetic data's teacher weights", 4.0 * static_cast<double>(c_.in_features + 1) *
                                                                    static_cast<double>(c_.out_features),
                       [&] { return make_synthetic_regression(c_.in_features, c_.out_features, c_.seed); });
  build_step();
  settings_ = run_settings(c_, *data_, so_.enabled);
}

Trainer::~Trainer() = default;

// A caller's dataset or the user's file: its shape is the model's. (Synthetic data is made
// after the model, with the shape the options give.)
void Trainer::build_data() {
  if (c_.make_dataset) {
    data_ = c_.make_dataset();
    c_.in_features = data_->in_features();
    c_.out_features = data_->out_features();
    tokens_ = dynamic_cast<TokenDataset*>(data_.get());
    if ((tokens_ != nullptr) != model_kind(c_.model).token_data)
      throw UsageError(tokens_ ? "token data needs --model " + model_kind_names(takes_tokens)
                               : "--model " + c_.model + " needs token data");
    if (tokens_) c_.context = tokens_->context();
  } else if (model_kind(c_.model).token_data) {
    if (c_.data.empty())
      throw UsageError("--model " + c_.model + " trains on a tokens file: give --data FILE (make one with python3 "
                       "apps/data/make_text_corpus.py -o text.safetensors)");
    auto tokens = load_token_dataset(c_.data, c_.context, c_.seed);
    tokens_ = tokens.get();
    data_ = std::move(tokens);
    c_.in_features = c_.context;
    c_.out_features = tokens_->vocab();
  } else if (!c_.data.empty()) {
    // Anomaly mode keeps non-finite rows, so that the run meets them and says where.
    data_ = load_dataset(c_.data, c_.detect_anomaly);
    c_.in_features = data_->in_features();
    c_.out_features = data_->out_features();
    if (data_->classification() && !model_kind(c_.model).class_labels)
      throw UsageError("class labels in '" + c_.data + "' need --model " + model_kind_names(takes_labels) +
                       " (cross-entropy on logits)");
  }
}

void Trainer::build_model() {
  Rng init_rng(c_.seed);
  model_ = allocating("the model's parameters (FP32 masters)", param_bytes_,
                      [&] { return make_model(c_, init_rng, device_); });
  if (!c_.init.empty()) load_initial_weights(c_.init, *model_, first_rows_tensors(c_));
  // A linear kept in FP32 (--fp32-ops linear) reads the FP32 masters, not a rounded copy.
  const DType working = (c_.fp32_ops & static_cast<uint32_t>(OpClass::Linear)) ? DType::F32 : c_.dtype;
  allocating("the model's " + std::string(dtype_name(working)) + " working copy", param_bytes_ / 2.0, [&] {
    model_->set_working_dtype(working);
    model_->set_grad_dtype(c_.low_precision_grads ? c_.dtype : DType::F32);
  });
}

// The optimizer, the scaler and the SafeStep that runs them in order over the communicator.
void Trainer::build_step() {
  opt_ = allocating("the optimizer state", 2.0 * param_bytes_, [&] { return make_optimizer(c_, *model_); });
  so_ = c_.scaler;
  if (!c_.scaler_explicit) so_.enabled = default_scaler_enabled(c_.dtype);
  scaler_ = std::make_unique<GradScaler>(device_, so_);
  SafeStepOptions sso;
  sso.max_norm = c_.max_norm;
  sso.fused = c_.fused;
  sso.clip_mode = c_.clip_mode;
  sso.accum_steps = static_cast<int>(c_.accum_steps());
  sso.census = !c_.census.empty();
  sso.census_format = census_format();
  sso.census_casts = c_.census_casts;
  if (c_.shard_optimizer) shard_optimizer();
  safe_step_ = std::make_unique<SafeStep>(*opt_, *scaler_, parse_schedule(c_.schedule, c_.lr, c_.warmup, c_.steps),
                                          sso, c_.comm);
  comm_ = &safe_step_->communicator();
  rank_ = comm_->rank();
  world_ = comm_->world_size();
  // The communicator may outlive this run (belay sweep trains every point on one): count
  // this run's calls alone.
  counters_before_ = comm_->counters();
  if (rank_ != 0) c_.quiet = true;  // rank 0 speaks for the run (errors are still printed by any rank)
  safe_step_->after_backward = [this](int64_t s, Optimizer& o) { on_after_backward(s, o); };
}

// --shard-optimizer: the plan (by size, the same on every rank), the optimizer keeping its
// own share's state (the rest released), the communicator summing gradients on their owners.
void Trainer::shard_optimizer() {
  std::vector<int64_t> numels;
  for (const Var& p : opt_->params()) numels.push_back(p.value().numel());
  const ShardPlan plan = plan_shards(numels, c_.comm->world_size());
  std::vector<bool> owned;
  for (int o : plan.owner) owned.push_back(o == c_.comm->rank());
  opt_->set_owned(owned);
  c_.comm->set_shards(plan);
  // The released moments and masters go back to the system, not to the allocator's cache
  // (engine/allocator.h), which would keep them for blocks of their sizes that never come.
  allocator_for(device_).release_cached();
}

// After the gradient all-reduce: an inf planted on one rank reaches only the belts' agreement.
void Trainer::on_after_backward(int64_t s, Optimizer& o) {
  if (c_.inject_inf.count(s) && (c_.inject_rank < 0 || c_.inject_rank == rank_) && !o.grads().empty())
    o.mutable_grads()[0]->set_element(0, INFINITY);
  // Anomaly mode: the gradient buffers as the guard will read them (a fault planted above
  // is found here: the ops' own backward checks ran before it).
  if (anomaly_mode_enabled())
    for (const Var& p : o.params())
      if (p.grad().defined()) check_gradient("gradient buffer", "", "gradient of " + p.name(), p.grad());
}

// ---- the whole run

TrainResult Trainer::run() {
  resume();
  open_outputs();
  announce();
  start();
  try {
    loop();
  } catch (const AnomalyError& e) {
    // The first non-finite value: the rows before it go to the log, the report to the user,
    // and no checkpoint is written (the state may hold the non-finite value).
    drain(0);
    progress_->finish();
    if (log_) log_->close();
    if (!c_.quiet) out_ << e.report().describe();
    throw;
  }
  return finish();
}

TrainResult run_training(const TrainConfig& config, std::ostream& out) { return Trainer(config, out).run(); }

// ---- resume

// Everything is validated before anything is written. Another precision policy (dtype,
// gradient dtype, loss scaling, fp32_ops: is_policy_setting) is a new experiment, allowed
// only when asked for, and then recorded.
void Trainer::resume() {
  if (c_.resume.empty()) return;
  // The data position is checked with the file, before the checkpoint is loaded or warned of.
  const RunState st = load_checkpoint(c_.resume, *model_, *opt_, settings_, c_.new_experiment,
                                      [&](const RunState& s) { data_->set_position(s.data_position); });
  if (st.scaler_state_loaded) scaler_->load_state(st.scaler);
  experiment_ = st.experiment;
  records_ = st.records;
  first_step_ = st.next_step;
  safe_step_->set_next_step(first_step_);
  if (first_step_ > c_.steps)
    throw UsageError("checkpoint '" + c_.resume + "' is at step " + std::to_string(first_step_) + ", past --steps " +
                     std::to_string(c_.steps));
  if (!st.policy_changes.empty()) {
    std::string what = "new experiment at step " + std::to_string(first_step_) + " from '" + c_.resume + "':";
    for (const std::string& change : st.policy_changes) what += " " + change + ",";
    what.pop_back();
    experiment_ += (experiment_.empty() ? "" : "; ") + what;
  }
}

// ---- outputs and the header

void Trainer::open_outputs() {
  // The CSV's `policy` column is there only when a rollback may change the policy.
  policy_column_ = c_.rollback.continues();
  rollback_report_ = c_.rollback.report;
  if (rollback_report_.empty() && c_.rollback.enabled()) {
    const std::string& csv = c_.csv;
    const std::string stem = csv.size() > 4 && csv.substr(csv.size() - 4) == ".csv" ? csv.substr(0, csv.size() - 4) : csv;
    rollback_report_ = csv.empty() ? "rollback.json" : stem + ".rollback.json";
  }
  if (c_.rollback.enabled()) check_writable(rollback_report_);
  // Open the log before any work: an unwritable path fails here, leaving nothing behind.
  // A resumed run keeps the rows up to the checkpoint, so the file reads as one run.
  std::vector<std::string> extra_columns;
  if (policy_column_) extra_columns.push_back("policy");
  if (c_.eval_every > 0) extra_columns.push_back("heldout_loss");
  if (!c_.census.empty()) extra_columns.push_back("nonfinite_tensors");
  if (!c_.census.empty() && rank_ == 0) {
    census_log_.emplace(c_.census, c_.census_every, census_format());
    census_summary_.emplace(census_format());
  }
  if (!c_.tensorboard.empty() && rank_ == 0) tensorboard_.emplace(c_.tensorboard);
  if (!c_.csv.empty() && rank_ == 0) log_.emplace(c_.csv, c_.resume.empty() ? -1 : first_step_ - 1, extra_columns);
  // Rank 0 writes the checkpoint: a path it cannot write fails now, not after the run.
  if (!c_.checkpoint.empty() && rank_ == 0) check_writable(c_.checkpoint);
}

void Trainer::announce() {
  if (c_.quiet) return;
  out_ << "belay train: " << c_.model << " " << model_->parameter_count() << " parameters, " << dtype_name(c_.dtype)
       << " on " << device_.str() << ", " << c_.optimizer << " lr " << c_.lr << ", batch " << c_.batch;
  if (c_.accum_steps() > 1 || world_ > 1) {
    out_ << " (" << c_.accum_steps() << " x " << c_.micro_batch_size();
    if (world_ > 1) out_ << " x " << world_ << " ranks";
    out_ << ")";
  }
  out_ << ", loss scaling " << (scaler_->enabled() ? "on" : "off") << ", clip "
       << (c_.clip_mode == ClipMode::Value ? "value " : "") << c_.max_norm << ", data " << data_->describe();
  if (c_.fp32_ops) out_ << ", fp32 ops " << fp32_ops_names(c_.fp32_ops);
  if (c_.detect_anomaly) out_ << ", anomaly detection on";
  if (first_step_ > 0) out_ << ", resumed at step " << first_step_;
  out_ << "\n";
  if (!experiment_.empty()) out_ << "experiment: " << experiment_ << "\n";
}

// The policy label of the CSV's `policy` column.
std::string Trainer::policy_label() const { return std::string(dtype_name(c_.dtype)) + "@lr=" + short_float(c_.lr); }

// ---- the steps

void Trainer::start() {
  if (tokens_) {
    result_.unigram_entropy = tokens_->unigram_entropy_nats();
    result_.heldout_bytes_per_token =
        tokens_->heldout_bytes_per_token(HeldOutBatches(*tokens_, 1, c_.eval_windows).windows());
    result_.tokens_per_step = c_.batch * c_.context;
  }
  progress_.emplace(out_, c_.steps, !c_.show_steps && !c_.quiet && is_terminal(out_), result_.tokens_per_step);
  signals_ = std::make_unique<SignalScope>(c_.handle_signals);
  monitor_.emplace(c_.skip);
  scale_monitor_.emplace(scaler_->scale(), so_.growth_interval, so_.min_scale);
  if (c_.detect_anomaly) {
    anomaly_.emplace(scaler_->enabled());  // with loss scaling, gradients are scaled
    anomaly_->on_scaler_event = [this](const AnomalyReport& r) {
      result_.scaler_events.push_back(r);
      if (!c_.quiet) {
        progress_->finish();
        out_ << r.describe();
      }
    };
  }
  accum_ = c_.accum_steps();
  micro_ = c_.micro_batch_size();
  classify_ = data_->classification();
  trigger_.emplace(c_.rollback);
  census_scale_ = scaler_->scale();
  t0_ = std::chrono::steady_clock::now();
  last_ = c_.stop_at >= 0 ? std::min(c_.steps, c_.stop_at) : c_.steps;
  if (c_.rollback.enabled()) snapshot_ = take_snapshot(*model_, *opt_, *scaler_, *data_, first_step_);  // the start is good
}

void Trainer::loop() {
  for (int64_t s = first_step_;; ++s) {
    const bool done = s >= last_;
    if (!done) step(s);
    const bool eval_due = !done && c_.eval_every > 0 && ((s + 1) % c_.eval_every == 0 || s + 1 == last_);
    if (eval_due) heldout_ = {s, evaluate_heldout()};  // the weights after step s: its row takes the value
    const bool checkpoint_due = !done && !c_.checkpoint.empty() && c_.checkpoint_every > 0 && (s + 1) % c_.checkpoint_every == 0;
    const bool snapshot_due = !done && snapshot_ && s + 1 - snapshot_->next_step >= c_.rollback.every;
    // Every row up to here is in the CSV (and judged) before a checkpoint or a snapshot is
    // taken, and before a rollback restores: the price is one wait for the device there.
    // A snapshot stays due while the state is not healthy, so such a stretch waits each step.
    if (done || eval_due || checkpoint_due || snapshot_due || rollback_reason_) drain(0);
    if (rollback_reason_) {
      if (!rollback()) break;
      s = snapshot_->next_step - 1;  // the loop's ++s runs the step after the snapshot next
      continue;
    }
    if (done) break;
    if (checkpoint_due) checkpoint(s + 1);
    if (snapshot_due && trigger_->healthy()) {
      snapshot_ = take_snapshot(*model_, *opt_, *scaler_, *data_, s + 1);
      snapshot_->row_index = result_.rows.size();
    }
    if (skip_stop_ || stop_signalled(s)) break;
  }
}

// Taken together: a signal seen by one rank stops every rank after the same step.
bool Trainer::stop_signalled(int64_t s) {
  int sig = world_ > 1 ? comm_->max_over_ranks(g_stop_signal) : static_cast<int>(g_stop_signal);
  if (sig == 0 && c_.stop_requested) sig = c_.stop_requested();
  if (sig == 0) return false;
  drain(0);
  progress_->finish();
  if (!c_.quiet)
    out_ << "stopping after step " << s << " on " << (sig == SIGINT ? "SIGINT" : "SIGTERM")
         << (c_.checkpoint.empty() ? "" : "; checkpoint " + c_.checkpoint) << "\n";
  result_.exit_code = 128 + sig;
  return true;
}

void Trainer::step(int64_t s) {
  const auto ts = std::chrono::steady_clock::now();
  const double batch_bytes = 4.0 * static_cast<double>(c_.batch) * static_cast<double>(c_.in_features + c_.out_features);
  std::optional<AllocationPurpose> purpose(std::in_place, "the batch of step", s);
  Batch batch = out_of_memory_as_error(batch_bytes, [&] { return data_->next(c_.batch, device_); });
  if (auto it = c_.spikes.find(s); it != c_.spikes.end() && !classify_)
    backend_for(device_).scale(batch.y, it->second, batch.y);
  if (world_ > 1) {  // every rank reads the effective batch and keeps its own rows
    const int64_t local = c_.local_batch();
    batch.x = batch.x.copy_rows(rank_ * local, (rank_ + 1) * local);
    batch.y = batch.y.copy_rows(rank_ * local, (rank_ + 1) * local);
  }
  if (anomaly_) {
    anomaly_->set_step(s);
    check_batch(batch);
  }
  purpose.emplace("the activations and gradients of step", s);
  const int64_t done_before = comm_->buckets_done_in_backward();
  in_flight_.push_back(safe_step_->enqueue([&](int k) {
    const Tensor x = accum_ == 1 ? batch.x : batch.x.copy_rows(k * micro_, (k + 1) * micro_);
    const Tensor y = accum_ == 1 ? batch.y : batch.y.copy_rows(k * micro_, (k + 1) * micro_);
    return loss_of(x, y);
  }));
  result_.buckets_done_in_backward.push_back(comm_->buckets_done_in_backward() - done_before);
  if (anomaly_) check_optimizer();
  drain(c_.sync_each_step ? 0 : 1);
  // The period of the loop: in steady state, one step of the device's work.
  result_.step_ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - ts).count());
}

// The values of the CSV's extra columns for this row: the policy, the held-out loss.
std::vector<std::string> Trainer::extra_columns(const StepRow& row) const {
  std::vector<std::string> extra;
  if (policy_column_) extra.push_back(policy_label());
  if (c_.eval_every > 0) extra.push_back(heldout_ && heldout_->first == row.step ? heldout_text(heldout_->second) : "");
  if (!c_.census.empty()) extra.push_back(nonfinite_tensors(row.census));
  return extra;
}

// The model's loss on one (micro-)batch, under the run's autocast. Token data: the logits of
// every position [B T, V] against the next ids [B, T], flattened in the same order.
Var Trainer::loss_of(const Tensor& x, const Tensor& y) {
  Autocast autocast(c_.dtype, c_.dtype != DType::F32, c_.fp32_ops);
  Var pred = (*model_)(Var(x));
  if (!classify_) return mse_loss(pred, y);
  return cross_entropy(pred, y.shape().rank() == 2 ? y.reshape(Shape{y.numel()}) : y);
}

// The mean loss over the first eval_windows held-out windows (each window's T tokens count
// the same), under the run's autocast as PyTorch evaluates under autocast; no graph recorded.
double Trainer::evaluate_heldout() {
  NoGrad no_grad;
  HeldOutBatches batches(*tokens_, c_.micro_batch_size(), c_.eval_windows);
  double sum = 0.0;
  while (std::optional<Batch> b = batches.next(device_)) {
    const double n = static_cast<double>(b->x.shape()[0]);
    sum += n * static_cast<double>(loss_of(b->x, b->y).value().item());
  }
  return sum / static_cast<double>(batches.windows());
}

void Trainer::drain(size_t keep) {
  while (in_flight_.size() > keep) {
    log(in_flight_.front().row());
    in_flight_.pop_front();
  }
}

// Anomaly mode: the batch as the model will read it (with the data row of a file's row).
void Trainer::check_batch(const Batch& batch) {
  const int64_t first_row = data_->last_batch_first_row();
  for (const auto& [name, t] : {std::pair<const char*, const Tensor*>{"x", &batch.x}, {"y", &batch.y}}) {
    try {
      check_finite("input", "batch", "", name, *t);
    } catch (const AnomalyError& e) {
      AnomalyReport r = e.report();
      if (first_row >= 0) r.tensor += " (data row " + std::to_string(first_row + r.first_row) + ")";
      throw AnomalyError(r);
    }
  }
}

// Anomaly mode: what the optimizer wrote, masters and the working copies the next forward reads.
void Trainer::check_optimizer() {
  for (const Var& p : model_->parameters()) {
    check_finite("optimizer", c_.optimizer, "", "master " + p.name(), p.master());
    if (p.value().dtype() != DType::F32) check_finite("optimizer", c_.optimizer, "", "working copy " + p.name(), p.value());
  }
}

// ---- log

// One finished step: CSV row, progress, the monitors (the skip monitor may end the run: exit 1).
void Trainer::log(const StepRow& row) {
  result_.rows.push_back(row);
  if (heldout_ && heldout_->first == row.step) result_.heldout.push_back(*heldout_);
  if (log_) log_->write(row, extra_columns(row));
  bool census_recorded = false;
  if (census_log_) {
    census_recorded = census_log_->write(row, census_scale_);
    census_summary_->observe(row, census_scale_);
  }
  if (tensorboard_) write_tensorboard(row, census_recorded);
  census_scale_ = row.scaler_scale;
  if (c_.rollback.enabled() && !rollback_reason_) {
    rollback_reason_ = trigger_->observe(row);
    if (rollback_reason_) rollback_fired_at_ = row.step;
  }
  if (result_.rows.size() == 1) result_.first_loss = row.loss;
  if (row.skipped)
    ++result_.skipped;
  else
    result_.final_loss = row.loss;
  if (c_.show_steps && !c_.quiet) out_ << describe_row(row) << "\n";
  if (!c_.quiet && !c_.show_steps) progress_->update(row, result_.skipped);
  if (!row.skipped && row.grad_l2_post_clip < row.grad_l2_pre_clip) {  // the clip changed this gradient
    ++result_.clipped;
    result_.min_clip_cosine = std::min(result_.min_clip_cosine, row.clip_cosine);
    cosine_sum_ += row.clip_cosine;
  }
  if (scaler_->enabled()) watch_scale(row);
  watch_skips(row);
}

// The row's values as scalars, and the census of a recorded step as per-tensor scalars
// (TensorBoard groups the tags by their prefix: one chart per tensor under census/...).
void Trainer::write_tensorboard(const StepRow& row, bool census_recorded) {
  std::vector<std::pair<std::string, float>> v{{"step/loss", row.loss},
                                               {"step/lr", row.lr},
                                               {"step/grad_l2_pre_clip", row.grad_l2_pre_clip},
                                               {"step/grad_l2_post_clip", row.grad_l2_post_clip},
                                               {"step/scaler_scale", row.scaler_scale},
                                               {"step/skipped", row.skipped ? 1.0f : 0.0f}};
  if (census_recorded) {
    const auto add = [&](const TensorCensus& c, const std::string& name) {
      const double n = c.numel > 0 ? static_cast<double>(c.numel) : 1.0;
      v.emplace_back("census_headroom_bits/" + name, static_cast<float>(c.headroom_bits(census_format())));
      v.emplace_back("census_underflow_fraction/" + name, static_cast<float>(static_cast<double>(c.underflow) / n));
      v.emplace_back("census_subnormal_fraction/" + name, static_cast<float>(static_cast<double>(c.subnormal) / n));
      v.emplace_back("census_nonfinite/" + name, static_cast<float>(c.nonfinite));
    };
    for (const TensorCensus& c : row.census) add(c, c.name);
    for (const TensorCensus& c : row.cast_census) add(c, cast_row_name(c.name));
  }
  tensorboard_->scalars(row.step, v);
}

void Trainer::watch_scale(const StepRow& row) {
  const ScaleMonitor::Verdict sv = scale_monitor_->observe(row);
  if (sv.repeated_backoff && !c_.quiet) {
    progress_->finish();
    out_ << "warning: the loss scale backed off " << sv.backoffs_in_interval << " times within one growth interval ("
         << so_.growth_interval << " steps, from step " << sv.interval_start << " to " << row.step
         << "): overflows keep coming, and a falling scale does not prove they are gone\n";
  }
  if (sv.hit_min && !c_.quiet) {
    progress_->finish();
    out_ << "warning: the loss scale reached --min-scale " << so_.min_scale << " at step " << row.step
         << " (an overflow): it can fall no further, so overflows from here on are not cured by scaling; look for "
            "the op that overflows (or try bf16)\n";
  }
}

void Trainer::watch_skips(const StepRow& row) {
  const SkipMonitor::Verdict v = monitor_->observe(row.skipped);
  if (v.alert && !c_.quiet) {
    progress_->finish();
    out_ << "alert: skip rate " << 100.0 * v.rate << "% over the last "
         << std::min<int64_t>(static_cast<int64_t>(result_.rows.size()), c_.skip.window) << " steps is above "
         << 100.0 * c_.skip.alert_rate << "%\n";
  }
  if (v.stop && !skip_stop_) {
    skip_stop_ = true;
    progress_->finish();
    std::ostringstream why;
    why << "skip rate stayed above " << 100.0 * c_.skip.max_rate << "% for " << c_.skip.patience
        << " consecutive steps (through step " << row.step << "); stopping";
    result_.stop_reason = why.str();
    out_ << "belay: error: " << result_.stop_reason << "\n";
    result_.exit_code = 1;
  }
}

// ---- checkpoint

void Trainer::checkpoint(int64_t next_step) {
  RunState st;
  st.next_step = next_step;
  st.optimizer_steps = opt_->step_count();
  st.scaler = scaler_->state();
  st.data_position = data_->position();
  st.settings = settings_;
  st.records = records_;
  st.experiment = experiment_;
  if (tokens_ && tokens_->tokenizer()) st.attachments[kBpeMetadataKey] = tokens_->tokenizer()->serialized();
  // Rank 0 writes for all, once every rank's weights and scaler state are seen to agree.
  save_checkpoint(c_.checkpoint, *model_, *opt_, st, *comm_);
}

// ---- rollback

// What fired is written to the case file, the last good state is restored, and the run
// stops (exit 1, the restored state checkpointed) or goes on under the new policy. Every
// row is drained before.
bool Trainer::rollback() {
  const Snapshot& snap = *snapshot_;
  ++result_.rollbacks;
  const bool go_on = c_.rollback.continues() && result_.rollbacks <= c_.rollback.max_rollbacks;
  nlohmann::json rows = nlohmann::json::array();
  for (size_t i = snap.row_index; i < result_.rows.size(); ++i) rows.push_back(format_step_row(result_.rows[i]));
  restore_snapshot(snap, *model_, *opt_, *scaler_, *data_);
  safe_step_->set_next_step(snap.next_step);
  trigger_->reset();
  scale_monitor_->restart(snap.scaler.scale);
  const std::string action = apply_rollback_policy(go_on);
  settings_ = run_settings(c_, *data_, so_.enabled);  // a checkpoint records the policy now in force
  records_[std::to_string(rollback_fired_at_) + ".rollback"] =
      *rollback_reason_ + "; restored step " + std::to_string(snap.next_step) + "; " + action;
  if (!cases_) cases_ = std::make_unique<nlohmann::json>(nlohmann::json::array());
  cases_->push_back({{"step", rollback_fired_at_},
                     {"condition", trigger_->condition()},
                     {"reason", *rollback_reason_},
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
  const nlohmann::json report{{"format", "belay.rollback.v1"}, {"cases", *cases_}};
  write_file_atomically(rollback_report_, report.dump(2) + "\n");
  progress_->finish();
  const std::string what = "rollback: " + *rollback_reason_ + "; restored the state of step " +
                           std::to_string(snap.next_step) + " (weights, optimizer, scaler, data, LR position); case in " +
                           rollback_report_;
  if (go_on) {
    if (!c_.quiet) out_ << what << "; " << action << "\n";
  } else {
    result_.stop_reason = what + "; stopping" + (c_.rollback.continues() ? " (--max-rollbacks)" : "");
    out_ << "belay: error: " << result_.stop_reason << "\n";
    result_.exit_code = 1;
  }
  rollback_reason_.reset();
  return go_on;
}

// The policy the run goes on under (fp32, or a lower LR), applied; returns the action's words.
std::string Trainer::apply_rollback_policy(bool go_on) {
  if (go_on && c_.rollback.policy == "fp32") {
    const std::string action = std::string("continue in fp32 (was ") + dtype_name(c_.dtype) + ")";
    c_.dtype = DType::F32;
    c_.low_precision_grads = false;
    model_->set_working_dtype(DType::F32);
    model_->set_grad_dtype(DType::F32);
    return action;
  }
  if (go_on) {
    const float old_lr = c_.lr;
    c_.lr *= c_.rollback.lr_factor;
    opt_->set_schedule(parse_schedule(c_.schedule, c_.lr, c_.warmup, c_.steps));
    return "continue with lr " + short_float(c_.lr) + " (was " + short_float(old_lr) + ")";
  }
  if (c_.rollback.continues()) return "stop (" + std::to_string(c_.rollback.max_rollbacks) + " rollbacks already)";
  return "stop";
}

// ---- finish

TrainResult Trainer::finish() {
  drain(0);
  // The steps are over: the blocks the allocator cached for them go back to the system before
  // the final checkpoint and the host copy of the weights below are made, so that neither
  // adds to the run's peak memory.
  allocator_for(device_).release_cached();
  if (!device_.is_cpu()) allocator_for(Device::cpu()).release_cached();
  result_.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  const CommCounters run_counters = comm_->counters() - counters_before_;
  result_.gradient_syncs = run_counters.gradient_syncs;
  result_.gradient_bytes = run_counters.gradient_bytes;
  result_.gradient_buckets = run_counters.gradient_buckets;
  result_.gradient_sync_seconds = run_counters.gradient_sync_seconds;
  result_.gradient_wait_seconds = run_counters.gradient_wait_seconds;
  result_.scale = scale_monitor_->summary();
  if (result_.clipped > 0) result_.mean_clip_cosine = cosine_sum_ / static_cast<double>(result_.clipped);
  progress_->finish();
  // The final checkpoint (also after a signal or a skip-rate stop): the run can continue.
  if (!c_.checkpoint.empty()) checkpoint(safe_step_->next_step());
  if (log_) log_->close();
  if (census_log_) census_log_->close();
  if (tensorboard_) tensorboard_->close();
  g_stop_signal = 0;
  // Reserved whole (push_back's doubling would add up to 8 bytes a parameter to the run's peak).
  // A master released by sharding (another rank owns it): the working copy, widened.
  size_t weights = 0;
  for (const Var& p : model_->parameters()) weights += static_cast<size_t>(p.value().numel());
  result_.final_weights.reserve(weights);
  for (const Var& p : model_->parameters()) {
    const std::vector<float> w = (p.master_released() ? p.value().to(DType::F32) : p.master()).to_vector();
    result_.final_weights.insert(result_.final_weights.end(), w.begin(), w.end());
  }
  result_.final_scaler = scaler_->state();
  result_.final_optimizer_steps = opt_->step_count();
  result_.final_next_step = safe_step_->next_step();
  result_.final_data_position = data_->position();
  // Every rank's memory, for rank 0's summary (a collective: every rank takes part).
  if (world_ > 1 || comm_->name() != "local") {
    rank_state_bytes_ = comm_->all_gather_value(optimizer_state_bytes());
    rank_peak_rss_ = comm_->all_gather_value(peak_rss_bytes());
  }
  if (!c_.quiet) print_summary(run_counters);
  return std::move(result_);
}

void Trainer::print_summary(const CommCounters& run_counters) {
  const TrainResult& r = result_;
  out_ << "done: " << r.rows.size() << " steps (" << r.rows.size() - r.skipped << " applied, " << r.skipped
       << " skipped) in " << r.seconds << " s; loss " << r.first_loss << " -> " << r.final_loss << "; final scale "
       << scaler_->scale();
  if (r.rollbacks > 0) out_ << "; " << r.rollbacks << (r.rollbacks == 1 ? " rollback" : " rollbacks");
  if (c_.fp32_ops) out_ << "; fp32 ops " << fp32_ops_names(c_.fp32_ops);
  if (c_.detect_anomaly) out_ << "; " << r.scaler_events.size() << " scaler event(s), no anomaly";
  if (!c_.csv.empty()) out_ << "; log " << c_.csv;
  if (r.tokens_per_step > 0)
    out_ << "; " << short_count(static_cast<double>(r.tokens_per_step) * static_cast<double>(r.rows.size()) /
                                std::max(r.seconds, 1e-9))
         << " tokens/s";
  if (!c_.checkpoint.empty()) out_ << "; checkpoint " << c_.checkpoint;
  out_ << "\n";
  if (world_ > 1 || comm_->name() != "local") print_dist_summary(run_counters);
  if (scaler_->enabled())
    out_ << "scale: min " << r.scale.min << ", max " << r.scale.max << ", " << r.scale.backoffs << " backoffs, "
         << r.scale.growths << " growths\n";
  if (!r.heldout.empty())
    out_ << "held-out loss " << heldout_text(r.heldout.front().second) << " (after step " << r.heldout.front().first
         << ") -> " << heldout_text(r.heldout.back().second) << " (after step " << r.heldout.back().first
         << ") nats per token" << bits_per_byte_text(r) << "; the training text's unigram entropy "
         << heldout_text(r.unigram_entropy) << "\n";
  if (census_summary_) {
    for (const std::string& line : census_summary_->lines()) out_ << line << "\n";
    out_ << "census: " << c_.census << "\n";
  }
  if (r.clipped > 0) {
    out_ << "clipping (" << (c_.clip_mode == ClipMode::Value ? "value" : "norm") << " at " << c_.max_norm
         << "): " << r.clipped << " of " << r.rows.size() - r.skipped << " applied steps clipped; cosine(raw, applied gradient) ";
    if (c_.clip_mode == ClipMode::Value)
      out_ << "min " << r.min_clip_cosine << ", mean " << r.mean_clip_cosine << " (clamping turns the gradient)\n";
    else
      out_ << "1 (scaled as a whole: the direction is kept)\n";
  }
  print_memory_summary();
}

namespace {
std::string gigabytes(double bytes) { return short_count(bytes / 1e9) + " GB"; }
}  // namespace

// What the run held: the tensors' peak (the allocator's count of bytes handed out), the most the
// caching allocator held at once (blocks are cached by exact size, so a gap between the two is
// memory that requests of other sizes could not reuse), and the process's peak RSS.
void Trainer::print_memory_summary() {
  const AllocatorStats st = allocator_for(device_).stats();
  out_ << "memory (" << device_.str() << "): tensors at most " << gigabytes(static_cast<double>(st.peak_bytes_in_use))
       << ", held by the allocator at most " << gigabytes(static_cast<double>(st.peak_bytes_held));
  const double rss = peak_rss_bytes();
  if (rss >= 0) out_ << "; process peak RSS " << gigabytes(rss);
  out_ << "\n";
}

namespace {
// Bytes as MB: whole MB from 100 up, three digits below (a small model's moments).
std::string mb_text(double bytes) {
  char text[32];
  const double mb = bytes / 1048576.0;
  std::snprintf(text, sizeof text, mb >= 100.0 ? "%.0f" : "%.3g", mb);
  return text;
}

// ", min A max B" over the steps' counts of buckets done before backward ended ("" for none).
std::string done_range_text(const std::vector<int64_t>& per_step) {
  if (per_step.empty()) return "";
  const auto [lo, hi] = std::minmax_element(per_step.begin(), per_step.end());
  return ", min " + std::to_string(*lo) + " max " + std::to_string(*hi);
}
}  // namespace

// The optimizer's FP32 state on this rank (its moments; with sharding only its share's).
double Trainer::optimizer_state_bytes() const {
  double bytes = 0.0;
  for (auto& [name, t] : opt_->state_tensors()) bytes += static_cast<double>(t->nbytes());
  return bytes;
}

// This process's peak resident memory (VmHWM), -1 where /proc/self/status has none.
double Trainer::peak_rss_bytes() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind("VmHWM:", 0) == 0) return std::atof(line.c_str() + 6) * 1024.0;  // "VmHWM:  1234 kB"
  return -1.0;
}

void Trainer::print_dist_summary(const CommCounters& run_counters) {
  const TrainResult& r = result_;
  const Communicator& comm = *comm_;
  if (comm.sharded()) {
    const ShardPlan& plan = comm.shards();
    out_ << "dist " << comm.name() << ": optimizer state sharded (--shard-optimizer), elements per rank";
    for (int64_t n : plan.rank_numel) out_ << " " << n;
    out_ << "\n";
  }
  if (!rank_peak_rss_.empty()) {
    out_ << "dist " << comm.name() << ": per rank optimizer state (moments) MB / peak RSS MB:";
    for (size_t i = 0; i < rank_peak_rss_.size(); ++i)
      out_ << " " << mb_text(rank_state_bytes_[i]) << "/" << mb_text(rank_peak_rss_[i]);
    out_ << "\n";
  }
  out_ << "dist " << comm.name() << ": " << world_ << " ranks; per rank " << r.gradient_syncs << " gradient all-reduces, "
       << r.gradient_bytes << " bytes, " << run_counters.agreements << " small collectives of the belts\n";
  out_ << "dist " << comm.name() << ": " << r.gradient_buckets << " buckets "
       << (comm.bucket_bytes() == 0 ? std::string("(one per step)")
                                    : "of <= " + short_count(static_cast<double>(comm.bucket_bytes()) / 1048576.0) + " MB")
       << " (" << run_counters.buckets_during_backward << " started during backward, "
       << run_counters.buckets_done_in_backward << " done before it ended; per step "
       << short_count(static_cast<double>(run_counters.buckets_done_in_backward) /
                      static_cast<double>(std::max<int64_t>(run_counters.gradient_syncs, 1)))
       << " of " << short_count(static_cast<double>(run_counters.gradient_buckets) /
                                static_cast<double>(std::max<int64_t>(run_counters.gradient_syncs, 1)))
       << done_range_text(r.buckets_done_in_backward) << "); gradient sync "
       << short_count(r.gradient_sync_seconds) << " s, of which waiting " << short_count(r.gradient_wait_seconds)
       << " s (" << short_count(100.0 * r.gradient_sync_seconds / std::max(r.seconds, 1e-9)) << "% of the run)\n";
}

}  // namespace belay

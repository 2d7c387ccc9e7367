#include "apps/run/rollback.h"

#include <cmath>
#include <cstdio>

#include "engine/error.h"

namespace belay {

void validate_rollback(const RollbackOptions& o) {
  if (o.every < 1) throw UsageError("--rollback-every must be >= 1");
  if (o.skip_window < 1) throw UsageError("--rollback-skip-window must be >= 1");
  if (!(o.max_skip_rate >= 0.0 && o.max_skip_rate < 1.0)) throw UsageError("--rollback-skip-rate must be in [0, 1)");
  if (!(o.divergence_factor > 1.0) || !std::isfinite(o.divergence_factor))
    throw UsageError("--divergence-factor must be a finite number > 1");
  if (o.divergence_warmup < 1) throw UsageError("--divergence-warmup must be >= 1");
  if (o.policy != "stop" && o.policy != "fp32" && o.policy != "lower-lr")
    throw UsageError("unknown --rollback-policy '" + o.policy + "': use fp32 or lower-lr F (default: stop)");
  if (o.policy == "lower-lr" && !(o.lr_factor > 0.0f && o.lr_factor < 1.0f))
    throw UsageError("--rollback-policy lower-lr F needs 0 < F < 1");
  if (o.max_rollbacks < 1) throw UsageError("--max-rollbacks must be >= 1");
  if (!o.enabled() && (o.policy != "stop")) throw UsageError("--rollback-policy needs --rollback-on");
}

RollbackTrigger::RollbackTrigger(RollbackOptions options) : o_(std::move(options)) { reset(); }

void RollbackTrigger::reset() {
  window_.assign(static_cast<size_t>(o_.skip_window), false);
  seen_ = skips_ = applied_ = 0;
  last_applied_ = false;
  ema_ = best_ = 0.0;
}

std::optional<std::string> RollbackTrigger::observe(const StepRow& row) {
  char buf[200];
  // The skip window: a ring of the last skip_window rows.
  const size_t slot = static_cast<size_t>(seen_ % o_.skip_window);
  skips_ += static_cast<int64_t>(row.skipped) - static_cast<int64_t>(window_[slot]);
  window_[slot] = row.skipped;
  ++seen_;
  last_applied_ = !row.skipped && std::isfinite(row.loss);
  if (last_applied_) {
    ema_ = applied_ == 0 ? row.loss : (1.0 - kEmaWeight) * ema_ + kEmaWeight * row.loss;
    ++applied_;
    if (applied_ >= o_.divergence_warmup && (applied_ == o_.divergence_warmup || ema_ < best_)) best_ = ema_;
  }
  if (o_.on_nonfinite_loss && row.skip_reason == "nonfinite_loss") {
    condition_ = "nonfinite-loss";
    std::snprintf(buf, sizeof buf, "nonfinite-loss: the loss of step %lld is %g", static_cast<long long>(row.step),
                  static_cast<double>(row.loss));
    return std::string(buf);
  }
  if (o_.on_skip_rate && static_cast<double>(skips_) > o_.max_skip_rate * static_cast<double>(o_.skip_window)) {
    condition_ = "skip-rate";
    std::snprintf(buf, sizeof buf, "skip-rate: %lld of the last %lld steps skipped, above %g of them",
                  static_cast<long long>(skips_), static_cast<long long>(std::min(seen_, o_.skip_window)),
                  o_.max_skip_rate);
    return std::string(buf);
  }
  if (o_.on_divergence && applied_ > o_.divergence_warmup && ema_ > o_.divergence_factor * best_) {
    condition_ = "divergence";
    std::snprintf(buf, sizeof buf, "divergence: smoothed loss %g is above %g x the best smoothed loss %g", ema_,
                  o_.divergence_factor, best_);
    return std::string(buf);
  }
  return std::nullopt;
}

bool RollbackTrigger::healthy() const {
  if (!last_applied_) return false;
  // Near a threshold is not good: half of either margin left.
  if (o_.on_skip_rate && static_cast<double>(skips_) > 0.5 * o_.max_skip_rate * static_cast<double>(o_.skip_window))
    return false;
  if (o_.on_divergence && applied_ > o_.divergence_warmup && ema_ > 0.5 * (1.0 + o_.divergence_factor) * best_)
    return false;
  return true;
}

Snapshot take_snapshot(const Module& model, Optimizer& opt, const GradScaler& scaler, const Dataset& data,
                       int64_t next_step) {
  Snapshot s;
  s.next_step = next_step;
  s.optimizer_steps = opt.step_count();
  s.scaler = scaler.state();
  s.data_position = data.position();
  for (auto& [name, p] : model.named_parameters()) s.tensors.push_back(p.master().clone());
  for (auto& [name, t] : opt.state_tensors()) s.tensors.push_back(t->clone());
  return s;
}

void restore_snapshot(const Snapshot& s, Module& model, Optimizer& opt, GradScaler& scaler, Dataset& data) {
  size_t i = 0;
  std::vector<Var> params;
  for (auto& [name, p] : model.named_parameters()) {
    const_cast<Tensor&>(p.master()).copy_from(s.tensors.at(i++));
    params.push_back(p);
  }
  for (auto& [name, t] : opt.state_tensors()) t->copy_from(s.tensors.at(i++));
  if (i != s.tensors.size()) throw Error("rollback: the snapshot does not match the model");
  for (Var& p : params) p.set_working_dtype(p.dtype());  // the working copy is the rounded master
  opt.set_step_count(s.optimizer_steps);
  scaler.load_state(s.scaler);
  data.set_position(s.data_position);
}

}  // namespace belay

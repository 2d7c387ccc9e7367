#include "apps/train.h"

#include <chrono>
#include <cmath>
#include <iostream>
#include <memory>
#include <optional>

#include "amp/autocast.h"
#include "amp/safe_step.h"
#include "apps/progress.h"
#include "apps/synthetic_data.h"
#include "autograd/modules.h"
#include "engine/backend.h"
#include "engine/error.h"
#include "optim/adamw.h"
#include "optim/sgd.h"

namespace belay {

void validate(const TrainConfig& c) {
  auto positive = [](const char* name, int64_t v) {
    if (v <= 0) throw UsageError(std::string("--") + name + " must be positive, got " + std::to_string(v));
  };
  positive("in", c.in_features);
  positive("out", c.out_features);
  positive("hidden", c.hidden);
  positive("batch", c.batch);
  positive("steps", c.steps);
  if (c.model != "linear" && c.model != "mlp") throw UsageError("unknown model '" + c.model + "': use linear or mlp");
  if (c.model == "mlp" && c.layers < 2) throw UsageError("--layers must be at least 2, got " + std::to_string(c.layers));
  if (c.optimizer != "adamw" && c.optimizer != "sgd")
    throw UsageError("unknown optimizer '" + c.optimizer + "': use adamw or sgd");
  if (!(c.lr > 0.0f) || !std::isfinite(c.lr)) throw UsageError("--lr must be a positive number");
  if (!(c.weight_decay >= 0.0f)) throw UsageError("--weight-decay must be >= 0");
  if (!(c.momentum >= 0.0f && c.momentum < 1.0f)) throw UsageError("--momentum must be in [0, 1)");
  if (c.warmup < 0) throw UsageError("--warmup must be >= 0");
  if (std::isnan(c.max_norm) || c.max_norm <= 0.0f) throw UsageError("--clip must be > 0");
  for (int64_t s : c.inject_inf)
    if (s < 0) throw UsageError("--inject-inf step must be >= 0, got " + std::to_string(s));
  for (auto [s, f] : c.spikes)
    if (s < 0 || !std::isfinite(f)) throw UsageError("--spike needs STEP >= 0 and a finite FACTOR");
  parse_schedule(c.schedule, c.lr, c.warmup, c.steps);
  const Device device = parse_device(c.device);
  require_device(device);
}

namespace {

std::unique_ptr<Module> make_model(const TrainConfig& c, Rng& rng, Device device) {
  if (c.model == "mlp") return std::make_unique<Mlp>(c.in_features, c.hidden, c.out_features, rng, c.layers, Activation::Gelu, device);
  return std::make_unique<Linear>(c.in_features, c.out_features, rng, true, device);
}

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

}  // namespace

TrainResult run_training(const TrainConfig& c, std::ostream& out) {
  validate(c);
  const Device device = parse_device(c.device);
  // Open the log first: an unwritable path fails before any work, leaving nothing behind.
  std::optional<StepLogWriter> log;
  if (!c.csv.empty()) log.emplace(c.csv);

  Rng init_rng(c.seed);
  std::unique_ptr<Module> model = make_model(c, init_rng, device);
  model->set_working_dtype(c.dtype);
  model->set_grad_dtype(c.low_precision_grads ? c.dtype : DType::F32);
  std::unique_ptr<Optimizer> opt = make_optimizer(c, *model);
  GradScalerOptions so = c.scaler;
  if (!c.scaler_explicit) so.enabled = default_scaler_enabled(c.dtype);
  GradScaler scaler(device, so);
  SafeStepOptions sso;
  sso.max_norm = c.max_norm;
  sso.fused = c.fused;
  SafeStep step(*opt, scaler, parse_schedule(c.schedule, c.lr, c.warmup, c.steps), sso);
  step.after_backward = [&](int64_t s, Optimizer& o) {
    if (c.inject_inf.count(s) && !o.grads().empty()) o.mutable_grads()[0]->set_element(0, INFINITY);
  };
  SyntheticRegression data(c.in_features, c.out_features, c.seed);
  SkipMonitor monitor(c.skip);

  if (!c.quiet)
    out << "belay train: " << c.model << " " << model->parameter_count() << " parameters, " << dtype_name(c.dtype)
        << " on " << device.str() << ", " << c.optimizer << " lr " << c.lr << ", loss scaling "
        << (scaler.enabled() ? "on" : "off") << ", clip " << c.max_norm << "\n";
  Progress progress(out, c.steps, !c.show_steps && !c.quiet && is_terminal(out));

  TrainResult result;
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t s = 0; s < c.steps; ++s) {
    Batch batch = data.next(c.batch, device);
    if (auto it = c.spikes.find(s); it != c.spikes.end()) backend_for(device).scale(batch.y, it->second, batch.y);
    const StepRow row = step.run([&](int) {
      Autocast autocast(c.dtype, c.dtype != DType::F32);
      return mse_loss((*model)(Var(batch.x)), batch.y);
    });
    result.rows.push_back(row);
    if (log) log->write(row);
    if (s == 0) result.first_loss = row.loss;
    if (row.skipped)
      ++result.skipped;
    else
      result.final_loss = row.loss;
    if (c.show_steps && !c.quiet) out << describe_row(row) << "\n";
    if (!c.quiet && !c.show_steps) progress.update(row, result.skipped);
    const SkipMonitor::Verdict v = monitor.observe(row.skipped);
    if (v.alert && !c.quiet) {
      progress.finish();
      out << "alert: skip rate " << 100.0 * v.rate << "% over the last "
          << std::min<int64_t>(s + 1, c.skip.window) << " steps is above " << 100.0 * c.skip.alert_rate << "%\n";
    }
    if (v.stop) {
      progress.finish();
      out << "belay: error: skip rate stayed above " << 100.0 * c.skip.max_rate << "% for " << c.skip.patience
          << " consecutive steps; stopping at step " << s << "\n";
      result.exit_code = 1;
      break;
    }
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  progress.finish();
  if (log) log->close();
  for (const Var& p : model->parameters())
    for (float v : p.master().to_vector()) result.final_weights.push_back(v);
  if (!c.quiet) {
    out << "done: " << result.rows.size() << " steps (" << result.rows.size() - result.skipped << " applied, "
        << result.skipped << " skipped) in " << result.seconds << " s; loss " << result.first_loss << " -> "
        << result.final_loss << "; final scale " << scaler.scale();
    if (!c.csv.empty()) out << "; log " << c.csv;
    out << "\n";
  }
  return result;
}

}  // namespace belay

#include "apps/run/accum_check.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <ostream>
#include <sstream>

#include "amp/dist/communicator.h"
#include "amp/safe_step.h"
#include "apps/run/dataset.h"
#include "apps/run/model_kinds.h"
#include "apps/run/trainer.h"
#include "autograd/modules.h"
#include "engine/atomic_file.h"
#include "engine/error.h"
#include "optim/adamw.h"

namespace belay {
namespace {

struct Outcome {
  std::vector<float> grads;   // every gradient before the step, flattened
  std::vector<float> params;  // every master after the step
};

// One effective step on a fresh model (same seed, so the same weights) over `batch`, split
// into `accum` micro-batches. `divide` = false reproduces the classic bug: each micro-batch's
// loss is not divided by accum_steps.
Outcome one_step(const AccumCheckConfig& c, const Batch& batch, int accum, bool divide) {
  TrainConfig m;  // the model as a training run builds it
  m.model = c.model;
  m.in_features = c.in_features;
  m.out_features = c.out_features;
  m.hidden = c.hidden;
  Rng rng(c.seed);
  std::unique_ptr<Module> model = make_model(m, rng, Device::cpu());
  AdamW opt(model->parameters(), AdamWOptions{1e-2f, 0.9f, 0.999f, 1e-8f, 0.01f, false});
  GradScaler scaler(Device::cpu(), GradScalerOptions{{}, false});
  SafeStep step(opt, scaler, LrSchedule::constant(1e-2f), SafeStepOptions{INFINITY, accum, true});
  Outcome o;
  step.after_backward = [&](int64_t, Optimizer& opt) {
    for (const Tensor* g : opt.grads())
      for (float v : g->to_vector()) o.grads.push_back(v);
  };
  const int64_t micro = c.batch / accum;
  step.run([&](int k) {
    Var loss = mse_loss((*model)(Var(batch.x.copy_rows(k * micro, (k + 1) * micro))),
                        batch.y.copy_rows(k * micro, (k + 1) * micro));
    return divide ? loss : scale(loss, static_cast<float>(accum));  // undo SafeStep's 1/accum
  });
  for (const Var& p : model->parameters())
    for (float v : p.master().to_vector()) o.params.push_back(v);
  return o;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0.0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs((double)a[i] - (double)b[i]));
  return m;
}

double max_abs(const std::vector<float>& a) {
  double m = 0.0;
  for (float v : a) m = std::max(m, std::fabs((double)v));
  return m;
}

}  // namespace

int run_accum_check(const AccumCheckConfig& c, std::ostream& out) {
  if (c.batch < 8 || c.batch % 4 != 0) throw UsageError("accum-check: --batch must be a multiple of 4, at least 8");
  if (c.in_features <= 0 || c.out_features <= 0 || c.hidden <= 0) throw UsageError("accum-check: sizes must be positive");
  // Accumulation is proved on rows of x and y (an MSE step): the kinds that train on them.
  const ModelKind* kind = find_model_kind(c.model);
  if (!kind || !takes_rows(*kind)) throw UsageError("unknown model '" + c.model + "': use " + model_kind_names(takes_rows));
  auto data = make_synthetic_regression(c.in_features, c.out_features, c.seed);
  const Batch batch = data->next(c.batch, Device::cpu());
  const int64_t q = c.batch / 4, h = c.batch / 2;
  const Outcome full = one_step(c, batch, 1, true);
  const Outcome by4 = one_step(c, batch, 4, true);
  const Outcome by2 = one_step(c, batch, 2, true);
  const Outcome wrong = one_step(c, batch, 4, false);

  char buf[256];
  out << "accum-check: " << c.model << " " << c.in_features << " -> " << c.out_features << ", batch " << c.batch
      << ", fp32, AdamW; bound " << c.bound << "\n";
  std::snprintf(buf, sizeof buf, "%-34s %18s %26s\n", "comparison", "max |grad diff|", "max |param diff| after step");
  out << buf;
  bool ok = true;
  auto line = [&](const std::string& what, const Outcome& a, const Outcome& b, bool checked) {
    const double g = max_abs_diff(a.grads, b.grads), p = max_abs_diff(a.params, b.params);
    const bool pass = g < c.bound && p < c.bound;
    if (checked) ok = ok && pass;
    std::snprintf(buf, sizeof buf, "%-34s %18.3e %26.3e  %s\n", what.c_str(), g, p,
                  checked ? (pass ? "ok" : "FAIL") : "(the bug, for comparison)");
    out << buf;
    return g;
  };
  line("4x" + std::to_string(q) + " accumulated vs 1x" + std::to_string(c.batch), by4, full, true);
  line("2x" + std::to_string(h) + " vs 4x" + std::to_string(q), by2, by4, true);
  const double wrong_g = line("4x" + std::to_string(q) + " without 1/accum_steps", wrong, full, false);
  std::snprintf(buf, sizeof buf,
                "without the division the gradient is %.2fx the full-batch one (accum_steps = 4): its error is "
                "%.3g, %.2fx the gradient's largest element\n",
                max_abs(wrong.grads) / max_abs(full.grads), wrong_g, wrong_g / max_abs(full.grads));
  out << buf;
  out << (ok ? "accum-check: passed\n" : "accum-check: FAILED, a difference is above the bound\n");
  return ok ? 0 : 1;
}

int run_sweep(const SweepConfig& s, std::ostream& out_all) {
  if (s.micro_batch <= 0) throw UsageError("sweep: --micro-batch must be positive");
  if (s.accum.empty()) throw UsageError("sweep: --accum needs at least one value");
  for (int64_t a : s.accum)
    if (a <= 0) throw UsageError("sweep: every --accum value must be positive, got " + std::to_string(a));
  const int world = s.base.world_size();
  const bool reporter = !s.base.comm || s.base.comm->rank() == 0;  // rank 0 prints and writes for all
  std::ostringstream quiet;
  std::ostream& out = reporter ? out_all : quiet;
  // Fail on an unwritable path before the work; every rank stops there, not only rank 0
  // (the others would wait for it in the first collective).
  std::string unwritable;
  if (reporter && !s.json.empty()) try {
      check_writable(s.json);
    } catch (const UsageError& e) {
      unwritable = e.what();
    }
  const int stop = s.base.comm ? s.base.comm->max_over_ranks(!unwritable.empty()) : !unwritable.empty();
  if (stop) throw UsageError(reporter ? unwritable : "sweep: rank 0 cannot write --json " + s.json);
  nlohmann::json points = nlohmann::json::array();
  char buf[200];
  out << "sweep: " << s.base.model << " " << dtype_name(s.base.dtype) << ", micro-batch " << s.micro_batch << ", ";
  if (world > 1) out << world << " ranks (batch = micro-batch x accum x ranks), ";
  out << s.base.steps << " steps per point\n";
  std::snprintf(buf, sizeof buf, "%6s %8s %16s %16s %11s %12s\n", "accum", "batch", "samples_per_sec", "median_step_ms",
                "sync_calls", "avg_loss");
  out << buf;
  for (int64_t a : s.accum) {
    TrainConfig c = s.base;
    c.micro_batch = s.micro_batch;
    c.batch = s.micro_batch * a * world;
    c.quiet = true;
    c.csv.clear();
    c.checkpoint.clear();
    std::ostringstream sink;
    const TrainResult r = Trainer(c, sink).run();
    std::vector<double> ms = r.step_ms;
    std::sort(ms.begin(), ms.end());
    const double median = ms.empty() ? 0.0 : ms[ms.size() / 2];
    double loss = 0.0;
    for (const StepRow& row : r.rows) loss += row.loss;
    loss /= std::max<size_t>(1, r.rows.size());
    // From the median step: the first steps (cold caches, first allocations) do not skew it.
    // With ranks: rank 0's step, which waits in the all-reduce for the slowest rank.
    const double sps = median > 0.0 ? static_cast<double>(c.batch) * 1000.0 / median : 0.0;
    points.push_back({{"accum", a}, {"batch", c.batch}, {"micro_batch", s.micro_batch}, {"ranks", world},
                      {"steps", r.rows.size()}, {"samples_per_sec", sps}, {"median_step_ms", median},
                      {"sync_calls", r.gradient_syncs}, {"gradient_bytes", r.gradient_bytes}, {"avg_loss", loss}});
    std::snprintf(buf, sizeof buf, "%6lld %8lld %16.1f %16.3f %11lld %12.6g\n", (long long)a, (long long)c.batch, sps,
                  median, (long long)r.gradient_syncs, loss);
    out << buf;
  }
  if (reporter && !s.json.empty()) {
    nlohmann::json doc = {{"model", s.base.model}, {"dtype", dtype_name(s.base.dtype)},
                          {"device", s.base.device}, {"micro_batch", s.micro_batch}, {"ranks", world},
                          {"steps", s.base.steps}, {"points", points}};
    write_file_atomically(s.json, doc.dump(2) + "\n");
    out << "wrote " << s.json << "\n";
  }
  return 0;
}

}  // namespace belay

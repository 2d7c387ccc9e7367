// Whole training steps at batch 256: Linear(4096 -> 4096) and an MLP 1024-2048-2048-1024
// (GELU), in fp32, bf16 and fp16 (FP32 masters and weight gradients, AdamW), with the
// safety belts (SafeStep: fused guard, global-norm clip at 1.0, loss scaling for fp16)
// and without (zero_grad, forward, backward, plain optimizer step). Reports samples/s, the
// belts' overhead, and the system allocations of a steady-state step (must be 0).
//
// Check: every loss is finite and the loss after the timed steps is below the first one.
#include <cmath>
#include <memory>

#include "amp/autocast.h"
#include "amp/safe_step.h"
#include "apps/run/dataset.h"
#include "autograd/modules.h"
#include "bench/sections.h"
#include "engine/allocator.h"
#include "engine/random.h"
#include "kernels/cpu/cpu_isa.h"
#include "optim/adamw.h"

namespace belay::bench {

namespace {

std::unique_ptr<Module> build(const TrainModel& m, Rng& rng) {
  if (m.layers == 1) return std::make_unique<Linear>(m.in, m.out, rng);
  return std::make_unique<Mlp>(m.in, m.hidden, m.out, rng, m.layers, Activation::Gelu);
}

// One model, optimizer and scaler, stepped with or without the belts.
struct Setup {
  const TrainModel& spec;
  DType dtype;
  bool belts;
  Rng rng{42};
  std::unique_ptr<Module> model;
  std::unique_ptr<AdamW> opt;
  std::unique_ptr<GradScaler> scaler;
  std::unique_ptr<SafeStep> step;
  Tensor x, y;
  std::vector<float> losses;

  Setup(const TrainModel& s, DType dt, bool with_belts) : spec(s), dtype(dt), belts(with_belts) {
    const int64_t batch = 256;
    model = build(spec, rng);
    model->set_working_dtype(dtype);
    model->set_grad_dtype(DType::F32);
    AdamWOptions ao;
    ao.lr = 1e-4f;
    ao.weight_decay = 0.01f;
    opt = std::make_unique<AdamW>(model->parameters(), ao);
    GradScalerOptions so;
    so.enabled = default_scaler_enabled(dtype);
    scaler = std::make_unique<GradScaler>(Device::cpu(), so);
    SafeStepOptions sso;
    sso.max_norm = 1.0f;
    step = std::make_unique<SafeStep>(*opt, *scaler, LrSchedule::constant(ao.lr), sso);
    x = Tensor::empty(Shape{batch, spec.in});
    y = Tensor::empty(Shape{batch, spec.out});
    for (int64_t i = 0; i < x.numel(); ++i) x.data_as<float>()[i] = rng.normal();
    for (int64_t i = 0; i < y.numel(); ++i) y.data_as<float>()[i] = 0.5f * rng.normal();
  }

  Var forward() {
    Autocast autocast(dtype, dtype != DType::F32);
    return mse_loss((*model)(Var(x)), y);
  }

  void one_step() {
    if (belts) {
      const StepRow row = step->run([&](int) { return forward(); });
      losses.push_back(row.loss);
    } else {
      opt->zero_grad(true);
      Var loss = forward();
      losses.push_back(loss.value().item());
      loss.backward();
      opt->step();
    }
  }

  Json row(const Timing& t, double allocs) const {
    for (float l : losses) require(std::isfinite(l), spec.name + ": a non-finite loss");
    require(losses.back() < losses.front(), spec.name + ": the loss did not go down");
    return Json{{"model", spec.name},
                {"params", model->parameter_count()},
                {"dtype", dtype_name(dtype)},
                {"belts", belts},
                {"time", to_json(t)},
                {"samples_per_s", 256 / (t.median_ms * 1e-3)},
                {"system_allocs_per_step", allocs},
                {"first_loss", losses.front()},
                {"last_loss", losses.back()}};
  }
};

}  // namespace

// The same configuration without and with the belts, stepped ALTERNATELY (plain, belted,
// plain, ...): drift on a shared machine then hits both alike, and the overhead is the
// ratio of two medians taken side by side rather than of two blocks minutes apart.
std::pair<Json, Json> train_pair(const TrainModel& spec, DType dtype, int warmup, int reps) {
  Setup plain(spec, dtype, false), belted(spec, dtype, true);
  for (int i = 0; i < warmup; ++i) {
    plain.one_step();
    belted.one_step();
  }
  std::vector<double> plain_ms, belted_ms;
  const AllocatorStats before = allocator_for(Device::cpu()).stats();
  for (int i = 0; i < reps; ++i) {
    double t0 = now_ms();
    plain.one_step();
    plain_ms.push_back(now_ms() - t0);
    t0 = now_ms();
    belted.one_step();
    belted_ms.push_back(now_ms() - t0);
  }
  const AllocatorStats after = allocator_for(Device::cpu()).stats();
  // System allocations of both setups together over 2 * reps steady-state steps.
  const double allocs = static_cast<double>(after.system_allocs - before.system_allocs) / (2.0 * reps);
  return {plain.row(summarize(plain_ms), allocs), belted.row(summarize(belted_ms), allocs)};
}

Json bench_train(const Options& o) {
  const std::vector<TrainModel> models = o.quick ? std::vector<TrainModel>{{"linear1024", 1024, 0, 1024, 1},
                                                                          {"mlp256-512-512-256", 256, 512, 256, 3}}
                                                 : std::vector<TrainModel>{{"linear4096", 4096, 0, 4096, 1},
                                                                          {"mlp1024-2048-2048-1024", 1024, 2048, 1024, 3}};
  Json rows = Json::array();
  for (const TrainModel& m : models)
    for (const DType dt : {DType::F32, DType::BF16, DType::F16}) {
      auto [plain, belted] = train_pair(m, dt, 2, o.quick ? 3 : 11);
      rows.push_back(plain);
      rows.push_back(belted);
    }
  return Json{{"threads", max_threads()}, {"batch", 256}, {"steps", rows}};
}

// The synthetic data (apps/run/dataset.cpp) against the step it feeds: on every ISA path of
// this CPU, one batch of Linear(4096)'s data (256 rows) and one belted step, alternated as
// in train_pair so that drift hits both alike. Aim: data <= 10% of the step on
// every path. Check: the data are finite and the step's losses too.
Json bench_data(const Options& o) {
  const TrainModel spec = o.quick ? TrainModel{"linear1024", 1024, 0, 1024, 1} : TrainModel{"linear4096", 4096, 0, 4096, 1};
  const int64_t batch = 256;
  const int reps = o.quick ? 3 : 7;
  const CpuIsa saved = active_cpu_isa();
  Json rows = Json::array();
  for (const CpuIsa isa : kAllCpuIsas) {
    if (!cpu_isa_available(isa)) continue;
    force_cpu_isa(isa);
    for (const DType dt : {DType::F32, DType::BF16, DType::F16}) {
      Setup step(spec, dt, true);
      const std::unique_ptr<Dataset> data = make_synthetic_regression(spec.in, spec.out, 1);
      step.one_step();
      data->next(batch, Device::cpu());
      std::vector<double> data_ms, step_ms;
      for (int i = 0; i < reps; ++i) {
        double t0 = now_ms();
        const Batch b = data->next(batch, Device::cpu());
        data_ms.push_back(now_ms() - t0);
        for (const float v : b.y.to_vector()) require(std::isfinite(v), "synthetic data: a non-finite target");
        t0 = now_ms();
        step.one_step();
        step_ms.push_back(now_ms() - t0);
      }
      for (float l : step.losses) require(std::isfinite(l), spec.name + ": a non-finite loss");
      const Timing d = summarize(data_ms), t = summarize(step_ms);
      rows.push_back(Json{{"isa", cpu_isa_name(isa)}, {"model", spec.name}, {"dtype", dtype_name(dt)},
                          {"data", to_json(d)}, {"step", to_json(t)}, {"data_over_step", d.median_ms / t.median_ms}});
    }
  }
  force_cpu_isa(saved);
  return Json{{"threads", max_threads()}, {"batch", batch}, {"rows", rows}};
}

}  // namespace belay::bench

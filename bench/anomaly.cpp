// What anomaly mode (autograd/anomaly.h, `belay train --detect-anomaly`) costs: the same
// training step with the belts (SafeStep, fp16 with loss scaling, bf16 without), timed
// alternately with and without a DetectAnomaly scope. Anomaly mode reads every op's output
// and every gradient on the host once more, so its cost is about one extra pass over all
// activations and gradients; on a GPU each read would also be a synchronisation.
//
// Check: anomaly mode only reads, so both setups (same seed, same data) give bit-identical
// losses step for step, all finite.
#include "autograd/anomaly.h"

#include <cstring>
#include <memory>

#include "amp/autocast.h"
#include "amp/safe_step.h"
#include "autograd/modules.h"
#include "bench/sections.h"
#include "optim/adamw.h"

namespace belay::bench {

namespace {

struct AnomalySetup {
  DType dtype;
  bool detect;
  Rng rng{7};
  std::unique_ptr<Module> model;
  std::unique_ptr<AdamW> opt;
  std::unique_ptr<GradScaler> scaler;
  std::unique_ptr<SafeStep> step;
  Tensor x, y;
  std::vector<float> losses;

  AnomalySetup(const TrainModel& m, DType dt, bool with_detect) : dtype(dt), detect(with_detect) {
    if (m.layers == 1)
      model = std::make_unique<Linear>(m.in, m.out, rng);
    else
      model = std::make_unique<Mlp>(m.in, m.hidden, m.out, rng, m.layers, Activation::Gelu);
    model->set_working_dtype(dtype);
    AdamWOptions ao;
    ao.lr = 1e-4f;
    opt = std::make_unique<AdamW>(model->parameters(), ao);
    GradScalerOptions so;
    so.enabled = default_scaler_enabled(dtype);
    scaler = std::make_unique<GradScaler>(Device::cpu(), so);
    SafeStepOptions sso;
    sso.max_norm = 1.0f;
    step = std::make_unique<SafeStep>(*opt, *scaler, LrSchedule::constant(ao.lr), sso);
    x = random_matrix(256, m.in, 1.0f, rng);
    y = random_matrix(256, m.out, 0.5f, rng);
  }

  void one_step() {
    std::unique_ptr<DetectAnomaly> scope;
    if (detect) scope = std::make_unique<DetectAnomaly>(scaler->enabled());
    const StepRow row = step->run([&](int) {
      Autocast autocast(dtype, dtype != DType::F32);
      return mse_loss((*model)(Var(x)), y);
    });
    losses.push_back(row.loss);
  }
};

}  // namespace

Json bench_anomaly(const Options& o) {
  const std::vector<TrainModel> models =
      o.quick
          ? std::vector<TrainModel>{{"linear1024", 1024, 0, 1024, 1}, {"mlp256-512-512-256", 256, 512, 256, 3}}
          : std::vector<TrainModel>{{"linear4096", 4096, 0, 4096, 1}, {"mlp1024-2048-2048-1024", 1024, 2048, 1024, 3}};
  Json rows = Json::array();
  for (const TrainModel& m : models)
    for (const DType dt : {DType::BF16, DType::F16}) {
      AnomalySetup plain(m, dt, false), checked(m, dt, true);
      const auto [t_plain, t_checked] = time_pair(
          2, o.quick ? 7 : 11, [&] { plain.one_step(); }, [&] { checked.one_step(); });
      require(plain.losses.size() == checked.losses.size(), m.name + ": step counts differ");
      for (size_t i = 0; i < plain.losses.size(); ++i) {
        require(std::isfinite(plain.losses[i]), m.name + ": a non-finite loss");
        require(std::memcmp(&plain.losses[i], &checked.losses[i], sizeof(float)) == 0,
                m.name + " " + dtype_name(dt) + ": anomaly mode changed a loss at step " + std::to_string(i));
      }
      rows.push_back(Json{{"model", m.name},
                          {"dtype", dtype_name(dt)},
                          {"plain", to_json(t_plain)},
                          {"anomaly", to_json(t_checked)},
                          {"ratio", t_checked.median_ms / t_plain.median_ms}});
    }
  return Json{{"batch", 256}, {"steps", rows}};
}

}  // namespace belay::bench

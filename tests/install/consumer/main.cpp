// Trains a Linear model in FP16 with dynamic loss scaling through the installed belay, and
// exits 0 only if the loss fell to under a tenth. Uses the headers as a user would.
#include <belay/amp/autocast.h>
#include <belay/amp/grad_scaler.h>
#include <belay/amp/safe_step.h>
#include <belay/autograd/modules.h>
#include <belay/optim/adamw.h>

#include <cstdio>
#include <vector>

int main() {
  belay::Rng rng(1);
  belay::Linear model(16, 4, rng);
  belay::AdamW opt(model.parameters(), {.lr = 5e-2f, .weight_decay = 0.0f});
  belay::GradScaler scaler(belay::Device::cpu(), {.enabled = true});
  belay::SafeStep step(opt, scaler, belay::LrSchedule::constant(5e-2f), {.max_norm = 1.0f});
  model.set_working_dtype(belay::DType::F16);  // the forward reads an FP16 copy of the FP32 masters

  // A fixed batch with targets from a random linear teacher: the loss can reach ~0.
  std::vector<float> xs(64 * 16), ys(64 * 4, 0.0f), teacher(4 * 16);
  for (float& t : teacher) t = rng.normal() * 0.5f;
  for (float& v : xs) v = rng.normal();
  for (int b = 0; b < 64; ++b)
    for (int o = 0; o < 4; ++o)
      for (int i = 0; i < 16; ++i) ys[b * 4 + o] += xs[b * 16 + i] * teacher[o * 16 + i];
  const belay::Var x(belay::Tensor::from_vector(xs, {64, 16}));
  const belay::Tensor y = belay::Tensor::from_vector(ys, {64, 4});

  float first = 0.0f, last = 0.0f;
  for (int s = 0; s < 60; ++s) {
    belay::StepRow row = step.run([&](int) {
      belay::Autocast fp16(belay::DType::F16);
      return belay::mse_loss(model(x), y);
    });
    if (s == 0) first = row.loss;
    last = row.loss;
    if (s % 20 == 0 || s == 59)
      std::printf("step %2d loss %.5f scale %g%s\n", s, row.loss, row.scaler_scale, row.skipped ? " SKIP" : "");
  }
  const bool ok = last < 0.1f * first;
  std::printf("consumer: loss %.5f -> %.5f: %s\n", first, last, ok ? "fell" : "did NOT fall enough");
  return ok ? 0 : 1;
}

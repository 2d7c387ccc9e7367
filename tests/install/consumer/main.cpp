// Trains a Linear model in FP16 with dynamic loss scaling through the installed belay, and
// exits 0 only if the loss fell to under a tenth and a checkpoint taken halfway, loaded
// into a fresh model, continues to the very same bits. Uses the headers as a user would.
#include <belay/amp/autocast.h>
#include <belay/amp/checkpoint.h>
#include <belay/amp/grad_scaler.h>
#include <belay/amp/safe_step.h>
#include <belay/autograd/modules.h>
#include <belay/optim/adamw.h>

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace {

// The whole state of one training loop: what a checkpoint saves and restores.
struct Loop {
  belay::Rng rng;
  belay::Linear model;
  belay::AdamW opt;
  belay::GradScaler scaler;
  belay::SafeStep step;

  explicit Loop(uint64_t seed)
      : rng(seed),
        model(16, 4, rng),
        opt(model.parameters(), {.lr = 5e-2f, .weight_decay = 0.0f}),
        scaler(belay::Device::cpu(), {.enabled = true}),
        step(opt, scaler, belay::LrSchedule::constant(5e-2f), {.max_norm = 1.0f}) {
    model.set_working_dtype(belay::DType::F16);  // the forward reads an FP16 copy of the FP32 masters
  }

  belay::StepRow train(const belay::Var& x, const belay::Tensor& y) {
    return step.run([&](int) {
      belay::Autocast fp16(belay::DType::F16);
      return belay::mse_loss(model(x), y);
    });
  }

  std::vector<float> weights() const {
    std::vector<float> w;
    for (const belay::Var& p : model.parameters())
      for (float v : p.master().to_vector()) w.push_back(v);
    return w;
  }
};

}  // namespace

int main() {
  // A fixed batch with targets from a random linear teacher: the loss can reach ~0.
  belay::Rng data(2);
  std::vector<float> xs(64 * 16), ys(64 * 4, 0.0f), teacher(4 * 16);
  for (float& t : teacher) t = data.normal() * 0.5f;
  for (float& v : xs) v = data.normal();
  for (int b = 0; b < 64; ++b)
    for (int o = 0; o < 4; ++o)
      for (int i = 0; i < 16; ++i) ys[b * 4 + o] += xs[b * 16 + i] * teacher[o * 16 + i];
  const belay::Var x(belay::Tensor::from_vector(xs, {64, 16}));
  const belay::Tensor y = belay::Tensor::from_vector(ys, {64, 4});

  const std::string path = "/tmp/belay_consumer_" + std::to_string(::getpid()) + ".safetensors";
  const std::map<std::string, std::string> settings{{"consumer", "fp16 linear"}};
  Loop run(1);
  float first = 0.0f, last = 0.0f;
  for (int s = 0; s < 60; ++s) {
    if (s == 30) {  // halfway: everything a bit-exact resume needs
      belay::RunState st;
      st.next_step = run.step.next_step();
      st.optimizer_steps = run.opt.step_count();
      st.scaler = run.scaler.state();
      st.settings = settings;
      belay::save_checkpoint(path, run.model, run.opt, st);
    }
    const belay::StepRow row = run.train(x, y);
    if (s == 0) first = row.loss;
    last = row.loss;
    if (s % 20 == 0 || s == 59)
      std::printf("step %2d loss %.5f scale %g%s\n", s, row.loss, row.scaler_scale, row.skipped ? " SKIP" : "");
  }
  const bool fell = last < 0.1f * first;
  std::printf("consumer: loss %.5f -> %.5f: %s\n", first, last, fell ? "fell" : "did NOT fall enough");

  // A fresh loop from other weights, loaded from the checkpoint, runs the last 30 steps.
  Loop resumed(7);
  const belay::RunState st = belay::load_checkpoint(path, resumed.model, resumed.opt, settings);
  resumed.scaler.load_state(st.scaler);
  resumed.step.set_next_step(st.next_step);
  while (resumed.step.next_step() < 60) resumed.train(x, y);
  std::remove(path.c_str());
  const std::vector<float> a = run.weights(), b = resumed.weights();
  const bool same = a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
  std::printf("consumer: checkpoint at step %lld, resumed to step 60: %s\n", static_cast<long long>(st.next_step),
              same ? "the same bits" : "DIFFERENT weights");
  return fell && same ? 0 : 1;
}

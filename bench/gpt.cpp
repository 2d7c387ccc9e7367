// gpt: the transformer at the shapes belay trains it.
//   block: one GptBlock's forward + backward (x [B T, D] -> y, then sum(y dy) backward: dx and
//          every parameter's gradient), fp32 and bf16 under autocast, at the default GPT's
//          shape (B 16, T 64, D 128, H 4) and GPT-2 small's (B 1, T 128, D 768, H 12);
//   step:  the whole training step of `belay train --model gpt`'s default model (2 layers,
//          width 128, 4 heads, context 64, vocab 256) at batch 16 and 32: zero_grad, forward
//          under autocast, cross-entropy, backward, SafeStep (guard, clip at 1.0, AdamW);
//          reported as ms and tokens/s; and (not with --quick) the same step of GPT-2 small
//          (12 layers, width 768, 12 heads, vocab 50304, the head tied) at batch 4 x 256, and
//          with --long at GPT-2's own context, batch 4 x 1024;
//   parts: the same blocks and steps again (GPT-2 small's step too, not with --quick) with
//          bench/timed_backend.h installed: the time of every backend call by part of the
//          step, and the rest (the autograd graph, allocation).
// fp16 is not run: this section's rows are compared with PyTorch (bench/peers/torch_gpt.py),
// and without AVX512-FP16 both widen fp16 like bf16 (belay in its GEMM packing, PyTorch in a
// reference path): the row would say nothing the bf16 one does not.
//
// Check (after timing): the block's loss is finite and the same bits at every repetition,
// dx and every gradient finite; the step's losses finite and the last below the first (one
// fixed batch, so the model must learn it).
#include <cmath>
#include <functional>
#include <memory>

#include "amp/autocast.h"
#include "amp/safe_step.h"
#include "autograd/gpt.h"
#include "bench/sections.h"
#include "bench/timed_backend.h"
#include "optim/adamw.h"

namespace belay::bench {
namespace {

struct BlockShape {
  const char* name;
  int64_t batch, tokens, width, heads;
};

Tensor normal_tensor(Shape s, Rng& rng) {
  Tensor t = Tensor::empty(s);
  for (int64_t i = 0; i < t.numel(); ++i) t.data_as<float>()[i] = rng.normal();
  return t;
}

void require_finite(const Tensor& t, const std::string& what) {
  for (float v : t.to_vector()) require(std::isfinite(v), what + " is not finite");
}

// One block, its input and the gradient of its output; run() is one forward + backward.
struct BlockRun {
  BlockShape s;
  DType dt;
  GptConfig c;
  Rng rng{7};
  std::unique_ptr<GptBlock> block;
  Tensor x, dy;
  Var xv;
  std::vector<float> losses;

  BlockRun(const BlockShape& shape, DType dtype) : s(shape), dt(dtype) {
    c.context = s.tokens, c.width = s.width, c.heads = s.heads;
    block = std::make_unique<GptBlock>(c, 0, rng, Device::cpu());
    block->set_working_dtype(dt);
    x = normal_tensor(Shape{s.batch * s.tokens, s.width}, rng);
    dy = normal_tensor(x.shape(), rng);
  }
  void run() {
    for (auto& [name, p] : block->named_parameters()) p.zero_grad(true);
    xv = Var(x, true);
    Var y;
    {
      Autocast autocast(dt, dt != DType::F32);
      y = block->forward(xv, s.batch, s.tokens);
    }
    const Var loss = sum(mul(y, Var(dy)));  // d loss / d y = dy
    loss.backward();
    losses.push_back(loss.value().item());
  }
  void check() const {
    const std::string what = std::string("gpt block ") + s.name + " " + dtype_name(dt);
    for (float l : losses) require(std::isfinite(l) && l == losses.front(), what + ": the loss moved or is not finite");
    require_finite(xv.grad(), what + ": dx");
    for (auto& [name, p] : block->named_parameters()) require_finite(p.grad(), what + ": the gradient of " + name);
  }
};

Json block_row(const BlockShape& s, DType dt, int warm, int reps) {
  BlockRun b(s, dt);
  const Timing t = time_it(warm, reps, [&] { b.run(); });
  b.check();
  const double tokens = static_cast<double>(s.batch * s.tokens);
  return Json{{"shape", s.name}, {"batch", s.batch},   {"tokens", s.tokens},
              {"width", s.width}, {"heads", s.heads},  {"dtype", dtype_name(dt)},
              {"time", to_json(t)}, {"tokens_per_s", tokens / (t.median_ms * 1e-3)}};
}

// A GPT (the default one, or GPT-2 small's shape), AdamW (PyTorch's defaults: lr 1e-3, weight
// decay 0.01 on every parameter) and SafeStep with clipping at 1.0, stepped on one fixed
// batch of random tokens.
struct GptStep {
  GptConfig config;
  int64_t batch;
  DType dtype;
  Rng rng{42};
  Gpt model{config, rng};
  std::unique_ptr<AdamW> opt;
  std::unique_ptr<GradScaler> scaler;
  std::unique_ptr<SafeStep> step;
  Tensor ids, labels;
  std::vector<float> losses;

  GptStep(const GptConfig& c, int64_t b, DType dt) : config(c), batch(b), dtype(dt) {
    model.set_working_dtype(dtype);
    model.set_grad_dtype(DType::F32);
    AdamWOptions ao;
    ao.decay_1d = true;  // as torch.optim.AdamW, which decays every parameter
    opt = std::make_unique<AdamW>(model.parameters(), ao);
    GradScalerOptions so;
    so.enabled = default_scaler_enabled(dtype);
    scaler = std::make_unique<GradScaler>(Device::cpu(), so);
    SafeStepOptions sso;
    sso.max_norm = 1.0f;
    step = std::make_unique<SafeStep>(*opt, *scaler, LrSchedule::constant(ao.lr), sso);
    ids = Tensor::empty(Shape{batch, config.context});
    labels = Tensor::empty(Shape{batch * config.context});
    for (int64_t i = 0; i < ids.numel(); ++i) {
      ids.data_as<float>()[i] = static_cast<float>(rng.next_u64() % config.vocab);
      labels.data_as<float>()[i] = static_cast<float>(rng.next_u64() % config.vocab);
    }
  }
  void one_step() {
    const StepRow row = step->run([&](int) {
      Autocast autocast(dtype, dtype != DType::F32);
      return cross_entropy(model(Var(ids)), labels);
    });
    losses.push_back(row.loss);
  }
  void check() const {
    const std::string what = std::string("gpt step ") + dtype_name(dtype) + " batch " + std::to_string(batch);
    for (float l : losses) require(std::isfinite(l), what + ": a non-finite loss");
    require(losses.back() < losses.front(), what + ": the loss did not go down");
  }
};

// The model of a step row: `belay train --model gpt`'s default, or GPT-2 small (124M
// parameters with its 50304-token vocabulary) at context 256 or (--long) 1024.
struct StepModel {
  const char* name;
  GptConfig config;
};
StepModel default_model() { return StepModel{"default", GptConfig{}}; }
StepModel gpt2_small(int64_t context = 256) {
  GptConfig c;
  c.vocab = 50304, c.context = context, c.width = 768, c.layers = 12, c.heads = 12;
  return StepModel{"gpt2-small", c};
}

Json step_row(const StepModel& m, int64_t batch, DType dt, int warm, int reps) {
  GptStep s(m.config, batch, dt);
  const Timing t = time_it(warm, reps, [&] { s.one_step(); });
  s.check();
  const double tokens = static_cast<double>(batch * s.config.context);
  return Json{{"model", m.name}, {"batch", batch}, {"context", s.config.context}, {"dtype", dtype_name(dt)},
              {"params", s.model.parameter_count()}, {"time", to_json(t)},
              {"tokens_per_s", tokens / (t.median_ms * 1e-3)}, {"first_loss", s.losses.front()},
              {"last_loss", s.losses.back()}};
}

// Where the time of `run` goes: every backend call timed (bench/timed_backend.h) over `reps`
// runs after one untimed run, and the runs' own time in the same loop; the rest = the runs
// minus the parts: belay's host work (graph, allocation, autocast bookkeeping). Times are
// sums over the runs (a median per part would not add up to the whole).
Json parts_of(const std::function<void()>& run, int reps, PartTimer& timer) {
  run();
  timer.totals() = PartTotals{};
  double run_ms = 0.0;
  for (int i = 0; i < reps; ++i) {
    const double t0 = now_ms();
    run();
    run_ms += now_ms() - t0;
  }
  const PartTotals& p = timer.totals();
  Json parts = Json::array();
  double sum = 0.0;
  for (size_t i = 0; i < p.ms.size(); ++i) {
    sum += p.ms[i];
    parts.push_back(Json{{"part", part_name(static_cast<Part>(i))}, {"ms_per_step", p.ms[i] / reps},
                         {"calls_per_step", static_cast<double>(p.calls[i]) / reps}, {"fraction", p.ms[i] / run_ms}});
  }
  parts.push_back(Json{{"part", "rest (autograd graph, allocation, host)"}, {"ms_per_step", (run_ms - sum) / reps},
                       {"calls_per_step", 0}, {"fraction", (run_ms - sum) / run_ms}});
  return Json{{"steps", reps}, {"step_ms", run_ms / reps}, {"parts", parts}};
}

Json step_parts(const StepModel& m, int64_t batch, DType dt, int reps) {
  PartTimer timer(now_ms);  // installed until the end of this scope
  GptStep s(m.config, batch, dt);
  Json out = parts_of([&] { s.one_step(); }, reps, timer);
  s.check();
  out["model"] = m.name;
  out["batch"] = batch;
  out["dtype"] = dtype_name(dt);
  return out;
}

Json block_parts(const BlockShape& shape, DType dt, int reps) {
  PartTimer timer(now_ms);
  BlockRun b(shape, dt);
  Json out = parts_of([&] { b.run(); }, reps, timer);
  b.check();
  out["shape"] = shape.name;
  out["dtype"] = dtype_name(dt);
  return out;
}

}  // namespace

Json bench_gpt(const Options& o) {
  const std::vector<BlockShape> shapes =
      o.quick ? std::vector<BlockShape>{{"gpt-default", 4, 32, 64, 4}}
              : std::vector<BlockShape>{{"gpt-default", 16, 64, 128, 4}, {"gpt2-small", 1, 128, 768, 12}};
  const int reps = o.quick ? 3 : 11;
  Json blocks = Json::array(), steps = Json::array(), parts = Json::array(), bparts = Json::array();
  for (const BlockShape& s : shapes)
    for (DType dt : {DType::F32, DType::BF16}) blocks.push_back(block_row(s, dt, 2, reps));
  for (const BlockShape& s : shapes)
    for (DType dt : {DType::F32, DType::BF16}) bparts.push_back(block_parts(s, dt, reps));
  for (int64_t batch : {int64_t{16}, int64_t{32}})
    for (DType dt : {DType::F32, DType::BF16}) steps.push_back(step_row(default_model(), batch, dt, 2, reps));
  if (!o.quick)  // seconds per step: one warm-up and 3 timed
    for (DType dt : {DType::F32, DType::BF16}) steps.push_back(step_row(gpt2_small(), 4, dt, 1, 3));
  if (o.long_rows)  // tens of seconds per step: one warm-up and 2 timed
    for (DType dt : {DType::F32, DType::BF16}) steps.push_back(step_row(gpt2_small(1024), 4, dt, 1, 2));
  for (int64_t batch : {int64_t{16}, int64_t{32}})
    for (DType dt : {DType::F32, DType::BF16}) parts.push_back(step_parts(default_model(), batch, dt, reps));
  if (!o.quick)
    for (DType dt : {DType::F32, DType::BF16}) parts.push_back(step_parts(gpt2_small(), 4, dt, 2));
  return Json{{"threads", max_threads()}, {"block", blocks}, {"step", steps}, {"step_parts", parts},
              {"block_parts", bparts}};
}

}  // namespace belay::bench

// The whole SafeStep on CUDA, as `belay train` drives it: enqueued steps with no blocking
// host read and no device allocation in steady state (docs/numerics.md: no host
// synchronisation anywhere in a training step, and no allocation once it runs steadily), rows
// that arrive asynchronously and match the same steps run on the CPU.
// Tolerance (fixed before the runs): both backends round the working copy and the
// activations to FP16 (eps 2^-10) and differ only in summation order, so over 13 steps of a
// Linear(16 -> 4) the loss and the norms agree within 1e-2 relative; skips and the scale are
// decided by injected infs and powers of two, so they agree exactly.
#include <cmath>
#include <vector>

#include "amp/autocast.h"
#include "amp/safe_step.h"
#include "autograd/modules.h"
#include "engine/allocator.h"
#include "optim/adamw.h"
#include "tests/gpu/gpu_test_util.h"

using namespace belay;
using namespace belay::test;

namespace {

struct DeviceRun {
  Device device;
  Rng rng{7};
  Linear model;
  AdamW opt;
  GradScaler scaler;
  SafeStep step;
  Tensor x, x_with_inf, y;

  DeviceRun(Device d, bool fused, ClipMode mode = ClipMode::Norm, float bound = 1.0f)
      : device(d),
        model(16, 4, rng, true, d),
        opt(model.parameters(), AdamWOptions{1e-2f, 0.9f, 0.999f, 1e-8f, 0.01f, false}),
        scaler(d, GradScalerOptions{}),
        step(opt, scaler, LrSchedule::constant(1e-2f), SafeStepOptions{bound, 2, fused, mode}) {
    model.set_working_dtype(DType::F16);
    x = Tensor::from_vector(random_values(8 * 16, 3), Shape{8, 16}, DType::F32, d);
    y = Tensor::from_vector(random_values(8 * 4, 4), Shape{8, 4}, DType::F32, d);
    x_with_inf = x.clone();  // made here, so that no step allocates it
    x_with_inf.set_element(5, INFINITY);
  }
  // Two micro-batches per step; step `inf_step` (counted from 0) gets an inf in its first
  // micro-batch's input, so that step is skipped on both backends.
  PendingStep enqueue(int index, int inf_step) {
    return step.enqueue([&, index, inf_step](int micro) {
      Autocast ac(DType::F16);
      const Tensor& in = index == inf_step && micro == 0 ? x_with_inf : x;
      return mse_loss(model(Var(in)), y);
    });
  }
};

}  // namespace

TEST_CASE("cuda SafeStep: enqueued steps read nothing back and allocate nothing, rows match the CPU",
          "[gpu][amp][step]") {
  BELAY_REQUIRE_GPU();
  for (bool fused : {true, false}) {
    CAPTURE(fused);
    DeviceRun gpu_run(Device::cuda(), fused), cpu_run(Device::cpu(), fused);
    constexpr int kWarm = 3, kSteps = 10, kInfStep = kWarm + 4;
    std::vector<StepRow> gpu_rows, cpu_rows;
    for (int s = 0; s < kWarm; ++s) gpu_rows.push_back(gpu_run.enqueue(s, kInfStep).row());

    const CachingAllocator& alloc = allocator_for(Device::cuda());
    const uint64_t allocs_before = alloc.stats().system_allocs;
    const uint64_t reads_before = blocking_host_reads();
    std::vector<PendingStep> pending;
    for (int s = kWarm; s < kWarm + kSteps; ++s) pending.push_back(gpu_run.enqueue(s, kInfStep));
    CHECK(blocking_host_reads() == reads_before);
    CHECK(alloc.stats().system_allocs == allocs_before);
    for (PendingStep& p : pending) gpu_rows.push_back(p.row());

    for (int s = 0; s < kWarm + kSteps; ++s) cpu_rows.push_back(cpu_run.enqueue(s, kInfStep).row());
    REQUIRE(gpu_rows.size() == cpu_rows.size());
    for (size_t s = 0; s < gpu_rows.size(); ++s) {
      INFO("step " << s);
      const StepRow &g = gpu_rows[s], &c = cpu_rows[s];
      CHECK(g.step == c.step);
      CHECK(g.skipped == c.skipped);
      CHECK(g.skip_reason == c.skip_reason);
      CHECK(g.scaler_scale == c.scaler_scale);
      CHECK(g.lr == c.lr);
      if (c.skipped) {
        CHECK(g.grad_l2_post_clip == 0.0f);
        continue;
      }
      check_close(std::vector<float>{g.loss, g.grad_l2_pre_clip, g.grad_l2_post_clip},
                  std::vector<double>{c.loss, c.grad_l2_pre_clip, c.grad_l2_post_clip}, Tolerance{1e-2, 0.0});
    }
    CHECK(gpu_rows[kInfStep].skipped);
    CHECK(gpu_rows[kInfStep].skip_reason == "nonfinite_loss");
  }
}

// --clip-mode value on CUDA: composed of backend ops both backends have (cast, clamp,
// multiply, sum, accumulate, guard), so the same tolerance as above holds for the norms and
// for the cosine between the raw and the clamped gradient (a ratio of those sums).
TEST_CASE("cuda SafeStep clipping by value: no host read, no allocation, rows and cosine match the CPU",
          "[gpu][amp][clip]") {
  BELAY_REQUIRE_GPU();
  DeviceRun gpu_run(Device::cuda(), false, ClipMode::Value, 0.02f), cpu_run(Device::cpu(), false, ClipMode::Value, 0.02f);
  constexpr int kWarm = 2, kSteps = 6, kInfStep = kWarm + 2;
  std::vector<StepRow> gpu_rows, cpu_rows;
  for (int s = 0; s < kWarm; ++s) gpu_rows.push_back(gpu_run.enqueue(s, kInfStep).row());
  const CachingAllocator& alloc = allocator_for(Device::cuda());
  const uint64_t allocs_before = alloc.stats().system_allocs;
  const uint64_t reads_before = blocking_host_reads();
  std::vector<PendingStep> pending;
  for (int s = kWarm; s < kWarm + kSteps; ++s) pending.push_back(gpu_run.enqueue(s, kInfStep));
  CHECK(blocking_host_reads() == reads_before);
  CHECK(alloc.stats().system_allocs == allocs_before);
  for (PendingStep& p : pending) gpu_rows.push_back(p.row());
  for (int s = 0; s < kWarm + kSteps; ++s) cpu_rows.push_back(cpu_run.enqueue(s, kInfStep).row());
  for (size_t s = 0; s < gpu_rows.size(); ++s) {
    INFO("step " << s);
    const StepRow &g = gpu_rows[s], &c = cpu_rows[s];
    CHECK(g.skipped == c.skipped);
    CHECK(g.scaler_scale == c.scaler_scale);
    if (c.skipped) continue;
    CHECK(c.grad_l2_post_clip < c.grad_l2_pre_clip);  // the bound clamps here
    CHECK(c.clip_cosine < 1.0f);
    check_close(std::vector<float>{g.loss, g.grad_l2_pre_clip, g.grad_l2_post_clip, g.clip_cosine},
                std::vector<double>{c.loss, c.grad_l2_pre_clip, c.grad_l2_post_clip, c.clip_cosine},
                Tolerance{1e-2, 0.0});
  }
  CHECK(gpu_rows[kInfStep].skipped);
}

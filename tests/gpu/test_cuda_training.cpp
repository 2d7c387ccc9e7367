// A 200-step training run on CUDA against the same run on the CPU (belay::run_training,
// the code the CLI runs): the same steps are skipped, the scaler takes the same values,
// and the loss follows the CPU's within a tolerance fixed here, before the runs:
//   fp32:          |loss_gpu - loss_cpu| <= 1e-3 * |loss_cpu|  at every step. Both runs
//                  are FP32; they differ only in summation order and FMA contraction
//                  (~1e-7 per operation), which 200 AdamW steps on this small, clipped
//                  regression do not amplify past 1e-3.
//   fp16 (scaler): 5e-2. Each step rounds the working copy and the activations to FP16
//                  (eps 2^-10); a one-ulp difference in a weight changes later losses by
//                  far less than 5 % on this problem.
//   bf16 (SGD, unfused clip): 1e-1, the same argument with eps 2^-7.
// Skips come from injected infs at fixed steps, so "skips at the same steps" is exact.
#include <sstream>

#include "apps/run/train.h"
#include "tests/gpu/gpu_test_util.h"

using namespace belay;
using namespace belay::test;

namespace {

void compare_runs(TrainConfig c, double rel) {
  c.quiet = true;
  c.steps = 200;
  c.inject_inf = {20, 100, 150};
  std::ostringstream sink;
  c.device = "cpu";
  const TrainResult cpu_run = run_training(c, sink);
  c.device = "cuda";
  const TrainResult gpu_run = run_training(c, sink);
  REQUIRE(cpu_run.rows.size() == 200);
  REQUIRE(gpu_run.rows.size() == cpu_run.rows.size());
  std::vector<float> gpu_loss;
  std::vector<double> cpu_loss;
  int64_t skips = 0;
  for (size_t s = 0; s < cpu_run.rows.size(); ++s) {
    const StepRow &g = gpu_run.rows[s], &r = cpu_run.rows[s];
    INFO("step " << s);
    CHECK(g.skipped == r.skipped);
    CHECK(g.skip_reason == r.skip_reason);
    CHECK(g.scaler_scale == r.scaler_scale);
    skips += r.skipped ? 1 : 0;
    gpu_loss.push_back(g.loss);
    cpu_loss.push_back(r.loss);
  }
  CHECK(skips >= 3);  // the injected ones at least
  check_close(gpu_loss, cpu_loss, Tolerance{rel, 0.0});
  // And it learned: the final loss is below the first on both.
  CHECK(gpu_run.final_loss < gpu_run.first_loss);
}

}  // namespace

TEST_CASE("cuda training, fp32 AdamW: follows the CPU run and skips at the same steps", "[gpu][train]") {
  BELAY_REQUIRE_GPU();
  TrainConfig c;
  c.model = "mlp";
  c.dtype = DType::F32;
  c.max_norm = 1.0f;
  compare_runs(c, 1e-3);
}

TEST_CASE("cuda training, fp16 AdamW with loss scaling: follows the CPU run", "[gpu][train]") {
  BELAY_REQUIRE_GPU();
  TrainConfig c;
  c.model = "mlp";
  c.dtype = DType::F16;
  c.max_norm = 1.0f;
  compare_runs(c, 5e-2);
}

TEST_CASE("cuda training, bf16 SGD with the unfused clip: follows the CPU run", "[gpu][train]") {
  BELAY_REQUIRE_GPU();
  TrainConfig c;
  c.model = "mlp";
  c.dtype = DType::BF16;
  c.optimizer = "sgd";
  c.lr = 1e-2f;
  c.fused = false;
  c.max_norm = 1.0f;
  compare_runs(c, 1e-1);
}

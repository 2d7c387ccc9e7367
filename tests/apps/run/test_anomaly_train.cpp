// `belay train --detect-anomaly` and `--fp32-ops` end to end: the first non-finite value of a
// run named by phase, op, module, step (and data row), scaler events that do not stop it, the
// op policy recorded in checkpoints and a resume under another one refused unless it is
// declared a new experiment.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <sstream>

#include "amp/autocast.h"
#include "amp/checkpoint.h"
#include "apps/run/train.h"
#include "engine/error.h"
#include "engine/safetensors.h"

using namespace belay;

namespace {
std::string tmp(const std::string& name) {
  return "/tmp/belay_anomaly_test_" + std::to_string(::getpid()) + "_" + name;
}

TrainConfig config(int64_t steps, DType dtype) {
  TrainConfig c;
  c.steps = steps;
  c.dtype = dtype;
  c.quiet = true;
  return c;
}

// Runs and returns the anomaly's report; fails the test when the run ends without one.
AnomalyReport anomaly_of(const TrainConfig& c) {
  std::ostringstream out;
  try {
    run_training(c, out);
  } catch (const AnomalyError& e) {
    return e.report();
  }
  FAIL("the run reported no anomaly");
  return {};
}

// A regression file: x [rows, in] all `x_value` (one NaN at nan_row if >= 0), y zeros.
std::string write_data(const std::string& name, int64_t rows, int64_t in, int64_t out, float x_value, int64_t nan_row) {
  std::vector<float> x(static_cast<size_t>(rows * in), x_value);
  if (nan_row >= 0) x[static_cast<size_t>(nan_row * in + 3)] = NAN;
  const std::string path = tmp(name);
  write_safetensors(path, {{"x", Tensor::from_vector(x, Shape{rows, in})}, {"y", Tensor::zeros(Shape{rows, out})}});
  return path;
}
}  // namespace

TEST_CASE("detect-anomaly: a NaN in the input data is reported with its step and data row", "[apps][anomaly]") {
  const std::string data = write_data("nan.safetensors", 64, 8, 2, 0.5f, 37);
  TrainConfig c = config(10, DType::F32);
  c.data = data;
  c.batch = 16;
  // Off: the file is refused at load, naming the row.
  std::ostringstream sink;
  CHECK_THROWS_WITH(run_training(c, sink), Catch::Contains("row 37"));
  c.detect_anomaly = true;
  const AnomalyReport r = anomaly_of(c);
  CHECK(r.phase == "input");
  CHECK(r.step == 2);  // rows 32..47
  CHECK(r.first_row == 5);
  CHECK(r.tensor == "x (data row 37)");
  CHECK(r.nans == 1);
  CHECK(r.infs == 0);
  std::remove(data.c_str());
}

TEST_CASE("detect-anomaly: an overflow in a hidden layer's forward names layers.1 linear", "[apps][anomaly]") {
  // x = 1, layers.0 weights 0.5 (no bias): 4 per hidden unit, GELU(4) ~ 4, and layers.1 with
  // weights 1e4 sums 16 of them: 6.4e5, past FP16's 65504. FP32 runs it (finite).
  const std::string data = write_data("ones.safetensors", 32, 8, 2, 1.0f, -1);
  const std::string init = tmp("init.safetensors");
  write_safetensors(init, {{"layers.0.weight", Tensor::full(Shape{16, 8}, 0.5f)},
                           {"layers.0.bias", Tensor::zeros(Shape{16})},
                           {"layers.1.weight", Tensor::full(Shape{2, 16}, 1e4f)},
                           {"layers.1.bias", Tensor::zeros(Shape{2})}});
  TrainConfig c = config(3, DType::F16);
  c.model = "mlp";
  c.hidden = 16;
  c.data = data;
  c.init = init;
  c.detect_anomaly = true;
  const AnomalyReport r = anomaly_of(c);
  CHECK(r.phase == "forward");
  CHECK(r.where() == "layers.1 linear");
  CHECK(r.step == 0);
  CHECK(r.dtype == "fp16");
  CHECK(r.shape == "[32, 2]");
  CHECK(r.infs == 64);
  SECTION("with --fp32-ops linear the same run is finite") {
    c.fp32_ops = parse_fp32_ops("linear");
    c.steps = 1;
    std::ostringstream out;
    CHECK_NOTHROW(run_training(c, out));
  }
  std::remove(data.c_str());
  std::remove(init.c_str());
}

TEST_CASE("detect-anomaly: an overflow in a backward, with loss scaling, a scaler event", "[apps][anomaly]") {
  // Targets x1e8 at step 3: the loss (FP32) is finite, its gradient 2 (pred - y) / N ~ 1e6
  // is written in FP16 by mse_loss's backward.
  TrainConfig c = config(8, DType::F16);
  c.spikes[3] = 1e8f;
  c.detect_anomaly = true;
  SECTION("no loss scaling: the run stops there") {
    c.scaler_explicit = true;
    c.scaler.enabled = false;
    const AnomalyReport r = anomaly_of(c);
    CHECK(r.phase == "backward");
    CHECK(r.where() == "mse_loss");
    CHECK(r.tensor == "gradient of input 0 (linear)");
    CHECK(r.step == 3);
    CHECK(r.dtype == "fp16");
    CHECK(r.infs > 0);
  }
  SECTION("loss scaling on: reported as a scaler event, the step skipped, the run goes on") {
    std::ostringstream out;
    const TrainResult res = run_training(c, out);
    REQUIRE(res.scaler_events.size() == 1);
    CHECK(res.scaler_events[0].step == 3);
    CHECK(res.scaler_events[0].where() == "mse_loss");
    CHECK(res.rows.size() == 8);
    CHECK(res.skipped == 1);
    CHECK(res.rows[3].skipped);
  }
  SECTION("off by default: no report, the step is skipped by the belts") {
    c.detect_anomaly = false;
    std::ostringstream out;
    const TrainResult res = run_training(c, out);
    CHECK(res.scaler_events.empty());
    CHECK(res.skipped == 1);
  }
}

TEST_CASE("detect-anomaly: a fault planted in a gradient buffer, and an optimizer result", "[apps][anomaly]") {
  SECTION("--inject-inf without loss scaling: the gradient buffer of the first parameter") {
    TrainConfig c = config(6, DType::BF16);
    c.inject_inf.insert(2);
    c.detect_anomaly = true;
    const AnomalyReport r = anomaly_of(c);
    CHECK(r.phase == "backward");
    CHECK(r.op == "gradient buffer");
    CHECK(r.tensor == "gradient of weight");
    CHECK(r.step == 2);
  }
  SECTION("an SGD step of lr 1e7 writes FP16 working copies past 65504") {
    TrainConfig c = config(4, DType::F16);
    c.optimizer = "sgd";
    c.momentum = 0.0f;
    c.lr = 1e7f;
    c.scaler_explicit = true;
    c.scaler.enabled = false;
    c.detect_anomaly = true;
    const AnomalyReport r = anomaly_of(c);
    CHECK(r.phase == "optimizer");
    CHECK(r.op == "sgd");
    CHECK(r.tensor.rfind("working copy ", 0) == 0);
    CHECK(r.step == 0);
  }
}

TEST_CASE("fp32-ops: recorded in the checkpoint, resuming under another policy needs --new-experiment",
          "[apps][anomaly][checkpoint]") {
  const std::string ckpt = tmp("policy.safetensors"), ckpt2 = tmp("policy2.safetensors");
  TrainConfig c = config(10, DType::F16);
  c.model = "mlp";
  c.stop_at = 4;
  c.checkpoint = ckpt;
  std::ostringstream out;
  run_training(c, out);
  CHECK(checkpoint_setting(ckpt, "fp32_ops") == "none");

  TrainConfig r = c;
  r.stop_at = -1;
  r.resume = ckpt;
  r.checkpoint = ckpt2;
  r.fp32_ops = parse_fp32_ops("gelu");
  CHECK_THROWS_WITH(run_training(r, out), Catch::Contains("--new-experiment") && Catch::Contains("fp32-ops none"));
  r.new_experiment = true;
  const TrainResult res = run_training(r, out);
  CHECK(res.rows.size() == 6);
  CHECK(checkpoint_setting(ckpt2, "fp32_ops") == "gelu");
  const SafetensorsFile f = read_safetensors(ckpt2);
  CHECK_THAT(f.meta("experiment"),
             Catch::Contains("new experiment at step 4") && Catch::Contains("fp32_ops none -> gelu"));
  // The new checkpoint resumes under its own policy without the flag.
  TrainConfig again = r;
  again.new_experiment = false;
  again.resume = ckpt2;
  again.steps = 12;
  CHECK_NOTHROW(run_training(again, out));
  std::remove(ckpt.c_str());
  std::remove(ckpt2.c_str());
}

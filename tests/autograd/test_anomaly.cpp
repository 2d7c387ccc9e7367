// Anomaly mode names the first non-finite value: the op and module that produced it, in
// forward or backward, and is silent where every value is finite. With scaled gradients, an
// overflow in backward is a scaler event instead. Off by default.
#include <catch2/catch.hpp>
#include <cmath>
#include <map>
#include <string>

#include "amp/autocast.h"
#include "autograd/anomaly.h"
#include "autograd/modules.h"
#include "tolerance.h"

using namespace belay;
using belay::test::check_close;
using belay::test::tolerance_for;

namespace {
void set_param(const Var& p, float value) {
  const_cast<Tensor&>(p.master()).fill(value);
  Var(p).set_working_dtype(DType::F32);
}
std::map<std::string, Var> params_of(const Module& m) {
  std::map<std::string, Var> out;
  for (auto& [name, p] : m.named_parameters()) out[name] = p;
  return out;
}
// An MLP 4 -> 8 -> 3 on x = 1: layers.0 gives 2 (weights 0.5, no bias), GELU ~1.95, and
// layers.1 sums 8 of them times `w1`: 1e4 makes 1.6e5 (past FP16's 65504), 1e3 makes 1.6e4.
Mlp planted_mlp(float w1) {
  Rng rng(1);
  Mlp m(4, 8, 3, rng, 2, Activation::Gelu);
  auto p = params_of(m);
  set_param(p["layers.0.weight"], 0.5f);
  set_param(p["layers.0.bias"], 0.0f);
  set_param(p["layers.1.weight"], w1);
  set_param(p["layers.1.bias"], 0.0f);
  return m;
}
Tensor ones() { return Tensor::full(Shape{2, 4}, 1.0f); }
}  // namespace

TEST_CASE("anomaly: an overflow in a hidden layer's forward names layers.1 linear", "[autograd][anomaly]") {
  Mlp m = planted_mlp(1e4f);
  DetectAnomaly detect;
  detect.set_step(7);
  Autocast fp16(DType::F16);
  try {
    (void)m(Var(ones()));
    FAIL("no anomaly reported");
  } catch (const AnomalyError& e) {
    const AnomalyReport& r = e.report();
    CHECK(r.phase == "forward");
    CHECK(r.where() == "layers.1 linear");
    CHECK(r.tensor == "output");
    CHECK(r.shape == "[2, 3]");
    CHECK(r.dtype == "fp16");
    CHECK(r.infs == 6);
    CHECK(r.nans == 0);
    CHECK(r.step == 7);
    // Its inputs: the GELU output (~1.95) and the weight, 1e4 exactly in FP16.
    check_close({static_cast<float>(r.max_abs_input)}, {1e4}, tolerance_for(DType::F16, DType::F16));
    CHECK(r.input_nonfinite == 0);
  }
}

TEST_CASE("anomaly: the same model in FP32, or with --fp32-ops linear, reports nothing", "[autograd][anomaly]") {
  Mlp m = planted_mlp(1e4f);
  DetectAnomaly detect;
  {
    const Var y = m(Var(ones()));  // FP32: 1.6e5 is finite
    for (float v : y.value().to_vector()) CHECK((std::isfinite(v) && v > 65504.0f));
  }
  Autocast fp16(DType::F16, true, parse_fp32_ops("linear"));
  const Var y = m(Var(ones()));
  CHECK(y.dtype() == DType::F32);
}

TEST_CASE("anomaly: an overflow in a backward names the op whose backward made it", "[autograd][anomaly]") {
  // Forward is finite (1.6e4); d(100 * sum)/d(out) = 100, and layers.1's dX = dY W sums
  // 3 * 100 * 1e3 = 3e5 per element: past FP16's range, in layers.1 linear's backward.
  Mlp m = planted_mlp(1e3f);
  SECTION("without loss scaling: an anomaly") {
    DetectAnomaly detect;
    Autocast fp16(DType::F16);
    const Var loss = scale(sum(m(Var(ones()))), 100.0f);
    try {
      loss.backward();
      FAIL("no anomaly reported");
    } catch (const AnomalyError& e) {
      const AnomalyReport& r = e.report();
      CHECK(r.phase == "backward");
      CHECK(r.where() == "layers.1 linear");
      CHECK(r.tensor == "gradient of input 0 (gelu)");
      CHECK(r.shape == "[2, 8]");
      CHECK(r.dtype == "fp16");
      CHECK(r.infs == 16);
      check_close({static_cast<float>(r.max_abs_input)}, {1e3}, tolerance_for(DType::F16, DType::F16));
    }
  }
  SECTION("with scaled gradients: a scaler event, recorded once, and backward goes on") {
    DetectAnomaly detect(true);
    Autocast fp16(DType::F16);
    const Var loss = scale(sum(m(Var(ones()))), 100.0f);
    loss.backward();
    REQUIRE(detect.scaler_events().size() == 1);
    CHECK(detect.scaler_events()[0].scaler_event);
    CHECK(detect.scaler_events()[0].where() == "layers.1 linear");
  }
  SECTION("outside a DetectAnomaly scope nothing is checked") {
    Autocast fp16(DType::F16);
    const Var loss = scale(sum(m(Var(ones()))), 100.0f);
    CHECK_NOTHROW(loss.backward());
    CHECK_FALSE(anomaly_mode_enabled());
  }
}

TEST_CASE("anomaly: a gradient a scale op's backward overflows, at the top level", "[autograd][anomaly]") {
  // scale(x, 1e5) of zeros is finite; its backward multiplies FP16 ones by 1e5.
  const Var x(Tensor::zeros(Shape{2, 3}, DType::F16), true);
  DetectAnomaly detect;
  const Var loss = sum(scale(x, 1e5f));
  try {
    loss.backward();
    FAIL("no anomaly reported");
  } catch (const AnomalyError& e) {
    CHECK(e.report().phase == "backward");
    CHECK(e.report().where() == "scale");
    CHECK(e.report().tensor == "gradient of input 0 (leaf)");
    CHECK(e.report().infs == 6);
  }
}

TEST_CASE("anomaly: a NaN reaching an op is reported at the loss, and check_finite names the row",
          "[autograd][anomaly]") {
  DetectAnomaly detect;
  std::vector<float> v(12, 0.5f);
  v[7] = NAN;  // row 2 of a [4, 3] tensor
  const Tensor t = Tensor::from_vector(v, Shape{4, 3});
  try {
    check_finite("input", "batch", "", "x", t, 100);
    FAIL("no anomaly reported");
  } catch (const AnomalyError& e) {
    CHECK(e.report().phase == "input");
    CHECK(e.report().nans == 1);
    CHECK(e.report().first_index == 7);
    CHECK(e.report().first_row == 102);
  }
  // A loss op's output is the "loss" phase.
  const Var pred(Tensor::full(Shape{4, 3}, 1.0f), true);
  try {
    (void)mse_loss(pred, t);
    FAIL("no anomaly reported");
  } catch (const AnomalyError& e) {
    CHECK(e.report().phase == "loss");
    CHECK(e.report().op == "mse_loss");
    CHECK(e.report().input_nonfinite == 0);  // the target is not an input of the graph
  }
}

TEST_CASE("anomaly: the transformer's ops are named with their module paths", "[autograd][anomaly][transformer]") {
  // An embedding table whose FP16 working copy overflowed (a master of 1e5): its output is the
  // first non-finite value of the forward, at "wte embedding" (the table itself is a leaf).
  Rng rng(3);
  Embedding wte(6, 4, rng, Device::cpu(), "wte.");
  const_cast<Tensor&>(wte.weight.master()).set_element(9, 1e5f);  // row 2
  wte.set_working_dtype(DType::F16);
  const Var ids(Tensor::from_vector({0, 2, 5}, Shape{3}));
  {
    DetectAnomaly detect;
    try {
      (void)wte(ids);
      FAIL("no anomaly reported");
    } catch (const AnomalyError& e) {
      CHECK(e.report().phase == "forward");
      CHECK(e.report().where() == "wte embedding");
      CHECK(e.report().first_row == 1);
      CHECK(e.report().input_nonfinite == 1);
    }
  }
  // LayerNorm of a nearly constant row (variance ~2e-7, eps 0: rstd ~2300) times an upstream
  // gradient of 100 on one element gives dx ~ 1.6e5: past FP16's range in the backward, at "blocks.0.ln_1 layer_norm".
  LayerNorm ln(4, 0.0f, Device::cpu(), "blocks.0.ln_1.");
  Var x(Tensor::from_vector({1.0f, 1.0f, 1.0f, 1.0f + 1.0f / 1024}, Shape{1, 4}, DType::F16), true);
  DetectAnomaly detect;
  const Var y = ln(x);  // finite: xhat is at most sqrt(3)
  CHECK(y.dtype() == DType::F16);
  try {
    sum(mul(y, Var(Tensor::from_vector({100, 0, 0, 0}, Shape{1, 4}, DType::F16)))).backward();
    FAIL("no anomaly reported");
  } catch (const AnomalyError& e) {
    CHECK(e.report().phase == "backward");
    CHECK(e.report().where() == "blocks.0.ln_1 layer_norm");
    CHECK(e.report().dtype == "fp16");
  }
}

TEST_CASE("anomaly: attention scores that overflow FP16 are named at bmm, --fp32-ops bmm keeps them finite",
          "[autograd][anomaly][bmm]") {
  // q k^T of rows of 300s over d = 2: 180000 per score, past FP16's 65504 under autocast.
  const Var q(Tensor::full(Shape{1, 2, 3, 2}, 300.0f), true);
  DetectAnomaly detect;
  {
    Autocast fp16(DType::F16);
    try {
      (void)bmm(q, q, false, true);
      FAIL("no anomaly reported");
    } catch (const AnomalyError& e) {
      CHECK(e.report().phase == "forward");
      CHECK(e.report().where() == "bmm");
      CHECK(e.report().infs == 18);
    }
  }
  Autocast kept(DType::F16, true, parse_fp32_ops("bmm"));
  const Var s = bmm(q, q, false, true);
  CHECK(s.dtype() == DType::F32);
  CHECK(s.value().to_vector() == std::vector<float>(18, 180000.0f));
}

TEST_CASE("anomaly: scores of 1e5 under FP16: the fused op's stay FP32 inside the kernel, the naive path's "
          "overflow at bmm", "[autograd][anomaly][attention]") {
  // q.k = 4 * 160^2 = 102400 per score: beyond FP16's 65504, while q, k and v are FP16 values.
  const Var q(Tensor::full(Shape{1, 2, 3, 4}, 160.0f), true);
  std::vector<float> vv(24);
  for (size_t i = 0; i < vv.size(); ++i) vv[i] = static_cast<float>(i % 5) - 2.0f;
  const Var v(Tensor::from_vector(vv, Shape{1, 2, 3, 4}), true);
  DetectAnomaly detect;
  Autocast fp16(DType::F16);
  const Var y = attention(q, q, v, true, 1.0f);  // equal scores: each row the mean of its visible v rows
  CHECK(y.dtype() == DType::F16);
  const std::vector<float> got = y.value().to_vector();
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t i = 0; i < 3; ++i)
      for (int64_t c = 0; c < 4; ++c) {
        double mean = 0.0;
        for (int64_t j = 0; j <= i; ++j) mean += vv[(h * 3 + j) * 4 + c];
        CHECK(std::fabs(got[(h * 3 + i) * 4 + c] - mean / (i + 1)) <= belay::test::unit_roundoff(DType::F16) * std::fabs(mean / (i + 1)) + 1e-6);
      }
  sum(y).backward();  // finite gradients: no anomaly in the backward either
  try {
    (void)bmm(softmax(scale(bmm(q, q, false, true), 1.0f), true), v);
    FAIL("no anomaly reported");
  } catch (const AnomalyError& e) {
    CHECK(e.report().phase == "forward");
    CHECK(e.report().where() == "bmm");
  }
}

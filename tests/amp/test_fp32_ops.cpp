// --fp32-ops: autocast left off around one op class. The op then reads FP32 inputs and gives
// what the FP32 op gives; the others keep the low dtype; names parse or fail clearly.
// The policy table (amp/autocast.cpp): every op class has one row, both dtypes' rules and a
// reason; and the hazard the table is for: an FP16 softmax of logits beyond FP16's range is
// NaN, which the table's FP32 rule prevents and which, with the rule turned off (low_ops),
// anomaly mode reports naming the op. (One file: each Catch2 file costs CI ~20 s to compile.)
#include <catch2/catch.hpp>

#include <cmath>
#include <set>
#include <string>

#include "amp/autocast.h"
#include "autograd/anomaly.h"
#include "autograd/modules.h"
#include "engine/error.h"
#include "tolerance.h"

using namespace belay;
using belay::test::check_close;
using belay::test::tolerance_for;

TEST_CASE("fp32-ops: names parse to a mask and back in a canonical order", "[amp][autocast]") {
  CHECK(parse_fp32_ops("") == 0u);
  const uint32_t m = parse_fp32_ops("gelu,linear");
  CHECK(m == (static_cast<uint32_t>(OpClass::Linear) | static_cast<uint32_t>(OpClass::Gelu)));
  CHECK(fp32_ops_names(m) == "linear,gelu");
  CHECK_THROWS_AS(parse_fp32_ops("conv"), UsageError);
  CHECK_THROWS_AS(parse_fp32_ops("linear,"), UsageError);
  CHECK_THROWS_WITH(parse_fp32_ops("lin"), Catch::Contains("known: linear, matmul"));
}

TEST_CASE("fp32-ops: a kept class runs in FP32 under autocast, the rest in the low dtype", "[amp][autocast]") {
  Rng rng(3);
  Mlp m(16, 32, 4, rng, 2, Activation::Gelu);
  std::vector<float> xv(8 * 16);
  for (float& v : xv) v = rng.normal();
  const Var x(Tensor::from_vector(xv, Shape{8, 16}));
  const std::vector<float> ref = m(x).value().to_vector();  // FP32
  std::vector<double> ref64(ref.begin(), ref.end());
  for (DType dt : {DType::F16, DType::BF16}) {
    {
      Autocast ac(dt, true, parse_fp32_ops("linear"));
      const Var y = m(x);
      CHECK(y.dtype() == DType::F32);  // the last op is a linear kept in FP32
      // An activation runs in its input's dtype, so with the linears kept nothing is rounded
      // to dt: the FP32 model's products, within FP32's bound for 32-term sums.
      check_close(y.value().to_vector(), ref64, tolerance_for(DType::F32, DType::F32, 32), {});
    }
    {
      Autocast ac(dt, true, parse_fp32_ops("gelu"));
      const Var y = m(x);
      CHECK(y.dtype() == dt);  // the linears still run in dt
    }
    {
      Autocast ac(dt, true, 0);
      CHECK(m(x).dtype() == dt);
    }
  }
  // Without autocast the mask means nothing: no autocast, no cast.
  AutocastPolicy& p = autocast_policy();
  CHECK_FALSE(p.enabled);
  CHECK_FALSE(autocast_keeps_fp32(OpClass::Linear));
}

TEST_CASE("autocast runs exp, log, pow, softmax, log_softmax, sum and mean in FP32, tanh as given", "[amp][autocast]") {
  const Var x(Tensor::from_vector({0.5f, 1.0f, 2.0f, 3.0f}, Shape{2, 2}, DType::F16));
  Autocast ac(DType::F16);
  for (const Var& y : {exp(x), log(x), pow(x, 2.0f), softmax(x), log_softmax(x), sum(x, 0), mean(x, 1)})
    CHECK(y.dtype() == DType::F32);
  CHECK(tanh(x).dtype() == DType::F16);
  CHECK(sigmoid(x).dtype() == DType::F16);
  CHECK(sub(x, x).dtype() == DType::F16);
  {
    Autocast kept(DType::F16, true, parse_fp32_ops("tanh,div"));
    CHECK(tanh(x).dtype() == DType::F32);
    CHECK(div(x, x).dtype() == DType::F32);
  }
  // exp(11.5) overflows FP16 (max 65504): under autocast it is 98715.8 in FP32.
  const Var big(Tensor::from_vector({11.5f}, Shape{1}, DType::F16));
  check_close(exp(big).value().to_vector(), {std::exp(11.5)}, tolerance_for(DType::F32, DType::F32, 4), {});
  CHECK(fp32_ops_names(parse_fp32_ops("softmax,sum")) == "softmax,sum");
}

TEST_CASE("autocast table: one row per op class, each with its rules and a reason", "[amp][autocast]") {
  size_t n = 0;
  const AutocastEntry* table = autocast_table(&n);
  std::set<uint32_t> seen;
  uint32_t prev = 0;
  for (size_t i = 0; i < n; ++i) {
    const uint32_t bit = static_cast<uint32_t>(table[i].op);
    INFO(table[i].name);
    CHECK(seen.insert(bit).second);
    CHECK(bit > prev);  // in OpClass order: fp32_ops_names' canonical order
    prev = bit;
    CHECK(std::string(table[i].why).size() > 10);
    CHECK(parse_fp32_ops(table[i].name) == bit);
  }
  CHECK(seen.size() == 24);  // linear ... mean, embedding, layer_norm, bmm, attention
  CHECK(fp32_ops_names(parse_fp32_ops("layer_norm,embedding")) == "embedding,layer_norm");
  CHECK(std::string(autocast_rule_name(AutocastRule::Fp32)) == "fp32");
  Autocast fp16(DType::F16);
  CHECK(autocast_rule(OpClass::Matmul) == AutocastRule::LowPrecision);
  CHECK(autocast_rule(OpClass::Softmax) == AutocastRule::Fp32);
  CHECK(autocast_rule(OpClass::LayerNorm) == AutocastRule::AsGiven);
  CHECK(autocast_rule(OpClass::Embedding) == AutocastRule::AsGiven);
  CHECK(autocast_rule(OpClass::Bmm) == AutocastRule::LowPrecision);
  CHECK(autocast_rule(OpClass::Attention) == AutocastRule::LowPrecision);
  {
    Autocast kept(DType::F16, true, parse_fp32_ops("layer_norm"), parse_fp32_ops("softmax,layer_norm"));
    CHECK(autocast_rule(OpClass::LayerNorm) == AutocastRule::Fp32);  // fp32_ops wins
    CHECK(autocast_rule(OpClass::Softmax) == AutocastRule::LowPrecision);
  }
}

namespace {
// Attention scores of a badly scaled model: FP32 logits up to 9e4, past FP16's 65504
// (row 0's largest is 9e4, row 1's -7e4 ... 7e4).
Var big_logits() {
  return Var(Tensor::from_vector({9e4f, 8.99e4f, 1.0f, -5.0f, -7e4f, 0.0f, 7e4f, 6.99e4f}, Shape{2, 4}), true);
}
}  // namespace

TEST_CASE("fp16 hazard: softmax of logits beyond 65504 is right under the table, NaN without it",
          "[amp][autocast][anomaly]") {
  // FP64 reference: exp(x - max) / sum, the gradient of sum(y * r) for r = (1, 2, 3, 4).
  const std::vector<float> xv = big_logits().value().to_vector();
  std::vector<double> ref(8), gref(8);
  for (int r = 0; r < 2; ++r) {
    double mx = -INFINITY, z = 0.0, s = 0.0;
    for (int c = 0; c < 4; ++c) mx = std::max(mx, double(xv[r * 4 + c]));
    for (int c = 0; c < 4; ++c) z += std::exp(xv[r * 4 + c] - mx);
    for (int c = 0; c < 4; ++c) ref[r * 4 + c] = std::exp(xv[r * 4 + c] - mx) / z;
    for (int c = 0; c < 4; ++c) s += ref[r * 4 + c] * (c + 1);
    for (int c = 0; c < 4; ++c) gref[r * 4 + c] = ref[r * 4 + c] * ((c + 1) - s);
  }
  const Tensor weights = Tensor::from_vector({1, 2, 3, 4, 1, 2, 3, 4}, Shape{2, 4});
  {
    Autocast fp16(DType::F16);  // the table: softmax in FP32
    DetectAnomaly detect;       // and nothing to report
    Var x = big_logits();
    const Var y = softmax(x);
    CHECK(y.dtype() == DType::F32);
    check_close(y.value().to_vector(), ref, tolerance_for(DType::F32, DType::F32, 16));
    sum(mul(y, Var(weights))).backward();
    check_close(x.grad().to_vector(), gref, tolerance_for(DType::F32, DType::F32, 3), std::vector<double>(8, 4.0));
  }
  {
    // The rule turned off for softmax: it runs in FP16, its input cast to FP16 overflows to
    // inf, and inf - inf is NaN. Silent without anomaly mode...
    Autocast fp16(DType::F16, true, 0, parse_fp32_ops("softmax"));
    const Var y = softmax(big_logits());
    CHECK(y.dtype() == DType::F16);
    int nans = 0;
    for (float v : y.value().to_vector()) nans += std::isnan(v);
    CHECK(nans == 8);
    // ... loud with it, naming the op that asked for the FP16 copy.
    DetectAnomaly detect;
    try {
      (void)softmax(big_logits());
      FAIL("no anomaly reported");
    } catch (const AnomalyError& e) {
      const AnomalyReport& r = e.report();
      CHECK(r.phase == "forward");
      CHECK(r.op == "cast for softmax");
      CHECK(r.dtype == "fp16");
      CHECK(r.infs == 5);  // all but 1, -5 and 0: FP16 rounds from 65520 up to inf
      CHECK(r.max_abs_input == 9e4);
      CHECK_THAT(e.what(), Catch::Contains("cast for softmax"));
    }
  }
}

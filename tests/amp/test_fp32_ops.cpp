// --fp32-ops: autocast left off around one op class. The op then reads FP32 inputs and gives
// what the FP32 op gives; the others keep the low dtype; names parse or fail clearly.
#include <catch2/catch.hpp>

#include <cmath>

#include "amp/autocast.h"
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

TEST_CASE("autocast runs exp, log, pow, softmax, log_softmax, sum and mean in FP32; tanh as given", "[amp][autocast]") {
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

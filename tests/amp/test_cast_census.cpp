// The census of the casts (autograd/cast_census.h) through SafeStep: the forward's autocast
// casts and the weights' working copies counted per site, the roundings into FP16/BF16 gradient
// buffers counted into the guard census's underflow column, each against a plain count; and a
// run that takes the census keeps every bit of the run that does not.
#include <catch2/catch.hpp>

#include <cmath>
#include <map>

#include "tests/amp/two_layers.h"
#include "tests/kernels/census_case.h"

using namespace belay;
using belay::test::bits_of;
using belay::test::TwoLayers;

namespace {

std::map<std::string, TensorCensus> by_name(const std::vector<TensorCensus>& census) {
  std::map<std::string, TensorCensus> out;
  for (const TensorCensus& c : census) out[c.name] = c;
  return out;
}

}  // namespace

TEST_CASE("cast census: a step that takes it keeps every bit of the step that does not", "[amp][census]") {
  for (const DType dt : {DType::F16, DType::BF16})
    for (const DType grads : {DType::F32, dt})
      for (const int accum : {1, 2}) {
        INFO(dtype_name(dt) << ", gradients " << dtype_name(grads) << ", " << accum << " micro-batches");
        TwoLayers with(dt, grads, accum, true), without(dt, grads, accum, false);
        for (int s = 0; s < 3; ++s) {
          const StepRow a = with.run(), b = without.run();
          CHECK(bits_of(std::vector<float>{a.loss, a.grad_l2_pre_clip}) ==
                bits_of(std::vector<float>{b.loss, b.grad_l2_pre_clip}));
          CHECK(!a.cast_census.empty());
          CHECK(b.cast_census.empty());
        }
        CHECK(with.state_bits() == without.state_bits());
      }
}

TEST_CASE("cast census: the forward's sites, each against a plain count of what was cast", "[amp][census]") {
  TwoLayers run(DType::F16, DType::F32, 2, true, 40000.0f);  // inputs of sigma 40000: some past fp16's 65504
  const StepRow row = run.run();
  const auto sites = by_name(row.cast_census);
  // The weights' working copies, from their masters (before the step updated them: the row is
  // the step's, and the forward read the copies made before it).
  REQUIRE(sites.count("fc1.weight") == 1);
  REQUIRE(sites.count("fc1.linear.input") == 1);
  CHECK(sites.count("fc2.linear.input") == 0);  // GELU's output is fp16 already: no cast
  // x and x * 1.37, cast for fc1 in micro-batches 0 and 1: the record adds both.
  std::vector<float> twice = run.x.to_vector(), xs = run.x_scaled.to_vector();
  twice.insert(twice.end(), xs.begin(), xs.end());
  const TensorCensus want = test::cast_census_reference(twice, DType::F16);
  const TensorCensus& got = sites.at("fc1.linear.input");
  CHECK(got.numel == 2 * run.x.numel());
  CHECK(got.nonfinite == want.nonfinite);
  CHECK(got.underflow == want.underflow);
  CHECK(got.subnormal == want.subnormal);
  CHECK(got.zeros == want.zeros);
  CHECK(got.amax == want.amax);
  CHECK(got.nonfinite > 0);  // the case is hit: 1.64 sigma reaches past 65520
}

TEST_CASE("cast census: fp16 gradient buffers count what their rounding flushed to zero", "[amp][census]") {
  // Tiny inputs at scale 1: many weight gradients fall below FP16's subnormals. The twin run
  // with FP32 buffers holds the values before the rounding (the same products, in FP32).
  TwoLayers low(DType::F16, DType::F16, 1, true, 1e-6f, 1.0f), ref(DType::F16, DType::F32, 1, false, 1e-6f, 1.0f);
  const StepRow row = low.run();
  ref.run();  // its gradients stay as the guard read them (unscale_grads is off; the scale is 1)
  const auto census = by_name(row.census);
  uint64_t flushed_total = 0;
  for (const Var& p : ref.params) {
    INFO(p.name());
    const std::vector<float> g = p.grad().to_vector();
    uint64_t flushed = 0;
    for (const float v : g) flushed += v != 0.0f && round_to(DType::F16, v) == 0.0f ? 1 : 0;
    REQUIRE(census.count(p.name()) == 1);
    CHECK(census.at(p.name()).underflow == flushed);
    flushed_total += flushed;
  }
  CHECK(flushed_total > 0);
}

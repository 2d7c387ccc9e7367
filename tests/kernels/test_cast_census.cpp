// Backend::cast_census on every CPU path this machine runs: each count against a plain
// reference that classifies through the format's own rounding (tests/kernels/census_case.h),
// on values at and next to every edge (the guard's, and the overflow midpoint), the cast's bits
// the same as cast()'s, and the counts of two calls added into one record. Bad calls refused.
#include <catch2/catch.hpp>

#include <cstring>
#include <vector>

#include "engine/backend.h"
#include "engine/census.h"
#include "engine/error.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_isa.h"
#include "tests/kernels/cpu_guards.h"
#include "tests/kernels/census_case.h"

using namespace belay;
using namespace belay::test;

namespace {

std::vector<uint16_t> halves(const Tensor& t) {
  const uint16_t* p = t.data_as<const uint16_t>();
  return std::vector<uint16_t>(p, p + t.numel());
}

}  // namespace

TEST_CASE("cast census: every count against the reference, the cast's bits, two calls in one record",
          "[kernels][census]") {
  IsaRestore restore;
  for (const CpuIsa isa : kAllCpuIsas) {
    if (!cpu_isa_available(isa)) continue;
    force_cpu_isa(isa);
    for (const DType format : {DType::F16, DType::BF16}) {
      INFO("path " << cpu_isa_name(isa) << ", cast to " << dtype_name(format));
      const std::vector<float> a = cast_census_values(format, 3), b = cast_census_values(format, 4);
      const Tensor ta = Tensor::from_vector(a, Shape{static_cast<int64_t>(a.size())});
      const Tensor tb = Tensor::from_vector(b, Shape{static_cast<int64_t>(b.size())});
      Tensor record = Tensor::zeros(Shape{kCensusFields});
      Tensor da = Tensor::empty(ta.shape(), format), db = Tensor::empty(tb.shape(), format);
      cpu_backend().cast_census(ta, da, record);
      cpu_backend().cast_census(tb, db, record);
      CHECK(halves(da) == halves(ta.to(format)));
      CHECK(halves(db) == halves(tb.to(format)));

      std::vector<float> both = a;
      both.insert(both.end(), b.begin(), b.end());
      const TensorCensus want = cast_census_reference(both, format);
      const uint32_t* w = record.data_as<const uint32_t>();
      CHECK(want.nonfinite >= 2 * (3 + 4));  // inf, -inf, NaN and the 4 that overflow, in each call
      CHECK(want.underflow > 0);
      CHECK(want.subnormal > 0);
      CHECK(record_differences(w, want).empty());
    }
  }
}

TEST_CASE("cast census: refuses what it cannot count", "[kernels][census]") {
  const Tensor x = Tensor::zeros(Shape{8});
  Tensor h = Tensor::empty(Shape{8}, DType::F16), record = Tensor::zeros(Shape{kCensusFields});
  Tensor f32 = Tensor::empty(Shape{8});
  CHECK_THROWS_WITH(cpu_backend().cast_census(h, f32, record), Catch::Contains("cast_census"));
  CHECK_THROWS_WITH(cpu_backend().cast_census(x, f32, record), Catch::Contains("into FP16 or BF16"));
  Tensor short_record = Tensor::zeros(Shape{3});
  CHECK_THROWS_WITH(cpu_backend().cast_census(x, h, short_record), Catch::Contains("the record must be FP32 [5]"));
  Tensor h7 = Tensor::empty(Shape{7}, DType::F16);
  CHECK_THROWS_WITH(cpu_backend().cast_census(x, h7, record), Catch::Contains("element counts differ"));
}

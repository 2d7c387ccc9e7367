// THE tolerance helper: every low-precision result in the tests is compared with an FP32 or
// FP64 reference through this one function, whose bound is set before the test runs from
// the dtype's unit roundoff and the reduction length, and never widened to make a test pass.
//
// For a result of `reduction_len` products whose inputs were rounded to `dtype` (u each,
// so 2u per product), summed in FP32 (at most n * u32 by the classic bound) and rounded
// once to `out_dtype` (u_out), the error is bounded by
//     (2 u_in + n u32 + u_out) * magnitude,   magnitude = sum |a_i b_i|   (or |exact| for n = 1)
#pragma once
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <sstream>
#include <vector>

#include "engine/dtype.h"
#include "engine/tensor.h"

namespace belay::test {

inline double unit_roundoff(DType d) { return 0.5 * static_cast<double>(finfo(d).eps); }

struct Tolerance {
  double rel;         // times the magnitude
  double abs = 0.0;   // floor for results near zero (e.g. the smallest normal of out_dtype)
};

inline Tolerance tolerance_for(DType in_dtype, DType out_dtype, int64_t reduction_len = 1) {
  const double n = static_cast<double>(reduction_len);
  const double inputs = in_dtype == DType::F32 ? 0.0 : 2.0 * unit_roundoff(in_dtype);
  return {inputs + n * unit_roundoff(DType::F32) + unit_roundoff(out_dtype),
          static_cast<double>(finfo(out_dtype).smallest_normal)};
}

// Checks |actual - expected| <= tol.rel * magnitude + tol.abs element by element and reports
// the worst element. magnitude defaults to |expected|.
inline void check_close(const std::vector<float>& actual, const std::vector<double>& expected, const Tolerance& tol,
                        const std::vector<double>& magnitude = {}) {
  REQUIRE(actual.size() == expected.size());
  size_t worst = 0, failures = 0;
  double worst_ratio = 0.0;
  for (size_t i = 0; i < actual.size(); ++i) {
    const double mag = magnitude.empty() ? std::fabs(expected[i]) : magnitude[i];
    const double bound = tol.rel * mag + tol.abs;
    const double err = std::fabs(static_cast<double>(actual[i]) - expected[i]);
    const double ratio = bound > 0 ? err / bound : (err > 0 ? INFINITY : 0.0);
    if (!(err <= bound)) ++failures;
    if (!(ratio <= worst_ratio)) {
      worst_ratio = ratio;
      worst = i;
    }
  }
  std::ostringstream msg;
  msg << failures << " of " << actual.size() << " elements outside the bound; worst at " << worst << ": got "
      << actual[worst] << ", expected " << expected[worst] << " (error/bound = " << worst_ratio << ")";
  INFO(msg.str());
  CHECK(failures == 0);
}

// The bit patterns of FP32 values (a tensor's widened exactly), for the checks that must hold
// bit for bit: the zero tolerance.
inline std::vector<uint32_t> bits_of(const std::vector<float>& v) {
  std::vector<uint32_t> out(v.size());
  if (!v.empty()) std::memcpy(out.data(), v.data(), v.size() * 4);
  return out;
}
inline std::vector<uint32_t> bits_of(const Tensor& t) { return bits_of(t.to_vector()); }

}  // namespace belay::test

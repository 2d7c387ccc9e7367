// Shared by the GPU tests: the skip check every case starts with, seeded inputs, and the
// round trip between the backends. Catch2 v2 has no SKIP(): a case that finds no GPU warns
// with the CTEST_SKIP marker (tests/CMakeLists.txt turns it into a skipped test) and returns.
#pragma once
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "engine/backend.h"
#include "engine/tensor.h"
#include "tests/tolerance.h"

#define BELAY_REQUIRE_GPU()                      \
  do {                                           \
    if (belay::cuda_device_count() == 0) {       \
      WARN("CTEST_SKIP: no CUDA device");        \
      return;                                    \
    }                                            \
  } while (0)

namespace belay::test {

inline const Backend& cpu() { return backend_for(Device::cpu()); }
inline const Backend& gpu() { return backend_for(Device::cuda()); }

// Values in [lo, hi), already rounded into `dtype`, so both backends see the same inputs.
inline std::vector<float> random_values(int64_t n, uint64_t seed, float lo = -2.0f, float hi = 2.0f,
                                        DType dtype = DType::F32) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = round_to(dtype, dist(rng));
  return v;
}

// The same values on the CPU and on the GPU.
struct Pair {
  Tensor host;
  Tensor device;
};
inline Pair make_pair(const std::vector<float>& values, const Shape& shape, DType dtype) {
  Tensor h = Tensor::from_vector(values, shape, dtype, Device::cpu());
  return {h, h.to(Device::cuda())};
}
inline Pair make_pair(const Shape& shape, DType dtype, uint64_t seed, float lo = -2.0f, float hi = 2.0f) {
  return make_pair(random_values(shape.numel(), seed, lo, hi, dtype), shape, dtype);
}

inline std::vector<double> as_double(const Tensor& t) {
  const std::vector<float> v = t.to_vector();
  return std::vector<double>(v.begin(), v.end());
}

// The sizes every op is tried on: one element, under a warp, just over a block, and large.
inline const std::vector<int64_t>& odd_sizes() {
  static const std::vector<int64_t> s{1, 7, 129, 1000};
  return s;
}

inline const char* name_of(DType d) { return dtype_name(d); }

}  // namespace belay::test

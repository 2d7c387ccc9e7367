// Gradients built to hit every class of the guard's census (engine/census.h), and the plain
// reference that classifies each stored value through the format's own rounding (round_to),
// not through the kernels' bounds. Shared by the CPU test and the GPU test.
#pragma once
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <vector>

#include "engine/census.h"
#include "engine/dtype.h"
#include "engine/random.h"
#include "engine/tensor.h"

namespace belay::test {

// The stored (scaled) values that sit on and next to each edge of `format`'s census classes.
inline std::vector<float> census_edge_values(DType format) {
  const FInfo fi = finfo(format);
  const float normal = fi.smallest_normal, sub = fi.smallest_subnormal, tie = sub / 2.0f;
  const float mid = normal - tie;  // between the largest subnormal and the smallest normal
  std::vector<float> v;
  for (const float e : {normal, sub, tie, mid, fi.max})
    for (const float x : {e, std::nextafter(e, 0.0f), std::nextafter(e, INFINITY)}) {
      v.push_back(x);
      v.push_back(-x);
    }
  for (const float x : {0.0f, -0.0f, INFINITY, -INFINITY, std::numeric_limits<float>::quiet_NaN(),
                        std::numeric_limits<float>::max(), 3.0f * sub, 1.5f * normal})
    v.push_back(x);
  return v;
}

// Three gradients of grad_dtype: two whole SIMD groups plus a tail (the edge values planted in
// both, at odd offsets), a short one (tail only) and one whole group of exact zeros. The
// other values are random and of every magnitude from 2^-30 to 2^10 (times `scale`'s
// worth of nothing: the census reads the stored values; scale only sets the guard's inv).
inline std::vector<Tensor> census_tensors(DType format, DType grad_dtype, float scale, uint64_t seed,
                                          Device device = Device::cpu()) {
  (void)scale;
  const std::vector<float> edges = census_edge_values(format);
  Rng rng(seed);
  auto filled = [&](int64_t n) {
    std::vector<float> x(static_cast<size_t>(n));
    for (float& e : x) e = std::ldexp(rng.uniform() - 0.5f, static_cast<int>(rng.uniform() * 40.0f) - 30);
    return x;
  };
  std::vector<float> big = filled(2 * 8 * 16384 + 777);
  for (size_t k = 0; k < edges.size(); ++k) {
    big[(k * 9973 + 13) % (2 * 8 * 16384)] = edges[k];  // inside the whole groups
    big[big.size() - 1 - k] = edges[k];                 // in the tail
  }
  std::vector<float> small = filled(37);
  for (size_t k = 0; k < edges.size() && k < small.size(); ++k) small[k] = edges[(k * 7) % edges.size()];
  const std::vector<float> zeros(8 * 16384, 0.0f);
  std::vector<Tensor> out;
  for (const std::vector<float>* v : std::initializer_list<const std::vector<float>*>{&big, &small, &zeros})
    out.push_back(Tensor::from_vector(*v, Shape{static_cast<int64_t>(v->size())}).to(grad_dtype).to(device));
  return out;
}

// The census of one tensor's stored values, classified one value at a time through round_to.
inline TensorCensus census_reference(const Tensor& t, DType format) {
  TensorCensus c;
  c.numel = t.numel();
  const float normal = finfo(format).smallest_normal;
  for (const float x : t.to(Device::cpu()).to_vector()) {
    if (!std::isfinite(x)) {
      ++c.nonfinite;
      continue;
    }
    c.amax = std::fmax(c.amax, std::fabs(x));
    if (x == 0.0f) {
      ++c.zeros;
      continue;
    }
    const float r = round_to(format, x);
    if (r == 0.0f) ++c.underflow;
    else if (std::fabs(r) < normal) ++c.subnormal;
  }
  return c;
}

}  // namespace belay::test

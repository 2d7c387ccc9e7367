// Gradients built to hit every class of the guard's census (engine/census.h), and the plain
// reference that classifies each stored value through the format's own rounding (round_to),
// not through the kernels' bounds. Shared by the CPU test and the GPU test.
#pragma once
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <string>
#include <vector>

#include "engine/census.h"
#include "engine/dtype.h"
#include "engine/half_bits.h"
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

// Gradients whose values are mostly plain normal numbers (magnitudes 2^-10 to 2^10, normal in
// FP16 and BF16 alike), as a trained model's mostly are: the kernels' fast steps, where only
// the min and max of 64 values are taken, carry most of the data here. The finite edge values
// are planted sparsely in the first whole group (one every few thousand values, so most
// 64-value steps stay plain), the largest magnitude sits in a plain step, and the second whole
// group is plain but for one NaN (the whole group counted again). A third tensor holds only
// plain values. Used beside census_tensors, whose random values put an edge in every step.
inline std::vector<Tensor> census_sparse_tensors(DType format, DType grad_dtype, uint64_t seed,
                                                 Device device = Device::cpu()) {
  std::vector<float> edges;
  for (const float e : census_edge_values(format))
    if (std::isfinite(e) && std::fabs(e) < 1.0f) edges.push_back(e);
  Rng rng(seed);
  auto plain = [&](int64_t n) {
    std::vector<float> x(static_cast<size_t>(n));
    for (float& e : x) e = std::ldexp(0.5f + 0.5f * rng.uniform(), static_cast<int>(rng.uniform() * 20.0f) - 10);
    return x;
  };
  const int64_t group = 8 * 16384;
  std::vector<float> big = plain(2 * group + 100);
  for (size_t k = 0; k < edges.size(); ++k) big[(k * 4099 + 5) % static_cast<size_t>(group)] = edges[k];
  big[static_cast<size_t>(group) / 2 + 3] = 4096.0f;  // the amax, in a plain step of the first group
  big[static_cast<size_t>(group) + 12345] = std::numeric_limits<float>::quiet_NaN();
  std::vector<Tensor> out;
  out.push_back(Tensor::from_vector(big, Shape{static_cast<int64_t>(big.size())}).to(grad_dtype).to(device));
  const std::vector<float> clean = plain(group);
  out.push_back(Tensor::from_vector(clean, Shape{group}).to(grad_dtype).to(device));
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

// The FP32 values a cast census must classify: the guard's edges, and the overflow edge (the
// midpoint between the format's largest finite value and the next power of two, which rounds
// to inf, and its neighbours), among random values of every magnitude from 2^-30 to 2^20. Two
// whole 1024-value blocks and a tail.
inline std::vector<float> cast_census_values(DType format, uint64_t seed) {
  std::vector<float> edges = census_edge_values(format);
  const float overflow = format == DType::F16 ? 65520.0f : std::ldexp(255.0f / 128.0f + 1.0f / 256.0f, 127);
  for (const float x : {overflow, std::nextafter(overflow, 0.0f), std::nextafter(overflow, INFINITY)}) {
    edges.push_back(x);
    edges.push_back(-x);
  }
  Rng rng(seed);
  std::vector<float> v(2 * 1024 + 333);
  for (float& e : v) e = std::ldexp(rng.uniform() - 0.5f, static_cast<int>(rng.uniform() * 50.0f) - 30);
  for (size_t k = 0; k < edges.size(); ++k) {
    v[(k * 37 + 5) % 2048] = edges[k];
    v[v.size() - 1 - k] = edges[k];
  }
  return v;
}

// The census of an FP32 tensor cast into `format`, classified one value at a time through the
// format's own rounding: non-finite when the cast gives inf or NaN.
inline TensorCensus cast_census_reference(const std::vector<float>& values, DType format) {
  TensorCensus c;
  c.numel = static_cast<int64_t>(values.size());
  const float normal = finfo(format).smallest_normal;
  for (const float x : values) {
    const float r = round_to(format, x);
    if (std::isfinite(x)) c.amax = std::fmax(c.amax, std::fabs(x));
    if (!std::isfinite(r)) ++c.nonfinite;
    else if (x == 0.0f) ++c.zeros;
    else if (r == 0.0f) ++c.underflow;
    else if (std::fabs(r) < normal) ++c.subnormal;
  }
  return c;
}

// "" when a record (kCensusFields words, engine/census.h) holds exactly `want`'s counts and
// amax bits, else what differs: CHECK(record_differences(r, want).empty()) prints it.
inline std::string record_differences(const uint32_t* r, const TensorCensus& want) {
  std::string out;
  const auto field = [&](const char* name, uint64_t got, uint64_t expected) {
    if (got != expected)
      out += std::string(name) + " " + std::to_string(got) + " (want " + std::to_string(expected) + ") ";
  };
  field("nonfinite", r[kCensusNonfinite], want.nonfinite);
  field("zeros", r[kCensusZeros], want.zeros);
  field("underflow", r[kCensusUnderflow], want.underflow);
  field("subnormal", r[kCensusSubnormal], want.subnormal);
  field("amax bits", r[kCensusAmax], f32_bits(want.amax));
  return out;
}

}  // namespace belay::test

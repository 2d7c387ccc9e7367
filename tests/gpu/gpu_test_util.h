// Shared by the GPU tests: the skip check every case starts with, seeded inputs, and the
// round trip between the backends. Catch2 v2 has no SKIP(): a case that finds no GPU warns
// with the CTEST_SKIP marker (tests/CMakeLists.txt turns it into a skipped test) and returns.
#pragma once
#include <catch2/catch.hpp>

#include <algorithm>
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

// Under the SIMT emulator (a BELAY_CUDA_EMULATION build) every CUDA thread runs as a fiber on
// the CPU, thousands of times slower than a GPU: a size that only keeps the GPU busy, or
// sweeps far past every edge the kernels have, is cut there (gpu_or_emulated). Each cut says
// why where it is made.
constexpr bool kEmulated = BELAY_CUDA_EMULATION != 0;
inline int64_t gpu_or_emulated(int64_t on_gpu, int64_t emulated) { return kEmulated ? emulated : on_gpu; }

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

// One autograd graph run on the CUDA device against the same graph on the CPU (each op is
// checked against FP64 on its own elsewhere): `gpu` and `cpu` are what the graph gave on
// each (a loss, then its gradients, flattened), within the tolerance of a few dozen FP32
// roundings of magnitude max(1, |cpu|).
inline void check_graph_matches_cpu(const std::vector<float>& gpu, const std::vector<float>& cpu) {
  const std::vector<double> ref(cpu.begin(), cpu.end());
  std::vector<double> mag(ref.size());
  for (size_t i = 0; i < ref.size(); ++i) mag[i] = std::max(1.0, std::fabs(ref[i]));
  check_close(gpu, ref, tolerance_for(DType::F32, DType::F32, 64), mag);
}

// Work that keeps the GPU busy for a few milliseconds (an FP32 SIMT product of 2048^3, ~17
// GFLOP), so what is enqueued after it is still waiting when the host goes on. The operands
// are made first: allocation is not what is under test. Under the emulator the product is
// 64^3: there the stream queue itself holds work back at moments drawn from the seed
// (kernels/cuda/emulation/runtime.cpp), and 2048^3 would take minutes.
struct BusyWork {
  int64_t n = gpu_or_emulated(2048, 64);
  Tensor a = Tensor::full(Shape{n, n}, 0.5f, DType::F32, Device::cuda());
  Tensor b = Tensor::full(Shape{n, n}, 0.25f, DType::F32, Device::cuda());
  Tensor c = Tensor::empty(Shape{n, n}, DType::F32, Device::cuda());
  void enqueue(int times = 1) {
    GemmArgs g;
    g.a = &a;
    g.b = &b;
    g.c = &c;
    for (int i = 0; i < times; ++i) gpu().gemm(g);
  }
};

}  // namespace belay::test

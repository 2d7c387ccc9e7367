// One GEMM case against an FP64 reference computed here, through tests/tolerance.h: shared
// by the backend's tests (test_cpu_ops.cpp) and the per-ISA tests (test_cpu_isa.cpp). The
// reference reads the inputs as stored (exact), so the bound covers the FP32 arithmetic
// (reduction length x u32) and the one rounding to the output dtype.
#pragma once
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <vector>

#include "engine/backend.h"
#include "engine/random.h"
#include "tests/tolerance.h"

namespace belay::test {

struct GemmCase {
  int64_t m, n, k;
};

inline Tensor gemm_random_tensor(const Shape& shape, DType dtype, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> v(static_cast<size_t>(shape.numel()));
  for (float& x : v) x = rng.uniform(-1.0f, 1.0f);
  return Tensor::from_vector(v, shape, dtype);
}

// The FP64 reference of C (+)= op(A) op(B) (+ bias) on the inputs as stored (exact), and
// each element's magnitude sum |terms| for the tolerance helper. bias and c0 may be empty
// (no bias; C = product). Shared by the CPU tests here and the GPU tests (test_cuda_gemm).
struct GemmReference {
  std::vector<double> value, magnitude;
};
inline GemmReference gemm_reference(const std::vector<float>& a, const std::vector<float>& b,
                                    const std::vector<float>& bias, const std::vector<float>& c0, int64_t m,
                                    int64_t n, int64_t k, bool ta, bool tb) {
  GemmReference r{std::vector<double>(static_cast<size_t>(m * n)), std::vector<double>(static_cast<size_t>(m * n))};
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0.0, mag = 0.0;
      for (int64_t p = 0; p < k; ++p) {
        const double x = ta ? a[p * m + i] : a[i * k + p];
        const double y = tb ? b[j * k + p] : b[p * n + j];
        s += x * y;
        mag += std::fabs(x * y);
      }
      if (!bias.empty()) {
        s += bias[j];
        mag += std::fabs(static_cast<double>(bias[j]));
      }
      if (!c0.empty()) {
        s += c0[i * n + j];
        mag += std::fabs(static_cast<double>(c0[i * n + j]));
      }
      r.value[i * n + j] = s;
      r.magnitude[i * n + j] = mag;
    }
  return r;
}

// Runs C (+)= op(A) op(B) (+ bias) through `gemm` on seeded inputs and checks every element.
inline void run_gemm_case(const GemmCase& gc, bool ta, bool tb, DType in, DType out, bool with_bias, bool beta1,
                          uint64_t seed, const std::function<void(const GemmArgs&)>& gemm) {
  INFO("gemm M=" << gc.m << " N=" << gc.n << " K=" << gc.k << " trans_a=" << ta << " trans_b=" << tb << " in="
                 << dtype_name(in) << " out=" << dtype_name(out) << " bias=" << with_bias << " beta=" << beta1);
  const Tensor a = gemm_random_tensor(ta ? Shape{gc.k, gc.m} : Shape{gc.m, gc.k}, in, seed);
  const Tensor b = gemm_random_tensor(tb ? Shape{gc.n, gc.k} : Shape{gc.k, gc.n}, in, seed + 1);
  const Tensor bias = gemm_random_tensor(Shape{gc.n}, DType::F32, seed + 2);
  Tensor c = beta1 ? gemm_random_tensor(Shape{gc.m, gc.n}, out, seed + 3) : Tensor::full(Shape{gc.m, gc.n}, NAN, out);
  const GemmReference ref = gemm_reference(a.to_vector(), b.to_vector(),
                                           with_bias ? bias.to_vector() : std::vector<float>{},
                                           beta1 ? c.to_vector() : std::vector<float>{}, gc.m, gc.n, gc.k, ta, tb);

  GemmArgs args;
  args.a = &a;
  args.trans_a = ta;
  args.b = &b;
  args.trans_b = tb;
  args.c = &c;
  args.beta = beta1 ? 1.0f : 0.0f;
  args.bias = with_bias ? &bias : nullptr;
  gemm(args);
  REQUIRE(c.dtype() == out);
  // K products (exact in FP32 for 16-bit inputs, one rounding each for FP32 inputs: covered by
  // the classic gamma_K bound), plus one addition each for the bias and the old C.
  const int64_t len = gc.k + (with_bias ? 1 : 0) + (beta1 ? 1 : 0);
  check_close(c.to_vector(), ref.value, tolerance_for(DType::F32, out, len), ref.magnitude);
}

}  // namespace belay::test

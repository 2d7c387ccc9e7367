// One batched GEMM case (GemmArgs batch and strides), shared by the CPU tests (every ISA path,
// test_batched_gemm.cpp) and the emulated CUDA ones (tests/gpu/test_cuda_batched.cpp): every
// item against the FP64 reference through the one tolerance helper, and every item's bits
// equal to the unbatched call on that item alone (the batch is a loop or a grid dimension
// over the same product, never another summation order).
#pragma once
#include <catch2/catch.hpp>

#include <functional>
#include <vector>

#include "engine/backend.h"
#include "tests/kernels/gemm_case.h"

namespace belay::test {

struct BatchedCase {
  int64_t batch, m, n, k;
  bool ta, tb;
  bool a_shared = false, b_shared = false;  // one matrix for every item: stride 0
  bool beta1 = false;                       // C += (needs an FP32 C)
  bool with_bias = false;
};

// Item i of a batched operand (stored [batch, rows, cols], or [rows, cols] when shared).
inline std::vector<float> item_of(const std::vector<float>& all, int64_t i, int64_t items, bool shared) {
  const int64_t at = shared ? 0 : i * items;
  return std::vector<float>(all.begin() + at, all.begin() + at + items);
}

// gemm runs on `device` (its backend); in and out are the operand and result dtypes; tol_in
// the input dtype the bound assumes (F32 where the inputs reach the FP32 sum exactly, as the
// CPU's widening does; `in` on a GPU, as tests/gpu/test_cuda_gemm.cpp bounds tensor cores).
inline void run_batched_case(const BatchedCase& bc, DType in, DType out, DType tol_in, Device device, uint64_t seed,
                             const std::function<void(const GemmArgs&)>& gemm) {
  INFO("batched gemm batch=" << bc.batch << " M=" << bc.m << " N=" << bc.n << " K=" << bc.k << " trans_a=" << bc.ta
                             << " trans_b=" << bc.tb << " a_shared=" << bc.a_shared << " b_shared=" << bc.b_shared
                             << " beta=" << bc.beta1 << " bias=" << bc.with_bias << " in=" << dtype_name(in)
                             << " out=" << dtype_name(out));
  const int64_t ar = bc.ta ? bc.k : bc.m, ac = bc.ta ? bc.m : bc.k;
  const int64_t br = bc.tb ? bc.n : bc.k, bcols = bc.tb ? bc.k : bc.n;
  const Shape a_shape = bc.a_shared ? Shape{ar, ac} : Shape{bc.batch, ar, ac};
  const Shape b_shape = bc.b_shared ? Shape{br, bcols} : Shape{bc.batch, br, bcols};
  const Tensor a = gemm_random_tensor(a_shape, in, seed).to(device);
  const Tensor b = gemm_random_tensor(b_shape, in, seed + 1).to(device);
  const Tensor bias = gemm_random_tensor(Shape{bc.n}, DType::F32, seed + 2).to(device);
  const Tensor c0 = gemm_random_tensor(Shape{bc.batch, bc.m, bc.n}, out, seed + 3);
  Tensor c = (bc.beta1 ? c0 : Tensor::full(c0.shape(), NAN, out)).to(device);

  GemmArgs args;
  args.a = &a;
  args.trans_a = bc.ta;
  args.b = &b;
  args.trans_b = bc.tb;
  args.c = &c;
  args.beta = bc.beta1 ? 1.0f : 0.0f;
  args.bias = bc.with_bias ? &bias : nullptr;
  args.batch = bc.batch;
  args.stride_a = bc.a_shared ? 0 : ar * ac;
  args.stride_b = bc.b_shared ? 0 : br * bcols;
  gemm(args);

  const std::vector<float> av = a.to_vector(), bv = b.to_vector(), c0v = c0.to_vector(), cv = c.to_vector();
  const int64_t len = bc.k + (bc.with_bias ? 1 : 0) + (bc.beta1 ? 1 : 0);
  for (int64_t i = 0; i < bc.batch; ++i) {
    INFO("item " << i);
    const std::vector<float> ai = item_of(av, i, ar * ac, bc.a_shared), bi = item_of(bv, i, br * bcols, bc.b_shared);
    const std::vector<float> ci0 = item_of(c0v, i, bc.m * bc.n, false), got = item_of(cv, i, bc.m * bc.n, false);
    const GemmReference ref = gemm_reference(ai, bi, bc.with_bias ? bias.to_vector() : std::vector<float>{},
                                             bc.beta1 ? ci0 : std::vector<float>{}, bc.m, bc.n, bc.k, bc.ta, bc.tb);
    check_close(got, ref.value, tolerance_for(tol_in, out, len), ref.magnitude);
    // The unbatched call on this item alone: the same bits.
    const Tensor a1 = Tensor::from_vector(ai, Shape{ar, ac}, in).to(device);
    const Tensor b1 = Tensor::from_vector(bi, Shape{br, bcols}, in).to(device);
    Tensor c1 = (bc.beta1 ? Tensor::from_vector(ci0, Shape{bc.m, bc.n}, out) : Tensor::full(Shape{bc.m, bc.n}, NAN, out))
                    .to(device);
    GemmArgs one = args;
    one.a = &a1;
    one.b = &b1;
    one.c = &c1;
    one.batch = 1;
    one.stride_a = one.stride_b = 0;
    gemm(one);
    CHECK(c1.to_vector() == got);
  }
}

}  // namespace belay::test

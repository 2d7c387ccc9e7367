// The CUDA GEMMs (tensor cores for FP16/BF16, SIMT for FP32) against an FP64 product of the
// same rounded inputs, through the one tolerance helper: every trans_a / trans_b layout
// (Y = X W^T, dX = dY W, dW = dY^T X and the fourth), odd shapes (edges, and leading
// dimensions that are not a multiple of 8, copied into a padded buffer first), aligned
// shapes, the bias epilogue and beta = 1 accumulation into an FP32 C. Then the batched products
// (GemmArgs batch and strides) and swap_axes, further down.
#include <cmath>

#include "tests/gpu/gpu_test_util.h"
#include "tests/kernels/batched_gemm_case.h"
#include "tests/kernels/gemm_case.h"

using namespace belay;
using namespace belay::test;

namespace {

struct Problem {
  int64_t m, n, k;
};

// Covers 1, 7, 129 and 1000 in every position, plus multiples of 8 (no padding copy)
// and a K that spans many k-tiles with a ragged last one.
const Problem kGpuProblems[] = {{1, 1, 1},      {7, 7, 7},       {129, 129, 129}, {1000, 129, 7},  {7, 1000, 129},
                                {129, 7, 1000}, {1, 1000, 1000}, {1000, 1, 129},  {128, 256, 64},  {256, 128, 1024},
                                {136, 72, 200}, {64, 8, 8}};
// Under the emulator 1000 becomes 300 (still three 128-row tiles and a ragged fourth, and as
// K five 64-wide k-tiles with a ragged last) and 1024 becomes 256: the same edges, a tenth
// of the work, which the emulator runs thread by thread.
const Problem kEmulatedProblems[] = {{1, 1, 1},    {7, 7, 7},     {129, 129, 129}, {300, 129, 7},  {7, 300, 129},
                                     {129, 7, 300}, {1, 300, 300}, {300, 1, 129},   {128, 256, 64}, {256, 128, 256},
                                     {136, 72, 200}, {64, 8, 8}};
const auto& kProblems = kEmulated ? kEmulatedProblems : kGpuProblems;

void run_case(const Problem& pr, DType ab, bool trans_a, bool trans_b, bool with_bias, bool accumulate) {
  const Shape a_shape = trans_a ? Shape{pr.k, pr.m} : Shape{pr.m, pr.k};
  const Shape b_shape = trans_b ? Shape{pr.n, pr.k} : Shape{pr.k, pr.n};
  const uint64_t seed = static_cast<uint64_t>(pr.m * 131 + pr.n * 17 + pr.k);
  Pair a = make_pair(a_shape, ab, seed), b = make_pair(b_shape, ab, seed + 1);
  Pair bias = make_pair(Shape{pr.n}, ab, seed + 2);
  const DType c_dtype = accumulate ? DType::F32 : ab;
  Pair c = make_pair(Shape{pr.m, pr.n}, c_dtype, seed + 3);
  const std::vector<float> av = a.host.to_vector(), bv = b.host.to_vector(), biasv = bias.host.to_vector(),
                           c0 = c.host.to_vector();

  const GemmReference ref = gemm_reference(av, bv, with_bias ? biasv : std::vector<float>{},
                                           accumulate ? c0 : std::vector<float>{}, pr.m, pr.n, pr.k, trans_a, trans_b);

  GemmArgs args;
  args.a = &a.device;
  args.trans_a = trans_a;
  args.b = &b.device;
  args.trans_b = trans_b;
  args.c = &c.device;
  args.beta = accumulate ? 1.0f : 0.0f;
  args.bias = with_bias ? &bias.device : nullptr;
  gpu().gemm(args);
  INFO(name_of(ab) << " M=" << pr.m << " N=" << pr.n << " K=" << pr.k << " trans_a=" << trans_a
                   << " trans_b=" << trans_b << " bias=" << with_bias << " beta=" << accumulate);
  // K products, then the bias and C additions: K + 2 terms in the FP32 sum.
  check_close(c.device.to_vector(), ref.value, tolerance_for(ab, c_dtype, pr.k + 2), ref.magnitude);
}

}  // namespace

TEST_CASE("cuda gemm fp16 and bf16 (tensor cores) match FP64 in every layout and odd shape", "[gpu][gemm]") {
  BELAY_REQUIRE_GPU();
  for (DType ab : {DType::F16, DType::BF16})
    for (const Problem& pr : kProblems)
      for (bool ta : {false, true})
        for (bool tb : {false, true}) {
          run_case(pr, ab, ta, tb, false, false);
          run_case(pr, ab, ta, tb, true, false);
          run_case(pr, ab, ta, tb, false, true);
        }
}

TEST_CASE("cuda gemm fp32 (SIMT) matches FP64 in every layout and odd shape", "[gpu][gemm]") {
  BELAY_REQUIRE_GPU();
  for (const Problem& pr : kProblems)
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        run_case(pr, DType::F32, ta, tb, false, false);
        run_case(pr, DType::F32, ta, tb, true, true);
      }
}

TEST_CASE("cuda gemm: the three products of a linear layer agree with the CPU backend", "[gpu][gemm]") {
  BELAY_REQUIRE_GPU();
  // X [B, in], W [out, in]: Y = X W^T, dX = dY W, dW (+)= dY^T X, as autograd issues them.
  const int64_t batch = 129, in = 1000, out = 7;
  for (DType d : {DType::F16, DType::BF16}) {
    Pair x = make_pair(Shape{batch, in}, d, 61), w = make_pair(Shape{out, in}, d, 62);
    Pair dy = make_pair(Shape{batch, out}, d, 63);
    Tensor yg = Tensor::empty(Shape{batch, out}, d, Device::cuda()), yc = Tensor::empty(Shape{batch, out}, d);
    Tensor dxg = Tensor::empty(Shape{batch, in}, d, Device::cuda()), dxc = Tensor::empty(Shape{batch, in}, d);
    Tensor dwg = Tensor::zeros(Shape{out, in}, DType::F32, Device::cuda()), dwc = Tensor::zeros(Shape{out, in});
    for (int pass = 0; pass < 2; ++pass) {  // the second dW accumulates (beta = 1)
      gpu().gemm({&x.device, false, &w.device, true, &yg, 0.0f, nullptr});
      cpu().gemm({&x.host, false, &w.host, true, &yc, 0.0f, nullptr});
      gpu().gemm({&dy.device, false, &w.device, false, &dxg, 0.0f, nullptr});
      cpu().gemm({&dy.host, false, &w.host, false, &dxc, 0.0f, nullptr});
      gpu().gemm({&dy.device, true, &x.device, false, &dwg, pass == 0 ? 0.0f : 1.0f, nullptr});
      cpu().gemm({&dy.host, true, &x.host, false, &dwc, pass == 0 ? 0.0f : 1.0f, nullptr});
    }
    // Both backends err by at most the bound from the exact product; they differ by at most
    // twice it. Magnitudes from |X| |W|^T etc. are replaced by the (larger) sum bound:
    // |x|, |w| < 2, so every |product| < 4 and magnitude <= 4 K.
    auto check = [&](const Tensor& g, const Tensor& c, int64_t k, DType out_dtype) {
      const Tolerance t = tolerance_for(d, out_dtype, k);
      const std::vector<double> mag(static_cast<size_t>(g.numel()), 4.0 * static_cast<double>(k));
      check_close(g.to_vector(), as_double(c), {2.0 * t.rel, 2.0 * t.abs}, mag);
    };
    check(yg, yc, in, d);
    check(dxg, dxc, out, d);
    check(dwg, dwc, 2 * batch, DType::F32);
  }
}

// The batched GEMM on the CUDA kernels (gridDim.z over the items): the tensor-core kernel for
// FP16/BF16 and the SIMT kernel for FP32, each item against the FP64 reference through the
// tolerance helper and with the bits of the unbatched call on it; every layout, odd shapes
// (rows not a multiple of 8: the padded copy, its batch stride rescaled), an operand shared
// over the batch, the bias and beta = 1. Then swap_axes (the head split and merge), bit for
// bit against the CPU backend. Small shapes: the emulator runs every thread of every block.

namespace {

// 7 x 5 x 9: one ragged tile, every row unaligned; 33 x 17 x 72: K over two k-tiles of 64;
// 16 x 8 x 24: rows already 16-byte aligned (no padding copy).
const GemmCase kShapes[] = {{7, 5, 9}, {33, 17, 72}, {16, 8, 24}};

void batched_suite(DType in) {
  const auto gemm = [](const GemmArgs& a) { gpu().gemm(a); };
  uint64_t seed = 500;
  for (const GemmCase& s : kShapes)
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        run_batched_case({3, s.m, s.n, s.k, ta, tb}, in, in, in, Device::cuda(), seed++, gemm);
        run_batched_case({2, s.m, s.n, s.k, ta, tb, false, true}, in, in, in, Device::cuda(), seed++, gemm);
        run_batched_case({2, s.m, s.n, s.k, ta, tb, true, false, true, true}, in, DType::F32, in, Device::cuda(),
                         seed++, gemm);
      }
}

// x [outer, p, mid, q, inner] -> [outer, q, mid, p, inner], by indices.
std::vector<float> swap_reference(const std::vector<float>& x, const SwapAxesView& v) {
  std::vector<float> out(x.size());
  size_t k = 0;
  for (int64_t o = 0; o < v.outer; ++o)
    for (int64_t j = 0; j < v.q; ++j)
      for (int64_t m = 0; m < v.mid; ++m)
        for (int64_t i = 0; i < v.p; ++i)
          for (int64_t n = 0; n < v.inner; ++n) out[k++] = x[(((o * v.p + i) * v.mid + m) * v.q + j) * v.inner + n];
  return out;
}

}  // namespace

TEST_CASE("cuda batched gemm fp16 and bf16 (tensor cores): items match FP64 and the unbatched bits",
          "[gpu][gemm][bmm]") {
  BELAY_REQUIRE_GPU();
  for (DType in : {DType::F16, DType::BF16}) batched_suite(in);
}

TEST_CASE("cuda batched gemm fp32 (SIMT): items match FP64 and the unbatched bits", "[gpu][gemm][bmm]") {
  BELAY_REQUIRE_GPU();
  batched_suite(DType::F32);
}

TEST_CASE("cuda swap_axes (head split and merge) copies the bits the CPU does", "[gpu][bmm]") {
  BELAY_REQUIRE_GPU();
  const SwapAxesView views[] = {{2, 3, 1, 4, 5}, {1, 7, 3, 5, 1}, {3, 1, 1, 129, 2}, {1, 1, 1, 1, 1}};
  uint64_t seed = 700;
  for (DType dt : {DType::F32, DType::F16, DType::BF16})
    for (const SwapAxesView& v : views) {
      INFO(name_of(dt) << " view " << v.outer << "," << v.p << "," << v.mid << "," << v.q << "," << v.inner);
      Pair x = make_pair(Shape{v.numel()}, dt, seed++);
      Tensor out_cpu = Tensor::empty(Shape{v.numel()}, dt, Device::cpu());
      Tensor out_gpu = Tensor::empty(Shape{v.numel()}, dt, Device::cuda());
      cpu().swap_axes(x.host, v, out_cpu);
      gpu().swap_axes(x.device, v, out_gpu);
      CHECK(out_cpu.to_vector() == swap_reference(x.host.to_vector(), v));
      CHECK(out_gpu.to_vector() == out_cpu.to_vector());
    }
}

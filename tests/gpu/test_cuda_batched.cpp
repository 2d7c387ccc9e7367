// The batched GEMM on the CUDA kernels (gridDim.z over the items): the tensor-core kernel for
// FP16/BF16 and the SIMT kernel for FP32, each item against the FP64 reference through the
// tolerance helper and with the bits of the unbatched call on it; every layout, odd shapes
// (rows not a multiple of 8: the padded copy, its batch stride rescaled), an operand shared
// over the batch, the bias and beta = 1. Then swap_axes (the head split and merge), bit for
// bit against the CPU backend. Small shapes: the emulator runs every thread of every block.
#include "tests/gpu/gpu_test_util.h"
#include "tests/kernels/batched_gemm_case.h"

using namespace belay;
using namespace belay::test;

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

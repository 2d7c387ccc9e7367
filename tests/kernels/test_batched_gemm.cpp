// The batched GEMM (GemmArgs batch, stride_a, stride_b) on every CPU ISA path this CPU has,
// and on the emulated AMX tiles: each item against the FP64 reference through the tolerance
// helper and with the bits of the unbatched call on it; FP32, FP16 and BF16 inputs, every
// layout, odd shapes, an operand shared over the batch (stride 0), the bias, beta = 1; and
// what check_gemm refuses.
#include <catch2/catch.hpp>

#include "engine/error.h"
#include "kernels/cpu/cpu_gemm.h"
#include "tests/kernels/batched_gemm_case.h"

using namespace belay;
using namespace belay::test;

namespace {

// Odd extents in every role (edges of every micro-kernel), batches of 1 to 5.
const GemmCase kShapes[] = {{1, 1, 1}, {7, 5, 9}, {33, 17, 40}, {5, 70, 3}};

void batched_suite(const std::function<void(const GemmArgs&)>& gemm, const std::vector<DType>& dtypes) {
  uint64_t seed = 100;
  for (DType in : dtypes)
    for (const GemmCase& s : kShapes)
      for (bool ta : {false, true})
        for (bool tb : {false, true}) {
          const int64_t batch = 1 + (s.m + s.n + ta + 2 * tb) % 5;
          run_batched_case({batch, s.m, s.n, s.k, ta, tb}, in, in, DType::F32, Device::cpu(), seed++, gemm);
          run_batched_case({batch, s.m, s.n, s.k, ta, tb, false, true}, in, in, DType::F32, Device::cpu(), seed++,
                           gemm);
          run_batched_case({3, s.m, s.n, s.k, ta, tb, true, false, true, true}, in, DType::F32, DType::F32,
                           Device::cpu(), seed++, gemm);
        }
}

}  // namespace

TEST_CASE("cpu batched gemm: each item matches FP64 and the unbatched call's bits, on every ISA path",
          "[kernels][cpu][isa][bmm]") {
  for (CpuIsa isa : kAllCpuIsas) {
    if (!cpu_isa_available(isa)) continue;  // test_cpu_isa.cpp reports the paths this CPU lacks
    INFO("path " << cpu_isa_name(isa));
    batched_suite([isa](const GemmArgs& a) { cpu_gemm_on(isa, a); }, {DType::F32, DType::F16, DType::BF16});
  }
  amx_emulator_reset_faults();
  batched_suite(cpu_gemm_amx_emulated, {DType::BF16});
  CHECK(amx_emulator_faults() == 0);
}

TEST_CASE("cpu batched gemm: operands that do not hold the batch are refused", "[kernels][cpu][bmm]") {
  const Tensor a = gemm_random_tensor(Shape{3, 4, 5}, DType::F32, 1), b = gemm_random_tensor(Shape{3, 5, 2}, DType::F32, 2);
  Tensor c = Tensor::empty(Shape{3, 4, 2});
  GemmArgs args;
  args.a = &a;
  args.b = &b;
  args.c = &c;
  args.batch = 3;
  args.stride_a = 20;
  args.stride_b = 10;
  cpu_gemm(args);  // fits
  args.stride_b = 11;  // not a whole number of rows
  CHECK_THROWS_WITH(cpu_gemm(args), Catch::Contains("does not hold 3 matrices"));
  args.stride_b = 10;
  args.batch = 4;  // past the end of A
  CHECK_THROWS_WITH(cpu_gemm(args), Catch::Contains("does not hold 4 matrices"));
  args.batch = 3;
  Tensor small = Tensor::empty(Shape{2, 4, 2});
  args.c = &small;
  CHECK_THROWS_WITH(cpu_gemm(args), Catch::Contains("dense"));
  // Unbatched calls still take matrices only.
  args.c = &c;
  args.batch = 1;
  CHECK_THROWS_WITH(cpu_gemm(args), Catch::Contains("expected matrices"));
}

// The CUDA backend's edges that the op tests do not reach: shape errors said before any
// launch, a product beyond the kernels' grid, the device memory the caching allocator gives
// back, and the occupancy the benchmark reports. Found by the line coverage of the GPU path
// (tests/emulation/line_coverage.sh, docs/gpu-path-uncovered.md).
#include <string>

#include "engine/allocator.h"
#include "engine/error.h"
#include "kernels/cuda/gemm_kernels.h"
#include "tests/gpu/gpu_test_util.h"

using namespace belay;
using namespace belay::test;

namespace {

// The error's message, or "" when none was thrown.
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("cuda transpose and sum_rows refuse shapes that do not match, naming both", "[gpu][errors]") {
  BELAY_REQUIRE_GPU();
  Tensor x = Tensor::zeros(Shape{3, 5}, DType::F32, Device::cuda());
  Tensor same = Tensor::zeros(Shape{3, 5}, DType::F32, Device::cuda());
  Tensor half_t = Tensor::zeros(Shape{5, 3}, DType::F16, Device::cuda());
  CHECK(error_of([&] { gpu().transpose(x, same); }).find("transpose: expected x [M, N] and out [N, M]") == 0);
  CHECK(error_of([&] { gpu().transpose(x, half_t); }).find("transpose: expected") == 0);
  Tensor row4 = Tensor::zeros(Shape{4}, DType::F32, Device::cuda());
  CHECK(error_of([&] { gpu().sum_rows(x, row4, false); }).find("sum_rows: expected x [M, N] and out [N]") == 0);
  Tensor row5 = Tensor::zeros(Shape{5}, DType::F32, Device::cuda());
  CHECK(error_of([&] { gpu().sum_rows(x, row5, false); }).empty());  // the right shape passes
}

TEST_CASE("cuda gemm refuses M beyond its grid (65535 row tiles) before launching", "[gpu][errors]") {
  BELAY_REQUIRE_GPU();
  // FP32 uses 64-row tiles: M = 65535 * 64 + 1 needs one tile more than gridDim.y holds.
  // K = N = 1, so the operands are 16 MiB each; nothing is written or launched.
  const int64_t m = 65535 * 64 + 1;
  Tensor a = Tensor::empty(Shape{m, 1}, DType::F32, Device::cuda());
  Tensor b = Tensor::empty(Shape{1, 1}, DType::F32, Device::cuda());
  Tensor c = Tensor::empty(Shape{m, 1}, DType::F32, Device::cuda());
  GemmArgs g;
  g.a = &a;
  g.b = &b;
  g.c = &c;
  const std::string said = error_of([&] { gpu().gemm(g); });
  CHECK(said.find("beyond the CUDA kernels' limits (M <= 4194240 for fp32") != std::string::npos);
  CHECK(said.find("split the product") != std::string::npos);
}

TEST_CASE("cuda device memory the caching allocator releases goes back to the device", "[gpu][memory]") {
  BELAY_REQUIRE_GPU();
  CachingAllocator& alloc = allocator_for(Device::cuda());
  { Tensor t = Tensor::empty(Shape{12345}, DType::F32, Device::cuda()); }  // freed: cached
  REQUIRE(alloc.stats().bytes_cached > 0);
  alloc.release_cached();
  CHECK(alloc.stats().bytes_cached == 0);
  // The next block of that size comes from the device again, and works.
  const uint64_t before = alloc.stats().system_allocs;
  Tensor t = Tensor::full(Shape{12345}, 1.5f, DType::F32, Device::cuda());
  CHECK(alloc.stats().system_allocs == before + 1);
  CHECK(t.to(Device::cpu()).to_vector()[12344] == 1.5f);
}

TEST_CASE("cuda tensor-core GEMM: the occupancy its __launch_bounds__ ask for", "[gpu][gemm]") {
  BELAY_REQUIRE_GPU();
  // The default 4 warps ask for 2 blocks per SM (gemm_layout.h, kBlocksPerSm), 8 warps or a
  // deeper pipeline for 1: shared memory (and on a GPU registers) must allow them, or the
  // kernel runs at a fraction of the occupancy designed.
  CHECK(gemm_tensor_core_blocks_per_sm() >= gemm::kBlocksPerSm);
}

TEST_CASE("cuda: a device allocation refused says out of memory, and the next launch is not blamed for it",
          "[gpu][memory]") {
  BELAY_REQUIRE_GPU();
  // 1 TiB: more than any GPU (and the emulated device's 4 GiB) has. cudaMalloc's error is
  // not sticky but stays the "last error"; the backend clears it, so the kernels after it run.
  const std::string said = error_of([] { Tensor::empty(Shape{int64_t{1} << 38}, DType::F32, Device::cuda()); });
  CHECK(said.find("out of memory allocating 1099511627776 bytes") == 0);
  Tensor t = Tensor::full(Shape{1000}, 2.5f, DType::F32, Device::cuda());
  Tensor doubled = Tensor::empty(Shape{1000}, DType::F32, Device::cuda());
  gpu().scale(t, 2.0f, doubled);
  CHECK(doubled.to(Device::cpu()).to_vector()[999] == 5.0f);
}

// Tests of the SIMT emulator itself (kernels/cuda/emulation/): small kernels defined here,
// compiled as the emulated build compiles kernels/cuda/*.cu (cuda_shim.h included first, the
// race check's load/store hooks on), launched through the seam (cuda::launch) with memory from
// the emulated runtime. Only BELAY_CUDA_EMULATION builds compile this file.
//
// A kernel fault is sticky for the whole process, as on a GPU: every case that makes a kernel
// fault is a TEST_CASE of its own (CTest runs each discovered case in its own process), and is
// the only thing that faults in it. Running this binary by hand runs all cases in one process:
// give it a test name to run one.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cuda/device_access.cuh"
#include "kernels/cuda/emulation/simt.h"
#include "kernels/cuda/simt_seam.cuh"
#include "tests/emulation/emu_test_util.h"

namespace {

using belay::cuda::launch;
using namespace belay::emu_test;

// ---- Kernels ------------------------------------------------------------------------------------

// Case 1. Each thread claims the slot its coordinates name and records what it saw there.
constexpr int kCoordFields = 12;
__global__ void coords_kernel(unsigned* record, int* claims, int slots, int* out_of_range) {
  const unsigned block_linear = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  const unsigned thread_linear = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  const unsigned slot = block_linear * (blockDim.x * blockDim.y * blockDim.z) + thread_linear;
  if (slot >= static_cast<unsigned>(slots)) {
    atomicAdd(out_of_range, 1);
    return;
  }
  atomicAdd(&claims[slot], 1);
  unsigned* r = record + static_cast<size_t>(slot) * kCoordFields;
  r[0] = threadIdx.x, r[1] = threadIdx.y, r[2] = threadIdx.z;
  r[3] = blockIdx.x, r[4] = blockIdx.y, r[5] = blockIdx.z;
  r[6] = blockDim.x, r[7] = blockDim.y, r[8] = blockDim.z;
  r[9] = gridDim.x, r[10] = gridDim.y, r[11] = gridDim.z;
}

// Case 2. Each block reverses its slice through shared memory, ordered by the barrier.
constexpr int kReverseMax = 256;
__global__ void reverse_kernel(const float* in, float* out, int n) {
  BELAY_SHARED(float, s, [kReverseMax]);
  const int t = static_cast<int>(threadIdx.x);
  const float* src = in + static_cast<size_t>(blockIdx.x) * n;
  s[t] = src[t];
  __syncthreads();
  out[static_cast<size_t>(blockIdx.x) * n + t] = s[n - 1 - t];
}

// Case 3. Thread t writes s[t] and reads s[t + 1], which thread t + 1 writes: with the
// barrier between them this is correct; without it, a race whichever thread runs first.
template <bool Barrier>
__global__ void neighbour_kernel(float* out) {
  BELAY_SHARED(float, s, [65]);
  const int t = static_cast<int>(threadIdx.x);
  s[t] = static_cast<float>(t);
  if (t == 0) s[blockDim.x] = static_cast<float>(blockDim.x);
  if (Barrier) __syncthreads();
  out[t] = s[t + 1];
}

// Case 4. The lower half of the block leaves; the upper half waits at a barrier it can never pass.
__global__ void divergent_barrier_kernel(int* out) {
  if (threadIdx.x < blockDim.x / 2) return;
  __syncthreads();
  out[threadIdx.x] = 1;
}

// Case 5. Warp collectives: each thread writes its results to its own row of `out`.
constexpr int kShuffleFields = 6;
__global__ void shuffle_kernel(int* out, double* out_d) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int warp = static_cast<int>(threadIdx.x) / 32;
  int* row = out + static_cast<size_t>(threadIdx.x) * kShuffleFields;
  // Tree reduction downwards: lane 0 ends with the warp's sum.
  int down = static_cast<int>(threadIdx.x) + 1;
  for (int offset = 16; offset > 0; offset /= 2) down += __shfl_down_sync(0xffffffffu, down, offset);
  row[0] = down;
  // Butterfly: every lane ends with the warp's sum.
  int butterfly = lane * lane + warp * 1000;
  for (int mask = 16; mask > 0; mask /= 2) butterfly += __shfl_xor_sync(0xffffffffu, butterfly, mask);
  row[1] = butterfly;
  // Lane parity: the odd lanes' bits.
  row[2] = static_cast<int>(__ballot_sync(0xffffffffu, lane & 1));
  // Broadcast from lane 5.
  row[3] = __shfl_sync(0xffffffffu, lane * 7 + warp, 5);
  // Upwards by 1: lane 0 keeps its own value.
  row[4] = __shfl_up_sync(0xffffffffu, lane + 100, 1);
  // __any_sync / __all_sync packed into one field.
  row[5] = __any_sync(0xffffffffu, lane == 31) * 10 + __all_sync(0xffffffffu, lane < 31);
  // An 8-byte payload through the butterfly.
  double d = 0.5 * lane;
  for (int mask = 16; mask > 0; mask /= 2) d += __shfl_xor_sync(0xffffffffu, d, mask);
  out_d[threadIdx.x] = d;
}

// Case 6. Uses all of its dynamic shared memory: each thread fills a stripe, then (after the
// barrier) sums its neighbour's stripe.
__global__ void dynamic_smem_kernel(float* out, int floats_per_thread) {
  BELAY_SHARED_DYNAMIC(float, s, 16);
  const int t = static_cast<int>(threadIdx.x);
  for (int i = 0; i < floats_per_thread; ++i) s[t * floats_per_thread + i] = static_cast<float>(t);
  __syncthreads();
  const int other = (t + 1) % static_cast<int>(blockDim.x);
  float sum = 0.0f;
  for (int i = 0; i < floats_per_thread; ++i) sum += s[other * floats_per_thread + i];
  out[t] = sum;
}

__global__ void fill_kernel(int* out, int value) { out[threadIdx.x] = value; }

// Case 6 too: a kernel with a bound of 64 threads (registered with the emulator through the
// generated unit this file is compiled through, as every kernel file is).
constexpr int kBoundedThreads = 64;
__global__ void __launch_bounds__(kBoundedThreads) bounded_fill_kernel(int* out, int value) {
  out[threadIdx.x] = value;
}

// Case 8. Reads shared memory before anything wrote it, then scribbles over it so that a
// block reusing the memory would see the scribble.
constexpr int kUninitThreads = 64;
__global__ void uninit_kernel(uint32_t* out_u, uint32_t* out_f, uint32_t* out_dyn) {
  BELAY_SHARED(uint32_t, u, [kUninitThreads]);
  BELAY_SHARED(float, f, [kUninitThreads]);
  BELAY_SHARED_DYNAMIC(uint8_t, dyn, 16);
  const int t = static_cast<int>(threadIdx.x);
  const size_t at = static_cast<size_t>(blockIdx.x) * kUninitThreads + t;
  out_u[at] = u[t];
  const float v = f[t];
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  out_f[at] = bits;
  out_dyn[at] = dyn[t];
  __syncthreads();
  u[t] = 0;
  f[t] = 1.0f;
  dyn[t] = 0;
}

// Case 9. Vector accesses as the kernels make them (device_access.cuh's load_vector and
// store_vector): thread t loads the float4 at in + load_at + 4t and stores the float2 of its
// pair sums at out + store_at + 2t. An offset of 1 float puts the access 4 bytes off the
// float4's (or float2's) alignment.
constexpr int kVectorThreads = 32;
__global__ void vector_kernel(const float* in, float* out, int load_at, int store_at) {
  const int t = static_cast<int>(threadIdx.x);
  const float4 v = belay::cuda::load_vector(reinterpret_cast<const float4*>(in + load_at + 4 * t));
  belay::cuda::store_vector(reinterpret_cast<float2*>(out + store_at + 2 * t), make_float2(v.x + v.y, v.z + v.w));
}

// Case 10. cp.async as the tensor-core GEMM issues it (the emulator's twin of its PTX):
// thread t copies 16 bytes from in + src_at + 4t into its own chunk of shared memory at
// float dst_at + 4t, waits, and writes the chunk out.
__global__ void cp_async_kernel(const float* in, float* out, int src_at, int dst_at) {
  BELAY_SHARED(float4, s, [kVectorThreads + 1]);
  float* f = reinterpret_cast<float*>(&s[0]);
  const int t = static_cast<int>(threadIdx.x);
  belay::emu::cp_async_16(static_cast<uint32_t>(__cvta_generic_to_shared(f + dst_at + 4 * t)), in + src_at + 4 * t,
                          16);
  belay::emu::cp_async_commit();
  belay::emu::cp_async_wait(0);
  for (int i = 0; i < 4; ++i) out[4 * t + i] = f[dst_at + 4 * t + i];
}

// Inputs for cases 9 and 10: one float4 per thread, and one float more for the offset.
std::vector<float> vector_input() {
  std::vector<float> in(4 * kVectorThreads + 4);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(i);
  return in;
}

// A launch that must fault with a misaligned address: the error is
// cudaErrorMisalignedAddress (not a launch failure), its message names the kernel and the
// access, and it is sticky, as after the fault on a GPU.
void require_misaligned_fault(const char* kernel, const char* access) {
  const cudaError_t e = cudaDeviceSynchronize();
  INFO(cudaGetErrorName(e));
  REQUIRE(e == cudaErrorMisalignedAddress);
  const std::string text = cudaGetErrorString(e);
  INFO(text);
  CHECK(text.find("misaligned address") != std::string::npos);
  CHECK(text.find(kernel) != std::string::npos);
  CHECK(text.find(access) != std::string::npos);
  CHECK(belay::emu::faults_reported() >= 1);
  CHECK(cudaGetLastError() == cudaErrorMisalignedAddress);
  void* p = nullptr;
  CHECK(cudaMalloc(&p, 16) == cudaErrorMisalignedAddress);  // sticky
  CHECK(cudaDeviceSynchronize() == cudaErrorMisalignedAddress);
}

}  // namespace

// 1. Every thread of a 2D grid of 3D blocks runs exactly once and sees its own
//    threadIdx/blockIdx and the launch's blockDim/gridDim.
TEST_CASE("thread and block coordinates: each thread once, with its own coordinates", "[emu]") {
  const dim3 grid(3, 2), block(4, 3, 2);
  const int per_block = 4 * 3 * 2, slots = 3 * 2 * per_block;
  unsigned* record = device_alloc<unsigned>(static_cast<size_t>(slots) * kCoordFields);
  int* claims = device_copy(std::vector<int>(slots, 0));
  int* out_of_range = device_copy(std::vector<int>(1, 0));
  launch<coords_kernel>(grid, block, 0, nullptr, record, claims, slots, out_of_range);
  REQUIRE_CUDA(cudaGetLastError());
  REQUIRE_CUDA(cudaDeviceSynchronize());
  const auto rec = host_copy(record, static_cast<size_t>(slots) * kCoordFields);
  const auto cl = host_copy(claims, slots);
  CHECK(host_copy(out_of_range, 1)[0] == 0);
  for (unsigned bz = 0; bz < 1; ++bz)
    for (unsigned by = 0; by < 2; ++by)
      for (unsigned bx = 0; bx < 3; ++bx)
        for (unsigned tz = 0; tz < 2; ++tz)
          for (unsigned ty = 0; ty < 3; ++ty)
            for (unsigned tx = 0; tx < 4; ++tx) {
              const unsigned slot = (bx + 3 * by) * per_block + tx + 4 * (ty + 3 * tz);
              INFO("block (" << bx << "," << by << "," << bz << ") thread (" << tx << "," << ty << "," << tz << ")");
              REQUIRE(cl[slot] == 1);
              const unsigned* r = &rec[static_cast<size_t>(slot) * kCoordFields];
              const std::vector<unsigned> got(r, r + kCoordFields);
              const std::vector<unsigned> want{tx, ty, tz, bx, by, bz, 4, 3, 2, 3, 2, 1};
              CHECK(got == want);
            }
  REQUIRE_CUDA(cudaFree(record));
  REQUIRE_CUDA(cudaFree(claims));
  REQUIRE_CUDA(cudaFree(out_of_range));
}

// 2. __syncthreads orders shared memory: a block-wide reverse through BELAY_SHARED is exact
//    (and the race check stays quiet) on every launch. The seed is fixed per process
//    (BELAY_EMU_SEED), but each launch draws a fresh thread and block order from it.
TEST_CASE("__syncthreads orders shared memory: reverse through BELAY_SHARED", "[emu]") {
  for (int n : {kReverseMax, 200, 33}) {
    for (int rep = 0; rep < 3; ++rep) {
      const int blocks = 3;
      std::vector<float> in(static_cast<size_t>(blocks) * n);
      for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(i * 3 + rep);
      float* d_in = device_copy(in);
      float* d_out = device_alloc<float>(in.size());
      launch<reverse_kernel>(dim3(blocks), dim3(n), 0, nullptr, d_in, d_out, n);
      REQUIRE_CUDA(cudaGetLastError());
      REQUIRE_CUDA(cudaDeviceSynchronize());
      const auto out = host_copy(d_out, in.size());
      INFO("n " << n << " rep " << rep);
      for (int b = 0; b < blocks; ++b)
        for (int t = 0; t < n; ++t) REQUIRE(out[static_cast<size_t>(b) * n + t] == in[static_cast<size_t>(b) * n + n - 1 - t]);
      REQUIRE_CUDA(cudaFree(d_in));
      REQUIRE_CUDA(cudaFree(d_out));
    }
  }
}

// 3a. The control for 3b: the neighbour exchange with its barrier runs clean and reads the
//     neighbour's value (so 3b's fault is the missing barrier, not the kernel).
TEST_CASE("race check: the neighbour exchange with a barrier is clean", "[emu]") {
  float* out = device_alloc<float>(64);
  launch<neighbour_kernel<true>>(dim3(1), dim3(64), 0, nullptr, out);
  REQUIRE_CUDA(cudaGetLastError());
  REQUIRE_CUDA(cudaDeviceSynchronize());
  const auto h = host_copy(out, 64);
  for (int t = 0; t < 64; ++t) CHECK(h[t] == static_cast<float>(t + 1));
  REQUIRE_CUDA(cudaFree(out));
}

// 3b. The race check fires: without the barrier, thread t reads s[t + 1] in the interval in
//     which thread t + 1 writes it. The launch fails with the race in its message, and the
//     fault is sticky, as after a fault on a GPU. (Faults: its own process.)
TEST_CASE("race check: a write and a neighbour's read without a barrier fault", "[emu][fault]") {
  float* out = device_alloc<float>(64);
  REQUIRE(belay::emu::faults_reported() == 0);
  launch<neighbour_kernel<false>>(dim3(1), dim3(64), 0, nullptr, out);
  const cudaError_t e = cudaDeviceSynchronize();
  REQUIRE(e == cudaErrorLaunchFailure);
  const std::string text = cudaGetErrorString(e);
  INFO(text);
  CHECK(text.find("shared-memory race") != std::string::npos);
  // The report names the kernel. (Not its template arguments: under clang, kernel_name<K>()'s
  // __PRETTY_FUNCTION__ spells a function-template argument without them.)
  CHECK(text.find("neighbour_kernel") != std::string::npos);
  CHECK(belay::emu::faults_reported() >= 1);
  void* p = nullptr;
  CHECK(cudaMalloc(&p, 16) == cudaErrorLaunchFailure);  // sticky
  CHECK(cudaDeviceSynchronize() == cudaErrorLaunchFailure);
}

// 4. A barrier that half the block never reaches (they returned) is reported as a divergent
//    __syncthreads, not run past or hung on. (Faults: its own process.)
TEST_CASE("a divergent __syncthreads faults", "[emu][fault]") {
  int* out = device_copy(std::vector<int>(64, 0));
  launch<divergent_barrier_kernel>(dim3(1), dim3(64), 0, nullptr, out);
  const cudaError_t e = cudaDeviceSynchronize();
  REQUIRE(e == cudaErrorLaunchFailure);
  const std::string text = cudaGetErrorString(e);
  INFO(text);
  CHECK(text.find("divergent __syncthreads") != std::string::npos);
  CHECK(text.find("shared-memory race") == std::string::npos);
}

// 5. Warp shuffles give what the hardware gives, lane by lane: __shfl_down_sync's tree
//    reduction (lanes past the end keep their own value), the __shfl_xor_sync butterfly (in
//    4-byte and 8-byte payloads), __ballot_sync of the lane parity, a __shfl_sync broadcast,
//    __shfl_up_sync and __any_sync/__all_sync; two warps, each on its own.
TEST_CASE("warp shuffles: down reduction, xor butterfly, ballot", "[emu]") {
  const int threads = 64;
  int* out = device_alloc<int>(static_cast<size_t>(threads) * kShuffleFields);
  double* out_d = device_alloc<double>(threads);
  launch<shuffle_kernel>(dim3(1), dim3(threads), 0, nullptr, out, out_d);
  REQUIRE_CUDA(cudaGetLastError());
  REQUIRE_CUDA(cudaDeviceSynchronize());
  const auto h = host_copy(out, static_cast<size_t>(threads) * kShuffleFields);
  const auto hd = host_copy(out_d, threads);
  for (int warp = 0; warp < threads / 32; ++warp) {
    // The down reduction, step by step as the hardware does it.
    std::vector<int> down(32);
    for (int l = 0; l < 32; ++l) down[l] = warp * 32 + l + 1;
    for (int offset = 16; offset > 0; offset /= 2) {
      std::vector<int> next(32);
      for (int l = 0; l < 32; ++l) next[l] = down[l] + (l + offset < 32 ? down[l + offset] : down[l]);
      down = next;
    }
    int butterfly = 0;
    double butterfly_d = 0.0;
    for (int l = 0; l < 32; ++l) {
      butterfly += l * l + warp * 1000;
      butterfly_d += 0.5 * l;
    }
    const int warp_sum = (warp * 32 + 1 + warp * 32 + 32) * 16;
    CHECK(down[0] == warp_sum);
    for (int l = 0; l < 32; ++l) {
      const int* row = &h[static_cast<size_t>(warp * 32 + l) * kShuffleFields];
      INFO("warp " << warp << " lane " << l);
      CHECK(row[0] == down[l]);
      CHECK(row[1] == butterfly);
      CHECK(static_cast<unsigned>(row[2]) == 0xAAAAAAAAu);
      CHECK(row[3] == 5 * 7 + warp);
      CHECK(row[4] == (l == 0 ? 100 : l - 1 + 100));
      CHECK(row[5] == 10);  // any(lane == 31) and not all(lane < 31)
      CHECK(hd[warp * 32 + l] == butterfly_d);
    }
  }
  REQUIRE_CUDA(cudaFree(out));
  REQUIRE_CUDA(cudaFree(out_d));
}

// 6. Launch configuration errors are refused at the launch, as the runtime refuses them,
//    and are not sticky: cudaGetLastError reports them once and the next launch runs.
//    Dynamic shared memory above 48 KiB needs the per-kernel opt-in, which stops at 227 KiB.
TEST_CASE("launch configuration errors are reported and not sticky", "[emu]") {
  int* out = device_copy(std::vector<int>(256, 0));
  REQUIRE_CUDA(cudaGetLastError());

  SECTION("a block of 1025 threads") {
    launch<fill_kernel>(dim3(1), dim3(1025), 0, nullptr, out, 7);
    CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
    CHECK(cudaGetLastError() == cudaSuccess);  // reported once
    launch<fill_kernel>(dim3(1), dim3(256), 0, nullptr, out, 7);
    REQUIRE_CUDA(cudaGetLastError());
    REQUIRE_CUDA(cudaDeviceSynchronize());
    for (int v : host_copy(out, 256)) CHECK(v == 7);
    // The other limits of a block and a grid: 2048 threads with every dimension in range,
    // a block's z past 64, an empty grid, a grid's y past 65535.
    launch<fill_kernel>(dim3(1), dim3(32, 32, 2), 0, nullptr, out, 7);
    CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
    launch<fill_kernel>(dim3(1), dim3(1, 1, 65), 0, nullptr, out, 7);
    CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
    launch<fill_kernel>(dim3(0), dim3(32), 0, nullptr, out, 7);
    CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
    launch<fill_kernel>(dim3(1, 65536), dim3(32), 0, nullptr, out, 7);
    CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
  }

  SECTION("more threads than the kernel's __launch_bounds__") {
    launch<bounded_fill_kernel>(dim3(1), dim3(kBoundedThreads + 1), 0, nullptr, out, 5);
    CHECK(cudaGetLastError() == cudaErrorLaunchOutOfResources);
    CHECK(cudaGetLastError() == cudaSuccess);  // reported once, not sticky
    launch<bounded_fill_kernel>(dim3(1), dim3(kBoundedThreads), 0, nullptr, out, 5);
    REQUIRE_CUDA(cudaGetLastError());
    REQUIRE_CUDA(cudaDeviceSynchronize());
    const auto h = host_copy(out, 256);
    for (int t = 0; t < 256; ++t) CHECK(h[t] == (t < kBoundedThreads ? 5 : 0));
  }

  SECTION("dynamic shared memory above 48 KiB needs cudaFuncSetAttribute, up to 227 KiB") {
    const int threads = 256;
    const size_t bytes = 64 << 10;
    const int floats_per_thread = static_cast<int>(bytes / sizeof(float)) / threads;
    float* d = device_alloc<float>(threads);
    launch<dynamic_smem_kernel>(dim3(1), dim3(threads), bytes, nullptr, d, floats_per_thread);
    CHECK(cudaGetLastError() == cudaErrorInvalidValue);
    CHECK(cudaGetLastError() == cudaSuccess);
    // 228 KiB (a whole SM's shared memory) is past the opt-in limit: refused, not sticky.
    CHECK(cudaFuncSetAttribute(dynamic_smem_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 228 << 10) ==
          cudaErrorInvalidValue);
    CHECK(cudaGetLastError() == cudaErrorInvalidValue);
    // Refused, so the limit is still 48 KiB.
    launch<dynamic_smem_kernel>(dim3(1), dim3(threads), bytes, nullptr, d, floats_per_thread);
    CHECK(cudaGetLastError() == cudaErrorInvalidValue);

    REQUIRE_CUDA(cudaFuncSetAttribute(dynamic_smem_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 65536));
    launch<dynamic_smem_kernel>(dim3(1), dim3(threads), bytes, nullptr, d, floats_per_thread);
    REQUIRE_CUDA(cudaGetLastError());
    REQUIRE_CUDA(cudaDeviceSynchronize());
    const auto h = host_copy(d, threads);
    for (int t = 0; t < threads; ++t) CHECK(h[t] == static_cast<float>(((t + 1) % threads) * floats_per_thread));
    // One byte past the opt-in is refused again.
    launch<dynamic_smem_kernel>(dim3(1), dim3(threads), bytes + 1, nullptr, d, floats_per_thread);
    CHECK(cudaGetLastError() == cudaErrorInvalidValue);
    // 227 KiB, the opt-in's ceiling, is granted and usable.
    REQUIRE_CUDA(cudaFuncSetAttribute(dynamic_smem_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 227 << 10));
    const size_t big = size_t{227} << 10;
    const int big_per_thread = static_cast<int>(big / sizeof(float)) / threads;
    launch<dynamic_smem_kernel>(dim3(1), dim3(threads), big, nullptr, d, big_per_thread);
    REQUIRE_CUDA(cudaGetLastError());
    REQUIRE_CUDA(cudaDeviceSynchronize());
    const auto hb = host_copy(d, threads);
    for (int t = 0; t < threads; ++t) CHECK(hb[t] == static_cast<float>(((t + 1) % threads) * big_per_thread));
    REQUIRE_CUDA(cudaFree(d));
  }
  REQUIRE_CUDA(cudaFree(out));
}

// 7. cudaMalloc past the emulated device's memory (BELAY_EMU_DEVICE_MEMORY, 4096 MiB unless
//    set) fails with cudaErrorMemoryAllocation, without reserving anything, and is not sticky.
TEST_CASE("cudaMalloc beyond the device's memory fails and is not sticky", "[emu]") {
  size_t free_bytes = 0, total = 0;
  REQUIRE_CUDA(cudaMemGetInfo(&free_bytes, &total));
  const size_t ask = size_t{8} << 30;
  REQUIRE(total < ask);  // BELAY_EMU_DEVICE_MEMORY set above 8 GiB would void this case
  void* p = reinterpret_cast<void*>(1);
  CHECK(cudaMalloc(&p, ask) == cudaErrorMemoryAllocation);
  CHECK(p == nullptr);
  CHECK(cudaGetLastError() == cudaErrorMemoryAllocation);
  CHECK(cudaGetLastError() == cudaSuccess);
  size_t free_after = 0;
  REQUIRE_CUDA(cudaMemGetInfo(&free_after, &total));
  CHECK(free_after == free_bytes);
  // The next allocation, and a kernel on it, work.
  int* out = device_alloc<int>(32);
  launch<fill_kernel>(dim3(1), dim3(32), 0, nullptr, out, 3);
  REQUIRE_CUDA(cudaGetLastError());
  REQUIRE_CUDA(cudaDeviceSynchronize());
  for (int v : host_copy(out, 32)) CHECK(v == 3);
  REQUIRE_CUDA(cudaFree(out));
}

// 8. Shared memory nothing wrote reads as 0xFF bytes (a NaN as a float) in every block,
//    static and dynamic alike, even after an earlier block of the grid overwrote its own.
TEST_CASE("uninitialised shared memory reads as 0xFF bytes in a fresh block", "[emu]") {
  const int blocks = 4, n = blocks * kUninitThreads;
  uint32_t* u = device_alloc<uint32_t>(n);
  uint32_t* f = device_alloc<uint32_t>(n);
  uint32_t* dyn = device_alloc<uint32_t>(n);
  for (int rep = 0; rep < 2; ++rep) {  // a second launch: nothing carries over from the first
    launch<uninit_kernel>(dim3(blocks), dim3(kUninitThreads), kUninitThreads, nullptr, u, f, dyn);
    REQUIRE_CUDA(cudaGetLastError());
    REQUIRE_CUDA(cudaDeviceSynchronize());
    const auto hu = host_copy(u, n), hf = host_copy(f, n), hdyn = host_copy(dyn, n);
    for (int i = 0; i < n; ++i) {
      INFO("rep " << rep << " block " << i / kUninitThreads << " thread " << i % kUninitThreads);
      CHECK(hu[i] == 0xFFFFFFFFu);
      CHECK(hf[i] == 0xFFFFFFFFu);
      float v;
      std::memcpy(&v, &hf[i], sizeof v);
      CHECK(std::isnan(v));
      CHECK(hdyn[i] == 0xFFu);
    }
  }
  REQUIRE_CUDA(cudaFree(u));
  REQUIRE_CUDA(cudaFree(f));
  REQUIRE_CUDA(cudaFree(dyn));
}

// 9. Vector accesses: x86 forgives a misaligned one, the GPU faults with
//    cudaErrorMisalignedAddress, and so does the emulator. Aligned ones run and give the values.
TEST_CASE("vector accesses: aligned float4 loads and float2 stores run", "[emu]") {
  float* in = device_copy(vector_input());
  float* out = device_alloc<float>(2 * kVectorThreads + 2);
  launch<vector_kernel>(dim3(1), dim3(kVectorThreads), 0, nullptr, in, out, 0, 0);
  REQUIRE_CUDA(cudaGetLastError());
  REQUIRE_CUDA(cudaDeviceSynchronize());
  CHECK(belay::emu::faults_reported() == 0);
  const auto h = host_copy(out, 2 * kVectorThreads);
  for (int t = 0; t < kVectorThreads; ++t) {
    const float base = 4.0f * t;
    CHECK(h[2 * t] == base + base + 1.0f);
    CHECK(h[2 * t + 1] == base + 2.0f + base + 3.0f);
  }
  REQUIRE_CUDA(cudaFree(in));
  REQUIRE_CUDA(cudaFree(out));
}

// 9b. (Faults: its own process.)
TEST_CASE("vector accesses: a float4 load 4 bytes off its alignment faults", "[emu][fault]") {
  float* in = device_copy(vector_input());
  float* out = device_alloc<float>(2 * kVectorThreads + 2);
  REQUIRE(belay::emu::faults_reported() == 0);
  launch<vector_kernel>(dim3(1), dim3(kVectorThreads), 0, nullptr, in, out, 1, 0);
  require_misaligned_fault("vector_kernel", "loads 16 bytes");
}

// 9c. (Faults: its own process.)
TEST_CASE("vector accesses: a float2 store 4 bytes off its alignment faults", "[emu][fault]") {
  float* in = device_copy(vector_input());
  float* out = device_alloc<float>(2 * kVectorThreads + 2);
  REQUIRE(belay::emu::faults_reported() == 0);
  launch<vector_kernel>(dim3(1), dim3(kVectorThreads), 0, nullptr, in, out, 0, 1);
  require_misaligned_fault("vector_kernel", "stores 8 bytes");
}

// 10. cp.async: both addresses 16-byte aligned copies; a source or a destination 4 bytes off
//     faults with cudaErrorMisalignedAddress.
TEST_CASE("cp.async: aligned source and destination copy", "[emu]") {
  float* in = device_copy(vector_input());
  float* out = device_alloc<float>(4 * kVectorThreads);
  launch<cp_async_kernel>(dim3(1), dim3(kVectorThreads), 0, nullptr, in, out, 4, 4);
  REQUIRE_CUDA(cudaGetLastError());
  REQUIRE_CUDA(cudaDeviceSynchronize());
  CHECK(belay::emu::faults_reported() == 0);
  const auto h = host_copy(out, 4 * kVectorThreads);
  for (int i = 0; i < 4 * kVectorThreads; ++i) CHECK(h[i] == static_cast<float>(i + 4));
  REQUIRE_CUDA(cudaFree(in));
  REQUIRE_CUDA(cudaFree(out));
}

// 10b. (Faults: its own process.)
TEST_CASE("cp.async: a source 4 bytes off 16-byte alignment faults", "[emu][fault]") {
  float* in = device_copy(vector_input());
  float* out = device_alloc<float>(4 * kVectorThreads);
  REQUIRE(belay::emu::faults_reported() == 0);
  launch<cp_async_kernel>(dim3(1), dim3(kVectorThreads), 0, nullptr, in, out, 1, 0);
  require_misaligned_fault("cp_async_kernel", "cp.async from global memory");
}

// 10c. (Faults: its own process.)
TEST_CASE("cp.async: a shared destination 4 bytes off 16-byte alignment faults", "[emu][fault]") {
  float* in = device_copy(vector_input());
  float* out = device_alloc<float>(4 * kVectorThreads);
  REQUIRE(belay::emu::faults_reported() == 0);
  launch<cp_async_kernel>(dim3(1), dim3(kVectorThreads), 0, nullptr, in, out, 0, 1);
  require_misaligned_fault("cp_async_kernel", "cp.async to shared memory");
}

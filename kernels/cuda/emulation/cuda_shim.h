// What CUDA C++ gives a kernel, supplied to a host compiler: the emulated build compiles
// kernels/cuda/*.cu as C++ with this header included first (-include), so the same source
// runs on the CPU under the SIMT emulator (simt.h). The execution-space keywords vanish,
// the built-in coordinates read the running fiber's, and the intrinsics the kernels use call
// the emulator. Shared memory is declared through BELAY_SHARED (simt_seam.cuh): a bare
// __shared__ would silently become a per-thread local here, so it is made a compile error.
#pragma once
#if !BELAY_CUDA_EMULATION
#error "cuda_shim.h is for the emulated build (BELAY_CUDA_EMULATION=1) only"
#endif

// The standard headers the kernels use, before __noinline__ becomes a macro below (the
// library's own headers spell __attribute__((__noinline__))).
#include <algorithm>
#include <array>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <limits>
#include <map>
#include <math.h>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

// Before the runtime headers: host_defines.h keeps a keyword that is already defined.
#define __global__
#define __device__
#define __host__
#define __grid_constant__
#define __launch_bounds__(...)
#define __shared__ belay_emulation_declares_shared_memory_with_BELAY_SHARED
#define __constant__ belay_emulation_has_no_constant_memory

#include <cuda_runtime.h>

#include "kernels/cuda/emulation/simt.h"

#define __noinline__ __attribute__((noinline))

#define threadIdx (::belay::emu::coords().thread_idx)
#define blockIdx (::belay::emu::coords().block_idx)
#define blockDim (::belay::emu::coords().block_dim)
#define gridDim (::belay::emu::coords().grid_dim)
#define warpSize 32

inline void __syncthreads() { ::belay::emu::syncthreads(); }
inline void __syncwarp(unsigned mask = 0xffffffffu) { ::belay::emu::syncwarp(mask); }

inline size_t __cvta_generic_to_shared(const void* p) { return ::belay::emu::shared_address(p); }

namespace belay::emu {
template <class T>
uint64_t to_payload(T v) {
  static_assert(sizeof(T) <= 8, "warp shuffles move at most 8 bytes");
  uint64_t u = 0;
  std::memcpy(&u, &v, sizeof(T));
  return u;
}
template <class T>
T from_payload(uint64_t u) {
  T v;
  std::memcpy(&v, &u, sizeof(T));
  return v;
}
}  // namespace belay::emu

template <class T>
T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
  using namespace belay::emu;
  return from_payload<T>(warp_collective(WarpOp::Shfl, mask, to_payload(v), src, width));
}
template <class T>
T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  using namespace belay::emu;
  return from_payload<T>(warp_collective(WarpOp::ShflUp, mask, to_payload(v), static_cast<int>(delta), width));
}
template <class T>
T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  using namespace belay::emu;
  return from_payload<T>(warp_collective(WarpOp::ShflDown, mask, to_payload(v), static_cast<int>(delta), width));
}
template <class T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
  using namespace belay::emu;
  return from_payload<T>(warp_collective(WarpOp::ShflXor, mask, to_payload(v), lane_mask, width));
}
inline unsigned __ballot_sync(unsigned mask, int pred) {
  return static_cast<unsigned>(belay::emu::warp_collective(belay::emu::WarpOp::Ballot, mask, pred != 0, 0, 32));
}
inline int __any_sync(unsigned mask, int pred) {
  return static_cast<int>(belay::emu::warp_collective(belay::emu::WarpOp::Any, mask, pred != 0, 0, 32));
}
inline int __all_sync(unsigned mask, int pred) {
  return static_cast<int>(belay::emu::warp_collective(belay::emu::WarpOp::All, mask, pred != 0, 0, 32));
}

// Atomics: the fibers of a block never interleave inside a function of the emulator, so a
// plain read-modify-write is atomic here. Out of line (simt.cpp is not instrumented), so the
// race check does not count them as plain accesses.
float atomicAdd(float* p, float v);
double atomicAdd(double* p, double v);
int atomicAdd(int* p, int v);
unsigned atomicAdd(unsigned* p, unsigned v);
int atomicMax(int* p, int v);
int atomicCAS(int* p, int compare, int v);
unsigned atomicCAS(unsigned* p, unsigned compare, unsigned v);

// The runtime's C++ overloads that take a kernel itself (cuda_runtime.h declares them for
// nvcc only): the kernel's host address is its handle here.
template <class F, class = std::enable_if_t<std::is_function_v<F>>>
cudaError_t cudaFuncSetAttribute(F* kernel, cudaFuncAttribute attr, int value) {
  return ::cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel), attr, value);
}
template <class F, class = std::enable_if_t<std::is_function_v<F>>>
cudaError_t cudaFuncGetAttributes(cudaFuncAttributes* attr, F* kernel) {
  return ::cudaFuncGetAttributes(attr, reinterpret_cast<const void*>(kernel));
}
template <class F, class = std::enable_if_t<std::is_function_v<F>>>
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int* blocks, F* kernel, int block_size, size_t smem) {
  return ::cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks, reinterpret_cast<const void*>(kernel), block_size,
                                                         smem);
}

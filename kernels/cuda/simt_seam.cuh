// The three places where a kernel file differs between the GPU build (nvcc) and the emulated
// build (BELAY_CUDA_EMULATION: the same source compiled by the host compiler and run by the
// SIMT emulator in kernels/cuda/emulation/): how a kernel is launched, how it declares
// shared memory and whether its loops are unrolled. Everything else in kernels/cuda/ is the
// same text in both builds.
#pragma once
#include <cuda_runtime.h>

#include <utility>

#if BELAY_CUDA_EMULATION
#include "kernels/cuda/emulation/simt.h"
#endif

// BELAY_UNROLL before a loop is `#pragma unroll` under nvcc, where a kernel's small arrays
// (accumulators, mma fragments) stay in registers only if every index is a constant after
// unrolling. In the emulated build it is nothing: there the arrays live in memory either way,
// and the unrolled bodies cost compile time alone. Under clang with ASan, UBSan and the race
// check's hooks, the SIMT attention unit took 100 s to compile unrolled and 1.4 s not (the
// object 2.3 MB against 0.24 MB). The results do not change: unrolling reorders no operation.
#if BELAY_CUDA_EMULATION
#define BELAY_UNROLL
#else
#define BELAY_UNROLL _Pragma("unroll")
#endif

namespace belay::cuda {

// kernel<<<grid, block, smem, stream>>>(args...), written launch<kernel>(grid, block, smem,
// stream, args...): the triple chevron under nvcc, the emulator's launch otherwise.
template <auto Kernel, class... Args>
void launch(dim3 grid, dim3 block, size_t smem, cudaStream_t stream, Args&&... args) {
#if BELAY_CUDA_EMULATION
  emu::launch_kernel<Kernel>(Kernel, grid, block, smem, stream, std::forward<Args>(args)...);
#else
  Kernel<<<grid, block, smem, stream>>>(std::forward<Args>(args)...);
#endif
}

#if BELAY_CUDA_EMULATION
// A distinct address per declaration (and per instantiation of a kernel template): each
// lambda expression has a type of its own.
template <class Site>
const void* shared_site(Site) {
  static const char site = 0;
  return &site;
}
#endif

}  // namespace belay::cuda

// BELAY_SHARED(double, scratch, [256]);  is  __shared__ double scratch[256];
// BELAY_SHARED_DYNAMIC(uint16_t, smem, 128);  is  extern __shared__ __align__(128) uint16_t smem[];
#if BELAY_CUDA_EMULATION
#define BELAY_SHARED(type, name, dims)                                                           \
  using belay_shared_##name##_t = type dims;                                                     \
  belay_shared_##name##_t& name = *static_cast<belay_shared_##name##_t*>(::belay::emu::block_shared( \
      ::belay::cuda::shared_site([] {}), sizeof(belay_shared_##name##_t), alignof(belay_shared_##name##_t)))
#define BELAY_SHARED_DYNAMIC(type, name, align) type* const name = static_cast<type*>(::belay::emu::dynamic_shared(align))
#else
#define BELAY_SHARED(type, name, dims) __shared__ type name dims
#define BELAY_SHARED_DYNAMIC(type, name, align) extern __shared__ __align__(align) type name[]
#endif

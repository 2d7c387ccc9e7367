// Fixed-order block reductions (no atomics: the same inputs give the same bits on every
// run), for the kernels that reduce a block's values: sums, norms, the guard, softmax, layer
// norm, cross-entropy. Apart from device_access.cuh because CUB's headers are most of a .cu
// file's compile time (elementwise_kernels.cu: 13-16 s of nvcc with them, 6 s without).
#pragma once
#include <cuda_runtime.h>

#include "kernels/cuda/device_access.cuh"

#if !BELAY_CUDA_EMULATION
#include <cub/block/block_reduce.cuh>
#endif

namespace belay::cuda {

// Block reductions: one value per thread, the result given to every thread. On the GPU they
// are CUB's BlockReduce with the raking algorithm at the fixed block size kBlock: a fixed
// reduction tree, so the same inputs give the same bits on every run and every GPU. In the
// emulated build (BELAY_CUDA_EMULATION) they are the portable shared-memory tree below,
// whose barriers the emulator's race check watches; the two trees add in different orders,
// so the emulated bits are not the GPU's (tests compare through the tolerance helper, and
// the repeatability tests hold on each). `scratch` holds blockDim.x values (the portable
// tree's); every launch of a kernel that reduces uses blockDim.x == kBlock.
#if BELAY_CUDA_EMULATION
__device__ __forceinline__ double block_sum(double v, double* scratch) {
  scratch[threadIdx.x] = v;
  __syncthreads();
  for (unsigned stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) scratch[threadIdx.x] += scratch[threadIdx.x + stride];
    __syncthreads();
  }
  const double total = scratch[0];
  __syncthreads();  // scratch may be reused right after
  return total;
}

// The maximum of floats; a NaN anywhere propagates (the loss must see it).
__device__ __forceinline__ float block_max(float v, float* scratch) {
  scratch[threadIdx.x] = v;
  __syncthreads();
  for (unsigned stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) {
      const float o = scratch[threadIdx.x + stride], s = scratch[threadIdx.x];
      scratch[threadIdx.x] = (o > s || o != o) ? o : s;
    }
    __syncthreads();
  }
  const float total = scratch[0];
  __syncthreads();
  return total;
}
#else
struct Plus {
  __device__ __forceinline__ double operator()(double a, double b) const { return a + b; }
};
struct NanPropagatingMax {
  __device__ __forceinline__ float operator()(float s, float o) const { return (o > s || o != o) ? o : s; }
};

template <class T, class Op>
__device__ __forceinline__ T cub_block_reduce(T v, Op op) {
  using Reduce = cub::BlockReduce<T, kBlock, cub::BLOCK_REDUCE_RAKING>;
  __shared__ typename Reduce::TempStorage temp;
  __shared__ T result;
  const T total = Reduce(temp).Reduce(v, op);  // valid in thread 0
  if (threadIdx.x == 0) result = total;
  __syncthreads();
  const T all = result;
  __syncthreads();  // temp and result may be reused right after
  return all;
}

__device__ __forceinline__ double block_sum(double v, double* /*scratch*/) {
  return cub_block_reduce(v, Plus{});
}
__device__ __forceinline__ float block_max(float v, float* /*scratch*/) {
  return cub_block_reduce(v, NanPropagatingMax{});
}
#endif

}  // namespace belay::cuda

// Device-side helpers shared by the CUDA kernels: loads and stores of any belay dtype
// through FP32 (the same bit-exact conversions as the CPU, engine/half_bits.h), 8-wide
// vector loads for the bandwidth-bound passes, and fixed-order block reductions (no
// atomics: the same inputs give the same bits on every run).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "engine/dtype.h"
#include "kernels/common/element_math.h"

#if !BELAY_CUDA_EMULATION
#include <cub/block/block_reduce.cuh>
#endif

// Element i of n, for i = this thread's index, stepping by the grid's thread count: the
// element-wise kernels' loop (any n with any grid).
#define BELAY_GRID_STRIDE(i, n) \
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < (n); i += (int64_t)gridDim.x * blockDim.x)

namespace belay::cuda {

constexpr int kBlock = 256;  // threads per block of the elementwise and reduction kernels

__device__ __forceinline__ float load_f32(const void* base, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::F16: return f16_bits_to_f32(static_cast<const uint16_t*>(base)[i]);
    case DType::BF16: return bf16_bits_to_f32(static_cast<const uint16_t*>(base)[i]);
    default: return static_cast<const float*>(base)[i];
  }
}

__device__ __forceinline__ void store_f32(void* base, DType dtype, int64_t i, float x) {
  switch (dtype) {
    case DType::F16: static_cast<uint16_t*>(base)[i] = f32_to_f16_bits(x); break;
    case DType::BF16: static_cast<uint16_t*>(base)[i] = f32_to_bf16_bits(x); break;
    default: static_cast<float*>(base)[i] = x; break;
  }
}

// A vector access (float2, float4, uint4: 8 or 16 bytes in one transaction): a plain
// dereference on the GPU, which faults (cudaErrorMisalignedAddress) unless p is aligned to
// sizeof(V). x86 forgives a misaligned one, so in the emulated build the address is checked
// first and a misaligned access faults there too, skipping the access. Every vector access of
// the kernels goes through these two: a kernel that dereferenced a vector type itself would
// escape the emulator's check.
template <class V>
__device__ __forceinline__ V load_vector(const V* p) {
#if BELAY_CUDA_EMULATION
  if (!emu::vector_access_aligned(p, sizeof(V), false)) return V{};
#endif
  return *p;
}
template <class V>
__device__ __forceinline__ void store_vector(V* p, const V& v) {
#if BELAY_CUDA_EMULATION
  if (!emu::vector_access_aligned(p, sizeof(V), true)) return;
#endif
  *p = v;
}

// Elements i .. i+7 (i a multiple of 8, base 16-byte aligned): one 16-byte load for 16-bit
// dtypes, two for FP32. Why: the guard and AdamW are bound by memory bandwidth, and 16-byte
// transactions per thread are what reaches it.
__device__ __forceinline__ void load8_f32(const void* base, DType dtype, int64_t i, float out[8]) {
  if (dtype == DType::F32) {
    const float4* p = reinterpret_cast<const float4*>(static_cast<const float*>(base) + i);
    const float4 a = load_vector(p), b = load_vector(p + 1);
    out[0] = a.x; out[1] = a.y; out[2] = a.z; out[3] = a.w;
    out[4] = b.x; out[5] = b.y; out[6] = b.z; out[7] = b.w;
    return;
  }
  const uint4 raw = load_vector(reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(base) + i));
  const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
  for (int w = 0; w < 4; ++w) {
    const uint16_t lo = static_cast<uint16_t>(words[w] & 0xffffu), hi = static_cast<uint16_t>(words[w] >> 16);
    out[2 * w] = dtype == DType::F16 ? f16_bits_to_f32(lo) : bf16_bits_to_f32(lo);
    out[2 * w + 1] = dtype == DType::F16 ? f16_bits_to_f32(hi) : bf16_bits_to_f32(hi);
  }
}

__device__ __forceinline__ void store8_f32(void* base, DType dtype, int64_t i, const float in[8]) {
  if (dtype == DType::F32) {
    float4* p = reinterpret_cast<float4*>(static_cast<float*>(base) + i);
    store_vector(p, make_float4(in[0], in[1], in[2], in[3]));
    store_vector(p + 1, make_float4(in[4], in[5], in[6], in[7]));
    return;
  }
  uint32_t words[4];
  for (int w = 0; w < 4; ++w) {
    const uint16_t lo = dtype == DType::F16 ? f32_to_f16_bits(in[2 * w]) : f32_to_bf16_bits(in[2 * w]);
    const uint16_t hi = dtype == DType::F16 ? f32_to_f16_bits(in[2 * w + 1]) : f32_to_bf16_bits(in[2 * w + 1]);
    words[w] = static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
  }
  store_vector(reinterpret_cast<uint4*>(static_cast<uint16_t*>(base) + i),
               make_uint4(words[0], words[1], words[2], words[3]));
}

__device__ __forceinline__ bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

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

inline int grid_for(int64_t n, int block = kBlock, int cap = 8192) {
  const int64_t blocks = (n + block - 1) / block;
  return static_cast<int>(blocks < cap ? (blocks > 0 ? blocks : 1) : cap);
}

}  // namespace belay::cuda

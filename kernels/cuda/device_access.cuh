// Device-side helpers shared by the CUDA kernels: loads and stores of any belay dtype
// through FP32 (the same bit-exact conversions as the CPU, engine/half_bits.h) and 8-wide
// vector loads for the bandwidth-bound passes. The block reductions are in
// block_reduce.cuh: CUB's headers cost a .cu file 7 of its 13 s of nvcc, so only the
// kernels that reduce include them.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "engine/dtype.h"
#include "kernels/common/element_math.h"

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

// The vector loops of the bandwidth-bound passes (guard, unscale, AdamW): a warp takes 256
// consecutive elements per pass, and each lane the 8 elements [i, i+4) and [i+128, i+132),
// i = span + 4 * lane. Why not 8 consecutive elements a lane: a warp-wide access must cover
// contiguous memory for every 32-byte sector it touches to be used whole. Here each access is
// 512 contiguous bytes of FP32 (a float4 a lane) or 256 of FP16/BF16 (8 bytes a lane), in every
// dtype of a kernel that mixes them (AdamW: a 16-bit gradient and working copy beside FP32
// state). With 8 consecutive FP32 elements a lane, the two float4 of a lane were 32 bytes
// apart and each warp-wide load used half of the sectors it touched (the emulator's memory
// metrics, kernels/cuda/emulation/memory_metrics.h, counted 50%).
constexpr int kVecSpan = 256;  // elements per warp and pass
constexpr int kVecHalf = 128;  // the second run of a lane's 8

// The first element of this thread's 8, for a chunk [start, vec_end) whose length is a multiple
// of kVecSpan; blockDim.x a multiple of 32.
#define BELAY_VEC8_LOOP(i, start, vec_end)                                                                \
  for (int64_t i = (start) + ::belay::cuda::kVecSpan * (int64_t)(threadIdx.x / 32) + 4 * (threadIdx.x % 32); \
       i < (vec_end); i += ::belay::cuda::kVecSpan * (int64_t)(blockDim.x / 32))

// Elements [i, i+4) and [i+kVecHalf, i+kVecHalf+4) (i a multiple of 4, base 16-byte aligned):
// two 16-byte loads for FP32, two 8-byte loads for 16-bit dtypes.
__device__ __forceinline__ void load8_f32(const void* base, DType dtype, int64_t i, float out[8]) {
  for (int h = 0; h < 2; ++h) {
    const int64_t at = i + h * kVecHalf;
    float* o = out + 4 * h;
    if (dtype == DType::F32) {
      const float4 a = load_vector(reinterpret_cast<const float4*>(static_cast<const float*>(base) + at));
      o[0] = a.x; o[1] = a.y; o[2] = a.z; o[3] = a.w;
      continue;
    }
    const uint2 raw = load_vector(reinterpret_cast<const uint2*>(static_cast<const uint16_t*>(base) + at));
    const uint32_t words[2] = {raw.x, raw.y};
    for (int w = 0; w < 2; ++w) {
      const uint16_t lo = static_cast<uint16_t>(words[w] & 0xffffu), hi = static_cast<uint16_t>(words[w] >> 16);
      o[2 * w] = dtype == DType::F16 ? f16_bits_to_f32(lo) : bf16_bits_to_f32(lo);
      o[2 * w + 1] = dtype == DType::F16 ? f16_bits_to_f32(hi) : bf16_bits_to_f32(hi);
    }
  }
}

__device__ __forceinline__ void store8_f32(void* base, DType dtype, int64_t i, const float in[8]) {
  for (int h = 0; h < 2; ++h) {
    const int64_t at = i + h * kVecHalf;
    const float* v = in + 4 * h;
    if (dtype == DType::F32) {
      store_vector(reinterpret_cast<float4*>(static_cast<float*>(base) + at), make_float4(v[0], v[1], v[2], v[3]));
      continue;
    }
    uint32_t words[2];
    for (int w = 0; w < 2; ++w) {
      const uint16_t lo = dtype == DType::F16 ? f32_to_f16_bits(v[2 * w]) : f32_to_bf16_bits(v[2 * w]);
      const uint16_t hi = dtype == DType::F16 ? f32_to_f16_bits(v[2 * w + 1]) : f32_to_bf16_bits(v[2 * w + 1]);
      words[w] = static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
    }
    store_vector(reinterpret_cast<uint2*>(static_cast<uint16_t*>(base) + at), make_uint2(words[0], words[1]));
  }
}

__device__ __forceinline__ bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

inline int grid_for(int64_t n, int block = kBlock, int cap = 8192) {
  const int64_t blocks = (n + block - 1) / block;
  return static_cast<int>(blocks < cap ? (blocks > 0 ? blocks : 1) : cap);
}

}  // namespace belay::cuda

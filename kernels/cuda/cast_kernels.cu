// Dtype conversion and fill on the GPU, through the same bit-exact conversions as the CPU
// (engine/half_bits.h), so a cast gives identical bits on both backends.
// Moves n * (src_size + dst_size) bytes; no flops worth counting.
#include <cstdint>

#include "engine/dtype.h"
#include "kernels/cuda/cuda_kernels.h"

namespace belay {
namespace {

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

__global__ void cast_kernel(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    store_f32(dst, dst_dtype, i, load_f32(src, src_dtype, i));
}

__global__ void fill_kernel(void* dst, DType dtype, int64_t n, float value) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    store_f32(dst, dtype, i, value);
}

int grid_for(int64_t n, int block) {
  const int64_t blocks = (n + block - 1) / block;
  return static_cast<int>(blocks < 4096 ? (blocks > 0 ? blocks : 1) : 4096);
}

}  // namespace

void launch_cast(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  cast_kernel<<<grid_for(n, 256), 256, 0, stream>>>(src, src_dtype, dst, dst_dtype, n);
}

void launch_fill(void* dst, DType dtype, int64_t n, float value, cudaStream_t stream) {
  if (n == 0) return;
  fill_kernel<<<grid_for(n, 256), 256, 0, stream>>>(dst, dtype, n, value);
}

}  // namespace belay

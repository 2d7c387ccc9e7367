// Dtype conversion and fill on the GPU, through the same bit-exact conversions as the CPU
// (engine/half_bits.h), so a cast gives identical bits on both backends.
// Moves n * (src_size + dst_size) bytes; no flops worth counting. The counted cast moves the
// same bytes, plus kCensusFields atomics per block (census_count.cuh).
#include <cstdint>

#include "engine/dtype.h"
#include "kernels/cuda/census_count.cuh"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/simt_seam.cuh"
#include "kernels/cuda/device_access.cuh"

namespace belay {
namespace {

using cuda::grid_for;
using cuda::load_f32;
using cuda::store_f32;

__global__ void cast_kernel(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    store_f32(dst, dst_dtype, i, load_f32(src, src_dtype, i));
}

// dst = src * factor[0] in FP32, rounded once into dst's dtype (the CPU's scale_cast bits).
__global__ void scale_cast_kernel(const float* src, const float* factor, void* dst, DType dst_dtype, int64_t n) {
  const float f = *factor;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    store_f32(dst, dst_dtype, i, src[i] * f);
}

// The cast, and each value's cast_census_class counted as the thread holds it (FP32 in).
__global__ void __launch_bounds__(256) cast_census_kernel(const float* src, void* dst, DType dst_dtype, int64_t n,
                                                          unsigned* record, CensusBounds bounds) {
  BELAY_SHARED(unsigned, block_census, [kCensusFields]);
  cuda::zero_block_census(block_census);
  __syncthreads();
  cuda::ThreadCensus census;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const float v = src[i];
    store_f32(dst, dst_dtype, i, v);
    census.add(cast_census_class(v, bounds), v);
  }
  cuda::flush_census(census, block_census, record);
}

__global__ void fill_kernel(void* dst, DType dtype, int64_t n, float value) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    store_f32(dst, dtype, i, value);
}

}  // namespace

void launch_cast(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  cuda::launch<cast_kernel>(grid_for(n, 256), 256, 0, stream, src, src_dtype, dst, dst_dtype, n);
}

void launch_scale_cast(const float* src, const float* factor, void* dst, DType dst_dtype, int64_t n) {
  if (n == 0) return;
  cuda::launch<scale_cast_kernel>(grid_for(n, 256), 256, 0, nullptr, src, factor, dst, dst_dtype, n);
}

void launch_cast_census(const float* src, void* dst, DType dst_dtype, int64_t n, unsigned* record) {
  if (n == 0) return;
  cuda::launch<cast_census_kernel>(grid_for(n, 256), 256, 0, nullptr, src, dst, dst_dtype, n, record,
                                   census_bounds(dst_dtype == DType::BF16));
}

void launch_fill(void* dst, DType dtype, int64_t n, float value, cudaStream_t stream) {
  if (n == 0) return;
  cuda::launch<fill_kernel>(grid_for(n, 256), 256, 0, stream, dst, dtype, n, value);
}

}  // namespace belay

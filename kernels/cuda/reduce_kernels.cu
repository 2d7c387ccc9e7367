// Reductions on the GPU, deterministic by construction: every thread sums a fixed set of
// elements in a fixed order (in double, as the CPU does), each block combines its threads
// in a fixed tree, and one final block sums the per-block partials in index order. No
// atomics, so a run repeats bit for bit; the grid depends only on n.
// sum / mse forward: read n * dtype_size bytes (mse: both inputs), 1-3 flops per element.
// sum_rows: reads rows * cols elements, writes cols floats.
#include <cmath>
#include <cstdint>

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/device_access.cuh"

namespace belay {
namespace {

using cuda::block_sum;
using cuda::kBlock;
using cuda::load_f32;
using cuda::store_f32;

constexpr int kMaxPartials = 1024;
constexpr int kItemsPerThread = 8;  // before the grid reaches kMaxPartials blocks

enum class ReduceKind { Sum, SquaredDiff };

template <ReduceKind kKind>
__global__ void partial_sums_kernel(const void* x, DType dx, const void* y, DType dy, int64_t n, double* partials) {
  __shared__ double scratch[kBlock];
  double acc = 0.0;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    if constexpr (kKind == ReduceKind::Sum) {
      acc += (double)load_f32(x, dx, i);
    } else {
      const double d = (double)load_f32(x, dx, i) - (double)load_f32(y, dy, i);
      acc += d * d;
    }
  }
  const double total = block_sum(acc, scratch);
  if (threadIdx.x == 0) partials[blockIdx.x] = total;
}

// One block: out[0] = (float)(sum of partials * post_scale).
__global__ void finish_sum_kernel(const double* partials, int64_t count, double post_scale, float* out) {
  __shared__ double scratch[kBlock];
  double acc = 0.0;
  for (int64_t i = threadIdx.x; i < count; i += blockDim.x) acc += partials[i];
  const double total = block_sum(acc, scratch);
  if (threadIdx.x == 0) out[0] = static_cast<float>(total * post_scale);
}

// 32 columns per block, 8 row groups: a warp reads 32 consecutive columns of one row
// (coalesced); group g sums rows g, g+8, ... in order, then thread g = 0 adds the 8 groups
// in order. Why not one thread per column: a bias gradient has few columns and many rows.
constexpr int kColsPerBlock = 32;
constexpr int kRowGroups = kBlock / kColsPerBlock;

__global__ void sum_rows_kernel(const void* x, DType dx, int64_t rows, int64_t cols, float* out, bool accumulate) {
  __shared__ double scratch[kRowGroups][kColsPerBlock];
  const int cx = threadIdx.x % kColsPerBlock, g = threadIdx.x / kColsPerBlock;
  const int64_t col = blockIdx.x * (int64_t)kColsPerBlock + cx;
  double acc = 0.0;
  if (col < cols)
    for (int64_t r = g; r < rows; r += kRowGroups) acc += (double)load_f32(x, dx, r * cols + col);
  scratch[g][cx] = acc;
  __syncthreads();
  if (g == 0 && col < cols) {
    double s = 0.0;
    for (int k = 0; k < kRowGroups; ++k) s += scratch[k][cx];
    out[col] = accumulate ? out[col] + static_cast<float>(s) : static_cast<float>(s);
  }
}

__global__ void mse_backward_kernel(const void* pred, DType dp, const void* target, DType dt, const float* g,
                                    void* dpred, DType dd, int64_t n) {
  const float factor = 2.0f * *g / static_cast<float>(n);  // the CPU's expression, in FP32
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    store_f32(dpred, dd, i, factor * (load_f32(pred, dp, i) - load_f32(target, dt, i)));
}

}  // namespace

int reduce_partials(int64_t n) {
  const int64_t blocks = (n + (int64_t)kBlock * kItemsPerThread - 1) / ((int64_t)kBlock * kItemsPerThread);
  return static_cast<int>(blocks < 1 ? 1 : (blocks > kMaxPartials ? kMaxPartials : blocks));
}

void launch_finish_sum(const double* partials, int64_t count, double post_scale, float* out) {
  finish_sum_kernel<<<1, kBlock>>>(partials, count, post_scale, out);
}

void launch_sum(const void* x, DType dx, int64_t n, double* partials, float* out) {
  const int blocks = reduce_partials(n);
  partial_sums_kernel<ReduceKind::Sum><<<blocks, kBlock>>>(x, dx, nullptr, dx, n, partials);
  launch_finish_sum(partials, blocks, 1.0, out);
}

void launch_mse_forward(const void* pred, DType dp, const void* target, DType dt, int64_t n, double* partials,
                        float* out) {
  const int blocks = reduce_partials(n);
  partial_sums_kernel<ReduceKind::SquaredDiff><<<blocks, kBlock>>>(pred, dp, target, dt, n, partials);
  // The CPU divides the double sum by n: multiplying by 1/n in double differs from that by
  // at most one double rounding, far below the FP32 result's own rounding.
  launch_finish_sum(partials, blocks, n > 0 ? 1.0 / static_cast<double>(n) : NAN, out);
}

void launch_mse_backward(const void* pred, DType dp, const void* target, DType dt, const float* g, void* dpred,
                         DType dd, int64_t n) {
  if (n > 0) mse_backward_kernel<<<cuda::grid_for(n), kBlock>>>(pred, dp, target, dt, g, dpred, dd, n);
}

void launch_sum_rows(const void* x, DType dx, int64_t rows, int64_t cols, float* out, bool accumulate) {
  if (cols == 0) return;
  const int64_t blocks = (cols + kColsPerBlock - 1) / kColsPerBlock;
  sum_rows_kernel<<<static_cast<unsigned>(blocks), kBlock>>>(x, dx, rows, cols, out, accumulate);
}

}  // namespace belay

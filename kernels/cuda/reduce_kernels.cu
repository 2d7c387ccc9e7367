// Reductions on the GPU, deterministic by construction: every thread sums a fixed set of
// elements in a fixed order (in double, as the CPU does), each block combines its threads
// in a fixed tree, and one final block sums the per-block partials in index order. No
// atomics, so a run repeats bit for bit; the grid depends only on n.
// sum / mse forward: read n * dtype_size bytes (mse: both inputs), 1-3 flops per element.
// sum_rows: reads rows * cols elements, writes cols floats (and splits * cols doubles of
// partials when the rows are split).
#include <cmath>
#include <cstdint>

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/simt_seam.cuh"
#include "kernels/cuda/block_reduce.cuh"
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
__global__ void partial_sums_kernel(const void* x, DType x_dtype, const void* y, DType y_dtype, int64_t n,
                                    double* partials) {
  BELAY_SHARED(double, scratch, [kBlock]);
  double acc = 0.0;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    if constexpr (kKind == ReduceKind::Sum) {
      acc += (double)load_f32(x, x_dtype, i);
    } else {
      const double d = (double)load_f32(x, x_dtype, i) - (double)load_f32(y, y_dtype, i);
      acc += d * d;
    }
  }
  const double total = block_sum(acc, scratch);
  if (threadIdx.x == 0) partials[blockIdx.x] = total;
}

// One block: out[0] = (float)(sum of partials * post_scale).
__global__ void finish_sum_kernel(const double* partials, int64_t count, double post_scale, float* out) {
  BELAY_SHARED(double, scratch, [kBlock]);
  double acc = 0.0;
  for (int64_t i = threadIdx.x; i < count; i += blockDim.x) acc += partials[i];
  const double total = block_sum(acc, scratch);
  if (threadIdx.x == 0) out[0] = static_cast<float>(total * post_scale);
}

// 32 columns per block, 8 row groups: a warp reads 32 consecutive columns of one row
// (coalesced); group g sums rows g, g+8, ... of the block's row range in order, then thread
// g = 0 adds the 8 groups in order. A bias gradient has few columns and many rows, so the
// rows are also split into `splits` ranges (blockIdx.y) when the columns alone give too few
// blocks: each range then writes a double partial per column, and sum_rows_finish_kernel
// adds a column's partials in range order. The split depends only on the shape
// (sum_rows_splits), so a run repeats bit for bit on any GPU.
constexpr int kColsPerBlock = 32;
constexpr int kRowGroups = kBlock / kColsPerBlock;
constexpr int64_t kRowsPerSplitMin = 1024;  // fewer rows than this per block: not worth a split
constexpr int64_t kSumRowsTargetBlocks = 512;  // enough blocks to fill an H100's 132 SMs a few times

// partials == nullptr: write (or add to) out directly; else partials[blockIdx.y * cols + col].
__global__ void sum_rows_kernel(const void* x, DType x_dtype, int64_t rows, int64_t cols, int64_t rows_per_split,
                                double* partials, float* out, bool accumulate) {
  BELAY_SHARED(double, scratch, [kRowGroups][kColsPerBlock]);
  const int cx = threadIdx.x % kColsPerBlock, g = threadIdx.x / kColsPerBlock;
  const int64_t col = blockIdx.x * (int64_t)kColsPerBlock + cx;
  const int64_t r0 = blockIdx.y * rows_per_split;
  const int64_t r1 = r0 + rows_per_split < rows ? r0 + rows_per_split : rows;
  double acc = 0.0;
  if (col < cols)
    for (int64_t r = r0 + g; r < r1; r += kRowGroups) acc += (double)load_f32(x, x_dtype, r * cols + col);
  scratch[g][cx] = acc;
  __syncthreads();
  if (g == 0 && col < cols) {
    double s = 0.0;
    for (int k = 0; k < kRowGroups; ++k) s += scratch[k][cx];
    if (partials)
      partials[blockIdx.y * cols + col] = s;
    else
      out[col] = accumulate ? out[col] + static_cast<float>(s) : static_cast<float>(s);
  }
}

// One thread per column: the splits' partials in order, one rounding to FP32.
__global__ void sum_rows_finish_kernel(const double* partials, int64_t splits, int64_t cols, float* out,
                                       bool accumulate) {
  for (int64_t col = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; col < cols;
       col += (int64_t)gridDim.x * blockDim.x) {
    double s = 0.0;
    for (int64_t k = 0; k < splits; ++k) s += partials[k * cols + col];
    out[col] = accumulate ? out[col] + static_cast<float>(s) : static_cast<float>(s);
  }
}

__global__ void mse_backward_kernel(const void* pred, DType pred_dtype, const void* target, DType target_dtype,
                                    const float* g, void* dpred, DType dpred_dtype, int64_t n) {
  const float factor = 2.0f * *g / static_cast<float>(n);  // the CPU's expression, in FP32
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    store_f32(dpred, dpred_dtype, i, factor * (load_f32(pred, pred_dtype, i) - load_f32(target, target_dtype, i)));
}

}  // namespace

int reduce_partials(int64_t n) {
  const int64_t blocks = (n + (int64_t)kBlock * kItemsPerThread - 1) / ((int64_t)kBlock * kItemsPerThread);
  return static_cast<int>(blocks < 1 ? 1 : (blocks > kMaxPartials ? kMaxPartials : blocks));
}

void launch_finish_sum(const double* partials, int64_t count, double post_scale, float* out) {
  cuda::launch<finish_sum_kernel>(1, kBlock, 0, nullptr, partials, count, post_scale, out);
}

void launch_sum(const void* x, DType x_dtype, int64_t n, double* partials, float* out) {
  const int blocks = reduce_partials(n);
  cuda::launch<partial_sums_kernel<ReduceKind::Sum>>(blocks, kBlock, 0, nullptr, x, x_dtype, nullptr, x_dtype, n,
                                                     partials);
  launch_finish_sum(partials, blocks, 1.0, out);
}

void launch_mse_forward(const void* pred, DType pred_dtype, const void* target, DType target_dtype, int64_t n,
                        double* partials, float* out) {
  const int blocks = reduce_partials(n);
  cuda::launch<partial_sums_kernel<ReduceKind::SquaredDiff>>(blocks, kBlock, 0, nullptr, pred, pred_dtype, target,
                                                             target_dtype, n, partials);
  // The CPU divides the double sum by n: multiplying by 1/n in double differs from that by
  // at most one double rounding, far below the FP32 result's own rounding.
  launch_finish_sum(partials, blocks, n > 0 ? 1.0 / static_cast<double>(n) : NAN, out);
}

void launch_mse_backward(const void* pred, DType pred_dtype, const void* target, DType target_dtype, const float* g,
                         void* dpred, DType dpred_dtype, int64_t n) {
  if (n > 0)
    cuda::launch<mse_backward_kernel>(cuda::grid_for(n), kBlock, 0, nullptr, pred, pred_dtype, target, target_dtype, g,
                                      dpred, dpred_dtype, n);
}

int64_t sum_rows_splits(int64_t rows, int64_t cols) {
  const int64_t col_blocks = (cols + kColsPerBlock - 1) / kColsPerBlock;
  if (col_blocks == 0 || col_blocks >= kSumRowsTargetBlocks) return 1;
  const int64_t by_rows = rows / kRowsPerSplitMin;  // each split keeps at least kRowsPerSplitMin rows
  const int64_t by_blocks = (kSumRowsTargetBlocks + col_blocks - 1) / col_blocks;
  const int64_t splits = by_rows < by_blocks ? by_rows : by_blocks;
  return splits < 1 ? 1 : splits;  // at most 512: gridDim.y allows 65535
}

void launch_sum_rows(const void* x, DType x_dtype, int64_t rows, int64_t cols, double* partials, float* out,
                     bool accumulate) {
  if (cols == 0) return;
  const int64_t col_blocks = (cols + kColsPerBlock - 1) / kColsPerBlock;
  const int64_t splits = sum_rows_splits(rows, cols);
  const int64_t rows_per_split = (rows + splits - 1) / splits;
  const dim3 grid(static_cast<unsigned>(col_blocks), static_cast<unsigned>(splits));
  cuda::launch<sum_rows_kernel>(grid, kBlock, 0, nullptr, x, x_dtype, rows, cols,
                                rows_per_split < 1 ? 1 : rows_per_split, splits > 1 ? partials : nullptr, out,
                                accumulate);
  if (splits > 1) cuda::launch<sum_rows_finish_kernel>(cuda::grid_for(cols), kBlock, 0, nullptr, partials, splits, cols, out, accumulate);
}

}  // namespace belay

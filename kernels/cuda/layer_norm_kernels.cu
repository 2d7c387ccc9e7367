// LayerNorm over the last dim on the GPU, and its backward: one block per row (grid-stride over
// rows), as the softmax. The statistics are FP32 values, summed in double with the block's
// fixed tree (so a run repeats bit for bit): mean = sum x / n, var = sum (x - mean)^2 / n,
// rstd = 1 / sqrt(var + eps); y = (x - mean) rstd w + b in FP32 (the CPU's expression),
// rounded once into y's dtype. The backward's dx is per row too; dweight and dbias are sums
// over rows, taken by column: each thread sums one column over a fixed chunk of rows in
// double, then one thread per column adds the chunks in order. No atomics anywhere.
// Bytes: forward reads x twice (the second from L1/L2), writes y and 8 bytes a row; ~8 flops
// per element. Backward: dx reads x and dy twice, writes dx; the parameter sums read x and dy
// once more and write 2 x chunks x cols doubles; ~14 flops per element.
#include <cmath>
#include <cstdint>

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/simt_seam.cuh"
#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/device_access.cuh"
#include "kernels/cuda/row_grid.h"

namespace belay {
namespace {

using cuda::block_sum;
using cuda::kBlock;
using cuda::load_f32;
using cuda::row_blocks;
using cuda::store_f32;

// A LayerNorm parameter's element c, or `absent` when there is none (weight 1, bias 0).
__device__ __forceinline__ float param(const void* p, DType p_dtype, int64_t c, float absent) {
  return p ? load_f32(p, p_dtype, c) : absent;
}

__global__ void layer_norm_kernel(const void* x, DType x_dtype, const void* w, DType w_dtype, const void* b,
                                  DType b_dtype, int64_t rows, int64_t cols, float eps, void* y, DType y_dtype,
                                  float* mean_out, float* rstd_out) {
  BELAY_SHARED(double, scratch, [kBlock]);
  const float nf = static_cast<float>(cols);
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t base = r * cols;
    double s = 0.0;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) s += load_f32(x, x_dtype, base + c);
    const float mean = static_cast<float>(block_sum(s, scratch)) / nf;
    double q = 0.0;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      const float d = load_f32(x, x_dtype, base + c) - mean;
      q += static_cast<double>(d * d);
    }
    const float var = static_cast<float>(block_sum(q, scratch)) / nf;
    const float rstd = 1.0f / sqrtf(var + eps);
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      const float v =
          (load_f32(x, x_dtype, base + c) - mean) * rstd * param(w, w_dtype, c, 1.0f) + param(b, b_dtype, c, 0.0f);
      store_f32(y, y_dtype, base + c, v);
    }
    if (threadIdx.x == 0) {
      mean_out[r] = mean;
      rstd_out[r] = rstd;
    }
  }
}

// dx = rstd ((g - mean(g)) - xhat mean(g xhat)), g = dy w, xhat = (x - mean) rstd.
__global__ void layer_norm_backward_kernel(const void* x, DType x_dtype, const void* w, DType w_dtype,
                                           const float* mean, const float* rstd, const void* dy, DType dy_dtype,
                                           int64_t rows, int64_t cols, void* dx, DType dx_dtype) {
  BELAY_SHARED(double, scratch, [kBlock]);
  const float nf = static_cast<float>(cols);
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t base = r * cols;
    const float mu = mean[r], rs = rstd[r];
    double sg = 0.0, sgx = 0.0;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      const float g = load_f32(dy, dy_dtype, base + c) * param(w, w_dtype, c, 1.0f);
      sg += g;
      sgx += static_cast<double>(g * ((load_f32(x, x_dtype, base + c) - mu) * rs));
    }
    const float mg = static_cast<float>(block_sum(sg, scratch)) / nf;
    const float mgx = static_cast<float>(block_sum(sgx, scratch)) / nf;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      const float xhat = (load_f32(x, x_dtype, base + c) - mu) * rs;
      const float g = load_f32(dy, dy_dtype, base + c) * param(w, w_dtype, c, 1.0f);
      store_f32(dx, dx_dtype, base + c, rs * ((g - mg) - xhat * mgx));
    }
  }
}

// Thread (column c, chunk blockIdx.y): the sums over the chunk's rows, in row order, in double,
// of dy xhat and of dy: partials [chunks, cols] each.
__global__ void layer_norm_param_partials_kernel(const void* x, DType x_dtype, const float* mean, const float* rstd,
                                                 const void* dy, DType dy_dtype, int64_t rows, int64_t cols,
                                                 int64_t rows_per_chunk, double* pw, double* pb) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x, ch = blockIdx.y;
  if (c >= cols) return;
  const int64_t r0 = ch * rows_per_chunk, r1 = r0 + rows_per_chunk < rows ? r0 + rows_per_chunk : rows;
  double sw = 0.0, sb = 0.0;
  for (int64_t r = r0; r < r1; ++r) {
    const float g = load_f32(dy, dy_dtype, r * cols + c);
    sw += static_cast<double>(g * ((load_f32(x, x_dtype, r * cols + c) - mean[r]) * rstd[r]));
    sb += static_cast<double>(g);
  }
  pw[ch * cols + c] = sw;
  pb[ch * cols + c] = sb;
}

// One thread per column: the chunks' partials added in chunk order, then (+)= into FP32.
__global__ void layer_norm_param_finish_kernel(const double* pw, const double* pb, int64_t chunks, int64_t cols,
                                               float* dweight, float* dbias, bool accumulate) {
  BELAY_GRID_STRIDE(c, cols) {
    double sw = 0.0, sb = 0.0;
    for (int64_t ch = 0; ch < chunks; ++ch) {
      sw += pw[ch * cols + c];
      sb += pb[ch * cols + c];
    }
    if (dweight) dweight[c] = accumulate ? dweight[c] + static_cast<float>(sw) : static_cast<float>(sw);
    if (dbias) dbias[c] = accumulate ? dbias[c] + static_cast<float>(sb) : static_cast<float>(sb);
  }
}

}  // namespace

LayerNormChunks layer_norm_chunks(int64_t rows) {
  // 32 rows a chunk (as the CPU), fewer chunks than gridDim.y's limit on tall inputs.
  const int64_t chunks = rows <= 0 ? 1 : ((rows + 31) / 32 < 65535 ? (rows + 31) / 32 : 65535);
  return {chunks, rows <= 0 ? 1 : (rows + chunks - 1) / chunks};
}

void launch_layer_norm(const void* x, DType x_dtype, const void* w, DType w_dtype, const void* b, DType b_dtype,
                       int64_t rows, int64_t cols, float eps, void* y, DType y_dtype, float* mean, float* rstd) {
  if (rows > 0 && cols > 0)
    cuda::launch<layer_norm_kernel>(row_blocks(rows), kBlock, 0, nullptr, x, x_dtype, w, w_dtype, b, b_dtype, rows,
                                    cols, eps, y, y_dtype, mean, rstd);
}

void launch_layer_norm_backward(const void* x, DType x_dtype, const void* w, DType w_dtype, const float* mean,
                                const float* rstd, const void* dy, DType dy_dtype, int64_t rows, int64_t cols, void* dx,
                                DType dx_dtype, double* partials, float* dweight, float* dbias, bool accumulate) {
  if (rows <= 0 || cols <= 0) return;
  cuda::launch<layer_norm_backward_kernel>(row_blocks(rows), kBlock, 0, nullptr, x, x_dtype, w, w_dtype, mean, rstd, dy,
                                           dy_dtype, rows, cols, dx, dx_dtype);
  if (!dweight && !dbias) return;
  const LayerNormChunks k = layer_norm_chunks(rows);
  double *pw = partials, *pb = partials + k.chunks * cols;
  const dim3 grid(static_cast<unsigned>((cols + kBlock - 1) / kBlock), static_cast<unsigned>(k.chunks));
  cuda::launch<layer_norm_param_partials_kernel>(grid, kBlock, 0, nullptr, x, x_dtype, mean, rstd, dy, dy_dtype, rows,
                                                 cols, k.rows_per_chunk, pw, pb);
  cuda::launch<layer_norm_param_finish_kernel>(cuda::grid_for(cols), kBlock, 0, nullptr, pw, pb, k.chunks, cols,
                                               dweight, dbias, accumulate);
}

}  // namespace belay

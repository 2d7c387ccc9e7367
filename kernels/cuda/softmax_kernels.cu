// Softmax and log-softmax over the last dim on the GPU, and their backward: one block per row
// (grid-stride over rows), as the fused cross-entropy. The row maximum is subtracted before
// exp (in FP32, no overflow for large inputs); the normaliser is summed in double with the
// block's fixed tree, so a run repeats bit for bit. causal: row r keeps columns c <= r % cols
// (engine/backend.h), the masked ones get 0 (log: -inf), as on the CPU.
// Bytes: forward reads the row three times (from L1/L2 after the first), writes it once;
// backward reads y and dy twice, writes dx once. Flops: ~2 exp and 4 more per element.
#include <cmath>
#include <cstdint>

#include "kernels/common/unary_math.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/simt_seam.cuh"
#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/device_access.cuh"
#include "kernels/cuda/row_grid.h"

namespace belay {
namespace {

using cuda::block_max;
using cuda::block_sum;
using cuda::kBlock;
using cuda::load_f32;
using cuda::row_blocks;
using cuda::store_f32;

__global__ void softmax_kernel(const void* x, DType x_dtype, int64_t rows, int64_t cols, bool log, bool causal, void* y,
                               DType y_dtype) {
  BELAY_SHARED(double, sum_scratch, [kBlock]);
  BELAY_SHARED(float, max_scratch, [kBlock]);
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t base = r * cols, live = causal ? r % cols + 1 : cols;  // unmasked columns [0, live)
    float mx = -INFINITY;
    for (int64_t c = threadIdx.x; c < live; c += blockDim.x) mx = fmaxf(mx, load_f32(x, x_dtype, base + c));
    mx = block_max(mx, max_scratch);
    double z = 0.0;
    for (int64_t c = threadIdx.x; c < live; c += blockDim.x) z += expf(load_f32(x, x_dtype, base + c) - mx);
    z = block_sum(z, sum_scratch);
    const double log_z = ::log(z);
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      const float shifted = load_f32(x, x_dtype, base + c) - mx;
      float v;
      if (c >= live) v = log ? -INFINITY : 0.0f;
      else v = log ? static_cast<float>(shifted - log_z) : static_cast<float>(expf(shifted) / z);
      store_f32(y, y_dtype, base + c, v);
    }
  }
}

__global__ void softmax_backward_kernel(const void* y, DType y_dtype, const void* g, DType g_dtype, int64_t rows,
                                        int64_t cols, bool log, bool causal, void* dx, DType dx_dtype) {
  BELAY_SHARED(double, sum_scratch, [kBlock]);
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t base = r * cols, live = causal ? r % cols + 1 : cols;
    double s = 0.0;  // softmax: sum(y_dtype y); log-softmax: sum(y_dtype), over the unmasked columns
    for (int64_t c = threadIdx.x; c < live; c += blockDim.x) {
      const double gv = load_f32(g, g_dtype, base + c);
      s += log ? gv : gv * load_f32(y, y_dtype, base + c);
    }
    const float sf = static_cast<float>(block_sum(s, sum_scratch));
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      const float gv = load_f32(g, g_dtype, base + c), v = load_f32(y, y_dtype, base + c);
      store_f32(dx, dx_dtype, base + c, c >= live ? 0.0f : (log ? gv - expf(v) * sf : v * (gv - sf)));
    }
  }
}

}  // namespace

void launch_softmax(const void* x, DType x_dtype, int64_t rows, int64_t cols, bool log, bool causal, void* y,
                    DType y_dtype) {
  if (rows > 0 && cols > 0)
    cuda::launch<softmax_kernel>(row_blocks(rows), kBlock, 0, nullptr, x, x_dtype, rows, cols, log, causal, y, y_dtype);
}

void launch_softmax_backward(const void* y, DType y_dtype, const void* g, DType g_dtype, int64_t rows, int64_t cols,
                             bool log, bool causal, void* dx, DType dx_dtype) {
  if (rows > 0 && cols > 0)
    cuda::launch<softmax_backward_kernel>(row_blocks(rows), kBlock, 0, nullptr, y, y_dtype, g, g_dtype, rows, cols, log,
                                          causal, dx, dx_dtype);
}

}  // namespace belay

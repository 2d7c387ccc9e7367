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
#include "kernels/cuda/device_access.cuh"

namespace belay {
namespace {

using cuda::block_max;
using cuda::block_sum;
using cuda::kBlock;
using cuda::load_f32;
using cuda::store_f32;

constexpr int64_t kMaxRowBlocks = 65535;

__global__ void softmax_kernel(const void* x, DType dx, int64_t rows, int64_t cols, bool log, bool causal, void* y,
                               DType dy) {
  BELAY_SHARED(double, dscratch, [kBlock]);
  BELAY_SHARED(float, fscratch, [kBlock]);
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t base = r * cols, live = causal ? r % cols + 1 : cols;  // unmasked columns [0, live)
    float mx = -INFINITY;
    for (int64_t c = threadIdx.x; c < live; c += blockDim.x) mx = fmaxf(mx, load_f32(x, dx, base + c));
    mx = block_max(mx, fscratch);
    double z = 0.0;
    for (int64_t c = threadIdx.x; c < live; c += blockDim.x) z += expf(load_f32(x, dx, base + c) - mx);
    z = block_sum(z, dscratch);
    const double log_z = ::log(z);
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      const float shifted = load_f32(x, dx, base + c) - mx;
      float v;
      if (c >= live) v = log ? -INFINITY : 0.0f;
      else v = log ? static_cast<float>(shifted - log_z) : static_cast<float>(expf(shifted) / z);
      store_f32(y, dy, base + c, v);
    }
  }
}

__global__ void softmax_backward_kernel(const void* y, DType dy, const void* g, DType dg, int64_t rows, int64_t cols,
                                        bool log, bool causal, void* dx, DType ddx) {
  BELAY_SHARED(double, dscratch, [kBlock]);
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t base = r * cols, live = causal ? r % cols + 1 : cols;
    double s = 0.0;  // softmax: sum(dy y); log-softmax: sum(dy), over the unmasked columns
    for (int64_t c = threadIdx.x; c < live; c += blockDim.x) {
      const double gv = load_f32(g, dg, base + c);
      s += log ? gv : gv * load_f32(y, dy, base + c);
    }
    const float sf = static_cast<float>(block_sum(s, dscratch));
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      const float gv = load_f32(g, dg, base + c), v = load_f32(y, dy, base + c);
      store_f32(dx, ddx, base + c, c >= live ? 0.0f : (log ? gv - expf(v) * sf : v * (gv - sf)));
    }
  }
}

unsigned row_blocks(int64_t rows) { return static_cast<unsigned>(rows < kMaxRowBlocks ? rows : kMaxRowBlocks); }

}  // namespace

void launch_softmax(const void* x, DType dx, int64_t rows, int64_t cols, bool log, bool causal, void* y, DType dy) {
  if (rows > 0 && cols > 0)
    cuda::launch<softmax_kernel>(row_blocks(rows), kBlock, 0, nullptr, x, dx, rows, cols, log, causal, y, dy);
}

void launch_softmax_backward(const void* y, DType dy, const void* g, DType dg, int64_t rows, int64_t cols, bool log,
                             bool causal, void* dx, DType ddx) {
  if (rows > 0 && cols > 0)
    cuda::launch<softmax_backward_kernel>(row_blocks(rows), kBlock, 0, nullptr, y, dy, g, dg, rows, cols, log, causal,
                                          dx, ddx);
}

}  // namespace belay

// Fused cross-entropy on the GPU: one block per row does log-softmax, the row's loss and
// the row's gradient (softmax - onehot) / B in three sweeps over the row; a final block sums
// the row losses in row order. The row maximum is subtracted before exp, so large logits
// never overflow; exp and the normaliser are in double. (The CPU's fused classifier works in
// FP32 with exact differences, kernels/cpu/isa/classifier_rows.h. Each is checked against
// FP64, tests/gpu/test_cuda_reduce.cpp and tests/kernels/test_cross_entropy.cpp; the two agree
// within those bounds, not bit for bit.)
// Bytes: reads B*C logits three times (from L2 for rows that fit) and B labels, writes B*C
// FP32 gradients; flops ~ 2 exp + 4 per element.
#include <cmath>
#include <cstdint>

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/simt_seam.cuh"
#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/device_access.cuh"

namespace belay {
namespace {

using cuda::block_max;
using cuda::block_sum;
using cuda::kBlock;
using cuda::load_f32;

__global__ void cross_entropy_rows_kernel(const void* logits, DType logits_dtype, const void* labels,
                                          DType labels_dtype, int64_t classes, double inv_rows, double* row_loss,
                                          float* dlogits) {
  BELAY_SHARED(double, sum_scratch, [kBlock]);
  BELAY_SHARED(float, max_scratch, [kBlock]);
  const int64_t r = blockIdx.x;
  const int64_t base = r * classes;

  float mx = -INFINITY;
  for (int64_t c = threadIdx.x; c < classes; c += blockDim.x) mx = fmaxf(mx, load_f32(logits, logits_dtype, base + c));
  mx = block_max(mx, max_scratch);

  double z = 0.0;
  for (int64_t c = threadIdx.x; c < classes; c += blockDim.x)
    z += exp((double)load_f32(logits, logits_dtype, base + c) - mx);
  z = block_sum(z, sum_scratch);
  const double log_z = log(z) + mx;

  // A label is a class index held as a float; anything else poisons the row (NaN), since
  // throwing would need the host to look at the labels.
  const float l = load_f32(labels, labels_dtype, r);
  const bool valid = l >= 0.0f && l < static_cast<float>(classes) && l == floorf(l);
  const int64_t label = valid ? static_cast<int64_t>(l) : -1;
  if (threadIdx.x == 0)
    row_loss[r] = valid ? log_z - (double)load_f32(logits, logits_dtype, base + label) : (double)NAN;
  for (int64_t c = threadIdx.x; c < classes; c += blockDim.x) {
    const double p = exp((double)load_f32(logits, logits_dtype, base + c) - log_z);
    dlogits[base + c] = valid ? static_cast<float>((p - (c == label ? 1.0 : 0.0)) * inv_rows) : NAN;
  }
}

}  // namespace

void launch_cross_entropy(const void* logits, DType logits_dtype, const void* labels, DType labels_dtype, int64_t rows,
                          int64_t classes, double* row_loss, float* loss, float* dlogits) {
  const double inv_rows = rows > 0 ? 1.0 / static_cast<double>(rows) : NAN;
  if (rows > 0 && classes > 0)
    cuda::launch<cross_entropy_rows_kernel>(static_cast<unsigned>(rows), kBlock, 0, nullptr, logits, logits_dtype,
                                            labels, labels_dtype, classes, inv_rows, row_loss, dlogits);
  launch_finish_sum(row_loss, classes > 0 ? rows : 0, inv_rows, loss);  // the mean, in row order
}

}  // namespace belay

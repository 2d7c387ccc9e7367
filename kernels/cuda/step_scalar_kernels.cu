// The small device-side moves of a step's bookkeeping, so the host never has to read a count
// to run a step: the LR picked from the schedule's table by the applied-step count, and the
// count moved only by a step that was applied. One thread each; they read and write one or
// two floats (bytes: 8-12, flops: 1), so their cost is the launch.
#include <cstdint>

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/simt_seam.cuh"
#include "kernels/common/element_math.h"

namespace belay {
namespace {

__global__ void lookup_kernel(const float* table, int64_t n, const float* index, float* out) {
  *out = table[table_index(*index, n)];
}

__global__ void count_applied_kernel(float* count, const float* found_inf) {
  if (*found_inf == 0.0f) *count += 1.0f;  // FP32 counts exactly up to 2^24 steps
}

}  // namespace

void launch_lookup(const float* table, int64_t n, const float* index, float* out) {
  cuda::launch<lookup_kernel>(1, 1, 0, nullptr, table, n, index, out);
}

void launch_count_applied(float* count, const float* found_inf) { cuda::launch<count_applied_kernel>(1, 1, 0, nullptr, count, found_inf); }

}  // namespace belay

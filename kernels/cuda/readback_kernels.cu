// The gather behind read_async: copies up to kMaxReadbackScalars device scalars into one
// pinned host buffer in one launch. Why a kernel and not one cudaMemcpyAsync per scalar:
// one launch instead of N copies, and the source addresses travel as a kernel parameter
// (__grid_constant__), so nothing has to be copied to the device first. Because it runs in
// stream order, the values are a snapshot as of the read_async call: kernels enqueued later
// that change the scalars run after it. Bytes: 4 read and 4 written per scalar; no flops.
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/simt_seam.cuh"

namespace belay {
namespace {

static_assert(kMaxReadbackScalars <= 32, "the gather is one warp, one scalar per thread");

struct ReadbackSources {
  const float* src[kMaxReadbackScalars];
  int count;
};

__global__ void readback_gather_kernel(const __grid_constant__ ReadbackSources s, float* dst) {
  const int i = static_cast<int>(threadIdx.x);
  if (i < s.count) dst[i] = *s.src[i];
}

}  // namespace

void launch_readback_gather(const float* const* src, int count, float* dst) {
  ReadbackSources s{};
  for (int i = 0; i < count; ++i) s.src[i] = src[i];
  s.count = count;
  cuda::launch<readback_gather_kernel>(1, 32, 0, nullptr, s, dst);
}

}  // namespace belay

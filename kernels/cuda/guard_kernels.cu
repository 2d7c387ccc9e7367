// The fused guard and its companions on the GPU.
//  guard: ONE read of every gradient, many tensors per launch. Each element is unscaled on
//    the fly (g * inv_scale, in FP32, as the CPU does) and squared in double; each block
//    writes one partial sum; one final block adds the partials in index order. A non-finite
//    element makes its square, hence the sum, non-finite: found_inf is read off the total,
//    so no flag needs atomics either. Nothing is written to the gradients.
//    Bytes: sum of numel * dtype_size read + 8 per 16384 elements; flops: 3 per element.
//    The norm is the square root of the FP64 total, rounded to FP32 once.
//  guard with the census: the same sums in the same order, and in the same read each thread
//    counts census_class and census_amax (kernels/common/census_math.h) of the values as
//    stored; the block adds its threads' counts in shared memory, then one thread adds the
//    block's into the tensor's record (zeroed first) with integer atomics: integer sums and
//    a max of non-negative floats as integers do not depend on the order, so the record is
//    deterministic. Bytes: the guard's, plus kCensusFields words per tensor zeroed and at most
//    that many atomics per block (20 bytes per 64 KiB of FP32 gradient).
//  clip_coefficient: one thread, coef = min(1, max / (norm + 1e-6)).
//  unscale: g *= inv_scale in place (the unfused path); reads and writes each gradient once.
//    A thread that sees a non-finite product stores 1 into found_inf (zeroed first): every
//    writer writes the same value, so the race is benign and the result deterministic.
#include <cmath>
#include <cstdint>

#include "engine/census.h"
#include "kernels/common/census_math.h"
#include "kernels/cuda/census_count.cuh"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/simt_seam.cuh"
#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/device_access.cuh"
#include "kernels/cuda/multi_tensor.cuh"

namespace belay {
namespace {

using cuda::aligned16;
using cuda::block_sum;
using cuda::kBlock;
using cuda::kChunk;
using cuda::load8_f32;
using cuda::load_f32;
using cuda::store8_f32;
using cuda::store_f32;
using GuardBatch = cuda::MultiTensorBatch<GradRef>;

__global__ void __launch_bounds__(kBlock) guard_partials_kernel(const __grid_constant__ GuardBatch batch,
                                                                const float* inv_scale, double* partials) {
  BELAY_SHARED(double, scratch, [kBlock]);
  const auto [g, start, end] = cuda::block_chunk(batch, blockIdx.x);
  const float inv = *inv_scale;

  double acc = 0.0;
  int64_t tail = start;
  if (aligned16(g.data)) {
    // 8 elements per thread per pass, each warp-wide load contiguous (BELAY_VEC8_LOOP; kChunk
    // is a multiple of kVecSpan, so every chunk starts aligned). The last < 256 elements of a
    // tensor go through the scalar loop below.
    const int64_t vec_end = start + (end - start) / cuda::kVecSpan * cuda::kVecSpan;
    BELAY_VEC8_LOOP(i, start, vec_end) {
      float x[8];
      load8_f32(g.data, g.dtype, i, x);
      BELAY_UNROLL
      for (int e = 0; e < 8; ++e) {
        const float u = x[e] * inv;
        acc += (double)u * (double)u;
      }
    }
    tail = vec_end;
  }
  for (int64_t i = tail + threadIdx.x; i < end; i += blockDim.x) {
    const float u = load_f32(g.data, g.dtype, i) * inv;
    acc += (double)u * (double)u;
  }
  const double total = block_sum(acc, scratch);
  if (threadIdx.x == 0) partials[blockIdx.x] = total;
}

// A gradient and where its census record goes.
struct CensusRef {
  void* data;
  DType dtype;
  int64_t n;
  unsigned* record;  // kCensusFields words
};
using CensusBatch = cuda::MultiTensorBatch<CensusRef>;

__global__ void __launch_bounds__(kBlock) guard_census_partials_kernel(const __grid_constant__ CensusBatch batch,
                                                                       const float* inv_scale, double* partials,
                                                                       CensusBounds bounds) {
  BELAY_SHARED(double, scratch, [kBlock]);
  BELAY_SHARED(unsigned, block_census, [kCensusFields]);
  const auto [g, start, end] = cuda::block_chunk(batch, blockIdx.x);
  const float inv = *inv_scale;
  cuda::zero_block_census(block_census);
  __syncthreads();

  double acc = 0.0;
  cuda::ThreadCensus census;
  int64_t tail = start;
  if (aligned16(g.data)) {
    const int64_t vec_end = start + (end - start) / cuda::kVecSpan * cuda::kVecSpan;
    BELAY_VEC8_LOOP(i, start, vec_end) {
      float x[8];
      load8_f32(g.data, g.dtype, i, x);
      BELAY_UNROLL
      for (int e = 0; e < 8; ++e) {
        census.add(census_class(x[e], bounds), x[e]);
        const float u = x[e] * inv;
        acc += (double)u * (double)u;
      }
    }
    tail = vec_end;
  }
  for (int64_t i = tail + threadIdx.x; i < end; i += blockDim.x) {
    const float v = load_f32(g.data, g.dtype, i);
    census.add(census_class(v, bounds), v);
    const float u = v * inv;
    acc += (double)u * (double)u;
  }
  const double total = block_sum(acc, scratch);
  if (threadIdx.x == 0) partials[blockIdx.x] = total;
  cuda::flush_census(census, block_census, g.record);
}

__global__ void guard_finish_kernel(const double* partials, int64_t count, float* found_inf, float* norm) {
  BELAY_SHARED(double, scratch, [kBlock]);
  double acc = 0.0;
  for (int64_t i = threadIdx.x; i < count; i += blockDim.x) acc += partials[i];
  const double total = block_sum(acc, scratch);
  if (threadIdx.x == 0) {
    found_inf[0] = isfinite(total) ? 0.0f : 1.0f;
    // The FP64 root, rounded once (IEEE sqrt, no fast math: the CPU's std::sqrt bit for bit).
    norm[0] = static_cast<float>(sqrt(total));
  }
}

__global__ void clip_coefficient_kernel(const float* norm, float max_norm, float* clip_coef) {
  *clip_coef = clip_coefficient_of(*norm, max_norm);
}

__global__ void __launch_bounds__(kBlock) unscale_kernel(const __grid_constant__ GuardBatch batch,
                                                         const float* inv_scale, float* found_inf) {
  const auto [g, start, end] = cuda::block_chunk(batch, blockIdx.x);
  const float inv = *inv_scale;
  bool nonfinite = false;
  int64_t tail = start;
  if (aligned16(g.data)) {
    const int64_t vec_end = start + (end - start) / cuda::kVecSpan * cuda::kVecSpan;
    BELAY_VEC8_LOOP(i, start, vec_end) {
      float x[8];
      load8_f32(g.data, g.dtype, i, x);
      BELAY_UNROLL
      for (int e = 0; e < 8; ++e) {
        x[e] *= inv;
        nonfinite |= !is_finite_f32(x[e]);
      }
      store8_f32(g.data, g.dtype, i, x);
    }
    tail = vec_end;
  }
  for (int64_t i = tail + threadIdx.x; i < end; i += blockDim.x) {
    const float u = load_f32(g.data, g.dtype, i) * inv;
    nonfinite |= !is_finite_f32(u);
    store_f32(g.data, g.dtype, i, u);
  }
  if (nonfinite) *found_inf = 1.0f;
}

}  // namespace

int64_t guard_partials(const std::vector<GradRef>& grads) {
  int64_t blocks = 0;
  for (const GradRef& g : grads) blocks += (g.n + kChunk - 1) / kChunk;
  return blocks > 0 ? blocks : 1;
}

void launch_guard(const std::vector<GradRef>& grads, const float* inv_scale, float* found_inf, float* norm,
                  double* partials) {
  // Each batch writes its own slice of `partials`, so the final sum sees every block of
  // every batch in one fixed order.
  int64_t offset = 0;
  cuda::for_each_batch(grads, [&](const GuardBatch& batch, int64_t blocks) {
    cuda::launch<guard_partials_kernel>(static_cast<unsigned>(blocks), kBlock, 0, nullptr, batch, inv_scale, partials + offset);
    offset += blocks;
  });
  cuda::launch<guard_finish_kernel>(1, kBlock, 0, nullptr, partials, offset, found_inf, norm);  // offset 0: sum 0, finite
}

int64_t guard_blocks_of(int64_t n) { return (n + kChunk - 1) / kChunk; }

void launch_guard_block_sums(const std::vector<GradRef>& grads, const float* inv_scale, double* partials) {
  int64_t offset = 0;
  cuda::for_each_batch(grads, [&](const GuardBatch& batch, int64_t blocks) {
    cuda::launch<guard_partials_kernel>(static_cast<unsigned>(blocks), kBlock, 0, nullptr, batch, inv_scale, partials + offset);
    offset += blocks;
  });
}

void launch_guard_census(const std::vector<GradRef>& grads, const float* inv_scale, float* found_inf, float* norm,
                         double* partials, unsigned* census, bool bf16) {
  launch_fill(census, DType::F32, static_cast<int64_t>(grads.size()) * kCensusFields, 0.0f, nullptr);  // 0.0f: all bits 0
  std::vector<CensusRef> refs;
  refs.reserve(grads.size());
  for (size_t t = 0; t < grads.size(); ++t)
    refs.push_back({grads[t].data, grads[t].dtype, grads[t].n, census + t * kCensusFields});
  const CensusBounds bounds = census_bounds(bf16);
  int64_t offset = 0;
  cuda::for_each_batch(refs, [&](const CensusBatch& batch, int64_t blocks) {
    cuda::launch<guard_census_partials_kernel>(static_cast<unsigned>(blocks), kBlock, 0, nullptr, batch, inv_scale,
                                               partials + offset, bounds);
    offset += blocks;
  });
  cuda::launch<guard_finish_kernel>(1, kBlock, 0, nullptr, partials, offset, found_inf, norm);
}

void launch_clip_coefficient(const float* norm, float max_norm, float* clip_coef) {
  cuda::launch<clip_coefficient_kernel>(1, 1, 0, nullptr, norm, max_norm, clip_coef);
}

void launch_unscale(const std::vector<GradRef>& grads, const float* inv_scale, float* found_inf) {
  launch_fill(found_inf, DType::F32, 1, 0.0f, nullptr);
  cuda::for_each_batch(grads, [&](const GuardBatch& batch, int64_t blocks) {
    cuda::launch<unscale_kernel>(static_cast<unsigned>(blocks), kBlock, 0, nullptr, batch, inv_scale, found_inf);
  });
}

}  // namespace belay

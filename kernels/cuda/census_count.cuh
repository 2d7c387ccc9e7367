// Counting the numerics census (engine/census.h) on the GPU, shared by the guard's census
// (guard_kernels.cu) and the counted cast (cast_kernels.cu). Each thread counts in registers;
// the block adds its threads' counts into shared words, then one thread per word adds the
// block's into the tensor's record with integer atomics. Integer sums, and a max of
// non-negative floats taken as integers (their bit order is their numeric order), do not
// depend on the order of the atomics: the record is deterministic.
#pragma once
#include "engine/census.h"
#include "kernels/common/census_math.h"
#include "kernels/cuda/simt_seam.cuh"

namespace belay::cuda {

// One thread's census counts and amax.
struct ThreadCensus {
  unsigned count[kCensusFields + 1] = {};  // by class; the last slot: normal values
  float amax = 0.0f;
  // v, of class `cls` (census_class or cast_census_class).
  __device__ __forceinline__ void add(int cls, float v) {
    ++count[cls];
    amax = census_amax(amax, v);
  }
};

// The block's shared words, zeroed by the first kCensusFields threads. A barrier must follow
// before any thread calls flush_census.
__device__ __forceinline__ void zero_block_census(unsigned* block_census) {
  if (threadIdx.x < kCensusFields) block_census[threadIdx.x] = 0u;
}

// Every thread of the block calls it once, after its last add: the thread's counts into the
// block's words, then the block's into `record` (kCensusFields words in global memory).
__device__ __forceinline__ void flush_census(const ThreadCensus& census, unsigned* block_census, unsigned* record) {
  for (int f = 0; f < kCensusAmax; ++f)
    if (census.count[f] != 0u) atomicAdd(&block_census[f], census.count[f]);
  if (census.amax > 0.0f)
    atomicMax(reinterpret_cast<int*>(&block_census[kCensusAmax]), static_cast<int>(f32_bits(census.amax)));
  __syncthreads();
  if (threadIdx.x < kCensusAmax && block_census[threadIdx.x] != 0u) atomicAdd(&record[threadIdx.x], block_census[threadIdx.x]);
  if (threadIdx.x == kCensusAmax && block_census[kCensusAmax] != 0u)
    atomicMax(reinterpret_cast<int*>(&record[kCensusAmax]), static_cast<int>(block_census[kCensusAmax]));
}

}  // namespace belay::cuda

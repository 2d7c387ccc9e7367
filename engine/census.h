// The numerics census: what the fused guard can also count, per gradient, in its one read
// (Backend::guard's optional census output). The device record is kCensusFields 32-bit
// words per tensor, stored in an FP32 tensor [tensors, kCensusFields] whose words are read as
// bits: integer counts (exact to 2^32 - 1 elements) and the amax as FP32 bits.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "engine/dtype.h"

namespace belay {

// The words of one tensor's record, in order.
enum CensusField : int {
  kCensusNonfinite = 0,  // inf or NaN elements
  kCensusZeros = 1,      // exact zeros in the buffer
  kCensusUnderflow = 2,  // nonzero, but round to zero in the census format
  kCensusSubnormal = 3,  // nonzero, land in the format's subnormal range (not zero)
  kCensusAmax = 4,       // the largest finite magnitude, FP32 bits (0 when none)
  kCensusFields = 5,
};

// One tensor's census as the host reads it. The values are the gradient as the step holds it
// (scaled by the loss scale), classified against `format` (FP16 or BF16).
struct TensorCensus {
  std::string name;
  int64_t numel = 0;
  uint64_t nonfinite = 0, zeros = 0, underflow = 0, subnormal = 0;
  float amax = 0.0f;
  // log2(max finite of format / amax): how many doublings of the scale the largest value
  // could still take. +inf when the tensor has no nonzero finite value.
  double headroom_bits(DType format) const;
};

// The records of `words.size() / kCensusFields` tensors from the words the guard wrote.
std::vector<TensorCensus> decode_census(const std::vector<uint32_t>& words, const std::vector<std::string>& names,
                                        const std::vector<int64_t>& numels);

}  // namespace belay

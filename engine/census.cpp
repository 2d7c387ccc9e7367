#include "engine/census.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "engine/error.h"

namespace belay {

double TensorCensus::headroom_bits(DType format) const {
  if (!(amax > 0.0f)) return std::numeric_limits<double>::infinity();
  return std::log2(static_cast<double>(finfo(format).max) / static_cast<double>(amax));
}

std::vector<TensorCensus> decode_census(const std::vector<uint32_t>& words, const std::vector<std::string>& names,
                                        const std::vector<int64_t>& numels) {
  const size_t n = words.size() / kCensusFields;
  if (words.size() % kCensusFields != 0 || names.size() != n || numels.size() != n)
    throw Error("census: " + std::to_string(words.size()) + " words for " + std::to_string(names.size()) +
                " tensors (" + std::to_string(kCensusFields) + " words each)");
  std::vector<TensorCensus> out(n);
  for (size_t t = 0; t < n; ++t) {
    const uint32_t* w = words.data() + t * kCensusFields;
    TensorCensus& c = out[t];
    c.name = names[t];
    c.numel = numels[t];
    c.nonfinite = w[kCensusNonfinite];
    c.zeros = w[kCensusZeros];
    c.underflow = w[kCensusUnderflow];
    c.subnormal = w[kCensusSubnormal];
    std::memcpy(&c.amax, &w[kCensusAmax], sizeof(float));
  }
  return out;
}

}  // namespace belay

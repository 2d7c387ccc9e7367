// Seeded synthetic regression data: x ~ N(0, 1), y = x T^T + t + 0.01 * noise with a fixed
// random teacher (T, t). One batch per call, drawn from the generator's own stream, so
// the data position is the generator's state.
#pragma once
#include "engine/random.h"
#include "engine/tensor.h"

namespace belay {

struct Batch {
  Tensor x;  // [B, in] FP32
  Tensor y;  // [B, out] FP32
};

class SyntheticRegression {
 public:
  SyntheticRegression(int64_t in_features, int64_t out_features, uint64_t seed);
  Batch next(int64_t batch, Device device);
  Rng& rng() { return data_rng_; }

 private:
  int64_t in_, out_;
  std::vector<float> teacher_w_, teacher_b_;
  Rng data_rng_;
};

}  // namespace belay

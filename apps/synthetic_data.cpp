#include "apps/synthetic_data.h"

#include <cmath>

namespace belay {

SyntheticRegression::SyntheticRegression(int64_t in, int64_t out, uint64_t seed)
    : in_(in), out_(out), data_rng_(seed * 2 + 1) {
  Rng teacher(seed * 2 + 2);
  const float s = 1.0f / std::sqrt(static_cast<float>(in));
  teacher_w_.resize(static_cast<size_t>(in * out));
  teacher_b_.resize(static_cast<size_t>(out));
  for (float& w : teacher_w_) w = s * teacher.normal();
  for (float& b : teacher_b_) b = 0.1f * teacher.normal();
}

Batch SyntheticRegression::next(int64_t batch, Device device) {
  std::vector<float> x(static_cast<size_t>(batch * in_)), y(static_cast<size_t>(batch * out_));
  for (float& v : x) v = data_rng_.normal();
  for (int64_t r = 0; r < batch; ++r)
    for (int64_t o = 0; o < out_; ++o) {
      double acc = teacher_b_[o];
      for (int64_t i = 0; i < in_; ++i) acc += (double)x[r * in_ + i] * teacher_w_[o * in_ + i];
      y[r * out_ + o] = static_cast<float>(acc) + 0.01f * data_rng_.normal();
    }
  return {Tensor::from_vector(x, Shape{batch, in_}, DType::F32, device),
          Tensor::from_vector(y, Shape{batch, out_}, DType::F32, device)};
}

}  // namespace belay

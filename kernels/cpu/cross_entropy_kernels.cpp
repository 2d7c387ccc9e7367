// The CPU backend's fused cross-entropy (kernels/cpu/cpu_kernels.h): the mean loss and the
// unit gradient (softmax - onehot) / B in one pass over the logits, rows summed in order.
#include <cmath>
#include <string>

#include "engine/error.h"
#include "kernels/cpu/block_loops.h"
#include "kernels/cpu/cpu_kernels.h"

namespace belay::cpu {

void cross_entropy(const Tensor& logits, const Tensor& labels, Tensor& loss, Tensor& dlogits) {
  const int64_t rows = logits.dim(0), classes = logits.dim(1);
  std::vector<float> lab(static_cast<size_t>(labels.numel()));  // read in place: no host read counted
  for (size_t r = 0; r < lab.size(); ++r) lab[r] = load_as_f32(labels.data(), labels.dtype(), r);
  for (int64_t r = 0; r < rows; ++r) {
    const float l = lab[r];
    if (!(l >= 0.0f) || l >= static_cast<float>(classes) || l != std::floor(l))
      throw Error("cross_entropy: label " + std::to_string(l) + " at row " + std::to_string(r) +
                  " is not a class index in [0, " + std::to_string(classes) + ")");
  }
  const void* px = logits.data();
  const DType logits_dtype = logits.dtype();
  float* pd = dlogits.data_as<float>();
  thread_local std::vector<double> row_loss;
  row_loss.assign(static_cast<size_t>(rows), 0.0);
  double* rl = row_loss.data();
  const double inv_rows = 1.0 / static_cast<double>(rows);
  parallel_for(rows, [&](int64_t r) {
    // log-softmax with the row maximum subtracted: exp never overflows for large logits.
    float mx = -INFINITY;
    for (int64_t c = 0; c < classes; ++c) mx = std::max(mx, load_as_f32(px, logits_dtype, r * classes + c));
    double z = 0.0;
    for (int64_t c = 0; c < classes; ++c) z += std::exp((double)load_as_f32(px, logits_dtype, r * classes + c) - mx);
    const double log_z = std::log(z) + mx;
    const int64_t label = static_cast<int64_t>(lab[r]);
    rl[r] = log_z - (double)load_as_f32(px, logits_dtype, r * classes + label);
    for (int64_t c = 0; c < classes; ++c) {
      const double p = std::exp((double)load_as_f32(px, logits_dtype, r * classes + c) - log_z);
      pd[r * classes + c] = static_cast<float>((p - (c == label ? 1.0 : 0.0)) * inv_rows);
    }
  });
  double total = 0.0;
  for (int64_t r = 0; r < rows; ++r) total += rl[r];
  loss.data_as<float>()[0] = static_cast<float>(total * inv_rows);
}

}  // namespace belay::cpu

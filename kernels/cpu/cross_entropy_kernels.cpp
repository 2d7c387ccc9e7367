// The CPU backend's fused cross-entropy (kernels/cpu/cpu_kernels.h), llm.c's fused classifier:
// per row of logits, the row kernel of the active ISA path (kernels/cpu/isa/classifier_rows.h)
// finds the maximum and the log-sum-exp online in FP32, the row's loss, and writes the unit
// gradient (softmax - onehot) / B, reading the logits once. Threads take whole rows; the row
// losses are added in row order in double, so the bits do not depend on the thread count.
// FP16/BF16 logits are widened a row at a time into the gradient's own row (FP32, the same
// shape), and the row kernel runs there in place: no FP32 copy of the logits.
// Bytes: B C (4 or 2) read, B C 4 written (and read back from the cache); ~40 flops a logit.
#include <cmath>
#include <string>
#include <vector>

#include "engine/error.h"
#include "kernels/cpu/block_loops.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/isa/classifier_rows.h"

namespace belay::cpu {
namespace {

const ClassifierRows& classifier_rows() {
  switch (active_cpu_isa()) {
    case CpuIsa::Avx2: return isa_avx2::classifier_rows;
    case CpuIsa::Avx512:
    case CpuIsa::Avx512Bf16:
    case CpuIsa::Amx: return isa_avx512::classifier_rows;  // nothing here for VDPBF16PS or tiles
    case CpuIsa::Baseline: break;
  }
  return isa_baseline::classifier_rows;
}

}  // namespace

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
  const ClassifierRows& kernel = classifier_rows();
  const void* px = logits.data();
  const DType logits_dtype = logits.dtype();
  float* pd = dlogits.data_as<float>();
  thread_local std::vector<double> row_loss;
  row_loss.assign(static_cast<size_t>(rows), 0.0);
  double* rl = row_loss.data();
  const float inv_rows = 1.0f / static_cast<float>(rows);
#pragma omp parallel if (rows * classes > kParallelThreshold)
  {
    std::vector<float> scratch(static_cast<size_t>(classifier_chunks(classes)));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      float* d = pd + r * classes;
      const float* x = load_block(px, logits_dtype, r * classes, classes, d);  // FP32: the logits' own row
      rl[r] = kernel.row(x, classes, static_cast<int64_t>(lab[r]), inv_rows, d, scratch.data());
    }
  }
  double total = 0.0;
  for (int64_t r = 0; r < rows; ++r) total += rl[r];
  loss.data_as<float>()[0] = static_cast<float>(total / static_cast<double>(rows));
}

}  // namespace belay::cpu

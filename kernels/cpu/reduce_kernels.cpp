// The CPU backend's reductions and the MSE loss (kernels/cpu/cpu_kernels.h): fixed-order sums
// in double (block_loops.h, deterministic_sum), the same bits at any thread count.
#include <omp.h>

#include <algorithm>

#include "kernels/cpu/block_loops.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/isa/element_blocks.h"

namespace belay::cpu {

// Reads x once, writes N floats. Each column sums its rows in row order in double, as a
// column at a time would, but rows are walked outer so the reads are contiguous.
void sum_rows(const Tensor& x, Tensor& out, bool accumulate) {
  const int64_t rows = x.dim(0), cols = x.dim(1);
  const void* px = x.data();
  const DType x_dtype = x.dtype();
  float* po = out.data_as<float>();
  // Blocks of up to kCols columns, narrower where that gives every thread one: a bias of 128
  // (the default GPT's) was one block, summed by one thread while the other waited. Whole
  // vectors of 16 columns; each column's sum is the same whatever block holds it.
  constexpr int64_t kCols = 256;
  const bool parallel = rows * cols > kParallelThreshold;
  const int64_t threads = parallel ? omp_get_max_threads() : 1;
  const int64_t width = std::min(kCols, std::max<int64_t>(16, (cols + threads - 1) / threads + 15) / 16 * 16);
  const int64_t col_blocks = (cols + width - 1) / width;
  const ElementBlocks& blocks = cpu_element_blocks();  // the widest adds of doubles this CPU has
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t cb = 0; cb < col_blocks; ++cb) {
    const int64_t c0 = cb * width, len = std::min(width, cols - c0);
    double acc[kCols] = {};
    alignas(64) float buf[kCols];
    for (int64_t m = 0; m < rows; ++m) {
      const float* v = load_block(px, x_dtype, m * cols + c0, len, buf);
      blocks.add_row_f64(v, len, acc);
    }
    for (int64_t j = 0; j < len; ++j)
      po[c0 + j] = accumulate ? po[c0 + j] + static_cast<float>(acc[j]) : static_cast<float>(acc[j]);
  }
}

void sum(const Tensor& x, Tensor& out) {
  const void* px = x.data();
  out.data_as<float>()[0] = static_cast<float>(with_dtype(x.dtype(), [&](auto tag) {
    constexpr DType D = decltype(tag)::value;
    return deterministic_sum(x.numel(), [&](int64_t i) { return (double)ld<D>(px, i); });
  }));
}

void mse_forward(const Tensor& pred, const Tensor& target, Tensor& out) {
  const void *pp = pred.data(), *pt = target.data();
  const DType pred_dtype = pred.dtype(), target_dtype = target.dtype();
  const double s = with_dtype(pred_dtype, [&](auto tp) {
    return with_dtype(target_dtype, [&](auto tt) {
      constexpr DType P = decltype(tp)::value, T = decltype(tt)::value;
      return deterministic_sum(pred.numel(), [&](int64_t i) {
        const double d = (double)ld<P>(pp, i) - (double)ld<T>(pt, i);
        return d * d;
      });
    });
  });
  out.data_as<float>()[0] = static_cast<float>(s / static_cast<double>(pred.numel()));
}

void mse_backward(const Tensor& pred, const Tensor& target, const Tensor& g, Tensor& dpred) {
  const float factor = 2.0f * scalar_value(g) / static_cast<float>(pred.numel());
  map_blocks(
      dpred,
      [factor](int64_t, int64_t len, float* r, const float* p, const float* t) {
        for (int64_t j = 0; j < len; ++j) r[j] = factor * (p[j] - t[j]);
      },
      pred, target);
}

}  // namespace belay::cpu

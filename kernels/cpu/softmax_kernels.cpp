// The CPU backend's softmax and log-softmax, forward and backward (kernels/cpu/cpu_kernels.h):
// a row at a time on the active ISA path (kernels/cpu/isa/element_blocks.cpp).
#include "kernels/cpu/block_loops.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/isa/element_blocks.h"

namespace belay::cpu {

// Per row (kernels/cpu/isa, the active path): reads x once (FP32 in place, else widened
// into a row buffer), writes y once; one exp and ~4 flops per element.
void softmax(const Tensor& x, int64_t cols, bool log, bool causal, Tensor& y) {
  const void* px = x.data();
  void* py = y.data();
  const DType tx = x.dtype(), ty = y.dtype();
  const int64_t rows = x.numel() / cols;
  const ElementBlocks& blocks = cpu_element_blocks();
#pragma omp parallel if (x.numel() > kParallelThreshold)
  {
    std::vector<float> xb(static_cast<size_t>(cols)), yb(static_cast<size_t>(cols));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t live = causal ? r % cols + 1 : cols;  // unmasked columns [0, live)
      const float* xr = load_block(px, tx, r * cols, cols, xb.data());
      float* yr = out_block(py, ty, r * cols, yb.data());
      blocks.softmax_row(xr, yr, cols, live, log);
      store_block(py, ty, r * cols, cols, yr);
    }
  }
}

// Per row (the active path): reads y and dy once (widened into row buffers unless FP32),
// writes dx once.
void softmax_backward(const Tensor& y, const Tensor& dy, int64_t cols, bool log, bool causal,
                      Tensor& dx) {
  const void *pyv = y.data(), *pg = dy.data();
  void* pd = dx.data();
  const DType ty = y.dtype(), tg = dy.dtype(), td = dx.dtype();
  const int64_t rows = y.numel() / cols;
  const ElementBlocks& blocks = cpu_element_blocks();
#pragma omp parallel if (y.numel() > kParallelThreshold)
  {
    std::vector<float> yb(static_cast<size_t>(cols)), gb(static_cast<size_t>(cols)), db(static_cast<size_t>(cols));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t live = causal ? r % cols + 1 : cols;
      const float* yr = load_block(pyv, ty, r * cols, cols, yb.data());
      const float* gr = load_block(pg, tg, r * cols, cols, gb.data());
      float* dr = out_block(pd, td, r * cols, db.data());
      blocks.softmax_row_backward(yr, gr, dr, cols, live, log);
      store_block(pd, td, r * cols, cols, dr);
    }
  }
}

}  // namespace belay::cpu

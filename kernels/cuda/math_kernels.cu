// The Var operators on the GPU (autograd/math_ops.cpp): the functions of UnaryOp and their
// backward, broadcasting arithmetic, sums over an axis and their backward, and the matrix
// transpose.
// Element math through kernels/common/unary_math.h, the formula the CPU backend computes.
// Bytes per element: the inputs read plus the output written (unary fp16: 4 B; backward
// fp16: 8 B; broadcast: the full operand and the output, the small one from cache); flops:
// 1 for arithmetic, ~20 for a transcendental. sum_axis reads x once and writes outer * inner
// floats; transpose and swap_axes move 2 x numel x dtype bytes. All memory-bound.
#include <cstdint>

#include "kernels/common/unary_math.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/simt_seam.cuh"
#include "kernels/cuda/device_access.cuh"

namespace belay {
namespace {

using cuda::grid_for;
using cuda::kBlock;
using cuda::load_f32;
using cuda::store_f32;

__global__ void unary_kernel(UnaryOp op, float p, const void* x, DType x_dtype, void* y, DType y_dtype, int64_t n) {
  BELAY_GRID_STRIDE(i, n) store_f32(y, y_dtype, i, unary_f32(op, load_f32(x, x_dtype, i), p));
}

__global__ void unary_backward_kernel(UnaryOp op, float p, const void* x, DType x_dtype, const void* y, DType y_dtype,
                                      const void* g, DType g_dtype, void* out, DType out_dtype, int64_t n) {
  BELAY_GRID_STRIDE(i, n) {
    const float v = unary_grad_f32(op, load_f32(x, x_dtype, i), load_f32(y, y_dtype, i), load_f32(g, g_dtype, i), p);
    store_f32(out, out_dtype, i, v);
  }
}

__global__ void binary_broadcast_kernel(BinaryOp op, const void* a, DType a_dtype, const void* b, DType b_dtype,
                                        AxisView view, bool swapped, void* out, DType out_dtype, int64_t n) {
  BELAY_GRID_STRIDE(i, n) {
    const float x = load_f32(a, a_dtype, i), y = load_f32(b, b_dtype, view.reduced_index(i));
    store_f32(out, out_dtype, i, swapped ? binary_f32(op, y, x) : binary_f32(op, x, y));
  }
}

__global__ void broadcast_axis_kernel(const void* g, DType g_dtype, AxisView view, float alpha, void* out,
                                      DType out_dtype, int64_t n) {
  BELAY_GRID_STRIDE(i, n) store_f32(out, out_dtype, i, alpha * load_f32(g, g_dtype, view.reduced_index(i)));
}

// One thread per output (o, i): its len elements in order, in double, rounded once, as the
// CPU sums them (the same bits). Neighbouring threads read neighbouring i: coalesced when
// inner is large; a last-axis sum (inner 1) reads strided, fine for the sizes it serves.
__global__ void sum_axis_kernel(const void* x, DType x_dtype, AxisView view, float alpha, void* out, DType out_dtype,
                                bool accumulate) {
  BELAY_GRID_STRIDE(k, view.outer * view.inner) {
    const int64_t o = k / view.inner, i = k % view.inner;
    double acc = 0.0;
    for (int64_t l = 0; l < view.len; ++l) acc += (double)load_f32(x, x_dtype, (o * view.len + l) * view.inner + i);
    const float s = static_cast<float>(acc * static_cast<double>(alpha));
    store_f32(out, out_dtype, k, accumulate ? load_f32(out, out_dtype, k) + s : s);
  }
}

// out [cols, rows] from x [rows, cols], one thread per output element, the bits copied.
template <class Bits>
__global__ void transpose_kernel(const Bits* x, int64_t rows, int64_t cols, Bits* out) {
  BELAY_GRID_STRIDE(k, rows * cols) {
    const int64_t c = k / rows, r = k % rows;
    out[k] = x[r * cols + c];
  }
}

// out [outer, q, mid, p, inner] from x [outer, p, mid, q, inner] (Backend::swap_axes), one
// thread per output element, the bits copied: consecutive threads write consecutive elements
// and read runs of `inner` (a head's d values when splitting heads).
template <class Bits>
__global__ void swap_axes_kernel(const Bits* x, SwapAxesView v, Bits* out) {
  BELAY_GRID_STRIDE(k, v.numel()) {
    const int64_t n = k % v.inner;
    int64_t rest = k / v.inner;
    const int64_t i = rest % v.p;
    rest /= v.p;
    const int64_t m = rest % v.mid;
    rest /= v.mid;
    const int64_t j = rest % v.q, o = rest / v.q;
    out[k] = x[(((o * v.p + i) * v.mid + m) * v.q + j) * v.inner + n];
  }
}

}  // namespace

void launch_unary(UnaryOp op, float p, const void* x, DType x_dtype, void* y, DType y_dtype, int64_t n) {
  if (n > 0) cuda::launch<unary_kernel>(grid_for(n), kBlock, 0, nullptr, op, p, x, x_dtype, y, y_dtype, n);
}
void launch_unary_backward(UnaryOp op, float p, const void* x, DType x_dtype, const void* y, DType y_dtype,
                           const void* g, DType g_dtype, void* out, DType out_dtype, int64_t n) {
  if (n > 0)
    cuda::launch<unary_backward_kernel>(grid_for(n), kBlock, 0, nullptr, op, p, x, x_dtype, y, y_dtype, g, g_dtype, out,
                                        out_dtype, n);
}
void launch_binary_broadcast(BinaryOp op, const void* a, DType a_dtype, const void* b, DType b_dtype,
                             const AxisView& view, bool swapped, void* out, DType out_dtype, int64_t n) {
  if (n > 0)
    cuda::launch<binary_broadcast_kernel>(grid_for(n), kBlock, 0, nullptr, op, a, a_dtype, b, b_dtype, view, swapped,
                                          out, out_dtype, n);
}
void launch_broadcast_axis(const void* g, DType g_dtype, const AxisView& view, float alpha, void* out, DType out_dtype,
                           int64_t n) {
  if (n > 0)
    cuda::launch<broadcast_axis_kernel>(grid_for(n), kBlock, 0, nullptr, g, g_dtype, view, alpha, out, out_dtype, n);
}
void launch_sum_axis(const void* x, DType x_dtype, const AxisView& view, float alpha, void* out, DType out_dtype,
                     bool accumulate) {
  const int64_t n = view.outer * view.inner;
  if (n > 0)
    cuda::launch<sum_axis_kernel>(grid_for(n), kBlock, 0, nullptr, x, x_dtype, view, alpha, out, out_dtype, accumulate);
}
void launch_transpose(const void* x, size_t elem_bytes, int64_t rows, int64_t cols, void* out) {
  const int64_t n = rows * cols;
  if (n == 0) return;
  if (elem_bytes == 2)
    cuda::launch<transpose_kernel<uint16_t>>(grid_for(n), kBlock, 0, nullptr, static_cast<const uint16_t*>(x), rows, cols,
                                             static_cast<uint16_t*>(out));
  else
    cuda::launch<transpose_kernel<uint32_t>>(grid_for(n), kBlock, 0, nullptr, static_cast<const uint32_t*>(x), rows, cols,
                                             static_cast<uint32_t*>(out));
}
void launch_swap_axes(const void* x, size_t elem_bytes, const SwapAxesView& view, void* out) {
  const int64_t n = view.numel();
  if (n == 0) return;
  if (elem_bytes == 2)
    cuda::launch<swap_axes_kernel<uint16_t>>(grid_for(n), kBlock, 0, nullptr, static_cast<const uint16_t*>(x), view,
                                             static_cast<uint16_t*>(out));
  else
    cuda::launch<swap_axes_kernel<uint32_t>>(grid_for(n), kBlock, 0, nullptr, static_cast<const uint32_t*>(x), view,
                                             static_cast<uint32_t*>(out));
}

}  // namespace belay

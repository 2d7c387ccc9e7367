// Elementwise ops on the GPU: one thread per element (grid-stride), any mix of dtypes
// computed in FP32 through the shared element math (kernels/common/element_math.h), so
// an element gets the CPU's formula. `out` may alias an input: each element is read
// before it is written, by the same thread.
// Bytes moved per element: the sizes of the inputs read plus the output written (e.g.
// binary fp16: 6 B); flops: 1 (gelu: ~20, erff and expf). These kernels are memory-bound.
#include <cstdint>

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/simt_seam.cuh"
#include "kernels/cuda/device_access.cuh"

namespace belay {
namespace {

using cuda::grid_for;
using cuda::kBlock;
using cuda::load_f32;
using cuda::store_f32;

__global__ void binary_kernel(BinaryOp op, const void* a, DType a_dtype, const void* b, DType b_dtype, void* out,
                              DType out_dtype, int64_t n) {
  BELAY_GRID_STRIDE(i, n) {
    const float x = load_f32(a, a_dtype, i), y = load_f32(b, b_dtype, i);
    // IEEE division (nvcc's default -prec-div=true): the same bits as the CPU's x / y.
    const float r = op == BinaryOp::Add ? x + y : op == BinaryOp::Sub ? x - y : op == BinaryOp::Mul ? x * y : x / y;
    store_f32(out, out_dtype, i, r);
  }
}

__global__ void scale_kernel(const void* x, DType x_dtype, float s, void* out, DType out_dtype, int64_t n) {
  BELAY_GRID_STRIDE(i, n) store_f32(out, out_dtype, i, s * load_f32(x, x_dtype, i));
}

__global__ void accumulate_kernel(void* dst, DType dst_dtype, const void* src, DType src_dtype, float alpha,
                                  const float* s, int64_t n) {
  // The factor is formed exactly as the CPU forms it: alpha * s[0], in FP32.
  const float factor = alpha * (s ? *s : 1.0f);
  BELAY_GRID_STRIDE(i, n) {
    store_f32(dst, dst_dtype, i, load_f32(dst, dst_dtype, i) + factor * load_f32(src, src_dtype, i));
  }
}

__global__ void broadcast_scalar_kernel(const float* s, float alpha, void* out, DType out_dtype, int64_t n) {
  const float value = *s * alpha;
  BELAY_GRID_STRIDE(i, n) store_f32(out, out_dtype, i, value);
}

__global__ void activation_kernel(Activation act, const void* x, DType x_dtype, void* y, DType y_dtype, int64_t n) {
  BELAY_GRID_STRIDE(i, n) {
    const float v = load_f32(x, x_dtype, i);
    store_f32(y, y_dtype, i, activation_f32(act, v));
  }
}

__global__ void activation_backward_kernel(Activation act, const void* x, DType x_dtype, const void* dy, DType dy_dtype,
                                           void* dxo, DType dxo_dtype, int64_t n) {
  BELAY_GRID_STRIDE(i, n) {
    const float v = load_f32(x, x_dtype, i), g = load_f32(dy, dy_dtype, i);
    store_f32(dxo, dxo_dtype, i, activation_backward_f32(act, v, g));
  }
}

__global__ void clamp_kernel(void* x, DType x_dtype, float lo, float hi, int64_t n) {
  BELAY_GRID_STRIDE(i, n) {
    const float v = load_f32(x, x_dtype, i);
    store_f32(x, x_dtype, i, v < lo ? lo : (v > hi ? hi : v));  // NaN stays NaN, as torch.clamp
  }
}

__global__ void scale_by_scalar_kernel(void* x, DType x_dtype, const float* factor, int64_t n) {
  const float f = *factor;
  BELAY_GRID_STRIDE(i, n) store_f32(x, x_dtype, i, load_f32(x, x_dtype, i) * f);
}

}  // namespace

void launch_binary(BinaryOp op, const void* a, DType a_dtype, const void* b, DType b_dtype, void* out, DType out_dtype,
                   int64_t n) {
  if (n > 0)
    cuda::launch<binary_kernel>(grid_for(n), kBlock, 0, nullptr, op, a, a_dtype, b, b_dtype, out, out_dtype, n);
}
void launch_scale(const void* x, DType x_dtype, float s, void* out, DType out_dtype, int64_t n) {
  if (n > 0) cuda::launch<scale_kernel>(grid_for(n), kBlock, 0, nullptr, x, x_dtype, s, out, out_dtype, n);
}
void launch_accumulate(void* dst, DType dst_dtype, const void* src, DType src_dtype, float alpha, const float* s,
                       int64_t n) {
  if (n > 0)
    cuda::launch<accumulate_kernel>(grid_for(n), kBlock, 0, nullptr, dst, dst_dtype, src, src_dtype, alpha, s, n);
}
void launch_broadcast_scalar(const float* s, float alpha, void* out, DType out_dtype, int64_t n) {
  if (n > 0) cuda::launch<broadcast_scalar_kernel>(grid_for(n), kBlock, 0, nullptr, s, alpha, out, out_dtype, n);
}
void launch_activation(Activation act, const void* x, DType x_dtype, void* y, DType y_dtype, int64_t n) {
  if (n > 0) cuda::launch<activation_kernel>(grid_for(n), kBlock, 0, nullptr, act, x, x_dtype, y, y_dtype, n);
}
void launch_activation_backward(Activation act, const void* x, DType x_dtype, const void* dy, DType dy_dtype, void* dxo,
                                DType dxo_dtype, int64_t n) {
  if (n > 0)
    cuda::launch<activation_backward_kernel>(grid_for(n), kBlock, 0, nullptr, act, x, x_dtype, dy, dy_dtype, dxo,
                                             dxo_dtype, n);
}
void launch_clamp(void* x, DType x_dtype, float lo, float hi, int64_t n) {
  if (n > 0) cuda::launch<clamp_kernel>(grid_for(n), kBlock, 0, nullptr, x, x_dtype, lo, hi, n);
}
void launch_scale_by_scalar(void* x, DType x_dtype, const float* factor, int64_t n) {
  if (n > 0) cuda::launch<scale_by_scalar_kernel>(grid_for(n), kBlock, 0, nullptr, x, x_dtype, factor, n);
}

}  // namespace belay

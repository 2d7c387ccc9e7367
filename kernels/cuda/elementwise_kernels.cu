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

__global__ void binary_kernel(BinaryOp op, const void* a, DType da, const void* b, DType db, void* out, DType dout,
                              int64_t n) {
  BELAY_GRID_STRIDE(i, n) {
    const float x = load_f32(a, da, i), y = load_f32(b, db, i);
    // IEEE division (nvcc's default -prec-div=true): the same bits as the CPU's x / y.
    const float r = op == BinaryOp::Add ? x + y : op == BinaryOp::Sub ? x - y : op == BinaryOp::Mul ? x * y : x / y;
    store_f32(out, dout, i, r);
  }
}

__global__ void scale_kernel(const void* x, DType dx, float s, void* out, DType dout, int64_t n) {
  BELAY_GRID_STRIDE(i, n) store_f32(out, dout, i, s * load_f32(x, dx, i));
}

__global__ void accumulate_kernel(void* dst, DType ddst, const void* src, DType dsrc, float alpha, const float* s,
                                  int64_t n) {
  // The factor is formed exactly as the CPU forms it: alpha * s[0], in FP32.
  const float factor = alpha * (s ? *s : 1.0f);
  BELAY_GRID_STRIDE(i, n) store_f32(dst, ddst, i, load_f32(dst, ddst, i) + factor * load_f32(src, dsrc, i));
}

__global__ void broadcast_scalar_kernel(const float* s, float alpha, void* out, DType dout, int64_t n) {
  const float value = *s * alpha;
  BELAY_GRID_STRIDE(i, n) store_f32(out, dout, i, value);
}

__global__ void activation_kernel(Activation act, const void* x, DType dx, void* y, DType dy, int64_t n) {
  BELAY_GRID_STRIDE(i, n) {
    const float v = load_f32(x, dx, i);
    store_f32(y, dy, i, act == Activation::Relu ? (v > 0.0f ? v : 0.0f) : gelu_f32(v));
  }
}

__global__ void activation_backward_kernel(Activation act, const void* x, DType dx, const void* dy, DType ddy,
                                           void* dxo, DType ddxo, int64_t n) {
  BELAY_GRID_STRIDE(i, n) {
    const float v = load_f32(x, dx, i), g = load_f32(dy, ddy, i);
    store_f32(dxo, ddxo, i, act == Activation::Relu ? (v > 0.0f ? g : 0.0f) : g * gelu_grad_f32(v));
  }
}

__global__ void clamp_kernel(void* x, DType dx, float lo, float hi, int64_t n) {
  BELAY_GRID_STRIDE(i, n) {
    const float v = load_f32(x, dx, i);
    store_f32(x, dx, i, v < lo ? lo : (v > hi ? hi : v));  // NaN stays NaN, as torch.clamp
  }
}

__global__ void scale_by_scalar_kernel(void* x, DType dx, const float* factor, int64_t n) {
  const float f = *factor;
  BELAY_GRID_STRIDE(i, n) store_f32(x, dx, i, load_f32(x, dx, i) * f);
}

}  // namespace

void launch_binary(BinaryOp op, const void* a, DType da, const void* b, DType db, void* out, DType dout, int64_t n) {
  if (n > 0) cuda::launch<binary_kernel>(grid_for(n), kBlock, 0, nullptr, op, a, da, b, db, out, dout, n);
}
void launch_scale(const void* x, DType dx, float s, void* out, DType dout, int64_t n) {
  if (n > 0) cuda::launch<scale_kernel>(grid_for(n), kBlock, 0, nullptr, x, dx, s, out, dout, n);
}
void launch_accumulate(void* dst, DType ddst, const void* src, DType dsrc, float alpha, const float* s, int64_t n) {
  if (n > 0) cuda::launch<accumulate_kernel>(grid_for(n), kBlock, 0, nullptr, dst, ddst, src, dsrc, alpha, s, n);
}
void launch_broadcast_scalar(const float* s, float alpha, void* out, DType dout, int64_t n) {
  if (n > 0) cuda::launch<broadcast_scalar_kernel>(grid_for(n), kBlock, 0, nullptr, s, alpha, out, dout, n);
}
void launch_activation(Activation act, const void* x, DType dx, void* y, DType dy, int64_t n) {
  if (n > 0) cuda::launch<activation_kernel>(grid_for(n), kBlock, 0, nullptr, act, x, dx, y, dy, n);
}
void launch_activation_backward(Activation act, const void* x, DType dx, const void* dy, DType ddy, void* dxo,
                                DType ddxo, int64_t n) {
  if (n > 0) cuda::launch<activation_backward_kernel>(grid_for(n), kBlock, 0, nullptr, act, x, dx, dy, ddy, dxo, ddxo, n);
}
void launch_clamp(void* x, DType dx, float lo, float hi, int64_t n) {
  if (n > 0) cuda::launch<clamp_kernel>(grid_for(n), kBlock, 0, nullptr, x, dx, lo, hi, n);
}
void launch_scale_by_scalar(void* x, DType dx, const float* factor, int64_t n) {
  if (n > 0) cuda::launch<scale_by_scalar_kernel>(grid_for(n), kBlock, 0, nullptr, x, dx, factor, n);
}

}  // namespace belay

// The elementwise functions of UnaryOp (engine/backend.h) and their derivatives, written once
// for both backends (BELAY_HD): the CPU loop and the CUDA kernel call these same lines, so
// they compute the same formula. expf/logf/tanhf/powf are the platform's (glibc on the CPU,
// CUDA's on the GPU, within 2 ulp of each other): results agree to the tolerance helper, not
// bit for bit. The derivative reads y = f(x) where it is cheaper and as exact (exp, tanh,
// sigmoid), as PyTorch's backward formulas do.
#pragma once
#include <cmath>

#include "engine/backend.h"
#include "kernels/common/element_math.h"

namespace belay {

BELAY_HD float sigmoid_f32(float x) { return 1.0f / (1.0f + expf(-x)); }

BELAY_HD float unary_f32(UnaryOp op, float x, float p) {
  switch (op) {
    case UnaryOp::Exp: return expf(x);
    case UnaryOp::Log: return logf(x);
    case UnaryOp::Tanh: return tanhf(x);
    case UnaryOp::Sigmoid: return sigmoid_f32(x);
    default: return powf(x, p);
  }
}

// dy * f'(x), with y = f(x) as stored.
BELAY_HD float unary_grad_f32(UnaryOp op, float x, float y, float dy, float p) {
  switch (op) {
    case UnaryOp::Exp: return dy * y;
    case UnaryOp::Log: return dy / x;
    case UnaryOp::Tanh: return dy * (1.0f - y * y);
    case UnaryOp::Sigmoid: return dy * (y * (1.0f - y));
    default:
      // x^0 is the constant 1: its derivative is 0 (p * x^-1 would give 0 * inf = NaN at x = 0).
      return p == 0.0f ? 0.0f : dy * (p * powf(x, p - 1.0f));
  }
}

BELAY_HD float binary_f32(BinaryOp op, float x, float y) {
  // IEEE division on both (nvcc's default -prec-div=true): the same bits as the CPU's x / y.
  return op == BinaryOp::Add ? x + y : op == BinaryOp::Sub ? x - y : op == BinaryOp::Mul ? x * y : x / y;
}

}  // namespace belay

// The elementwise ops of the CPU backend (kernels/cpu/cpu_kernels.h), each a map over blocks
// (block_loops.h, map_blocks): read each input once, write the output once; 1 flop or so per
// element (GELU: belay's own erf, ~20).
#include "kernels/common/element_math.h"
#include "kernels/cpu/block_loops.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/isa/element_blocks.h"

namespace belay::cpu {

void binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out) {
  map_blocks(
      out,
      [op](int64_t, int64_t len, float* r, const float* x, const float* y) {
        switch (op) {
          case BinaryOp::Add: for (int64_t j = 0; j < len; ++j) r[j] = x[j] + y[j]; break;
          case BinaryOp::Sub: for (int64_t j = 0; j < len; ++j) r[j] = x[j] - y[j]; break;
          case BinaryOp::Mul: for (int64_t j = 0; j < len; ++j) r[j] = x[j] * y[j]; break;
          case BinaryOp::Div: for (int64_t j = 0; j < len; ++j) r[j] = x[j] / y[j]; break;
        }
      },
      a, b);
}

void scale(const Tensor& x, float s, Tensor& out) {
  map_blocks(
      out, [s](int64_t, int64_t len, float* r, const float* v) {
        for (int64_t j = 0; j < len; ++j) r[j] = s * v[j];
      },
      x);
}

void accumulate(Tensor& dst, const Tensor& src, float alpha, const Tensor* s) {
  const float factor = alpha * (s ? scalar_value(*s) : 1.0f);
  map_blocks(
      dst,
      [factor](int64_t, int64_t len, float* r, const float* x, const float* d) {
        for (int64_t j = 0; j < len; ++j) r[j] = d[j] + factor * x[j];
      },
      src, dst);
}

void broadcast_scalar(const Tensor& s, float alpha, Tensor& out) { fill(out, scalar_value(s) * alpha); }

// The FP32 math of a block on the active ISA path (kernels/cpu/isa/element_blocks.cpp): GELU
// through belay's own erf and exp (erf_exp.h), the same bits on every path.
void activation(Activation act, const Tensor& x, Tensor& y) {
  const ElementBlocks& blocks = cpu_element_blocks();
  const auto f = act == Activation::Relu ? blocks.relu : act == Activation::Gelu ? blocks.gelu : blocks.gelu_tanh;
  map_blocks(y, [f](int64_t, int64_t len, float* r, const float* v) { f(v, r, len); }, x);
}

void activation_backward(Activation act, const Tensor& x, const Tensor& dy, Tensor& dx) {
  const ElementBlocks& blocks = cpu_element_blocks();
  const auto f =
      act == Activation::Relu ? blocks.relu_grad : act == Activation::Gelu ? blocks.gelu_grad : blocks.gelu_tanh_grad;
  map_blocks(dx, [f](int64_t, int64_t len, float* r, const float* v, const float* g) { f(v, g, r, len); }, x, dy);
}

void clamp_inplace(Tensor& x, float lo, float hi) {
  map_blocks(
      x,
      [lo, hi](int64_t, int64_t len, float* r, const float* v) {
        // NaN stays NaN (as torch.clamp): comparisons with NaN are false.
        for (int64_t j = 0; j < len; ++j) r[j] = v[j] < lo ? lo : (v[j] > hi ? hi : v[j]);
      },
      x);
}

void scale_inplace(const std::vector<Tensor*>& grads, const Tensor& factor) {
  const float f = scalar_value(factor);
  for (Tensor* g : grads) scale(*g, f, *g);
}

}  // namespace belay::cpu

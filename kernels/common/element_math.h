// Element math written once for every backend (BELAY_HD: host and device). The CPU loops
// and the CUDA kernels call these same functions, so both compute the same formula.
#pragma once
#include <cmath>
#include <cstdint>

#include "engine/activation.h"
#include "engine/half_bits.h"

namespace belay {

BELAY_HD bool is_finite_f32(float x) {
  // Exponent all ones means inf or NaN; works under -ffast-math too.
  return (f32_bits(x) & 0x7f800000u) != 0x7f800000u;
}

// GELU, the exact (erf) form that PyTorch uses by default. The CUDA kernels use these (CUDA's
// erff/expf are already vector code there); the CPU backend uses the same formula through
// its own erf and exp (kernels/cpu/isa/erf_exp.h), since glibc's erff/expf do not vectorize.
BELAY_HD float gelu_f32(float x) { return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f)); }

BELAY_HD float gelu_grad_f32(float x) {
  const float cdf = 0.5f * (1.0f + erff(x * 0.70710678118654752f));
  const float pdf = 0.39894228040143268f * expf(-0.5f * x * x);
  return cdf + x * pdf;
}

// GELU's tanh form (PyTorch's approximate='tanh', GPT-2's and Hugging Face's "gelu_new"):
// 0.5 x (1 + tanh(u)), u = sqrt(2 / pi) (x + 0.044715 x^3), computed as x s with s the
// logistic function of 2u (the same value: 0.5 (1 + tanh u) = 1 / (1 + e^(-2u))), through
// e = e^(-2|u|), which lies in [0, 1] and never overflows: s = 1 / (1 + e) for u >= 0 and
// e / (1 + e) for u < 0. Nothing subtracts nearly equal numbers, so the far negative tail keeps
// its relative accuracy where 1 + tanh(u) would cancel to 0. -inf (where -inf * 0 would be NaN)
// gets the limit -0 from the select. The CPU backend computes the same formula with its own
// exp (kernels/cpu/isa/erf_exp.h); the tests' bound is tests/kernels/gelu_tanh_reference.h.
constexpr float kGeluTanhC = 0.79788456080286536f;  // sqrt(2 / pi)
constexpr float kGeluTanhA = 0.044715f;
constexpr float kGeluTanhA3 = 0.134145f;  // 3 * 0.044715, for the derivative of x^3
BELAY_HD float gelu_tanh_f32(float x) {
  const float u = kGeluTanhC * (x + kGeluTanhA * (x * x * x));
  const float e = expf(-2.0f * fabsf(u));
  const float r = 1.0f / (1.0f + e);
  const float s = u < 0.0f ? e * r : r;
  if (x != x) return x;
  return x < -20.0f ? -0.0f : x * s;
}

// Its derivative s + x s (1 - s) 2 u', with s (1 - s) = e r r (r = 1 / (1 + e), the same for
// both signs of u) and u' = sqrt(2 / pi) (1 + 3 * 0.044715 x^2). Beyond |x| = 20 the limits 1
// and 0 (the formula's own values from |x| = 10.5 on, where e is 0, but inf * 0 at the
// infinities); a NaN x comes back as it is.
BELAY_HD float gelu_tanh_grad_f32(float x) {
  const float x2 = x * x;
  const float u = kGeluTanhC * (x + kGeluTanhA * (x2 * x));
  const float du = kGeluTanhC * (1.0f + kGeluTanhA3 * x2);
  const float e = expf(-2.0f * fabsf(u));
  const float r = 1.0f / (1.0f + e);
  const float s = u < 0.0f ? e * r : r;
  const float g = s + x * (e * r * r) * 2.0f * du;
  if (x != x) return x;
  return x > 20.0f ? 1.0f : (x < -20.0f ? 0.0f : g);
}

// An activation and its backward dy f'(x) by kind, for the kernels that take an Activation.
// ReLU's backward selects (x > 0 ? dy : 0), so a NaN or inf dy where x <= 0 gives 0.
BELAY_HD float activation_f32(Activation act, float x) {
  return act == Activation::Relu ? (x > 0.0f ? x : 0.0f) : act == Activation::Gelu ? gelu_f32(x) : gelu_tanh_f32(x);
}
BELAY_HD float activation_backward_f32(Activation act, float x, float dy) {
  return act == Activation::Relu ? (x > 0.0f ? dy : 0.0f)
                                 : dy * (act == Activation::Gelu ? gelu_grad_f32(x) : gelu_tanh_grad_f32(x));
}

// One AdamW element, in PyTorch's order: decoupled decay p *= (1 - lr*wd), then the moments,
// then p -= lr * m_hat / (sqrt(v_hat) + eps). eps stays outside the square root and in FP32
// (1e-8 would be 0 in FP16). g arrives already multiplied by inv_scale and clip_coef.
BELAY_HD void adamw_element(float g, float& p, float& m, float& v, float lr, float beta1, float beta2, float eps,
                            float weight_decay, float bias_correction1, float bias_correction2) {
  p = p * (1.0f - lr * weight_decay);
  m = beta1 * m + (1.0f - beta1) * g;
  v = beta2 * v + (1.0f - beta2) * g * g;
  const float m_hat = m / bias_correction1;
  const float v_hat = v / bias_correction2;
  p = p - lr * m_hat / (sqrtf(v_hat) + eps);
}

// AdamW's bias correction 1 - beta^t for the t-th applied step, in FP64 and rounded once,
// from the applied-step count the device keeps (t = applied_steps + 1): the host never needs
// the count to run a step. pow is glibc's on the CPU and CUDA's on the GPU (both within 1-2
// ulp in FP64, so the FP32 results agree except at rare rounding ties). ::pow, named from the
// global namespace: an unqualified pow would find belay::pow (autograd/ops.h) first wherever that
// header came earlier in the unit.
BELAY_HD float adamw_bias_correction(float beta, float applied_steps) {
  return static_cast<float>(1.0 - ::pow(static_cast<double>(beta), static_cast<double>(applied_steps) + 1.0));
}

// The index a step count selects in a table of n per-step values (the LR schedule): the
// count itself, held at the last entry once the schedule has ended.
BELAY_HD int64_t table_index(float count, int64_t n) {
  if (!(count > 0.0f)) return 0;                              // also NaN
  if (!(count < static_cast<float>(n - 1))) return n - 1;     // before converting: no overflow
  return static_cast<int64_t>(count);
}

// One SGD element with momentum (PyTorch's form: buf = mu*buf + g; p -= lr*buf).
// Weight decay is coupled (added to g), as torch.optim.SGD does.
BELAY_HD void sgd_element(float g, float& p, float& buf, float lr, float momentum, float weight_decay,
                          bool has_momentum) {
  g = g + weight_decay * p;
  if (has_momentum) {
    buf = momentum * buf + g;
    g = buf;
  }
  p = p - lr * g;
}

// The gradient the optimizer applies: the stored gradient, unscaled and clipped on the fly.
// Left to right, so it equals unscale-in-place followed by clip-in-place in FP32 bit for bit.
BELAY_HD float effective_grad(float stored, float inv_scale, float clip_coef) {
  return stored * inv_scale * clip_coef;
}

BELAY_HD float clip_coefficient_of(float norm, float max_norm) {
  const float coef = max_norm / (norm + 1e-6f);
  return coef < 1.0f ? coef : 1.0f;  // max_norm = inf gives 1: only measures
}

// The dynamic loss scaler's state transition, for one step. All state is FP32 so it can
// live in device memory; counts stay exact far beyond any growth interval.
BELAY_HD void scaler_transition(float found_inf, float& scale, float& growth_tracker, float& hysteresis_left,
                                float growth_factor, float backoff_factor, float growth_interval,
                                float hysteresis, float min_scale, float max_scale) {
  if (found_inf != 0.0f) {
    growth_tracker = 0.0f;
    hysteresis_left = hysteresis_left - 1.0f;
    if (hysteresis_left <= 0.0f) {
      const float backed_off = scale * backoff_factor;
      scale = backed_off > min_scale ? backed_off : min_scale;
      // As Megatron does: the tracker is refilled only by a growth, so once overflows
      // have used it up, every further overflow backs off at once.
    }
    return;
  }
  growth_tracker = growth_tracker + 1.0f;
  if (growth_tracker >= growth_interval) {
    const float grown = scale * growth_factor;
    // Growth is refused if it would overflow FP32 or pass max_scale (PyTorch refuses inf).
    if (is_finite_f32(grown)) scale = grown < max_scale ? grown : max_scale;
    growth_tracker = 0.0f;
    hysteresis_left = hysteresis;
  }
}

}  // namespace belay

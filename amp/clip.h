// Gradient clipping, in place, as torch.nn.utils does it: by the global L2 norm over all
// gradients (not per parameter), or by value.
#pragma once
#include <limits>
#include <vector>

#include "optim/optimizer.h"

namespace belay {

struct ClipResult {
  float pre_clip_norm;   // global L2 norm before clipping
  float post_clip_norm;  // after: pre * min(1, max_norm / (pre + 1e-6))
};

// max_norm = inf only measures. error_if_nonfinite: throw if the norm is inf or NaN
// (otherwise a non-finite norm leaves the gradients as they are).
ClipResult clip_grad_norm(const std::vector<Tensor*>& grads, float max_norm, bool error_if_nonfinite = false);
ClipResult clip_grad_norm(Optimizer& opt, float max_norm, bool error_if_nonfinite = false);
// The same without reading anything on the host (what a training step uses): the norm and
// the coefficient come back as device scalars, and the gradients are always multiplied by
// the coefficient (1 when under max_norm; PyTorch's clip_grad_norm_ does the same to avoid a
// sync), except with max_norm = inf, which only measures.
struct DeviceClip {
  Tensor norm;       // FP32 [1]
  Tensor clip_coef;  // FP32 [1]
};
DeviceClip clip_grad_norm_on_device(const std::vector<Tensor*>& grads, float max_norm);
void clip_grad_value(const std::vector<Tensor*>& grads, float clip_value);
// Clip by value in a training step (--clip-mode value), on unscaled gradients, reading
// nothing on the host: each element clamped to [-clip_value, clip_value] in place. Unlike
// clipping by norm this changes the gradient's direction, so it also measures how much:
// the norms before and after and the dot product of the raw and the clamped gradient (the
// cosine is dot / (norm * post_norm)), as device scalars. Costs one FP32 copy of the
// gradients (taken from the caching allocator, so a steady-state step still allocates
// nothing from the system). A non-finite gradient is clamped too, but its step is skipped
// by found_inf, which the unscale before this recorded.
struct DeviceValueClip {
  Tensor norm;       // FP32 [1]: global L2 norm before clamping
  Tensor post_norm;  // FP32 [1]: after
  Tensor dot;        // FP32 [1]: sum of raw * clamped over every element
};
DeviceValueClip clip_grad_value_on_device(const std::vector<Tensor*>& grads, float clip_value);

constexpr float kNoClip = std::numeric_limits<float>::infinity();

}  // namespace belay

#include "amp/clip.h"

#include <cmath>

#include "engine/backend.h"
#include "engine/error.h"

namespace belay {

namespace {

void check_max_norm(float max_norm) {
  if (std::isnan(max_norm) || max_norm <= 0.0f) throw Error("clip_grad_norm: max_norm must be > 0 (inf only measures)");
}

// The global norm of the gradients and the clip coefficient, as device scalars.
DeviceClip measure(const std::vector<Tensor*>& grads, float max_norm) {
  const Device device = grads[0]->device();
  const Backend& be = backend_for(device);
  std::vector<const Tensor*> read(grads.begin(), grads.end());
  const Tensor one = Tensor::full(Shape{1}, 1.0f, DType::F32, device);  // filled by a kernel: no upload
  Tensor found = Tensor::empty(Shape{1}, DType::F32, device);
  DeviceClip r{Tensor::empty(Shape{1}, DType::F32, device), Tensor::empty(Shape{1}, DType::F32, device)};
  be.guard(read, one, found, r.norm);
  be.clip_coefficient(r.norm, max_norm, r.clip_coef);
  return r;
}

}  // namespace

ClipResult clip_grad_norm(const std::vector<Tensor*>& grads, float max_norm, bool error_if_nonfinite) {
  check_max_norm(max_norm);
  if (grads.empty()) return {0.0f, 0.0f};
  const DeviceClip m = measure(grads, max_norm);
  const float pre = m.norm.item();
  if (!std::isfinite(pre)) {
    if (error_if_nonfinite)
      throw Error("clip_grad_norm: the total norm of the gradients is non-finite (" + std::to_string(pre) +
                  "); set error_if_nonfinite=false to skip this check");
    return {pre, pre};
  }
  const float c = m.clip_coef.item();
  if (c < 1.0f) backend_for(grads[0]->device()).scale_inplace(grads, m.clip_coef);
  return {pre, pre * c};
}

ClipResult clip_grad_norm(Optimizer& opt, float max_norm, bool error_if_nonfinite) {
  return clip_grad_norm(opt.mutable_grads(), max_norm, error_if_nonfinite);
}

DeviceClip clip_grad_norm_on_device(const std::vector<Tensor*>& grads, float max_norm) {
  check_max_norm(max_norm);
  if (grads.empty()) throw Error("clip_grad_norm_on_device: no gradients");
  DeviceClip r = measure(grads, max_norm);
  if (!std::isinf(max_norm)) backend_for(grads[0]->device()).scale_inplace(grads, r.clip_coef);
  return r;
}

void clip_grad_value(const std::vector<Tensor*>& grads, float clip_value) {
  if (!(clip_value > 0.0f)) throw Error("clip_grad_value: clip_value must be > 0");
  for (Tensor* g : grads) backend_for(g->device()).clamp_inplace(*g, -clip_value, clip_value);
}

DeviceValueClip clip_grad_value_on_device(const std::vector<Tensor*>& grads, float clip_value) {
  if (!(clip_value > 0.0f)) throw Error("clip_grad_value: clip_value must be > 0");
  if (grads.empty()) throw Error("clip_grad_value_on_device: no gradients");
  const Device device = grads[0]->device();
  const Backend& be = backend_for(device);
  const Tensor one = Tensor::full(Shape{1}, 1.0f, DType::F32, device);
  Tensor found = Tensor::empty(Shape{1}, DType::F32, device);
  DeviceValueClip r{Tensor::empty(Shape{1}, DType::F32, device), Tensor::empty(Shape{1}, DType::F32, device),
                    Tensor::zeros(Shape{1}, DType::F32, device)};
  std::vector<const Tensor*> read(grads.begin(), grads.end());
  be.guard(read, one, found, r.norm);
  Tensor partial = Tensor::empty(Shape{1}, DType::F32, device);
  for (Tensor* g : grads) {
    Tensor raw = Tensor::empty(g->shape(), DType::F32, device);
    be.cast(*g, raw);  // exact: FP16/BF16 widen to FP32 without rounding
    be.clamp_inplace(*g, -clip_value, clip_value);
    be.binary(BinaryOp::Mul, raw, *g, raw);  // raw * clamped, in FP32
    be.sum(raw, partial);
    be.accumulate(r.dot, partial, 1.0f, nullptr);
  }
  be.guard(read, one, found, r.post_norm);
  return r;
}

}  // namespace belay

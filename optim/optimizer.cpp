#include "optim/optimizer.h"

#include "engine/error.h"

namespace belay {

Optimizer::Optimizer(std::vector<Var> params, float lr) : params_(std::move(params)), lr_(lr) {
  if (params_.empty()) throw Error("optimizer: no parameters given");
  device_ = params_[0].device();
  for (const Var& p : params_) {
    if (!p.is_parameter()) throw Error("optimizer: '" + p.name() + "' is not a parameter (no FP32 master)");
    if (p.device() != device_) throw Error("optimizer: parameters live on different devices");
  }
}

void Optimizer::step(const Tensor& inv_scale, const Tensor& clip_coef, const Tensor& found_inf) {
  apply(step_count_ + 1, inv_scale, clip_coef, found_inf);
  // The kernels are no-ops under found_inf; the count follows them. Reading the flag is free
  // on the CPU and a synchronisation on a GPU. Known debt: a sync-free CUDA step needs the
  // count (and the bias corrections and LR derived from it) kept on the device.
  if (found_inf.item() == 0.0f) ++step_count_;
}

void Optimizer::step() {
  const Tensor one = Tensor::scalar(1.0f, DType::F32, device_);
  const Tensor zero = Tensor::scalar(0.0f, DType::F32, device_);
  step(one, one, zero);
}

void Optimizer::zero_grad(bool set_to_none) {
  for (Var& p : params_) p.zero_grad(set_to_none);
}

std::vector<const Tensor*> Optimizer::grads() const {
  std::vector<const Tensor*> out;
  for (const Var& p : params_)
    if (p.grad().defined()) out.push_back(&p.grad());
  return out;
}

std::vector<Tensor*> Optimizer::mutable_grads() {
  std::vector<Tensor*> out;
  for (Var& p : params_)
    if (p.grad().defined()) out.push_back(&p.mutable_grad());
  return out;
}

Tensor* Optimizer::working_copy_of(const Var& p) {
  Tensor& value = p.node()->value;
  return value.data() == p.master().data() ? nullptr : &value;
}

}  // namespace belay

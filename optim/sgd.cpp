#include "optim/sgd.h"

#include "engine/backend.h"
#include "engine/error.h"

namespace belay {

Sgd::Sgd(std::vector<Var> params, SgdOptions options) : Optimizer(std::move(params), options.lr), options_(options) {
  if (!(options.lr >= 0.0f) || !(options.momentum >= 0.0f) || !(options.weight_decay >= 0.0f))
    throw UsageError("sgd: need lr, momentum and weight_decay >= 0");
  for (const Var& p : params_)
    momentum_.push_back(options.momentum > 0.0f ? Tensor::zeros(p.shape(), DType::F32, device_) : Tensor());
}

void Sgd::apply(const StepScalars& scalars) {
  std::vector<SgdSlot> slots;
  for (size_t i = 0; i < params_.size(); ++i) {
    const Var& p = params_[i];
    if (!p.grad().defined()) continue;
    SgdSlot s;
    s.master = const_cast<Tensor*>(&p.master());
    s.momentum = momentum_[i].defined() ? &momentum_[i] : nullptr;
    s.grad = &p.grad();
    s.working = working_copy_of(p);
    s.weight_decay = (p.value().rank() > 1 || options_.decay_1d) ? options_.weight_decay : 0.0f;
    slots.push_back(s);
  }
  backend_for(device_).sgd(options_.momentum, slots, scalars);
}

std::vector<std::pair<std::string, Tensor*>> Sgd::state_tensors() {
  std::vector<std::pair<std::string, Tensor*>> out;
  for (size_t i = 0; i < params_.size(); ++i)
    if (momentum_[i].defined()) out.push_back({"optim." + params_[i].name() + ".momentum_buffer", &momentum_[i]});
  return out;
}

}  // namespace belay

#include "optim/adamw.h"

#include "engine/backend.h"
#include "engine/error.h"

namespace belay {

AdamW::AdamW(std::vector<Var> params, AdamWOptions options) : Optimizer(std::move(params), options.lr), options_(options) {
  if (!(options.lr >= 0.0f) || !(options.eps > 0.0f) || !(options.beta1 >= 0.0f && options.beta1 < 1.0f) ||
      !(options.beta2 >= 0.0f && options.beta2 < 1.0f) || !(options.weight_decay >= 0.0f))
    throw UsageError("adamw: need lr >= 0, eps > 0, betas in [0, 1) and weight_decay >= 0");
  for (const Var& p : params_) {
    m_.push_back(Tensor::zeros(p.shape(), DType::F32, device_));
    v_.push_back(Tensor::zeros(p.shape(), DType::F32, device_));
  }
}

void AdamW::apply(const StepScalars& scalars) {
  AdamWHyper h;
  h.beta1 = options_.beta1;
  h.beta2 = options_.beta2;
  h.eps = options_.eps;
  std::vector<AdamWSlot> slots;
  for (size_t i = 0; i < params_.size(); ++i) {
    const Var& p = params_[i];
    if (!p.grad().defined()) continue;
    AdamWSlot s;
    s.master = const_cast<Tensor*>(&p.master());
    s.m = &m_[i];
    s.v = &v_[i];
    s.grad = &p.grad();
    s.working = working_copy_of(p);
    s.weight_decay = (p.value().rank() > 1 || options_.decay_1d) ? options_.weight_decay : 0.0f;
    slots.push_back(s);
  }
  backend_for(device_).adamw(h, slots, scalars);
}

std::vector<std::pair<std::string, Tensor*>> AdamW::state_tensors() {
  std::vector<std::pair<std::string, Tensor*>> out;
  for (size_t i = 0; i < params_.size(); ++i) {
    out.push_back({"optim." + params_[i].name() + ".exp_avg", &m_[i]});
    out.push_back({"optim." + params_[i].name() + ".exp_avg_sq", &v_[i]});
  }
  return out;
}

}  // namespace belay

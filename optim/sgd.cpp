#include "optim/sgd.h"

#include "engine/backend.h"
#include "engine/error.h"

namespace belay {

namespace {

void check_options(const SgdOptions& o) {
  if (!(o.lr >= 0.0f) || !(o.momentum >= 0.0f) || !(o.weight_decay >= 0.0f))
    throw UsageError("sgd: need lr, momentum and weight_decay >= 0");
}

}  // namespace

Sgd::Sgd(std::vector<Var> params, SgdOptions options) : Sgd({SgdGroup{std::move(params), options}}, options) {}

// The base checks the LRs first (one message for a bad LR everywhere), then the other options.
Sgd::Sgd(std::vector<SgdGroup> groups, SgdOptions defaults)
    : Optimizer(take_group_params(groups), group_lrs(groups), defaults.lr), defaults_(defaults) {
  check_options(defaults);
  for (size_t g = 0; g < groups.size(); ++g) {
    check_options(groups[g].options);
    options_.push_back(groups[g].options);
    for (size_t i = group_begin(g); i < group_begin(g + 1); ++i)
      momentum_.push_back(groups[g].options.momentum > 0.0f ? Tensor::zeros(params_[i].shape(), DType::F32, device_)
                                                            : Tensor());
  }
}

void Sgd::apply(size_t group, const StepScalars& scalars) {
  const SgdOptions& o = options_[group];
  std::vector<SgdSlot> slots;
  for (size_t i = group_begin(group); i < group_begin(group + 1); ++i) {
    const Var& p = params_[i];
    if (!p.grad().defined()) continue;
    SgdSlot s;
    s.master = const_cast<Tensor*>(&p.master());
    s.momentum = momentum_[i].defined() ? &momentum_[i] : nullptr;
    s.grad = &p.grad();
    s.working = working_copy_of(p);
    s.weight_decay = (p.value().rank() > 1 || o.decay_1d) ? o.weight_decay : 0.0f;
    slots.push_back(s);
  }
  backend_for(device_).sgd(o.momentum, slots, scalars);
}

std::vector<std::pair<std::string, Tensor*>> Sgd::state_tensors() {
  std::vector<std::pair<std::string, Tensor*>> out;
  for (size_t i = 0; i < params_.size(); ++i)
    if (momentum_[i].defined()) out.push_back({"optim." + params_[i].name() + ".momentum_buffer", &momentum_[i]});
  return out;
}

std::vector<std::string> Sgd::state_names(size_t i) const {
  if (!momentum_[i].defined()) return {};
  return {"optim." + params_[i].name() + ".momentum_buffer"};
}

}  // namespace belay

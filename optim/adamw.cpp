#include "optim/adamw.h"

#include "engine/backend.h"
#include "engine/error.h"

namespace belay {

namespace {

void check_options(const AdamWOptions& o) {
  if (!(o.lr >= 0.0f) || !(o.eps > 0.0f) || !(o.beta1 >= 0.0f && o.beta1 < 1.0f) || !(o.beta2 >= 0.0f && o.beta2 < 1.0f) ||
      !(o.weight_decay >= 0.0f))
    throw UsageError("adamw: need lr >= 0, eps > 0, betas in [0, 1) and weight_decay >= 0");
}

}  // namespace

AdamW::AdamW(std::vector<Var> params, AdamWOptions options) : AdamW({AdamWGroup{std::move(params), options}}, options) {}

// The base checks the LRs first (one message for a bad LR everywhere), then the other options.
AdamW::AdamW(std::vector<AdamWGroup> groups, AdamWOptions defaults)
    : Optimizer(take_group_params(groups), group_lrs(groups), defaults.lr), defaults_(defaults) {
  check_options(defaults);
  for (const AdamWGroup& g : groups) {
    check_options(g.options);
    options_.push_back(g.options);
  }
  for (const Var& p : params_) {
    m_.push_back(Tensor::zeros(p.shape(), DType::F32, device_));
    v_.push_back(Tensor::zeros(p.shape(), DType::F32, device_));
  }
}

void AdamW::apply(size_t group, const StepScalars& scalars) {
  const AdamWOptions& o = options_[group];
  AdamWHyper h;
  h.beta1 = o.beta1;
  h.beta2 = o.beta2;
  h.eps = o.eps;
  std::vector<AdamWSlot> slots;
  for (size_t i = group_begin(group); i < group_begin(group + 1); ++i) {
    const Var& p = params_[i];
    if (!p.grad().defined() || !owns(i)) continue;  // another rank updates it (sharded)
    AdamWSlot s;
    s.master = const_cast<Tensor*>(&p.master());
    s.m = &m_[i];
    s.v = &v_[i];
    s.grad = &p.grad();
    s.working = working_copy_of(p);
    s.weight_decay = (p.value().rank() > 1 || o.decay_1d) ? o.weight_decay : 0.0f;
    slots.push_back(s);
  }
  backend_for(device_).adamw(h, slots, scalars);
}

std::vector<std::pair<std::string, Tensor*>> AdamW::state_tensors() {
  std::vector<std::pair<std::string, Tensor*>> out;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!owns(i)) continue;
    const std::vector<std::string> names = state_names(i);
    out.push_back({names[0], &m_[i]});
    out.push_back({names[1], &v_[i]});
  }
  return out;
}

std::vector<std::string> AdamW::state_names(size_t i) const {
  return {"optim." + params_[i].name() + ".exp_avg", "optim." + params_[i].name() + ".exp_avg_sq"};
}

// The moments of a parameter another rank owns are released, and its FP32 master where the
// working copy is a tensor of its own: that is the memory sharding saves.
void AdamW::set_owned(const std::vector<bool>& owned) {
  if (owned.size() != params_.size())
    throw Error("adamw: set_owned needs one flag per parameter (" + std::to_string(params_.size()) + "), got " +
                std::to_string(owned.size()));
  owned_ = owned;
  for (size_t i = 0; i < params_.size(); ++i)
    if (!owned[i]) {
      m_[i] = v_[i] = Tensor();
      params_[i].release_master();
    }
}

}  // namespace belay

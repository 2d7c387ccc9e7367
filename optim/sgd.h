// SGD with momentum (PyTorch's form: buf = momentum * buf + g, p -= lr * buf) and coupled
// weight decay; 1-D parameters are not decayed unless asked.
#pragma once
#include "optim/optimizer.h"

namespace belay {

struct SgdOptions {
  float lr = 1e-2f;
  float momentum = 0.9f;
  float weight_decay = 0.0f;
  bool decay_1d = false;
};

// A parameter group: its parameters and every option of its own (see AdamWGroup).
struct SgdGroup {
  std::vector<Var> params;
  SgdOptions options;
};

class Sgd : public Optimizer {
 public:
  Sgd(std::vector<Var> params, SgdOptions options = {});
  // defaults.lr is the optimizer's lr: the one schedules and set_lr speak of.
  Sgd(std::vector<SgdGroup> groups, SgdOptions defaults);
  const SgdOptions& options() const { return defaults_; }
  const SgdOptions& group_options(size_t g) const { return options_[g]; }
  std::vector<std::pair<std::string, Tensor*>> state_tensors() override;
  std::vector<std::string> state_names(size_t i) const override;
  std::string name() const override { return "sgd"; }

 protected:
  void apply(size_t group, const StepScalars& scalars) override;

 private:
  SgdOptions defaults_;
  std::vector<SgdOptions> options_;  // per group
  std::vector<Tensor> momentum_;
};

}  // namespace belay

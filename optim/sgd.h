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

class Sgd : public Optimizer {
 public:
  Sgd(std::vector<Var> params, SgdOptions options = {});
  std::vector<std::pair<std::string, Tensor*>> state_tensors() override;
  std::string name() const override { return "sgd"; }

 protected:
  void apply(const StepScalars& scalars) override;

 private:
  SgdOptions options_;
  std::vector<Tensor> momentum_;
};

}  // namespace belay

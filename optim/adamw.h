// AdamW (Loshchilov & Hutter): decoupled weight decay, bias correction, eps added outside
// the square root and kept in FP32. By default 1-D parameters (biases, norms) get no decay.
#pragma once
#include "optim/optimizer.h"

namespace belay {

struct AdamWOptions {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.01f;
  bool decay_1d = false;  // also decay 1-D parameters
};

// A parameter group: its parameters and every option of its own (copy the optimizer's
// defaults and change what differs, as PyTorch fills a group's missing keys).
struct AdamWGroup {
  std::vector<Var> params;
  AdamWOptions options;
};

class AdamW : public Optimizer {
 public:
  AdamW(std::vector<Var> params, AdamWOptions options = {});
  // defaults.lr is the optimizer's lr: the one schedules and set_lr speak of.
  AdamW(std::vector<AdamWGroup> groups, AdamWOptions defaults);
  std::vector<std::pair<std::string, Tensor*>> state_tensors() override;
  std::vector<std::string> state_names(size_t i) const override;
  void set_owned(const std::vector<bool>& owned) override;
  std::string name() const override { return "adamw"; }
  const AdamWOptions& options() const { return defaults_; }
  const AdamWOptions& group_options(size_t g) const { return options_[g]; }
  const Tensor& exp_avg(size_t i) const { return m_[i]; }
  const Tensor& exp_avg_sq(size_t i) const { return v_[i]; }

 protected:
  void apply(size_t group, const StepScalars& scalars) override;

 private:
  AdamWOptions defaults_;
  std::vector<AdamWOptions> options_;  // per group
  std::vector<Tensor> m_, v_;
};

}  // namespace belay

// The optimizer interface. Parameters hold FP32 masters; an optimizer keeps its state in
// FP32 and, in the same pass that updates a master, writes the FP16/BF16 working copy the
// next forward reads. A step takes three device scalars from the AMP guard (inv_scale,
// clip_coef, found_inf) and applies g * inv_scale * clip_coef on the fly; with found_inf
// set it changes nothing, not even its step count.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "autograd/graph.h"

namespace belay {

class Optimizer {
 public:
  explicit Optimizer(std::vector<Var> params, float lr);
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  void step(const Tensor& inv_scale, const Tensor& clip_coef, const Tensor& found_inf);
  void step();  // no scaling, no clipping
  void zero_grad(bool set_to_none = true);

  const std::vector<Var>& params() const { return params_; }
  // The gradients the next step will read (parameters without a gradient are skipped).
  std::vector<const Tensor*> grads() const;
  std::vector<Tensor*> mutable_grads();
  Device device() const { return device_; }

  float lr() const { return lr_; }
  void set_lr(float lr) { lr_ = lr; }
  int64_t step_count() const { return step_count_; }  // applied steps only
  void set_step_count(int64_t n) { step_count_ = n; }

  // Named FP32 state tensors (moments, momentum buffers), for checkpoints.
  virtual std::vector<std::pair<std::string, Tensor*>> state_tensors() = 0;
  virtual std::string name() const = 0;

 protected:
  // `t` is the 1-based index of the step being taken (for bias correction).
  virtual void apply(int64_t t, const Tensor& inv_scale, const Tensor& clip_coef, const Tensor& found_inf) = 0;
  // The working copy to refresh with the master, or null when they share storage (FP32).
  static Tensor* working_copy_of(const Var& p);

  std::vector<Var> params_;
  Device device_;
  float lr_;
  int64_t step_count_ = 0;
};

}  // namespace belay

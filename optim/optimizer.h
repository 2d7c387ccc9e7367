// The optimizer interface. Parameters hold FP32 masters; an optimizer keeps its state in
// FP32 and, in the same pass that updates a master, writes the FP16/BF16 working copy the
// next forward reads. A step takes three device scalars from the AMP guard (inv_scale,
// clip_coef, found_inf) and applies g * inv_scale * clip_coef on the fly; with found_inf
// set it changes nothing, not even its step count.
//
// The position of the run lives on the device too: the applied-step count is a device
// scalar advanced by a kernel only when found_inf is clear, the LR is picked on the device
// from the schedule's table at that count, and AdamW's bias corrections are computed from it
// in the update kernel. So a step is enqueued without the host reading anything back.
//
// Parameter groups (PyTorch's param_groups): the parameters come in groups, each with
// hyperparameters of its own (AdamW's and SGD's options). A group's LR follows the optimizer's
// schedule scaled by group lr / optimizer lr, as a PyTorch scheduler scales each group's base
// lr: set_lr(x) gives the groups x * their ratio. A group whose lr is the optimizer's reads
// the optimizer's LR scalar itself, so one group is exactly the optimizer without groups.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "autograd/graph.h"
#include "engine/backend.h"
#include "optim/lr_schedule.h"

namespace belay {

// A list of groups ({params, options} with options.lr) as the base class takes them: the
// parameters of each group (moved out) and each group's lr.
template <class Group>
std::vector<std::vector<Var>> take_group_params(std::vector<Group>& groups) {
  std::vector<std::vector<Var>> out;
  for (Group& g : groups) out.push_back(std::move(g.params));
  return out;
}
template <class Group>
std::vector<float> group_lrs(const std::vector<Group>& groups) {
  std::vector<float> out;
  for (const Group& g : groups) out.push_back(g.options.lr);
  return out;
}

class Optimizer {
 public:
  explicit Optimizer(std::vector<Var> params, float lr);
  // Groups: group_lrs[g] is group g's LR when the schedule gives `lr`.
  Optimizer(std::vector<std::vector<Var>> groups, const std::vector<float>& group_lrs, float lr);
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  void step(const Tensor& inv_scale, const Tensor& clip_coef, const Tensor& found_inf);
  void step();  // no scaling, no clipping
  void zero_grad(bool set_to_none = true);

  const std::vector<Var>& params() const { return params_; }  // all groups', in group order
  size_t group_count() const { return group_begin_.size() - 1; }
  // Group g holds params()[group_begin(g), group_begin(g + 1)).
  size_t group_begin(size_t g) const { return group_begin_[g]; }
  // Group g's LR as a multiple of the schedule's (exactly 1 for a group at the optimizer's lr).
  double group_lr_ratio(size_t g) const { return group_lr_[g].ratio; }
  // The gradients the next step will read (parameters without a gradient are skipped).
  std::vector<const Tensor*> grads() const;
  std::vector<Tensor*> mutable_grads();
  Device device() const { return device_; }

  // The LR as a function of the applied-step count (uploaded once as a table).
  void set_schedule(const LrSchedule& schedule);
  void set_lr(float lr) { set_schedule(LrSchedule::constant(lr)); }
  const LrSchedule& schedule() const { return schedule_; }
  // The LR the last step() used or would have used (a device scalar, for the log).
  const Tensor& lr_tensor() const { return lr_now_; }
  const Tensor& lr_tensor(size_t group) const { return lr_of_group(group); }

  // Applied steps only. step_count() reads the device count (a host read: for checkpoints
  // and tests, never inside a step).
  int64_t step_count() const;
  void set_step_count(int64_t n);
  const Tensor& applied_steps_tensor() const { return applied_steps_; }

  // Named FP32 state tensors (moments, momentum buffers), for checkpoints: the owned
  // parameters' only when the state is sharded.
  virtual std::vector<std::pair<std::string, Tensor*>> state_tensors() = 0;
  // The names of parameter i's state tensors (each shaped as the parameter), owned or not:
  // what a sharded checkpoint gathers from the owners.
  virtual std::vector<std::string> state_names(size_t i) const = 0;

  // Sharded state (ZeRO stage 1, `--shard-optimizer`): owned[i] says whether this rank
  // keeps and updates parameter i; the others' state is released and their update skipped
  // (the owner's result arrives by the communicator's all-gather). Empty: every parameter.
  // Refused by an optimizer that cannot shard its state.
  virtual void set_owned(const std::vector<bool>& owned);
  bool owns(size_t i) const { return owned_.empty() || owned_[i]; }
  bool sharded() const { return !owned_.empty(); }
  virtual std::string name() const = 0;

 protected:
  // One update pass over group g with the step's device scalars (lr: the group's).
  virtual void apply(size_t group, const StepScalars& scalars) = 0;
  // The working copy to refresh with the master, or null when they share storage (FP32).
  static Tensor* working_copy_of(const Var& p);

  std::vector<Var> params_;
  std::vector<bool> owned_;  // empty: not sharded
  Device device_;
  LrSchedule schedule_;
  Tensor lr_table_;       // FP32 [n]: lr_at(k) for k < n; the last entry holds from there on
  Tensor lr_now_;         // FP32 [1]
  Tensor applied_steps_;  // FP32 [1]: exact up to 2^24 steps

 private:
  struct GroupLr {
    double ratio = 1.0;  // group lr / optimizer lr
    Tensor table, now;   // defined only when ratio != 1 (else the optimizer's are read)
  };
  void init(float lr);
  const Tensor& lr_of_group(size_t g) const { return group_lr_[g].now.defined() ? group_lr_[g].now : lr_now_; }

  std::vector<size_t> group_begin_;  // group_count() + 1 offsets into params_
  std::vector<GroupLr> group_lr_;
};

}  // namespace belay

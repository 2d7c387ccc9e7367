#include "optim/optimizer.h"

#include <algorithm>

#include "engine/backend.h"
#include "engine/error.h"

namespace belay {

namespace {
// FP32 holds every integer up to 2^24 exactly: the device count and the table index.
constexpr int64_t kMaxCount = int64_t{1} << 24;
}  // namespace

Optimizer::Optimizer(std::vector<Var> params, float lr) : params_(std::move(params)) {
  group_begin_ = {0, params_.size()};
  group_lr_.resize(1);
  init(lr);
}

Optimizer::Optimizer(std::vector<std::vector<Var>> groups, const std::vector<float>& group_lrs, float lr) {
  if (groups.size() != group_lrs.size()) throw Error("optimizer: one lr per parameter group is needed");
  LrSchedule::check_lr("optimizer", lr);
  group_begin_ = {0};
  for (size_t g = 0; g < groups.size(); ++g) {
    if (groups[g].empty()) throw UsageError("optimizer: parameter group " + std::to_string(g) + " has no parameters");
    LrSchedule::check_lr("optimizer: a parameter group", group_lrs[g]);
    GroupLr glr;
    if (group_lrs[g] != lr) {
      // The schedule scales every group alike (lr_at(k) * ratio), so the ratio must exist.
      if (lr == 0.0f)
        throw UsageError("optimizer: parameter group " + std::to_string(g) + " has lr " + std::to_string(group_lrs[g]) +
                         " but the optimizer's lr is 0; a group's lr follows the schedule as a multiple of the "
                         "optimizer's lr, so give the optimizer an lr > 0");
      glr.ratio = static_cast<double>(group_lrs[g]) / static_cast<double>(lr);
    }
    group_lr_.push_back(glr);
    for (Var& p : groups[g]) params_.push_back(std::move(p));
    group_begin_.push_back(params_.size());
  }
  init(lr);
}

// The checks and device scalars both constructors share.
void Optimizer::init(float lr) {
  if (params_.empty()) throw Error("optimizer: no parameters given");
  device_ = params_[0].device();
  for (const Var& p : params_) {
    if (!p.is_parameter()) throw Error("optimizer: '" + p.name() + "' is not a parameter (no FP32 master)");
    if (p.device() != device_) throw Error("optimizer: parameters live on different devices");
  }
  // A parameter listed twice would be updated twice a step (and its state kept twice).
  for (size_t i = 0; i < params_.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      if (params_[i].node() == params_[j].node())
        throw UsageError("optimizer: parameter '" + params_[i].name() + "' is listed twice (at " + std::to_string(j) +
                         " and " + std::to_string(i) + "); give each parameter once");
  lr_now_ = Tensor::scalar(lr, DType::F32, device_);
  applied_steps_ = Tensor::scalar(0.0f, DType::F32, device_);
  for (GroupLr& g : group_lr_)
    if (g.ratio != 1.0) g.now = Tensor::scalar(static_cast<float>(lr * g.ratio), DType::F32, device_);
  set_lr(lr);
}

void Optimizer::set_schedule(const LrSchedule& schedule) {
  // Every way an LR reaches an optimizer (constructor, set_lr, set_schedule, SafeStep's
  // schedule) passes here: a struct filled by hand is held to the factories' check too.
  schedule.check();
  // Constant: one entry. Warmup + cosine: every step up to the later of the warmup's end and
  // the cosine's end, after which lr_at is the floor for good (held by the lookup's clamp).
  const int64_t n = schedule.kind == LrSchedule::Kind::Constant
                        ? 1
                        : std::max({schedule.total_steps, schedule.warmup_steps, int64_t{0}}) + 1;
  if (n > kMaxCount)
    throw UsageError("LR schedule spans " + std::to_string(n) + " steps; at most 2^24 (16777216) are supported");
  std::vector<float> table(static_cast<size_t>(n));
  for (int64_t k = 0; k < n; ++k) table[static_cast<size_t>(k)] = schedule.lr_at(k);
  // Each group's table first: a group LR that is not a finite number >= 0 leaves all as they were.
  std::vector<Tensor> group_tables(group_lr_.size());
  for (size_t g = 0; g < group_lr_.size(); ++g) {
    if (group_lr_[g].ratio == 1.0) continue;
    std::vector<float> scaled(table.size());
    for (size_t k = 0; k < table.size(); ++k) {
      scaled[k] = static_cast<float>(static_cast<double>(table[k]) * group_lr_[g].ratio);
      LrSchedule::check_lr("optimizer: a parameter group's scaled schedule", scaled[k]);
    }
    group_tables[g] = Tensor::from_vector(scaled, Shape{n}, DType::F32, device_);
  }
  lr_table_ = Tensor::from_vector(table, Shape{n}, DType::F32, device_);
  for (size_t g = 0; g < group_lr_.size(); ++g)
    if (group_tables[g].defined()) group_lr_[g].table = group_tables[g];
  schedule_ = schedule;
}

int64_t Optimizer::step_count() const { return static_cast<int64_t>(applied_steps_.item()); }

void Optimizer::set_step_count(int64_t n) {
  if (n < 0 || n >= kMaxCount) throw Error("optimizer: step count " + std::to_string(n) + " out of range [0, 2^24)");
  applied_steps_.fill(static_cast<float>(n));
}

void Optimizer::step(const Tensor& inv_scale, const Tensor& clip_coef, const Tensor& found_inf) {
  const Backend& be = backend_for(device_);
  be.lookup(lr_table_, applied_steps_, lr_now_);
  for (GroupLr& g : group_lr_)
    if (g.table.defined()) be.lookup(g.table, applied_steps_, g.now);
  StepScalars s;
  s.inv_scale = &inv_scale;
  s.clip_coef = &clip_coef;
  s.found_inf = &found_inf;
  s.applied_steps = &applied_steps_;
  for (size_t g = 0; g < group_count(); ++g) {
    s.lr = &lr_of_group(g);
    apply(g, s);
  }
  // After the update pass (which read the count as t - 1): a kernel, no host read.
  be.count_applied(applied_steps_, found_inf);
}

void Optimizer::step() {
  const Tensor one = Tensor::scalar(1.0f, DType::F32, device_);
  const Tensor zero = Tensor::scalar(0.0f, DType::F32, device_);
  step(one, one, zero);
}

void Optimizer::set_owned(const std::vector<bool>&) {
  throw UsageError("optimizer " + name() + " cannot shard its state (--shard-optimizer needs adamw)");
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

#include "amp/safe_step.h"

#include <cmath>
#include <optional>

#include "amp/clip.h"
#include "engine/error.h"

namespace belay {

namespace {
// The order of the values a step sends to the host for its log row.
// Clipping by value sends two more: the norm after clamping and the raw . clamped product.
enum RowValue { kLoss, kNonfiniteLoss, kFoundInf, kNorm, kClipCoef, kLr, kScale, kRowValues, kPostNorm = kRowValues, kDot,
                kValueClipRowValues };
}  // namespace

PendingStep::PendingStep(int64_t step, std::unique_ptr<HostReadback> values, bool value_clip, PendingCensus census)
    : step_(step), values_(std::move(values)), value_clip_(value_clip), census_(std::move(census)) {}

namespace {
// The census record as the host reads it, in backward order (the reverse of the parameters'
// order: the order in which backward reaches the weights, so the first named tensor of an
// overflow is the first one the overflow reached). The words come back with the row: on a
// GPU this copy waits for the step's guard, which the row's values have already waited for.
std::vector<TensorCensus> read_census(const Tensor& census, const CensusNames& names) {
  const Tensor host = census.device().is_cpu() ? census : census.to(Device::cpu());
  const uint32_t* w = host.data_as<const uint32_t>();
  std::vector<TensorCensus> out =
      decode_census(std::vector<uint32_t>(w, w + host.numel()), names.names, names.numels);
  return std::vector<TensorCensus>(out.rbegin(), out.rend());
}

// With FP16/BF16 gradient buffers the guard sees values already rounded: what the rounding
// flushed to zero is known only from the casts into the buffers, so that count replaces the
// guard's (which is 0 there by construction).
void merge_grad_buffer_roundings(std::vector<TensorCensus>& census, const std::vector<TensorCensus>& roundings) {
  for (const TensorCensus& r : roundings)
    for (TensorCensus& c : census)
      if (c.name == r.name) c.underflow = r.underflow;
}
}  // namespace

StepRow PendingStep::row() {
  const std::vector<float>& v = values_->wait();
  if (v.size() != (value_clip_ ? kValueClipRowValues : kRowValues)) throw Error("PendingStep: the device sent " + std::to_string(v.size()) + " values");
  StepRow row;
  row.step = step_;
  row.lr = v[kLr];
  row.loss = v[kLoss];
  row.skipped = v[kFoundInf] != 0.0f;
  row.skip_reason = v[kNonfiniteLoss] != 0.0f ? "nonfinite_loss" : (row.skipped ? "nonfinite_grad" : "");
  row.grad_l2_pre_clip = v[kNorm];  // as measured: inf or NaN on an overflow
  row.grad_l2_post_clip = row.skipped ? 0.0f : v[kNorm] * v[kClipCoef];
  row.scaler_scale = v[kScale];
  if (value_clip_ && !row.skipped) {
    row.grad_l2_post_clip = v[kPostNorm];
    // cos(raw, applied); a zero gradient has no direction to change.
    const double denom = static_cast<double>(v[kNorm]) * static_cast<double>(v[kPostNorm]);
    row.clip_cosine = denom > 0.0 ? static_cast<float>(std::fmin(1.0, std::fmax(-1.0, v[kDot] / denom))) : 1.0f;
  }
  if (census_.guard.defined()) {
    row.census = read_census(census_.guard, *census_.names);
    merge_grad_buffer_roundings(row.census, census_.grad_buffers.decode());
    row.cast_census = census_.forward.decode();
  }
  return row;
}

SafeStep::SafeStep(Optimizer& opt, GradScaler& scaler, LrSchedule schedule, SafeStepOptions options,
                   Communicator* comm)
    : opt_(opt), scaler_(scaler), options_(options), comm_(comm ? comm : &local_comm_),
      cast_census_(options.census_casts) {
  if (options_.accum_steps < 1) throw UsageError("accum_steps must be >= 1");
  if (std::isnan(options_.max_norm) || options_.max_norm <= 0.0f)
    throw UsageError("max_norm must be > 0 (inf: no clipping)");
  // The unfused path clips in place before its norm could be agreed across ranks.
  if (comm_->world_size() > 1 && !options_.fused)
    throw UsageError("the unfused step (--unfused) is single-process only for now; drop it with --dist");
  if (comm_->world_size() > 1 && options_.clip_mode == ClipMode::Value)
    throw UsageError("clipping by value (--clip-mode value) is single-process only for now; drop it with --dist");
  // Sharded state: the fused guard's per-tensor sums are what the ranks combine.
  if (comm_->sharded() && (!options_.fused || options_.clip_mode == ClipMode::Value || options_.census))
    throw UsageError("--shard-optimizer needs the fused step clipping by norm: drop --unfused, --clip-mode value and "
                     "--census");
  if (comm_->sharded() && !opt_.sharded() && comm_->world_size() > 1)
    throw Error("SafeStep: the communicator is sharded but the optimizer is not (Optimizer::set_owned)");
  if (options_.census && (!options_.fused || options_.clip_mode == ClipMode::Value))
    throw UsageError("the census is taken by the fused guard: drop --unfused and --clip-mode value, or --census");
  if (options_.census && options_.census_format != DType::F16 && options_.census_format != DType::BF16)
    throw UsageError("the census counts against fp16 or bf16");
  if (options_.census_casts && !options_.census) throw UsageError("the census of the casts (--census-casts) needs --census");
  opt_.set_schedule(schedule);
}

PendingStep SafeStep::enqueue(const std::function<Var(int)>& loss_fn) {
  // A loss function (or after_backward) that runs a step of its own would merge two steps
  // into one row and zero the outer step's gradients: refused, and the outer step is then
  // abandoned like any step whose loss function throws.
  if (running_)
    throw UsageError("SafeStep: run() called again while a step of the same SafeStep is running (from its loss "
                     "function or after_backward hook); run one step at a time, outside the loss function");
  running_ = true;
  struct Running {
    bool& flag;
    ~Running() { flag = false; }
  } running{running_};
  const int64_t step = step_;
  const Backend& be = backend_for(opt_.device());
  const Tensor loss_mean = forward_backward(loss_fn, step);
  ++step_;

  const StepMeasures m = measure_and_clip();
  const Tensor found_inf = scaler_.found_inf_tensor(opt_);
  const Tensor nonfinite_loss = scaler_.nonfinite_loss_tensor(opt_);
  scaler_.step(opt_);  // a no-op under found_inf, decided on the device
  // Sharded: each rank updated what it owns; every rank gets every updated parameter.
  if (comm_->sharded()) comm_->all_gather_params(opt_.params());
  const bool by_value = options_.clip_mode == ClipMode::Value;
  if (options_.unscale_grads && options_.fused && !by_value) leave_grads_unscaled(m.clip_coef);
  scaler_.update();

  std::vector<const Tensor*> values{&loss_mean, &nonfinite_loss, &found_inf, &m.norm,
                                    &m.clip_coef, &opt_.lr_tensor(), &scaler_.scale_tensor()};
  if (by_value) {
    values.push_back(&m.value_clip.post_norm);
    values.push_back(&m.value_clip.dot);
  }
  return PendingStep(step, be.read_async(values), by_value, take_census(m.census));
}

// Forward and backward, micro-batch by micro-batch; returns the mean loss (on the device). Each
// loss is checked on the device (a non-finite one marks the step as an overflow) and averaged
// there for the log. d(objective)/d(loss) = scale / accum_steps, from the scale in device
// memory. A loss function may throw (a Python one, a shape error): then the step never
// happened. Nothing of the optimizer or the scale has been written yet; the gradients, the
// scaler's loss checks and the casts' census are dropped, and the step index does not advance.
Tensor SafeStep::forward_backward(const std::function<Var(int)>& loss_fn, int64_t step) {
  const Device device = opt_.device();
  const Backend& be = backend_for(device);
  opt_.zero_grad(true);
  const float per_micro_batch = 1.0f / static_cast<float>(options_.accum_steps);
  // With N ranks each backward is also divided by N and the all-reduce sums: every micro-batch's
  // backward then computes the same numbers as in one process accumulating accum x N of them,
  // so an FP16 gradient overflows at the same loss scale whatever the world size (dividing
  // after the sum would make each rank's gradients N times larger on the way).
  const float backward_factor = per_micro_batch / static_cast<float>(comm_->world_size());
  Tensor loss_mean = Tensor::zeros(Shape{1}, DType::F32, device);
  // The census counts the step's casts (autograd/cast_census.h) from here to the guard.
  std::optional<CastCensusScope> cast_scope;
  if (options_.census) {
    if (options_.census_casts) cast_census_.census_weights(opt_.params());
    cast_scope.emplace(&cast_census_);
  }
  try {
    for (int k = 0; k < options_.accum_steps; ++k) {
      Var loss = loss_fn(k);
      scaler_.check_loss(opt_, loss.value());
      be.accumulate(loss_mean, loss.value(), per_micro_batch, nullptr);
      // The gradient sync belongs to the last micro-batch alone (DDP's no_sync on the others):
      // its buckets start from backward's hook as their gradients become final.
      const bool last = k == options_.accum_steps - 1;
      if (last) comm_->begin_gradient_sync(opt_.params());
      if (last && comm_->hooks_backward())
        loss.backward(scaler_.loss_seed_tensor(), backward_factor, [this](Node& leaf) { comm_->leaf_done(leaf); });
      else
        loss.backward(scaler_.loss_seed_tensor(), backward_factor);
    }
    comm_->finish_gradient_sync();  // once per effective step: every gradient holds the sum
    if (comm_->world_size() > 1) comm_->average_loss(loss_mean);  // the log's loss: the whole batch's
    if (after_backward) after_backward(step, opt_);
  } catch (...) {
    opt_.zero_grad(true);
    scaler_.discard(opt_);
    take_census({});  // the abandoned step's counts go with it
    throw;
  }
  return loss_mean;
}

// The norm, the clip coefficient (and the census) of the step's gradients, by the path the
// options name: clamping by value (after an in-place unscale, PyTorch's order), the fused
// guard, or the unfused unscale then clip.
SafeStep::StepMeasures SafeStep::measure_and_clip() {
  StepMeasures m;
  if (options_.clip_mode == ClipMode::Value) {
    scaler_.unscale_(opt_);
    m.value_clip = clip_grad_value_on_device(opt_.mutable_grads(), options_.max_norm);
    m.norm = m.value_clip.norm;
    // The step applies the clamped gradients as they are.
    m.clip_coef = Tensor::full(Shape{1}, 1.0f, DType::F32, opt_.device());
  } else if (options_.fused) {
    const GuardResult g = scaler_.guard(opt_, options_.max_norm, comm_,
                                        options_.census ? std::optional<DType>(options_.census_format) : std::nullopt);
    m.norm = g.norm;
    m.clip_coef = g.clip_coef;
    m.census = g.census;
  } else {
    scaler_.unscale_(opt_);
    const DeviceClip c = clip_grad_norm_on_device(opt_.mutable_grads(), options_.max_norm);
    m.norm = c.norm;
    m.clip_coef = c.clip_coef;
  }
  return m;
}

// The unfused step's passes, with this step's scale (update() has not changed it yet) and clip
// coefficient: the fused step's gradients then hold the same numbers as after unscale_ and
// clip_grad_norm_ in place.
void SafeStep::leave_grads_unscaled(const Tensor& clip_coef) {
  const Device device = opt_.device();
  const Backend& be = backend_for(device);
  const Tensor one = Tensor::full(Shape{1}, 1.0f, DType::F32, device);
  Tensor inv_scale = Tensor::empty(Shape{1}, DType::F32, device), ignored = Tensor::zeros(Shape{1}, DType::F32, device);
  if (scaler_.enabled()) be.binary(BinaryOp::Div, one, scaler_.scale_tensor(), inv_scale);
  else inv_scale.fill(1.0f);
  be.unscale_inplace(opt_.mutable_grads(), inv_scale, ignored);
  if (!std::isinf(options_.max_norm)) be.scale_inplace(opt_.mutable_grads(), clip_coef);
}

PendingCensus SafeStep::take_census(const Tensor& guard_census) {
  PendingCensus out;
  out.forward = cast_census_.take(CastSite::Forward);
  out.grad_buffers = cast_census_.take(CastSite::GradBuffer);
  if (!guard_census.defined()) return out;
  if (!census_names_ || static_cast<int64_t>(census_names_->names.size()) != guard_census.dim(0)) {
    auto names = std::make_shared<CensusNames>();
    for (const Var& p : opt_.params())
      if (p.grad().defined()) {
        names->names.push_back(p.name());
        names->numels.push_back(p.grad().numel());
      }
    census_names_ = names;
  }
  out.guard = guard_census;
  out.names = census_names_;
  return out;
}

}  // namespace belay

#include "amp/grad_scaler.h"

#include <cmath>

#include "engine/census.h"
#include "engine/error.h"

namespace belay {

bool default_scaler_enabled(DType compute_dtype) { return compute_dtype == DType::F16; }

GradScaler::GradScaler(Device device, GradScalerOptions options) : device_(device), options_(options) {
  const auto& o = options_;
  if (!(o.init_scale > 0.0f) || !std::isfinite(o.init_scale))
    throw UsageError("scaler: init scale must be a positive finite number");
  if (!(o.growth_factor > 1.0f)) throw UsageError("scaler: growth factor must be > 1");
  if (!(o.backoff_factor > 0.0f && o.backoff_factor < 1.0f)) throw UsageError("scaler: backoff factor must be in (0, 1)");
  if (o.growth_interval < 1) throw UsageError("scaler: growth interval must be >= 1");
  if (o.hysteresis < 1) throw UsageError("scaler: hysteresis must be >= 1");
  if (!(o.min_scale > 0.0f) || !(o.max_scale >= o.min_scale))
    throw UsageError("scaler: need 0 < min scale <= max scale");
  const float start = options_.enabled ? std::fmin(std::fmax(o.init_scale, o.min_scale), o.max_scale) : 1.0f;
  scale_ = Tensor::scalar(start, DType::F32, device);
  growth_tracker_ = Tensor::scalar(0.0f, DType::F32, device);
  hysteresis_left_ = Tensor::scalar(static_cast<float>(o.hysteresis), DType::F32, device);
  one_ = Tensor::scalar(1.0f, DType::F32, device);
}

float GradScaler::scale() const { return scale_.item(); }
float GradScaler::loss_seed() const { return options_.enabled ? scale() : 1.0f; }

Tensor GradScaler::inv_scale() const {
  // 1/scale, on the device. Scales are powers of two in practice, so this is exact.
  // Computed on the scale's device: no host read, so a CUDA step does not wait here.
  Tensor inv = Tensor::empty(Shape{1}, DType::F32, device_);
  if (!options_.enabled) {
    inv.fill(1.0f);
    return inv;
  }
  backend_for(device_).binary(BinaryOp::Div, one_, scale_, inv);
  return inv;
}

void GradScaler::check_loss(Optimizer& opt, const Tensor& loss) {
  PerOptimizer& p = per(opt, "check_loss");
  if (p.stage != Stage::Ready)
    throw Error("GradScaler: check_loss() after the finite check; call it for every micro-batch before guard()/unscale_()");
  if (loss.numel() != 1 || loss.device() != device_)
    throw UsageError("GradScaler: the loss must be one element on " + device_.str() + " (the scaler's device), got " +
                     loss.describe());
  if (!p.nonfinite_loss.defined()) p.nonfinite_loss = Tensor::zeros(Shape{1}, DType::F32, device_);
  // The guard kernel on the one element: found = 1 when it is inf or NaN.
  Tensor found = Tensor::empty(Shape{1}, DType::F32, device_), norm = Tensor::empty(Shape{1}, DType::F32, device_);
  const Backend& be = backend_for(device_);
  be.guard({&loss}, one_, found, norm);
  be.binary(BinaryOp::Add, p.nonfinite_loss, found, p.nonfinite_loss);
}

void GradScaler::discard(const Optimizer& opt) { per_optimizer_.erase(&opt); }

GradScaler::PerOptimizer& GradScaler::per(const Optimizer& opt, const char* call) {
  if (opt.device() != device_)
    throw UsageError(std::string("GradScaler (") + call + "): the optimizer is on " + opt.device().str() +
                     ", the scaler on " + device_.str() + "; create the scaler on the optimizer's device");
  return per_optimizer_[&opt];
}

void GradScaler::unscale_(Optimizer& opt) {
  PerOptimizer& p = per(opt, "unscale_");
  if (p.stage == Stage::Unscaled || p.stage == Stage::Checked)
    throw Error("GradScaler: unscale_() has already been called on this optimizer since the last update()");
  if (p.stage == Stage::Stepped) throw Error("GradScaler: unscale_() is being called after step()");
  p.found_inf = Tensor::zeros(Shape{1}, DType::F32, device_);
  const Backend& be = backend_for(device_);
  be.unscale_inplace(opt.mutable_grads(), inv_scale(), p.found_inf);
  if (p.nonfinite_loss.defined()) be.binary(BinaryOp::Add, p.found_inf, p.nonfinite_loss, p.found_inf);
  p.clip_coef = Tensor();
  p.stage = Stage::Unscaled;
}

GuardResult GradScaler::guard(Optimizer& opt, float max_norm, Communicator* comm, std::optional<DType> census_format) {
  PerOptimizer& p = per(opt, "guard");
  if (p.stage != Stage::Ready)
    throw Error("GradScaler: guard() needs scaled gradients; the finite check already ran since the last update()");
  if (std::isnan(max_norm) || max_norm <= 0.0f) throw Error("GradScaler: max_norm must be > 0 (inf only measures)");
  GuardResult r;
  r.found_inf = Tensor::empty(Shape{1}, DType::F32, device_);
  r.norm = Tensor::empty(Shape{1}, DType::F32, device_);
  r.clip_coef = Tensor::empty(Shape{1}, DType::F32, device_);
  const Backend& be = backend_for(device_);
  p.inv_scale = inv_scale();
  const std::vector<const Tensor*> grads = opt.grads();
  GuardCensus census;
  if (census_format) {
    r.census = Tensor::empty(Shape{static_cast<int64_t>(grads.size()), kCensusFields}, DType::F32, device_);
    census = {&r.census, *census_format};
  }
  if (comm && comm->sharded()) {
    guard_sharded(opt, *comm, p, r);
  } else {
    be.guard(grads, p.inv_scale, r.found_inf, r.norm, census);
    if (p.nonfinite_loss.defined()) be.binary(BinaryOp::Add, r.found_inf, p.nonfinite_loss, r.found_inf);
  }
  // Across ranks: agreed before anything acts on them (the clip coefficient, the step, the
  // scaler update). A rank with a non-finite loss alone makes every rank skip.
  if (comm && comm->world_size() > 1 && !comm->sharded()) {
    if (!p.nonfinite_loss.defined()) p.nonfinite_loss = Tensor::zeros(Shape{1}, DType::F32, device_);
    comm->agree_on_guard(r.found_inf, p.nonfinite_loss, r.norm);
  }
  be.clip_coefficient(r.norm, max_norm, r.clip_coef);
  p.found_inf = r.found_inf;
  p.clip_coef = r.clip_coef;
  p.stage = Stage::Checked;
  return r;
}

// Sharded optimizer state: each rank holds the reduced gradients of what it owns, so the
// norm comes from the guard's per-tensor sums, each from its owner, added in the guard's
// order on every rank (Communicator::agree_on_partials): the unsharded norm's bits.
void GradScaler::guard_sharded(Optimizer& opt, Communicator& comm, PerOptimizer& p, GuardResult& r) {
  if (!p.nonfinite_loss.defined()) p.nonfinite_loss = Tensor::zeros(Shape{1}, DType::F32, device_);
  std::vector<double> partials;
  backend_for(device_).guard_partials(opt.grads(), p.inv_scale, partials);
  std::vector<bool> owned;
  for (size_t i = 0; i < opt.params().size(); ++i)
    if (opt.params()[i].grad().defined()) owned.push_back(opt.owns(i));
  comm.agree_on_partials(partials, owned, r.found_inf, p.nonfinite_loss, r.norm);
}

void GradScaler::step(Optimizer& opt) {
  PerOptimizer& p = per(opt, "step");
  switch (p.stage) {
    case Stage::Ready:
      throw Error("GradScaler: step() without the finite check: call unscale_() or guard() first");
    case Stage::Stepped:
      throw Error("GradScaler: step() has already been called since the last update()");
    case Stage::Unscaled:  // gradients already unscaled (and maybe clipped) in place
      opt.step(one_, one_, p.found_inf);
      break;
    case Stage::Checked:  // fused: unscale and clip on the fly inside the optimizer pass
      opt.step(p.inv_scale, p.clip_coef, p.found_inf);
      break;
  }
  p.stage = Stage::Stepped;
}

void GradScaler::update() {
  if (per_optimizer_.empty()) throw Error("GradScaler: update() with no optimizer checked since the last update()");
  Tensor found = Tensor::zeros(Shape{1}, DType::F32, device_);
  const Backend& be = backend_for(device_);
  for (auto& [opt, p] : per_optimizer_) {
    if (p.stage != Stage::Stepped)
      throw Error("GradScaler: update() before step() for an optimizer whose gradients were checked");
    be.binary(BinaryOp::Add, found, p.found_inf, found);  // any overflow counts
  }
  if (options_.enabled) {
    be.scaler_update(options_, scale_, growth_tracker_, hysteresis_left_, found);
  }
  per_optimizer_.clear();
}

bool GradScaler::found_inf(const Optimizer& opt) const {
  auto it = per_optimizer_.find(&opt);
  return it != per_optimizer_.end() && it->second.found_inf.defined() && it->second.found_inf.item() != 0.0f;
}

const Tensor& GradScaler::found_inf_tensor(const Optimizer& opt) { return per(opt, "found_inf_tensor").found_inf; }

const Tensor& GradScaler::nonfinite_loss_tensor(const Optimizer& opt) {
  PerOptimizer& p = per(opt, "nonfinite_loss_tensor");
  if (!p.nonfinite_loss.defined()) p.nonfinite_loss = Tensor::zeros(Shape{1}, DType::F32, device_);
  return p.nonfinite_loss;
}

ScalerState GradScaler::state() const { return {scale_.item(), growth_tracker_.item(), hysteresis_left_.item()}; }

void GradScaler::load_state(const ScalerState& s) {
  if (!(s.scale > 0.0f) || !std::isfinite(s.scale)) throw Error("scaler state: scale must be positive and finite");
  scale_.fill(s.scale);
  growth_tracker_.fill(s.growth_tracker);
  hysteresis_left_.fill(s.hysteresis_left);
  per_optimizer_.clear();
}

}  // namespace belay

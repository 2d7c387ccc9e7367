// Dynamic loss scaling (FP16): the loss is multiplied by `scale` before backward so small
// gradients survive FP16; before the step gradients are unscaled; an overflow (inf/NaN)
// skips the step and backs the scale off; growth_interval clean steps grow it.
//
// The scale, the growth tracker, the hysteresis counter and found_inf are one-element
// tensors on the parameters' device, updated by the backend's scaler kernel, so a step
// needs no trip to the host. A per-optimizer state machine (ready -> unscaled or checked ->
// stepped -> ready at update) turns misuse into a clear error, as PyTorch's GradScaler does.
#pragma once
#include <map>
#include <optional>
#include <string>

#include "amp/dist/communicator.h"
#include "engine/backend.h"
#include "optim/optimizer.h"

namespace belay {

// The scaler's options: the update rule the backend applies (ScalerConfig, engine/backend.h:
// growth and backoff factors, growth interval, hysteresis, min and max scale), and whether
// scaling is on and the scale it starts from.
struct GradScalerOptions : ScalerConfig {
  bool enabled = true;  // off by default for BF16 (see default_scaler_enabled)
  float init_scale = 65536.0f;
};

// FP16 needs loss scaling; BF16 has FP32's range and does not; FP32 neither.
bool default_scaler_enabled(DType compute_dtype);

// The scaler's state as a checkpoint stores it.
struct ScalerState {
  float scale = 65536.0f;
  float growth_tracker = 0.0f;
  float hysteresis_left = 1.0f;
};

// What the fused guard found, as device scalars.
struct GuardResult {
  Tensor found_inf;  // FP32 [1]: 1 if any gradient is inf or NaN
  Tensor norm;       // FP32 [1]: global L2 norm of the unscaled gradients
  Tensor clip_coef;  // FP32 [1]: min(1, max_norm / (norm + 1e-6))
  Tensor census;     // when asked: FP32 [grads, kCensusFields] of 32-bit words (engine/census.h)
};

class GradScaler {
 public:
  GradScaler(Device device, GradScalerOptions options = {});

  bool enabled() const { return options_.enabled; }
  const GradScalerOptions& options() const { return options_; }
  const Tensor& scale_tensor() const { return scale_; }
  float scale() const;      // host read, for logs: 1 when disabled
  float loss_seed() const;  // what backward is seeded with (the scale), read on the host
  // The same as a device scalar (the scale, or 1 when disabled): SafeStep seeds backward
  // with it, so the scale is never read on the host to run a step.
  const Tensor& loss_seed_tensor() const { return options_.enabled ? scale_ : one_; }

  // Checks one micro-batch's loss on the device: a non-finite loss marks the step as an
  // overflow (found_inf of the coming check) without the host reading the loss. Call it
  // before the finite check (unscale_ or guard), once per micro-batch.
  void check_loss(Optimizer& opt, const Tensor& loss);
  // Unfused path, PyTorch's order: unscale_ (grads *= 1/scale in place, found_inf recorded).
  void unscale_(Optimizer& opt);
  // Fused path: one read of every gradient; found_inf, the norm of the unscaled gradients
  // and the clip coefficient; the gradients are not written. With a communicator, found_inf,
  // the non-finite-loss flag and the norm are agreed across ranks before the clip
  // coefficient is taken, so every rank skips, clips and scales identically.
  // census_format (F16 or BF16): the same read also takes each gradient's census, this rank's.
  GuardResult guard(Optimizer& opt, float max_norm, Communicator* comm = nullptr,
                    std::optional<DType> census_format = std::nullopt);
  // Applies the optimizer step unless found_inf; needs unscale_ or guard first.
  void step(Optimizer& opt);
  // Every step, skipped or not: back off on overflow, grow after growth_interval clean steps.
  void update();

  // found_inf of the last check of `opt` (host read, for tests and simple loops).
  bool found_inf(const Optimizer& opt) const;
  // The same and the non-finite-loss flag as device scalars (FP32 [1]; undefined before the
  // check), valid until update(): a log reads them asynchronously.
  const Tensor& found_inf_tensor(const Optimizer& opt);
  const Tensor& nonfinite_loss_tensor(const Optimizer& opt);

  // Forgets the checks of a step that was abandoned before its finite check (an exception in
  // a loss function): the next step starts from Ready with no non-finite loss counted.
  void discard(const Optimizer& opt);

  ScalerState state() const;
  void load_state(const ScalerState& state);

 private:
  enum class Stage { Ready, Unscaled, Checked, Stepped };
  struct PerOptimizer {
    Stage stage = Stage::Ready;
    Tensor found_inf;
    Tensor nonfinite_loss;  // count of non-finite micro-batch losses, folded into found_inf
    Tensor clip_coef;       // fused path
    Tensor inv_scale;       // fused path: the guard's 1/scale, which the optimizer pass reuses
  };
  PerOptimizer& per(const Optimizer& opt, const char* call);
  void guard_sharded(Optimizer& opt, Communicator& comm, PerOptimizer& p, GuardResult& r);
  Tensor inv_scale() const;

  Device device_;
  GradScalerOptions options_;
  Tensor scale_, growth_tracker_, hysteresis_left_;
  Tensor one_;
  std::map<const Optimizer*, PerOptimizer> per_optimizer_;
};

}  // namespace belay

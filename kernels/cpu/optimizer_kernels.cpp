// The CPU backend's optimizer passes and the loss scaler's update (kernels/cpu/cpu_kernels.h):
// AdamW and SGD a block at a time on the active ISA path (kernels/cpu/isa/element_blocks.cpp),
// each element read and written once; a step with found_inf set changes nothing.
#include "kernels/common/element_math.h"
#include "kernels/cpu/block_loops.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/isa/element_blocks.h"

namespace belay::cpu {

namespace {

// AdamW's numbers for one step as the block loops use them: the hyper-parameters, and the
// lr and bias corrections read from the step's device scalars.
struct AdamWStep {
  float lr, beta1, beta2, eps, bias_correction1, bias_correction2;
};

// Tensors at least this large get their FP16 working copy written with non-temporal stores.
constexpr int64_t kStreamThreshold = 1 << 20;

// The AdamW update of one block on the active ISA path (kernels/cpu/isa/element_blocks.cpp:
// the same operations in the same order on every path, so the same bits). Returns whether it
// also wrote the working copy (FP16 on the F16C paths); else the caller does.
bool adamw_block(const float* g, float* p, float* m, float* v, void* w, DType w_dtype, int64_t len, float inv, float coef,
                 const AdamWStep& h, float wd, bool stream) {
  const AdamWBlock b{g,     p,       m,       v,      w && w_dtype == DType::F16 ? static_cast<uint16_t*>(w) : nullptr,
                     len,   inv,     coef,    h.lr,   h.beta1,
                     h.beta2, h.eps, h.bias_correction1, h.bias_correction2, wd, stream};
  return cpu_element_blocks().adamw(b);
}

// Each slot's element count, for parallel_blocks_of.
template <class Slot>
std::vector<int64_t> slot_sizes(const std::vector<Slot>& slots) {
  std::vector<int64_t> sizes;
  sizes.reserve(slots.size());
  for (const Slot& s : slots) sizes.push_back(s.master->numel());
  return sizes;
}

}  // namespace

// One pass: reads grad, master, m, v; writes master, m, v and the working copy.
// FP32 grads and an FP16/BF16 working copy: 30 bytes per element; ~15 flops, 1 sqrt, 3 div.
void adamw(const AdamWHyper& hyper, const std::vector<AdamWSlot>& slots, const StepScalars& sc) {
  if (scalar_value(*sc.found_inf) != 0.0f) return;  // a skipped step changes nothing
  const float inv = scalar_value(*sc.inv_scale), coef = scalar_value(*sc.clip_coef);
  const float applied = scalar_value(*sc.applied_steps);
  const AdamWStep h{scalar_value(*sc.lr),
                    hyper.beta1,
                    hyper.beta2,
                    hyper.eps,
                    adamw_bias_correction(hyper.beta1, applied),
                    adamw_bias_correction(hyper.beta2, applied)};
  parallel_blocks_of(slot_sizes(slots), [&](int64_t t, int64_t i0, int64_t len) {
    const AdamWSlot& s = slots[static_cast<size_t>(t)];
    float* p = s.master->data_as<float>() + i0;
    void* w = s.working ? static_cast<char*>(s.working->data()) + i0 * dtype_size(s.working->dtype()) : nullptr;
    const DType w_dtype = s.working ? s.working->dtype() : DType::F32;
    alignas(64) float bg[kBlock];
    const float* gb = load_block(s.grad->data(), s.grad->dtype(), i0, len, bg);
    const bool stream = s.master->numel() >= kStreamThreshold;
    const bool wrote_w = adamw_block(gb, p, s.m->data_as<float>() + i0, s.v->data_as<float>() + i0, w, w_dtype, len,
                                     inv, coef, h, s.weight_decay, stream);
    if (w && !wrote_w) store_block(s.working->data(), w_dtype, i0, len, p);  // the working copy, in the same pass
  });
}

void sgd(float momentum, const std::vector<SgdSlot>& slots, const StepScalars& sc) {
  if (scalar_value(*sc.found_inf) != 0.0f) return;
  const float inv = scalar_value(*sc.inv_scale), coef = scalar_value(*sc.clip_coef);
  const float lr = scalar_value(*sc.lr);
  const ElementBlocks& blocks_isa = cpu_element_blocks();
  parallel_blocks_of(slot_sizes(slots), [&](int64_t t, int64_t i0, int64_t len) {
    const SgdSlot& s = slots[static_cast<size_t>(t)];
    float* buf = s.momentum && s.momentum->defined() ? s.momentum->data_as<float>() + i0 : nullptr;
    float* p = s.master->data_as<float>() + i0;
    alignas(64) float bg[kBlock];
    const float* gb = load_block(s.grad->data(), s.grad->dtype(), i0, len, bg);
    blocks_isa.sgd(SgdBlock{gb, p, buf, len, inv, coef, lr, momentum, s.weight_decay});
    if (s.working) store_block(s.working->data(), s.working->dtype(), i0, len, p);
  });
}

void scaler_update(const ScalerConfig& c, Tensor& scale, Tensor& growth_tracker, Tensor& hysteresis_left,
                   const Tensor& found_inf) {
  scaler_transition(scalar_value(found_inf), scale.data_as<float>()[0], growth_tracker.data_as<float>()[0],
                    hysteresis_left.data_as<float>()[0], c.growth_factor, c.backoff_factor,
                    static_cast<float>(c.growth_interval), static_cast<float>(c.hysteresis), c.min_scale,
                    c.max_scale);
}

}  // namespace belay::cpu

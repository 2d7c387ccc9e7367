// The optimizer step on the GPU, fused: one pass per parameter reads grad, master, m and v
// once and writes master, m, v and the FP16/BF16 working copy once. The gradient is
// unscaled and clipped on the fly (effective_grad) and the update is the shared
// adamw_element / sgd_element, so CPU and GPU run the same formula. found_inf, inv_scale,
// clip_coef, lr and the applied-step count are read from device memory (StepScalarPtrs): a
// skipped step returns before touching anything, and the host never reads a step scalar.
// AdamW bytes per element: grad (2 or 4) + 3 x 4 read, 3 x 4 + working (2) written =
//   28-32 B; flops ~ 15 (one sqrt, one divide). SGD: grad + 4 (+4 momentum) read,
//   4 (+4) + working written; flops ~ 4.
// AdamW's bias corrections 1 - beta^t need two FP64 pows: thread 0 of each block computes
// them once from the device count into shared memory (a few hundred cycles per block of
// 16384 elements, nothing next to its memory traffic).
// scaler_update: one thread, the shared scaler_transition.
#include <cstdint>

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/simt_seam.cuh"
#include "kernels/cuda/device_access.cuh"
#include "kernels/cuda/multi_tensor.cuh"

namespace belay {
namespace {

using cuda::aligned16;
using cuda::kBlock;
using cuda::kChunk;
using cuda::load8_f32;
using cuda::load_f32;
using cuda::store8_f32;
using cuda::store_f32;
using OptimBatch = cuda::MultiTensorBatch<OptimRef>;

__device__ __forceinline__ bool all_aligned(const OptimRef& s) {
  return aligned16(s.master) && aligned16(s.grad) && (!s.m || aligned16(s.m)) && (!s.v || aligned16(s.v)) &&
         (!s.working || aligned16(s.working));
}

__device__ __forceinline__ void load8(const float* p, int64_t i, float out[8]) { load8_f32(p, DType::F32, i, out); }
__device__ __forceinline__ void store8(float* p, int64_t i, const float in[8]) { store8_f32(p, DType::F32, i, in); }

__global__ void __launch_bounds__(kBlock) adamw_kernel(const __grid_constant__ OptimBatch batch, AdamWHyper h,
                                                       StepScalarPtrs sc) {
  if (*sc.found_inf != 0.0f) return;  // a skipped step changes nothing (uniform: the whole grid returns)
  BELAY_SHARED(float, bias_correction, [2]);
  if (threadIdx.x == 0) {
    const float applied = *sc.applied_steps;
    bias_correction[0] = adamw_bias_correction(h.beta1, applied);
    bias_correction[1] = adamw_bias_correction(h.beta2, applied);
  }
  __syncthreads();
  const float bc1 = bias_correction[0], bc2 = bias_correction[1];
  const float inv = *sc.inv_scale, coef = *sc.clip_coef, lr = *sc.lr;
  const auto [s, start, end] = cuda::block_chunk(batch, blockIdx.x);

  int64_t tail = start;
  if (all_aligned(s)) {
    const int64_t vec_end = start + (end - start) / cuda::kVecSpan * cuda::kVecSpan;
    BELAY_VEC8_LOOP(i, start, vec_end) {
      float g[8], p[8], m[8], v[8];
      load8_f32(s.grad, s.grad_dtype, i, g);
      load8(s.master, i, p);
      load8(s.m, i, m);
      load8(s.v, i, v);
      BELAY_UNROLL
      for (int e = 0; e < 8; ++e)
        adamw_element(effective_grad(g[e], inv, coef), p[e], m[e], v[e], lr, h.beta1, h.beta2, h.eps,
                      s.weight_decay, bc1, bc2);
      store8(s.master, i, p);
      store8(s.m, i, m);
      store8(s.v, i, v);
      if (s.working) store8_f32(s.working, s.working_dtype, i, p);
    }
    tail = vec_end;
  }
  for (int64_t i = tail + threadIdx.x; i < end; i += blockDim.x) {
    float p = s.master[i], m = s.m[i], v = s.v[i];
    adamw_element(effective_grad(load_f32(s.grad, s.grad_dtype, i), inv, coef), p, m, v, lr, h.beta1, h.beta2,
                  h.eps, s.weight_decay, bc1, bc2);
    s.master[i] = p;
    s.m[i] = m;
    s.v[i] = v;
    if (s.working) store_f32(s.working, s.working_dtype, i, p);
  }
}

__global__ void __launch_bounds__(kBlock) sgd_kernel(const __grid_constant__ OptimBatch batch, float momentum,
                                                     StepScalarPtrs sc) {
  if (*sc.found_inf != 0.0f) return;
  const float inv = *sc.inv_scale, coef = *sc.clip_coef, lr = *sc.lr;
  const auto [s, start, end] = cuda::block_chunk(batch, blockIdx.x);
  const bool has_momentum = s.m != nullptr;
  for (int64_t i = start + threadIdx.x; i < end; i += blockDim.x) {
    float p = s.master[i];
    float buf = has_momentum ? s.m[i] : 0.0f;
    sgd_element(effective_grad(load_f32(s.grad, s.grad_dtype, i), inv, coef), p, buf, lr, momentum,
                s.weight_decay, has_momentum);
    s.master[i] = p;
    if (has_momentum) s.m[i] = buf;
    if (s.working) store_f32(s.working, s.working_dtype, i, p);
  }
}

__global__ void scaler_update_kernel(ScalerConfig c, float* scale, float* growth_tracker, float* hysteresis_left,
                                     const float* found_inf) {
  scaler_transition(*found_inf, *scale, *growth_tracker, *hysteresis_left, c.growth_factor, c.backoff_factor,
                    static_cast<float>(c.growth_interval), static_cast<float>(c.hysteresis), c.min_scale,
                    c.max_scale);
}

}  // namespace

void launch_adamw(const AdamWHyper& h, const std::vector<OptimRef>& slots, const StepScalarPtrs& s) {
  cuda::for_each_batch(slots, [&](const OptimBatch& batch, int64_t blocks) {
    cuda::launch<adamw_kernel>(static_cast<unsigned>(blocks), kBlock, 0, nullptr, batch, h, s);
  });
}

void launch_sgd(float momentum, const std::vector<OptimRef>& slots, const StepScalarPtrs& s) {
  cuda::for_each_batch(slots, [&](const OptimBatch& batch, int64_t blocks) {
    cuda::launch<sgd_kernel>(static_cast<unsigned>(blocks), kBlock, 0, nullptr, batch, momentum, s);
  });
}

void launch_scaler_update(const ScalerConfig& c, float* scale, float* growth_tracker, float* hysteresis_left,
                          const float* found_inf) {
  cuda::launch<scaler_update_kernel>(1, 1, 0, nullptr, c, scale, growth_tracker, hysteresis_left, found_inf);
}

}  // namespace belay

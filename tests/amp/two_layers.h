// A small model for the cast census's tests (tests/amp/test_cast_census.cpp, and the GPU
// tests on the emulated device): two Linear layers with a GELU between them, FP16/BF16 working
// copies and gradients of a chosen dtype, trained by a SafeStep with or without the census.
#pragma once
#include <string>
#include <vector>

#include "amp/autocast.h"
#include "amp/safe_step.h"
#include "autograd/modules.h"
#include "autograd/ops.h"
#include "optim/adamw.h"
#include "tests/tolerance.h"

namespace belay::test {

// Two Linear layers with a GELU between them, FP16/BF16 working copies, trained by a SafeStep.
struct TwoLayers {
  Device device;
  Rng rng{7};
  Linear fc1, fc2;
  std::vector<Var> params;
  AdamW opt;
  GradScaler scaler;
  SafeStep step;
  Tensor x, x_scaled, y;
  DType dtype;

  TwoLayers(DType compute, DType grad_dtype, int accum, bool census, float input_scale = 1.0f,
            float init_scale = 1024.0f, Device on = Device::cpu())
      : device(on),
        fc1{64, 128, rng, true, on, "fc1."},
        fc2{128, 8, rng, true, on, "fc2."},
        params(all_params()),
        opt(params, AdamWOptions{1e-2f, 0.9f, 0.999f, 1e-8f, 0.01f, false}),
        scaler(on, GradScalerOptions{{}, true, init_scale}),
        step(opt, scaler, LrSchedule::constant(1e-2f), options(accum, census, compute)),
        dtype(compute) {
    for (Module* m : {static_cast<Module*>(&fc1), static_cast<Module*>(&fc2)}) {
      m->set_working_dtype(compute);
      m->set_grad_dtype(grad_dtype);
    }
    Rng data(3);
    std::vector<float> xv(32 * 64), yv(32 * 8);
    for (float& v : xv) v = data.normal() * input_scale;
    for (float& v : yv) v = data.normal();
    x = Tensor::from_vector(xv, Shape{32, 64}).to(on);
    for (float& v : xv) v *= 1.37f;
    x_scaled = Tensor::from_vector(xv, Shape{32, 64}).to(on);
    y = Tensor::from_vector(yv, Shape{32, 8}).to(on);
  }
  std::vector<Var> all_params() {
    std::vector<Var> p = fc1.parameters();
    for (const Var& v : fc2.parameters()) p.push_back(v);
    return p;
  }
  static SafeStepOptions options(int accum, bool census, DType compute) {
    SafeStepOptions o{INFINITY, accum, true};
    o.census = census;
    o.census_casts = census;
    o.census_format = compute == DType::BF16 ? DType::BF16 : DType::F16;
    return o;
  }
  StepRow run() {
    return step.run([&](int k) {  // micro-batch 1 reads x * 1.37: its gradient differs from micro-batch 0's
      Autocast ac(dtype, true);
      return mse_loss(fc2(gelu(fc1(Var(k == 0 ? x : x_scaled)))), y);
    });
  }
  std::vector<uint32_t> state_bits() {
    std::vector<uint32_t> all;
    for (const Var& p : params) {
      for (uint32_t b : bits_of(p.master().to(Device::cpu()))) all.push_back(b);
      for (uint32_t b : bits_of(p.value().to(DType::F32).to(Device::cpu()))) all.push_back(b);
    }
    for (auto& [name, t] : opt.state_tensors())
      for (uint32_t b : bits_of(t->to(Device::cpu()))) all.push_back(b);
    return all;
  }
};

}  // namespace belay::test

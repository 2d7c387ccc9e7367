// The CUDA AMP kernels: the fused guard (many tensors per launch, deterministic sums,
// a single inf or NaN found wherever it sits), the clip coefficient, unscale / scale in
// place, AdamW and SGD (fused, steered by device scalars) and the scaler update, each
// against the CPU backend.
#include <cmath>
#include <limits>
#include <memory>

#include "tests/gpu/gpu_test_util.h"

using namespace belay;
using namespace belay::test;

namespace {

// A list of gradients of mixed dtypes and odd sizes, on both devices. More than 32 tensors,
// so the guard and the optimizers need more than one launch.
struct GradSet {
  std::vector<Tensor> host, device;
  std::vector<const Tensor*> host_ptrs() const {
    std::vector<const Tensor*> out;
    for (const Tensor& t : host) out.push_back(&t);
    return out;
  }
  std::vector<const Tensor*> device_ptrs() const {
    std::vector<const Tensor*> out;
    for (const Tensor& t : device) out.push_back(&t);
    return out;
  }
  std::vector<Tensor*> host_mut() {
    std::vector<Tensor*> out;
    for (Tensor& t : host) out.push_back(&t);
    return out;
  }
  std::vector<Tensor*> device_mut() {
    std::vector<Tensor*> out;
    for (Tensor& t : device) out.push_back(&t);
    return out;
  }
};

GradSet make_grads(float scale, uint64_t seed) {
  GradSet s;
  const DType dtypes[] = {DType::F32, DType::F16, DType::BF16};
  int i = 0;
  for (int rep = 0; rep < 10; ++rep)
    for (int64_t n : odd_sizes()) {
      const DType d = dtypes[i % 3];
      const std::vector<float> v = random_values(n, seed + i, -scale, scale, d);
      Pair p = make_pair(v, Shape{n}, d);
      s.host.push_back(p.host);
      s.device.push_back(p.device);
      ++i;
    }
  return s;
}

double reference_sumsq(const GradSet& s, float inv) {
  double total = 0.0;
  for (const Tensor& t : s.host)
    for (float v : t.to_vector()) {
      const double u = static_cast<double>(v * inv);  // the unscale happens in FP32
      total += u * u;
    }
  return total;
}

void require_same_bits(const Tensor& a, const Tensor& b) {
  const std::vector<float> x = a.to_vector(), y = b.to_vector();
  REQUIRE(x.size() == y.size());
  size_t differ = 0;
  for (size_t i = 0; i < x.size(); ++i)
    if (f32_bits(x[i]) != f32_bits(y[i])) ++differ;
  INFO(differ << " of " << x.size() << " elements differ in their bits");
  CHECK(differ == 0);
}

Tensor dev_scalar(float v) { return Tensor::scalar(v, DType::F32, Device::cuda()); }

}  // namespace

TEST_CASE("cuda guard: found_inf clear and the norm from an FP64 sum, bit-repeatable", "[gpu][amp]") {
  BELAY_REQUIRE_GPU();
  GradSet s = make_grads(1000.0f, 71);
  const float inv = 1.0f / 1024.0f;
  Tensor inv_t = dev_scalar(inv), found = dev_scalar(-1.0f), norm = dev_scalar(-1.0f);
  gpu().guard(s.device_ptrs(), inv_t, found, norm);
  CHECK(found.item() == 0.0f);
  // The sum and the root in FP64 (orders differ from the reference's), one rounding.
  check_close({norm.item()}, {std::sqrt(reference_sumsq(s, inv))}, tolerance_for(DType::F32, DType::F32, 2));
  Tensor norm2 = dev_scalar(-1.0f);
  gpu().guard(s.device_ptrs(), inv_t, found, norm2);
  CHECK(f32_bits(norm.item()) == f32_bits(norm2.item()));
  // The gradients are only read.
  for (size_t i = 0; i < s.host.size(); ++i) require_same_bits(s.device[i], s.host[i]);
  // No gradients at all: nothing found, norm 0.
  gpu().guard({}, inv_t, found, norm);
  CHECK(found.item() == 0.0f);
  CHECK(norm.item() == 0.0f);
  // Finite values whose squares pass FP32's max: a finite norm, as on the CPU.
  Tensor huge = Tensor::full(Shape{4}, 1e30f, DType::F32, Device::cuda());
  Tensor one = dev_scalar(1.0f);
  gpu().guard({&huge}, one, found, norm);
  CHECK(found.item() == 0.0f);
  CHECK(norm.item() == Approx(2e30).epsilon(1e-6));
}

// The per-tensor sums a sharded optimizer agrees on (--shard-optimizer over NCCL): each
// tensor's sum of (g * inv)^2 in FP64 (block sums added in order: relative error ~ 2^-53 per
// block, far inside 1e-12), and the norm made from them within one FP32 rounding of the
// guard's (the same terms, grouped otherwise). A non-finite value shows in its tensor's sum
// alone; a tensor of no elements sums to 0.
TEST_CASE("cuda guard_partials: each tensor's sum of squares, the guard's norm from them", "[gpu][amp]") {
  BELAY_REQUIRE_GPU();
  GradSet s = make_grads(1000.0f, 73);
  const float inv = 1.0f / 1024.0f;
  Tensor inv_t = dev_scalar(inv), found = dev_scalar(-1.0f), norm = dev_scalar(-1.0f);
  std::vector<double> partials;
  gpu().guard_partials(s.device_ptrs(), inv_t, partials);
  REQUIRE(partials.size() == s.host.size());
  double total = 0.0;
  for (size_t t = 0; t < s.host.size(); ++t) {
    double ref = 0.0;
    for (float v : s.host[t].to_vector()) {
      const double u = static_cast<double>(v * inv);
      ref += u * u;
    }
    INFO("tensor " << t << " of " << s.host[t].numel() << " elements");
    CHECK(std::fabs(partials[t] - ref) <= 1e-12 * ref);
    total += partials[t];
  }
  gpu().guard(s.device_ptrs(), inv_t, found, norm);
  check_close({static_cast<float>(std::sqrt(total))}, {static_cast<double>(norm.item())},
              tolerance_for(DType::F32, DType::F32, 2));
  Tensor empty = Tensor::zeros(Shape{0}, DType::F32, Device::cuda());
  Tensor big = Tensor::full(Shape{70000}, 1.0f, DType::F32, Device::cuda());
  big.set_element(40000, INFINITY);
  Tensor one = dev_scalar(1.0f), small = Tensor::full(Shape{3}, 2.0f, DType::F16, Device::cuda());
  gpu().guard_partials({&small, &empty, &big, &small}, one, partials);
  REQUIRE(partials.size() == 4);
  CHECK(partials[0] == 12.0);
  CHECK(partials[1] == 0.0);
  CHECK(std::isinf(partials[2]));
  CHECK(partials[3] == 12.0);
}

TEST_CASE("cuda guard finds one inf or NaN first, in the middle or last of a large tensor", "[gpu][amp]") {
  BELAY_REQUIRE_GPU();
  // Not a multiple of the chunk, the block or the vector width. Under the emulator 100'003
  // (six whole chunks and a ragged seventh) instead of 305 chunks: the edges are the same.
  const int64_t n = gpu_or_emulated(5'000'003, 100'003);
  for (DType d : {DType::F32, DType::F16, DType::BF16})
    for (float bad : {INFINITY, -INFINITY, NAN})
      for (int64_t where : {int64_t{0}, n / 2, n - 1}) {
        Tensor big = Tensor::zeros(Shape{n}, d, Device::cuda());
        big.fill(0.5f);
        Tensor small = Tensor::full(Shape{7}, 1.0f, d, Device::cuda());
        big.set_element(where, bad);
        Tensor inv = dev_scalar(1.0f / 65536.0f), found = dev_scalar(0.0f), norm = dev_scalar(0.0f);
        gpu().guard({&small, &big, &small}, inv, found, norm);
        INFO(name_of(d) << " " << bad << " at " << where);
        CHECK(found.item() == 1.0f);
        // The unfused path finds it too, and the CPU agrees.
        Tensor found2 = dev_scalar(0.0f);
        std::vector<Tensor*> list{&big};
        gpu().unscale_inplace(list, inv, found2);
        CHECK(found2.item() == 1.0f);
      }
}

TEST_CASE("cuda clip_coefficient, unscale_inplace and scale_inplace give the CPU's bits", "[gpu][amp]") {
  BELAY_REQUIRE_GPU();
  for (float n : {0.0f, 1e-12f, 0.25f, 1.0f, 4.0f, 1e30f, INFINITY, NAN}) {
    Tensor ng = dev_scalar(n), cg = dev_scalar(0);
    Tensor nc = Tensor::scalar(n), cc = Tensor::scalar(0);
    gpu().clip_coefficient(ng, 1.0f, cg);
    cpu().clip_coefficient(nc, 1.0f, cc);
    require_same_bits(cg, cc);
  }
  GradSet s = make_grads(3.0f, 81);
  Tensor inv_g = dev_scalar(1.0f / 8.0f), inv_c = Tensor::scalar(1.0f / 8.0f);
  Tensor fg = dev_scalar(7.0f), fc = Tensor::scalar(7.0f);
  gpu().unscale_inplace(s.device_mut(), inv_g, fg);
  cpu().unscale_inplace(s.host_mut(), inv_c, fc);
  CHECK(fg.item() == 0.0f);
  CHECK(fc.item() == 0.0f);
  for (size_t i = 0; i < s.host.size(); ++i) require_same_bits(s.device[i], s.host[i]);
  Tensor kg = dev_scalar(0.3f), kc = Tensor::scalar(0.3f);
  gpu().scale_inplace(s.device_mut(), kg);
  cpu().scale_inplace(s.host_mut(), kc);
  for (size_t i = 0; i < s.host.size(); ++i) require_same_bits(s.device[i], s.host[i]);
}

namespace {

// Parameters for an optimizer test: masters, moments, grads and working copies on both
// devices, 40 slots of odd sizes and one of three 16384-element chunks and a ragged fourth
// (multi_tensor.cuh: the blocks sharing a tensor must meet exactly at chunk boundaries);
// two launches on the GPU.
struct OptimState {
  std::vector<Tensor> master[2], m[2], v[2], grad[2], working[2];
  std::vector<DType> working_dtype;
};

OptimState make_optim_state(uint64_t seed) {
  OptimState st;
  const DType grad_dtypes[] = {DType::F32, DType::F16, DType::BF16};
  const DType working_dtypes[] = {DType::F16, DType::BF16, DType::F32};  // F32: no working copy
  std::vector<int64_t> sizes;
  for (int rep = 0; rep < 10; ++rep)
    for (int64_t n : odd_sizes()) sizes.push_back(n);
  sizes.push_back(3 * 16384 + 1001);
  int i = 0;
  for (int64_t n : sizes) {
    const Shape shape{n};
    const std::vector<float> p = random_values(n, seed + 4 * i, -1.0f, 1.0f);
    const std::vector<float> g = random_values(n, seed + 4 * i + 1, -4096.0f, 4096.0f, grad_dtypes[i % 3]);
    const DType wd = working_dtypes[(i / 3) % 3];
    st.working_dtype.push_back(wd);
    for (int dev = 0; dev < 2; ++dev) {
      const Device device = dev ? Device::cuda() : Device::cpu();
      st.master[dev].push_back(Tensor::from_vector(p, shape, DType::F32, device));
      st.m[dev].push_back(Tensor::zeros(shape, DType::F32, device));
      st.v[dev].push_back(Tensor::zeros(shape, DType::F32, device));
      st.grad[dev].push_back(Tensor::from_vector(g, shape, grad_dtypes[i % 3], device));
      st.working[dev].push_back(Tensor::from_vector(p, shape, wd, device));
    }
    ++i;
  }
  return st;
}

std::vector<AdamWSlot> adamw_slots(OptimState& st, int dev) {
  std::vector<AdamWSlot> out;
  for (size_t i = 0; i < st.master[dev].size(); ++i) {
    AdamWSlot s;
    s.master = &st.master[dev][i];
    s.m = &st.m[dev][i];
    s.v = &st.v[dev][i];
    s.grad = &st.grad[dev][i];
    s.working = st.working_dtype[i] == DType::F32 ? nullptr : &st.working[dev][i];
    s.weight_decay = i % 2 ? 0.01f : 0.0f;
    out.push_back(s);
  }
  return out;
}

std::vector<SgdSlot> sgd_slots(OptimState& st, int dev, bool momentum) {
  std::vector<SgdSlot> out;
  for (size_t i = 0; i < st.master[dev].size(); ++i) {
    SgdSlot s;
    s.master = &st.master[dev][i];
    s.momentum = momentum ? &st.m[dev][i] : nullptr;
    s.grad = &st.grad[dev][i];
    s.working = st.working_dtype[i] == DType::F32 ? nullptr : &st.working[dev][i];
    s.weight_decay = i % 2 ? 0.01f : 0.0f;
    out.push_back(s);
  }
  return out;
}

// GPU against CPU for every tensor of the state. Both run the same FP32 formula; the GPU
// may fuse a multiply-add (FMA) where the CPU rounds twice, so each FP32 operation may
// differ by one rounding per step: `roundings` of them, relative to `magnitude`.
void check_state(const OptimState& st, int roundings, double update_magnitude) {
  for (size_t i = 0; i < st.master[0].size(); ++i) {
    INFO("slot " << i);
    const std::vector<double> p = as_double(st.master[0][i]);
    std::vector<double> mag(p.size());
    for (size_t j = 0; j < p.size(); ++j) mag[j] = std::fabs(p[j]) + update_magnitude;
    const Tolerance t = tolerance_for(DType::F32, DType::F32, roundings);
    check_close(st.master[1][i].to_vector(), p, {2.0 * t.rel, 2.0 * t.abs}, mag);
    if (st.working_dtype[i] != DType::F32) {
      // The working copy is the master rounded once more: allow that rounding on top.
      const Tolerance tw = tolerance_for(DType::F32, st.working_dtype[i], roundings);
      check_close(st.working[1][i].to_vector(), p, {2.0 * tw.rel, 2.0 * tw.abs}, mag);
    }
    check_close(st.m[1][i].to_vector(), as_double(st.m[0][i]), {2.0 * t.rel, 2.0 * t.abs});
    check_close(st.v[1][i].to_vector(), as_double(st.v[0][i]), {2.0 * t.rel, 2.0 * t.abs});
  }
}

}  // namespace

TEST_CASE("cuda adamw follows the CPU step by step and is a no-op under found_inf", "[gpu][amp]") {
  BELAY_REQUIRE_GPU();
  OptimState st = make_optim_state(91);
  const float inv = 1.0f / 1024.0f, coef = 0.5f, lr = 1e-2f;
  Tensor inv_c = Tensor::scalar(inv), coef_c = Tensor::scalar(coef), zero_c = Tensor::scalar(0.0f);
  Tensor inv_g = dev_scalar(inv), coef_g = dev_scalar(coef), zero_g = dev_scalar(0.0f), one_g = dev_scalar(1.0f);
  const AdamWHyper h;
  const Tensor lr_c = Tensor::scalar(lr), lr_g = dev_scalar(lr);
  // lr and the applied-step count are device scalars: the bias corrections are computed on
  // each device from the count, in FP64 (t = applied + 1).
  for (int applied = 0; applied < 3; ++applied) {
    const Tensor applied_c = Tensor::scalar(static_cast<float>(applied));
    const Tensor applied_g = dev_scalar(static_cast<float>(applied));
    cpu().adamw(h, adamw_slots(st, 0), {&inv_c, &coef_c, &zero_c, &lr_c, &applied_c});
    gpu().adamw(h, adamw_slots(st, 1), {&inv_g, &coef_g, &zero_g, &lr_g, &applied_g});
  }
  // ~12 FP32 operations per step (effective_grad 2, decay 2, m 3, v 4, update 5), 3 steps;
  // the update lr * m_hat / sqrt(v_hat) is at most ~3.2 lr per step for these betas.
  check_state(st, 3 * 16, 3 * 3.2 * lr);

  // found_inf set on the device: nothing may change, bit for bit.
  std::vector<Tensor> before;
  for (const Tensor& t : st.master[1]) before.push_back(t.clone());
  std::vector<Tensor> before_w, before_m;
  for (const Tensor& t : st.working[1]) before_w.push_back(t.clone());
  for (const Tensor& t : st.m[1]) before_m.push_back(t.clone());
  const Tensor applied_g = dev_scalar(3.0f);
  gpu().adamw(h, adamw_slots(st, 1), {&inv_g, &coef_g, &one_g, &lr_g, &applied_g});
  for (size_t i = 0; i < before.size(); ++i) {
    require_same_bits(st.master[1][i], before[i]);
    require_same_bits(st.working[1][i], before_w[i]);
    require_same_bits(st.m[1][i], before_m[i]);
  }
}

TEST_CASE("cuda sgd follows the CPU with and without momentum", "[gpu][amp]") {
  BELAY_REQUIRE_GPU();
  for (bool momentum : {false, true}) {
    OptimState st = make_optim_state(101);
    const float inv = 1.0f / 4096.0f, coef = 0.75f, lr = 1e-2f;
    Tensor inv_c = Tensor::scalar(inv), coef_c = Tensor::scalar(coef), zero_c = Tensor::scalar(0.0f);
    Tensor inv_g = dev_scalar(inv), coef_g = dev_scalar(coef), zero_g = dev_scalar(0.0f);
    const Tensor lr_c = Tensor::scalar(lr), lr_g = dev_scalar(lr);
    const Tensor applied_c = Tensor::scalar(0.0f), applied_g = dev_scalar(0.0f);  // unused by SGD
    for (int t = 0; t < 3; ++t) {
      cpu().sgd(momentum ? 0.9f : 0.0f, sgd_slots(st, 0, momentum), {&inv_c, &coef_c, &zero_c, &lr_c, &applied_c});
      gpu().sgd(momentum ? 0.9f : 0.0f, sgd_slots(st, 1, momentum), {&inv_g, &coef_g, &zero_g, &lr_g, &applied_g});
    }
    INFO("momentum " << momentum);
    // |g_eff| <= 4096 / 4096 * 0.75 < 1 (+ decay), buf <= 3 g: the update is <= 3 lr a step.
    check_state(st, 3 * 8, 3 * 3.0 * lr);
  }
}

TEST_CASE("cuda scaler_update walks the CPU's state machine bit for bit", "[gpu][amp]") {
  BELAY_REQUIRE_GPU();
  ScalerConfig c;
  c.growth_interval = 3;
  c.hysteresis = 2;
  c.max_scale = 1024.0f;
  Tensor sg = dev_scalar(256.0f), tg = dev_scalar(0.0f), hg = dev_scalar(2.0f);
  Tensor sc = Tensor::scalar(256.0f), tc = Tensor::scalar(0.0f), hc = Tensor::scalar(2.0f);
  const int pattern[] = {0, 0, 0, 1, 0, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0};
  for (int f : pattern) {
    Tensor fg = dev_scalar(static_cast<float>(f)), fc = Tensor::scalar(static_cast<float>(f));
    gpu().scaler_update(c, sg, tg, hg, fg);
    cpu().scaler_update(c, sc, tc, hc, fc);
    CHECK(sg.item() == sc.item());
    CHECK(tg.item() == tc.item());
    CHECK(hg.item() == hc.item());
  }
}

// AdamW and SGD against reference sequences written here in double from the published
// formulas (Loshchilov & Hutter; torch.optim.AdamW / torch.optim.SGD docs), the fused
// inv_scale * clip_coef path, the skipped step, FP32 eps, the working-copy refresh and the
// LR schedules.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "autograd/graph.h"
#include "engine/error.h"
#include "engine/random.h"
#include "optim/adamw.h"
#include "optim/lr_schedule.h"
#include "optim/sgd.h"
#include "tests/tolerance.h"

using namespace belay;
using belay::test::check_close;
using belay::test::tolerance_for;

namespace {

constexpr int kSteps = 6;

std::vector<float> random_values(size_t n, uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (float& x : v) x = rng.uniform(lo, hi);
  return v;
}

// A weight [2, 3] (decayed) and a bias [3] (1-D: not decayed by default).
struct TwoParams {
  Var w, b;
  TwoParams() {
    w = Var::parameter(Tensor::from_vector(random_values(6, 1), Shape{2, 3}), "w");
    b = Var::parameter(Tensor::from_vector(random_values(3, 2), Shape{3}), "b");
  }
  std::vector<Var> list() const { return {w, b}; }
};

// The gradient of step t for parameter k: a fixed sequence with changing signs and sizes.
std::vector<float> grad_at(int t, int k, size_t n) { return random_values(n, 100 + 10 * t + k, -2.0f, 2.0f); }

void set_grad(Var& p, const std::vector<float>& g, DType dtype = DType::F32) {
  p.mutable_grad() = Tensor::from_vector(g, p.shape(), dtype);
}

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  const std::vector<float> x = a.to_vector(), y = b.to_vector();
  if (x.size() != y.size()) return false;
  for (size_t i = 0; i < x.size(); ++i)
    if (bits(x[i]) != bits(y[i])) return false;
  return true;
}

// torch.optim.AdamW, in double, one element:
//   p <- p - lr wd p;  m <- b1 m + (1-b1) g;  v <- b2 v + (1-b2) g^2;
//   p <- p - lr (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps)
struct AdamRef {
  double p, m = 0, v = 0;
  double m_mag = 0;  // the same average of |g|: the size of m's terms (m itself may cancel)
  void step(double g, int t, double lr, double b1, double b2, double eps, double wd) {
    p -= lr * wd * p;
    m = b1 * m + (1 - b1) * g;
    m_mag = b1 * m_mag + (1 - b1) * std::fabs(g);
    v = b2 * v + (1 - b2) * g * g;
    const double mhat = m / (1 - std::pow(b1, t)), vhat = v / (1 - std::pow(b2, t));
    p -= lr * mhat / (std::sqrt(vhat) + eps);
  }
};

}  // namespace

TEST_CASE("AdamW follows the reference sequence: decoupled decay, bias correction, no decay on 1-D",
          "[optim][adamw]") {
  for (bool decay_1d : {false, true}) {
    INFO("decay_1d " << decay_1d);
    TwoParams ps;
    AdamWOptions o;
    o.lr = 0.01f;
    o.beta1 = 0.9f;
    o.beta2 = 0.999f;
    o.eps = 1e-8f;
    o.weight_decay = 0.1f;  // large enough that decaying the bias by mistake is seen (1e-3 p a step)
    o.decay_1d = decay_1d;
    AdamW opt(ps.list(), o);
    // The reference uses the optimizer's FP32 hyperparameters, widened exactly.
    std::vector<AdamRef> wref, bref;
    for (float x : ps.w.master().to_vector()) wref.push_back({x});
    for (float x : ps.b.master().to_vector()) bref.push_back({x});
    for (int t = 1; t <= kSteps; ++t) {
      const std::vector<float> gw = grad_at(t, 0, 6), gb = grad_at(t, 1, 3);
      set_grad(ps.w, gw);
      set_grad(ps.b, gb);
      opt.step();
      for (size_t i = 0; i < 6; ++i) wref[i].step(gw[i], t, o.lr, o.beta1, o.beta2, o.eps, o.weight_decay);
      for (size_t i = 0; i < 3; ++i) bref[i].step(gb[i], t, o.lr, o.beta1, o.beta2, o.eps, decay_1d ? o.weight_decay : 0.0);
      CHECK(opt.step_count() == t);
    }
    // Error bound: each step adds ~10 FP32 roundings on terms of size |p| + lr |update|, with
    // |update| = |m_hat| / sqrt(v_hat) <= ~3 here; over kSteps steps. Bias correction makes
    // step 1's update exactly +-lr: a missing correction errs by ~10x, a decayed bias by 6e-3 |p|.
    auto check = [&](const Var& p, const std::vector<AdamRef>& ref, const Tensor& m, const Tensor& v) {
      std::vector<double> wp, wm, wv, mag, mmag;
      for (const AdamRef& r : ref) {
        wp.push_back(r.p);
        wm.push_back(r.m);
        mmag.push_back(r.m_mag);
        wv.push_back(r.v);
        mag.push_back(std::fabs(r.p) + 3.0 * o.lr * kSteps);
      }
      check_close(p.master().to_vector(), wp, tolerance_for(DType::F32, DType::F32, 10 * kSteps), mag);
      check_close(m.to_vector(), wm, tolerance_for(DType::F32, DType::F32, 4 * kSteps), mmag);
      check_close(v.to_vector(), wv, tolerance_for(DType::F32, DType::F32, 5 * kSteps));
    };
    check(ps.w, wref, opt.exp_avg(0), opt.exp_avg_sq(0));
    check(ps.b, bref, opt.exp_avg(1), opt.exp_avg_sq(1));
  }
}

TEST_CASE("AdamW's first step moves every weight by lr against its gradient's sign", "[optim][adamw]") {
  // With bias correction m_hat = g and v_hat = g^2 at t = 1: the step is lr g / (|g| + eps).
  Var p = Var::parameter(Tensor::from_vector({1.0f, 1.0f, 1.0f}, Shape{3}), "p");
  AdamWOptions o;
  o.lr = 0.5f;
  o.weight_decay = 0.0f;
  AdamW opt({p}, o);
  set_grad(p, {1e-3f, -20.0f, 3.0f});
  opt.step();
  const std::vector<float> got = p.master().to_vector();
  check_close(got, {1.0 - 0.5 * 1e-3 / (1e-3 + 1e-8), 1.5, 1.0 - 0.5 * 3.0 / (3.0 + 1e-8)},
              tolerance_for(DType::F32, DType::F32, 10), {1.5, 1.5, 1.5});
}

TEST_CASE("SGD with momentum follows the reference sequence", "[optim][sgd]") {
  for (float wd : {0.0f, 0.05f}) {
    INFO("weight decay " << wd);
    TwoParams ps;
    SgdOptions o;
    o.lr = 0.05f;
    o.momentum = 0.9f;
    o.weight_decay = wd;
    Sgd opt(ps.list(), o);
    // torch.optim.SGD (dampening 0, not Nesterov): g <- g + wd p; buf <- mu buf + g (buf = g
    // at the first step, the same as from a zero buffer); p <- p - lr buf. Coupled decay,
    // 2-D parameters only by default.
    std::vector<double> pw, pb, bw(6, 0.0), bb(3, 0.0);
    for (float x : ps.w.master().to_vector()) pw.push_back(x);
    for (float x : ps.b.master().to_vector()) pb.push_back(x);
    for (int t = 1; t <= kSteps; ++t) {
      const std::vector<float> gw = grad_at(t, 0, 6), gb = grad_at(t, 1, 3);
      set_grad(ps.w, gw);
      set_grad(ps.b, gb);
      opt.step();
      for (size_t i = 0; i < 6; ++i) {
        const double g = gw[i] + static_cast<double>(wd) * pw[i];
        bw[i] = static_cast<double>(o.momentum) * bw[i] + g;
        pw[i] -= static_cast<double>(o.lr) * bw[i];
      }
      for (size_t i = 0; i < 3; ++i) {
        bb[i] = static_cast<double>(o.momentum) * bb[i] + gb[i];
        pb[i] -= static_cast<double>(o.lr) * bb[i];
      }
    }
    // Buffers reach at most sum 0.9^k * 2 < 12, each step ~5 roundings of terms that size.
    std::vector<double> magw, magb;
    for (double x : pw) magw.push_back(std::fabs(x) + o.lr * 12.0 * kSteps);
    for (double x : pb) magb.push_back(std::fabs(x) + o.lr * 12.0 * kSteps);
    check_close(ps.w.master().to_vector(), pw, tolerance_for(DType::F32, DType::F32, 5 * kSteps), magw);
    check_close(ps.b.master().to_vector(), pb, tolerance_for(DType::F32, DType::F32, 5 * kSteps), magb);
    auto state = opt.state_tensors();
    REQUIRE(state.size() == 2);
    CHECK(state[0].first == "optim.w.momentum_buffer");
    const std::vector<double> magbw(bw.size(), 12.0);
    check_close(state[0].second->to_vector(), bw, tolerance_for(DType::F32, DType::F32, 5 * kSteps), magbw);
  }
  // No momentum: plain p -= lr g, and no state.
  Var p = Var::parameter(Tensor::from_vector({1.0f, 2.0f}, Shape{2}), "p");
  SgdOptions o;
  o.lr = 0.25f;
  o.momentum = 0.0f;
  Sgd plain({p}, o);
  CHECK(plain.state_tensors().empty());
  set_grad(p, {2.0f, -4.0f});
  plain.step();
  CHECK(p.master().to_vector() == std::vector<float>{0.5f, 3.0f});
}

TEST_CASE("the fused inv_scale * clip_coef path equals pre-multiplied gradients, bit for bit", "[optim]") {
  const float inv = 1.0f / 3000.0f, coef = 0.37f;
  for (int which : {0, 1}) {
    INFO((which == 0 ? "adamw" : "sgd"));
    TwoParams fused, pre;
    std::unique_ptr<Optimizer> of, op;
    if (which == 0) {
      of = std::make_unique<AdamW>(fused.list());
      op = std::make_unique<AdamW>(pre.list());
    } else {
      of = std::make_unique<Sgd>(fused.list());
      op = std::make_unique<Sgd>(pre.list());
    }
    for (int t = 1; t <= 3; ++t) {
      const std::vector<float> gw = grad_at(t, 0, 6), gb = grad_at(t, 1, 3);
      std::vector<float> sw(6), sb(3), uw(6), ub(3);
      for (size_t i = 0; i < 6; ++i) {
        sw[i] = gw[i] * 3000.0f;     // the scaled gradient as stored
        uw[i] = sw[i] * inv * coef;  // unscaled, then clipped, in FP32, in that order
      }
      for (size_t i = 0; i < 3; ++i) {
        sb[i] = gb[i] * 3000.0f;
        ub[i] = sb[i] * inv * coef;
      }
      set_grad(fused.w, sw);
      set_grad(fused.b, sb);
      set_grad(pre.w, uw);
      set_grad(pre.b, ub);
      of->step(Tensor::scalar(inv), Tensor::scalar(coef), Tensor::scalar(0.0f));
      op->step();
    }
    CHECK(same_bits(fused.w.master(), pre.w.master()));
    CHECK(same_bits(fused.b.master(), pre.b.master()));
    auto sf = of->state_tensors(), sp = op->state_tensors();
    REQUIRE(sf.size() == sp.size());
    for (size_t i = 0; i < sf.size(); ++i) CHECK(same_bits(*sf[i].second, *sp[i].second));
    // And the steps did move the weights.
    CHECK_FALSE(same_bits(fused.w.master(), TwoParams().w.master()));
  }
}

TEST_CASE("a found_inf step changes nothing: masters, moments, working copy, step count", "[optim]") {
  for (int which : {0, 1}) {
    INFO((which == 0 ? "adamw" : "sgd"));
    TwoParams ps;
    ps.w.set_working_dtype(DType::F16);
    std::unique_ptr<Optimizer> opt;
    if (which == 0)
      opt = std::make_unique<AdamW>(ps.list());
    else
      opt = std::make_unique<Sgd>(ps.list());
    for (int t = 1; t <= 2; ++t) {
      set_grad(ps.w, grad_at(t, 0, 6));
      set_grad(ps.b, grad_at(t, 1, 3));
      opt->step();
    }
    REQUIRE(opt->step_count() == 2);
    const Tensor w0 = ps.w.master().clone(), b0 = ps.b.master().clone(), work0 = ps.w.value().clone();
    std::vector<Tensor> state0;
    for (auto& [name, t] : opt->state_tensors()) state0.push_back(t->clone());
    // A gradient holding inf, and found_inf set as the guard would.
    std::vector<float> g = grad_at(3, 0, 6);
    g[2] = INFINITY;
    set_grad(ps.w, g);
    set_grad(ps.b, grad_at(3, 1, 3));
    opt->step(Tensor::scalar(1.0f / 65536.0f), Tensor::scalar(1.0f), Tensor::scalar(1.0f));
    CHECK(opt->step_count() == 2);
    CHECK(same_bits(ps.w.master(), w0));
    CHECK(same_bits(ps.b.master(), b0));
    CHECK(same_bits(ps.w.value(), work0));
    auto state = opt->state_tensors();
    for (size_t i = 0; i < state.size(); ++i) CHECK(same_bits(*state[i].second, state0[i]));
    // The next clean step is step 3 (bias correction continues from the applied count).
    set_grad(ps.w, grad_at(3, 0, 6));
    opt->step();
    CHECK(opt->step_count() == 3);
    CHECK_FALSE(same_bits(ps.w.master(), w0));
  }
}

TEST_CASE("Adam's eps 1e-8 stays in FP32: in FP16 it would be 0", "[optim][adamw]") {
  // 1e-8 is below half the smallest FP16 subnormal (2^-25 = 2.98e-8): it rounds to 0 there.
  CHECK(round_to(DType::F16, 1e-8f) == 0.0f);
  CHECK(1e-8f < 0.5f * finfo(DType::F16).smallest_subnormal);
  CHECK(round_to(DType::F32, 1e-8f) == 1e-8f);
  CHECK(AdamWOptions{}.eps == 1e-8f);
  // A gradient of 1e-9: at t = 1, m_hat = g and v_hat = g^2 (1e-21, fine in FP32), so the step
  // is lr g / (|g| + eps) = lr / 11. Without eps (an FP16 eps) it would be lr; with eps inside
  // the square root, lr * 1e-9 / sqrt(1e-18 + 1e-8) = lr * 1e-5.
  Var p = Var::parameter(Tensor::from_vector({1.0f}, Shape{1}), "p");
  AdamWOptions o;
  o.lr = 0.01f;
  o.weight_decay = 0.0f;
  AdamW opt({p}, o);
  set_grad(p, {1e-9f});
  opt.step();
  CHECK(opt.exp_avg_sq(0).item() > 0.0f);
  const double lr = o.lr, g = 1e-9f, eps = 1e-8f;
  check_close(p.master().to_vector(), {1.0 - lr * g / (g + eps)}, tolerance_for(DType::F32, DType::F32, 10));
  CHECK(std::fabs(p.master().item() - (1.0f - 0.01f / 11.0f)) < 1e-6f);
}

TEST_CASE("the working copy is refreshed in the low dtype, equal to round_to(master)", "[optim]") {
  for (DType d : {DType::F16, DType::BF16})
    for (int which : {0, 1}) {
      INFO(dtype_name(d) << (which == 0 ? " adamw" : " sgd"));
      TwoParams ps;
      ps.w.set_working_dtype(d);
      ps.b.set_working_dtype(d);
      REQUIRE(ps.w.value().dtype() == d);
      REQUIRE(ps.w.value().data() != ps.w.master().data());
      std::unique_ptr<Optimizer> opt;
      if (which == 0)
        opt = std::make_unique<AdamW>(ps.list());
      else
        opt = std::make_unique<Sgd>(ps.list());
      for (int t = 1; t <= 3; ++t) {
        // Gradients in the low dtype, as a compute-dtype backward would leave them.
        set_grad(ps.w, grad_at(t, 0, 6), d);
        set_grad(ps.b, grad_at(t, 1, 3), d);
        const std::vector<float> before = ps.w.master().to_vector();
        opt->step();
        REQUIRE(ps.w.master().to_vector() != before);
        for (const Var* p : {&ps.w, &ps.b}) {
          REQUIRE(p->value().dtype() == d);
          const std::vector<float> m = p->master().to_vector(), w = p->value().to_vector();
          for (size_t i = 0; i < m.size(); ++i) CHECK(bits(w[i]) == bits(round_to(d, m[i])));
        }
      }
    }
}

TEST_CASE("parameters without a gradient are left alone, bad options are UsageErrors", "[optim]") {
  TwoParams ps;
  AdamW opt(ps.list());
  const Tensor b0 = ps.b.master().clone();
  set_grad(ps.w, grad_at(1, 0, 6));
  opt.step();
  CHECK(same_bits(ps.b.master(), b0));
  CHECK(opt.exp_avg(1).to_vector() == std::vector<float>(3, 0.0f));
  AdamWOptions bad;
  bad.eps = 0.0f;
  CHECK_THROWS_AS(AdamW(ps.list(), bad), UsageError);
  bad = {};
  bad.beta1 = 1.0f;
  CHECK_THROWS_AS(AdamW(ps.list(), bad), UsageError);
  SgdOptions sbad;
  sbad.lr = -1.0f;
  CHECK_THROWS_AS(Sgd(ps.list(), sbad), UsageError);
  CHECK_THROWS_AS(AdamW(std::vector<Var>{}), Error);
  CHECK_THROWS_WITH(AdamW({Var(Tensor::zeros(Shape{2}), true)}), Catch::Contains("not a parameter"));
}

TEST_CASE("an LR that is negative, NaN or infinite is refused everywhere, with one message", "[optim][schedule]") {
  TwoParams ps;
  const auto refused = Catch::Contains("lr must be a finite number >= 0");
  for (float lr : {-1.0f, NAN, INFINITY, -INFINITY}) {
    AdamWOptions a;
    a.lr = lr;
    CHECK_THROWS_AS(AdamW(ps.list(), a), UsageError);
    CHECK_THROWS_WITH(AdamW(ps.list(), a), refused);
    SgdOptions sg;
    sg.lr = lr;
    CHECK_THROWS_WITH(Sgd(ps.list(), sg), refused);
    CHECK_THROWS_WITH(LrSchedule::constant(lr), refused);
    CHECK_THROWS_WITH(LrSchedule::warmup_cosine(lr, 1, 10), refused);
    CHECK_THROWS_WITH(LrSchedule::warmup_cosine(0.1f, 1, 10, lr), refused);
    // set_lr and set_schedule (a struct filled by hand too) leave the optimizer as it was.
    Sgd opt(ps.list(), SgdOptions{0.5f, 0.0f, 0.0f, false});
    CHECK_THROWS_WITH(opt.set_lr(lr), refused);
    LrSchedule by_hand;
    by_hand.peak_lr = by_hand.min_lr = lr;
    CHECK_THROWS_WITH(opt.set_schedule(by_hand), refused);
    CHECK(opt.schedule().peak_lr == 0.5f);
    const Tensor w0 = ps.w.master().clone();
    set_grad(ps.w, grad_at(1, 0, 6));
    opt.step();  // descends at 0.5: w - 0.5 g
    const std::vector<float> w = ps.w.master().to_vector(), w_before = w0.to_vector(), g = ps.w.grad().to_vector();
    for (size_t i = 0; i < w.size(); ++i) CHECK(w[i] == w_before[i] - 0.5f * g[i]);
  }
  CHECK(LrSchedule::constant(0.0f).lr_at(3) == 0.0f);  // 0 is allowed: a frozen run
}

TEST_CASE("a parameter given to an optimizer twice is refused, naming it", "[optim]") {
  TwoParams ps;
  CHECK_THROWS_AS(AdamW({ps.w, ps.b, ps.w}), UsageError);
  CHECK_THROWS_WITH(Sgd({ps.w, ps.b, ps.b}), Catch::Contains("parameter 'b' is listed twice (at 1 and 2)"));
  const Var copy = ps.w;  // the same parameter through another handle
  CHECK_THROWS_WITH(AdamW({ps.w, copy}), Catch::Contains("'w' is listed twice"));
}

TEST_CASE("LR schedules: constant, and linear warmup then cosine", "[optim][schedule]") {
  const LrSchedule c = LrSchedule::constant(0.1f);
  for (int64_t t : {0, 1, 1000, 1000000}) CHECK(c.lr_at(t) == 0.1f);

  const float peak = 1e-3f, floor = 1e-5f;
  const LrSchedule s = LrSchedule::warmup_cosine(peak, 10, 110, floor);
  // Warmup: peak * (t + 1) / warmup, reaching the peak on the last warmup step.
  CHECK(s.lr_at(0) == Approx(peak / 10).epsilon(1e-6));
  CHECK(s.lr_at(4) == Approx(peak * 5 / 10).epsilon(1e-6));
  CHECK(s.lr_at(9) == Approx(peak).epsilon(1e-6));
  // Cosine over the 100 steps after warmup: peak at its start, (peak + floor) / 2 at its
  // midpoint, floor at its end and after.
  CHECK(s.lr_at(10) == Approx(peak).epsilon(1e-6));
  CHECK(s.lr_at(35) == Approx(floor + 0.5 * (peak - floor) * (1 + std::cos(M_PI / 4))).epsilon(1e-6));
  CHECK(s.lr_at(60) == Approx(0.5 * (peak + floor)).epsilon(1e-6));
  CHECK(s.lr_at(110) == Approx(floor).epsilon(1e-6));
  CHECK(s.lr_at(500) == Approx(floor).epsilon(1e-6));
  for (int64_t t = 0; t < 9; ++t) CHECK(s.lr_at(t) < s.lr_at(t + 1));
  for (int64_t t = 10; t < 110; ++t) CHECK(s.lr_at(t) >= s.lr_at(t + 1));
  // No warmup: the cosine starts at the peak.
  CHECK(LrSchedule::warmup_cosine(peak, 0, 100).lr_at(0) == Approx(peak).epsilon(1e-6));
  CHECK(LrSchedule::warmup_cosine(peak, 0, 100).lr_at(100) == 0.0f);

  CHECK(parse_schedule("constant", 0.1f, 0, 10).kind == LrSchedule::Kind::Constant);
  CHECK(parse_schedule("cosine", 0.1f, 5, 10).warmup_steps == 5);
  CHECK_THROWS_AS(parse_schedule("linear", 0.1f, 0, 10), UsageError);
  CHECK_THROWS_WITH(parse_schedule("step", 0.1f, 0, 10), Catch::Contains("unknown schedule 'step'"));
}

// Every op of the CPU backend (engine/backend.h) against an FP64 reference computed here,
// through tests/tolerance.h. The references read the inputs as stored (so the inputs are
// exact in the reference and the bound has no input-rounding term), then the bound covers
// the FP32 arithmetic (reduction length x u32) and the one rounding to the output dtype.
#include <catch2/catch.hpp>

#include <omp.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "engine/backend.h"
#include "engine/census.h"
#include "engine/error.h"
#include "engine/random.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_gemm.h"
#include "tests/kernels/batched_gemm_case.h"
#include "tests/kernels/cpu_guards.h"
#include "tests/kernels/gemm_case.h"
#include "tests/tolerance.h"

using namespace belay;
using belay::test::check_close;
using belay::test::GemmCase;
using belay::test::Tolerance;
using belay::test::tolerance_for;

namespace {

const Backend& cpu() { return cpu_backend(); }

Tensor random_tensor(const Shape& shape, DType dtype, uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  Rng rng(seed);
  std::vector<float> v(static_cast<size_t>(shape.numel()));
  for (float& x : v) x = rng.uniform(lo, hi);
  return Tensor::from_vector(v, shape, dtype);
}

std::vector<double> as_double(const Tensor& t) {
  const std::vector<float> f = t.to_vector();
  return {f.begin(), f.end()};
}

Tensor scalar(float v) { return Tensor::scalar(v); }

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

const char* name(DType d) { return dtype_name(d); }

}  // namespace

// ---------------------------------------------------------------------------------------
// GEMM

namespace {

void run_gemm_case(const GemmCase& gc, bool ta, bool tb, DType in, DType out, bool with_bias, bool beta1,
                   uint64_t seed) {
  belay::test::run_gemm_case(gc, ta, tb, in, out, with_bias, beta1, seed, [](const GemmArgs& a) { cpu().gemm(a); });
}

}  // namespace

TEST_CASE("gemm: all four transpose combinations, fp32/fp16/bf16 inputs, odd shapes", "[kernels][cpu][gemm]") {
  const GemmCase cases[] = {{1, 1, 1}, {7, 129, 1}, {129, 7, 13}, {1, 129, 7}, {7, 7, 1000}, {33, 1, 1023}};
  uint64_t seed = 100;
  for (DType in : {DType::F32, DType::F16, DType::BF16})
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (const GemmCase& gc : cases) run_gemm_case(gc, ta, tb, in, in, false, false, seed += 10);
}

TEST_CASE("gemm: fp32 or low-precision C, bias, beta = 1 accumulation", "[kernels][cpu][gemm]") {
  uint64_t seed = 5000;
  for (DType in : {DType::F32, DType::F16, DType::BF16}) {
    // Low inputs, FP32 C (weight gradients); FP32 inputs, low C.
    for (DType out : {DType::F32, DType::F16, DType::BF16}) {
      run_gemm_case({7, 129, 1000}, false, true, in, out, true, false, seed += 10);
      run_gemm_case({129, 7, 13}, true, false, in, out, true, false, seed += 10);
    }
    // beta = 1 needs an FP32 C: C += op(A) op(B) (+ bias).
    run_gemm_case({7, 129, 1000}, true, false, in, DType::F32, false, true, seed += 10);
    run_gemm_case({33, 17, 64}, false, false, in, DType::F32, true, true, seed += 10);
    run_gemm_case({1, 1, 1}, true, true, in, DType::F32, false, true, seed += 10);
  }
}

TEST_CASE("gemm: bad arguments are Errors", "[kernels][cpu][gemm]") {
  Tensor a = Tensor::zeros(Shape{2, 3}), b = Tensor::zeros(Shape{3, 4}), c = Tensor::zeros(Shape{2, 4});
  Tensor c16 = Tensor::zeros(Shape{2, 4}, DType::F16), bad_bias = Tensor::zeros(Shape{3});
  GemmArgs args;
  args.a = &a;
  args.b = &b;
  args.c = &c;
  CHECK_NOTHROW(cpu().gemm(args));
  args.trans_b = true;
  CHECK_THROWS_WITH(cpu().gemm(args), Catch::Contains("do not chain"));
  args.trans_b = false;
  args.c = &c16;
  args.beta = 1.0f;
  CHECK_THROWS_WITH(cpu().gemm(args), Catch::Contains("beta"));
  args.c = &c;
  args.beta = 0.5f;
  CHECK_THROWS_AS(cpu().gemm(args), Error);
  args.beta = 0.0f;
  args.bias = &bad_bias;
  CHECK_THROWS_WITH(cpu().gemm(args), Catch::Contains("bias"));
}

// ---------------------------------------------------------------------------------------
// Elementwise

TEST_CASE("cast and fill write each element rounded once", "[kernels][cpu]") {
  const Tensor src = random_tensor(Shape{1000}, DType::F32, 7, -70000.0f, 70000.0f);
  const std::vector<float> s = src.to_vector();
  for (DType d : {DType::F16, DType::BF16}) {
    Tensor dst = Tensor::empty(Shape{1000}, d);
    cpu().cast(src, dst);
    const std::vector<float> got = dst.to_vector();
    int bad = 0;
    for (size_t i = 0; i < s.size(); ++i) bad += bits_of(got[i]) != bits_of(round_to(d, s[i]));
    CHECK(bad == 0);
    Tensor back = Tensor::empty(Shape{10, 100}, DType::F32);  // same count, other shape: allowed
    cpu().cast(dst, back);
    CHECK(back.to_vector() == got);
  }
  Tensor wrong = Tensor::empty(Shape{999}, DType::F16);
  CHECK_THROWS_WITH(cpu().cast(src, wrong), Catch::Contains("element counts differ"));
  Tensor f = Tensor::empty(Shape{5}, DType::F16);
  cpu().fill(f, 1.001f);
  CHECK(f.to_vector() == std::vector<float>(5, 1.0009765625f));
}

// scale_cast: the loss-scaled unit gradient rounded into a BF16/FP16 gradient in one pass,
// with the bits of scale_inplace then cast (the two passes it replaces), FP32 dst included;
// a factor that overflows FP16 gives its infs as the two passes did.
TEST_CASE("scale_cast has the bits of scale_inplace then cast", "[kernels][cpu]") {
  const Tensor src = random_tensor(Shape{33001}, DType::F32, 9, -3.0f, 3.0f);  // past the parallel threshold
  for (float f : {1.0f, 65536.0f, 3.0e-5f, 1.0e5f})
    for (DType d : {DType::F16, DType::BF16, DType::F32}) {
      INFO("factor " << f << ", " << dtype_name(d));
      const Tensor factor = Tensor::full(Shape{1}, f);
      Tensor two = src.clone(), fused = Tensor::empty(src.shape(), d), plain = Tensor::empty(src.shape(), d);
      cpu().scale_inplace({&two}, factor);
      cpu().cast(two, plain);
      cpu().scale_cast(src, factor, fused);
      const std::vector<float> a = fused.to_vector(), b = plain.to_vector();
      int differ = 0;
      for (size_t i = 0; i < a.size(); ++i) differ += bits_of(a[i]) != bits_of(b[i]);
      CHECK(differ == 0);
    }
  Tensor h = Tensor::empty(Shape{33001}, DType::BF16), short_one = Tensor::empty(Shape{7}, DType::BF16);
  const Tensor two_values = Tensor::full(Shape{2}, 1.0f);
  CHECK_THROWS_WITH(cpu().scale_cast(h.to(DType::F16), Tensor::full(Shape{1}, 1.0f), h), Catch::Contains("expected fp32"));
  CHECK_THROWS_WITH(cpu().scale_cast(src, Tensor::full(Shape{1}, 1.0f), short_one), Catch::Contains("element counts differ"));
  CHECK_THROWS(cpu().scale_cast(src, two_values, h));
}

TEST_CASE("binary add/sub/mul, mixed dtypes, aliasing output", "[kernels][cpu]") {
  const int64_t n = 33000;  // above the parallel threshold
  for (DType da : {DType::F32, DType::F16, DType::BF16})
    for (DType db : {DType::F32, DType::F16}) {
      const Tensor a = random_tensor(Shape{n}, da, 11, -3.0f, 3.0f), b = random_tensor(Shape{n}, db, 12, -3.0f, 3.0f);
      const std::vector<double> x = as_double(a), y = as_double(b);
      for (DType dout : {DType::F32, DType::F16, DType::BF16})
        for (BinaryOp op : {BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul}) {
          INFO("a " << name(da) << " b " << name(db) << " out " << name(dout) << " op " << static_cast<int>(op));
          Tensor out = Tensor::empty(Shape{n}, dout);
          cpu().binary(op, a, b, out);
          std::vector<double> want(x.size());
          for (size_t i = 0; i < x.size(); ++i)
            want[i] = op == BinaryOp::Add ? x[i] + y[i] : op == BinaryOp::Sub ? x[i] - y[i] : x[i] * y[i];
          // One FP32 operation, one rounding to dout.
          check_close(out.to_vector(), want, tolerance_for(DType::F32, dout, 1));
        }
    }
  // Division, with divisors away from zero so no quotient leaves the output dtype's range.
  {
    const Tensor a = random_tensor(Shape{257}, DType::F32, 13, -3.0f, 3.0f);
    const Tensor b = random_tensor(Shape{257}, DType::BF16, 14, 0.5f, 3.0f);
    const std::vector<double> x = as_double(a), y = as_double(b);
    for (DType dout : {DType::F32, DType::F16, DType::BF16}) {
      Tensor out = Tensor::empty(Shape{257}, dout);
      cpu().binary(BinaryOp::Div, a, b, out);
      std::vector<double> want(x.size());
      for (size_t i = 0; i < x.size(); ++i) want[i] = x[i] / y[i];
      check_close(out.to_vector(), want, tolerance_for(DType::F32, dout, 1));
    }
  }
  // out aliases a.
  Tensor a = Tensor::from_vector({1, 2, 3}, Shape{3}), b = Tensor::from_vector({10, 20, 30}, Shape{3});
  cpu().binary(BinaryOp::Sub, a, b, a);
  CHECK(a.to_vector() == std::vector<float>{-9, -18, -27});
  Tensor bad = Tensor::empty(Shape{4});
  CHECK_THROWS_WITH(cpu().binary(BinaryOp::Add, a, b, bad), Catch::Contains("shape mismatch"));
}

TEST_CASE("scale, accumulate (with and without a scalar tensor), broadcast_scalar", "[kernels][cpu]") {
  const int64_t n = 5000;
  for (DType d : {DType::F32, DType::F16, DType::BF16}) {
    INFO(name(d));
    const Tensor x = random_tensor(Shape{n}, d, 21, -2.0f, 2.0f);
    const std::vector<double> xv = as_double(x);
    Tensor y = Tensor::empty(Shape{n}, d);
    cpu().scale(x, 0.3f, y);
    std::vector<double> want(xv.size());
    for (size_t i = 0; i < xv.size(); ++i) want[i] = static_cast<double>(0.3f) * xv[i];
    check_close(y.to_vector(), want, tolerance_for(DType::F32, d, 1));

    // dst (FP32 or d) += alpha * src * s[0].
    for (DType dd : {DType::F32, d}) {
      Tensor dst = random_tensor(Shape{n}, dd, 22);
      const std::vector<double> d0 = as_double(dst);
      const Tensor s = scalar(4.0f);
      cpu().accumulate(dst, x, 0.5f, &s);
      std::vector<double> w(n), mag(n);
      for (int64_t i = 0; i < n; ++i) {
        w[i] = d0[i] + 2.0 * xv[i];
        mag[i] = std::fabs(d0[i]) + std::fabs(2.0 * xv[i]);
      }
      check_close(dst.to_vector(), w, tolerance_for(DType::F32, dd, 2), mag);
      // alpha alone (no scalar tensor), negative: from the values as stored now.
      const std::vector<double> d1 = as_double(dst);
      cpu().accumulate(dst, x, -2.0f, nullptr);
      for (int64_t i = 0; i < n; ++i) {
        w[i] = d1[i] - 2.0 * xv[i];
        mag[i] = std::fabs(d1[i]) + std::fabs(2.0 * xv[i]);
      }
      check_close(dst.to_vector(), w, tolerance_for(DType::F32, dd, 2), mag);
    }
  }
  Tensor out = Tensor::empty(Shape{3, 2}, DType::BF16);
  cpu().broadcast_scalar(scalar(6.0f), 0.5f, out);
  CHECK(out.to_vector() == std::vector<float>(6, 3.0f));
  CHECK_THROWS_AS(cpu().broadcast_scalar(Tensor::zeros(Shape{2}), 1.0f, out), Error);
}

namespace {
double gelu_ref(double x) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); }
double gelu_grad_ref(double x) {
  return 0.5 * (1.0 + std::erf(x / std::sqrt(2.0))) + x * std::exp(-0.5 * x * x) / std::sqrt(2.0 * M_PI);
}
}  // namespace

TEST_CASE("relu and gelu, forward and backward", "[kernels][cpu]") {
  const int64_t n = 40000;
  for (DType d : {DType::F32, DType::F16, DType::BF16}) {
    INFO(name(d));
    const Tensor x = random_tensor(Shape{n}, d, 31, -6.0f, 6.0f);
    const Tensor dy = random_tensor(Shape{n}, d, 32, -1.0f, 1.0f);
    const std::vector<double> xv = as_double(x), gv = as_double(dy);
    Tensor y = Tensor::empty(Shape{n}, d), dx = Tensor::empty(Shape{n}, d);

    // ReLU is exact in any dtype.
    cpu().activation(Activation::Relu, x, y);
    cpu().activation_backward(Activation::Relu, x, dy, dx);
    const std::vector<float> yr = y.to_vector(), dxr = dx.to_vector();
    int bad = 0;
    for (int64_t i = 0; i < n; ++i) {
      bad += yr[i] != (xv[i] > 0 ? xv[i] : 0.0);
      bad += dxr[i] != (xv[i] > 0 ? gv[i] : 0.0);
    }
    CHECK(bad == 0);

    // GELU: 0.5 x + 0.5 x erf(x / sqrt 2), each term at most |x| in size, is ~10 FP32 roundings
    // (the 1/sqrt 2 constant, the product, erff within 2 ulps, the sum, two products): the
    // bound is 10 u32 of |x|, which also covers the cancellation in 1 + erf for x < 0.
    cpu().activation(Activation::Gelu, x, y);
    std::vector<double> want(n), mag(n);
    for (int64_t i = 0; i < n; ++i) {
      want[i] = gelu_ref(xv[i]);
      mag[i] = std::fabs(xv[i]);
    }
    check_close(y.to_vector(), want, tolerance_for(DType::F32, d, 10), mag);
    // Its derivative cdf + x pdf: ~12 roundings of terms at most (1 + |x| pdf) in size.
    cpu().activation_backward(Activation::Gelu, x, dy, dx);
    for (int64_t i = 0; i < n; ++i) {
      want[i] = gv[i] * gelu_grad_ref(xv[i]);
      mag[i] = std::fabs(gv[i]) * (1.0 + std::fabs(xv[i]) * std::exp(-0.5 * xv[i] * xv[i]) / std::sqrt(2.0 * M_PI));
    }
    check_close(dx.to_vector(), want, tolerance_for(DType::F32, d, 12), mag);
  }
  // Known values: GELU(1) = 0.8413447460685429, GELU'(0) = 0.5.
  Tensor one = Tensor::from_vector({1.0f, 0.0f}, Shape{2}), out = Tensor::empty(Shape{2});
  cpu().activation(Activation::Gelu, one, out);
  CHECK(out.to_vector()[0] == Approx(0.8413447460685429).epsilon(1e-6));
  Tensor g = Tensor::full(Shape{2}, 1.0f), d = Tensor::empty(Shape{2});
  cpu().activation_backward(Activation::Gelu, one, g, d);
  CHECK(d.to_vector()[1] == 0.5f);
  CHECK(d.to_vector()[0] == Approx(gelu_grad_ref(1.0)).epsilon(1e-6));
}

// ---------------------------------------------------------------------------------------
// Reductions and losses

TEST_CASE("sum_rows (set and accumulate) and sum", "[kernels][cpu]") {
  for (DType d : {DType::F32, DType::F16, DType::BF16}) {
    INFO(name(d));
    const int64_t rows = 129, cols = 300;
    const Tensor x = random_tensor(Shape{rows, cols}, d, 41);
    const std::vector<double> xv = as_double(x);
    std::vector<double> want(cols, 0.0), mag(cols, 0.0);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        want[c] += xv[r * cols + c];
        mag[c] += std::fabs(xv[r * cols + c]);
      }
    Tensor out = Tensor::full(Shape{cols}, NAN);
    cpu().sum_rows(x, out, false);
    check_close(out.to_vector(), want, tolerance_for(DType::F32, DType::F32, rows), mag);
    cpu().sum_rows(x, out, true);
    for (int64_t c = 0; c < cols; ++c) {
      want[c] *= 2.0;
      mag[c] *= 2.0;
    }
    check_close(out.to_vector(), want, tolerance_for(DType::F32, DType::F32, rows + 1), mag);

    const Tensor big = random_tensor(Shape{100003}, d, 42);
    const std::vector<double> bv = as_double(big);
    double s = 0.0, m = 0.0;
    for (double v : bv) {
      s += v;
      m += std::fabs(v);
    }
    Tensor total = Tensor::empty(Shape{1});
    cpu().sum(big, total);
    check_close(total.to_vector(), {s}, tolerance_for(DType::F32, DType::F32, 100003), {m});
  }
  Tensor wrong = Tensor::empty(Shape{3});
  CHECK_THROWS_WITH(cpu().sum_rows(Tensor::zeros(Shape{2, 4}), wrong, false), Catch::Contains("sum_rows"));
}

TEST_CASE("mse forward and backward", "[kernels][cpu]") {
  for (DType d : {DType::F32, DType::F16, DType::BF16}) {
    INFO(name(d));
    const int64_t n = 50000;
    const Tensor pred = random_tensor(Shape{250, 200}, d, 51, -2.0f, 2.0f);
    const Tensor target = random_tensor(Shape{250, 200}, DType::F32, 52, -2.0f, 2.0f);
    const std::vector<double> p = as_double(pred), t = as_double(target);
    double s = 0.0;
    for (int64_t i = 0; i < n; ++i) s += (p[i] - t[i]) * (p[i] - t[i]);
    Tensor loss = Tensor::empty(Shape{1});
    cpu().mse_forward(pred, target, loss);
    // All terms are non-negative: the magnitude is the result itself.
    check_close(loss.to_vector(), {s / n}, tolerance_for(DType::F32, DType::F32, n + 1));

    const float g = 3.0f;
    Tensor dpred = Tensor::empty(pred.shape(), d);
    cpu().mse_backward(pred, target, scalar(g), dpred);
    std::vector<double> want(n), mag(n);
    for (int64_t i = 0; i < n; ++i) {
      want[i] = 2.0 * g * (p[i] - t[i]) / n;
      mag[i] = std::fabs(want[i]);
    }
    // 2 g / N (two roundings), the difference, the product.
    check_close(dpred.to_vector(), want, tolerance_for(DType::F32, d, 4), mag);
  }
}

namespace {
// Reference cross-entropy in double: loss and (softmax - onehot) / B.
void ce_ref(const std::vector<double>& x, const std::vector<float>& labels, int64_t rows, int64_t classes,
            double& loss, double& loss_mag, std::vector<double>& grad, std::vector<double>& grad_mag) {
  loss = 0.0;
  loss_mag = 0.0;
  grad.assign(x.size(), 0.0);
  grad_mag.assign(x.size(), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    double mx = -INFINITY;
    for (int64_t c = 0; c < classes; ++c) mx = std::max(mx, x[r * classes + c]);
    double z = 0.0;
    for (int64_t c = 0; c < classes; ++c) z += std::exp(x[r * classes + c] - mx);
    const double lse = mx + std::log(z);
    const int64_t l = static_cast<int64_t>(labels[r]);
    loss += (lse - x[r * classes + l]) / rows;
    loss_mag += (std::fabs(lse) + std::fabs(x[r * classes + l])) / rows;
    for (int64_t c = 0; c < classes; ++c) {
      const double p = std::exp(x[r * classes + c] - lse);
      grad[r * classes + c] = (p - (c == l ? 1.0 : 0.0)) / rows;
      grad_mag[r * classes + c] = (p + (c == l ? 1.0 : 0.0)) / rows;
    }
  }
}
}  // namespace

TEST_CASE("cross_entropy: loss and fused gradient", "[kernels][cpu]") {
  for (DType d : {DType::F32, DType::F16, DType::BF16}) {
    INFO(name(d));
    const int64_t rows = 37, classes = 129;
    const Tensor logits = random_tensor(Shape{rows, classes}, d, 61, -4.0f, 4.0f);
    std::vector<float> lab(rows);
    Rng rng(62);
    for (float& l : lab) l = static_cast<float>(rng.next_u64() % classes);
    const Tensor labels = Tensor::from_vector(lab, Shape{rows});
    Tensor loss = Tensor::empty(Shape{1}), grad = Tensor::empty(Shape{rows, classes});
    cpu().cross_entropy(logits, labels, loss, grad);
    double l, lmag;
    std::vector<double> g, gmag;
    ce_ref(as_double(logits), lab, rows, classes, l, lmag, g, gmag);
    // The log-sum-exp over C classes and the mean over B rows; each gradient element is an
    // exp, a difference and a division.
    check_close(loss.to_vector(), {l}, tolerance_for(DType::F32, DType::F32, classes + rows), {lmag});
    check_close(grad.to_vector(), g, tolerance_for(DType::F32, DType::F32, classes + 4), gmag);
  }
}

TEST_CASE("cross_entropy is stable for logits of 1e4", "[kernels][cpu]") {
  // Row 0: the label holds the largest logit by 1e4: loss ~ 0. Row 1: the label is 2e4 below
  // the maximum: loss 2e4. Row 2: all equal at 1e4: loss log 3. A naive exp(1e4) is inf.
  const Tensor logits = Tensor::from_vector({1e4f, 0.0f, -1e4f, 1e4f, 0.0f, -1e4f, 1e4f, 1e4f, 1e4f}, Shape{3, 3});
  const Tensor labels = Tensor::from_vector({0, 2, 1}, Shape{3});
  Tensor loss = Tensor::empty(Shape{1}), grad = Tensor::empty(Shape{3, 3});
  cpu().cross_entropy(logits, labels, loss, grad);
  const double want = (0.0 + 2e4 + std::log(3.0)) / 3.0;
  REQUIRE(std::isfinite(loss.item()));
  CHECK(loss.item() == Approx(want).epsilon(1e-6));
  const std::vector<float> g = grad.to_vector();
  for (float v : g) CHECK(std::isfinite(v));
  // Row 0: softmax is (1, 0, 0) and the label is 0: gradient 0. Row 1: (1, 0, 0) - e2.
  CHECK(g[0] == 0.0f);
  CHECK(g[3] == Approx(1.0 / 3.0).epsilon(1e-6));
  CHECK(g[5] == Approx(-1.0 / 3.0).epsilon(1e-6));
  CHECK(g[7] == Approx((1.0 / 3.0 - 1.0) / 3.0).epsilon(1e-6));
  // Bad labels are errors, not out-of-bounds reads.
  for (float bad : {3.0f, -1.0f, 0.5f, NAN}) {
    INFO(bad);
    CHECK_THROWS_WITH(cpu().cross_entropy(logits, Tensor::from_vector({0, bad, 1}, Shape{3}), loss, grad),
                      Catch::Contains("not a class index"));
  }
  // No classes at all: refused by the shared check (both backends), before any kernel.
  Tensor none = Tensor::empty(Shape{3, 0}), none_grad = Tensor::empty(Shape{3, 0});
  CHECK_THROWS_WITH(cpu().cross_entropy(none, Tensor::from_vector({0, 0, 0}, Shape{3}), loss, none_grad),
                    Catch::Contains("no classes"));
}

// ---------------------------------------------------------------------------------------
// AMP: guard, clipping, unscaling

TEST_CASE("guard: the norm of the unscaled gradients, nothing written", "[kernels][cpu][amp]") {
  for (DType d : {DType::F32, DType::F16, DType::BF16}) {
    INFO(name(d));
    // 210000 elements: 12 reduction chunks, the first 8 through the ISA's grouped kernel.
    const Tensor g1 = random_tensor(Shape{700, 300}, d, 71, -1000.0f, 1000.0f);
    const Tensor g2 = random_tensor(Shape{77}, d, 72, -1000.0f, 1000.0f);
    const std::vector<float> before1 = g1.to_vector();
    const float inv = 1.0f / 1024.0f;
    Tensor found = scalar(NAN), norm = scalar(NAN);
    cpu().guard({&g1, &g2}, scalar(inv), found, norm);
    CHECK(found.item() == 0.0f);
    double want = 0.0;
    int64_t n = 0;
    for (const Tensor* g : {&g1, &g2})
      for (double v : as_double(*g)) {
        want += (v * inv) * (v * inv);
        ++n;
      }
    // Each term: a product rounded to FP32 (squared exactly in FP64); the sum and the root in
    // FP64; one rounding to FP32 at the end.
    check_close(norm.to_vector(), {std::sqrt(want)}, tolerance_for(DType::F32, DType::F32, 2));
    CHECK(g1.to_vector() == before1);
  }
  Tensor found = scalar(NAN), norm = scalar(NAN);
  cpu().guard({}, scalar(1.0f), found, norm);
  CHECK(found.item() == 0.0f);
  CHECK(norm.item() == 0.0f);
  // The largest finite FP16 values are not overflows.
  const Tensor big = Tensor::full(Shape{10}, 65504.0f, DType::F16);
  cpu().guard({&big}, scalar(1.0f), found, norm);
  CHECK(found.item() == 0.0f);
  CHECK(norm.item() == Approx(std::sqrt(10.0) * 65504.0).epsilon(1e-6));
  // Finite FP32 gradients whose sum of squares passes FP32's max (3.4e38) still have a
  // finite norm, so clipping scales them instead of zeroing them (coefficient 0 from an inf).
  const Tensor huge = Tensor::full(Shape{4}, 1e30f);
  cpu().guard({&huge}, scalar(1.0f), found, norm);
  CHECK(found.item() == 0.0f);
  CHECK(norm.item() == Approx(2e30).epsilon(1e-6));
  Tensor coef = scalar(NAN);
  cpu().clip_coefficient(norm, 1.0f, coef);
  CHECK(coef.item() > 0.0f);
  CHECK(coef.item() == Approx(0.5e-30).epsilon(1e-6));
}

// Many small gradients (each under one group of 8 chunks, so read in batches of chunks from
// several gradients, kernels/cpu/guard_kernels.cpp) beside a large one with a tail: each
// gradient's partial is its chunks' sequential FP64 sums added in chunk order, to the bit, at 1
// and 2 threads, with and without the census, in every dtype.
TEST_CASE("guard: batched small gradients keep each chunk's sequential sum, to the bit", "[kernels][cpu][amp]") {
  for (DType d : {DType::F32, DType::F16, DType::BF16}) {
    INFO(name(d));
    std::vector<Tensor> ts;
    const std::vector<int64_t> sizes = {128, 16384, 65536, 5, 200000, 16384, 77, 40000, 128, 1, 16384, 30000};
    for (size_t i = 0; i < sizes.size(); ++i) ts.push_back(random_tensor(Shape{sizes[i]}, d, 300 + i, -3.0f, 3.0f));
    std::vector<const Tensor*> grads;
    for (const Tensor& t : ts) grads.push_back(&t);
    const float inv = 1.0f / 8.0f;
    double total = 0.0;
    std::vector<double> want;
    for (const Tensor& t : ts) {
      const std::vector<float> v = t.to_vector();  // exact: every stored value is an FP32 value
      double grad = 0.0;
      for (size_t c0 = 0; c0 < v.size(); c0 += 16384) {
        double chunk = 0.0;
        for (size_t i = c0; i < std::min(v.size(), c0 + 16384); ++i) {
          const float u = v[i] * inv;
          chunk += (double)u * (double)u;
        }
        grad += chunk;
      }
      want.push_back(grad);
      total += grad;
    }
    for (const int threads : {1, 2}) {
      test::Threads with(threads);
      std::vector<double> got;
      cpu().guard_partials(grads, scalar(inv), got);
      REQUIRE(got.size() == want.size());
      for (size_t t = 0; t < want.size(); ++t) CHECK(got[t] == want[t]);
      Tensor found = scalar(NAN), norm = scalar(NAN);
      cpu().guard(grads, scalar(inv), found, norm);
      CHECK(norm.item() == static_cast<float>(std::sqrt(total)));
      Tensor words = Tensor::zeros(Shape{static_cast<int64_t>(grads.size()), kCensusFields}, DType::F32);
      GuardCensus census;
      census.out = &words;
      Tensor found_c = scalar(NAN), norm_c = scalar(NAN);
      cpu().guard(grads, scalar(inv), found_c, norm_c, census);
      CHECK(norm_c.item() == norm.item());
    }
  }
}

TEST_CASE("guard: found_inf for inf, -inf and NaN placed first, middle or last", "[kernels][cpu][amp]") {
  const int64_t n = 140001;  // nine reduction chunks, run in parallel: 8 grouped, 1 alone
  for (DType d : {DType::F32, DType::F16, DType::BF16}) {
    const Tensor a0 = random_tensor(Shape{n}, d, 81), b0 = random_tensor(Shape{n}, d, 82);
    for (float bad : {INFINITY, -INFINITY, NAN})
      for (int64_t where : {int64_t{0}, n / 2, n - 1})
        for (int which : {0, 1}) {
          INFO(name(d) << " value " << bad << " at " << where << " of gradient " << which);
          Tensor a = a0.clone(), b = b0.clone();
          (which == 0 ? a : b).set_element(where, bad);
          Tensor found = scalar(0.0f), norm = scalar(0.0f);
          cpu().guard({&a, &b}, scalar(0.5f), found, norm);
          CHECK(found.item() == 1.0f);
        }
  }
}

TEST_CASE("clip_coefficient: min(1, max_norm / (norm + 1e-6))", "[kernels][cpu][amp]") {
  Tensor coef = scalar(NAN);
  cpu().clip_coefficient(scalar(2.0f), 1.0f, coef);
  // Two FP32 roundings: the sum, the division.
  check_close(coef.to_vector(), {1.0 / (2.0 + 1e-6)}, tolerance_for(DType::F32, DType::F32, 2));
  CHECK(coef.item() < 0.5f);  // the 1e-6 is there
  cpu().clip_coefficient(scalar(2.0f), 10.0f, coef);
  CHECK(coef.item() == 1.0f);
  cpu().clip_coefficient(scalar(2.0f), INFINITY, coef);
  CHECK(coef.item() == 1.0f);
  cpu().clip_coefficient(scalar(0.0f), 1.0f, coef);
  CHECK(coef.item() == 1.0f);
  cpu().clip_coefficient(scalar(std::sqrt(2.0f)), 0.5f, coef);
  check_close(coef.to_vector(), {0.5 / (static_cast<double>(std::sqrt(2.0f)) + 1e-6)},
              tolerance_for(DType::F32, DType::F32, 2));
  cpu().clip_coefficient(scalar(INFINITY), 1.0f, coef);  // a non-finite norm: 0 (the step is skipped anyway)
  CHECK(coef.item() == 0.0f);
}

TEST_CASE("unscale_inplace, scale_inplace and clamp_inplace", "[kernels][cpu][amp]") {
  for (DType d : {DType::F32, DType::F16, DType::BF16}) {
    INFO(name(d));
    Tensor g1 = random_tensor(Shape{40000}, d, 91, -60000.0f, 60000.0f), g2 = random_tensor(Shape{13}, d, 92);
    const std::vector<double> v1 = as_double(g1), v2 = as_double(g2);
    Tensor found = scalar(NAN);
    const float inv = 1.0f / 3000.0f;
    cpu().unscale_inplace({&g1, &g2}, scalar(inv), found);
    CHECK(found.item() == 0.0f);
    std::vector<double> w1(v1.size()), w2(v2.size());
    for (size_t i = 0; i < v1.size(); ++i) w1[i] = v1[i] * inv;
    for (size_t i = 0; i < v2.size(); ++i) w2[i] = v2[i] * inv;
    check_close(g1.to_vector(), w1, tolerance_for(DType::F32, d, 1));
    check_close(g2.to_vector(), w2, tolerance_for(DType::F32, d, 1));

    // A power of two is exact: scale back up and get the stored values bit for bit.
    Tensor h = random_tensor(Shape{1000}, d, 93);
    const std::vector<float> hv = h.to_vector();
    cpu().scale_inplace({&h}, scalar(0.25f));
    cpu().scale_inplace({&h}, scalar(4.0f));
    CHECK(h.to_vector() == hv);

    // An inf anywhere: flagged (in the second gradient, so the flag must survive the first).
    Tensor ok = random_tensor(Shape{100}, d, 94), bad = random_tensor(Shape{100}, d, 95);
    bad.set_element(50, INFINITY);
    cpu().unscale_inplace({&ok, &bad}, scalar(0.5f), found);
    CHECK(found.item() == 1.0f);
    Tensor nan_first = random_tensor(Shape{100}, d, 96), fine = random_tensor(Shape{100}, d, 97);
    nan_first.set_element(0, NAN);
    cpu().unscale_inplace({&nan_first, &fine}, scalar(0.5f), found);
    CHECK(found.item() == 1.0f);

    Tensor c = Tensor::from_vector({-5.0f, -1.0f, 0.5f, 1.0f, 7.0f, NAN}, Shape{6}, d);
    cpu().clamp_inplace(c, -1.0f, 1.0f);
    const std::vector<float> cv = c.to_vector();
    CHECK(cv[0] == -1.0f);
    CHECK(cv[1] == -1.0f);
    CHECK(cv[2] == 0.5f);
    CHECK(cv[3] == 1.0f);
    CHECK(cv[4] == 1.0f);
    CHECK(std::isnan(cv[5]));
  }
}

// ---------------------------------------------------------------------------------------
// Optimizer element kernels

// The device scalars of one optimizer pass, owned together.
struct OwnedStepScalars {
  Tensor inv, coef, found, lr, applied;
  OwnedStepScalars(float inv_, float coef_, float found_, float lr_, float applied_)
      : inv(scalar(inv_)), coef(scalar(coef_)), found(scalar(found_)), lr(scalar(lr_)), applied(scalar(applied_)) {}
  StepScalars view() const { return {&inv, &coef, &found, &lr, &applied}; }
};

TEST_CASE("adamw: the single-element formula, working copy, and nothing on found_inf", "[kernels][cpu][optim]") {
  AdamWHyper h;
  h.beta1 = 0.9f;
  h.beta2 = 0.99f;
  h.eps = 1e-3f;  // large enough to matter in the formula
  const float lr_value = 0.01f;
  // One step applied before: this is t = 2, and the kernel derives 1 - beta^2 itself.
  const double bc1 = 1.0 - std::pow(static_cast<double>(h.beta1), 2.0);
  const double bc2 = 1.0 - std::pow(static_cast<double>(h.beta2), 2.0);
  const std::vector<float> p0{0.5f, -2.0f, 3.0f}, m0{0.1f, -0.2f, 0.0f}, v0{0.04f, 0.01f, 0.0f};
  const std::vector<float> gs{3.0f, -1.0f, 0.25f};
  const float inv = 0.125f, coef = 0.6f, wd = 0.1f;
  for (DType wdt : {DType::F16, DType::BF16}) {
    Tensor p = Tensor::from_vector(p0, Shape{3}), m = Tensor::from_vector(m0, Shape{3});
    Tensor v = Tensor::from_vector(v0, Shape{3}), g = Tensor::from_vector(gs, Shape{3}, DType::F16);
    Tensor w = Tensor::zeros(Shape{3}, wdt);
    AdamWSlot s{&p, &m, &v, &g, &w, wd};

    // found_inf: nothing moves, bit for bit.
    cpu().adamw(h, {s}, OwnedStepScalars(inv, coef, 1.0f, lr_value, 1.0f).view());
    CHECK(p.to_vector() == p0);
    CHECK(m.to_vector() == m0);
    CHECK(v.to_vector() == v0);
    CHECK(w.to_vector() == std::vector<float>(3, 0.0f));

    cpu().adamw(h, {s}, OwnedStepScalars(inv, coef, 0.0f, lr_value, 1.0f).view());
    std::vector<double> wp(3), wm(3), wv(3), mag(3);
    for (int i = 0; i < 3; ++i) {
      const double ge = static_cast<double>(gs[i]) * inv * coef;
      const double b1 = h.beta1, b2 = h.beta2, lr = lr_value, eps = h.eps;
      wm[i] = b1 * m0[i] + (1 - b1) * ge;
      wv[i] = b2 * v0[i] + (1 - b2) * ge * ge;
      const double upd = (wm[i] / bc1) / (std::sqrt(wv[i] / bc2) + eps);
      wp[i] = p0[i] * (1 - lr * wd) - lr * upd;
      mag[i] = std::fabs(p0[i]) + lr * std::fabs(upd);
    }
    // ~4 roundings for the moments, ~10 for the parameter.
    check_close(m.to_vector(), wm, tolerance_for(DType::F32, DType::F32, 4));
    check_close(v.to_vector(), wv, tolerance_for(DType::F32, DType::F32, 5));
    check_close(p.to_vector(), wp, tolerance_for(DType::F32, DType::F32, 10), mag);
    const std::vector<float> pm = p.to_vector(), wv16 = w.to_vector();
    for (int i = 0; i < 3; ++i) CHECK(bits_of(wv16[i]) == bits_of(round_to(wdt, pm[i])));
  }
}

TEST_CASE("sgd: the single-element formula with and without momentum", "[kernels][cpu][optim]") {
  const float lr = 0.1f, mu = 0.9f, wd = 0.01f, inv = 0.5f, coef = 0.75f;
  Tensor p = Tensor::from_vector({1.0f, -2.0f}, Shape{2}), buf = Tensor::from_vector({0.5f, 0.25f}, Shape{2});
  const Tensor g = Tensor::from_vector({4.0f, -8.0f}, Shape{2});
  Tensor w = Tensor::zeros(Shape{2}, DType::F16);
  SgdSlot s{&p, &buf, &g, &w, wd};
  cpu().sgd(mu, {s}, OwnedStepScalars(inv, coef, 1.0f, lr, 0.0f).view());  // found_inf: no-op
  CHECK(p.to_vector() == std::vector<float>{1.0f, -2.0f});
  CHECK(buf.to_vector() == std::vector<float>{0.5f, 0.25f});
  cpu().sgd(mu, {s}, OwnedStepScalars(inv, coef, 0.0f, lr, 0.0f).view());
  // g_eff = g * 0.375 + wd * p = (1.5 + 0.01, -3 - 0.02); buf = 0.9 buf + g_eff.
  const double b0 = 0.9 * 0.5 + 1.51, b1 = 0.9 * 0.25 - 3.02;
  check_close(buf.to_vector(), {b0, b1}, tolerance_for(DType::F32, DType::F32, 6));
  check_close(p.to_vector(), {1.0 - 0.1 * b0, -2.0 - 0.1 * b1}, tolerance_for(DType::F32, DType::F32, 8),
              {1.0 + 0.1 * std::fabs(b0), 2.0 + 0.1 * std::fabs(b1)});
  const std::vector<float> pv = p.to_vector(), wv = w.to_vector();
  CHECK(wv[0] == round_to(DType::F16, pv[0]));
  CHECK(wv[1] == round_to(DType::F16, pv[1]));

  // No momentum buffer: p -= lr * (g_eff + wd p).
  Tensor q = Tensor::from_vector({1.0f}, Shape{1});
  const Tensor gq = Tensor::from_vector({2.0f}, Shape{1});
  SgdSlot plain{&q, nullptr, &gq, nullptr, 0.0f};
  cpu().sgd(0.0f, {plain}, OwnedStepScalars(1.0f, 1.0f, 0.0f, 0.25f, 0.0f).view());
  CHECK(q.item() == 0.5f);
}

TEST_CASE("adamw: bias corrections from the device count, as 1 - beta^t in FP64", "[kernels][cpu][optim]") {
  // Zero moments and a gradient of 1: m = (1 - b1), v = (1 - b2), so the step is
  // lr * (m / bc1) / (sqrt(v / bc2) + eps) and reveals both corrections at t = applied + 1.
  AdamWHyper h;
  h.eps = 0.0f;
  for (float applied : {0.0f, 1.0f, 9.0f, 999.0f, 100000.0f}) {
    Tensor p = scalar(0.0f), m = scalar(0.0f), v = scalar(0.0f);
    const Tensor g = scalar(1.0f);
    cpu().adamw(h, {AdamWSlot{&p, &m, &v, &g, nullptr, 0.0f}}, OwnedStepScalars(1.0f, 1.0f, 0.0f, 1.0f, applied).view());
    const double t = static_cast<double>(applied) + 1.0, b1 = h.beta1, b2 = h.beta2;  // the FP32 betas
    const double bc1 = 1.0 - std::pow(b1, t), bc2 = 1.0 - std::pow(b2, t);
    const double want = -((1.0 - b1) / bc1) / std::sqrt((1.0 - b2) / bc2);
    check_close(p.to_vector(), {want}, tolerance_for(DType::F32, DType::F32, 12));
  }
}

TEST_CASE("lookup and count_applied: the schedule's position on the device", "[kernels][cpu][optim]") {
  const Tensor table = Tensor::from_vector({0.5f, 0.25f, 0.125f, 0.0625f}, Shape{4});
  Tensor out = scalar(-1.0f);
  const std::vector<std::pair<float, float>> cases{{0.0f, 0.5f}, {2.0f, 0.125f}, {3.0f, 0.0625f}, {4.0f, 0.0625f},
                                                   {1e6f, 0.0625f}, {1e30f, 0.0625f}, {INFINITY, 0.0625f},
                                                   {NAN, 0.5f},     {-3.0f, 0.5f}};
  for (auto [index, want] : cases) {
    cpu().lookup(table, scalar(index), out);
    CHECK(out.item() == want);
  }
  CHECK_THROWS_AS(cpu().lookup(Tensor::empty(Shape{0}), scalar(0.0f), out), Error);
  CHECK_THROWS_AS(cpu().lookup(Tensor::zeros(Shape{2, 2}), scalar(0.0f), out), Error);  // a vector only
  CHECK_THROWS_AS(cpu().lookup(table.to(DType::F16), scalar(0.0f), out), Error);

  Tensor count = scalar(7.0f);
  cpu().count_applied(count, scalar(0.0f));
  CHECK(count.item() == 8.0f);
  cpu().count_applied(count, scalar(1.0f));  // a skipped step does not count
  cpu().count_applied(count, scalar(2.0f));  // (found_inf is a count of overflows: any nonzero)
  CHECK(count.item() == 8.0f);
}

TEST_CASE("read_async: a snapshot of device scalars, ready at once on the CPU", "[kernels][cpu]") {
  Tensor a = scalar(1.5f), b = scalar(-2.0f);
  const uint64_t reads = blocking_host_reads();
  std::unique_ptr<HostReadback> rb = cpu().read_async({&a, &b});
  a.fill(9.0f);  // later work does not change what was sent
  CHECK(rb->ready());
  CHECK(rb->wait() == std::vector<float>{1.5f, -2.0f});
  CHECK(blocking_host_reads() == reads);  // not a blocking read of a tensor
  Tensor not_scalar = Tensor::zeros(Shape{2});
  CHECK_THROWS_AS(cpu().read_async({&not_scalar}), Error);
}

TEST_CASE("scaler_update: growth, backoff, hysteresis, limits", "[kernels][cpu][amp]") {
  ScalerConfig c;
  c.growth_interval = 3;
  Tensor scale = scalar(1024.0f), tracker = scalar(0.0f), hyst = scalar(1.0f);
  auto step = [&](float found) { cpu().scaler_update(c, scale, tracker, hyst, scalar(found)); };
  step(0);
  step(0);
  CHECK(scale.item() == 1024.0f);
  CHECK(tracker.item() == 2.0f);
  step(0);  // the third clean step grows
  CHECK(scale.item() == 2048.0f);
  CHECK(tracker.item() == 0.0f);
  step(0);
  step(1);  // an overflow backs off at once and resets the count
  CHECK(scale.item() == 1024.0f);
  CHECK(tracker.item() == 0.0f);
  step(0);
  step(0);
  CHECK(scale.item() == 1024.0f);
  step(0);
  CHECK(scale.item() == 2048.0f);

  // Floors and ceilings.
  c.min_scale = 1.0f;
  scale = scalar(1.5f);
  step(1);
  CHECK(scale.item() == 1.0f);
  step(1);
  CHECK(scale.item() == 1.0f);
  c.max_scale = 4096.0f;
  scale = scalar(3000.0f);
  tracker = scalar(0.0f);
  for (int i = 0; i < 3; ++i) step(0);
  CHECK(scale.item() == 4096.0f);
  // Growth that would overflow FP32 is refused (max_scale above FLT_MAX/2).
  c.max_scale = INFINITY;
  scale = scalar(std::numeric_limits<float>::max());
  for (int i = 0; i < 3; ++i) step(0);
  CHECK(scale.item() == std::numeric_limits<float>::max());

  // Hysteresis 2: the first overflow is tolerated, the second backs off; a growth refills it.
  ScalerConfig hc;
  hc.growth_interval = 2;
  hc.hysteresis = 2;
  Tensor s2 = scalar(256.0f), t2 = scalar(0.0f), h2 = scalar(2.0f);
  auto step2 = [&](float found) { cpu().scaler_update(hc, s2, t2, h2, scalar(found)); };
  step2(1);
  CHECK(s2.item() == 256.0f);
  CHECK(h2.item() == 1.0f);
  step2(1);
  CHECK(s2.item() == 128.0f);
  step2(1);  // used up: every further overflow backs off
  CHECK(s2.item() == 64.0f);
  step2(0);
  step2(0);
  CHECK(s2.item() == 128.0f);
  CHECK(h2.item() == 2.0f);
  step2(1);
  CHECK(s2.item() == 128.0f);
}

// ---------------------------------------------------------------------------------------
// Determinism

TEST_CASE("reductions repeat bit for bit, whatever the thread count", "[kernels][cpu][determinism]") {
  const Tensor x = random_tensor(Shape{300001}, DType::F32, 101, -1e4f, 1e4f);
  const Tensor y = random_tensor(Shape{300001}, DType::F32, 105, -1e4f, 1e4f);
  const Tensor g16 = random_tensor(Shape{200003}, DType::F16, 102, -100.0f, 100.0f);
  const Tensor a = random_tensor(Shape{129, 1000}, DType::BF16, 103), b = random_tensor(Shape{1000, 65}, DType::BF16, 104);
  const Tensor wide = random_tensor(Shape{40, 40000}, DType::F32, 106);  // sum_rows runs in parallel
  // ... and on columns cut finer than its 256-wide blocks, one block per thread (130 = 80 + 50)
  const Tensor narrow = random_tensor(Shape{3000, 130}, DType::F32, 107);
  // One bit pattern per result, by part, so a failure names the part.
  auto reductions = [&] {
    std::vector<uint32_t> out;
    Tensor s = scalar(0.0f);
    cpu().sum(x, s);
    out.push_back(bits_of(s.item()));
    Tensor found = scalar(0.0f), norm = scalar(0.0f);
    cpu().guard({&x, &g16}, scalar(0.001f), found, norm);
    out.push_back(bits_of(norm.item()));
    Tensor loss = scalar(0.0f);
    cpu().mse_forward(x, y, loss);
    out.push_back(bits_of(loss.item()));
    for (const Tensor* m : {&a, &wide, &narrow}) {
      Tensor rows = Tensor::empty(Shape{m->dim(1)});
      cpu().sum_rows(*m, rows, false);
      for (float v : rows.to_vector()) out.push_back(bits_of(v));
    }
    return out;
  };
  auto gemm = [&] {
    std::vector<uint32_t> out;
    Tensor c = Tensor::empty(Shape{129, 65});
    GemmArgs args;
    args.a = &a;
    args.b = &b;
    args.c = &c;
    cpu().gemm(args);
    for (float v : c.to_vector()) out.push_back(bits_of(v));
    return out;
  };
  auto differing = [](const std::vector<uint32_t>& p, const std::vector<uint32_t>& q) {
    REQUIRE(p.size() == q.size());
    size_t n = 0;
    for (size_t i = 0; i < p.size(); ++i) n += p[i] != q[i];
    return n;
  };
  const int threads = omp_get_max_threads();
  const std::vector<uint32_t> r0 = reductions(), g0 = gemm();
  CHECK(differing(reductions(), r0) == 0);
  CHECK(differing(gemm(), g0) == 0);
  // The reductions are fixed-order by design (chunked, chunk sums added in order), so the
  // thread count cannot change them.
  for (int t : {1, 3}) {
    INFO("threads " << t << " vs " << threads);
    omp_set_num_threads(t);
    const std::vector<uint32_t> rt = reductions();
    omp_set_num_threads(threads);
    CHECK(differing(rt, r0) == 0);
  }
}

// The batched GEMM (GemmArgs batch, stride_a, stride_b) on every CPU ISA path this CPU has,
// and on the emulated AMX tiles: each item against the FP64 reference through the tolerance
// helper and with the bits of the unbatched call on it; FP32, FP16 and BF16 inputs, every
// layout, odd shapes, an operand shared over the batch (stride 0), the bias, beta = 1; and
// what check_gemm refuses.
namespace batched_gemm_tests {
using namespace belay::test;

// Odd extents in every role (edges of every micro-kernel), batches of 1 to 5.
const GemmCase kShapes[] = {{1, 1, 1}, {7, 5, 9}, {33, 17, 40}, {5, 70, 3}};

void batched_suite(const std::function<void(const GemmArgs&)>& gemm, const std::vector<DType>& dtypes) {
  uint64_t seed = 100;
  for (DType in : dtypes)
    for (const GemmCase& s : kShapes)
      for (bool ta : {false, true})
        for (bool tb : {false, true}) {
          const int64_t batch = 1 + (s.m + s.n + ta + 2 * tb) % 5;
          run_batched_case({batch, s.m, s.n, s.k, ta, tb}, in, in, DType::F32, Device::cpu(), seed++, gemm);
          run_batched_case({batch, s.m, s.n, s.k, ta, tb, false, true}, in, in, DType::F32, Device::cpu(), seed++,
                           gemm);
          run_batched_case({3, s.m, s.n, s.k, ta, tb, true, false, true, true}, in, DType::F32, DType::F32,
                           Device::cpu(), seed++, gemm);
        }
}

}  // namespace batched_gemm_tests

TEST_CASE("cpu batched gemm: each item matches FP64 and the unbatched call's bits, on every ISA path",
          "[kernels][cpu][isa][bmm]") {
  for (CpuIsa isa : kAllCpuIsas) {
    if (!cpu_isa_available(isa)) continue;  // test_cpu_isa.cpp reports the paths this CPU lacks
    INFO("path " << cpu_isa_name(isa));
    batched_gemm_tests::batched_suite([isa](const GemmArgs& a) { cpu_gemm_on(isa, a); }, {DType::F32, DType::F16, DType::BF16});
  }
  amx_emulator_reset_faults();
  batched_gemm_tests::batched_suite(cpu_gemm_amx_emulated, {DType::BF16});
  CHECK(amx_emulator_faults() == 0);
}

TEST_CASE("cpu batched gemm: operands that do not hold the batch are refused", "[kernels][cpu][bmm]") {
  const Tensor a = test::gemm_random_tensor(Shape{3, 4, 5}, DType::F32, 1);
  const Tensor b = test::gemm_random_tensor(Shape{3, 5, 2}, DType::F32, 2);
  Tensor c = Tensor::empty(Shape{3, 4, 2});
  GemmArgs args;
  args.a = &a;
  args.b = &b;
  args.c = &c;
  args.batch = 3;
  args.stride_a = 20;
  args.stride_b = 10;
  cpu_gemm(args);  // fits
  args.stride_b = 11;  // not a whole number of rows
  CHECK_THROWS_WITH(cpu_gemm(args), Catch::Contains("does not hold 3 matrices"));
  args.stride_b = 10;
  args.batch = 4;  // past the end of A
  CHECK_THROWS_WITH(cpu_gemm(args), Catch::Contains("does not hold 4 matrices"));
  args.batch = 3;
  Tensor small = Tensor::empty(Shape{2, 4, 2});
  args.c = &small;
  CHECK_THROWS_WITH(cpu_gemm(args), Catch::Contains("dense"));
  // Unbatched calls still take matrices only.
  args.c = &c;
  args.batch = 1;
  CHECK_THROWS_WITH(cpu_gemm(args), Catch::Contains("expected matrices"));
}

// ---------------------------------------------------------------------------------------
// Host memory

TEST_CASE("cpu host memory: blocks of 2 MiB and more start on a 2 MiB boundary (huge pages)", "[kernels][cpu]") {
  const RawMemory raw = cpu().raw_memory();
  for (const size_t bytes : {size_t{2} << 20, (size_t{2} << 20) + 4, size_t{9} << 20}) {
    INFO(bytes << " bytes");
    void* p = raw.alloc(bytes);
    REQUIRE(p != nullptr);
    CHECK(reinterpret_cast<uintptr_t>(p) % (size_t{2} << 20) == 0);
    std::memset(p, 1, bytes);  // the whole block is usable
    raw.free(p);
  }
  for (const size_t bytes : {size_t{4}, size_t{100}, (size_t{2} << 20) - 4}) {
    INFO(bytes << " bytes");
    void* p = raw.alloc(bytes);
    REQUIRE(p != nullptr);
    CHECK(reinterpret_cast<uintptr_t>(p) % 64 == 0);
    raw.free(p);
  }
}

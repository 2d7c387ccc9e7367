// Finite-difference gradient checks of every op of autograd/ops.h and of the modules, in
// FP32, plus the graph's contract: gradients accumulate (+=) across backward calls,
// zero_grad sets to none, NoGrad records nothing, backward needs a scalar, autocast picks
// the dtype of matrix products.
//
// The check. Each op's output y is reduced to a scalar f = sum(y * R) with fixed weights R
// (|R| in [0.5, 1.5], random signs), so every output element's gradient is exercised. For
// each input element x_i, fd = (f(x_i + h) - f(x_i - h)) / (x_i+h - (x_i-h)) (the step as
// actually stored in FP32) is compared with the analytic d f / d x_i.
//   Step h = 1e-2 with inputs of size ~1. Error of fd: truncation h^2/6 |f'''| <= 2e-4 for the
//   smooth ops here (|f'''| <= ~10 for gelu, cross-entropy and products at |x| <= 2; it is 0
//   for the (bi)linear ops, mse and sums), plus rounding 2 eps_f / (2h), where one evaluation of
//   f is off by eps_f <= ~16 u32 sum|R y| <= 16 * 6e-8 * 10 = 1e-5 for these small problems
//   (sum accumulates in double): <= 1e-3. Hence |fd - g| <= 1e-3 + 1e-2 |g|, fixed here for all
//   ops. A real backward bug (a wrong sign, factor, transpose or a lost term) errs by O(|g|),
//   and every check below also asserts that some |g| is large (> 0.05), so it cannot pass
//   vacuously on tiny gradients.
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <sstream>
#include <vector>

#include "amp/autocast.h"
#include "autograd/gpt.h"
#include "autograd/modules.h"
#include "autograd/ops.h"
#include "engine/error.h"
#include "engine/random.h"
#include "tests/tolerance.h"

using namespace belay;

namespace {

constexpr float kStep = 1e-2f;
constexpr double kAbsTol = 1e-3;
constexpr double kRelTol = 1e-2;

Tensor random_tensor(const Shape& shape, uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  Rng rng(seed);
  std::vector<float> v(static_cast<size_t>(shape.numel()));
  for (float& x : v) x = rng.uniform(lo, hi);
  return Tensor::from_vector(v, shape);
}

// Weights in +-[0.5, 1.5]: no output element's gradient is near zero.
Tensor weights(const Shape& shape, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> v(static_cast<size_t>(shape.numel()));
  for (float& x : v) x = (rng.uniform() < 0.5f ? -1.0f : 1.0f) * rng.uniform(0.5f, 1.5f);
  return Tensor::from_vector(v, shape);
}

Var leaf(const Shape& shape, uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  return Var(random_tensor(shape, seed, lo, hi), true);
}

// f = sum(y * R) for a non-scalar y; a scalar y is its own objective.
Var objective(const Var& y, uint64_t seed = 999) {
  if (y.value().numel() == 1 && y.dtype() == DType::F32) return y;
  return sum(mul(y, Var(weights(y.shape(), seed))));
}

// Runs the analytic backward once, then central differences on every element of every leaf.
void gradcheck(const std::string& what, const std::vector<Var>& leaves, const std::function<Var()>& f,
               float step = kStep) {
  INFO(what);
  for (Var l : leaves) l.zero_grad();
  Var out = f();
  REQUIRE(out.value().numel() == 1);
  out.backward();
  std::vector<std::vector<float>> analytic;
  for (const Var& l : leaves) {
    REQUIRE(l.grad().defined());
    REQUIRE(l.grad().shape() == l.shape());
    analytic.push_back(l.grad().to_vector());
  }
  double largest = 0.0;
  int bad = 0;
  std::ostringstream report;
  NoGrad no_grad;
  for (size_t li = 0; li < leaves.size(); ++li) {
    Tensor value = leaves[li].value();  // shares storage with the leaf (and a parameter's master)
    const std::vector<float> x0 = value.to_vector();
    for (size_t i = 0; i < x0.size(); ++i) {
      const float up = x0[i] + step, down = x0[i] - step;
      value.set_element(static_cast<int64_t>(i), up);
      const double f_up = f().value().item();
      value.set_element(static_cast<int64_t>(i), down);
      const double f_down = f().value().item();
      value.set_element(static_cast<int64_t>(i), x0[i]);
      const double fd = (f_up - f_down) / (static_cast<double>(up) - static_cast<double>(down));
      const double g = analytic[li][i];
      largest = std::max(largest, std::fabs(g));
      if (!(std::fabs(fd - g) <= kAbsTol + kRelTol * std::fabs(g)) && ++bad <= 5)
        report << " input " << li << " element " << i << ": analytic " << g << ", finite difference " << fd << ";";
    }
  }
  INFO("mismatches:" << report.str());
  CHECK(bad == 0);
  CHECK(largest > 0.05);
}

}  // namespace

TEST_CASE("gradcheck: matmul", "[autograd][gradcheck]") {
  Var a = leaf(Shape{3, 4}, 1), b = leaf(Shape{4, 5}, 2);
  gradcheck("matmul", {a, b}, [&] { return objective(matmul(a, b)); });
  // Rectangular the other way, and a row vector.
  Var c = leaf(Shape{1, 6}, 3), d = leaf(Shape{6, 2}, 4);
  gradcheck("matmul 1x6 x 6x2", {c, d}, [&] { return objective(matmul(c, d)); });
}

TEST_CASE("gradcheck: linear with and without bias", "[autograd][gradcheck]") {
  Var x = leaf(Shape{4, 3}, 5), w = leaf(Shape{5, 3}, 6), b = leaf(Shape{5}, 7);
  gradcheck("linear with bias", {x, w, b}, [&] { return objective(linear(x, w, b)); });
  gradcheck("linear without bias", {x, w}, [&] { return objective(linear(x, w, Var())); });
}

TEST_CASE("gradcheck: add, mul, scale", "[autograd][gradcheck]") {
  Var a = leaf(Shape{3, 4}, 8), b = leaf(Shape{3, 4}, 9);
  gradcheck("add", {a, b}, [&] { return objective(add(a, b)); });
  gradcheck("mul", {a, b}, [&] { return objective(mul(a, b)); });
  gradcheck("scale", {a}, [&] { return objective(scale(a, -2.5f)); });
  // One input used twice: both uses' gradients must arrive (d(a*a)/da = 2a, d(a+a)/da = 2).
  gradcheck("mul(a, a)", {a}, [&] { return objective(mul(a, a)); });
  gradcheck("add(a, a)", {a}, [&] { return objective(add(a, a)); });
}

TEST_CASE("gradcheck: relu (inputs away from 0), gelu and gelu_tanh", "[autograd][gradcheck]") {
  // ReLU's kink at 0 must stay outside [x - h, x + h]: |x| in [0.2, 2].
  Rng rng(10);
  std::vector<float> v(20);
  for (float& x : v) x = (rng.uniform() < 0.5f ? -1.0f : 1.0f) * rng.uniform(0.2f, 2.0f);
  Var x(Tensor::from_vector(v, Shape{4, 5}), true);
  gradcheck("relu", {x}, [&] { return objective(relu(x)); });
  Var y = leaf(Shape{4, 5}, 11, -2.0f, 2.0f);
  gradcheck("gelu", {y}, [&] { return objective(gelu(y)); });
  gradcheck("gelu_tanh", {y}, [&] { return objective(gelu_tanh(y)); });
}

TEST_CASE("gradcheck: sum and mean", "[autograd][gradcheck]") {
  Var a = leaf(Shape{3, 4}, 12);
  // sum(a) and mean(a) directly (gradients 1 and 1/12), and through a weighting so the
  // broadcast of the upstream gradient is checked too.
  gradcheck("sum", {a}, [&] { return sum(a); });
  gradcheck("3 * mean", {a}, [&] { return scale(mean(a), 3.0f); });
  gradcheck("mean of a weighted", {a}, [&] { return mean(mul(a, Var(weights(a.shape(), 13)))); });
  gradcheck("sum then scale", {a}, [&] { return scale(sum(mul(a, a)), 0.5f); });
}

TEST_CASE("gradcheck: mse_loss and cross_entropy", "[autograd][gradcheck]") {
  Var p = leaf(Shape{4, 3}, 14, -2.0f, 2.0f);
  const Tensor target = random_tensor(Shape{4, 3}, 15, -2.0f, 2.0f);
  gradcheck("mse_loss", {p}, [&] { return mse_loss(p, target); });
  gradcheck("2 * mse_loss", {p}, [&] { return scale(mse_loss(p, target), 2.0f); });
  Var logits = leaf(Shape{5, 4}, 16, -2.0f, 2.0f);
  const Tensor labels = Tensor::from_vector({0, 3, 1, 1, 2}, Shape{5});
  gradcheck("cross_entropy", {logits}, [&] { return cross_entropy(logits, labels); });
  // With an upstream gradient other than 1.
  gradcheck("cross_entropy * -3", {logits}, [&] { return scale(cross_entropy(logits, labels), -3.0f); });
}

TEST_CASE("gradcheck: cast", "[autograd][gradcheck]") {
  // Values on a grid of 2^-8 with |x| < 0.5 and a step of 2^-6: x and x +- h need at most 8
  // significant bits, so they are exact in FP16 and BF16, the cast adds no rounding to the
  // finite difference, and (the cast being linear) the standard tolerance applies.
  Rng rng(17);
  std::vector<float> v(12);
  for (float& x : v) x = std::round(rng.uniform(-0.95f, 0.95f) * 128.0f) / 256.0f;  // |x| < 0.5, 2^-8 grid
  Var x(Tensor::from_vector(v, Shape{3, 4}), true);
  for (DType d : {DType::F16, DType::BF16, DType::F32}) {
    // R on a grid of 2^-3 is exact in both 16-bit formats too.
    std::vector<float> r(12);
    for (size_t i = 0; i < r.size(); ++i) r[i] = (i % 2 ? -1.0f : 1.0f) * (0.5f + 0.125f * static_cast<float>(i % 8));
    const Tensor rw = Tensor::from_vector(r, Shape{3, 4});
    gradcheck(std::string("cast to ") + dtype_name(d), {x}, [&] {
      Var c = cast(x, d);
      REQUIRE(c.dtype() == d);
      return sum(mul(c, Var(rw)));
    }, 0.015625f);
  }
}

TEST_CASE("gradcheck: Linear and Mlp modules, every parameter", "[autograd][gradcheck][modules]") {
  Rng rng(18);
  Linear lin(3, 4, rng);
  Var x = leaf(Shape{5, 3}, 19);
  const Tensor target = random_tensor(Shape{5, 4}, 20);
  std::vector<Var> leaves = lin.parameters();
  leaves.push_back(x);
  gradcheck("Linear + mse", leaves, [&] { return mse_loss(lin(x), target); });

  Linear nobias(3, 2, rng, false);
  CHECK(nobias.parameters().size() == 1);
  gradcheck("Linear without bias", nobias.parameters(), [&] { return objective(nobias(x)); });

  Mlp mlp(3, 6, 2, rng, 3, Activation::Gelu);
  REQUIRE(mlp.parameters().size() == 6);
  const Tensor t2 = random_tensor(Shape{5, 2}, 21);
  std::vector<Var> mleaves = mlp.parameters();
  mleaves.push_back(x);
  gradcheck("Mlp(gelu) + mse", mleaves, [&] { return scale(mse_loss(mlp(x), t2), 10.0f); });
  const Tensor labels = Tensor::from_vector({0, 1, 1, 0, 1}, Shape{5});
  gradcheck("Mlp(gelu) + cross_entropy", mleaves, [&] { return cross_entropy(mlp(x), labels); });
}

// ---------------------------------------------------------------------------------------
// The graph's contract

TEST_CASE("gradients accumulate (+=) across backward calls until zero_grad", "[autograd]") {
  Rng rng(30);
  Linear lin(4, 3, rng);
  Var x = leaf(Shape{6, 4}, 31);
  Var a = leaf(Shape{6, 3}, 32);
  const Tensor target = random_tensor(Shape{6, 3}, 33);
  auto loss = [&] { return mse_loss(add(mul(lin(x), a), a), target); };

  loss().backward();
  const std::vector<float> w1 = lin.weight.grad().to_vector(), b1 = lin.bias.grad().to_vector(),
                           x1 = x.grad().to_vector(), a1 = a.grad().to_vector();
  loss().backward();
  // The weight gradient accumulates inside the GEMM (beta = 1), the bias in sum_rows, the
  // others by an add: each is 2 g up to the FP32 roundings of one more accumulation.
  auto doubled = [](const std::vector<float>& once) {
    std::vector<double> d(once.size());
    for (size_t i = 0; i < once.size(); ++i) d[i] = 2.0 * once[i];
    return d;
  };
  const test::Tolerance tol = test::tolerance_for(DType::F32, DType::F32, 8);
  test::check_close(lin.weight.grad().to_vector(), doubled(w1), tol);
  test::check_close(lin.bias.grad().to_vector(), doubled(b1), tol);
  test::check_close(x.grad().to_vector(), doubled(x1), tol);
  test::check_close(a.grad().to_vector(), doubled(a1), tol);

  // A different objective adds its own gradient.
  lin.zero_grad();
  sum(lin(x)).backward();  // d/db = number of rows, for every output
  sum(lin(x)).backward();
  CHECK(lin.bias.grad().to_vector() == std::vector<float>(3, 12.0f));

  // zero_grad sets to none by default; set_to_none = false keeps zeros.
  lin.zero_grad();
  CHECK_FALSE(lin.weight.grad().defined());
  CHECK_FALSE(lin.bias.grad().defined());
  sum(lin(x)).backward();
  lin.zero_grad(false);
  REQUIRE(lin.bias.grad().defined());
  CHECK(lin.bias.grad().to_vector() == std::vector<float>(3, 0.0f));
  sum(lin(x)).backward();
  CHECK(lin.bias.grad().to_vector() == std::vector<float>(3, 6.0f));
  x.zero_grad();
  CHECK_FALSE(x.grad().defined());
}

TEST_CASE("NoGrad records nothing, backward needs a scalar that depends on a leaf", "[autograd]") {
  Var a = leaf(Shape{2, 3}, 40), b = leaf(Shape{3, 2}, 41);
  {
    NoGrad off;
    CHECK_FALSE(grad_enabled());
    Var y = sum(matmul(a, b));
    CHECK_FALSE(y.requires_grad());
    CHECK(y.node()->inputs.empty());
    CHECK_FALSE(static_cast<bool>(y.node()->backward));
    CHECK_THROWS_WITH(y.backward(), Catch::Contains("does not depend on anything that requires grad"));
    {
      NoGrad nested;
    }
    CHECK_FALSE(grad_enabled());  // the nested guard restores "off", not "on"
  }
  CHECK(grad_enabled());
  CHECK_FALSE(a.grad().defined());

  Var m = matmul(a, b);
  CHECK(m.requires_grad());
  CHECK_THROWS_AS(m.backward(), Error);
  CHECK_THROWS_WITH(m.backward(), Catch::Contains("scalar") && Catch::Contains("fp32[2, 2]"));
  CHECK_FALSE(a.grad().defined());
  // Only leaves that require grad get one.
  Var c(random_tensor(Shape{2, 3}, 42), false);
  sum(mul(a, c)).backward();
  CHECK(a.grad().defined());
  CHECK_FALSE(c.grad().defined());
  CHECK(a.grad().to_vector() == c.value().to_vector());
}

TEST_CASE("a second backward through a freed graph is an error, not a silent no-op", "[autograd]") {
  Var a = leaf(Shape{2, 3}, 43);
  Var h = scale(a, 2.0f);
  Var loss1 = sum(h);
  loss1.backward();
  const std::vector<float> once = a.grad().to_vector();
  CHECK(once == std::vector<float>(6, 2.0f));
  // Once more through the same graph: it was freed, so no gradient could arrive.
  CHECK_THROWS_WITH(loss1.backward(), Catch::Contains("already used by a backward"));
  // A new output over a part of the freed graph.
  CHECK_THROWS_AS(sum(mul(h, h)).backward(), Error);
  CHECK(a.grad().to_vector() == once);  // nothing was written
  // A fresh forward works and accumulates.
  sum(scale(a, 2.0f)).backward();
  CHECK(a.grad().to_vector() == std::vector<float>(6, 4.0f));
}

TEST_CASE("autocast: linear runs in the low dtype, losses stay fp32", "[autograd][autocast]") {
  Rng rng(50);
  Linear lin(8, 4, rng);
  const Var x(random_tensor(Shape{16, 8}, 51));
  const Tensor target = random_tensor(Shape{16, 4}, 52);
  const Var f32_out = lin(x);
  CHECK(f32_out.dtype() == DType::F32);
  for (DType d : {DType::F16, DType::BF16}) {
    INFO(dtype_name(d));
    Var out, loss, inner, promoted, mm;
    {
      Autocast ac(d);
      CHECK(autocast_policy().enabled);
      out = lin(x);
      loss = mse_loss(out, target);
      mm = matmul(x, Var(random_tensor(Shape{8, 2}, 53)));
      promoted = add(out, Var(Tensor::zeros(Shape{16, 4})));  // low + fp32 -> fp32
      {
        AutocastOff off;
        inner = lin(x);
      }
      CHECK(autocast_policy().enabled);  // AutocastOff restored it
    }
    CHECK_FALSE(autocast_policy().enabled);
    CHECK(out.dtype() == d);
    CHECK(mm.dtype() == d);
    CHECK(loss.dtype() == DType::F32);
    CHECK(inner.dtype() == DType::F32);
    CHECK(promoted.dtype() == DType::F32);
    CHECK(lin(x).dtype() == DType::F32);  // back to normal after the scope
    // The low-precision forward agrees with an FP64 reference within the bound for inputs
    // rounded to d, K = 8 products and the bias summed in FP32, one rounding on output.
    std::vector<double> ref(16 * 4), mag(16 * 4);
    {
      const std::vector<float> xv = x.value().to_vector(), wv = lin.weight.value().to_vector(),
                               bv = lin.bias.value().to_vector();
      for (int64_t i = 0; i < 16; ++i)
        for (int64_t j = 0; j < 4; ++j) {
          double s = bv[j], m = std::fabs(bv[j]);
          for (int64_t k = 0; k < 8; ++k) {
            s += static_cast<double>(xv[i * 8 + k]) * wv[j * 8 + k];
            m += std::fabs(static_cast<double>(xv[i * 8 + k]) * wv[j * 8 + k]);
          }
          ref[i * 4 + j] = s;
          mag[i * 4 + j] = m;
        }
    }
    test::check_close(out.value().to_vector(), ref, test::tolerance_for(d, d, 8 + 1), mag);
    // Backward through the autocast graph: the FP32 parameters get FP32 gradients.
    lin.zero_grad();
    loss.backward();
    CHECK(lin.weight.grad().dtype() == DType::F32);
    CHECK(lin.bias.grad().dtype() == DType::F32);
    CHECK(lin.weight.grad().shape() == lin.weight.shape());
  }
  // Autocast to FP32 (or disabled) is no autocast.
  {
    Autocast ac(DType::F32);
    CHECK_FALSE(autocast_policy().enabled);
  }
  {
    Autocast ac(DType::F16, false);
    CHECK_FALSE(autocast_policy().enabled);
    CHECK(lin(x).dtype() == DType::F32);
  }
  // Mixed-dtype add outside autocast promotes too, and its gradient reaches both inputs in
  // their own dtypes.
  Var h(random_tensor(Shape{3}, 54).to(DType::F16), true), f(random_tensor(Shape{3}, 55), true);
  Var s = add(h, f);
  CHECK(s.dtype() == DType::F32);
  sum(s).backward();
  CHECK(h.grad().dtype() == DType::F16);
  CHECK(f.grad().dtype() == DType::F32);
  CHECK(h.grad().to_vector() == std::vector<float>(3, 1.0f));
}

// A cast from FP32 keeps its gradient in FP32 (Node::fp32_grad): the linear reading it writes
// dX and dW straight from the GEMM's FP32 sums, with no rounding to the low dtype on the way
// back to the FP32 tensors. Checked on the tied-head shape (the weight a cast of an FP32 leaf,
// the input the cast of a non-leaf FP32 value): the gradients hold bits that no BF16 value
// has, and agree with an FP64 reference of the BF16 operands within FP32's bound.
TEST_CASE("autocast: a cast from FP32 gets its gradient in FP32, never rounded to the low dtype",
          "[autograd][autocast]") {
  for (DType d : {DType::BF16, DType::F16}) {
    INFO(dtype_name(d));
    Var w(random_tensor(Shape{5, 64}, 61), true), x0(random_tensor(Shape{7, 64}, 62), true);
    const Tensor dy = random_tensor(Shape{7, 5}, 63);
    Var out;
    {
      Autocast ac(d);
      const Var x = scale(x0, 1.0f);  // a non-leaf FP32 value, as a LayerNorm's output
      out = linear(x, w, Var());
      CHECK(out.dtype() == d);
      sum(mul(out, Var(dy))).backward();
    }
    REQUIRE(x0.grad().dtype() == DType::F32);
    REQUIRE(w.grad().dtype() == DType::F32);
    // dX = dY W and dW = dY^T X on the operands as the GEMM saw them (rounded to d).
    const std::vector<float> g = Tensor(dy).to(d).to(DType::F32).to_vector(),
                             wv = w.value().to(d).to(DType::F32).to_vector(),
                             xv = x0.value().to(d).to(DType::F32).to_vector();
    std::vector<double> ref_dx(7 * 64), mag_dx(7 * 64), ref_dw(5 * 64), mag_dw(5 * 64);
    for (int i = 0; i < 7; ++i)
      for (int k = 0; k < 64; ++k)
        for (int j = 0; j < 5; ++j) {
          ref_dx[i * 64 + k] += static_cast<double>(g[i * 5 + j]) * wv[j * 64 + k];
          mag_dx[i * 64 + k] += std::fabs(static_cast<double>(g[i * 5 + j]) * wv[j * 64 + k]);
          ref_dw[j * 64 + k] += static_cast<double>(g[i * 5 + j]) * xv[i * 64 + k];
          mag_dw[j * 64 + k] += std::fabs(static_cast<double>(g[i * 5 + j]) * xv[i * 64 + k]);
        }
    // The operands are the rounded ones already: FP32's bound alone (a rounding to d is far out).
    test::check_close(x0.grad().to_vector(), ref_dx, test::tolerance_for(DType::F32, DType::F32, 7), mag_dx);
    test::check_close(w.grad().to_vector(), ref_dw, test::tolerance_for(DType::F32, DType::F32, 7), mag_dw);
    // Rounded to d on the way, every gradient would be a d value: here some are not.
    auto narrow_values = [d](const Tensor& t) {
      const std::vector<float> v = t.to_vector(), r = t.to(d).to(DType::F32).to_vector();
      size_t same = 0;
      for (size_t i = 0; i < v.size(); ++i) same += v[i] == r[i];
      return same;
    };
    CHECK(narrow_values(x0.grad()) < static_cast<size_t>(x0.grad().numel()));
    CHECK(narrow_values(w.grad()) < static_cast<size_t>(w.grad().numel()));
  }
}

// ---- The Var operators (autograd/math_ops.cpp). Inputs kept where |f'''| stays small (the
// bound in the header): divisors and log/pow arguments in [1, 2].
TEST_CASE("gradcheck: sub and div, same shape and broadcast both ways", "[autograd][gradcheck][math]") {
  Var a = leaf(Shape{3, 4}, 30), b = leaf(Shape{3, 4}, 31, 1.0f, 2.0f);
  Var row = leaf(Shape{4}, 32, 1.0f, 2.0f), col = leaf(Shape{3, 1}, 33, 1.0f, 2.0f), one = leaf(Shape{1}, 34, 1.0f, 2.0f);
  gradcheck("sub", {a, b}, [&] { return objective(sub(a, b)); });
  gradcheck("div", {a, b}, [&] { return objective(div(a, b)); });
  for (Var* s : {&row, &col, &one}) {
    const std::string what = " by " + s->value().shape().str();
    gradcheck("add" + what, {a, *s}, [&] { return objective(add(a, *s)); });
    gradcheck("add swapped" + what, {a, *s}, [&] { return objective(add(*s, a)); });
    gradcheck("sub" + what, {a, *s}, [&] { return objective(sub(a, *s)); });
    gradcheck("sub swapped" + what, {a, *s}, [&] { return objective(sub(*s, a)); });
    gradcheck("mul" + what, {a, *s}, [&] { return objective(mul(a, *s)); });
    gradcheck("mul swapped" + what, {a, *s}, [&] { return objective(mul(*s, a)); });
    gradcheck("div" + what, {a, *s}, [&] { return objective(div(a, *s)); });
    gradcheck("div swapped" + what, {b, *s}, [&] { return objective(div(*s, b)); });
  }
  gradcheck("neg", {a}, [&] { return objective(neg(a)); });
}

TEST_CASE("broadcasting refuses what it cannot broadcast, naming both shapes", "[autograd][math]") {
  const Var a(Tensor::zeros(Shape{2, 3})), b(Tensor::zeros(Shape{2})), c(Tensor::zeros(Shape{3, 1}));
  CHECK_THROWS_WITH(sub(a, b), Catch::Contains("cannot broadcast fp32[2]") && Catch::Contains("fp32[2, 3]"));
  CHECK_THROWS_WITH(div(a, c), Catch::Contains("div") && Catch::Contains("fp32[3, 1]"));
  CHECK(add(a, Var(Tensor::zeros(Shape{1, 3}))).shape() == Shape{2, 3});
  CHECK(mul(Var(Tensor::zeros(Shape{2, 1})), a).shape() == Shape{2, 3});
}

TEST_CASE("gradcheck: exp, log, tanh, sigmoid, pow", "[autograd][gradcheck][math]") {
  Var x = leaf(Shape{3, 4}, 35), p = leaf(Shape{3, 4}, 36, 1.0f, 2.0f);
  gradcheck("exp", {x}, [&] { return objective(exp(x)); });
  gradcheck("log", {p}, [&] { return objective(log(p)); });
  gradcheck("tanh", {x}, [&] { return objective(tanh(x)); });
  gradcheck("sigmoid", {x}, [&] { return objective(sigmoid(x)); });
  gradcheck("pow 2", {x}, [&] { return objective(pow(x, 2.0f)); });
  gradcheck("pow 3", {x}, [&] { return objective(pow(x, 3.0f)); });
  gradcheck("pow -1.5", {p}, [&] { return objective(pow(p, -1.5f)); });
  gradcheck("pow 0", {x}, [&] { return objective(add(pow(x, 0.0f), x)); });
}

TEST_CASE("gradcheck: softmax and log_softmax, plain and causal", "[autograd][gradcheck][math]") {
  Var x = leaf(Shape{3, 5}, 37, -2.0f, 2.0f), s = leaf(Shape{2, 4, 4}, 38, -2.0f, 2.0f);
  gradcheck("softmax", {x}, [&] { return objective(softmax(x)); });
  gradcheck("log_softmax", {x}, [&] { return objective(log_softmax(x)); });
  gradcheck("causal softmax", {s}, [&] { return objective(softmax(s, true)); });
  // Masked log-probabilities are -inf (a weight times them would be NaN): read through exp.
  Var s2 = leaf(Shape{2, 4, 4}, 39, -2.0f, 2.0f);
  gradcheck("causal log_softmax", {s2}, [&] { return objective(exp(log_softmax(s2, true))); });
  CHECK_THROWS_WITH(softmax(x, true), Catch::Contains("[..., T, T]"));
}

TEST_CASE("gradcheck: sum and mean over an axis, keepdim or not", "[autograd][gradcheck][math]") {
  Var x = leaf(Shape{2, 3, 4}, 40);
  for (int64_t axis : {0, 1, 2, -1})
    for (bool keep : {false, true}) {
      const std::string what = " axis " + std::to_string(axis) + (keep ? " keepdim" : "");
      gradcheck("sum" + what, {x}, [&] { return objective(sum(x, axis, keep)); });
      gradcheck("mean" + what, {x}, [&] { return objective(mean(x, axis, keep)); });
    }
  CHECK(sum(x, 1).shape() == Shape{2, 4});
  CHECK(mean(x, -1, true).shape() == Shape{2, 3, 1});
  CHECK_THROWS_WITH(sum(x, 3), Catch::Contains("axis 3 is out of range"));
}

TEST_CASE("gradcheck: transpose, reshape, rows", "[autograd][gradcheck][math]") {
  Var x = leaf(Shape{3, 4}, 41);
  gradcheck("transpose", {x}, [&] { return objective(transpose(x)); });
  gradcheck("reshape", {x}, [&] { return objective(reshape(x, {2, -1, 3})); });
  gradcheck("slice_rows", {x}, [&] { return objective(slice_rows(x, 1, 3)); });
  gradcheck("select_row", {x}, [&] { return objective(mul(select_row(x, -1), select_row(x, 0))); });
  CHECK(reshape(x, {-1}).shape() == Shape{12});
  CHECK_THROWS_WITH(reshape(x, {5, -1}), Catch::Contains("cannot infer"));
  CHECK_THROWS_WITH(select_row(x, 3), Catch::Contains("out of range"));
}

TEST_CASE("gradcheck: embedding (repeated ids) and layer_norm (x, weight, bias)", "[autograd][gradcheck][transformer]") {
  Var table = leaf(Shape{5, 3}, 41);
  const Tensor ids = Tensor::from_vector({1, 4, 1, 0, 1, 3}, Shape{2, 3});  // id 1 three times, 2 never
  gradcheck("embedding", {table}, [&] { return objective(embedding(table, ids)); });
  CHECK(embedding(table, ids).shape() == Shape{2, 3, 3});
  const std::vector<float> g = table.grad().to_vector();
  CHECK((g[6] == 0.0f && g[7] == 0.0f && g[8] == 0.0f));  // row 2: no id picks it, no gradient
  // LayerNorm: inputs in [-2, 2] over rows of 6 (the variance well away from 0, so the
  // third derivative stays as small as the step assumes); weight and bias, then neither.
  Var x = leaf(Shape{2, 3, 6}, 42, -2.0f, 2.0f), w = leaf(Shape{6}, 43, 0.5f, 1.5f), b = leaf(Shape{6}, 44);
  gradcheck("layer_norm", {x, w, b}, [&] { return objective(layer_norm(x, w, b, 1e-5f)); });
  gradcheck("layer_norm without weight and bias", {x}, [&] { return objective(layer_norm(x, Var(), Var())); });
  CHECK_THROWS_AS(layer_norm(x, leaf(Shape{5}, 45), b), UsageError);
  CHECK_THROWS_AS(embedding(leaf(Shape{5}, 46), ids), UsageError);
  CHECK_THROWS_AS(embedding(table, Tensor::from_vector({5}, Shape{1})), Error);
}

TEST_CASE("embedding and layer_norm under autocast: dtypes and FP32 gradients", "[autograd][autocast][transformer]") {
  // A GPT's parameters: FP32 masters, BF16 working copies; the table's gradient in FP32.
  Var table = Var::parameter(random_tensor(Shape{10, 8}, 51), "wte");
  Var w = Var::parameter(random_tensor(Shape{8}, 52, 0.5f, 1.5f), "ln.weight");
  Var b = Var::parameter(random_tensor(Shape{8}, 53), "ln.bias");
  for (Var p : {table, w, b}) p.set_working_dtype(DType::BF16);
  const Tensor ids = Tensor::from_vector({3, 3, 7, 0}, Shape{4});
  Autocast bf16(DType::BF16);
  const Var h = embedding(table, ids);
  CHECK(h.dtype() == DType::BF16);  // the table's dtype: a gather changes nothing
  const Var y = layer_norm(h, w, b);
  CHECK(y.dtype() == DType::BF16);  // the input's dtype; statistics in FP32 inside
  sum(y).backward();
  for (const Var& p : {table, w, b}) {
    REQUIRE(p.grad().defined());
    CHECK(p.grad().dtype() == DType::F32);
  }
  {
    Autocast kept(DType::BF16, true, parse_fp32_ops("embedding,layer_norm"));
    CHECK(embedding(table, ids).dtype() == DType::F32);
    CHECK(layer_norm(h, w, b).dtype() == DType::F32);
  }
}

TEST_CASE("gradcheck: bmm in every layout, per item and with b shared over the batch", "[autograd][gradcheck][bmm]") {
  // [2, 3] items of op(A) [3, 4] x op(B) [4, 5]; stored transposed when the flag is set.
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      Var a = leaf(ta ? Shape{2, 3, 4, 3} : Shape{2, 3, 3, 4}, 61);
      Var b = leaf(tb ? Shape{2, 3, 5, 4} : Shape{2, 3, 4, 5}, 62);
      Var w = leaf(tb ? Shape{5, 4} : Shape{4, 5}, 63);  // one B for all six items
      const std::string layout = " trans_a=" + std::to_string(ta) + " trans_b=" + std::to_string(tb);
      gradcheck("bmm" + layout, {a, b}, [&] { return objective(bmm(a, b, ta, tb)); });
      gradcheck("bmm, b shared" + layout, {a, w}, [&] { return objective(bmm(a, w, ta, tb)); });
      CHECK(bmm(a, b, ta, tb).shape() == Shape{2, 3, 3, 5});
    }
  Var q = leaf(Shape{2, 3, 4}, 64), k = leaf(Shape{2, 5, 4}, 65);
  gradcheck("bmm(q, k^T) then bmm(., k)", {q, k}, [&] { return objective(bmm(bmm(q, k, false, true), k)); });
  CHECK_THROWS_WITH(bmm(q, leaf(Shape{3, 4, 5}, 66)), Catch::Contains("leading dims differ"));
  CHECK_THROWS_WITH(bmm(q, k), Catch::Contains("inner sizes differ"));
  CHECK_THROWS_AS(bmm(leaf(Shape{4}, 67), k), UsageError);
}

TEST_CASE("gradcheck: fused attention, causal and not, Tq == Tk and Tq != Tk", "[autograd][gradcheck][attention]") {
  // [2, 2] items of q [3, 4] against k, v [5, 4]: causal aligns the mask at the end (query i
  // sees keys <= i + 2); and a square causal case, the GPT's.
  Var q = leaf(Shape{2, 2, 3, 4}, 91, -1.5f, 1.5f), k = leaf(Shape{2, 2, 5, 4}, 92, -1.5f, 1.5f);
  Var v = leaf(Shape{2, 2, 5, 4}, 93);
  for (bool causal : {false, true}) {
    INFO((causal ? "causal" : "not causal"));
    gradcheck("attention", {q, k, v}, [&] { return objective(attention(q, k, v, causal, 0.8f)); });
  }
  Var s = leaf(Shape{1, 2, 6, 3}, 94, -1.5f, 1.5f), t = leaf(Shape{1, 2, 6, 3}, 95, -1.5f, 1.5f);
  gradcheck("attention, square causal", {s, t}, [&] { return objective(attention(s, t, s, true)); });
  // The same values as the three-op path it replaces (FP32: both within a few ulps of the truth).
  const std::vector<float> fused = attention(s, t, s, true).value().to_vector();
  const std::vector<float> naive =
      bmm(softmax(scale(bmm(s, t, false, true), 1.0f / std::sqrt(3.0f)), true), s).value().to_vector();
  REQUIRE(fused.size() == naive.size());
  for (size_t i = 0; i < fused.size(); ++i) CHECK(std::fabs(fused[i] - naive[i]) <= 1e-6f * (1.0f + std::fabs(naive[i])));
  CHECK_THROWS_AS(attention(q, leaf(Shape{2, 2, 5, 3}, 96), v), UsageError);
  CHECK_THROWS_WITH(attention(q, k, leaf(Shape{2, 5, 4}, 97)), Catch::Contains("attention"));
}

// attention_heads: the heads side by side ([B, T, H d]), as the GPT's Linears give them.
TEST_CASE("gradcheck: attention_heads, and its bits those of split_heads, attention, merge_heads",
          "[autograd][gradcheck][attention]") {
  Var q = leaf(Shape{2, 3, 8}, 101, -1.5f, 1.5f), k = leaf(Shape{2, 5, 8}, 102, -1.5f, 1.5f), v = leaf(Shape{2, 5, 8}, 103);
  for (bool causal : {false, true}) {
    INFO((causal ? "causal" : "not causal"));
    gradcheck("attention_heads", {q, k, v}, [&] { return objective(attention_heads(q, k, v, 2, causal, 0.8f)); });
  }
  const Tensor dy = random_tensor(Shape{2, 3, 8}, 104);
  auto run = [&](bool side_by_side) {
    for (Var* x : {&q, &k, &v}) x->zero_grad();
    const Var y = side_by_side ? attention_heads(q, k, v, 2, true)
                               : merge_heads(attention(split_heads(q, 2), split_heads(k, 2), split_heads(v, 2), true));
    sum(mul(y, Var(dy))).backward();
    return std::vector<std::vector<float>>{y.value().to_vector(), q.grad().to_vector(), k.grad().to_vector(),
                                           v.grad().to_vector()};
  };
  CHECK(run(true) == run(false));
  CHECK_THROWS_WITH(attention_heads(q, k, v, 3), Catch::Contains("3 heads do not divide"));
}

TEST_CASE("attention under autocast: the low dtype, FP32 with --fp32-ops attention", "[autograd][autocast][attention]") {
  Var q = leaf(Shape{2, 3, 4}, 98), k = leaf(Shape{2, 3, 4}, 99);
  for (DType low : {DType::F16, DType::BF16}) {
    Autocast on(low);
    CHECK(attention(q, k, k).dtype() == low);
    Autocast kept(low, true, parse_fp32_ops("attention"));
    CHECK(attention(q, k, k).dtype() == DType::F32);
  }
  {
    Autocast bf16(DType::BF16);
    sum(attention(q, k, k)).backward();
  }
  REQUIRE(q.grad().defined());
  CHECK(q.grad().dtype() == DType::F32);  // a leaf's gradient in its own dtype, through the cast
  CHECK(fp32_ops_names(parse_fp32_ops("attention")) == "attention");
}

TEST_CASE("gradcheck: transpose of two dims, split_heads and merge_heads", "[autograd][gradcheck][bmm]") {
  Var x = leaf(Shape{2, 3, 4, 5}, 71);
  gradcheck("transpose(1, 2)", {x}, [&] { return objective(transpose(x, 1, 2)); });
  gradcheck("transpose(0, -1)", {x}, [&] { return objective(transpose(x, 0, -1)); });
  gradcheck("transpose(-2, -1)", {x}, [&] { return objective(transpose(x, -2, -1)); });
  Var h = leaf(Shape{2, 3, 6}, 72);  // [B, T, H * d] with H = 2, d = 3
  gradcheck("split_heads", {h}, [&] { return objective(split_heads(h, 2)); });
  gradcheck("merge_heads", {x}, [&] { return objective(merge_heads(x)); });
  // The values: [B, H, T, d] element (b, i, t, j) is [B, T, H * d] element (b, t, i * d + j).
  const std::vector<float> hv = h.value().to_vector(), sv = split_heads(h, 2).value().to_vector();
  REQUIRE(split_heads(h, 2).shape() == Shape{2, 2, 3, 3});
  for (int b = 0; b < 2; ++b)
    for (int i = 0; i < 2; ++i)
      for (int t = 0; t < 3; ++t)
        for (int j = 0; j < 3; ++j) CHECK(sv[((b * 2 + i) * 3 + t) * 3 + j] == hv[(b * 3 + t) * 6 + i * 3 + j]);
  CHECK(merge_heads(split_heads(h, 2)).value().to_vector() == hv);
  CHECK(transpose(x, 1, 3).shape() == Shape{2, 5, 4, 3});
  CHECK_THROWS_WITH(transpose(x, 0, 4), Catch::Contains("out of range"));
  CHECK_THROWS_AS(split_heads(h, 4), UsageError);
}

TEST_CASE("bmm under autocast: the low dtype, FP32 with --fp32-ops bmm, FP32 gradients", "[autograd][autocast][bmm]") {
  Var w = Var::parameter(random_tensor(Shape{4, 5}, 81), "w");
  w.set_working_dtype(DType::BF16);
  Var q = leaf(Shape{2, 3, 4}, 82), k = leaf(Shape{2, 3, 4}, 83);
  for (DType low : {DType::F16, DType::BF16}) {
    Autocast on(low);
    const Var s = bmm(q, k, false, true);
    CHECK(s.dtype() == low);
    CHECK(bmm(q, w).dtype() == low);
    Autocast kept(low, true, parse_fp32_ops("bmm"));
    CHECK(bmm(q, k, false, true).dtype() == DType::F32);
  }
  {
    Autocast bf16(DType::BF16);
    sum(bmm(q, w)).backward();
  }
  REQUIRE(w.grad().defined());
  CHECK(w.grad().dtype() == DType::F32);
  CHECK(fp32_ops_names(parse_fp32_ops("bmm")) == "bmm");
}

// The GPT (autograd/gpt.h) end to end: every parameter of a one-block model through the
// causal attention, the GELU MLP, both LayerNorms and the tied head, checked by finite
// differences. GPT-2's init (0.02) would make the gradients too small for the step: the
// parameters are redrawn in +-0.5 (LayerNorm weights in [0.5, 1.5]) first.
TEST_CASE("gradcheck: a one-block GPT, every parameter, the tied head included", "[autograd][gradcheck][gpt]") {
  const bool fused = GENERATE(true, false);
  INFO((fused ? "fused attention" : "naive attention (bmm, softmax, bmm)"));
  GptConfig c;
  c.fused_attention = fused;
  c.vocab = 7;
  c.context = 4;
  c.width = 8;
  c.layers = 1;
  c.heads = 2;
  Rng rng(50);
  Gpt gpt(c, rng);
  uint64_t seed = 51;
  for (auto& [name, p] : gpt.named_parameters()) {
    const bool ln_weight = name.find("ln_") != std::string::npos && name.find("weight") != std::string::npos;
    const Tensor v = random_tensor(p.shape(), seed++, ln_weight ? 0.5f : -0.5f, ln_weight ? 1.5f : 0.5f);
    Tensor value = p.value();
    for (int64_t i = 0; i < v.numel(); ++i) value.set_element(i, v.to_vector()[static_cast<size_t>(i)]);
  }
  const Tensor ids = Tensor::from_vector({1, 6, 1, 0, 3, 3}, Shape{2, 3});
  const Tensor next = Tensor::from_vector({6, 1, 0, 3, 3, 2}, Shape{6});
  gradcheck("gpt + cross_entropy", gpt.parameters(), [&] { return scale(cross_entropy(gpt(Var(ids)), next), 4.0f); });
}

// The CPU backend's fused classifier (kernels/cpu/cross_entropy_kernels.cpp, the rows of
// kernels/cpu/isa/classifier_rows.cpp) against an FP64 reference from the logits as stored, on
// every ISA path this CPU has: odd vocabulary sizes, wide and extreme logits, -inf classes,
// the labels' contract; the same bits at every thread count and on every path; and the
// autograd op that hands its gradient on (scaled in place, or added to an existing gradient).
#include <catch2/catch.hpp>
#include <omp.h>

#include <cmath>
#include <vector>

#include "autograd/ops.h"
#include "engine/error.h"
#include "engine/random.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/isa/classifier_rows.h"
#include "tests/kernels/cpu_guards.h"
#include "tests/tolerance.h"

using namespace belay;
using belay::test::IsaRestore;
using belay::test::Threads;
using belay::test::bits_of;
using belay::test::check_close;
using belay::test::tolerance_for;

namespace {

const Backend& cpu() { return cpu_backend(); }

// Every path this CPU can run (avx512bf16 and amx run avx512's rows, and are run too: the
// dispatch is what is tested there).
std::vector<CpuIsa> runnable_paths() {
  std::vector<CpuIsa> out;
  for (CpuIsa isa : kAllCpuIsas) {
    if (cpu_isa_available(isa)) out.push_back(isa);
    else WARN("the " << cpu_isa_name(isa) << " path cannot run on this CPU: its classifier rows are not tested here");
  }
  return out;
}

// The kernel's roundings, counted before the test runs (classifier_rows.h): the lane sums
// (C / 16 terms a lane, then a tree of 4), a rescale of the sums (an exp and a product, ~3) per
// chunk of kClassifierChunk classes, and per gradient element ~9 (the exp and its exact-difference
// correction, the chunk's scale: an exp and a division, the product, the onehot difference, 1/B).
int64_t grad_roundings(int64_t classes) { return classes / 16 + 4 + 3 * classifier_chunks(classes) + 9; }
// The loss: log S carries the sum's error (absolute = S's relative), then the mean in double and
// one rounding to FP32.
int64_t loss_roundings(int64_t classes) { return classes / 16 + 4 + 3 * classifier_chunks(classes) + 2; }

struct Reference {
  double loss = 0.0, loss_mag = 0.0;
  std::vector<double> grad, grad_mag;
};

// loss = mean over rows of log sum e^x - x[label]; grad = (softmax - onehot) / B, in FP64.
Reference reference(const std::vector<float>& x, const std::vector<float>& labels, int64_t rows, int64_t classes) {
  Reference ref;
  ref.grad.resize(x.size());
  ref.grad_mag.resize(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x.data() + r * classes;
    double mx = -INFINITY, z = 0.0;
    for (int64_t c = 0; c < classes; ++c) mx = std::max(mx, static_cast<double>(xr[c]));
    for (int64_t c = 0; c < classes; ++c) z += std::exp(xr[c] - mx);
    const double lse = mx + std::log(z);
    const int64_t l = static_cast<int64_t>(labels[r]);
    ref.loss += (lse - xr[l]) / rows;
    ref.loss_mag += (std::fabs(lse) + std::fabs(xr[l])) / rows;
    for (int64_t c = 0; c < classes; ++c) {
      const double p = std::exp(xr[c] - lse), onehot = c == l ? 1.0 : 0.0;
      ref.grad[r * classes + c] = (p - onehot) / rows;
      ref.grad_mag[r * classes + c] = (p + onehot) / rows;
    }
  }
  return ref;
}

struct Result {
  float loss;
  std::vector<float> grad;
};

Result run(const Tensor& logits, const std::vector<float>& labels) {
  Tensor loss = Tensor::empty(Shape{1}), grad = Tensor::empty(logits.shape());
  cpu().cross_entropy(logits, Tensor::from_vector(labels, Shape{logits.dim(0)}), loss, grad);
  return {loss.item(), grad.to_vector()};
}

// Logits uniform in [lo, hi) rounded to dtype, and labels spread over the classes.
struct Problem {
  Tensor logits;
  std::vector<float> x, labels;
};
Problem problem(int64_t rows, int64_t classes, DType dt, float lo, float hi, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> v(static_cast<size_t>(rows * classes)), lab(static_cast<size_t>(rows));
  for (float& f : v) f = rng.uniform(lo, hi);
  for (float& l : lab) l = static_cast<float>(rng.next_u64() % static_cast<uint64_t>(classes));
  Problem p;
  p.logits = Tensor::from_vector(v, Shape{rows, classes}, dt);
  p.x = p.logits.to_vector();  // as stored
  p.labels = lab;
  return p;
}

void check_against_fp64(const Problem& p, int64_t rows, int64_t classes) {
  const Reference ref = reference(p.x, p.labels, rows, classes);
  const Result got = run(p.logits, p.labels);
  check_close({got.loss}, {ref.loss}, tolerance_for(DType::F32, DType::F32, loss_roundings(classes)), {ref.loss_mag});
  check_close(got.grad, ref.grad, tolerance_for(DType::F32, DType::F32, grad_roundings(classes)), ref.grad_mag);
}

}  // namespace

TEST_CASE("cross_entropy: odd vocabulary sizes against FP64, every dtype and ISA path", "[kernels][cpu][loss]") {
  IsaRestore restore;
  for (CpuIsa isa : runnable_paths()) {
    force_cpu_isa(isa);
    for (const auto& [rows, classes] : std::vector<std::pair<int64_t, int64_t>>{{37, 1}, {37, 7}, {37, 257}, {3, 50257}})
      for (DType dt : {DType::F32, DType::F16, DType::BF16})
        for (float spread : {4.0f, 60.0f}) {  // 60: classes 120 apart, where the exact difference matters
          INFO("ISA path " << cpu_isa_name(isa) << ", [" << rows << ", " << classes << "] " << dtype_name(dt)
                           << ", logits in +-" << spread);
          check_against_fp64(problem(rows, classes, dt, -spread, spread, 101 + classes), rows, classes);
        }
  }
}

TEST_CASE("cross_entropy: rising logits rescale the running sum at every chunk", "[kernels][cpu][loss]") {
  // Each chunk's maximum beats the last: the online sum is rescaled 99 times in a row of 50257.
  IsaRestore restore;
  const int64_t rows = 2, classes = 50257;
  std::vector<float> v(static_cast<size_t>(rows * classes));
  for (int64_t c = 0; c < classes; ++c) {
    v[c] = -100.0f + 0.004f * static_cast<float>(c);                          // up to ~101
    v[classes + c] = 30.0f * std::sin(0.001f * static_cast<float>(c)) + 0.001f * c;  // up and down
  }
  Problem p;
  p.logits = Tensor::from_vector(v, Shape{rows, classes});
  p.x = v;
  p.labels = {50000.0f, 17.0f};
  for (CpuIsa isa : runnable_paths()) {
    force_cpu_isa(isa);
    INFO("ISA path " << cpu_isa_name(isa));
    check_against_fp64(p, rows, classes);
  }
}

TEST_CASE("cross_entropy: extreme logits, -inf classes and non-finite rows", "[kernels][cpu][loss]") {
  IsaRestore restore;
  const float inf = INFINITY;
  // Rows 0-3 are finite: a spread of 1e4 (the label at the top, at the bottom, all equal) and a
  // row padded with -inf classes (the label among the finite ones) whose first chunk is all -inf.
  const int64_t classes = 1100;
  std::vector<float> finite(4 * classes);
  for (int64_t c = 0; c < classes; ++c) {
    finite[c] = c % 3 == 0 ? 1e4f : c % 3 == 1 ? 0.0f : -1e4f;
    finite[classes + c] = c == 5 ? 1e4f : -1e4f + static_cast<float>(c);
    finite[2 * classes + c] = 1e4f;
    finite[3 * classes + c] = c < 600 ? -inf : static_cast<float>(c % 17) - 8.0f;
  }
  const std::vector<float> finite_labels = {0.0f, 1000.0f, 3.0f, 777.0f};
  for (CpuIsa isa : runnable_paths()) {
    force_cpu_isa(isa);
    INFO("ISA path " << cpu_isa_name(isa));
    Problem p;
    p.logits = Tensor::from_vector(finite, Shape{4, classes});
    p.x = finite;
    p.labels = finite_labels;
    check_against_fp64(p, 4, classes);
    const Result got = run(p.logits, p.labels);
    for (int64_t c = 0; c < 600; ++c) CHECK(got.grad[3 * classes + c] == 0.0f);  // the -inf classes: p = 0

    // The label on a -inf class: loss inf, the gradient still finite (p - 1 there).
    const Result at_pad = run(Tensor::from_vector(std::vector<float>(finite.begin() + 3 * classes, finite.end()),
                                                  Shape{1, classes}),
                              {10.0f});
    CHECK(at_pad.loss == inf);
    CHECK(at_pad.grad[10] == -1.0f);
    // A row of only -inf, a row with +inf and a row with a NaN: NaN loss and NaN gradients, as
    // the FP64 formula gives (0/0, inf - inf).
    for (int bad = 0; bad < 3; ++bad) {
      std::vector<float> row(static_cast<size_t>(classes), bad == 0 ? -inf : 1.0f);
      if (bad == 1) row[900] = inf;
      if (bad == 2) row[3] = NAN;
      INFO("non-finite row " << bad);
      const Result r = run(Tensor::from_vector(row, Shape{1, classes}), {4.0f});
      CHECK(std::isnan(r.loss));
      for (float g : r.grad) REQUIRE(std::isnan(g));
    }
  }
  // The labels' contract is the op's, whatever the path: a label that is not a class index
  // (out of range, negative, fractional, NaN) is an Error naming it, before any row is computed.
  for (float bad : {static_cast<float>(classes), -1.0f, 2.5f, NAN}) {
    INFO("label " << bad);
    Tensor loss = Tensor::empty(Shape{1}), grad = Tensor::empty(Shape{4, classes});
    CHECK_THROWS_WITH(cpu().cross_entropy(Tensor::from_vector(finite, Shape{4, classes}),
                                          Tensor::from_vector({0.0f, bad, 1.0f, 2.0f}, Shape{4}), loss, grad),
                      Catch::Contains("not a class index"));
  }
}

TEST_CASE("cross_entropy: the same bits at every thread count and on every ISA path", "[kernels][cpu][loss]") {
  // Rows split differently over 1, 2 and 3 threads; every path does the same operations in the
  // same order (classifier_rows.h), so all of them give the baseline's bits.
  IsaRestore restore;
  for (const auto& [rows, classes] : std::vector<std::pair<int64_t, int64_t>>{{301, 257}, {7, 50257}})
    for (DType dt : {DType::F32, DType::BF16}) {
      const Problem p = problem(rows, classes, dt, -8.0f, 8.0f, 7 + classes);
      std::vector<uint32_t> first_grad;
      float first_loss = 0.0f;
      bool have_first = false;
      for (CpuIsa isa : runnable_paths()) {
        force_cpu_isa(isa);
        for (int threads : {1, 2, 3}) {
          INFO("[" << rows << ", " << classes << "] " << dtype_name(dt) << ", ISA path " << cpu_isa_name(isa) << ", "
                   << threads << " threads");
          Threads t(threads);
          const Result r = run(p.logits, p.labels);
          if (!have_first) {
            first_grad = bits_of(r.grad);
            first_loss = r.loss;
            have_first = true;
            continue;
          }
          CHECK(bits_of(std::vector<float>{r.loss}) == bits_of(std::vector<float>{first_loss}));
          CHECK(bits_of(r.grad) == first_grad);
        }
      }
    }
}

TEST_CASE("cross_entropy op: the gradient is the unit gradient times the upstream one", "[autograd][loss]") {
  // The backward scales the op's own FP32 buffer in place and hands it on (no zero-filled copy),
  // adds it to a gradient the logits already have, or converts it once to the logits' dtype.
  const int64_t rows = 6, classes = 11;
  for (DType dt : {DType::F32, DType::BF16}) {
    INFO(dtype_name(dt));
    const Problem p = problem(rows, classes, dt, -3.0f, 3.0f, 5);
    const Tensor labels = Tensor::from_vector(p.labels, Shape{rows});
    const Reference ref = reference(p.x, p.labels, rows, classes);
    // Rounded once to the logits' dtype (BF16: its unit roundoff) after the FP32 product.
    const auto tol = tolerance_for(DType::F32, dt, grad_roundings(classes) + 1);
    {
      Var x(p.logits.clone(), true);
      Var h = scale(x, 1.0f);  // a non-leaf: its gradient is the op's buffer itself
      cross_entropy(h, labels).backward(-3.0f);
      std::vector<double> want(ref.grad), mag(ref.grad_mag);
      for (size_t i = 0; i < want.size(); ++i) want[i] *= -3.0, mag[i] *= 3.0;
      check_close(x.grad().to_vector(), want, tol, mag);
    }
    {
      // x read by two losses: the second gradient is added to the first (x's gradient in FP32:
      // the sum is one FP32 rounding).
      Var x(p.logits.clone(), true);
      x.set_grad_dtype(DType::F32);
      std::vector<float> other(p.labels.rbegin(), p.labels.rend());
      const Reference ref2 = reference(p.x, other, rows, classes);
      add(cross_entropy(x, labels), scale(cross_entropy(x, Tensor::from_vector(other, Shape{rows})), 2.0f))
          .backward();
      std::vector<double> want(ref.grad), mag(ref.grad_mag);
      for (size_t i = 0; i < want.size(); ++i) want[i] += 2.0 * ref2.grad[i], mag[i] += 2.0 * ref2.grad_mag[i];
      check_close(x.grad().to_vector(), want, tolerance_for(DType::F32, DType::F32, grad_roundings(classes) + 1), mag);
    }
  }
}

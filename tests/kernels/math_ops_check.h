// The backend ops behind the Var operators (unary, binary_broadcast, broadcast_axis,
// sum_axis, softmax and its backward, transpose) against FP64 references of the same
// already-rounded inputs, through the one tolerance helper, in FP32, FP16 and BF16. Written
// once for any device: tests/kernels/test_math_kernels.cpp runs it on the CPU backend,
// tests/gpu/test_cuda_math.cpp on the CUDA one (the emulated device in CI).
//
// The bounds, per op (u = unit roundoff of FP32; every result is then rounded once into its
// dtype, the u_out term of tolerance_for):
//  - exp, tanh, log: the platform's expf/tanhf/logf, within 2 ulp (4u) on both glibc and CUDA
//    (CUDA C Programming Guide, table of single-precision function errors): n = 4.
//  - sigmoid = 1 / (1 + expf(-x)): expf's 4u, the add and the division 1u each: n = 6.
//  - pow = powf: 2 ulp on CUDA (n = 4); its backward p * powf(x, p-1) * dy, two more: n = 6.
//  - backward of exp, tanh, sigmoid, log from the stored y: at most 3 roundings: n = 3.
//  - binary ops: one FP32 operation: n = 1.
//  - sum_axis: `len` terms summed in double, rounded once: the sum bound with n = len against
//    sum |x| (generous: double adds far less than u per term).
//  - softmax: x - max rounded (u |x - max| <= 8u for |x| <= 4, which exp turns into a relative
//    error), expf 4u, the division 1u: n = 16. log-softmax: (x - max) rounded and the result
//    rounded, against |x - max| + log z (the difference may cancel): n = 2.
//  - softmax backward y (dy - s), s = sum(dy y) rounded once: 3 roundings against
//    |y| (|dy| + |s|): n = 3; log-softmax dy - expf(y) s: expf 4u and 3 roundings against
//    |dy| + exp(y) |s|: n = 8.
#pragma once
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <random>
#include <vector>

#include "engine/backend.h"
#include "engine/tensor.h"
#include "tests/tolerance.h"

namespace belay::test::math {

inline const DType kMathDtypes[] = {DType::F32, DType::F16, DType::BF16};

// n values in [lo, hi) rounded into dtype (so the reference sees exactly the stored inputs).
inline std::vector<float> values(int64_t n, uint64_t seed, DType dtype, float lo = -2.0f, float hi = 2.0f) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = round_to(dtype, dist(rng));
  return v;
}

inline Tensor make(const std::vector<float>& v, const Shape& s, DType d, Device dev) {
  return Tensor::from_vector(v, s, d, Device::cpu()).to(dev);
}
inline std::vector<float> host(const Tensor& t) { return t.to(Device::cpu()).to_vector(); }

inline double unary_ref(UnaryOp op, double x, double p) {
  switch (op) {
    case UnaryOp::Exp: return std::exp(x);
    case UnaryOp::Log: return std::log(x);
    case UnaryOp::Tanh: return std::tanh(x);
    case UnaryOp::Sigmoid: return 1.0 / (1.0 + std::exp(-x));
    default: return std::pow(x, p);
  }
}
inline double unary_grad_ref(UnaryOp op, double x, double y, double dy, double p) {
  switch (op) {
    case UnaryOp::Exp: return dy * y;
    case UnaryOp::Log: return dy / x;
    case UnaryOp::Tanh: return dy * (1.0 - y * y);
    case UnaryOp::Sigmoid: return dy * y * (1.0 - y);
    default: return p == 0.0 ? 0.0 : dy * p * std::pow(x, p - 1.0);
  }
}

struct UnaryCase {
  UnaryOp op;
  float p, lo, hi;
  int64_t fwd_n, bwd_n;
  const char* name;
};

inline void check_unary(Device dev) {
  const int64_t n = 300;  // over a block of 256 threads
  const UnaryCase cases[] = {
      {UnaryOp::Exp, 0, -4, 4, 4, 3, "exp"},          {UnaryOp::Log, 0, 0.05f, 8, 4, 3, "log"},
      {UnaryOp::Tanh, 0, -3, 3, 4, 3, "tanh"},        {UnaryOp::Sigmoid, 0, -6, 6, 6, 3, "sigmoid"},
      {UnaryOp::Pow, 2.0f, -2, 2, 4, 6, "pow 2"},     {UnaryOp::Pow, 3.0f, -2, 2, 4, 6, "pow 3"},
      {UnaryOp::Pow, 0.5f, 0.1f, 3, 4, 6, "pow 0.5"}, {UnaryOp::Pow, -1.5f, 0.25f, 3, 4, 6, "pow -1.5"},
  };
  const Backend& be = backend_for(dev);
  for (const UnaryCase& c : cases)
    for (DType dt : kMathDtypes) {
      INFO(c.name << " in " << dtype_name(dt) << " on " << dev.str());
      const std::vector<float> xv = values(n, 7, dt, c.lo, c.hi), gv = values(n, 8, dt);
      Tensor x = make(xv, Shape{n}, dt, dev), g = make(gv, Shape{n}, dt, dev);
      Tensor y = Tensor::empty(Shape{n}, dt, dev), dx = Tensor::empty(Shape{n}, dt, dev);
      be.unary(c.op, c.p, x, y);
      const std::vector<float> yv = host(y);
      std::vector<double> ref(n), gref(n), gmag(n);
      for (int64_t i = 0; i < n; ++i) {
        ref[i] = unary_ref(c.op, xv[i], c.p);
        gref[i] = unary_grad_ref(c.op, xv[i], yv[i], gv[i], c.p);
        // exp/tanh/sigmoid read the stored y; log and pow x: the magnitude of each term.
        gmag[i] = c.op == UnaryOp::Tanh ? std::fabs(gv[i]) * (1.0 + double(yv[i]) * yv[i]) : std::fabs(gref[i]);
      }
      check_close(yv, ref, tolerance_for(dt, dt, c.fwd_n));
      be.unary_backward(c.op, c.p, x, y, g, dx);
      check_close(host(dx), gref, tolerance_for(dt, dt, c.bwd_n), gmag);
    }
}

inline double binary_ref(BinaryOp op, double x, double y) {
  return op == BinaryOp::Add ? x + y : op == BinaryOp::Sub ? x - y : op == BinaryOp::Mul ? x * y : x / y;
}

// Every op over a row, a column and a scalar, both operand orders, then the backward pair:
// broadcast_axis and sum_axis (with accumulate) against sums in double.
inline void check_broadcast(Device dev) {
  const int64_t m = 5, k = 3, n = 67;
  const AxisView views[] = {{1, m * k, n}, {m, k, n}, {m * k, n, 1}, {1, m * k * n, 1}};  // row, middle, column, scalar
  const Backend& be = backend_for(dev);
  for (const AxisView& v : views)
    for (DType dt : kMathDtypes) {
      const int64_t full_n = v.outer * v.len * v.inner, small_n = v.outer * v.inner;
      const std::vector<float> av = values(full_n, 11, dt), bv = values(small_n, 12, dt, 0.5f, 2.0f);
      Tensor a = make(av, Shape{full_n}, dt, dev), b = make(bv, Shape{small_n}, dt, dev);
      for (BinaryOp op : {BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div})
        for (bool swapped : {false, true}) {
          INFO("view [" << v.outer << ", " << v.len << ", " << v.inner << "] op " << int(op) << " swapped " << swapped
                        << " in " << dtype_name(dt) << " on " << dev.str());
          Tensor out = Tensor::empty(Shape{full_n}, dt, dev);
          be.binary_broadcast(op, a, b, v, swapped, out);
          std::vector<double> ref(full_n);
          for (int64_t i = 0; i < full_n; ++i) {
            const double x = av[i], y = bv[v.reduced_index(i)];
            ref[i] = swapped ? binary_ref(op, y, x) : binary_ref(op, x, y);
          }
          check_close(host(out), ref, tolerance_for(dt, dt, 1));
        }
      INFO("broadcast_axis and sum_axis, view [" << v.outer << ", " << v.len << ", " << v.inner << "] in "
                                                 << dtype_name(dt) << " on " << dev.str());
      Tensor spread = Tensor::empty(Shape{full_n}, dt, dev);
      be.broadcast_axis(b, v, -0.5f, spread);
      std::vector<double> sref(full_n);
      for (int64_t i = 0; i < full_n; ++i) sref[i] = -0.5 * bv[v.reduced_index(i)];
      check_close(host(spread), sref, tolerance_for(dt, dt, 1));
      Tensor sums = make(std::vector<float>(small_n, 1.0f), Shape{small_n}, DType::F32, dev);
      be.sum_axis(a, v, 0.25f, sums, true);  // 1 + 0.25 * sum
      std::vector<double> ref(small_n, 0.0), mag(small_n, 1.0);
      for (int64_t i = 0; i < full_n; ++i) {
        ref[v.reduced_index(i)] += 0.25 * av[i];
        mag[v.reduced_index(i)] += 0.25 * std::fabs(av[i]);
      }
      for (double& r : ref) r += 1.0;
      check_close(host(sums), ref, tolerance_for(dt, DType::F32, v.len + 1), mag);
    }
}

// Softmax and log-softmax of rows of 300 (over a block) and of 5 x 5 causal blocks (or the
// cases given), forward and backward, in every dtype.
struct SoftmaxCase {
  int64_t rows, cols;
  bool causal;
};

inline void check_softmax(Device dev, std::initializer_list<SoftmaxCase> cases = {SoftmaxCase{3, 300, false},
                                                                                 SoftmaxCase{10, 5, true},
                                                                                 SoftmaxCase{4, 1, false}}) {
  const Backend& be = backend_for(dev);
  for (const SoftmaxCase& c : cases)
    for (bool log : {false, true})
      for (DType dt : kMathDtypes) {
        INFO((log ? "log_softmax " : "softmax ") << c.rows << " x " << c.cols << (c.causal ? " causal" : "") << " in "
                                                 << dtype_name(dt) << " on " << dev.str());
        const int64_t n = c.rows * c.cols;
        const std::vector<float> xv = values(n, 21, dt, -4.0f, 4.0f), gv = values(n, 22, dt);
        Tensor x = make(xv, Shape{c.rows, c.cols}, dt, dev), g = make(gv, Shape{c.rows, c.cols}, dt, dev);
        Tensor y = Tensor::empty(x.shape(), dt, dev), dx = Tensor::empty(x.shape(), dt, dev);
        be.softmax(x, c.cols, log, c.causal, y);
        const std::vector<float> yv = host(y);
        std::vector<double> ref(n), mag(n), gref(n), gmag(n);
        std::vector<bool> masked(n, false);
        for (int64_t r = 0; r < c.rows; ++r) {
          const int64_t live = c.causal ? r % c.cols + 1 : c.cols, base = r * c.cols;
          double mx = -INFINITY, z = 0.0, s = 0.0;
          for (int64_t j = 0; j < live; ++j) mx = std::max(mx, double(xv[base + j]));
          for (int64_t j = 0; j < live; ++j) z += std::exp(xv[base + j] - mx);
          for (int64_t j = 0; j < live; ++j) s += log ? double(gv[base + j]) : double(gv[base + j]) * yv[base + j];
          for (int64_t j = 0; j < c.cols; ++j) {
            const int64_t i = base + j;
            if (j >= live) {  // masked: exactly 0 (log: -inf) with no gradient, checked below
              ref[i] = mag[i] = gref[i] = gmag[i] = 0.0;
              masked[i] = true;
              continue;
            }
            const double shifted = xv[i] - mx;
            ref[i] = log ? shifted - std::log(z) : std::exp(shifted) / z;
            mag[i] = log ? std::fabs(shifted) + std::fabs(std::log(z)) : ref[i];
            gref[i] = log ? gv[i] - std::exp(double(yv[i])) * s : yv[i] * (gv[i] - s);
            gmag[i] = log ? std::fabs(gv[i]) + std::exp(double(yv[i])) * std::fabs(s)
                          : std::fabs(yv[i]) * (std::fabs(gv[i]) + std::fabs(s));
          }
        }
        // A masked entry must be exactly 0 (log: -inf): compared as 0, or as 1 when it is not.
        std::vector<float> yc = yv;
        for (int64_t i = 0; i < n; ++i)
          if (masked[i]) yc[i] = yc[i] == (log ? -INFINITY : 0.0f) ? 0.0f : 1.0f;
        check_close(yc, ref, tolerance_for(dt, dt, log ? 2 : 16), mag);
        be.softmax_backward(y, g, c.cols, log, c.causal, dx);
        std::vector<float> dxv = host(dx);
        for (int64_t i = 0; i < n; ++i)
          if (masked[i] && dxv[i] != 0.0f) dxv[i] = 1.0f;  // masked: exactly 0
        check_close(dxv, gref, tolerance_for(dt, dt, log ? 8 : 3), gmag);
      }
}

// Bit for bit, every dtype, rows and columns not multiples of anything.
inline void check_transpose(Device dev) {
  const Backend& be = backend_for(dev);
  for (DType dt : kMathDtypes) {
    const int64_t rows = 37, cols = 70;
    const std::vector<float> xv = values(rows * cols, 31, dt);
    Tensor x = make(xv, Shape{rows, cols}, dt, dev), out = Tensor::empty(Shape{cols, rows}, dt, dev);
    be.transpose(x, out);
    const std::vector<float> got = host(out);
    int64_t differ = 0;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) differ += f32_bits(got[c * rows + r]) != f32_bits(xv[r * cols + c]);
    INFO(dtype_name(dt) << " on " << dev.str());
    CHECK(differ == 0);
  }
}

}  // namespace belay::test::math
